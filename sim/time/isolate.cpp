// run_isolated(): SimGrid's engine is a process-wide singleton, so every run gets a forked child
// that simulates and writes its EngineRun back through a pipe.
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>

#include "sim/time/engine.hpp"

namespace hpz::time {
namespace {

/** Writes `n` bytes or throws (the parent then sees a short result). */
void write_all(int fd, const void* p, std::size_t n) {
  const char* at = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::write(fd, at, n);
    if (k <= 0) throw std::runtime_error("writing the simulation result failed");
    at += k;
    n -= static_cast<std::size_t>(k);
  }
}

/** Reads exactly `n` bytes or throws. */
void read_exact(int fd, void* p, std::size_t n) {
  char* at = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::read(fd, at, n);
    if (k <= 0) throw std::runtime_error("simulation child returned a short result");
    at += k;
    n -= static_cast<std::size_t>(k);
  }
}

template <typename T>
void put_value(int fd, T v) {
  write_all(fd, &v, sizeof v);
}

template <typename T>
void put_vector(int fd, const std::vector<T>& v) {
  put_value<std::uint64_t>(fd, v.size());
  write_all(fd, v.data(), v.size() * sizeof(T));
}

template <typename T>
T take_value(int fd) {
  T v{};
  read_exact(fd, &v, sizeof v);
  return v;
}

template <typename T>
std::vector<T> take_vector(int fd) {
  std::vector<T> v(take_value<std::uint64_t>(fd));
  read_exact(fd, v.data(), v.size() * sizeof(T));
  return v;
}

/** Streams the run straight from its vectors into the pipe (no intermediate copy: at 1,024
 *  ranks the timeline is hundreds of MB). */
void send_run(int fd, const EngineRun& run) {
  put_value(fd, run.timeline.seed);
  put_value(fd, run.stats);
  put_value<std::uint64_t>(fd, run.timeline.ranks.size());
  for (const auto& rank : run.timeline.ranks) put_vector(fd, rank);
  put_value<std::uint64_t>(fd, run.link_bytes.size());
  for (const auto& step : run.link_bytes) put_vector(fd, step);
}

/** Reads what send_run() wrote, in the same order, straight into the result's vectors. */
EngineRun receive_run(int fd) {
  EngineRun run;
  run.timeline.seed = take_value<std::uint64_t>(fd);
  run.stats = take_value<EngineStats>(fd);
  run.timeline.ranks.resize(take_value<std::uint64_t>(fd));
  for (auto& rank : run.timeline.ranks) rank = take_vector<OpTime>(fd);
  run.link_bytes.resize(take_value<std::uint64_t>(fd));
  for (auto& step : run.link_bytes) step = take_vector<double>(fd);
  return run;
}

}  // namespace

ChildRun::ChildRun(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed,
                   const NodeQuotient* quotient) {
  void* shared = ::mmap(nullptr, sizeof(EngineProgress), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error("mmap() failed");
  progress_ = new (shared) EngineProgress;
  int fds[2];
  if (::pipe(fds) != 0) {
    ::munmap(shared, sizeof(EngineProgress));
    throw std::runtime_error("pipe() failed");
  }
  std::fflush(nullptr);  // the child must not flush the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    ::munmap(shared, sizeof(EngineProgress));
    throw std::runtime_error("fork() failed");
  }
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    try {
      send_run(fds[1], run_engine(in, schedule, seed, progress_, quotient));
    } catch (const std::exception&) {
      code = 1;
    }
    ::close(fds[1]);
    ::_exit(code);
  }
  ::close(fds[1]);
  pid_ = pid;
  fd_ = fds[0];
}

ChildRun::ChildRun(ChildRun&& other) noexcept
    : pid_(other.pid_), fd_(other.fd_), progress_(other.progress_) {
  other.pid_ = -1;
  other.fd_ = -1;
  other.progress_ = nullptr;
}

ChildRun::~ChildRun() {
  if (progress_ != nullptr) ::munmap(progress_, sizeof(EngineProgress));
  if (fd_ >= 0) ::close(fd_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

EngineRun ChildRun::wait() {
  EngineRun run;
  bool complete = true;
  try {
    run = receive_run(fd_);
  } catch (const std::runtime_error&) {
    complete = false;  // the child died or failed: its exit status says which
  }
  ::close(fd_);
  fd_ = -1;
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("the simulation child process failed");
  }
  if (!complete) throw std::runtime_error("simulation child returned a short result");
  return run;
}

bool ChildRun::ready(int timeout_ms) const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) != 0;  // readable, closed, or an error wait() will report
}

double ChildRun::fraction() const {
  const auto total = progress_->ops_total.load(std::memory_order_relaxed);
  const auto done = progress_->ops_done.load(std::memory_order_relaxed);
  return total == 0 ? 0.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
}

EngineRun run_isolated(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed) {
  return ChildRun(in, schedule, seed).wait();
}

}  // namespace hpz::time
