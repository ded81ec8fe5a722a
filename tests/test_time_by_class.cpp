// The timing engine on one node per symmetry class (sim/time/by_class.hpp, issue 33): where the
// world is symmetric and jitter is 0, simulating node 0 for every node gives the full
// simulation's step times (within 0.1%), races and link bytes; anything else falls back to the
// full simulation and says why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "sim/builder.hpp"
#include "sim/time/by_class.hpp"
#include "sim/time/simulate.hpp"
#include "tests/paths.hpp"

namespace hpz::time {
namespace {

Scenario llama70b(int nodes, std::vector<Override> sets = {}) {
  sets.push_back({"cluster.nodes", std::to_string(nodes)});
  sets.push_back({"model.layers", "2"});
  return load_scenario(test::scenario_path("llama2-70b"), sets);
}

SimResult sim(const Scenario& sc, const Schedule& schedule, ByClass how) {
  SimOptions opts;
  opts.by_class = how;
  return simulate(timing_inputs_of(sc), schedule, opts);
}

double relative(double a, double b) {
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-300);
}

/** By class against every rank: the step metrics, races, link bytes and every rank's op times;
 *  returns the relative step-time difference. `kinds`: the kinds of node the fold should find. */
double expect_alike(const Scenario& sc, int kinds = 1) {
  const Schedule schedule = build_schedule(sc);
  const SimResult by_class = sim(sc, schedule, ByClass::kAuto);
  const SimResult full = sim(sc, schedule, ByClass::kPerRank);
  EXPECT_TRUE(by_class.by_class()) << by_class.by_class_how;
  EXPECT_FALSE(full.by_class());
  const double step = relative(by_class.mean.step_time_s, full.mean.step_time_s);
  EXPECT_LT(step, 1e-3) << by_class.mean.step_time_s << " against " << full.mean.step_time_s;
  EXPECT_LT(relative(by_class.mean.exposed_comm_s, full.mean.exposed_comm_s), 1e-3);
  EXPECT_NEAR(by_class.mean.host_sync_s, full.mean.host_sync_s, 1e-3 * full.mean.step_time_s);
  EXPECT_FALSE(by_class.mean.hung);
  EXPECT_EQ(by_class.mean.races_manifested, full.mean.races_manifested);
  EXPECT_EQ(by_class.race_instances.size(), full.race_instances.size());
  EXPECT_GT(full.race_instances.size(), 0u);  // stock: the hpZ race is there to time
  EXPECT_EQ(by_class.races.size(), full.races.size());
  for (std::size_t g = 0; g < std::min(by_class.races.size(), full.races.size()); ++g) {
    const RaceReport& a = by_class.races[g];
    const RaceReport& b = full.races[g];
    EXPECT_EQ(a.manifested_per_run, b.manifested_per_run) << "race group " << g;
    EXPECT_EQ(a.has_example, b.has_example) << "race group " << g;
    EXPECT_EQ(a.has_margin, b.has_margin) << "race group " << g;
    EXPECT_NEAR(a.min_margin_s, b.min_margin_s, 1e-3 * full.mean.step_time_s);
  }
  EXPECT_EQ(by_class.links.size(), full.links.size());
  for (std::size_t l = 0; l < std::min(by_class.links.size(), full.links.size()); ++l) {
    EXPECT_NEAR(by_class.links[l].bytes, full.links[l].bytes, 1e-9 * full.links[l].bytes + 1)
        << full.links[l].spec.name;
  }
  // Every rank is in the timeline, with the times of the simulated rank that stands for it.
  EXPECT_EQ(by_class.timeline.ranks.size(), static_cast<std::size_t>(sc.cluster.world_size()));
  EXPECT_EQ(by_class.timeline.ranks.size(), full.timeline.ranks.size());
  std::size_t ops = 0, unlike = 0;
  const double tolerance = 1e-9 * full.mean.step_time_s;
  for (std::size_t r = 0; r < std::min(by_class.timeline.ranks.size(), full.timeline.ranks.size());
       ++r) {
    const auto& a = by_class.timeline.ranks[r];
    const auto& b = full.timeline.ranks[r];
    if (a.size() != b.size()) {
      ADD_FAILURE() << "rank " << r << ": " << a.size() << " ops against " << b.size();
      continue;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      const bool alike = std::fabs(a[i].issue_s - b[i].issue_s) <= tolerance &&
                         std::fabs(a[i].start_s - b[i].start_s) <= tolerance &&
                         std::fabs(a[i].end_s - b[i].end_s) <= tolerance;
      if (!alike && unlike++ == 0) {
        ADD_FAILURE() << "rank " << r << " op " << i << ": " << a[i].start_s << ".." << a[i].end_s
                      << " by class, " << b[i].start_s << ".." << b[i].end_s << " every rank";
      }
      ++ops;
    }
  }
  EXPECT_EQ(unlike, 0u) << "of " << ops << " op times";
  // Without the unfolded timeline (what `hpzlab sim` keeps unless a trace, op times or
  // sensitivity need every rank's): node 0's ranks, the same metrics and races.
  SimOptions lean;
  lean.full_timeline = false;
  const SimResult folded = simulate(timing_inputs_of(sc), schedule, lean);
  EXPECT_EQ(folded.timeline.ranks.size(),
            static_cast<std::size_t>(kinds * sc.cluster.gpus_per_node));
  EXPECT_NE(
      by_class.by_class_how.find(kinds == 1 ? "node 0's" : fmt::format("{} kinds of node", kinds)),
      std::string::npos)
      << by_class.by_class_how;
  EXPECT_EQ(folded.mean.step_time_s, by_class.mean.step_time_s);
  EXPECT_LT(relative(folded.mean.exposed_comm_s, by_class.mean.exposed_comm_s), 1e-9);
  EXPECT_EQ(folded.mean.races_manifested, by_class.mean.races_manifested);
  for (std::size_t g = 0; g < std::min(folded.races.size(), by_class.races.size()); ++g) {
    EXPECT_EQ(folded.races[g].min_margin_s, by_class.races[g].min_margin_s);
    EXPECT_EQ(folded.races[g].closest.rank, by_class.races[g].closest.rank);
  }
  // Node 0 simulated alone: fewer transfers than the whole world's.
  EXPECT_LT(by_class.stats.transfers, full.stats.transfers);
  std::printf(
      "[by class] %d GPUs: step %.9f s by class, %.9f s every rank (%.2e relative); %llu "
      "of %llu race instances manifested\n",
      sc.cluster.world_size(), by_class.mean.step_time_s, full.mean.step_time_s, step,
      static_cast<unsigned long long>(by_class.mean.races_manifested),
      static_cast<unsigned long long>(full.race_instances.size()));
  return step;
}

TEST(TimeByClass, StepTimesAndRacesMatchEveryRankAt16GpusFine) {
  expect_alike(llama70b(2, {{"sim.jitter", "0"}, {"sim.collective_model", "fine"}}));
}

TEST(TimeByClass, StepTimesAndRacesMatchEveryRankAt16GpusCoarse) {
  expect_alike(llama70b(2, {{"sim.jitter", "0"}, {"sim.collective_model", "coarse"}}));
}

// The fine model's full simulation takes 15 s at 128 GPUs and 330 s at 256 in a Release build
// (its world rings have a transfer per rank and step): the larger worlds are compared in the
// coarse model, whose transfers between nodes are SimGrid flows all the same.
TEST(TimeByClass, StepTimesAndRacesMatchEveryRankAt128Gpus) {
  expect_alike(llama70b(16, {{"sim.jitter", "0"}, {"sim.collective_model", "coarse"}}));
}

TEST(TimeByClass, StepTimesAndRacesMatchEveryRankAt256Gpus) {
  expect_alike(llama70b(32, {{"sim.jitter", "0"}, {"sim.collective_model", "coarse"}}));
}

// tiny.toml past 64 ranks: the norm weights' 64 elements fill the first 64 ranks' slices, and
// the ranks past them copy no secondary and spin no 200 us kernel before it (the scenario's
// repro spin). Two kinds of node: node 0 and the first node past 64 ranks are simulated, each for
// its kind, and every rank's op times are the full simulation's.
Scenario tiny(int nodes, const std::string& model, int gpus_per_node = 2) {
  return load_scenario(test::scenario_path("tiny"),
                       {{"cluster.nodes", std::to_string(nodes)},
                        {"cluster.gpus_per_node", std::to_string(gpus_per_node)},
                        {"sim.jitter", "0"},
                        {"sim.collective_model", model}});
}

TEST(TimeByClass, KindsOfNodeWhereSlicesLieInThePaddingFoldInTheCoarseModel) {
  // 40 nodes: the last node's 2 ranks also hold the padded ends of the larger weights (3 kinds).
  for (const auto& [nodes, kinds] : {std::pair{40, 3}, std::pair{64, 2}}) {
    SCOPED_TRACE(fmt::format("{} nodes", nodes));
    expect_alike(tiny(nodes, "coarse"), kinds);
  }
}

// With 4 GPUs a node, a world collective's members on GPUs 1 and 2 send and receive inside their
// node and, in the coarse model, end before those whose hops cross a NIC: each other kind's member
// of it must end with the node-0 member of its own local index, not any other.
TEST(TimeByClass, KindsOfNodeEndEachSharedCollectiveWithTheirOwnNode0Member) {
  expect_alike(tiny(20, "coarse", 4), 3);
}

// In the fine model a kind's hops inside its node share NVLink with the world's hops at times
// of its own: no one node stands for the others. Every rank is simulated, and it says why.
TEST(TimeByClass, KindsOfNodeAreSimulatedEveryRankInTheFineModelAndSaySo) {
  const Scenario sc = tiny(64, "fine");
  const SimResult r = sim(sc, build_schedule(sc), ByClass::kAuto);
  EXPECT_FALSE(r.by_class());
  EXPECT_NE(r.by_class_how.find("nodes of 2 kinds (rank 64 issues other ops than rank 0)"),
            std::string::npos)
      << r.by_class_how;
  EXPECT_NE(r.by_class_how.find("sim.collective_model=coarse"), std::string::npos);
}

// The race bites when the step is compute-bound (docs/timing.md): by class it bites the same.
TEST(TimeByClass, ARaceThatBitesBitesByClassToo) {
  const Scenario sc = llama70b(
      2, {{"sim.jitter", "0"}, {"cluster.nic_gbps", "1600"}, {"training.micro_batch", "4"}});
  const Schedule schedule = build_schedule(sc);
  const SimResult by_class = sim(sc, schedule, ByClass::kAuto);
  const SimResult full = sim(sc, schedule, ByClass::kPerRank);
  ASSERT_TRUE(by_class.by_class()) << by_class.by_class_how;
  EXPECT_GT(full.mean.races_manifested, 0u);
  EXPECT_EQ(by_class.mean.races_manifested, full.mean.races_manifested);
  EXPECT_LT(relative(by_class.mean.step_time_s, full.mean.step_time_s), 1e-3);
}

TEST(TimeByClass, AnAsymmetricScheduleIsSimulatedRankByRankAndSaysWhy) {
  const Scenario sc = llama70b(2, {{"sim.jitter", "0"}, {"bugs.secondary_mismatch_rank", "1"}});
  const Schedule schedule = build_schedule(sc);
  const SimResult r = sim(sc, schedule, ByClass::kAuto);
  EXPECT_FALSE(r.by_class());
  EXPECT_NE(r.by_class_how.find("rank 9 issues other collectives than rank 1"), std::string::npos)
      << r.by_class_how;
}

// A rank that shares node 0's op list must still run it on its own node's groups: rank 2 (node
// 1 of tiny's 2 x 2) given rank 0's ops on rank 0's hpZ group does not fold, though every op
// and buffer is shared (the fold then compares only the copy's groups).
TEST(TimeByClass, ASharedOpListOnAnotherNodesGroupsDoesNotFold) {
  const Scenario sc = tiny(2, "coarse");
  Schedule schedule = build_schedule(sc);
  const TimingInputs in = timing_inputs_of(sc);
  NodeQuotient q;
  std::string why;
  ASSERT_TRUE(node_quotient(in, schedule, false, q, why)) << why;
  RankSchedule& r2 = schedule.ranks[2];
  const RankSchedule& r0 = schedule.ranks[0];
  r2.ops = OpList::sharing(r0.ops, {});
  r2.buffers = r0.buffers;
  r2.accesses = r0.accesses;
  ASSERT_TRUE(r2.ops.shares_with(r0.ops));
  EXPECT_FALSE(node_quotient(in, schedule, false, q, why));
  EXPECT_EQ(why, "rank 2 issues other collectives than rank 0");
}

TEST(TimeByClass, JitterIsDrawnPerRankSoTheDefaultIsEveryRank) {
  const Scenario sc = llama70b(2);  // the shipped sim.jitter = 0.02
  ASSERT_GT(sc.sim.jitter, 0);
  const Schedule schedule = build_schedule(sc);
  const SimResult r = sim(sc, schedule, ByClass::kAuto);
  EXPECT_FALSE(r.by_class());
  EXPECT_NE(r.by_class_how.find("jitter"), std::string::npos) << r.by_class_how;
  // Forced, every node draws node 0's noise: a different model, close but not the same.
  const SimResult forced = sim(sc, schedule, ByClass::kForce);
  ASSERT_TRUE(forced.by_class()) << forced.by_class_how;
  EXPECT_NE(forced.by_class_how.find("not exact"), std::string::npos);
  const double diff = relative(forced.mean.step_time_s, r.mean.step_time_s);
  EXPECT_LT(diff, 0.05);
  std::printf(
      "[by class] jitter 0.02, 16 GPUs: step %.9f s by class (forced), %.9f s every rank "
      "(%.2e relative)\n",
      forced.mean.step_time_s, r.mean.step_time_s, diff);
}

TEST(TimeByClass, OneNodeHasNothingToFold) {
  const Scenario sc = llama70b(1, {{"sim.jitter", "0"}});
  const SimResult r = sim(sc, build_schedule(sc), ByClass::kAuto);
  EXPECT_FALSE(r.by_class());
  EXPECT_TRUE(r.by_class_how.empty()) << r.by_class_how;
}

}  // namespace
}  // namespace hpz::time
