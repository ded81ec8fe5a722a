// `hpzlab repro` as a library: replay stock, host-sync, event-wait and hpZ off (no-hpz) on the
// same seeds and compare them: first bad step, losses, share of runs that went bad, throughput.
// The driver layer, above the engines: it builds each variant's schedule (the builder), times it
// (the timing engine) and replays it (the data replay), from a Scenario.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/replay/replay.hpp"
#include "sim/scenario.hpp"

namespace hpz::replay {

/** Gives the timeline of one run of a schedule. */
using TimelineSource = std::function<Timeline(const Scenario&, const Schedule&, std::uint64_t)>;

/** One seeded run of the SimGrid timing engine (`hpzlab sim`), in a child process: SimGrid's
 *  engine is a per-process singleton. */
Timeline sim_timeline(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed);

/** How to reproduce. */
struct ReproOptions {
  int runs = 1;                            ///< seeds run.seed, run.seed + 1, ...
  std::optional<Mode> mode;                ///< default: default_mode()
  TimelineSource timeline = sim_timeline;  ///< tests give hand-made timelines
  std::string timing_name = "the SimGrid timing engine (hpzlab sim), one seeded run each";
  /** Called after each replay with the replays done and the total (for a progress bar). */
  std::function<void(int done, int total)> progress;
};

/** One variant over every run. */
struct VariantRepro {
  std::string name;                ///< stock | host-sync | event-wait | no-hpz
  std::vector<ReplayResult> runs;  ///< per seed
  /** Per seed, with ReproResult::baseline "serialized": the replay in issue order. */
  std::vector<ReplayResult> serialized;
  std::vector<std::optional<int>>
      first_bad;                     ///< per seed: first step whose weights or loss went bad
  double tokens_per_s_per_node = 0;  ///< mean over runs, last step of the timeline
  std::uint64_t mixed_reads = 0;     ///< over runs
  /** Share of runs with a bad step. */
  double share_bad() const;
  /** Share of runs whose loss became NaN. */
  double share_nan() const;
};

/** Everything `hpzlab repro` reports. */
struct ReproResult {
  std::string scenario;
  Mode mode = Mode::kNumeric;
  std::string timing;
  std::uint64_t first_seed = 0;
  int steps = 0;
  double spin_before_copy_us = 0;      ///< the scenario's run.spin_before_copy_us
  std::vector<VariantRepro> variants;  ///< stock, host-sync, event-wait, no-hpz
  /** What a bad step differs from: "no-hpz" (the same seed with hpZ off), or, for the numeric
   *  replay with qwZ, "serialized" (the same variant's schedule replayed one op at a time in
   *  issue order): qwZ rounds hpZ's secondaries in other groups than hpZ off's shards, so their
   *  numbers differ without any race. */
  std::string baseline = "no-hpz";
};

/** Runs every variant of `scenario` (whose run.variant is ignored) per `options`. */
ReproResult run_repro(const Scenario& scenario, const ReproOptions& options);

/** The replay's mode when none is asked for: numeric when numeric_fits(), else taint. */
Mode default_mode(const Scenario& scenario);

/** The replay a given schedule (say, read from a file) gets: `asked`, or numbers where the
 *  scenario's Llama computes the schedule's parameters (numeric_fits, llama_unsupported) and
 *  taint otherwise. Throws InputError naming `name` when the replay cannot follow the schedule
 *  (replay_unsupported) or numbers are asked for and cannot be had. */
Mode schedule_mode(const Scenario& scenario, const Schedule& schedule, const std::string& name,
                   std::optional<Mode> asked);

/** Replays one given schedule (say, read from a file: there are no variants to build) per
 *  `options`: with numbers where the scenario's Llama computes the schedule's parameters
 *  (numeric_fits, llama_unsupported), each run then held against the same schedule replayed in
 *  issue order (baseline "serialized"), else in the taint domain. Its one variant is named after
 *  schedule.variant, and `name` names the result. `scenario` supplies the model, the timing and
 *  run.steps, which must cover the schedule's steps. Throws InputError naming `name` when the
 *  replay cannot follow the schedule (replay_unsupported) or numbers are asked for and cannot
 *  be had. */
ReproResult replay_schedule(const Scenario& scenario, const Schedule& schedule,
                            const std::string& name, const ReproOptions& options);

/** The side-by-side table. */
std::string repro_table(const ReproResult& r);
/** Loss (or loss tag) per step, variant and run as CSV. */
std::string repro_csv(const ReproResult& r);
/** The loss curves of the first run as a self-contained SVG plot. */
std::string repro_svg(const ReproResult& r);
/** The JSON form: {"variants": {"stock": {"loss": [...], "first_bad_step": n|null, ...}},
 *  "notes": [...]}, `notes` being what loading the scenario noted (Scenario::notes). */
std::string repro_json(const ReproResult& r, const std::vector<std::string>& notes = {});

}  // namespace hpz::replay
