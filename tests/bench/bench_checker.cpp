// Google Benchmark cases for the race checker: llama2-70b (stock, so every race is found and
// grouped) at 2, 16 and 128 nodes of 8 GPUs. The schedule is built once per size, outside the
// timed loop; peak_rss_mib is the process's peak resident memory after the run, schedule
// included; rss_before_check_mib is the peak before the first check (the schedule and its
// construction).
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <memory>
#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/scenario.hpp"

namespace {

using hpz::Override;

/** llama2-70b on `nodes` nodes with `sets` on top, built once and kept until another is asked
 *  for: one schedule alive at a time (the 128-node one is large, and a schedule left over from an
 *  earlier case would count in the next case's peak RSS). */
const hpz::Schedule& llama70b(int nodes, const std::vector<Override>& sets) {
  static std::vector<Override> key;
  static std::unique_ptr<hpz::Schedule> cached;
  std::vector<Override> all = {{"cluster.nodes", std::to_string(nodes)}};
  all.insert(all.end(), sets.begin(), sets.end());
  if (!cached || key != all) {
    cached.reset();
    const hpz::Scenario sc =
        hpz::load_scenario(std::string(HPZLAB_SOURCE_DIR) + "/scenarios/llama2-70b.toml", all);
    cached = std::make_unique<hpz::Schedule>(hpz::build_schedule(sc));
    key = all;
  }
  return *cached;
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void check_and_count(benchmark::State& state, const hpz::Schedule& schedule) {
  const double schedule_rss = peak_rss_mib();
  hpz::check::CheckResult result;
  for (auto _ : state) {
    result = hpz::check::check_schedule(schedule);
    benchmark::DoNotOptimize(result);
  }
  state.counters["ranks"] = static_cast<double>(schedule.world_size);
  state.counters["ops"] = static_cast<double>(result.stats.ops);
  state.counters["ops_per_s"] = benchmark::Counter(static_cast<double>(result.stats.ops),
                                                   benchmark::Counter::kIsIterationInvariantRate);
  state.counters["races"] = static_cast<double>(result.count(hpz::check::FindingKind::kRace));
  state.counters["clock_bases"] = static_cast<double>(result.stats.clock_bases);
  state.counters["peak_rss_mib"] = peak_rss_mib();
  state.counters["rss_before_check_mib"] = schedule_rss;
}

// llama2-70b's DeepSpeed schedule (docs/deepspeed-builder.md), qwZ and qgZ off (as the README's
// numbers were measured).
void BM_CheckLlama70bDeepSpeed(benchmark::State& state) {
  check_and_count(state, llama70b(static_cast<int>(state.range(0)),
                                  {{"zero.zero_quantized_weights", "false"},
                                   {"zero.zero_quantized_gradients", "false"}}));
}

// The shipped scenario as it is (qwZ and qgZ on, DeepSpeed's schedule), checked as `hpzlab check`
// does since issue 33: one rank per symmetry class (range(1) = 1), or every rank (0, --per-rank).
// The reports are equal byte for byte (tests/test_check_by_class.cpp).
void BM_CheckLlama70bShipped(benchmark::State& state) {
  const hpz::Schedule& schedule = llama70b(static_cast<int>(state.range(0)), {});
  const bool by_class = state.range(1) != 0;
  const double schedule_rss = peak_rss_mib();
  hpz::check::CheckResult result;
  hpz::check::ClassCheck how;
  for (auto _ : state) {
    result = by_class ? hpz::check::check_schedule_by_class(schedule, &how)
                      : hpz::check::check_schedule(schedule);
    benchmark::DoNotOptimize(result);
  }
  state.counters["ranks"] = static_cast<double>(schedule.world_size);
  state.counters["classes"] = by_class ? static_cast<double>(how.classes) : 0.0;
  state.counters["races"] = static_cast<double>(result.count(hpz::check::FindingKind::kRace));
  state.counters["peak_rss_mib"] = peak_rss_mib();
  state.counters["rss_before_check_mib"] = schedule_rss;
}

}  // namespace

// 2, 16 and 64 nodes (16 to 512 GPUs), each by class and then rank by rank on the same schedule
// (rank by rank needs more memory, so its peak RSS is its own); 128 nodes (1,024 GPUs) by class
// only, last: its schedule alone is about 2.5 GiB.
BENCHMARK(BM_CheckLlama70bShipped)
    ->Args({2, 1})
    ->Args({2, 0})
    ->Args({16, 1})
    ->Args({16, 0})
    ->Args({64, 1})
    ->Args({64, 0})
    ->Args({128, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// 32 and 64 nodes show how the checker's time and memory grow with the world on this schedule;
// 128 nodes is issue 16's target (1,024 GPUs: under 30 s on one core and 4 GiB).
BENCHMARK(BM_CheckLlama70bDeepSpeed)
    ->Arg(2)
    ->Arg(16)
    ->Arg(32)
    ->Arg(64)
    ->Arg(128)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

BENCHMARK_MAIN();
