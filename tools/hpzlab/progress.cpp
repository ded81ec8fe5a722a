#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>

#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

bool line_open = false;  ///< a bar is drawn and its line not ended

/** Standard error's terminal width in columns, else $COLUMNS, else 80. */
int terminal_columns() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr && std::atoi(c) > 0) {
    return std::atoi(c);
  }
  return 80;
}

}  // namespace

bool progress_on() {
  return ::isatty(STDERR_FILENO) != 0;
}

void progress_bar(double done, int total, const std::string& what) {
  if (!progress_on() || total <= 0) return;
  // The line fits the terminal (issue 35: 160-179 columns on an 80-column one wrapped, and each
  // redraw then left a line behind): the bar shrinks to a quarter of it, the text is cut.
  const int columns = terminal_columns();
  const int width = std::clamp(columns / 4, 5, 30);
  const int filled = std::clamp(static_cast<int>(done * width / total), 0, width);
  const std::size_t room =
      static_cast<std::size_t>(std::max(columns - width - 4, 4));  // "[", "] ", the last column
  const std::string text = what.size() <= room ? what : what.substr(0, room - 3) + "...";
  // \033[K clears what a longer line drawn before left behind.
  std::fprintf(stderr, "\r[%s%s] %s\033[K",
               std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), text.c_str());
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
