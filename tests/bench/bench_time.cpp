// Google Benchmark cases for the timing engine: one step of llama2-70b (stock, qwZ + qgZ) with
// the fine collective model on 2 x 8 GPUs and the coarse model on 8, 16, 32, 64 and 128 x 8
// GPUs (select with --benchmark_filter, e.g. 'BM_SimLlama70b/128/1'); the DeepSpeed builder's
// schedule of it (qwZ and qgZ off) in BM_SimLlama70bDeepSpeed. Each iteration simulates in a
// forked child (SimGrid runs once per process), so the time includes the fork; the counters
// report the child's events per second and peak memory. The 2 x 8 case also prints the coarse
// model's step-time error against the fine one.
#include <benchmark/benchmark.h>

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

hpz::Scenario llama70b(int nodes, const std::string& model, const std::string& builder = "coarse") {
  std::vector<hpz::Override> sets = {{"cluster.nodes", std::to_string(nodes)},
                                     {"run.steps", "1"},
                                     {"sim.collective_model", model},
                                     {"run.builder", builder}};
  if (builder == "deepspeed") {  // as the checker's benchmark and the README's numbers
    sets.push_back({"zero.zero_quantized_weights", "false"});
    sets.push_back({"zero.zero_quantized_gradients", "false"});
  }
  return hpz::load_scenario(std::string(HPZLAB_SOURCE_DIR) + "/scenarios/llama2-70b.toml", sets);
}

const hpz::Schedule& schedule_of(const hpz::Scenario& sc) {
  static std::map<std::pair<int, std::string>, std::unique_ptr<hpz::Schedule>> cache;
  const auto key = std::make_pair(sc.cluster.nodes, sc.run.builder);
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
  return hpz::time::simulate(sc, schedule_of(sc), opts);
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

void BM_SimLlama70b(benchmark::State& state) {
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

// The DeepSpeed builder's schedule of the same model (about 4 times the ops a rank).
void BM_SimLlama70bDeepSpeed(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const hpz::Scenario sc = llama70b(nodes, state.range(1) != 0 ? "coarse" : "fine", "deepspeed");
  hpz::time::SimResult r;
  for (auto _ : state) {
    r = run_once(sc);
    benchmark::DoNotOptimize(r);
  }
  report(state, r);
}

BENCHMARK(BM_SimLlama70bDeepSpeed)
    ->Args({2, 0})
    ->Args({16, 1})
    ->Args({128, 1})
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->UseRealTime();

BENCHMARK(BM_SimLlama70b)
    ->Args({2, 0})
    ->Args({8, 1})
    ->Args({16, 1})
    ->Args({32, 1})
    ->Args({64, 1})
    ->Args({128, 1})
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
