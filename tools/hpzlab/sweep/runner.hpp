// Runs a sweep's simulations as child processes of this same program (`hpzlab sim ...`), a few
// at a time: SimGrid's engine is one per process, and separate processes use every core.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace hpz::sweep {

/** One child process to run. */
struct Job {
  std::size_t id = 0;             ///< the caller's index, handed back in finished()
  std::vector<std::string> args;  ///< arguments after the program name
  std::string stderr_path;        ///< where the child's standard error goes (stdout: /dev/null)
};

/** How a child ended. */
struct Outcome {
  int exit_code = -1;  ///< its exit status, -1 when a signal ended it
  int signal = 0;      ///< the signal that ended it, 0 if none
};

/** The program to run the jobs with: this process's own executable (/proc/self/exe resolved). */
std::string own_executable();

/** Runs every job with `program`, at most `parallel` at once, in the order given; calls
 *  finished(job, outcome) in this thread as each one ends. Throws std::runtime_error if a child
 *  cannot be started. */
void run_jobs(const std::string& program, const std::vector<Job>& jobs, int parallel,
              const std::function<void(const Job&, const Outcome&)>& finished);

/** The last line of a child's standard error worth showing as its error ("" if none), without
 *  the "hpzlab: error: " start. Read through the guarded reader (issue 34): a link to /dev/zero
 *  or a file over the input cap gives a line saying so, not gigabytes in memory. */
std::string last_error_line(const std::string& stderr_path);

/** The line last_error_line() picks from a child's standard error `text`: the last "hpzlab: "
 *  line (without "hpzlab: error: "), else the last line that is not blank; control characters
 *  escaped, cut at 400 characters, bytes that are not UTF-8 replaced by U+FFFD. */
std::string error_line_of(const std::string& text);

/** What an emitted command left at `path` in DIR/out (its JSON or its standard error, `what`
 *  for the message): nothing when there is nothing there, else the text through the guarded
 *  reader. Anything there that is not a regular file of at most kMaxInputBytes (a directory, a
 *  link loop or a dangling link, a device, a FIFO) is InputError naming the file (issue 34). */
std::optional<std::string> read_command_output(const std::string& path, const std::string& what);

/** Takes DIR's lock (DIR/sweep.lock, flock) for the rest of this process, or throws InputError
 *  naming `flag` when another hpzlab holds it (issue 34: two `--resume` on one directory ran the
 *  same simulations and deleted each other's files). The lock goes with the process. */
void lock_dir(const std::string& dir, const std::string& flag);

/** A JSON file a sweep's child or an earlier sweep left (the JSON in DIR/out, sweep.json), read
 *  through the guarded reader (a regular file, at most kMaxInputBytes, nesting at most
 *  kMaxJsonDepth): null when it is missing, unreadable or not such JSON. A value nested 100,000
 *  deep overflowed the stack in nlohmann's plain parse. */
nlohmann::json read_sweep_json(const std::string& path);

}  // namespace hpz::sweep
