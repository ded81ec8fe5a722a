// Interleaving exploration: the orders the scheduler makes keep happens-before, and exploring
// agrees with the checker (clean schedules give the reference's weights in every order, racy
// ones a counterexample in the targeted phase).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/replay/explore.hpp"
#include "tests/paths.hpp"

namespace hpz::replay {
namespace {

Scenario tiny(const std::vector<Override>& overrides = {}) {
  return load_scenario(test::scenario_path("tiny"), overrides);
}

std::vector<RacePair> pairs_of(const Schedule& s) {
  std::vector<RacePair> out;
  for (const auto& g : check::check_schedule(s).groups) {
    if (g.example.kind != check::FindingKind::kRace) continue;
    for (const auto& p : g.occurrences) out.push_back({p.rank, p.first, p.second});
  }
  return out;
}

/** Everything the IR orders is ordered in the timeline: FIFO per stream, a wait after its
 *  record, a host sync after what it waits for, an op after its issue. */
void expect_happens_before(const Schedule& s, const Timeline& t) {
  for (const RankSchedule& rs : s.ranks) {
    const auto& times = t.ranks[static_cast<std::size_t>(rs.rank)];
    std::map<StreamId, double> last_end;
    std::map<EventId, double> recorded;
    for (std::size_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      const OpTime& ot = times[i];
      ASSERT_TRUE(std::isfinite(ot.start_s)) << "rank " << rs.rank << " op " << i;
      EXPECT_LE(ot.issue_s, ot.start_s) << "rank " << rs.rank << " op " << i;
      if (op.kind == OpKind::kEventRecord) recorded[op.event] = ot.end_s;
      if (op.kind == OpKind::kStreamWaitEvent || op.kind == OpKind::kHostEventSync) {
        ASSERT_TRUE(recorded.count(op.event)) << "rank " << rs.rank << " op " << i;
        EXPECT_GE(ot.start_s, recorded[op.event]) << "rank " << rs.rank << " op " << i;
      }
      if (op.kind == OpKind::kHostStreamSync) {
        EXPECT_GE(ot.start_s, last_end[op.stream]) << "rank " << rs.rank << " op " << i;
      }
      if (is_host_sync(op.kind) || op.stream == kHostStream) continue;
      EXPECT_GE(ot.start_s, last_end[op.stream]) << "rank " << rs.rank << " op " << i;
      last_end[op.stream] = ot.end_s;
    }
  }
}

TEST(Explore, RandomOrdersKeepHappensBefore) {
  const Schedule s = build_schedule(tiny());
  std::uint64_t ops = 0;
  for (const auto& rs : s.ranks) ops += rs.ops.size();
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const ExploredOrder order = run_order(s, pct_chooser(s, seed, 3, ops));
    EXPECT_TRUE(order.complete);
    expect_happens_before(s, order.timeline);
  }
  // Different seeds give different orders.
  const Timeline a = run_order(s, pct_chooser(s, 1, 3, ops)).timeline;
  const Timeline b = run_order(s, pct_chooser(s, 2, 3, ops)).timeline;
  bool differ = false;
  for (std::size_t r = 0; r < a.ranks.size(); ++r)
    for (std::size_t i = 0; i < a.ranks[r].size(); ++i)
      differ = differ || a.ranks[r][i].start_s != b.ranks[r][i].start_s;
  EXPECT_TRUE(differ);
}

TEST(Explore, AHoldBackRunsTheSecondOpFirst) {
  const Schedule s = build_schedule(tiny());
  const std::vector<RacePair> pairs = pairs_of(s);
  ASSERT_FALSE(pairs.empty());
  const RacePair p = pairs.front();
  const Timeline serial = serialized_timeline(s);
  const ExploredOrder order =
      run_order(s, timing_chooser(serial), HoldBack{p.rank, p.first, p.second});
  ASSERT_TRUE(order.held_back_ran);
  const auto& times = order.timeline.ranks[static_cast<std::size_t>(p.rank)];
  EXPECT_LT(times[p.second].start_s, times[p.first].start_s);
  expect_happens_before(s, order.timeline);
}

TEST(Explore, AnOrderedPairCannotBeReversed) {
  // Two ops of one stream are ordered: holding the first back until the second has run is not
  // possible, and the scheduler says so.
  const Schedule s = build_schedule(tiny({{"run.variant", "event-wait"}}));
  const Timeline serial = serialized_timeline(s);
  const ExploredOrder order = run_order(s, timing_chooser(serial), HoldBack{0, 0, 1});
  EXPECT_FALSE(order.held_back_ran);
  EXPECT_TRUE(order.complete);
}

TEST(Explore, StockRacesShowInTheTargetedPhaseEvenWithoutTheSpin) {
  // Without tiny.toml's spin kernel the timing engine never lets the race bite; exploring the
  // orders happens-before allows finds the corruption anyway.
  const Scenario sc = tiny({{"run.spin_before_copy_us", "0"}});
  const Schedule s = build_schedule(sc);
  ExploreOptions o;
  o.budget = 20;
  o.mode = Mode::kNumeric;
  const Timeline serial = serialized_timeline(s);
  const ExploreResult r = explore(replay_inputs_of(sc), s, pairs_of(s), serial, o);
  ASSERT_TRUE(r.counterexample.has_value());
  EXPECT_EQ(r.counterexample->phase, "targeted");
  EXPECT_GE(r.counterexample->first_bad_step, 1);  // step 0 copies before anything reads
  EXPECT_FALSE(same_result(r.counterexample->result, r.reference));
}

TEST(Explore, BothFixesGiveTheReferenceWeightsInEveryOrder) {
  for (const char* variant : {"host-sync", "event-wait"}) {
    const Scenario sc = tiny({{"run.variant", variant}});
    const Schedule s = build_schedule(sc);
    ASSERT_TRUE(pairs_of(s).empty()) << variant;
    ExploreOptions o;
    o.budget = 12;
    o.mode = Mode::kNumeric;
    const ExploreResult r = explore(replay_inputs_of(sc), s, {}, Timeline{}, o);
    EXPECT_FALSE(r.counterexample.has_value()) << variant;
    EXPECT_EQ(r.random, 12) << variant;
    EXPECT_EQ(r.incomplete, 0) << variant;
  }
}

TEST(Explore, SameResultComparesBitForBit) {
  ReplayResult a;
  a.steps.resize(2);
  a.steps[1].loss = 1.0;
  ReplayResult b = a;
  EXPECT_TRUE(same_result(a, b));
  b.steps[1].weights_hash = 7;
  EXPECT_FALSE(same_result(a, b));
  b = a;
  b.steps[1].loss = std::nextafter(1.0, 2.0);
  EXPECT_FALSE(same_result(a, b));
  b = a;
  b.steps[0].bad_elements = 1;
  EXPECT_FALSE(same_result(a, b));
}

}  // namespace
}  // namespace hpz::replay
