// hpzlab: simulator and race-reproduction harness for ZeRO++ hierarchical partitioning.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "sim/builder.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/scenario.hpp"
#include "sim/time/sensitivity.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {

void add_user_flags(CLI::App& sub, UserFlags& flags, bool with_version) {
  sub.add_option("--ds-config", flags.ds_config,
                 "Your DeepSpeed config (JSON, or an accelerate config .yaml naming or "
                 "holding one): zero.ds_config, over the scenario's keys' "
                 "defaults (without a scenario, with --hf-config: the one-command form)");
  sub.add_option("--hf-config", flags.hf_config,
                 "Your model's Hugging Face config.json: model.hf_config");
  sub.add_option("--nodes", flags.nodes, "Nodes of the cluster: cluster.nodes (default 2)");
  sub.add_option("--gpus-per-node", flags.gpus_per_node,
                 "GPUs (ranks) per node: cluster.gpus_per_node (default 8)");
  // The cluster's hardware (issue 35: "what if our network were 100 Gbit/s" in one flag).
  sub.add_option("--gpu", flags.gpu,
                 "The GPU: cluster.gpu, a preset (a100-80g, the default; h100-sxm; h200)");
  sub.add_option("--nic-gbps", flags.nic_gbps,
                 "Bandwidth of one inter-node NIC in Gbit/s: cluster.nic_gbps (default 12.5)");
  sub.add_option("--nics-per-node", flags.nics_per_node,
                 "NICs per node: cluster.nics_per_node (default 1)");
  sub.add_option("--nvlink-gbytes-per-s", flags.nvlink,
                 "NVLink bandwidth of one GPU in GB/s: cluster.nvlink_gbytes_per_s (default 600)");
  sub.add_flag("--hf-trainer", flags.hf_trainer,
               "The run uses the Hugging Face Trainer (or accelerate, axolotl, LLaMA-Factory): "
               "fill the ds_config's \"auto\" values as it does (training.hf_trainer)");
  sub.add_flag("--from-config", flags.from_config,
               "The model is trained from its config, from scratch (run.load = none); without "
               "it the one-command form fine-tunes: the weights loaded after zero.Init as "
               "from_pretrained loads them (run.load = pretrained)");
  sub.add_option("--torch", flags.torch,
                 "Your torch version (run.torch_version; default: one before 2.10, as the "
                 "recordings' 2.1.2): DeepSpeed rules that apply only from some torch on");
  sub.add_option("--step-stream", flags.step_stream,
                 "The stream your script issues forward and backward from (run.step_stream): "
                 "default (the HF Trainer, accelerate, DeepSpeed's examples) or side (under "
                 "torch.cuda.stream(s)); with torch >= 2.10 the gradient hooks run there "
                 "(DeepSpeed issue 7898)");
  if (with_version) {
    sub.add_option("--deepspeed", flags.deepspeed,
                   "Your DeepSpeed version: the schedule it issues "
                   "(zero.deepspeed_version = VERSION)");
  }
}

std::vector<FlagSetting> flag_settings(const UserFlags& flags) {
  std::vector<FlagSetting> out;
  if (!flags.hf_config.empty()) out.push_back({"--hf-config", "model.hf_config", flags.hf_config});
  // Without it the one-command form fine-tunes (load_scenario).
  if (flags.from_config) out.push_back({"--from-config", "run.load", "none"});
  if (!flags.ds_config.empty()) out.push_back({"--ds-config", "zero.ds_config", flags.ds_config});
  if (!flags.nodes.empty()) out.push_back({"--nodes", "cluster.nodes", flags.nodes});
  if (!flags.gpus_per_node.empty()) {
    out.push_back({"--gpus-per-node", "cluster.gpus_per_node", flags.gpus_per_node});
  }
  if (!flags.gpu.empty()) out.push_back({"--gpu", "cluster.gpu", flags.gpu});
  if (!flags.nic_gbps.empty()) out.push_back({"--nic-gbps", "cluster.nic_gbps", flags.nic_gbps});
  if (!flags.nics_per_node.empty()) {
    out.push_back({"--nics-per-node", "cluster.nics_per_node", flags.nics_per_node});
  }
  if (!flags.nvlink.empty()) {
    out.push_back({"--nvlink-gbytes-per-s", "cluster.nvlink_gbytes_per_s", flags.nvlink});
  }
  if (flags.hf_trainer) out.push_back({"--hf-trainer", "training.hf_trainer", "true"});
  if (!flags.torch.empty()) out.push_back({"--torch", "run.torch_version", flags.torch});
  if (!flags.step_stream.empty()) {
    out.push_back({"--step-stream", "run.step_stream", flags.step_stream});
  }
  if (!flags.deepspeed.empty()) {
    out.push_back({"--deepspeed", "zero.deepspeed_version", flags.deepspeed});
  }
  return out;
}

std::vector<std::string> flag_args(const UserFlags& flags) {
  std::vector<std::string> out;
  const auto valued = [&](const char* flag, const std::string& value) {
    if (!value.empty()) out.insert(out.end(), {flag, value});
  };
  valued("--hf-config", flags.hf_config);
  if (flags.from_config) out.emplace_back("--from-config");
  valued("--ds-config", flags.ds_config);
  valued("--nodes", flags.nodes);
  valued("--gpus-per-node", flags.gpus_per_node);
  valued("--gpu", flags.gpu);
  valued("--nic-gbps", flags.nic_gbps);
  valued("--nics-per-node", flags.nics_per_node);
  valued("--nvlink-gbytes-per-s", flags.nvlink);
  if (flags.hf_trainer) out.emplace_back("--hf-trainer");
  valued("--torch", flags.torch);
  valued("--step-stream", flags.step_stream);
  valued("--deepspeed", flags.deepspeed);
  return out;
}

bool has_user_files(const UserFlags& flags) {
  return !flags.ds_config.empty() || !flags.hf_config.empty();
}

void add_scenario_options(CLI::App& sub, ScenarioOptions& opts) {
  sub.add_option("scenario", opts.scenario,
                 "Scenario file (TOML), e.g. scenarios/llama2-7b.toml; optional with "
                 "--hf-config FILE --ds-config FILE");
  sub.add_option("--set", opts.sets,
                 "Override a scenario key, e.g. --set zero.overlap_comm=false (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  sub.add_option("--json", opts.json, "Write machine-readable results to FILE ('-' = stdout)");
  add_user_flags(sub, opts.user, true);
}

void add_schedule_option(CLI::App& sub, std::string& file) {
  sub.add_option("--schedule", file,
                 "Use the schedule in FILE (hpzlab's schedule JSON, e.g. from `hpzlab record` or "
                 "`hpzlab schedule --json`) instead of building one; the scenario supplies the "
                 "cluster (its world size must be the schedule's), costs and run settings, and "
                 "run.steps becomes the schedule's step count");
}

std::vector<std::string> inputs_of(const ScenarioOptions& opts) {
  return {opts.scenario, opts.schedule, opts.user.ds_config, opts.user.hf_config};
}

std::string notes_text(const Scenario& scenario) {
  std::string out;
  for (const std::string& note : scenario.notes) out += "note: " + note + "\n";
  return out;
}

Scenario load(const std::string& scenario, const UserFlags& flags,
              const std::vector<Override>& overrides) {
  if (scenario.empty() && !has_user_files(flags)) {
    throw InputError(
        "", "scenario",
        "is required (a scenario file, or your own --hf-config FILE --ds-config FILE)");
  }
  return load_scenario(scenario, overrides, flag_settings(flags));
}

Scenario load(const ScenarioOptions& opts) {
  std::vector<Override> overrides;
  for (const auto& s : opts.sets) overrides.push_back(parse_override(s));
  Scenario sc = load(opts.scenario, opts.user, overrides);
  // A DeepSpeed defect of this release on this run (not an ordering bug: no schedule, timing or
  // taint replay shows it) is said under every engine's output; `check` names it under its
  // verdict and counts it as a finding.
  for (const ReleaseRule* r : scenario_defects(sc)) {
    sc.notes.push_back(fmt::format(
        "DeepSpeed {} has the defect `{}` on this run ({}; {}, {}): not an ordering bug, so "
        "this output does not show it (`hpzlab check` names it, `hpzlab releases` says what "
        "it does)",
        canonical_deepspeed_version(sc.zero.deepspeed_version), r->id, condition_of(*r), r->pr,
        fixed_label(*r)));
  }
  return sc;
}

std::string source_dir() {
  const char* env = std::getenv("HPZLAB_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(HPZLAB_SOURCE_DIR);
}

Schedule read_schedule(const std::string& file) {
  Schedule s = read_schedule_file(file);
  s.scenario = file;
  return s;
}

void check_world_size(const Scenario& sc, const Schedule& s, const std::string& file) {
  const int world = sc.cluster.world_size();
  if (s.world_size == world) return;
  throw InputError(
      file, "world_size",
      fmt::format("{} in the schedule, but {} has {} ranks ({} nodes x {} GPUs)", s.world_size,
                  sc.path, world, sc.cluster.nodes, sc.cluster.gpus_per_node));
}

Schedule schedule_for(Scenario& sc, const std::string& file, Engines engines) {
  if (file.empty()) return build_schedule(sc, engines);
  Schedule s = read_schedule(file);
  check_world_size(sc, s, file);
  sc.run.steps = step_count(s);
  // run.spin_before_copy_us puts its spins into a schedule that has none of its own (a
  // recording), where the builder would have put them; one it built keeps its own.
  if (sc.run.spin_before_copy_us > 0 && !has_repro_spins(s)) {
    return with_spin_before_secondary_copies(s, sc.run.spin_before_copy_us);
  }
  sc.run.spin_before_copy_us = 0;
  return s;
}

void guard_every_rank(const Schedule& schedule, double bytes_per_op, const std::string& what,
                      double per_rank_pair) {
  std::uint64_t ops = 0;
  for (const RankSchedule& r : schedule.ranks) ops += r.ops.size();
  const auto ranks = static_cast<double>(schedule.ranks.size());
  const double bytes = static_cast<double>(ops) * bytes_per_op + ranks * ranks * per_rank_pair;
  guard_engine_memory(
      schedule.scenario, bytes, schedule_budget(), what,
      per_rank_pair > 0
          ? fmt::format("{:.3g} ops x ~{} B and {:.3g} ranks squared x ~{} B of "
                        "clocks",
                        static_cast<double>(ops), bytes_per_op, ranks, per_rank_pair)
          : fmt::format("{:.3g} ops x ~{} B", static_cast<double>(ops), bytes_per_op));
}

void guard_check_every_rank(const Schedule& schedule, bool bytes_too, const std::string& what) {
  guard_every_rank(schedule, bytes_too ? kCheckEveryRankPerOp : kWalkEveryRankPerOp, what);
}

void guard_every_rank_times(const Schedule& schedule) {
  guard_every_rank(
      schedule, kTimesPerOp,
      fmt::format("keeping all {} ranks' op times (--op-times, --trace)", schedule.ranks.size()),
      0);
}

void guard_sensitivity_every_rank(const Schedule& schedule) {
  guard_every_rank(schedule, time::kSensitivityRunsAtOnce * kSimEveryRankPerOp,
                   fmt::format("re-simulating all {} ranks for --sensitivity ({} at once)",
                               schedule.ranks.size(), time::kSensitivityRunsAtOnce),
                   0);
}

void guard_simulation(time::SimOptions& options, const Schedule& schedule) {
  // A world that does not fold onto node 0 is simulated and checked rank by rank: refused
  // before any child starts where this machine cannot hold that.
  options.before_simulating_every_rank = [&schedule](const std::string& why) {
    guard_every_rank(schedule, kSimEveryRankPerOp + kCheckEveryRankPerOp,
                     fmt::format("simulating all {} ranks{}", schedule.ranks.size(),
                                 why.empty() ? "" : " (" + why + ")"));
  };
  options.before_every_rank = [&schedule](bool bytes_too) {
    guard_check_every_rank(schedule, bytes_too,
                           fmt::format("checking all {} ranks for races", schedule.ranks.size()));
  };
}

void require_at_least(const std::string& flag, double value, double min) {
  if (value >= min) return;
  throw InputError("", flag, fmt::format("{} is out of range (allowed: {} or more)", value, min));
}

void require_between(const std::string& flag, double value, double min, double max) {
  if (value >= min && value <= max) return;
  throw InputError("", flag,
                   fmt::format("{} is out of range (allowed: {} to {})", value, min, max));
}

void require_within(const std::string& flag, double value, double bound, double max) {
  if (value > bound && value <= max) return;
  throw InputError(
      "", flag,
      fmt::format("{} is out of range (allowed: more than {} and at most {})", value, bound, max));
}

std::string version() {
  return HPZLAB_VERSION;
}

std::string version_line() {
  return "hpzlab " + version();
}

void setup_version(CLI::App& app, int& exit_code) {
  CLI::App* sub = app.add_subcommand("version", "Print the program name and version");
  sub->callback([&exit_code] {
    std::printf("%s\n", version_line().c_str());
    exit_code = kExitOk;
  });
}

void check_subcommand_name(const CLI::App& app, int argc, char** argv) {
  // The program's own options (--help, --version) take no value: a first argument that is not
  // an option names the subcommand.
  if (argc < 2 || argv[1][0] == '-') return;
  const std::string name = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == name) return;
    names.push_back(sub->get_name());
  }
  const std::optional<std::string> suggestion = closest_name(name, names);
  std::string allowed;
  for (const std::string& n : names) allowed += (allowed.empty() ? "" : ", ") + n;
  throw InputError(
      "", "",
      fmt::format("unknown subcommand '{}'{} (allowed: {})", name,
                  suggestion ? fmt::format("; did you mean '{}'?", *suggestion) : "", allowed));
}

/** An empty argument (`--json ''`, `--json=`, `--rank ''`) is never a value hpzlab takes: as an
 *  output it silently wrote nothing (issue 34), into an optional<int> CLI11 read it as no value
 *  at all. Refused before parsing, naming the option. */
void check_empty_arguments(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string flag =
        a.empty() ? (i > 1 ? std::string(argv[i - 1]) : std::string()) : a.substr(0, a.size() - 1);
    if (a.empty() || (a.starts_with("--") && a.ends_with("="))) {
      throw InputError("", flag, "expected a value, got ''");
    }
  }
}

/** CLI11's parse error in the program's one-line form: the subcommand, what is wrong and, for an
 *  option no subcommand option is named, the closest one (CLI11's own message is two lines
 *  without `hpzlab: error:`; issue 35). */
std::string parse_error_line(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (argc > 1 && s->get_name() == argv[1]) sub = s;
  }
  std::string what = e.what();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  if (sub == nullptr) return what;
  std::vector<std::string> names;
  for (const CLI::Option* o : sub->get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back(n);
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) continue;
    const std::string name = arg.substr(2, arg.find('=') - 2);
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    const std::optional<std::string> near = closest_name(name, names);
    return fmt::format("{}: unknown option '--{}'{} (`hpzlab {} --help` lists its options)",
                       sub->get_name(), name,
                       near ? fmt::format("; did you mean '--{}'?", *near) : "", sub->get_name());
  }
  return fmt::format("{}: {} (`hpzlab {} --help` lists its options)", sub->get_name(), what,
                     sub->get_name());
}

}  // namespace hpz::cli

int main(int argc, char** argv) {
  CLI::App app{
      "hpzlab: finds the ordering bugs of DeepSpeed ZeRO-3 with ZeRO++ hierarchical "
      "partitioning (hpZ), times them and replays what they do.\nTwo forms: your own files, "
      "`hpzlab check --ds-config ds_config.json --hf-config config.json --nodes 2 "
      "--gpus-per-node 8 --deepspeed 0.13.4` (every flag: `hpzlab check --help`), or a scenario "
      "file first, `hpzlab sim scenarios/llama2-7b.toml` (scenarios/README.md); `compare` takes "
      "two JSON files, `record` the recorder's options, `order --check/--update` golden files."};
  app.require_subcommand(1);
  app.set_version_flag("--version", hpz::cli::version_line(),
                       "Print the program name and version, and exit");
  int exit_code = hpz::kExitOk;
  hpz::cli::setup_schedule(app, exit_code);
  hpz::cli::setup_order(app, exit_code);
  hpz::cli::setup_explore(app, exit_code);
  hpz::cli::setup_check(app, exit_code);
  hpz::cli::setup_sim(app, exit_code);
  hpz::cli::setup_sweep(app, exit_code);
  hpz::cli::setup_real(app, exit_code);
  hpz::cli::setup_repro(app, exit_code);
  hpz::cli::setup_compare(app, exit_code);
  hpz::cli::setup_record(app, exit_code);
  hpz::cli::setup_releases(app, exit_code);
  hpz::cli::setup_version(app, exit_code);
  try {
    hpz::cli::check_subcommand_name(app, argc, argv);
    hpz::cli::check_empty_arguments(argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "hpzlab: error: %s\n",
                 hpz::cli::parse_error_line(app, e, argc, argv).c_str());
    return hpz::kExitBadInput;
  } catch (const hpz::InputError& e) {
    hpz::cli::end_progress_line();
    std::fprintf(stderr, "hpzlab: error: %s\n", e.what());
    return hpz::kExitBadInput;
  } catch (const std::exception& e) {
    hpz::cli::end_progress_line();
    std::fprintf(stderr, "hpzlab: internal error (please report): %s\n", e.what());
    return hpz::kExitInternal;
  }
  // What went to standard output may still sit in its buffer: a full disk (or a closed file)
  // shows only when it is flushed. A CI step `check ... --sarif - > results.sarif` must not pass
  // with a broken file (issue 34).
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int err = errno;
    hpz::cli::end_progress_line();
    std::fprintf(stderr,
                 "hpzlab: error: standard output: cannot write (%s); what it holds is "
                 "incomplete\n",
                 err != 0 ? std::strerror(err) : "write error");
    return hpz::kExitBadInput;
  }
  return exit_code;
}
