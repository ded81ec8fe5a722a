// Writing the output files (--json, --trace, --csv, --plot, --junit): every path checked before
// anything is written, then each written whole. A regular file (or none yet) gets a temporary
// file next to it renamed into place, so a failed run never leaves half a file; a symlink is
// followed (the temporary file goes next to its target, which the rename replaces, and the link
// stays; links that lead in a loop are refused); a FIFO, a device (/dev/null) or a socket is
// written directly, never replaced.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "sim/error.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

namespace fs = std::filesystem;

/** `path` with its symlinks resolved as far as they lead (a dangling link: the path it names). */
fs::path resolved(const fs::path& path) {
  std::error_code ec;
  fs::path p = path;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path link = fs::read_symlink(p, ec);
    if (ec) break;
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  const fs::path canonical = fs::weakly_canonical(p, ec);
  return ec ? p : canonical;
}

/** True when following `path`'s links never ends (a link to itself, two links to each other):
 *  writing there would replace a link by a file. */
bool link_loop(const fs::path& path) {
  std::error_code ec;
  return fs::is_symlink(fs::symlink_status(resolved(path), ec));
}

/** True when `a` and `b` name the same file (or would, once written). */
bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  return resolved(a) == resolved(b);
}

[[noreturn]] void cannot_write(const OutputFile& out, const std::string& why) {
  throw InputError(out.path, out.flag, "cannot write this file" + (why.empty() ? "" : ": " + why));
}

/** Throws InputError unless `out` can be written (see check_outputs). */
void check_writable(const OutputFile& out) {
  if (link_loop(out.path)) cannot_write(out, "its symbolic links lead in a loop");
  const fs::path target = resolved(out.path);
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  if (fs::is_directory(st)) cannot_write(out, "it is a directory");
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    // A FIFO or a device is written directly: only its own permission counts.
    if (::access(target.c_str(), W_OK) != 0) cannot_write(out, std::strerror(errno));
    return;
  }
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) cannot_write(out, "");  // as before: no such directory
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    cannot_write(out, fmt::format("the directory '{}' is not writable ({})", shown(dir.string()),
                                  std::strerror(errno)));
  }
}

/** Writes all of `text` to the open descriptor; false on an error. */
bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

/** A fresh temporary file next to `target` (PATH.tmp, or PATH.PID.N.tmp when that name is
 *  taken, by a directory say); O_EXCL so that nothing at that name is followed or reused. */
int open_temporary(const fs::path& target, fs::path& tmp) {
  for (int n = 0; n < 100; ++n) {
    tmp = target;
    tmp += n == 0 ? std::string(".tmp") : fmt::format(".{}.{}.tmp", ::getpid(), n);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

/** How long a FIFO output waits for a reader before the write fails (issue 34: with none it
 *  blocked forever after all the work was done). */
constexpr int kFifoReaderWaitMs = 10'000;

/** Opens a FIFO for writing once a reader has it open, polling for up to kFifoReaderWaitMs (a
 *  non-blocking open fails with ENXIO while there is none); -1 with errno set otherwise. */
int open_fifo(const fs::path& target) {
  for (int waited = 0;; waited += 100) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // then block as usual
      return fd;
    }
    if (errno != ENXIO || waited >= kFifoReaderWaitMs) return -1;
    ::usleep(100'000);
  }
}

/** Writes straight into a FIFO, a device or a socket. */
void write_directly(const OutputFile& out, const fs::path& target, const std::string& text) {
  std::error_code ec;
  const bool fifo = fs::is_fifo(fs::status(target, ec));
  const int fd = fifo ? open_fifo(target) : ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0 && fifo && errno == ENXIO) {
    cannot_write(out,
                 fmt::format("a FIFO that no process read from in {} s", kFifoReaderWaitMs / 1000));
  }
  if (fd < 0) cannot_write(out, std::strerror(errno));
  const bool ok = write_all(fd, text);
  const int err = errno;
  ::close(fd);
  if (!ok) cannot_write(out, std::strerror(err));
}

}  // namespace

void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<std::string>& inputs) {
  std::vector<const OutputFile*> seen;
  for (const OutputFile& out : outputs) {
    if (out.path.empty() || out.path == "-") continue;
    for (const std::string& input : inputs) {
      if (!input.empty() && same_file(out.path, input)) {
        throw InputError(out.path, out.flag,
                         fmt::format("is an input of this run ('{}'): refusing to overwrite it "
                                     "(allowed: a file that is not an input)",
                                     shown(input)));
      }
    }
    for (const OutputFile* earlier : seen) {
      if (same_file(out.path, earlier->path)) {
        throw InputError(out.path, out.flag,
                         fmt::format("is also given to {} (allowed: a file of its own for each "
                                     "output)",
                                     earlier->flag));
      }
    }
    check_writable(out);
    seen.push_back(&out);
  }
}

void write_output(const std::string& path, const std::string& text, const std::string& flag) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  const OutputFile out{path, flag};
  if (link_loop(path)) cannot_write(out, "its symbolic links lead in a loop");
  const fs::path target = resolved(path);
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  if (fs::is_directory(st)) cannot_write(out, "it is a directory");
  if (fs::exists(st) && !fs::is_regular_file(st)) return write_directly(out, target, text);
  fs::path tmp;
  const int fd = open_temporary(target, tmp);
  if (fd < 0) cannot_write(out, "");
  const bool ok = write_all(fd, text);
  if (::close(fd) != 0 || !ok) {
    fs::remove(tmp, ec);
    cannot_write(out, "");
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    cannot_write(out, "");
  }
}

}  // namespace hpz::cli
