// `hpzlab sim --sensitivity` (sim/time/sensitivity.hpp) on tiny.toml's DeepSpeed schedule
// without the spin kernel, where the race misses by tens of microseconds: a faster host (less
// launch overhead) or a slower inter-node latency makes it bite, bandwidth does not; the flip is
// bracketed by the samples around it; the same run twice gives the same numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "sim/builder.hpp"
#include "sim/time/sensitivity.hpp"
#include "sim/time/simulate.hpp"
#include "tests/paths.hpp"

namespace hpz::time {
namespace {

const SensitivityRow& row(const SensitivityResult& r, const std::string& key) {
  const auto it = std::find_if(r.rows.begin(), r.rows.end(),
                               [&](const SensitivityRow& x) { return x.key == key; });
  EXPECT_NE(it, r.rows.end()) << key;
  return *it;
}

SensitivityResult run(const std::vector<Override>& more = {}) {
  std::vector<Override> o = {{"run.builder", "deepspeed"}, {"run.spin_before_copy_us", "0"}};
  o.insert(o.end(), more.begin(), more.end());
  const Scenario sc = load_scenario(test::scenario_path("tiny"), o);
  const Schedule s = build_schedule(sc);
  return sensitivity(timing_inputs_of(sc), s, simulate(timing_inputs_of(sc), s, {}));
}

TEST(Sensitivity, NamesTheInputsThatDecideTheBite) {
  const SensitivityResult r = run();
  ASSERT_TRUE(r.min_margin_s.has_value());
  EXPECT_GT(*r.min_margin_s, 0);  // it misses without the spin
  const SensitivityRow& launch = row(r, "sim.launch_overhead_us");
  ASSERT_FALSE(launch.flips.empty());
  const SensitivityFlip& f = launch.flips.front();
  EXPECT_TRUE(f.bites);
  EXPECT_LT(f.factor, 1);  // a faster host
  EXPECT_DOUBLE_EQ(f.value, launch.value * f.factor);
  // The flip lies between the grid's samples on either side of it.
  const auto below = std::find_if(launch.samples.begin(), launch.samples.end(),
                                  [](const SensitivitySample& s) { return s.factor == 0.25; });
  ASSERT_NE(below, launch.samples.end());
  EXPECT_LT(*below->min_margin_s, 0);
  EXPECT_GT(f.factor, 0.25);
  // Bandwidth is not what decides it here.
  EXPECT_TRUE(row(r, "cluster.nic_gbps").flips.empty());
  EXPECT_TRUE(row(r, "cluster.nvlink_gbytes_per_s").flips.empty());
  const std::string sentence = sensitivity_sentence(r);
  EXPECT_NE(sentence.find("misses by"), std::string::npos) << sentence;
  EXPECT_NE(sentence.find("would bite with"), std::string::npos) << sentence;
  // Efficiencies stop at 1: the bound is sampled, nothing past it.
  for (const SensitivitySample& s : row(r, "sim.compute_efficiency").samples) {
    EXPECT_LE(s.value, 1.0);
  }
}

TEST(Sensitivity, Deterministic) {
  const SensitivityResult a = run(), b = run();
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    ASSERT_EQ(a.rows[i].samples.size(), b.rows[i].samples.size());
    for (std::size_t k = 0; k < a.rows[i].samples.size(); ++k) {
      EXPECT_EQ(a.rows[i].samples[k].min_margin_s, b.rows[i].samples[k].min_margin_s);
    }
    ASSERT_EQ(a.rows[i].flips.size(), b.rows[i].flips.size());
    for (std::size_t k = 0; k < a.rows[i].flips.size(); ++k) {
      EXPECT_EQ(a.rows[i].flips[k].factor, b.rows[i].flips[k].factor);
    }
  }
  EXPECT_EQ(sensitivity_table(a), sensitivity_table(b));
}

// At jitter 0 the first run folds onto node 0 and so do the re-simulations: the same samples and
// flips as re-simulating every rank from a run of every rank.
TEST(Sensitivity, ByClassGivesWhatEveryRankGives) {
  const Scenario sc = load_scenario(
      test::scenario_path("tiny"),
      {{"run.builder", "deepspeed"}, {"run.spin_before_copy_us", "0"}, {"sim.jitter", "0"}});
  const Schedule s = build_schedule(sc);
  const TimingInputs in = timing_inputs_of(sc);
  SimOptions lean;
  lean.full_timeline = false;  // the first run's timeline: node 0's ranks only
  const SimResult folded_run = simulate(in, s, lean);
  ASSERT_TRUE(folded_run.by_class()) << folded_run.by_class_how;
  ASSERT_LT(folded_run.timeline.ranks.size(), s.ranks.size());
  SimOptions every;
  every.by_class = ByClass::kPerRank;
  const SensitivityResult a = sensitivity(in, s, folded_run);
  bool asked = false;
  const SensitivityResult b = sensitivity(in, s, simulate(in, s, every), {}, [&] { asked = true; });
  EXPECT_TRUE(a.by_class);
  EXPECT_FALSE(b.by_class);
  EXPECT_TRUE(asked);  // the hook that guards re-simulating every rank
  EXPECT_EQ(a.min_margin_s, b.min_margin_s);
  EXPECT_EQ(a.runs, b.runs);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  std::size_t flips = 0;
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    ASSERT_EQ(a.rows[i].samples.size(), b.rows[i].samples.size()) << a.rows[i].key;
    for (std::size_t k = 0; k < a.rows[i].samples.size(); ++k) {
      EXPECT_EQ(a.rows[i].samples[k].min_margin_s, b.rows[i].samples[k].min_margin_s)
          << a.rows[i].key << " x" << a.rows[i].samples[k].factor;
    }
    ASSERT_EQ(a.rows[i].flips.size(), b.rows[i].flips.size()) << a.rows[i].key;
    for (std::size_t k = 0; k < a.rows[i].flips.size(); ++k) {
      EXPECT_EQ(a.rows[i].flips[k].factor, b.rows[i].flips[k].factor) << a.rows[i].key;
    }
    flips += a.rows[i].flips.size();
  }
  EXPECT_GT(flips, 0u);  // something to compare: the launch overhead flips it (above)
}

TEST(Sensitivity, BitingRaceSaysWhatWouldStopIt) {
  // With tiny.toml's 200 us spin it bites by about 2 ms; no input within x4 stops it.
  const SensitivityResult r = run({{"run.spin_before_copy_us", "200"}});
  ASSERT_TRUE(r.min_margin_s.has_value());
  EXPECT_LT(*r.min_margin_s, 0);
  const std::string sentence = sensitivity_sentence(r);
  EXPECT_NE(sentence.find("bites by"), std::string::npos) << sentence;
}

}  // namespace
}  // namespace hpz::time
