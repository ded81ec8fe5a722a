// `hpzlab check`'s runs: each scenario (or the user's files) loaded, its schedule built (or, with
// --record, recorded) and checked, once or under each epoch of the --deepspeed release matrix;
// several built schedules a core each. --explain's and --sensitivity's extra work per verdict.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/explain.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/parallel.hpp"
#include "sim/time/sensitivity.hpp"
#include "sim/time/simulate.hpp"
#include "tools/hpzlab/check_internal.hpp"

namespace hpz::cli {
namespace {

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

/** Scenario i of n on the progress bar (a terminal only): building its schedule fills the
 *  first half of its share, checking it the second (neither reports how far it got). */
std::string progress_what(std::size_t i, std::size_t n, const char* doing, const std::string& of) {
  return n == 1 ? fmt::format("{} {}", doing, of)
                : fmt::format("scenario {}/{}: {} {}", i + 1, n, doing, of);
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

/** A check to run: a scenario (or "", the user's files), its overrides and, in the version
 *  matrix, the epoch of releases it is built as. */
struct Job {
  std::string path;
  std::vector<Override> overrides;
  std::optional<MatrixEpoch> epoch;
};

/** Without --deepspeed each scenario once; with it, each scenario under each epoch of releases,
 *  built by the DeepSpeed builder as the epoch's first release (the version matrix). */
std::vector<Job> jobs_of(const CheckOptions& opts, const std::vector<std::string>& releases) {
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
  return jobs;
}

/** --record: where the recordings land: --record-dir (kept), else a temporary directory removed
 *  at the end, unless keep() was called. None without --record. */
class RecordDir {
 public:
  explicit RecordDir(const CheckOptions& opts) {
    if (!opts.record) return;
    if (!opts.record_dir.empty()) {
      path_ = opts.record_dir;
      std::error_code ec;
      std::filesystem::create_directories(path_, ec);
      if (ec || !std::filesystem::is_directory(path_)) {
        throw InputError(opts.record_dir, "--record-dir",
                         "cannot make this directory (" + ec.message() + ")");
      }
    } else {
      std::string pattern = (std::filesystem::temp_directory_path() / "hpzlab-record-XXXXXX");
      if (::mkdtemp(pattern.data()) == nullptr) {
        throw std::runtime_error("cannot make a temporary directory for the recordings");
      }
      path_ = pattern;
      temporary_ = true;
    }
  }
  ~RecordDir() {
    if (!temporary_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  RecordDir(const RecordDir&) = delete;
  RecordDir& operator=(const RecordDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /** Leaves a temporary directory in place (a failed recording's message names it). */
  void keep() { temporary_ = false; }

 private:
  std::filesystem::path path_;
  bool temporary_ = false;  ///< made here: removed at the end
};

/** What the jobs of one `hpzlab check` share. */
struct JobRun {
  const CheckOptions& opts;
  const std::vector<Job>& jobs;
  bool matrix;  ///< more than one release: a refused one is a line, not an error
  RecordDir& record_dir;

  std::size_t size() const { return jobs.size(); }
  int total() const { return static_cast<int>(jobs.size()); }
};

/** Runs fn; when `progress` (the job shows its own progress, one job at a time), with the
 *  progress bar at `at` of `total` saying `what`. */
void shown(bool progress, double at, int total, const std::string& what,
           const std::function<void()>& fn) {
  if (progress) {
    run_showing_progress(at, total, what, fn);
  } else {
    fn();
  }
}

/** --record: the scenario's schedule recorded into the run's directory. */
Schedule recorded(const JobRun& run, const Scenario& sc) {
  try {
    return record_schedule(sc, run.record_dir.path());
  } catch (...) {
    // The message names the inputs' directory: a temporary one stays for the user to read.
    run.record_dir.keep();
    throw;
  }
}

/** --explain on job i's clean verdict: what orders the secondary copies and, for a built
 *  schedule with secondary copies, what each probed key does to it. */
void explain_job(const JobRun& run, std::size_t i, bool progress, const Scenario& sc,
                 const Schedule& schedule, std::optional<check::OrderExplanation>& explanation,
                 std::vector<Probe>& probes) {
  const CheckOptions& opts = run.opts;
  const Job& job = run.jobs[i];
  // One job alone uses every core for its checks; jobs of a matrix run a core each already.
  const unsigned workers = progress ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  shown(progress, static_cast<double>(i) + 0.7, run.total(),
        progress_what(i, run.size(), "explaining", sc.path), [&] {
          explanation = check::explain_ordering(schedule, workers);
          if (explanation->secondary_copies > 0 && !opts.record) {
            probes = probe_keys(sc, job.path, opts.user, job.overrides);
          }
        });
}

/** Job i's schedule checked, explained and its closest race timed, as the options ask. */
Checked verdict_of(const JobRun& run, std::size_t i, bool progress, const Scenario& sc,
                   const Schedule& schedule, std::optional<RecordingComparison> builder) {
  const CheckOptions& opts = run.opts;
  const std::string& path = sc.path;
  const MatrixEpoch* epoch = run.jobs[i].epoch ? &*run.jobs[i].epoch : nullptr;
  check::CheckResult result;
  std::string rank_by_rank;
  shown(progress, static_cast<double>(i) + 0.5, run.total(),
        progress_what(i, run.size(), "checking", path), [&] {
          result = check_one(schedule, opts, path.empty() ? "schedule" : path, rank_by_rank);
        });
  std::optional<check::OrderExplanation> explanation;
  std::vector<Probe> probes;
  if (opts.explain && result.clean())
    explain_job(run, i, progress, sc, schedule, explanation, probes);
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
}

/** One job: its scenario loaded, its schedule recorded or built, and checked. `progress`: the
 *  job shows its own progress (one job at a time). */
Checked run_job(const JobRun& run, std::size_t i, bool progress) {
  const Job& job = run.jobs[i];
  const MatrixEpoch* epoch = job.epoch ? &*job.epoch : nullptr;
  Scenario sc;
  try {
    sc = load(job.path, run.opts.user, job.overrides);
  } catch (const ReleaseRefusal& e) {
    // The user's ds_config has a key this release does not define: DeepSpeed refuses it.
    if (!run.matrix) throw;
    Scenario named;
    named.path = job.path;
    return refused_epoch(named, *epoch, e.what());
  }
  // A release the builder does not model: its line in a matrix; alone, the build below refuses
  // it in one line.
  if (run.matrix && epoch != nullptr && epoch->missing != nullptr && !run.opts.record) {
    return refused_epoch(sc, *epoch, "not modelled: " + lacks_rule(*epoch->missing));
  }
  Schedule schedule;
  std::optional<RecordingComparison> builder;
  if (run.opts.record) {
    schedule = recorded(run, sc);
    builder = compare_with_builder(sc, schedule);
  } else {
    try {
      shown(progress, static_cast<double>(i), run.total(),
            progress_what(i, run.size(), "building the schedule of", sc.path),
            [&] { schedule = build_schedule(sc, Engines::kByClass); });
    } catch (const ReleaseRefusal& e) {
      // DeepSpeed itself raises on this configuration: that release's line says so.
      if (!run.matrix) throw;
      return refused_epoch(sc, *epoch, e.what());
    }
    if (epoch != nullptr) schedule.source["deepspeed"] = releases_label(epoch->releases);
  }
  return verdict_of(run, i, progress, sc, schedule, std::move(builder));
}

/** Every job, in the jobs' order: one at a time with its own progress (--record, or one job),
 *  else built and checked on every core. */
std::vector<Checked> run_jobs(const JobRun& run) {
  const std::size_t n = run.size();
  std::vector<Checked> results;
  if (run.opts.record || n == 1) {
    for (std::size_t i = 0; i < n; ++i) results.push_back(run_job(run, i, true));
    return results;
  }
  // Several built schedules (a matrix of releases, several scenarios): built and checked on
  // every core, a job each, the results in the jobs' order whatever order they finish in. A
  // job's error is rethrown in that order too, as the serial loop would have met it.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min<std::size_t>(n, cores);
  std::vector<std::optional<Checked>> slots(n);
  parallel_for(
      n, cores, [&](std::size_t i) { slots[i] = run_job(run, i, false); },
      [&](std::size_t done) {
        if (!progress_on()) return;
        progress_bar(static_cast<double>(done), run.total(),
                     fmt::format("building and checking {} schedules on {} cores ({} done)", n,
                                 workers, done));
      });
  for (std::optional<Checked>& slot : slots) results.push_back(std::move(*slot));
  return results;
}

}  // namespace

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

/** Whether --deepspeed names more than one release: a refused release then gets its line and
 *  the matrix goes on; one release alone is refused in one line (exit 2). */
bool is_matrix(const std::vector<std::string>& releases) {
  return releases.size() > 1;
}

/** From this many ranks the check says when happens-before walked every rank (a smaller world
 *  is checked in about a second either way). */
constexpr std::size_t kSayWalkFrom = 64;

/** The check of one schedule (`what` names it): one rank per symmetry class, the same report as
 *  rank by rank, unless --per-rank. A schedule whose ranks are not alike is checked rank by
 *  rank, and `note` says so, for standard error (not the report, the same either way), as it
 *  does where a large world's happens-before walked every rank. */
check::CheckResult check_one(const Schedule& schedule, const CheckOptions& opts,
                             const std::string& what, std::string& note) {
  const std::string ranks = fmt::format("all {} ranks", schedule.ranks.size());
  if (opts.per_rank) {
    guard_every_rank(schedule, kCheckEveryRankPerOp, "checking " + ranks + " rank by rank");
    return check::check_schedule(schedule);
  }
  check::ClassCheck how;
  how.before_every_rank = [&](bool bytes_too) {
    guard_check_every_rank(
        schedule, bytes_too,
        bytes_too ? fmt::format("checking {} rank by rank ({})", ranks, how.per_rank_because)
                  : fmt::format("walking happens-before on {} ({})", ranks,
                                how.walked_every_rank_because));
  };
  check::CheckResult result = check::check_schedule_by_class(schedule, &how);
  if (!how.per_rank_because.empty()) {
    // No colon: the line follows the verdict, which scripts match up to the end.
    note = fmt::format("{} checked rank by rank ({}; {})", what, how.per_rank_because, how.summary);
  } else if (!how.walked_by_class && schedule.ranks.size() >= kSayWalkFrom) {
    // Checked by class, but happens-before walked by every rank: what makes a large world slow
    // (a rank issuing ordering ops the others do not; symmetric_world.hpp says why it must).
    note = fmt::format("{} walked happens-before on all {} ranks, not one per class ({}; {})", what,
                       schedule.ranks.size(), how.walked_every_rank_because, how.summary);
  }
  return result;
}

/** --sensitivity: the schedule simulated once (the scenario's seed) and, when a race is in it,
 *  every cost input scaled alone (`hpzlab sim --sensitivity`); none for a race-free schedule. */
std::optional<time::SensitivityResult> timing_margin(const Scenario& sc, const Schedule& schedule,
                                                     const check::CheckResult& result,
                                                     bool show_progress) {
  if (result.group_count(check::FindingKind::kRace) == 0) return std::nullopt;
  time::SimOptions o;
  o.runs = 1;
  o.full_timeline = false;  // the margins read the simulated ranks' times
  guard_simulation(o, schedule);
  const TimingInputs platform = timing_inputs_of(sc);
  const time::SimResult simulated = time::simulate(platform, schedule, o);
  if (!time::has_race(simulated)) return std::nullopt;
  return time::sensitivity(
      platform, schedule, simulated,
      [show_progress](int done, int total) {
        if (!show_progress) return;
        progress_bar(done, std::max(done, total),
                     fmt::format("sensitivity: {} timelines (about {})", done, total));
      },
      [&schedule] { guard_sensitivity_every_rank(schedule); });
}

std::vector<Checked> check_scenarios(const CheckOptions& opts,
                                     const std::vector<std::string>& releases) {
  if (opts.scenarios.empty() && !has_user_files(opts.user)) {
    throw InputError("", "scenario",
                     "is required (a scenario file, your own --hf-config FILE --ds-config FILE, "
                     "or --schedule FILE)");
  }
  const bool matrix = is_matrix(releases);
  const std::vector<Job> jobs = jobs_of(opts, releases);
  // --record: recordings land in --record-dir (kept), else in a directory removed at the end.
  RecordDir record_dir(opts);
  const JobRun run{opts, jobs, matrix, record_dir};
  std::vector<Checked> results = run_jobs(run);
  if (matrix && std::all_of(results.begin(), results.end(),
                            [](const Checked& c) { return !c.refused.empty(); })) {
    throw InputError(
        "", "--deepspeed",
        fmt::format("the builder checks none of these releases: {}", results.front().refused));
  }
  const std::size_t n = jobs.size();
  const int total = static_cast<int>(n);
  progress_bar(total, total,
               fmt::format("{} checked",
                           n == 1 ? results[0].result.scenario : fmt::format("{} scenarios", n)));
  return results;
}

}  // namespace hpz::cli
