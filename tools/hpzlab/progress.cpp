#include <unistd.h>

#include <cstdio>
#include <string>

#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {

void progress_bar(double done, int total, const std::string& what) {
  if (!::isatty(STDERR_FILENO) || total <= 0) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(done * kWidth / total);
  std::fprintf(stderr, "\r[%s%s] %s", std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(), what.c_str());
  if (done >= total) std::fprintf(stderr, "\n");
}

}  // namespace hpz::cli
