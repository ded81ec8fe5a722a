#include "tools/hpzlab/sweep/runner.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "tools/hpzlab/sweep/fields.hpp"

extern char** environ;

namespace hpz::sweep {
namespace {

namespace fs = std::filesystem;

pid_t spawn(const std::string& program, const Job& job) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, job.stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> argv_text = {program};
  argv_text.insert(argv_text.end(), job.args.begin(), job.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw std::runtime_error("cannot start " + program + ": " + std::strerror(rc));
  }
  return pid;
}

Outcome outcome_of(int status) {
  if (WIFEXITED(status)) return {WEXITSTATUS(status), 0};
  if (WIFSIGNALED(status)) return {-1, WTERMSIG(status)};
  return {-1, 0};
}

}  // namespace

std::string own_executable() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : self.string();
}

void run_jobs(const std::string& program, const std::vector<Job>& jobs, int parallel,
              const std::function<void(const Job&, const Outcome&)>& finished) {
  std::map<pid_t, const Job*> running;
  std::size_t next = 0;
  while (next < jobs.size() || !running.empty()) {
    while (next < jobs.size() && static_cast<int>(running.size()) < parallel) {
      running[spawn(program, jobs[next])] = &jobs[next];
      ++next;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;  // not one of ours
    const Job* job = it->second;
    running.erase(it);
    finished(*job, outcome_of(status));
  }
}

std::string error_line_of(const std::string& text) {
  std::istringstream in(text);
  std::string line, last, error;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    last = line;
    if (line.rfind("hpzlab: ", 0) == 0) error = line;
  }
  std::string chosen = error.empty() ? last : error;
  const std::string prefix = "hpzlab: error: ";
  if (chosen.rfind(prefix, 0) == 0) chosen = chosen.substr(prefix.size());
  // A progress bar's carriage returns: keep what was drawn last.
  const std::size_t cr = chosen.rfind('\r');
  // Control characters escaped, the line cut, bytes that are not UTF-8 replaced (a child's
  // stderr is anything; issue 34: one made dumping the row throw): it goes into JSON and CSV
  // cells.
  return valid_utf8(shown(cr == std::string::npos ? chosen : chosen.substr(cr + 1), 400));
}

std::string last_error_line(const std::string& stderr_path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(stderr_path, ec))) return "";
  try {
    return error_line_of(
        read_input_file(stderr_path, stderr_path, "", "cannot read the child's error output"));
  } catch (const InputError& e) {
    return valid_utf8(e.what());
  }
}

std::optional<std::string> read_command_output(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  try {
    return read_input_file(path, path, "", "cannot read " + what);
  } catch (const InputError& e) {
    throw InputError(
        "", "",
        std::string(e.what()) + " (allowed: the regular file the command wrote there, or nothing)");
  }
}

void lock_dir(const std::string& dir, const std::string& flag) {
  const std::string path = dir + "/sweep.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) throw InputError(path, flag, std::string("cannot open: ") + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(dir, flag,
                     err == EWOULDBLOCK
                         ? "another hpzlab sweep is working in this directory (allowed: wait "
                           "for it to end, or another directory)"
                         : std::string("cannot lock: ") + std::strerror(err));
  }
  // Held open, never closed: the lock lasts as long as this process (children do not inherit
  // it: O_CLOEXEC).
}

nlohmann::json read_sweep_json(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return nullptr;
  try {
    return parse_json_input(read_input_file(path, path, "", "cannot read"), path, "not JSON");
  } catch (const InputError&) {
    return nullptr;
  }
}

}  // namespace hpz::sweep
