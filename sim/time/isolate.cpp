// run_isolated(): SimGrid's engine is a process-wide singleton, so every run gets a forked child
// that simulates and writes its EngineRun back through a pipe.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "sim/time/engine.hpp"

namespace hpz::time {
namespace {

void put(std::string& out, const void* p, std::size_t n) {
  out.append(static_cast<const char*>(p), n);
}

template <typename T>
void put_value(std::string& out, T v) {
  put(out, &v, sizeof v);
}

template <typename T>
void put_vector(std::string& out, const std::vector<T>& v) {
  put_value<std::uint64_t>(out, v.size());
  put(out, v.data(), v.size() * sizeof(T));
}

/** Reads what put_* wrote, in the same order. */
class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  T value() {
    T v{};
    take(&v, sizeof v);
    return v;
  }
  template <typename T>
  std::vector<T> vector() {
    std::vector<T> v(value<std::uint64_t>());
    take(v.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  void take(void* p, std::size_t n) {
    if (at_ + n > in_.size()) throw std::runtime_error("simulation child returned a short result");
    std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  const std::string& in_;
  std::size_t at_ = 0;
};

std::string serialize(const EngineRun& run) {
  std::string out;
  put_value(out, run.timeline.seed);
  put_value(out, run.stats);
  put_value<std::uint64_t>(out, run.timeline.ranks.size());
  for (const auto& rank : run.timeline.ranks) put_vector(out, rank);
  put_value<std::uint64_t>(out, run.link_bytes.size());
  for (const auto& step : run.link_bytes) put_vector(out, step);
  return out;
}

EngineRun deserialize(const std::string& in) {
  Reader reader(in);
  EngineRun run;
  run.timeline.seed = reader.value<std::uint64_t>();
  run.stats = reader.value<EngineStats>();
  run.timeline.ranks.resize(reader.value<std::uint64_t>());
  for (auto& rank : run.timeline.ranks) rank = reader.vector<OpTime>();
  run.link_bytes.resize(reader.value<std::uint64_t>());
  for (auto& step : run.link_bytes) step = reader.vector<double>();
  return run;
}

void write_all(int fd, const std::string& data) {
  std::size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::write(fd, data.data() + at, data.size() - at);
    if (n <= 0) return;
    at += static_cast<std::size_t>(n);
  }
}

std::string read_all(int fd) {
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    data.append(buf, static_cast<std::size_t>(n));
  }
  return data;
}

}  // namespace

ChildRun::ChildRun(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe() failed");
  std::fflush(nullptr);  // the child must not flush the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork() failed");
  if (pid == 0) {
    ::close(fds[0]);
    int code = 0;
    try {
      write_all(fds[1], serialize(run_engine(scenario, schedule, seed)));
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

EngineRun ChildRun::wait() {
  const std::string data = read_all(fd_);
  ::close(fd_);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("the simulation child process failed");
  }
  return deserialize(data);
}

EngineRun run_isolated(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed) {
  return ChildRun(scenario, schedule, seed).wait();
}

}  // namespace hpz::time
