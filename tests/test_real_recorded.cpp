// The real executor's model math on recordings of real DeepSpeed (traces/deepspeed/, `hpzlab
// record`): the plan lays the Llama's modules on autograd's kernels as the numeric replay does
// (the weights the first backward kernel reads kept for the kernel that writes their gradient,
// the loss at the micro-step's first backward kernel, Adam where the primaries are written back
// from DeepSpeed's flat fp32 partition), so a serialized run on the host backend trains as the
// replay and as the builder's schedule of the same model.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "real/plan.hpp"
#include "real/run.hpp"
#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"
#include "tests/recorded.hpp"

namespace hpz::real {
namespace {

using test::recorded_tiny;
using test::recording;

RealResult run_model(const Scenario& sc, const Schedule& s, const std::string& backend) {
  RealOptions o;
  o.runs = 1;
  o.backend = backend;
  o.compute = "real";
  o.timeout_s = 60;
  return run_real(sc, s, o);
}

bool all_finite(const std::vector<double>& v) {
  for (double x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Per rank and micro-step: one loss, one forward of each parameter (and one recompute of the
// checkpointed layers'), one stash of the weights each backward reader sees, one backward per
// parameter; the optimizer is an Adam per shard on the write-back copy, moments fresh once.
TEST(RealRecorded, AutogradsKernelsBecomeTheLlamasModules) {
  const Scenario sc = recorded_tiny("0.13.4");
  const Schedule rec = recording("tiny-0.13.4-all-ranks");
  ASSERT_EQ(model_math_unfit(sc, rec), "");
  const Plan plan = make_plan(sc, rec, true);
  EXPECT_EQ(plan.element_bytes, 4) << "bf16 recorded, fp32 computed (as the numeric replay)";
  const std::size_t units = rec.units.size();
  const int steps = sc.run.steps;
  for (std::size_t r = 0; r < rec.ranks.size(); ++r) {
    std::map<ModelOp::Kind, std::size_t> kinds;
    std::size_t fresh = 0, write_backs = 0;
    for (const PlanOp& po : plan.ranks[r].ops) {
      for (const ModelOp& m : po.models) {
        ++kinds[m.kind];
        if (m.kind == ModelOp::Kind::kAdam && m.fresh_state) ++fresh;
      }
      if (po.models.size() > 1) ++write_backs;
    }
    const auto per_step = static_cast<std::size_t>(steps);
    EXPECT_EQ(kinds[ModelOp::Kind::kLlamaLoss], per_step) << "rank " << r;
    EXPECT_EQ(kinds[ModelOp::Kind::kLlamaBackward], units * per_step) << "rank " << r;
    EXPECT_GE(kinds[ModelOp::Kind::kLlamaForward], units * per_step) << "rank " << r;
    EXPECT_EQ(kinds[ModelOp::Kind::kAdam], units * per_step) << "rank " << r;
    EXPECT_EQ(fresh, units) << "rank " << r;
    EXPECT_EQ(write_backs, per_step) << "rank " << r << ": one write-back copy a step";
  }
}

// Serialized on the host backend, each recording trains as the numeric replay computes it, bit
// for bit, and as the builder's schedule of the same model: the same losses and final weights.
TEST(RealRecorded, EveryRankRecordedTrainsAsTheReplayAndTheBuilder) {
  for (const char* version : {"0.13.4", "0.13.5"}) {
    const Scenario sc = recorded_tiny(version);
    const RealResult rec =
        run_model(sc, recording(std::string("tiny-") + version + "-all-ranks"), "host");
    ASSERT_FALSE(rec.reference_hung) << version << ": " << rec.reference_hang;
    ASSERT_EQ(rec.reference_loss.size(), 3U) << version;
    EXPECT_TRUE(all_finite(rec.reference_loss)) << version;
    EXPECT_EQ(rec.reference_loss, rec.replay_loss) << version;
    EXPECT_LT(rec.reference_loss[2], rec.reference_loss[0]) << version << ": it learns";
    const RealResult built = run_model(sc, build_schedule(sc), "host");
    EXPECT_EQ(rec.reference_loss, built.reference_loss) << version;
    EXPECT_EQ(rec.reference_weights_hash, built.reference_weights_hash) << version;
  }
}

// A recording of one rank (the others copies at its offsets) is refused, as the replay refuses it.
TEST(RealRecorded, RecordingOfOneRankIsRefused) {
  const Scenario sc = recorded_tiny("0.13.4");
  const Schedule one = recording("tiny-0.13.4");
  EXPECT_NE(model_math_unfit(sc, one).find("copies"), std::string::npos)
      << model_math_unfit(sc, one);
  EXPECT_THROW(make_plan(sc, one, true), InputError);
}

}  // namespace
}  // namespace hpz::real
