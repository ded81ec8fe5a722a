// `hpzlab check SCENARIO... [--set k=v] [--json FILE]` and `hpzlab check --schedule FILE
// [SCENARIO]`: proves or refutes, independent of timing, that each scenario's schedule (or the
// schedule in FILE, whose world size a scenario given with it must match) is free of races,
// stale and uninitialized reads and mismatched collectives. Exit 0 when all are clean, 1 when
// anything was found, 2 on bad input.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/explain.hpp"
#include "sim/check/release_history.hpp"
#include "sim/check/report.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/ir/projection.hpp"
#include "sim/parallel.hpp"
#include "sim/record_inputs.hpp"
#include "sim/time/sensitivity.hpp"
#include "sim/time/simulate.hpp"
#include "sim/xml.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** What `hpzlab check` takes. */
struct CheckOptions {
  std::vector<std::string> scenarios;  ///< scenario files, checked in order
  std::vector<std::string> sets;       ///< --set key=value, applied to every scenario
  std::string json;                    ///< --json FILE ("-" = standard output)
  std::string schedule;                ///< --schedule FILE: check it instead of building one
  std::string deepspeed;     ///< --deepspeed V1,V2,...: the version matrix (DeepSpeed builder)
  std::string junit;         ///< --junit FILE: JUnit XML, a test case per checked schedule
  std::string sarif;         ///< --sarif FILE: SARIF 2.1.0, a result per finding group
  UserFlags user;            ///< --ds-config, --hf-config, --nodes, --gpus-per-node
  bool record = false;       ///< --record: the matrix over recordings of real DeepSpeed
  std::string record_dir;    ///< --record-dir DIR: keep the recordings and their inputs there
  bool explain = false;      ///< --explain: say what orders the secondary copies of a clean run
  bool sensitivity = false;  ///< --sensitivity: how close each race came in the simulation
  bool per_rank = false;     ///< --per-rank: check every rank, not one per symmetry class
};

/** One line of the version matrix: releases whose schedules the builder makes alike (equal
 *  rules, sim/deepspeed_releases.hpp), checked once as the first of them; or, where the builder
 *  lacks a rule they need, the rule. With --record each release is its own epoch. */
struct MatrixEpoch {
  std::vector<std::string> releases;  ///< oldest first
  const ReleaseRule* missing = nullptr;
};

std::vector<Override> overrides_of(const CheckOptions& opts) {
  std::vector<Override> overrides;
  for (const auto& s : opts.sets) overrides.push_back(parse_override(s));
  return overrides;
}

/** The releases --deepspeed names (a release, latest, all, A..B, or a comma-separated list of
 *  these), oldest first. */
std::vector<std::string> releases_of(const CheckOptions& opts) {
  if (opts.record && opts.deepspeed.empty()) {
    throw InputError("", "--record",
                     "needs --deepspeed VERSION[,VERSION...]: the versions to record");
  }
  if (opts.deepspeed.empty()) return {};
  return expand_deepspeed_versions(opts.deepspeed, "--deepspeed");
}

/** `releases` as the matrix's epochs for a run with `traits`, oldest first: consecutive releases
 *  with equal rules (or refused for the same missing rule) share one; with --record each
 *  release is its own. */
std::vector<MatrixEpoch> epochs_of(const std::vector<std::string>& releases,
                                   const RunTraits& traits, bool record) {
  std::vector<MatrixEpoch> out;
  std::optional<VersionRules> previous;
  for (const std::string& v : releases) {
    const ReleaseRule* missing = missing_rule(v, traits);
    std::optional<VersionRules> rules;
    if (missing == nullptr) {
      rules = version_rules(v, traits);
      rules->name.clear();  // alike but for the name
    }
    const bool same = !out.empty() && !record && out.back().missing == missing && previous == rules;
    if (!same) out.push_back({{}, missing});
    out.back().releases.push_back(v);
    previous = rules;
  }
  return out;
}

/** Whether --deepspeed names more than one release: a refused release then gets its line and
 *  the matrix goes on; one release alone is refused in one line (exit 2). */
bool is_matrix(const std::vector<std::string>& releases) {
  return releases.size() > 1;
}

/** The traits of the scenario at `path` that decide the conditional release rules: read with
 *  the newest release named (a ds_config key it does not define: the oldest). */
RunTraits traits_of(const std::string& path, const CheckOptions& opts,
                    const std::vector<std::string>& releases) {
  std::vector<Override> o = overrides_of(opts);
  o.emplace_back("zero.deepspeed_version", releases.back());
  try {
    return run_traits(load(path, opts.user, o));
  } catch (const ReleaseRefusal&) {
    o.back() = Override("zero.deepspeed_version", releases.front());
    return run_traits(load(path, opts.user, o));
  }
}

/** --record: the recording against the DeepSpeed builder's schedule of the same scenario
 *  (sim/projection.hpp); the builder's refusal is the comparison's error. */
RecordingComparison compare_with_builder(const Scenario& sc, const Schedule& rec) {
  Schedule built;
  try {
    Scenario as_recorded = sc;
    as_recorded.run.as_recorded = true;  // the recorder's AdamW and its logged .item()
    // The steps DeepSpeed skipped as it ran (fp16's overflow, 0.19.8's invalid norm): data the
    // builder takes from the recording.
    if (const auto skipped = rec.source.find("skipped_steps"); skipped != rec.source.end()) {
      as_recorded.run.skipped_steps =
          parse_step_list(skipped->second, rec.scenario, "skipped_steps");
    }
    built = build_schedule(as_recorded);
  } catch (const InputError& e) {
    RecordingComparison out;
    out.ranks = recorded_ranks(rec);
    out.error = e.what();
    return out;
  }
  RecordingComparison c = compare_recording(rec, built);
  const ModelConfig& m = sc.model;
  // The builder runs every routed expert; DeepseekV2MoE.moe skips one without tokens, and the
  // recorder's constant weights send every token to the same experts. Only a first difference
  // at a routed expert's op (on either side) is that one; any other is a defect to report.
  const auto at_expert = [](const std::string& op) {
    return op.find(".mlp.experts.") != std::string::npos;
  };
  if (!c.equal() && m.family == "deepseek_v2" && m.experts_per_token < m.experts &&
      (at_expert(c.recorded_op) || at_expert(c.built_op))) {
    c.expected_because = fmt::format(
        "DeepSeek-V2's MoE runs only the experts that received tokens, and the recorder's "
        "constant weights route every token to the same {} of the {}, where the builder takes "
        "every expert to receive tokens (docs/deepspeed-builder.md)",
        m.experts_per_token, m.experts);
  }
  return c;
}

/** --explain: one config key at ten times the run's value, and what the checker then finds on
 *  the secondary shards. */
struct Probe {
  std::string key;  ///< scenario key, e.g. "zero.stage3_max_live_parameters"
  std::int64_t value = 0;
  std::uint64_t races = 0;
  std::uint64_t stale = 0;
  std::string refused;  ///< the builder refused the changed run (its one line)
};

/** A verdict and what it covered. */
struct Checked {
  check::CheckResult result;
  int steps = 0;                   ///< optimizer steps in the checked schedule
  bool from_file = false;          ///< --schedule FILE: its steps are the recording's
  std::vector<std::string> notes;  ///< what loading the scenario noted (Scenario::notes)
  /** --record: the DeepSpeed builder's schedule of the same scenario against the recording. */
  std::optional<RecordingComparison> builder;
  /** --deepspeed: the releases this verdict covers (one epoch of the matrix), oldest first. */
  std::vector<std::string> releases;
  /** Not checked: why the builder refused these releases (a rule it lacks, or DeepSpeed raising
   *  on this configuration); `result` then holds only the scenario's name. */
  std::string refused;
  /** The DeepSpeed defects of this release on this run (known_defects): not the checker's
   *  kinds, but findings all the same (the exit status, `clean`, JUnit). */
  std::vector<const ReleaseRule*> defects;
  /** The DeepSpeed release checked alone (no --deepspeed matrix; the DeepSpeed builder). */
  std::string release;
  /** --explain on a clean verdict: what orders the secondary copies, and which keys break it. */
  std::optional<check::OrderExplanation> explanation;
  std::vector<Probe> probes;
  /** --sensitivity on a verdict with a race: the simulated timeline's closest race, and which
   *  single change of cluster or cost model would flip it (sim/time/sensitivity.hpp). */
  std::optional<time::SensitivityResult> sensitivity;
  /** Why the check ran rank by rank rather than by symmetry class ("": by class, or --per-rank),
   *  for standard error. */
  std::string rank_by_rank;

  /** Checked, nothing found and no known defect: a release to run this on. */
  bool clean() const { return refused.empty() && result.clean() && defects.empty(); }
};

/** A known DeepSpeed defect in one sentence: short (a matrix's line, JUnit's message) or whole
 *  (one release's text, SARIF's message). */
std::string defect_sentence(const ReleaseRule& r, bool whole) {
  const std::string fixed = fixed_label(r);
  return whole ? fmt::format("DeepSpeed defect `{}` ({}, {}), not an ordering bug: {}", r.id, r.pr,
                             fixed, r.what)
               : fmt::format("DeepSpeed defect `{}` ({}): {} (`hpzlab releases` says what)", r.id,
                             condition_of(r), fixed);
}

/** defect_sentence as a line under a verdict. */
std::string defect_line(const ReleaseRule& r, bool whole) {
  return "  " + defect_sentence(r, whole) + "\n";
}

/** Scenario i of n on the progress bar (a terminal only): building its schedule fills the
 *  first half of its share, checking it the second (neither reports how far it got). */
std::string progress_what(std::size_t i, std::size_t n, const char* doing, const std::string& of) {
  return n == 1 ? fmt::format("{} {}", doing, of)
                : fmt::format("scenario {}/{}: {} {}", i + 1, n, doing, of);
}

/** Runs tools/record (real DeepSpeed on this CPU) with `args`; returns its exit status. Its
 *  progress and errors go to this process's standard error. */
/** --sensitivity: the schedule simulated once (the scenario's seed) and, when a race is in it,
 *  every cost input scaled alone (`hpzlab sim --sensitivity`); none for a race-free schedule. */
std::optional<time::SensitivityResult> timing_margin(const Scenario& sc, const Schedule& schedule,
                                                     const check::CheckResult& result,
                                                     bool show_progress) {
  if (result.group_count(check::FindingKind::kRace) == 0) return std::nullopt;
  time::SimOptions o;
  o.runs = 1;
  const TimingInputs platform = timing_inputs_of(sc);
  const time::SimResult simulated = time::simulate(platform, schedule, o);
  if (!time::has_race(simulated)) return std::nullopt;
  return time::sensitivity(platform, schedule, simulated, [show_progress](int done, int total) {
    if (!show_progress) return;
    progress_bar(done, std::max(done, total),
                 fmt::format("sensitivity: {} timelines (about {})", done, total));
  });
}

int run_recorder(const std::vector<std::string>& args) {
  const std::string script = recorder_script("--record");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(script.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  pid_t pid = 0;
  if (const int err = ::posix_spawn(&pid, script.c_str(), nullptr, nullptr, argv.data(), environ);
      err != 0) {
    throw InputError(script, "--record", std::string("cannot run it: ") + std::strerror(err));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid on the recorder failed");
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/** --record: the schedule real DeepSpeed issues for `sc` (its version, cluster, model and
 *  ds_config: sim/record_inputs.hpp), recorded by tools/record into `dir`. */
Schedule record_schedule(const Scenario& sc, const std::filesystem::path& dir) {
  if (sc.run.variant != Variant::kStock) {
    throw InputError(sc.path, "run.variant",
                     fmt::format("{} cannot be recorded: --record runs DeepSpeed as it ships "
                                 "(allowed: stock; host-sync and event-wait are the builder's "
                                 "what-ifs)",
                                 to_string(sc.run.variant)));
  }
  if (sc.zero.stage == 0) {
    throw InputError(sc.path, "zero.stage",
                     "0 cannot be recorded: the recorder runs DeepSpeed's ZeRO optimizers, and "
                     "stage 0 has none (allowed: 1, 2, 3)");
  }
  if (sc.zero.offload_param) {
    // The recorder refuses it too (hpzrec/cli.py): said here before anything is written.
    throw InputError(sc.path, "zero.offload_param",
                     "true cannot be recorded: the recorder runs DeepSpeed on a CPU, where the "
                     "host memory it offloads to and the GPU's memory are one (allowed: false)");
  }
  if (sc.run.load == "checkpoint") {
    throw InputError(sc.path, "run.load",
                     "checkpoint cannot be recorded yet: the recorder loads weights as "
                     "from_pretrained does, not a ZeRO checkpoint (allowed: none, pretrained)");
  }
  if (sc.run.step_stream != "default") {
    throw InputError(sc.path, "run.step_stream",
                     sc.run.step_stream +
                         " cannot be recorded: the recorder runs DeepSpeed on a CPU, which has "
                         "no streams to issue the step from (allowed: default)");
  }
  const std::string v = sc.zero.deepspeed_version;
  const std::string hf = (dir / (v + "-config.json")).string();
  const std::string ds = (dir / (v + "-ds_config.json")).string();
  const std::string out = (dir / (v + "-schedule.json")).string();
  write_output(hf, recorder_hf_config(sc).dump(2) + "\n", "--record-dir");
  write_output(ds, recorder_ds_config(sc).dump(2) + "\n", "--record-dir");
  std::vector<std::string> args = {"--hf-config", hf, "--ds-config", ds, "--out", out};
  for (std::string& a : recorder_args(sc)) args.push_back(std::move(a));
  end_progress_line();
  std::fprintf(stderr, "hpzlab check --record: recording DeepSpeed %s (%s)\n", v.c_str(),
               sc.path.c_str());
  if (const int rc = run_recorder(args); rc != 0) {
    if (rc == kExitBadInput) {
      throw InputError(sc.path, "--record",
                       fmt::format("DeepSpeed {} refused this configuration (the recorder's "
                                   "error above; its inputs are in {})",
                                   v, dir.string()));
    }
    if (rc == 1) {
      // An exception in the run: DeepSpeed's own on this configuration (0.14.4's narrow() on a
      // secondary slice past a parameter's end, as the builder refuses it too) or, where the
      // traceback ends in tools/recorder, the recorder's.
      throw InputError(sc.path, "--record",
                       fmt::format("DeepSpeed {} raised while it ran this configuration (the "
                                   "traceback above says where; inputs in {})",
                                   v, dir.string()));
    }
    throw std::runtime_error(fmt::format(
        "recording DeepSpeed {} failed with exit code {} (inputs in {})", v, rc, dir.string()));
  }
  Schedule s = read_schedule(out);
  s.scenario = sc.path;
  return s;
}

/** The check of one schedule (`what` names it): one rank per symmetry class, the same report as
 *  rank by rank, unless --per-rank. A schedule whose ranks are not alike is checked rank by
 *  rank, and `note` says so, for standard error (not the report, the same either way). */
check::CheckResult check_one(const Schedule& schedule, const CheckOptions& opts,
                             const std::string& what, std::string& note) {
  if (opts.per_rank) return check::check_schedule(schedule);
  check::ClassCheck how;
  check::CheckResult result = check::check_schedule_by_class(schedule, &how);
  if (!how.per_rank_because.empty()) {
    // No colon: the line follows the verdict, which scripts match up to the end.
    note = fmt::format("{} checked rank by rank ({}; {})", what, how.per_rank_because, how.summary);
  }
  return result;
}

/** A matrix epoch the builder refused: its line says why. */
Checked refused_epoch(const Scenario& sc, const MatrixEpoch& epoch, const std::string& why) {
  Checked c;
  c.result.scenario = sc.path.empty() ? "schedule" : sc.path;
  c.result.variant = to_string(sc.run.variant);
  c.result.source = {{"builder", "deepspeed"}, {"deepspeed", releases_label(epoch.releases)}};
  c.steps = sc.run.steps;
  c.notes = sc.notes;
  c.releases = epoch.releases;
  c.refused = why;
  return c;
}

/** --explain's "what would break it": the run again with each of the keys that let gathers run
 *  further ahead (more parameters live, larger prefetch buckets, longer reuse) at ten times its
 *  value or DeepSpeed's default, whichever is larger, built and checked; the secondary findings
 *  of each. */
std::vector<Probe> probe_keys(const Scenario& sc, const std::string& path, const UserFlags& user,
                              const std::vector<Override>& overrides) {
  const ZeroConfig defaults;
  const std::tuple<const char*, std::int64_t, std::int64_t> keys[] = {
      {"zero.stage3_max_live_parameters", sc.zero.stage3_max_live_parameters,
       defaults.stage3_max_live_parameters},
      {"zero.stage3_prefetch_bucket_size", sc.zero.stage3_prefetch_bucket_size,
       defaults.stage3_prefetch_bucket_size},
      {"zero.stage3_max_reuse_distance", sc.zero.stage3_max_reuse_distance,
       defaults.stage3_max_reuse_distance},
  };
  std::vector<Probe> out;
  for (const auto& [key, now, deepspeeds] : keys) {
    Probe p{key, 10 * std::max(now, deepspeeds), 0, 0, ""};
    std::vector<Override> o = overrides;
    o.emplace_back(key, std::to_string(p.value));
    try {
      const check::CheckResult r = check::check_schedule(build_schedule(load(path, user, o)));
      p.races = check::secondary_findings(r, check::FindingKind::kRace);
      p.stale = check::secondary_findings(r, check::FindingKind::kStaleRead);
    } catch (const ReleaseRefusal& e) {
      p.refused = e.what();
    } catch (const InputError& e) {
      p.refused = e.what();
    }
    out.push_back(std::move(p));
  }
  return out;
}

/** The --explain lines of a checked run ("" without --explain or for a verdict with findings). */
std::string explain_lines(const Checked& c) {
  if (!c.explanation) return "";
  std::string out = check::explain_text(*c.explanation);
  if (c.probes.empty()) return out;
  out +=
      "    each key at ten times this run's value or DeepSpeed's default (gathers further "
      "ahead):\n";
  for (const Probe& p : c.probes) {
    std::string got;
    if (!p.refused.empty()) {
      got = "not checked: " + p.refused;
    } else if (p.races + p.stale == 0) {
      got = "still clean";
    } else {
      got = fmt::format("{} secondary race{}{}", p.races, p.races == 1 ? "" : "s",
                        p.stale > 0 ? fmt::format(", {} stale reads", p.stale) : "");
    }
    out += fmt::format("      {}={}: {}\n", p.key, p.value, got);
  }
  return out;
}

std::vector<Checked> check_scenarios(const CheckOptions& opts,
                                     const std::vector<std::string>& releases) {
  if (opts.scenarios.empty() && !has_user_files(opts.user)) {
    throw InputError("", "scenario",
                     "is required (a scenario file, your own --hf-config FILE --ds-config FILE, "
                     "or --schedule FILE)");
  }
  const bool matrix = is_matrix(releases);
  // Without --deepspeed each scenario once; with it, each scenario under each epoch of releases,
  // built by the DeepSpeed builder as the epoch's first release (the version matrix).
  struct Job {
    std::string path;
    std::vector<Override> overrides;
    std::optional<MatrixEpoch> epoch;
  };
  std::vector<Job> jobs;
  // The one-command form: the user's files on the defaults, as one scenario named after them.
  const std::vector<std::string> paths =
      opts.scenarios.empty() ? std::vector<std::string>{""} : opts.scenarios;
  for (const std::string& path : paths) {
    if (releases.empty()) {
      jobs.push_back({path, overrides_of(opts), std::nullopt});
      continue;
    }
    for (MatrixEpoch& e : epochs_of(releases, traits_of(path, opts, releases), opts.record)) {
      std::vector<Override> o = overrides_of(opts);
      o.emplace_back("zero.deepspeed_version", e.releases.front());
      jobs.push_back({path, std::move(o), std::move(e)});
    }
  }
  const std::size_t n = jobs.size();
  const int total = static_cast<int>(n);
  // --record: recordings land in --record-dir (kept), else in a directory removed at the end.
  std::filesystem::path record_dir;
  std::unique_ptr<std::filesystem::path, void (*)(std::filesystem::path*)> temporary(
      nullptr, [](std::filesystem::path* p) {
        std::error_code ec;
        std::filesystem::remove_all(*p, ec);
        delete p;
      });
  if (opts.record) {
    if (!opts.record_dir.empty()) {
      record_dir = opts.record_dir;
      std::error_code ec;
      std::filesystem::create_directories(record_dir, ec);
      if (ec || !std::filesystem::is_directory(record_dir)) {
        throw InputError(opts.record_dir, "--record-dir",
                         "cannot make this directory (" + ec.message() + ")");
      }
    } else {
      std::string pattern = (std::filesystem::temp_directory_path() / "hpzlab-record-XXXXXX");
      if (::mkdtemp(pattern.data()) == nullptr) {
        throw std::runtime_error("cannot make a temporary directory for the recordings");
      }
      record_dir = pattern;
      temporary.reset(new std::filesystem::path(record_dir));
    }
  }
  // One job: its scenario loaded, its schedule recorded or built, and checked. `progress`: the
  // job shows its own progress (one job at a time).
  auto run_job = [&](std::size_t i, bool progress) -> Checked {
    const MatrixEpoch* epoch = jobs[i].epoch ? &*jobs[i].epoch : nullptr;
    Scenario sc;
    try {
      sc = load(jobs[i].path, opts.user, jobs[i].overrides);
    } catch (const ReleaseRefusal& e) {
      // The user's ds_config has a key this release does not define: DeepSpeed refuses it.
      if (!matrix) throw;
      Scenario named;
      named.path = jobs[i].path;
      return refused_epoch(named, *epoch, e.what());
    }
    const std::string& path = sc.path;
    Schedule schedule;
    std::optional<RecordingComparison> builder;
    // A release the builder does not model: its line in a matrix; alone, the build below refuses
    // it in one line.
    if (matrix && epoch != nullptr && epoch->missing != nullptr && !opts.record) {
      return refused_epoch(sc, *epoch, "not modelled: " + lacks_rule(*epoch->missing));
    }
    const auto shown = [&](double at, const std::string& what, const std::function<void()>& fn) {
      if (progress) {
        run_showing_progress(at, total, what, fn);
      } else {
        fn();
      }
    };
    if (opts.record) {
      try {
        schedule = record_schedule(sc, record_dir);
      } catch (...) {
        // The message names the inputs' directory: a temporary one stays for the user to read.
        delete temporary.release();
        throw;
      }
      builder = compare_with_builder(sc, schedule);
    } else {
      try {
        shown(static_cast<double>(i), progress_what(i, n, "building the schedule of", path),
              [&] { schedule = build_schedule(sc); });
      } catch (const ReleaseRefusal& e) {
        // DeepSpeed itself raises on this configuration: that release's line says so.
        if (!matrix) throw;
        return refused_epoch(sc, *epoch, e.what());
      }
      if (epoch != nullptr) schedule.source["deepspeed"] = releases_label(epoch->releases);
    }
    check::CheckResult result;
    std::string rank_by_rank;
    shown(static_cast<double>(i) + 0.5, progress_what(i, n, "checking", path), [&] {
      result = check_one(schedule, opts, path.empty() ? "schedule" : path, rank_by_rank);
    });
    std::optional<check::OrderExplanation> explanation;
    std::vector<Probe> probes;
    if (opts.explain && result.clean()) {
      // One job alone uses every core for its checks; jobs of a matrix run a core each already.
      const unsigned workers = progress ? std::max(1u, std::thread::hardware_concurrency()) : 1;
      shown(static_cast<double>(i) + 0.7, progress_what(i, n, "explaining", path), [&] {
        explanation = check::explain_ordering(schedule, workers);
        if (explanation->secondary_copies > 0 && !opts.record) {
          probes = probe_keys(sc, jobs[i].path, opts.user, jobs[i].overrides);
        }
      });
    }
    std::optional<time::SensitivityResult> margin;
    if (opts.sensitivity) margin = timing_margin(sc, schedule, result, progress);
    Checked checked{std::move(result),
                    opts.record ? step_count(schedule) : sc.run.steps,
                    opts.record,
                    sc.notes,
                    std::move(builder),
                    epoch ? epoch->releases : std::vector<std::string>{},
                    "",
                    scenario_defects(sc),
                    epoch ? "" : canonical_deepspeed_version(sc.zero.deepspeed_version),
                    std::move(explanation),
                    std::move(probes),
                    std::move(margin),
                    std::move(rank_by_rank)};
    return checked;
  };
  std::vector<Checked> results;
  if (opts.record || n == 1) {
    for (std::size_t i = 0; i < n; ++i) results.push_back(run_job(i, true));
  } else {
    // Several built schedules (a matrix of releases, several scenarios): built and checked on
    // every core, a job each, the results in the jobs' order whatever order they finish in. A
    // job's error is rethrown in that order too, as the serial loop would have met it.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::size_t workers = std::min<std::size_t>(n, cores);
    std::vector<std::optional<Checked>> slots(n);
    parallel_for(
        n, cores, [&](std::size_t i) { slots[i] = run_job(i, false); },
        [&](std::size_t done) {
          if (!progress_on()) return;
          progress_bar(static_cast<double>(done), total,
                       fmt::format("building and checking {} schedules on {} cores ({} done)", n,
                                   workers, done));
        });
    for (std::optional<Checked>& slot : slots) results.push_back(std::move(*slot));
  }
  if (matrix && std::all_of(results.begin(), results.end(),
                            [](const Checked& c) { return !c.refused.empty(); })) {
    throw InputError(
        "", "--deepspeed",
        fmt::format("the builder checks none of these releases: {}", results.front().refused));
  }
  progress_bar(total, total,
               fmt::format("{} checked",
                           n == 1 ? results[0].result.scenario : fmt::format("{} scenarios", n)));
  return results;
}

/** The known DeepSpeed defects of a recording's run (known_defects), from what `hpzlab record`
 *  writes into its source: the release, torch, the dtype and the ds_config it used. None for a
 *  schedule without them (a built one, or a recording of a release hpzlab does not know), and
 *  none read from a ds_config_used that is not a JSON object of the expected types. */
std::vector<const ReleaseRule*> recorded_defects(const Schedule& s) {
  const auto at = [&](const char* key) {
    const auto it = s.source.find(key);
    return it == s.source.end() ? std::string() : it->second;
  };
  const std::string version = at("deepspeed");
  if (!is_deepspeed_release(version)) return {};
  const nlohmann::json ds = nlohmann::json::parse(at("ds_config_used"), nullptr, false);
  if (!ds.is_object()) return {};
  const auto flag = [](const nlohmann::json& object, const char* key) {
    const auto it = object.find(key);
    return it != object.end() && it->is_boolean() && it->get<bool>();
  };
  const auto zero_it = ds.find("zero_optimization");
  const nlohmann::json zero =
      zero_it != ds.end() && zero_it->is_object() ? *zero_it : nlohmann::json::object();
  RunTraits t;
  const std::string torch = at("torch");
  t.torch = torch.substr(0, torch.find('+'));  // "2.1.2+cu121": the release
  if (const auto accum = ds.find("gradient_accumulation_steps");
      accum != ds.end() && accum->is_number_integer()) {
    t.grad_accum =
        static_cast<int>(std::clamp<std::int64_t>(accum->get<std::int64_t>(), 1, 1 << 20));
  }
  t.qwz_non_fp16 = flag(zero, "zero_quantized_weights") && at("dtype") != "float16";
  t.qgz = flag(zero, "zero_quantized_gradients");
  return known_defects(version, t);
}

/** --schedule FILE: one schedule; a scenario, if given, only has to agree on the world size. */
Checked check_file(const CheckOptions& opts) {
  if (opts.scenarios.size() > 1) {
    throw InputError("", "--schedule", "checks one schedule: give at most one scenario");
  }
  if (opts.scenarios.empty() && !opts.sets.empty() && !has_user_files(opts.user)) {
    throw InputError("", "--set", "needs a scenario to apply to");
  }
  if (!opts.deepspeed.empty()) {
    throw InputError("", "--deepspeed",
                     "builds each version's schedule with the DeepSpeed builder; a schedule read "
                     "with --schedule has its own version");
  }
  Schedule schedule;
  run_showing_progress(0, 1, "reading " + opts.schedule,
                       [&] { schedule = read_schedule(opts.schedule); });
  std::optional<Scenario> sc;
  if (!opts.scenarios.empty() || has_user_files(opts.user)) {
    const std::string path = opts.scenarios.empty() ? "" : opts.scenarios[0];
    sc = load(path, opts.user, overrides_of(opts));
    check_world_size(*sc, schedule, opts.schedule);
  } else if (opts.sensitivity) {
    throw InputError("", "--sensitivity",
                     "simulates the schedule, which needs a scenario for the cluster and the "
                     "costs (give one, whose world size the schedule has)");
  }
  check::CheckResult result;
  std::string rank_by_rank;
  run_showing_progress(0.5, 1, "checking " + opts.schedule, [&] {
    result = on_schedule(opts.schedule,
                         [&] { return check_one(schedule, opts, opts.schedule, rank_by_rank); });
  });
  progress_bar(1, 1, opts.schedule + " checked");
  const auto v = schedule.source.find("deepspeed");
  const std::string recorded = v == schedule.source.end() ? "" : v->second;
  const bool clean = result.clean();
  Checked checked{std::move(result),
                  step_count(schedule),
                  true,
                  {},
                  std::nullopt,
                  {},
                  "",
                  recorded_defects(schedule),
                  is_deepspeed_release(recorded) ? recorded : "",
                  std::nullopt,
                  {},
                  std::nullopt,
                  std::move(rank_by_rank)};
  if (opts.sensitivity) {
    sc->run.steps = step_count(schedule);  // as sim --schedule takes them
    checked.sensitivity = on_schedule(
        opts.schedule, [&] { return timing_margin(*sc, schedule, checked.result, true); });
  }
  if (opts.explain && clean) {
    run_showing_progress(0.75, 1, "explaining " + opts.schedule, [&] {
      checked.explanation =
          check::explain_ordering(schedule, std::max(1u, std::thread::hardware_concurrency()));
    });
  }
  return checked;
}

/** A clean verdict on one step says nothing about the hpZ race: DeepSpeed copies the secondary
 *  partition in one step and reads it, racing, in the next, after the optimizer step (step 0
 *  only records the module trace, without prefetching). Built schedules of one step are clean
 *  for that reason alone. */
std::string one_step_note(const Checked& c) {
  if (!c.refused.empty() || !c.result.clean() || c.steps >= 2) return "";
  return fmt::format(
      "only {} step checked: one step of DeepSpeed's schedule cannot show the hpZ race, which "
      "needs a step after the optimizer's ({})",
      c.steps, c.from_file ? "record 2 steps or more" : "--set run.steps=2 or more");
}

/** The notes under a verdict in the text: the scenario's (what was read, ignored, defaulted),
 *  then the one-step note. */
std::string note_line(const Checked& c) {
  std::string out;
  for (const std::string& n : c.notes) out += "  note: " + n + "\n";
  const std::string note = one_step_note(c);
  return note.empty() ? out : out + "  note: " + note + "\n";
}

/** A refused epoch's one line, in the verdict line's form. */
std::string refused_line(const Checked& c) {
  return fmt::format("{} [DeepSpeed {}]: not checked: {}\n", c.result.scenario,
                     releases_label(c.releases), c.refused);
}

/** The matrix's epochs of one scenario, for the history across releases. */
std::vector<check::EpochVerdict> epochs_of_scenario(const std::vector<Checked>& checked,
                                                    const std::string& scenario) {
  std::vector<check::EpochVerdict> out;
  for (const Checked& c : checked) {
    if (c.releases.empty() || c.result.scenario != scenario) continue;
    out.push_back({c.releases, c.refused.empty() ? &c.result : nullptr});
  }
  return out;
}

/** The releases of `scenario`'s matrix that are clean (Checked::clean: no finding, no known
 *  defect), consecutive clean epochs joined into one run ("0.13.5-0.14.2"); refused and unclean
 *  epochs break a run. */
std::vector<std::string> clean_runs(const std::vector<Checked>& checked,
                                    const std::string& scenario) {
  std::vector<std::string> runs;
  std::string first, last;
  const auto close = [&] {
    if (!first.empty()) runs.push_back(first == last ? first : first + "-" + last);
    first.clear();
  };
  for (const Checked& c : checked) {
    if (c.releases.empty() || c.result.scenario != scenario) continue;
    if (c.clean()) {
      if (first.empty()) first = c.releases.front();
      last = c.releases.back();
    } else {
      close();
    }
  }
  close();
  return runs;
}

/** Each known defect in `scenario`'s matrix with the checked releases that have it. */
std::string defects_history(const std::vector<Checked>& checked, const std::string& scenario) {
  std::vector<std::pair<const ReleaseRule*, std::vector<std::string>>> seen;
  for (const Checked& c : checked) {
    if (c.result.scenario != scenario || !c.refused.empty()) continue;
    for (const ReleaseRule* r : c.defects) {
      auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first == r; });
      if (it == seen.end()) it = seen.insert(seen.end(), {r, {}});
      it->second.insert(it->second.end(), c.releases.begin(), c.releases.end());
    }
  }
  std::string out;
  for (const auto& [r, releases] : seen) {
    out += fmt::format("    DeepSpeed defect `{}` ({}): in {}; {}\n", r->id, r->pr,
                       releases_label(releases), fixed_label(*r));
  }
  return out;
}

/** Under a scenario's matrix of more than one epoch: each kind of finding with the releases that
 *  have it, the first that has it and the first that does not any more. */
std::string history_text(const std::vector<Checked>& checked, const std::string& scenario) {
  const std::vector<check::EpochVerdict> epochs = epochs_of_scenario(checked, scenario);
  if (epochs.size() < 2) return "";
  const std::vector<check::FindingHistory> history = check::finding_history(epochs);
  const std::string defects = defects_history(checked, scenario);
  if (history.empty() && defects.empty()) {
    return "  across these releases: nothing found in any checked release\n";
  }
  std::string out = "  across these releases:\n" + defects;
  for (const check::FindingHistory& h : history) {
    std::string spans;
    for (const std::string& s : h.spans) spans += (spans.empty() ? "" : ", ") + s;
    std::string fixed = h.fixed_in.empty() ? "not fixed in the newest checked release"
                                           : fmt::format("gone from {} on", h.fixed_in);
    if (!h.unchecked_before_fix.empty()) {
      fixed += fmt::format(" ({} not checked)", h.unchecked_before_fix);
    }
    out += fmt::format("    {}: in {}; {}\n      to do: {}\n", h.signature, spans, fixed, h.remedy);
  }
  // The remedy at the user's level: the releases this configuration is clean on.
  const std::vector<std::string> runs = clean_runs(checked, scenario);
  out += runs.empty()
             ? "  clean in: none of the checked releases\n"
             : fmt::format("  clean in: {} (the releases to run this on)\n", fmt::join(runs, ", "));
  // Where to read each finding explained: its ops, the edge that is missing, the fix.
  std::vector<std::string> firsts;
  for (const check::FindingHistory& h : history) {
    if (std::find(firsts.begin(), firsts.end(), h.first) == firsts.end()) {
      firsts.push_back(h.first);
    }
  }
  if (firsts.empty()) return out;
  out += fmt::format(
      "  each finding explained (its ops, the missing edge, what fixes it): check one release "
      "alone, --deepspeed {}\n",
      fmt::join(firsts, " or --deepspeed "));
  return out;
}

/** The JSON's "releases": each epoch of the matrix with its verdict, and per scenario the history
 *  of each kind of finding across them. */
nlohmann::json releases_json(const std::vector<Checked>& checked) {
  nlohmann::json epochs = nlohmann::json::array();
  std::vector<std::string> scenarios;
  for (const Checked& c : checked) {
    if (c.releases.empty()) continue;
    if (std::find(scenarios.begin(), scenarios.end(), c.result.scenario) == scenarios.end()) {
      scenarios.push_back(c.result.scenario);
    }
    nlohmann::json e = {{"scenario", c.result.scenario},
                        {"releases", c.releases},
                        {"checked", c.refused.empty()},
                        {"clean", c.clean()}};
    if (!c.refused.empty()) e["refused"] = c.refused;
    nlohmann::json defects = nlohmann::json::array();
    for (const ReleaseRule* r : c.defects) defects.push_back(r->id);
    e["defects"] = defects;
    nlohmann::json counts = nlohmann::json::object();
    for (const check::FindingKind k : check::kAllKinds) {
      if (c.refused.empty() && c.result.count(k) > 0) counts[to_string(k)] = c.result.count(k);
    }
    e["counts"] = counts;
    epochs.push_back(std::move(e));
  }
  nlohmann::json history = nlohmann::json::array();
  nlohmann::json clean_in = nlohmann::json::array();
  for (const std::string& scenario : scenarios) {
    clean_in.push_back({{"scenario", scenario}, {"releases", clean_runs(checked, scenario)}});
    for (const check::FindingHistory& h :
         check::finding_history(epochs_of_scenario(checked, scenario))) {
      history.push_back(
          {{"scenario", scenario},
           {"signature", h.signature},
           {"remedy", h.remedy},
           {"kind", to_string(h.kind)},
           {"in", h.spans},
           {"first", h.first},
           {"fixed_in", h.fixed_in.empty() ? nlohmann::json(nullptr) : nlohmann::json(h.fixed_in)},
           {"unchecked_before_fix", h.unchecked_before_fix},
           {"worst_count", h.count}});
    }
  }
  return {{"epochs", epochs}, {"findings", history}, {"clean_in", clean_in}};
}

void run_check(const CheckOptions& opts, int& exit_code) {
  const int to_stdout = static_cast<int>(opts.json == "-") + static_cast<int>(opts.junit == "-") +
                        static_cast<int>(opts.sarif == "-");
  if (to_stdout > 1) {
    throw InputError("", "--json/--junit/--sarif",
                     "only one of them can write to standard output ('-')");
  }
  const bool text_out = to_stdout == 0;
  std::vector<std::string> inputs = opts.scenarios;
  inputs.insert(inputs.end(), {opts.schedule, opts.user.ds_config, opts.user.hf_config});
  check_outputs({{opts.json, "--json"}, {opts.junit, "--junit"}, {opts.sarif, "--sarif"}}, inputs);
  // --deepspeed's releases, read once: they decide the jobs and whether the text is a matrix.
  const std::vector<std::string> releases =
      opts.schedule.empty() ? releases_of(opts) : std::vector<std::string>{};
  const bool matrix = is_matrix(releases);
  if (opts.sensitivity && (matrix || opts.record)) {
    throw InputError("", "--sensitivity",
                     "simulates one release's schedule (seconds to minutes a scenario): give "
                     "--deepspeed one release, without --record");
  }
  const std::vector<Checked> checked = opts.schedule.empty()
                                           ? check_scenarios(opts, releases)
                                           : std::vector<Checked>{check_file(opts)};
  std::vector<check::CheckResult> results;
  for (const Checked& c : checked) {
    if (c.refused.empty()) results.push_back(c.result);
    if (!c.rank_by_rank.empty()) {
      end_progress_line();
      std::fprintf(stderr, "%s\n", c.rank_by_rank.c_str());
    }
  }
  // The same notes as the text, in the JSON under "notes" (issue 17: notes everywhere).
  if (!opts.json.empty()) {
    nlohmann::json j = nlohmann::json::parse(check::JsonReporter().render(results));
    nlohmann::json notes = nlohmann::json::array();
    for (const Checked& c : checked) {
      for (const std::string& n : c.notes) notes.push_back(c.result.scenario + ": " + n);
      if (const std::string n = one_step_note(c); !n.empty()) {
        notes.push_back(c.result.scenario + ": " + n);
      }
    }
    j["notes"] = notes;
    // Known DeepSpeed defects (RuleScope::kDefect): findings the checker cannot make, so the
    // verdict is not clean where one applies.
    nlohmann::json defects = nlohmann::json::array();
    for (const Checked& c : checked) {
      for (const ReleaseRule* r : c.defects) {
        const std::string until = until_of(*r);
        defects.push_back(
            {{"scenario", c.result.scenario},
             {"releases", !c.releases.empty() ? c.releases
                          : c.release.empty() ? std::vector<std::string>{}
                                              : std::vector<std::string>{c.release}},
             {"rule", r->id},
             {"pr", r->pr},
             {"fixed_in", until.empty() ? nlohmann::json(nullptr) : nlohmann::json(until)},
             {"what", r->what}});
      }
    }
    j["defects"] = defects;
    if (!defects.empty()) j["clean"] = false;
    nlohmann::json builders = nlohmann::json::array();
    for (const Checked& c : checked) {
      if (!c.builder) continue;
      const RecordingComparison& b = *c.builder;
      nlohmann::json one = {{"scenario", c.result.scenario},
                            {"schedule", check::label_of(c.result)},
                            {"ranks", b.ranks},
                            {"projected_ops", b.ops},
                            {"equal", b.equal()}};
      if (!b.error.empty()) one["error"] = b.error;
      if (!b.expected_because.empty()) one["expected_because"] = b.expected_because;
      if (!b.divergence.empty()) {
        one["rank"] = b.diverging_rank;
        one["divergence"] = b.divergence;
      }
      builders.push_back(std::move(one));
    }
    if (!builders.empty()) j["builder_comparisons"] = builders;
    nlohmann::json explained = nlohmann::json::array();
    for (const Checked& c : checked) {
      if (!c.explanation) continue;
      nlohmann::json one = check::explain_json(*c.explanation);
      one["scenario"] = c.result.scenario;
      one["schedule"] = check::label_of(c.result);
      nlohmann::json probes = nlohmann::json::array();
      for (const Probe& p : c.probes) {
        nlohmann::json q = {{"key", p.key}, {"value", p.value}};
        if (p.refused.empty()) {
          q["secondary_races"] = p.races;
          q["secondary_stale_reads"] = p.stale;
        } else {
          q["refused"] = p.refused;
        }
        probes.push_back(std::move(q));
      }
      one["keys_at_ten_times"] = probes;
      explained.push_back(std::move(one));
    }
    if (opts.explain) j["explain"] = explained;
    if (opts.sensitivity) {
      nlohmann::json margins = nlohmann::json::array();
      for (const Checked& c : checked) {
        if (!c.sensitivity) continue;
        nlohmann::json one = time::sensitivity_json(*c.sensitivity);
        one["scenario"] = c.result.scenario;
        one["schedule"] = check::label_of(c.result);
        margins.push_back(std::move(one));
      }
      j["sensitivity"] = margins;
    }
    if (std::any_of(checked.begin(), checked.end(),
                    [](const Checked& c) { return !c.releases.empty(); })) {
      j["releases"] = releases_json(checked);
    }
    write_output(opts.json, j.dump(2) + "\n", "--json");
  }
  // Each result's text report, rendered once for the text and the JUnit output.
  std::vector<std::string> reports;
  if (text_out || !opts.junit.empty()) {
    for (const Checked& c : checked) {
      reports.push_back(c.refused.empty() ? check::TextReporter().render_one(c.result)
                                          : refused_line(c));
    }
  }
  if (!opts.junit.empty()) {
    // JUnit XML for CI systems (issue 19): one test case per checked schedule (scenario x
    // version), named by the verdict's bracket; a finding fails it with the verdict line as the
    // message and the whole report as the text.
    std::size_t failures = 0;
    std::size_t skipped = 0;
    std::string cases;
    for (std::size_t i = 0; i < checked.size(); ++i) {
      const Checked& c = checked[i];
      const std::string& report = reports[i];
      // The failure's message: the verdict line, or for a schedule the checker found clean, the
      // defect that fails it (a line saying "clean" would not say why the case failed).
      std::string first = report.substr(0, report.find('\n'));
      if (c.refused.empty() && c.result.clean() && !c.defects.empty()) {
        first = defect_sentence(*c.defects.front(), false);
      }
      const std::string name =
          c.refused.empty() ? check::label_of(c.result) : "DeepSpeed " + releases_label(c.releases);
      cases += fmt::format("    <testcase classname=\"{}\" name=\"{}\">\n",
                           xml_escaped(c.result.scenario), xml_escaped(name));
      if (!c.refused.empty()) {
        ++skipped;
        cases += fmt::format("      <skipped message=\"{}\"/>\n", xml_escaped(c.refused));
      } else if (!c.clean()) {
        ++failures;
        cases += fmt::format("      <failure message=\"{}\" type=\"hpzlab.finding\">{}</failure>\n",
                             xml_escaped(first), xml_escaped(report));
      }
      cases += "    </testcase>\n";
    }
    write_output(opts.junit,
                 fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                             "<testsuites name=\"hpzlab check\" tests=\"{0}\" failures=\"{1}\">\n"
                             "  <testsuite name=\"hpzlab check\" tests=\"{0}\" failures=\"{1}\" "
                             "skipped=\"{3}\">\n"
                             "{2}  </testsuite>\n</testsuites>\n",
                             checked.size(), failures, cases, skipped),
                 "--junit");
  }
  if (!opts.sarif.empty()) {
    // The known DeepSpeed defects of each checked release, as the text and JUnit name them.
    std::vector<check::DefectResult> defects;
    std::size_t at = 0;
    for (const Checked& c : checked) {
      if (!c.refused.empty()) continue;
      for (const ReleaseRule* r : c.defects) {
        defects.push_back({at, r->id, defect_sentence(*r, true)});
      }
      ++at;
    }
    write_output(opts.sarif, check::SarifReporter(version()).render(results, defects), "--sarif");
  }
  if (text_out) {
    // More than one release: a line per epoch. One release (--deepspeed X) is explained in full,
    // as without --deepspeed (issue 35: the explanation was lost there).
    std::string text;
    for (std::size_t i = 0; i < checked.size(); ++i) {
      const std::string& full = reports[i];
      if (matrix) {
        // The version matrix: each version's verdict line and, when something was found, the
        // worst group's line (what and where); one release alone explains it (below).
        text += full.substr(0, full.find('\n') + 1);
        if (const auto w = full.find("\nWorst: "); w != std::string::npos) {
          text += "  " + full.substr(w + 1, full.find('\n', w + 1) - w);
        }
        for (const ReleaseRule* r : checked[i].defects) text += defect_line(*r, false);
        if (checked[i].builder) text += "  " + describe(*checked[i].builder) + "\n";
        text += explain_lines(checked[i]);
        // The scenario's notes once, under its last epoch (they are the same for every
        // release, but for a one-step note), then its findings across the releases.
        const bool last_of_scenario =
            i + 1 == checked.size() || checked[i + 1].result.scenario != checked[i].result.scenario;
        if (checked[i].releases.empty() || last_of_scenario) text += note_line(checked[i]);
        if (last_of_scenario) text += history_text(checked, checked[i].result.scenario);
        continue;
      }
      if (i > 0) text += "\n";
      text += full;
      for (const ReleaseRule* r : checked[i].defects) text += defect_line(*r, true);
      if (checked[i].builder) text += "  " + describe(*checked[i].builder) + "\n";
      text += explain_lines(checked[i]);
      if (checked[i].sensitivity) {
        std::string sentence = time::sensitivity_sentence(*checked[i].sensitivity);
        if (sentence.rfind("The ", 0) == 0) sentence[0] = 't';
        text += "  in the simulation: " + sentence + "\n";
      } else if (opts.sensitivity && checked[i].refused.empty() && !checked[i].result.clean()) {
        text += "  in the simulation: no race of this schedule to time\n";
      }
      text += note_line(checked[i]);
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  bool clean = true;
  for (const auto& r : results) clean = clean && r.clean();
  for (const Checked& c : checked) clean = clean && c.defects.empty();
  exit_code = clean ? kExitOk : kExitFindings;
}

}  // namespace

void setup_check(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<CheckOptions>();
  CLI::App* sub = app.add_subcommand(
      "check",
      "Prove or refute, independent of timing, that each scenario's schedule (or the one in "
      "--schedule FILE) is free of races, stale or uninitialized reads and mismatched collectives "
      "(exit 0 clean, 1 findings)");
  sub->add_option("scenario", opts->scenarios,
                  "Scenario files (TOML), e.g. scenarios/llama2-7b.toml (with --schedule: at most "
                  "one, whose world size the schedule must have)");
  sub->add_option("--set", opts->sets,
                  "Override a scenario key in every scenario, e.g. --set zero.overlap_comm=false "
                  "(repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  sub->add_option("--json", opts->json,
                  "Also write the findings as JSON to FILE ('-' = stdout, instead of the text)");
  sub->add_option("--deepspeed", opts->deepspeed,
                  "The version matrix: check each scenario under these DeepSpeed releases, built "
                  "by the DeepSpeed builder: a release, latest, all, a range A..B, or a "
                  "comma-separated list (e.g. 0.13.1,0.13.4 or 0.13.0..0.19.8); one verdict line "
                  "(and the worst finding) per epoch of releases that issue the same schedule, "
                  "then each finding's first release and the release that fixed it");
  sub->add_option("--junit", opts->junit,
                  "Also write JUnit XML to FILE ('-' = stdout, instead of the text): a test case "
                  "per checked schedule, failed by any finding");
  sub->add_option("--sarif", opts->sarif,
                  "Also write SARIF 2.1.0 to FILE ('-' = stdout, instead of the text) for code "
                  "scanning: a result per group of findings, a rule per kind (docs/ci.md)");
  add_user_flags(*sub, opts->user, false);
  sub->add_flag("--record", opts->record,
                "With --deepspeed: record each version's schedule with real DeepSpeed on this CPU "
                "(hpzlab record: minutes per version, the first use installs its environment) "
                "and check the recordings instead of the builder's schedules");
  sub->add_option("--record-dir", opts->record_dir,
                  "With --record: keep the recordings and the files given to DeepSpeed in DIR "
                  "(VERSION-schedule.json, VERSION-config.json, VERSION-ds_config.json)");
  sub->add_flag("--explain", opts->explain,
                "On a clean verdict, say what orders each hpZ secondary copy before the gathers "
                "that read it (the schedule checked again without each kind of sync) and which "
                "config keys would break it (each at ten times its value); seconds to a minute");
  sub->add_option("--schedule", opts->schedule,
                  "Check the schedule in FILE (hpzlab's schedule JSON, e.g. from `hpzlab record` "
                  "or `hpzlab schedule --json`) instead of building one");
  sub->add_flag("--sensitivity", opts->sensitivity,
                "For a race: simulate the schedule on the scenario's cluster and say how close "
                "the closest race came to biting (or by how much it bit) and which single "
                "change of cluster or cost model (each scaled from x1/4 to x4) would flip it, "
                "as `hpzlab sim --sensitivity` does; seconds to minutes");
  sub->add_flag("--per-rank", opts->per_rank,
                "Check every rank's bytes, not one rank per symmetry class (ranks that issue the "
                "same ops at offsets in the same order; the report is the same)");
  sub->callback([opts, &exit_code] { run_check(*opts, exit_code); });
}

}  // namespace hpz::cli
