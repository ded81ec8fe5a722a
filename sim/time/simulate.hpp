// `hpzlab sim` as a library: play a schedule forward in simulated time (engine.hpp), once or
// --runs times with different jitter seeds, and compute from Schedule + Timeline + link bytes
// what a training step costs and which of the checker's races bite.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/check/checker.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"
#include "sim/platform.hpp"
#include "sim/time/by_class.hpp"
#include "sim/time/engine.hpp"
#include "sim/time/platform.hpp"
#include "sim/time/races.hpp"

namespace hpz::time {

struct NodeQuotient;

/** Whether to simulate one node for all (by_class.hpp). */
enum class ByClass : std::uint8_t {
  kAuto,     ///< by class where exact (symmetric schedule and network, jitter 0), else every rank
  kPerRank,  ///< every rank (`sim --per-rank`)
  kForce,    ///< by class also with jitter (every node draws node 0's noise: not exact)
};

/** How to simulate. */
struct SimOptions {
  int runs = 1;             ///< runs, seeds run.seed, run.seed + 1, ...
  int parallel = 2;         ///< child processes at once
  bool check_races = true;  ///< run the race checker and time its races (off for benchmarks)
  ByClass by_class = ByClass::kAuto;
  /** By class: give SimResult::timeline every rank (copies of node 0's times, memory that
   *  grows with the world); false keeps node 0's ranks only, enough for the step metrics, the
   *  races, the console and the JSON without op times (not for traces, --op-times or
   *  sensitivity, which read every rank's times). */
  bool full_timeline = true;
  /** Called with (runs done, runs in all) after each run and about 4 times a second while one
   *  runs; runs done counts the run in progress by its share of ops done (e.g. 0.45). */
  std::function<void(double, int)> progress;
  /** Passed to the race checker by class (check::ClassCheck::before_every_rank): may refuse a
   *  walk of every rank by throwing (null: none refused). */
  std::function<void(bool bytes_too)> before_every_rank;
  /** Called before any run starts where every rank is simulated (and checked), with why the
   *  world does not fold onto node 0 ("--per-rank", or node_quotient's reason; "" for one
   *  node): may refuse by throwing (null: none refused). */
  std::function<void(const std::string& why)> before_simulating_every_rank;
};

/** The step-level numbers of one run (the schedule's last step). */
struct StepMetrics {
  double step_time_s = 0;            ///< end of step k-1's last op to end of step k's last op
  double tokens_per_s_per_node = 0;  ///< seq_len x micro_batch x grad_accum x gpus/node / step
  double exposed_comm_s = 0;  ///< mean over ranks: time in the step the compute stream S0 idles
  double host_stall_s = 0;    ///< mean over ranks: time the host blocked in fix A's syncs
  double host_sync_s = 0;     ///< mean over ranks: time the host blocked in any sync
  std::uint64_t races_manifested = 0;  ///< race instances that manifested in this run
  bool hung = false;                   ///< some ops never ran (mismatched collectives)
};

/** One race group of the checker and how often it manifested. */
struct RaceReport {
  check::FindingGroup group;
  std::uint64_t instances = 0;                    ///< op pairs behind the group
  std::vector<std::uint64_t> manifested_per_run;  ///< instances that manifested, per run
  int runs_manifested = 0;   ///< runs in which at least one instance manifested
  bool has_example = false;  ///< first run's first manifested instance is below
  RaceInstance example;
  Manifestation example_timing;
  double max_overlap_s = 0;  ///< over the first run's instances
  /** The race's margin in the first run: how long after the earlier op ended the later one
   *  started (second start - first end; negative: it bit, by that much), over the instances
   *  where both ran. `closest` is the instance with the smallest margin. */
  bool has_margin = false;
  double min_margin_s = 0;
  double median_margin_s = 0;
  RaceInstance closest;
  /** The smallest margin of each run (NaN where no instance ran): what a sweep row shows. */
  std::vector<double> min_margin_per_run;
};

/** One link direction's traffic. */
struct LinkReport {
  LinkSpec spec;
  double bytes = 0;            ///< whole run (first run)
  double bytes_last_step = 0;  ///< the step that step_time_s measures
  double utilisation = 0;      ///< bytes_last_step / (bandwidth x step time)
};

/** Everything `hpzlab sim` reports. */
struct SimResult {
  std::string scenario;
  std::string variant;
  int world_size = 0;
  int nodes = 0;
  ClusterConfig cluster;           ///< the hardware every time assumed (--gpu, --nic-gbps, ...)
  int steps = 0;                   ///< steps in the schedule; the last one is measured
  double spin_before_copy_us = 0;  ///< run.spin_before_copy_us: a reproduction's spin kernels
  std::string collective_model;    ///< fine | coarse
  std::string network_model;       ///< SimGrid model name
  double bandwidth_factor = 0;
  double latency_factor = 0;
  std::vector<StepMetrics> runs;  ///< per run
  StepMetrics mean;               ///< averaged over runs, but races_manifested is summed (mean_of)
  std::vector<RaceReport> races;
  std::vector<LinkReport> links;
  /** The first run's; by class without SimOptions::full_timeline, node 0's ranks only. */
  Timeline timeline;
  std::vector<RaceInstance> race_instances;
  EngineStats stats;  ///< the first run's (by class: node 0's transfers and delays)
  /** How the world folded when it was simulated by symmetry class (one node of each kind of
   *  node; each rank's times are those of the simulated rank that stands for it): what the
   *  metrics, the races and --sensitivity's re-simulations read the timelines by. */
  std::optional<NodeQuotient> quotient;
  /** By class: says so; otherwise why every rank was simulated ("" for --per-rank or a world
   *  of one node). */
  std::string by_class_how;
  bool by_class() const { return quotient.has_value(); }
};

/** Simulates `schedule` on the platform `in` (timing_inputs_of its scenario) per `options`;
 *  each run in a child process. */
SimResult simulate(const TimingInputs& in, const Schedule& schedule, const SimOptions& options);

/** Puts the checker's verdict into `result`: a RaceReport per finding group (nothing timed
 *  yet) and the race pairs to time (race_instances()). */
void attach_races(const check::CheckResult& checked, SimResult& result);

/** Times `result.race_instances` in each run: fills every RaceReport's counts and example
 *  (first run) and result.runs[k].races_manifested. result.runs has one entry per timeline.
 *  With `quotient`, a timeline of fewer ranks than the world is a run by class's: rank r's times
 *  are those of the simulated rank that stands for it (by_class.hpp). */
void time_races(const std::vector<const Timeline*>& timelines, SimResult& result,
                const NodeQuotient* quotient = nullptr);

/** The mean of per-run metrics (races_manifested is summed, hung is any). */
StepMetrics mean_of(const std::vector<StepMetrics>& runs);

/** The step metrics of one run: over the timeline's ranks (with `quotient`, a run by class's:
 *  the simulated ranks, each for the ranks it stands for). */
StepMetrics step_metrics(const TimingInputs& in, const Schedule& schedule, const Timeline& timeline,
                         const NodeQuotient* quotient = nullptr);

}  // namespace hpz::time
