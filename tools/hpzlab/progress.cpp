#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>

#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

bool line_open = false;  ///< a bar is drawn and its line not ended

}  // namespace

bool progress_on() {
  return ::isatty(STDERR_FILENO) != 0;
}

void progress_bar(double done, int total, const std::string& what) {
  if (!progress_on() || total <= 0) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(done * kWidth / total);
  // \033[K clears what a longer line drawn before left behind.
  std::fprintf(stderr, "\r[%s%s] %s\033[K",
               std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(), what.c_str());
  line_open = done < total;
  if (!line_open) std::fprintf(stderr, "\n");
}

void end_progress_line() {
  if (line_open) std::fprintf(stderr, "\n");
  line_open = false;
}

void run_showing_progress(double done, int total, const std::string& what,
                          const std::function<void()>& fn) {
  if (!progress_on()) {
    fn();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto draw = [&] {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    progress_bar(done, total, fmt::format("{} ({:.0f} s)", what, elapsed.count()));
  };
  std::future<void> task = std::async(std::launch::async, fn);
  draw();
  while (task.wait_for(std::chrono::milliseconds(250)) != std::future_status::ready) draw();
  task.get();  // rethrows what fn threw
}

}  // namespace hpz::cli
