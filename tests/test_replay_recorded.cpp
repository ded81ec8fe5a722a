// The data replay on recordings of real DeepSpeed (traces/deepspeed/, `hpzlab record`): the numeric
// replay finds each parameter's module part among autograd's kernels by the buffers they touch
// (numeric_modules.cpp) and the optimizer step where the primaries are written back
// (data_engine.hpp). Held to the builder's schedule of the same model: where no race bites, the
// recording gives the builder's numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/driver/repro.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/replay/numeric_domain.hpp"
#include "sim/replay/replay.hpp"
#include "tests/recorded.hpp"

namespace hpz::replay {
namespace {

using test::recorded_tiny;
using test::recording;

TEST(RecordedReplay, RecordingOfOneRankIsRefused) {
  // tiny-0.13.4 records rank 0; ranks 1-15 are its copies, at rank 0's byte offsets.
  const Schedule s = recording("tiny-0.13.4");
  EXPECT_NE(replay_unsupported(s).find("copies"), std::string::npos);
  const Scenario sc = recorded_tiny("0.13.4");
  try {
    replay_schedule(sc, s, "tiny-0.13.4.json.gz", {});
    FAIL() << "replayed a recording of one rank";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--rank all"), std::string::npos) << e.what();
  }
}

TEST(RecordedReplay, EveryRankRecordedGivesTheBuildersNumbersInIssueOrder) {
  // Both schedules replayed one op at a time in issue order: the same model, weights, tokens and
  // optimizer, so the same losses and weights, step for step and bit for bit, although the
  // recording's forward and backward are autograd's kernels and its optimizer DeepSpeed's flat
  // fp32 partition.
  for (const char* version : {"0.13.4", "0.13.5"}) {
    const Scenario sc = recorded_tiny(version);
    const Schedule rec = recording(std::string("tiny-") + version + "-all-ranks");
    ASSERT_EQ(replay_unsupported(rec), "") << version;
    ASSERT_EQ(llama_unsupported(replay_inputs_of(sc), rec), "") << version;
    const Schedule built = build_schedule(sc);
    const ReplayResult a =
        replay(replay_inputs_of(sc), rec, serialized_timeline(rec), Mode::kNumeric);
    const ReplayResult b =
        replay(replay_inputs_of(sc), built, serialized_timeline(built), Mode::kNumeric);
    ASSERT_EQ(a.steps.size(), 3u) << version;
    ASSERT_EQ(b.steps.size(), a.steps.size()) << version;
    for (std::size_t k = 0; k < a.steps.size(); ++k) {
      EXPECT_TRUE(std::isfinite(a.steps[k].loss)) << version << " step " << k;
      EXPECT_EQ(a.steps[k].loss, b.steps[k].loss) << version << " step " << k;
      EXPECT_EQ(a.steps[k].weights_hash, b.steps[k].weights_hash) << version << " step " << k;
    }
    EXPECT_NE(a.steps[0].weights_hash, a.steps[1].weights_hash);  // the weights move
  }
}

TEST(RecordedReplay, ASpinAheadOfEachSecondaryCopyMakes0134sOwnOrderGoNan) {
  // run.spin_before_copy_us put into the recordings where the builder puts it (200 us, as
  // tiny.toml): along the timing engine's timeline, 0.13.4's backward gathers of step 1 read
  // secondaries before their copies end, and step 2's loss is NaN; 0.13.5, whose gathers wait
  // for the copies (PR 5216), equals its own issue order.
  for (const char* version : {"0.13.4", "0.13.5"}) {
    Scenario sc = recorded_tiny(version);
    sc.run.spin_before_copy_us = 200;
    const Schedule rec = with_spin_before_secondary_copies(
        recording(std::string("tiny-") + version + "-all-ranks"), sc.run.spin_before_copy_us);
    const ReproResult r = replay_schedule(sc, rec, "recording", {});
    ASSERT_EQ(r.mode, Mode::kNumeric) << version;
    ASSERT_EQ(r.variants.size(), 1u);
    const ReplayResult& run = r.variants[0].runs.at(0);
    ASSERT_EQ(run.steps.size(), 3u) << version;
    if (std::string(version) == "0.13.4") {
      EXPECT_EQ(r.variants[0].first_bad.at(0), 1) << version;
      EXPECT_TRUE(std::isfinite(run.steps[1].loss));
      EXPECT_TRUE(std::isnan(run.steps[2].loss));
    } else {
      EXPECT_FALSE(r.variants[0].first_bad.at(0).has_value()) << version;
      EXPECT_TRUE(std::isfinite(run.steps[2].loss));
    }
  }
}

TEST(RecordedReplay, TaintOfEveryRankRecordedIsCleanInIssueOrder) {
  const Scenario sc = recorded_tiny("0.13.4");
  const Schedule rec = recording("tiny-0.13.4-all-ranks");
  const ReplayResult r = replay(replay_inputs_of(sc), rec, serialized_timeline(rec), Mode::kTaint);
  ASSERT_EQ(r.steps.size(), 3u);
  for (const StepRecord& s : r.steps) {
    EXPECT_EQ(s.bad_elements, 0u);
    EXPECT_EQ(s.loss_health, Health::kGood);
  }
}

}  // namespace
}  // namespace hpz::replay
