// Google Benchmark cases for the timing engine: one step of llama2-70b's schedule (stock, qwZ and
// qgZ off) with the fine collective model on 2 x 8 GPUs and the coarse model on 16 and 128 x 8
// GPUs (select with --benchmark_filter, e.g. 'BM_SimLlama70bDeepSpeed/128/1'). Each iteration
// simulates in a forked child (SimGrid runs once per process), so the time includes the fork;
// the counters report the child's events per second and peak memory. The 2 x 8 case also prints
// the coarse model's step-time error against the fine one. BM_SimShippedByClass: the shipped
// scenario (sim.jitter = 0) simulated by symmetry class against every rank, 2 to 128 nodes.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sim/builder.hpp"
#include "sim/scenario.hpp"
#include "sim/time/simulate.hpp"

namespace {

// qwZ and qgZ off, as the checker's benchmark and the README's numbers.
hpz::Scenario llama70b(int nodes, const std::string& model) {
  const std::vector<hpz::Override> sets = {{"cluster.nodes", std::to_string(nodes)},
                                           {"run.steps", "1"},
                                           {"sim.collective_model", model},
                                           {"zero.zero_quantized_weights", "false"},
                                           {"zero.zero_quantized_gradients", "false"}};
  return hpz::load_scenario(std::string(HPZLAB_SOURCE_DIR) + "/scenarios/llama2-70b.toml", sets);
}

const hpz::Schedule& schedule_of(const hpz::Scenario& sc) {
  static std::map<int, std::unique_ptr<hpz::Schedule>> cache;
  const int key = sc.cluster.nodes;
  auto& slot = cache[key];
  if (!slot) {
    cache.clear();  // one schedule alive at a time: the 128-node one is large
    auto& fresh = cache[key];
    fresh = std::make_unique<hpz::Schedule>(hpz::build_schedule(sc));
    return *fresh;
  }
  return *slot;
}

hpz::time::SimResult run_once(const hpz::Scenario& sc) {
  hpz::time::SimOptions opts;
  opts.check_races = false;  // the checker has its own benchmark
  return hpz::time::simulate(timing_inputs_of(sc), schedule_of(sc), opts);
}

void report(benchmark::State& state, const hpz::time::SimResult& r) {
  const double events = static_cast<double>(r.stats.transfers + r.stats.execs);
  state.counters["ranks"] = r.world_size;
  state.counters["step_time_s"] = r.mean.step_time_s;
  state.counters["transfers"] = static_cast<double>(r.stats.transfers);
  state.counters["simgrid_comms"] = static_cast<double>(r.stats.simgrid_comms);
  state.counters["events"] = events;
  state.counters["events_per_s"] = events / r.stats.wall_s;
  state.counters["sim_wall_s"] = r.stats.wall_s;
  state.counters["child_peak_rss_mib"] = r.stats.peak_rss_bytes / (1024.0 * 1024.0);
}

// DeepSpeed's schedule (about 4 times the ops a rank of the retired coarse builder's); at 2 x 8
// the coarse collective model's step time against the fine one's.
void BM_SimLlama70bDeepSpeed(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const bool coarse = state.range(1) != 0;
  const hpz::Scenario sc = llama70b(nodes, coarse ? "coarse" : "fine");
  hpz::time::SimResult r;
  for (auto _ : state) {
    r = run_once(sc);
    benchmark::DoNotOptimize(r);
  }
  report(state, r);
  if (nodes == 2 && !coarse) {
    const double coarse_step = run_once(llama70b(nodes, "coarse")).mean.step_time_s;
    state.counters["coarse_step_error_pct"] =
        100.0 * std::fabs(coarse_step - r.mean.step_time_s) / r.mean.step_time_s;
  }
}

// By symmetry class (sim/time/by_class.hpp): the shipped llama2-70b.toml as it is (DeepSpeed's
// schedule, qwZ and qgZ on, two steps) but sim.jitter = 0, where by class is exact and the
// default; range(1) = 1 by class, 0 every rank (--per-rank). Whole simulate() calls: schedule
// build excluded (done once), race checker included; peak_rss_mib is this process's (schedule,
// checker, timelines), child_peak_rss_mib the simulating child's. range(2): 1 coarse.
hpz::Scenario shipped(int nodes, bool coarse) {
  return hpz::load_scenario(std::string(HPZLAB_SOURCE_DIR) + "/scenarios/llama2-70b.toml",
                            {{"cluster.nodes", std::to_string(nodes)},
                             {"sim.jitter", "0"},
                             {"sim.collective_model", coarse ? "coarse" : "fine"}});
}

void BM_SimShippedByClass(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const bool by_class = state.range(1) != 0;
  const hpz::Scenario sc = shipped(nodes, state.range(2) != 0);
  const hpz::Schedule schedule = hpz::build_schedule(sc);
  hpz::time::SimOptions opts;
  opts.by_class = by_class ? hpz::time::ByClass::kAuto : hpz::time::ByClass::kPerRank;
  opts.full_timeline = false;  // as `hpzlab sim` without --trace, --op-times or --sensitivity
  hpz::time::SimResult r;
  for (auto _ : state) {
    r = hpz::time::simulate(timing_inputs_of(sc), schedule, opts);
    benchmark::DoNotOptimize(r);
  }
  report(state, r);
  state.counters["by_class"] = r.by_class() ? 1 : 0;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_mib"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
}

BENCHMARK(BM_SimShippedByClass)
    ->Args({2, 1, 0})
    ->Args({2, 0, 0})
    ->Args({16, 1, 0})
    ->Args({16, 0, 0})
    ->Args({16, 1, 1})
    ->Args({16, 0, 1})
    ->Args({128, 1, 1})
    ->Args({128, 1, 0})
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->UseRealTime();

BENCHMARK(BM_SimLlama70bDeepSpeed)
    ->Args({2, 0})
    ->Args({16, 1})
    ->Args({128, 1})
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
