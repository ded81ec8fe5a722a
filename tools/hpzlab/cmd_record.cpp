// `hpzlab record ARGS...`: runs the recorder (tools/record in the source tree: real DeepSpeed on
// this CPU, writing the schedule it issues as hpzlab's IR; docs/record.md) with every argument
// after `record` passed through unchanged, `--help` included. The exit code is the recorder's;
// 2 when it is missing.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/accelerate_config.hpp"
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

/** The value of `flag` in args (`--flag VALUE` or `--flag=VALUE`) and where it sits; npos when
 *  absent. */
std::size_t find_value(const std::vector<std::string>& args, const std::string& flag) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return i + 1;
    if (args[i].starts_with(flag + "=")) return i;
  }
  return std::string::npos;
}

std::string value_at(const std::vector<std::string>& args, std::size_t i, const std::string& flag) {
  return args[i].starts_with(flag + "=") ? args[i].substr(flag.size() + 1) : args[i];
}

/** `--ds-config accelerate.yaml` (issue 35): the ds_config accelerate launches with, written
 *  beside --out as OUT-ds_config.json (its "auto" values left for the recorder, which fills them
 *  as the HF Trainer does), and the YAML's machines and processes as --nodes and
 *  --gpus-per-node unless given. Other arguments pass through unchanged. */
std::vector<std::string> with_accelerate_config(std::vector<std::string> args) {
  const std::size_t at = find_value(args, "--ds-config");
  if (at == std::string::npos) return args;
  const std::string path = value_at(args, at, "--ds-config");
  if (!is_accelerate_config_path(path)) return args;
  const AccelerateConfig acc = read_accelerate_config(path, "--ds-config", "--ds-config");
  if (!acc.zero3_init) {
    throw InputError(path, "deepspeed_config.zero3_init_flag",
                     "false: the model is built outside deepspeed.zero.Init, and the recorder "
                     "builds it under zero.Init (allowed: true, accelerate's default at ZeRO-3)");
  }
  const std::size_t out_at = find_value(args, "--out");
  if (out_at == std::string::npos) {
    throw InputError("", "--out",
                     "is required (with an accelerate config the ds_config it "
                     "launches with is written beside it)");
  }
  const std::filesystem::path out = value_at(args, out_at, "--out");
  const std::string json_path =
      (out.parent_path() / (out.stem().string() + "-ds_config.json")).string();
  write_output(json_path, acc.ds_config.dump(1) + "\n", "--ds-config");
  args[at] = at > 0 && args[at - 1] == "--ds-config" ? json_path : "--ds-config=" + json_path;
  for (const std::string& note : acc.notes) fmt::print(stderr, "hpzlab record: note: {}\n", note);
  fmt::print(stderr, "hpzlab record: {}: the ds_config accelerate launches with is {}\n", path,
             json_path);
  if (acc.num_processes && find_value(args, "--nodes") == std::string::npos &&
      find_value(args, "--gpus-per-node") == std::string::npos) {
    const int nodes = acc.num_machines.value_or(1);
    args.insert(args.end(), {"--nodes", std::to_string(nodes), "--gpus-per-node",
                             std::to_string(*acc.num_processes / nodes)});
  }
  return args;
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
  sub->callback([sub] { exec_recorder(with_accelerate_config(sub->remaining())); });
}

}  // namespace hpz::cli
