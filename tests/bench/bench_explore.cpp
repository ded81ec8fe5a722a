// Google Benchmark case for interleaving exploration (issue 19's target: `hpzlab explore
// --budget 1000` on tiny.toml under 60 s on one core). tiny.toml's stock schedule stops at its
// first counterexample (the first targeted order), so the full budget is measured on the
// event-wait fix, where every one of the 1000 random orders is replayed numerically and
// compared with the reference.
#include <benchmark/benchmark.h>

#include <string>

#include "sim/builder.hpp"
#include "sim/replay/explore.hpp"
#include "sim/scenario.hpp"

namespace {

void BM_ExploreTiny(benchmark::State& state) {
  const hpz::Scenario sc = hpz::load_scenario(
      std::string(HPZLAB_SOURCE_DIR) + "/scenarios/tiny.toml", {{"run.variant", "event-wait"}});
  const hpz::Schedule schedule = hpz::build_schedule(sc);
  hpz::replay::ExploreOptions o;
  o.budget = static_cast<int>(state.range(0));
  o.mode = hpz::replay::Mode::kNumeric;
  for (auto _ : state) {
    const hpz::replay::ExploreResult r =
        hpz::replay::explore(hpz::replay_inputs_of(sc), schedule, {}, {}, o);
    if (r.counterexample) state.SkipWithError("a counterexample on a clean schedule");
    benchmark::DoNotOptimize(r.random);
  }
  state.counters["orders"] = static_cast<double>(o.budget);
}
BENCHMARK(BM_ExploreTiny)->Arg(1000)->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace

BENCHMARK_MAIN();
