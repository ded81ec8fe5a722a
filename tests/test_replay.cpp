// The data replay: numeric and taint replays of the tiny scenarios under hand-made timelines and
// the timing engine's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "sim/builder.hpp"
#include "sim/driver/repro.hpp"
#include "sim/error.hpp"
#include "sim/replay/replay.hpp"
#include "tests/paths.hpp"

namespace hpz::replay {
namespace {

Scenario tiny(int steps = 3) {
  Scenario sc = load_scenario(test::scenario_path("tiny"));
  sc.run.steps = steps;
  return sc;
}

/** Every op of every rank back to back in host order on one global clock: no overlap at all. */
Timeline serial(const Schedule& s) {
  Timeline t;
  double now = 0;
  std::size_t longest = 0;
  for (const auto& r : s.ranks) longest = std::max(longest, r.ops.size());
  t.ranks.resize(s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) t.ranks[r].resize(s.ranks[r].ops.size());
  // Collectives need every member started before anyone's end; interleave ranks op by op
  // (the builder emits the same op sequence on every rank of the tiny scenario).
  for (std::size_t i = 0; i < longest; ++i) {
    for (std::size_t r = 0; r < s.ranks.size(); ++r) {
      if (i < s.ranks[r].ops.size()) t.ranks[r][i] = {now, now, now + 1};
    }
    now += 2;
  }
  return t;
}

/** Index of rank r's op satisfying pred, the nth match. */
template <class P>
std::size_t find_op(const Schedule& s, Rank r, P pred, int nth = 0) {
  for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
    if (pred(s.ranks[r].ops[i]) && nth-- == 0) return i;
  }
  return s.ranks[r].ops.size();
}

TEST(NumericReplay, SerialRunTrainsAndMatchesNoHpz) {
  Scenario sc = tiny();
  const Schedule s = build_schedule(sc);
  const ReplayResult a = replay(replay_inputs_of(sc), s, serial(s), Mode::kNumeric);
  Scenario off = sc;
  off.zero.zero_hpz_partition_size = 1;
  const Schedule so = build_schedule(off);
  const ReplayResult b = replay(replay_inputs_of(off), so, serial(so), Mode::kNumeric);
  ASSERT_EQ(a.steps.size(), 3u);
  EXPECT_NEAR(a.steps[0].loss, std::log(256.0), 1.0);
  EXPECT_LT(a.steps[2].loss, a.steps[0].loss);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(a.steps[k].loss, b.steps[k].loss) << k;
    EXPECT_EQ(a.steps[k].weights_hash, b.steps[k].weights_hash) << k;
  }
  EXPECT_EQ(a.mixed_reads, 0u);
}

// serialized_timeline: the race-free order `hpzlab real` replays its reference in. Every op
// runs, each after the previous one of its rank, and a collective starts on all its members at
// once; replayed along it, stock trains exactly as along the hand-made global serial order.
TEST(SerializedTimeline, RunsEveryOpInIssueOrderAndCollectivesTogether) {
  Scenario sc = tiny();
  const Schedule s = build_schedule(sc);
  const Timeline t = serialized_timeline(s);
  std::map<std::pair<GroupId, int>, double> start_of;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    std::map<GroupId, int> k;
    double last_end = -1;
    for (std::size_t i = 0; i < s.ranks[r].ops.size(); ++i) {
      const OpTime& ot = t.ranks[r][i];
      ASSERT_TRUE(std::isfinite(ot.start_s)) << "rank " << r << " op " << i;
      EXPECT_GT(ot.start_s, last_end);
      EXPECT_LT(ot.start_s, ot.end_s);
      last_end = ot.end_s;
      const Op& o = s.ranks[r].ops[i];
      if (!is_collective(o.kind)) continue;
      const auto [it, fresh] = start_of.try_emplace({o.group, k[o.group]++}, ot.start_s);
      if (!fresh) {
        EXPECT_EQ(it->second, ot.start_s) << "rank " << r << " op " << i;
      }
    }
  }
  const ReplayResult a = replay(replay_inputs_of(sc), s, t, Mode::kNumeric);
  const ReplayResult b = replay(replay_inputs_of(sc), s, serial(s), Mode::kNumeric);
  EXPECT_EQ(a.mixed_reads, 0u);
  for (std::size_t k = 0; k < a.steps.size(); ++k) {
    EXPECT_TRUE(std::isfinite(a.steps[k].loss)) << k;
    EXPECT_EQ(a.steps[k].loss, b.steps[k].loss) << k;
    EXPECT_EQ(a.steps[k].weights_hash, b.steps[k].weights_hash) << k;
  }
}

// A collective some member never issues: the ops behind it never run (NaN times), as on a GPU.
TEST(SerializedTimeline, StopsAtACollectiveSomeMemberNeverReaches) {
  const Scenario sc = load_scenario(test::scenario_path("mismatched-collectives"));
  const Schedule s = build_schedule(sc);
  const Timeline t = serialized_timeline(s);
  std::size_t never = 0;
  for (const auto& rank : t.ranks) {
    for (const OpTime& ot : rank) never += std::isnan(ot.start_s) ? 1 : 0;
  }
  EXPECT_GT(never, 0u);
}

// Step 1's first secondary copy made to end after the hpZ gather that reads it started:
// the gather reads NaN (fill = nan) and the loss goes NaN.
TEST(NumericReplay, FitCheckMultipliesTokensIn64Bits) {
  // 2^31 - 1 squared wraps an int to 1, which passed the check and ran (and crashed) the
  // numeric replay on a model it cannot hold (issue 20).
  Scenario sc = tiny(1);
  EXPECT_TRUE(numeric_fits(replay_inputs_of(sc)));
  sc.training.seq_len = std::numeric_limits<int>::max();
  sc.training.micro_batch = std::numeric_limits<int>::max();
  EXPECT_FALSE(numeric_fits(replay_inputs_of(sc)));
}

TEST(Repro, AJobThatHangsIsReportedNotReplayed) {
  // The timing engine marks ops that never ran with -1: replaying them (as if they ran at -1 s)
  // segfaulted in the numeric model with the gathers on the compute stream (issue 20).
  Scenario sc = tiny(1);
  const Schedule s = build_schedule(sc);
  Timeline t = serial(s);
  const std::size_t gather =
      find_op(s, 0, [](const Op& o) { return o.kind == OpKind::kAllGather; });
  for (std::size_t i = gather; i < s.ranks[0].ops.size(); ++i) t.ranks[0][i] = {-1, -1, -1};
  EXPECT_EQ(hang_of(s, serial(s)), "");
  EXPECT_NE(hang_of(s, t).find(fmt::format("the first: rank 0 op {} (all_gather", gather)),
            std::string::npos)
      << hang_of(s, t);
  ReproOptions o;
  o.timeline = [&](const Scenario& run, const Schedule& built, std::uint64_t) {
    const bool stock = run.run.variant == Variant::kStock && run.zero.zero_hpz_partition_size > 1;
    return stock ? t : serial(built);
  };
  const ReproResult r = run_repro(sc, o);
  ASSERT_EQ(r.variants.size(), 4u);
  EXPECT_FALSE(r.variants[0].runs[0].hang.empty());
  EXPECT_TRUE(r.variants[0].runs[0].steps.empty());
  EXPECT_EQ(r.variants[0].first_bad[0], 0);
  EXPECT_TRUE(r.variants[3].runs[0].hang.empty());  // no-hpz: its own (serial) timeline
  EXPECT_NE(repro_table(r).find("stock: the job hangs in 1 of 1 run(s), not replayed: HANG"),
            std::string::npos);
}

TEST(NumericReplay, GatherBeforeCopyEndsReadsNan) {
  Scenario sc = tiny();
  const Schedule s = build_schedule(sc);
  Timeline t = serial(s);
  for (Rank r = 0; r < static_cast<Rank>(s.ranks.size()); ++r) {
    // Step 1's secondary copy of a q_proj (a weight its backward reads; the embedding's does
    // not), and the first gather after it that reads that secondary.
    const std::size_t c = find_op(s, r, [&](const Op& o) {
      return o.purpose == Purpose::kSecondaryPartitionCopy && o.step == 1 &&
             s.units[o.unit].name.find("q_proj") != std::string::npos;
    });
    ASSERT_LT(c, s.ranks[r].ops.size());
    const BufferId secondary = s.accesses_of(r, s.ranks[r].ops[c]).back().buffer;
    ASSERT_EQ(s.ranks[r].buffers[secondary].role, BufferRole::kSecondary);
    std::size_t g = c + 1;
    for (; g < s.ranks[r].ops.size(); ++g) {
      const Op o = s.ranks[r].ops[g];
      const auto acc = s.accesses_of(r, o);
      if (o.kind == OpKind::kAllGather && std::any_of(acc.begin(), acc.end(), [&](const Access& a) {
            return a.buffer == secondary && a.mode == AccessMode::kRead;
          })) {
        break;
      }
    }
    ASSERT_LT(g, s.ranks[r].ops.size());
    t.ranks[r][c].start_s = t.ranks[r][g].start_s + 0.5;  // the gather reads first
    t.ranks[r][c].end_s = t.ranks[r][g].end_s + 1;
  }
  const ReplayResult res = replay(replay_inputs_of(sc), s, t, Mode::kNumeric);
  EXPECT_TRUE(std::isfinite(res.steps[1].loss));  // the NaN lands in step 1's update
  EXPECT_TRUE(std::isnan(res.steps[2].loss));
}

TEST(TaintReplay, StaleAfterStepMarksWeightsBad) {
  Scenario sc = load_scenario(test::scenario_path("stale-after-step"));
  const Schedule s = build_schedule(sc);
  const ReplayResult res = replay(replay_inputs_of(sc), s, serial(s), Mode::kTaint);
  ASSERT_EQ(res.steps.size(), 3u);
  EXPECT_EQ(res.steps[0].bad_elements, 0u);
  EXPECT_GT(res.steps[1].bad_elements, 0u);
  EXPECT_EQ(res.steps[1].bad_ranks.size(), 16u);
}

// The issue's must-hold, on the SimGrid timeline: stock goes NaN in most seeded runs of
// tiny.toml (whose spin kernel keeps the compute stream busy, as a reproduction on a GPU does),
// both fixes train bit for bit like hpZ off, and a run repeats itself bit for bit.
TEST(Repro, StockNanFixesBitIdenticalDeterministic) {
  Scenario sc = tiny(4);
  ASSERT_GT(sc.run.spin_before_copy_us, 0);
  ReproOptions o;
  o.runs = 3;
  const ReproResult a = run_repro(sc, o);
  ASSERT_EQ(a.variants.size(), 4u);
  EXPECT_EQ(a.variants[0].name, "stock");
  EXPECT_GT(a.variants[0].share_nan(), 0.5);
  const auto& base = a.variants[3].runs;
  for (int v = 1; v <= 3; ++v) {
    EXPECT_EQ(a.variants[v].share_bad(), 0.0) << a.variants[v].name;
    for (std::size_t k = 0; k < base.size(); ++k) {
      ASSERT_EQ(a.variants[v].runs[k].steps.size(), 4u);
      for (std::size_t st = 0; st < base[k].steps.size(); ++st) {
        EXPECT_EQ(a.variants[v].runs[k].steps[st].loss, base[k].steps[st].loss);
        EXPECT_EQ(a.variants[v].runs[k].steps[st].weights_hash, base[k].steps[st].weights_hash);
      }
    }
  }
  ReproOptions once = o;
  once.runs = 1;
  const ReproResult b = run_repro(sc, once);
  for (std::size_t v = 0; v < 4; ++v) {
    for (std::size_t st = 0; st < 4; ++st) {
      const StepRecord& x = a.variants[v].runs[0].steps[st];
      const StepRecord& y = b.variants[v].runs[0].steps[st];
      EXPECT_TRUE((std::isnan(x.loss) && std::isnan(y.loss)) || x.loss == y.loss);
      EXPECT_EQ(x.weights_hash, y.weights_hash);
    }
  }
}

// Without the spin kernel the tiny model's compute stream never backs up: the same replay
// trains stock exactly like hpZ off. What makes stock go NaN above is the spin, not the replay.
TEST(Repro, WithoutTheSpinTheTinyRaceDoesNotBite) {
  Scenario sc = tiny(3);
  sc.run.spin_before_copy_us = 0;
  const ReproResult r = run_repro(sc, ReproOptions{});
  ASSERT_EQ(r.variants[0].name, "stock");
  EXPECT_EQ(r.variants[0].share_bad(), 0.0);
  EXPECT_EQ(r.variants[0].mixed_reads, 0u);
}

TEST(Repro, ProgressCountsEveryReplayUpToTheTotal) {
  ReproOptions o;
  o.runs = 2;
  o.timeline = [](const Scenario&, const Schedule& s, std::uint64_t) { return serial(s); };
  std::vector<std::pair<int, int>> calls;
  o.progress = [&](int done, int total) { calls.emplace_back(done, total); };
  run_repro(tiny(1), o);
  ASSERT_EQ(calls.size(), 8u);  // 4 variants x 2 runs
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, static_cast<int>(i) + 1);
    EXPECT_EQ(calls[i].second, 8);
  }
}

// `hpzlab repro --schedule FILE`: one given schedule replayed in the taint domain, on the same
// timelines as the stock variant of run_repro, gives the stock variant's taint results.
TEST(Repro, AGivenScheduleReplaysLikeItsVariant) {
  Scenario sc = tiny(3);
  sc.run.variant = Variant::kStock;
  ReproOptions o;
  o.mode = Mode::kTaint;
  o.timeline = [](const Scenario&, const Schedule& s, std::uint64_t) { return serial(s); };
  const ReproResult all = run_repro(sc, o);
  const ReproResult one = replay_schedule(sc, build_schedule(sc), "file.json", o);
  EXPECT_EQ(one.scenario, "file.json");
  EXPECT_EQ(one.mode, Mode::kTaint);
  ASSERT_EQ(one.variants.size(), 1u);
  EXPECT_EQ(one.variants[0].name, "stock");
  const ReplayResult& a = all.variants[0].runs[0];
  const ReplayResult& b = one.variants[0].runs[0];
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t k = 0; k < a.steps.size(); ++k) {
    EXPECT_EQ(a.steps[k].loss_health, b.steps[k].loss_health);
    EXPECT_EQ(a.steps[k].bad_elements, b.steps[k].bad_elements);
  }
  EXPECT_EQ(one.variants[0].first_bad, all.variants[0].first_bad);
}

TEST(Repro, AScheduleTheReplayCannotFollowIsRefusedByName) {
  Scenario sc = tiny(1);
  Schedule s = build_schedule(sc);
  EXPECT_EQ(replay_unsupported(s), "");
  // DeepSpeed's schedules are followed by byte ranges, but an optimizer step that writes must
  // name the parameter whose weights it updates.
  const std::size_t adam = find_op(s, 1, [&](const Op& op) {
    const auto acc = s.accesses_of(1, op);
    return op.kind == OpKind::kKernel && op.purpose == Purpose::kOptimizerStep &&
           std::any_of(acc.begin(), acc.end(),
                       [](const Access& x) { return x.mode == AccessMode::kWrite; });
  });
  ASSERT_LT(adam, s.ranks[1].ops.size());
  const UnitId unit = s.ranks[1].ops[adam].unit;
  s.ranks[1].ops.mut()[adam].unit = kNoUnit;
  const std::string why = replay_unsupported(s);
  EXPECT_EQ(why.rfind(fmt::format("rank 1 op {} (kernel optimizer_step) ", adam), 0), 0u) << why;
  EXPECT_NE(why.find("needs a parameter unit"), std::string::npos) << why;
  s.ranks[1].ops.mut()[adam].unit = unit;
  // A reduction that receives must send; one that touches nothing is no trouble.
  const std::size_t reduce =
      find_op(s, 0, [](const Op& op) { return op.kind == OpKind::kAllReduce; });
  ASSERT_LT(reduce, s.ranks[0].ops.size());
  Op& op = s.ranks[0].ops.mut()[reduce];
  const auto accesses = s.accesses_of(0, op);
  const auto write = std::find_if(accesses.begin(), accesses.end(),
                                  [](const Access& a) { return a.mode == AccessMode::kWrite; });
  ASSERT_NE(write, accesses.end());
  op.access_begin += static_cast<std::uint32_t>(write - accesses.begin());
  op.access_count = 1;
  EXPECT_NE(replay_unsupported(s).find("receives but sends nothing"), std::string::npos);
  op.access_count = 0;
  EXPECT_EQ(replay_unsupported(s), "");
  s.ranks[1].ops.mut()[adam].unit = kNoUnit;
  try {
    replay_schedule(sc, s, "file.json", ReproOptions{});
    FAIL() << "replayed an optimizer step without a unit";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("file.json: the data replay cannot follow", 0), 0u)
        << e.what();
  }
}

TEST(Repro, StaleFillGivesWrongFiniteLoss) {
  Scenario sc = tiny(4);
  sc.run.fill = Fill::kStale;
  const ReproResult r = run_repro(sc, ReproOptions{});
  const VariantRepro& stock = r.variants[0];
  ASSERT_TRUE(stock.first_bad[0].has_value());
  EXPECT_EQ(stock.share_nan(), 0.0);
  for (const auto& s : stock.runs[0].steps) EXPECT_TRUE(std::isfinite(s.loss));
}

// The stale-secondary bug classes train worse than the baseline once the primary has moved on
// (an optimizer step, DeepSpeed issue 4851; a checkpoint load, issue 7606). Their scenarios use
// fix B, so the secondary-copy race is ordered and only the bug class is seen.
TEST(Repro, StaleSecondaryScenariosLoseMoreThanTheBaseline) {
  for (const char* name : {"stale-after-step", "stale-after-load"}) {
    // Both are DeepSpeed's own schedules: 0.13.1's missing invalidation, 0.13.4's load
    // (run.load = "checkpoint"), replayed with the small Llama's real math.
    const Scenario sc = load_scenario(test::scenario_path(name));
    const ReproResult r = run_repro(sc, ReproOptions{});
    const auto& stale = r.variants[2].runs[0].steps;  // event-wait, the scenario's own variant
    const auto& base = r.variants[3].runs[0].steps;   // no-hpz
    ASSERT_EQ(r.variants[2].name, "event-wait");
    ASSERT_EQ(r.variants[3].name, "no-hpz");
    ASSERT_EQ(stale.size(), base.size());
    ASSERT_GE(stale.size(), 2u);
    for (std::size_t st = 1; st < stale.size(); ++st) {
      EXPECT_TRUE(std::isfinite(stale[st].loss)) << name << " step " << st;
      EXPECT_GT(stale[st].loss, base[st].loss) << name << " step " << st;
    }
  }
}

// DeepSpeed 0.13.1 as built (scenarios/stale-after-step.toml): the gathers of step 1 hand out
// the weights of before step 0's update, so every variant's loss is wrong from step 1 on and
// hpZ off's is not.
TEST(Repro, DeepSpeed0131sStaleSecondariesMakeTheLossWrongFromStepOne) {
  ReproOptions taint;
  taint.mode = Mode::kTaint;
  const Scenario sc = load_scenario(test::scenario_path("stale-after-step"));
  const ReproResult r = run_repro(sc, taint);
  ASSERT_EQ(r.variants.size(), 4u);
  for (const auto& v : r.variants) {
    const auto& steps = v.runs.at(0).steps;
    ASSERT_EQ(steps.size(), 3u) << v.name;
    EXPECT_EQ(steps[0].loss_health, Health::kGood) << v.name;
    const Health later = v.name == "no-hpz" ? Health::kGood : Health::kWrong;
    EXPECT_EQ(steps[1].loss_health, later) << v.name;
    EXPECT_EQ(steps[2].loss_health, later) << v.name;
  }
  // With numbers (the scenario's Llama computes, the default): the same loss as hpZ off in
  // step 0, a finite but different one after the first step's update.
  const ReproResult n = run_repro(sc, ReproOptions{});
  ASSERT_EQ(n.mode, Mode::kNumeric);
  const auto& off = n.variants.back().runs.at(0).steps;
  for (std::size_t k = 0; k + 1 < n.variants.size(); ++k) {
    const auto& steps = n.variants[k].runs.at(0).steps;
    ASSERT_EQ(steps.size(), 3u);
    EXPECT_EQ(steps[0].loss, off[0].loss) << n.variants[k].name;
    for (std::size_t i = 1; i < 3; ++i) {
      EXPECT_TRUE(std::isfinite(steps[i].loss)) << n.variants[k].name;
      EXPECT_NE(steps[i].loss, off[i].loss) << n.variants[k].name << " step " << i;
    }
  }
}

}  // namespace
}  // namespace hpz::replay
