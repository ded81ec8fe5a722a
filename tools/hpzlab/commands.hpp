// The subcommands of `hpzlab`. Each lives in its own file: an options struct, a setup function
// that binds the options, and a callback that only calls the library. main() owns error handling.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"
#include "sim/replay/replay.hpp"
#include "sim/scenario.hpp"
#include "sim/time/report.hpp"
#include "sim/time/simulate.hpp"

namespace hpz::cli {

/** The one-command form's flags (issue 17): the user's own DeepSpeed and model configs and the
 *  cluster's size, on a scenario (they win over its keys, --set over them) or, without one, on
 *  the documented defaults (scenarios/README.md). Values stay text: load_scenario reads them as
 *  it reads --set, so errors name the flag, the key and the allowed values. */
struct UserFlags {
  std::string ds_config;      ///< --ds-config FILE: zero.ds_config
  std::string hf_config;      ///< --hf-config FILE: model.hf_config
  std::string nodes;          ///< --nodes N: cluster.nodes
  std::string gpus_per_node;  ///< --gpus-per-node G: cluster.gpus_per_node
  std::string gpu;            ///< --gpu PRESET: cluster.gpu
  std::string nic_gbps;       ///< --nic-gbps X: cluster.nic_gbps
  std::string nics_per_node;  ///< --nics-per-node N: cluster.nics_per_node
  std::string nvlink;         ///< --nvlink-gbytes-per-s X: cluster.nvlink_gbytes_per_s
  std::string deepspeed;      ///< --deepspeed VERSION: the DeepSpeed builder at that version
  std::string torch;          ///< --torch VERSION: run.torch_version
  std::string step_stream;    ///< --step-stream default|side: run.step_stream
  bool hf_trainer = false;    ///< --hf-trainer: training.hf_trainer ("auto" as the Trainer fills)
  bool from_config = false;   ///< --from-config: run.load = none (trained from scratch)
};

/** Binds --ds-config, --hf-config, --nodes, --gpus-per-node, --hf-trainer (and --deepspeed VERSION
 * when `with_version`: `check` binds its own, a list). */
void add_user_flags(CLI::App& sub, UserFlags& flags, bool with_version);

/** The keys the flags set, in the order load_scenario applies them. */
std::vector<FlagSetting> flag_settings(const UserFlags& flags);

/** The flags as a child process is given them, e.g. {"--ds-config", "ds.json", "--hf-trainer"}
 *  (`sweep` runs `hpzlab sim` with them). */
std::vector<std::string> flag_args(const UserFlags& flags);

/** Whether any of the user's files was given (the scenario file is then optional). */
bool has_user_files(const UserFlags& flags);

/** Options every subcommand takes: the scenario first, overrides, machine-readable output. */
struct ScenarioOptions {
  std::string scenario;           ///< path of the scenario TOML ("" = the one-command form)
  std::vector<std::string> sets;  ///< --set key=value, in order
  std::string json;               ///< --json FILE ("-" = standard output, "" = none)
  std::string schedule;           ///< --schedule FILE: use it instead of building ("" = build)
  UserFlags user;                 ///< --ds-config, --hf-config, --nodes, --gpus-per-node, ...
};

/** Binds SCENARIO, --set, --json and the user flags (UserFlags) on a subcommand. */
void add_scenario_options(CLI::App& sub, ScenarioOptions& opts);

/** Binds --schedule FILE on a subcommand. */
void add_schedule_option(CLI::App& sub, std::string& file);

/** The files a run reads: the scenario, the user's files and the --schedule file, if any. */
std::vector<std::string> inputs_of(const ScenarioOptions& opts);

/** The scenario's notes (what loading it read, ignored, defaulted or overrode: Scenario::notes),
 *  a "note: ..." line each, for a subcommand's text output (issue 17: notes everywhere). */
std::string notes_text(const Scenario& scenario);

/** Loads the scenario (or, without one, the user's files on the defaults) with the flags and
 *  overrides; throws InputError, also when neither a scenario nor the user's files are given.
 *  A known DeepSpeed defect of the scenario's release on it (known_defects) is one more note. */
Scenario load(const ScenarioOptions& opts);

/** As load(), for one scenario path of several (`check`), with the flags and overrides given. */
Scenario load(const std::string& scenario, const UserFlags& flags,
              const std::vector<Override>& overrides);

/** A schedule from a file (read_schedule_file), named after the file in reports. */
Schedule read_schedule(const std::string& file);

/** Throws InputError naming `file` unless the schedule has the scenario's world size. */
void check_world_size(const Scenario& scenario, const Schedule& schedule, const std::string& file);

/** What a subcommand runs: the schedule built from `scenario`, or, when `file` is given, the one
 *  read from it (read_schedule, check_world_size), whose step count then replaces run.steps
 *  (and which has any spin kernels in it already: run.spin_before_copy_us becomes 0). */
Schedule schedule_for(Scenario& scenario, const std::string& file,
                      Engines engines = Engines::kEveryRank);

/** Resident bytes of the engines' walks of every rank: per op, from the growth between
 *  llama2-70b.toml at 128 and 256 GPUs (2026-12-02, a Release build), the check rank by rank
 *  43 B (--per-rank), happens-before on every rank with each class's representative checking
 *  bytes 19 B (run.load = "pretrained"), `sim --per-rank` 70 B with its check; and per pair of
 *  ranks (every rank's clocks come to hold the others' ticks), 3.5 B, fitted to tiny.toml at
 *  10,000 and 20,000 ranks (0.71 and 2.12 GB with a pretrained load; 15.5 GB at 60,000). */
inline constexpr double kCheckEveryRankPerOp = 48;
inline constexpr double kWalkEveryRankPerOp = 24;
inline constexpr double kSimEveryRankPerOp = 32;
inline constexpr double kClocksPerRankPair = 4;
/** Every rank's op times, unfolded from a run by class for --op-times and --trace: one OpTime
 *  an op. */
inline constexpr double kTimesPerOp = sizeof(OpTime);

/** Refuses (InputError) a walk of every rank of `schedule` at about `bytes_per_op` an op and
 *  `per_rank_pair` a pair of ranks (kClocksPerRankPair: a walk's clocks) that would take more
 *  than half of this machine's memory; `what` names the walk and why. */
void guard_every_rank(const Schedule& schedule, double bytes_per_op, const std::string& what,
                      double per_rank_pair = kClocksPerRankPair);

/** The hook check::ClassCheck::before_every_rank calls: guard_every_rank for a check of every
 *  rank rank by rank (`bytes_too`, kCheckEveryRankPerOp) or for a walk of happens-before only
 *  (kWalkEveryRankPerOp); `what` names it. */
void guard_check_every_rank(const Schedule& schedule, bool bytes_too, const std::string& what);

/** Refuses what every rank's op times, kept for `sim --op-times` or `--trace` (kTimesPerOp),
 *  would need beyond half of memory. */
void guard_every_rank_times(const Schedule& schedule);

/** Refuses what --sensitivity's re-simulations of every rank, kSensitivityRunsAtOnce at once,
 *  would need beyond half of memory (where they do not fold: time::sensitivity's hook). */
void guard_sensitivity_every_rank(const Schedule& schedule);

/** Gives `options` the hooks that refuse, in one line, a simulation or race check of every
 *  rank of `schedule` this machine cannot hold (`sim`, `check --sensitivity`). */
void guard_simulation(time::SimOptions& options, const Schedule& schedule);

/** Runs `fn`, an engine on a schedule read from `file` ("" = a built one): an engine's
 *  std::invalid_argument (a schedule it cannot handle) becomes an InputError naming the file. */
template <class Fn>
auto on_schedule(const std::string& file, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::invalid_argument& e) {
    if (file.empty()) throw;
    throw InputError(file, "", e.what());
  }
}

/** --trace FILE, --trace-ranks LIST and --trace-steps LIST: what `sim` and `real` take. */
struct TraceOptions {
  std::string file;   ///< --trace FILE: Chrome trace-event JSON ("" = none; FILE.gz: gzip'd)
  std::string ranks;  ///< --trace-ranks LIST: the ranks the trace shows ("" = every rank)
  std::string steps;  ///< --trace-steps LIST: the steps it shows ("" = every step)
};

/** Adds the three trace options; `of` says which run is traced ("of the first run"). */
void add_trace_options(CLI::App& sub, TraceOptions& opts, const std::string& of);

/** The ranks and steps the options name, each within the schedule's (InputError naming the
 *  flag and the allowed numbers otherwise). */
time::TraceFilter trace_filter(const TraceOptions& opts, const Schedule& schedule);

/** Writes a rendered trace to opts.file: gzip'd when it ends in .gz (Perfetto opens it). */
void write_trace(const TraceOptions& opts, const std::string& trace);

/** An output file of a run and the flag it was given to (e.g. "--trace"). */
struct OutputFile {
  std::string path;  ///< "" = not asked for, "-" = standard output
  std::string flag;
};

/** Checks every output of a run before anything is written (or computed): each can be
 *  written (an existing directory that is writable, not a directory itself), none is one of
 *  `inputs` (the scenario, a schedule file), no two name the same file. Throws InputError
 *  naming the path and its flag. */
void check_outputs(const std::vector<OutputFile>& outputs, const std::vector<std::string>& inputs);

/** Writes text to path ("-" = standard output) all at once: a temporary file next to the
 *  file (a symlink's target) renamed into place, so a failed run never leaves a half-written
 *  file; a FIFO or device (/dev/null) is written directly, never replaced. Throws InputError
 *  naming the path and `flag`, the option the path was given to (e.g. "--trace"), if it
 *  cannot. */
void write_output(const std::string& path, const std::string& text, const std::string& flag);

/** True when progress is shown: standard error is a terminal. */
bool progress_on();

/** A one-line progress bar on standard error, only when it is a terminal: a bar filled to
 *  done / total, then `what`; ends the line once done reaches total. */
void progress_bar(double done, int total, const std::string& what);

/** Ends the progress bar's line if one is drawn and not full (main() calls it before an error
 *  message, so that the message starts a line of its own). */
void end_progress_line();

/** Runs fn. When progress_on(), on a thread of its own while this one redraws
 *  progress_bar(done, total, what + the seconds it has run) four times a second (for work that
 *  cannot report its share done); rethrows what fn throws. */
void run_showing_progress(double done, int total, const std::string& what,
                          const std::function<void()>& fn);

/** Throws InputError ("FLAG: VALUE is out of range (allowed: MIN or more)") unless
 *  value >= min; a NaN is out of range. For numeric flags, checked in the subcommand's callback
 *  so that the error is one line like every other input error. */
void require_at_least(const std::string& flag, double value, double min);

/** As require_at_least, for a flag that must be in [min, max]. */
void require_between(const std::string& flag, double value, double min, double max);

/** As require_at_least, for a flag that must be greater than `bound` and at most `max` (a
 *  timeout: `inf` or 1e300 s would overflow the clock's deadline). */
void require_within(const std::string& flag, double value, double bound, double max);

/** --mode (auto | numeric | taint) for `scenario`: auto is replay::default_mode (numeric when
 *  the numeric replay can hold and compute the model, else taint); numeric on a model it cannot
 *  throws InputError naming `file` and --mode. Shared by repro and explore. */
replay::Mode replay_mode(const std::string& mode, const Scenario& scenario,
                         const std::string& file);

/** Registers `hpzlab schedule`; the callback stores its exit code in exit_code. */
void setup_schedule(CLI::App& app, int& exit_code);
/** Registers `hpzlab order` (canonical issue orders and golden files). */
void setup_order(CLI::App& app, int& exit_code);
/** Registers `hpzlab explore` (interleaving exploration). */
void setup_explore(CLI::App& app, int& exit_code);
/** Registers `hpzlab check`. */
void setup_check(CLI::App& app, int& exit_code);
/** Registers `hpzlab sim`. */
void setup_sim(CLI::App& app, int& exit_code);
/** Registers `hpzlab sweep`. */
void setup_sweep(CLI::App& app, int& exit_code);
/** Registers `hpzlab real`. */
void setup_real(CLI::App& app, int& exit_code);
/** Registers `hpzlab repro`. */
void setup_repro(CLI::App& app, int& exit_code);
/** Registers `hpzlab compare` (takes two JSON files, not a scenario). */
void setup_compare(CLI::App& app, int& exit_code);
/** Registers `hpzlab record` (runs tools/record with the arguments after `record`). */
void setup_record(CLI::App& app, int& exit_code);
/** `hpzlab releases`: the DeepSpeed release table (cmd_releases.cpp). */
void setup_releases(CLI::App& app, int& exit_code);

/** Registers `hpzlab version` (what --version prints). */
void setup_version(CLI::App& app, int& exit_code);

/** hpzlab's version: project()'s in CMakeLists.txt. */
std::string version();

/** "hpzlab VERSION". */
std::string version_line();

/** Throws InputError ("unknown subcommand 'X'; did you mean 'Y'? (allowed: ...)") when the
 *  first argument is neither an option nor one of app's subcommands. */
void check_subcommand_name(const CLI::App& app, int argc, char** argv);

/** The recorder (tools/record in source_dir()); throws InputError naming `flag` when it is not
 *  there or cannot be run. */
std::string recorder_script(const std::string& flag);

/** hpzlab's source tree: $HPZLAB_SOURCE_DIR, else where it was built from. */
std::string source_dir();

}  // namespace hpz::cli
