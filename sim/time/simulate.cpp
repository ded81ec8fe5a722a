#include "sim/time/simulate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <future>
#include <limits>

#include "sim/time/by_class.hpp"

namespace hpz::time {
namespace {

/** The runs' child processes: at most `parallel` at once, seeds run.seed, run.seed + 1, ... */
class Runs {
 public:
  Runs(const TimingInputs& in, const Schedule& schedule, const SimOptions& options,
       const NodeQuotient* quotient)
      : in_(in),
        schedule_(schedule),
        options_(options),
        quotient_(quotient),
        total_(std::max(1, options.runs)) {
    top_up();
  }

  /** Reports `collected` runs done plus the share of the next one's ops done. */
  void report_progress(std::size_t collected = 0) const {
    if (options_.progress) {
      options_.progress(static_cast<double>(collected) + running_.front().fraction(), total_);
    }
  }

  /** Waits for every run, in seed order. */
  std::vector<EngineRun> collect() {
    std::vector<EngineRun> runs;
    while (static_cast<int>(runs.size()) < total_) {
      while (options_.progress && !running_.front().ready(250)) report_progress(runs.size());
      runs.push_back(running_.front().wait());
      running_.pop_front();
      top_up();
      if (options_.progress) options_.progress(static_cast<double>(runs.size()), total_);
    }
    return runs;
  }

 private:
  void top_up() {
    while (started_ < total_ &&
           static_cast<int>(running_.size()) < std::max(1, options_.parallel)) {
      running_.emplace_back(in_, schedule_, in_.seed + static_cast<std::uint64_t>(started_++),
                            quotient_);
    }
  }

  const TimingInputs& in_;
  const Schedule& schedule_;
  const SimOptions& options_;
  const NodeQuotient* quotient_;  ///< by class, or null
  const int total_;
  int started_ = 0;
  std::deque<ChildRun> running_;
};

/** The race checker; with a progress callback it runs on a thread of its own while this one
 *  keeps reporting the runs' progress (the checker takes seconds at 1,024 ranks). */
check::CheckResult check_showing_progress(const Schedule& schedule, const Runs& children,
                                          const SimOptions& options, bool by_class) {
  // By class the checker runs by class too (its report is the rank-by-rank one, byte for byte).
  const auto check = [&schedule, &options, by_class] {
    if (!by_class) return check::check_schedule(schedule);
    check::ClassCheck how;
    how.before_every_rank = options.before_every_rank;
    return check::check_schedule_by_class(schedule, &how);
  };
  if (!options.progress) return check();
  auto checked = std::async(std::launch::async, check);
  while (checked.wait_for(std::chrono::milliseconds(250)) != std::future_status::ready) {
    children.report_progress();
  }
  return checked.get();  // rethrows what the checker threw
}

void link_reports(const TimingInputs& in, const EngineRun& run, SimResult& result) {
  const Topology topology(in.cluster);
  const double step = result.runs.front().step_time_s;
  for (std::size_t l = 0; l < topology.links().size(); ++l) {
    LinkReport report;
    report.spec = topology.links()[l];
    for (const auto& per_step : run.link_bytes) report.bytes += per_step[l];
    report.bytes_last_step = run.link_bytes.back()[l];
    report.utilisation = step > 0 ? report.bytes_last_step / (report.spec.bytes_per_s * step) : 0;
    result.links.push_back(report);
  }
}

}  // namespace

void attach_races(const check::CheckResult& checked, SimResult& result) {
  for (const check::FindingGroup& g : checked.groups)
    result.races.push_back({g, 0, {}, 0, false, {}, {}, 0, false, 0, 0, {}, {}});
  result.race_instances = race_instances(checked);
}

void time_races(const std::vector<const Timeline*>& runs, SimResult& result,
                const NodeQuotient* quotient) {
  for (RaceReport& report : result.races) {
    report.manifested_per_run.assign(runs.size(), 0);
    report.min_margin_per_run.assign(runs.size(), std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<std::vector<double>> margins(result.races.size());  // first run, per group
  for (std::size_t run = 0; run < runs.size(); ++run) {
    for (const RaceInstance& race : result.race_instances) {
      const Manifestation m = manifestation(*runs[run], race, quotient);
      RaceReport& report = result.races[race.group];
      if (m.first_end_s >= 0 && m.second_start_s >= 0) {
        double& least = report.min_margin_per_run[run];
        const double margin = m.second_start_s - m.first_end_s;
        if (std::isnan(least) || margin < least) least = margin;
      }
      if (run == 0) {
        ++report.instances;
        report.max_overlap_s = std::max(report.max_overlap_s, m.overlap_s);
        if (m.first_end_s >= 0 && m.second_start_s >= 0) {  // both ran
          const double margin = m.second_start_s - m.first_end_s;
          if (!report.has_margin || margin < report.min_margin_s) {
            report.min_margin_s = margin;
            report.closest = race;
          }
          report.has_margin = true;
          margins[race.group].push_back(margin);
        }
      }
      if (!m.manifested) continue;
      ++report.manifested_per_run[run];
      ++result.runs[run].races_manifested;
      if (run == 0 && !report.has_example) {
        report.has_example = true;
        report.example = race;
        report.example_timing = m;
      }
    }
  }
  for (std::size_t g = 0; g < result.races.size(); ++g) {
    std::vector<double>& v = margins[g];
    if (v.empty()) continue;
    // The lower median: a margin some instance really had.
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
    std::nth_element(v.begin(), mid, v.end());
    result.races[g].median_margin_s = *mid;
  }
  for (RaceReport& report : result.races) {
    report.runs_manifested = static_cast<int>(std::count_if(report.manifested_per_run.begin(),
                                                            report.manifested_per_run.end(),
                                                            [](std::uint64_t n) { return n > 0; }));
  }
}

StepMetrics mean_of(const std::vector<StepMetrics>& runs) {
  StepMetrics m;
  const auto n = static_cast<double>(runs.size());
  for (const StepMetrics& r : runs) {
    m.step_time_s += r.step_time_s / n;
    m.tokens_per_s_per_node += r.tokens_per_s_per_node / n;
    m.exposed_comm_s += r.exposed_comm_s / n;
    m.host_stall_s += r.host_stall_s / n;
    m.host_sync_s += r.host_sync_s / n;
    m.races_manifested += r.races_manifested;
    m.hung = m.hung || r.hung;
  }
  return m;
}

SimResult simulate(const TimingInputs& in, const Schedule& schedule, const SimOptions& options) {
  SimResult result;
  result.scenario = schedule.scenario;
  result.variant = schedule.variant;
  result.world_size = schedule.world_size;
  result.nodes = in.cluster.nodes;
  result.cluster = in.cluster;
  result.steps = in.steps;
  result.spin_before_copy_us = in.spin_before_copy_us;
  result.collective_model = in.sim.collective_model;
  result.network_model = in.sim.network_model;
  result.bandwidth_factor = in.sim.bandwidth_factor;
  result.latency_factor = in.sim.latency_factor;
  if (options.by_class != ByClass::kPerRank) {
    NodeQuotient quotient;
    if (node_quotient(in, schedule, options.by_class == ByClass::kForce, quotient,
                      result.by_class_how)) {
      result.by_class_how = describe_quotient(quotient);
      result.quotient = std::move(quotient);
    }
    if (in.cluster.nodes < 2) result.by_class_how.clear();  // nothing to fold
  }
  const NodeQuotient* folded_by = result.quotient ? &*result.quotient : nullptr;
  if (folded_by == nullptr && options.before_simulating_every_rank) {
    options.before_simulating_every_rank(
        options.by_class == ByClass::kPerRank ? "--per-rank" : result.by_class_how);
  }
  // The children simulate while this process runs the checker (two cores: the checker's time
  // mostly disappears from the wall time).
  Runs children(in, schedule, options, folded_by);
  if (options.check_races) {
    attach_races(check_showing_progress(schedule, children, options, result.by_class()), result);
  }
  std::vector<EngineRun> runs = children.collect();
  if (folded_by != nullptr) {
    const Topology topology(in.cluster);
    for (EngineRun& run : runs) unfold_links(*folded_by, topology, run);
  }
  for (const EngineRun& run : runs) {
    result.runs.push_back(step_metrics(in, schedule, run.timeline, folded_by));
  }
  std::vector<const Timeline*> timelines;
  for (const EngineRun& run : runs) timelines.push_back(&run.timeline);
  time_races(timelines, result, folded_by);
  result.mean = mean_of(result.runs);
  link_reports(in, runs.front(), result);
  result.stats = runs.front().stats;
  result.timeline = std::move(runs.front().timeline);
  if (folded_by != nullptr && options.full_timeline) unfold_timeline(*folded_by, result.timeline);
  return result;
}

}  // namespace hpz::time
