// `hpzlab record ARGS...`: runs the recorder (tools/record in the source tree: real DeepSpeed on
// this CPU, writing the schedule it issues as hpzlab's IR; docs/record.md) with every argument
// after `record` passed through unchanged, `--help` included. The exit code is the recorder's;
// 2 when it is missing.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** Replaces this process with the recorder; returns only by throwing InputError. */
[[noreturn]] void exec_recorder(const std::vector<std::string>& args) {
  const std::string script = recorder_script("");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(script.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(script.c_str(), argv.data());
  throw InputError(script, "", std::string("cannot run it: ") + std::strerror(errno));
}

}  // namespace

std::string recorder_script(const std::string& flag) {
  const std::string script = source_dir() + "/tools/record";
  if (::access(script.c_str(), X_OK) != 0) {
    throw InputError(script, flag,
                     "the recorder is not there (set HPZLAB_SOURCE_DIR to hpzlab's source tree)");
  }
  return script;
}

void setup_record(CLI::App& app, int& /*exit_code: the recorder's own, through exec*/) {
  CLI::App* sub = app.add_subcommand(
      "record",
      "Run real DeepSpeed on this CPU and write the schedule it issues as hpzlab's schedule JSON, "
      "for --schedule FILE (tools/record; `hpzlab record --help` for its options)");
  // Everything after `record`, --help too, is the recorder's.
  sub->set_help_flag();
  sub->prefix_command();
  sub->callback([sub] { exec_recorder(sub->remaining()); });
}

}  // namespace hpz::cli
