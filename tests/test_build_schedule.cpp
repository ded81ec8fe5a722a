// Properties of every schedule build_schedule gives, whatever the release's rules: the same
// scenario gives the same schedule, the seed changes none of it, and ranks that issue alike share
// one copy of their ops (OpList). (The DeepSpeed builder's own order: test_deepspeed_builder.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"

namespace hpz {
namespace {

/** 2 nodes x 4 GPUs, hpZ 4, the tiny model with every parameter partitioned. */
Scenario small() {
  Scenario sc;
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 4;
  sc.cluster.gpu = gpu_preset("a100-80g");
  sc.model = model_preset("tiny");
  sc.training.seq_len = 16;
  sc.zero.zero_hpz_partition_size = 4;
  sc.zero.stage3_param_persistence_threshold = 0;
  // A tiny model fits in one prefetch bucket: the prefetcher would gather everything up front
  // and nothing would be released. These limits make it behave like a large model does.
  sc.zero.stage3_max_reuse_distance = 0;
  sc.zero.stage3_prefetch_bucket_size = 1;
  return sc;
}

TEST(Builder, SameScenarioGivesTheSameSchedule) {
  EXPECT_EQ(schedule_to_json(build_schedule(small())), schedule_to_json(build_schedule(small())));
}

// The seed moves simulated times (jitter) and replayed data, never the schedule: hpzlab repro
// builds one schedule per variant and replays it under every seed.
TEST(Builder, TheSeedDoesNotChangeTheSchedule) {
  Scenario sc = small();
  const nlohmann::json a = schedule_to_json(build_schedule(sc));
  sc.run.seed = 12345;
  EXPECT_EQ(schedule_to_json(build_schedule(sc)), a);
}

// Ranks that issue the same ops on their own groups share one copy (OpList): a reader sees each
// rank's own groups, a write gives the rank its own copy, and lists that differ (in anything but
// the groups, or with groups that do not correspond one for one) are not shared.
Op collective_on(GroupId g) {
  Op op;
  op.kind = OpKind::kAllGather;
  op.group = g;
  op.comm_bytes = 64;
  return op;
}

TEST(OpList, SharesEqualOpsAndReadsEachRanksOwnGroups) {
  OpList a, b;
  for (GroupId g : {0, 2, 0, kNoGroup}) a.push_back(g == kNoGroup ? Op{} : collective_on(g));
  for (GroupId g : {1, 3, 1, kNoGroup}) b.push_back(g == kNoGroup ? Op{} : collective_on(g));
  ASSERT_TRUE(b.share_if_same(a));
  EXPECT_TRUE(b.shares_with(a));
  EXPECT_EQ(b[0].group, 1);
  EXPECT_EQ(b[1].group, 3);
  EXPECT_EQ(b[2].group, 1);
  EXPECT_EQ(b[3].group, kNoGroup);
  EXPECT_EQ(a[1].group, 2);
  std::vector<GroupId> seen;
  for (const Op& op : b) seen.push_back(op.group);
  EXPECT_EQ(seen, (std::vector<GroupId>{1, 3, 1, kNoGroup}));
  // A write: b gets its own copy with its groups in place; a is untouched.
  b.mut()[0].comm_bytes = 128;
  EXPECT_FALSE(b.shares_with(a));
  EXPECT_EQ(b[0].group, 1);
  EXPECT_EQ(b[1].group, 3);
  EXPECT_EQ(a[0].comm_bytes, 64u);
  EXPECT_EQ(a[0].group, 0);
  // A third list sharing b's copy through a shares a's copy and maps from a's groups.
  OpList c;
  for (GroupId g : {5, 6, 5, kNoGroup}) c.push_back(g == kNoGroup ? Op{} : collective_on(g));
  ASSERT_TRUE(c.share_if_same(a));
  OpList d;
  for (GroupId g : {7, 8, 7, kNoGroup}) d.push_back(g == kNoGroup ? Op{} : collective_on(g));
  ASSERT_TRUE(d.share_if_same(c));
  EXPECT_TRUE(d.shares_with(a));
  EXPECT_EQ(d[1].group, 8);
}

TEST(OpList, DoesNotShareWhatDiffers) {
  OpList a;
  for (GroupId g : {0, 2, 0}) a.push_back(collective_on(g));
  OpList two_for_one;  // a's group 0 would be both 1 and 4
  for (GroupId g : {1, 3, 4}) two_for_one.push_back(collective_on(g));
  EXPECT_FALSE(two_for_one.share_if_same(a));
  EXPECT_EQ(two_for_one[2].group, 4);
  OpList other_bytes;
  for (GroupId g : {0, 2, 0}) other_bytes.push_back(collective_on(g));
  other_bytes.mut()[1].comm_bytes = 1;
  EXPECT_FALSE(other_bytes.share_if_same(a));
  OpList none_for_some;  // no group where a has one
  none_for_some.push_back(collective_on(0));
  none_for_some.push_back(Op{});
  none_for_some.push_back(collective_on(0));
  EXPECT_FALSE(none_for_some.share_if_same(a));
  OpList shorter;
  shorter.push_back(collective_on(0));
  EXPECT_FALSE(shorter.share_if_same(a));
}

// The builder gives every rank of a 2 x 4 world one copy of the ops, and each rank's
// collectives still run on groups it belongs to.
TEST(OpList, TheBuilderSharesOneCopyAndEveryRankReadsItsOwnGroups) {
  Scenario sc = small();
  sc.zero.zero_quantized_gradients = true;
  const Schedule s = build_schedule(sc);
  for (Rank r = 1; r < s.world_size; ++r) {
    EXPECT_TRUE(s.ranks[r].ops.shares_with(s.ranks[0].ops)) << "rank " << r;
    EXPECT_TRUE(s.ranks[r].buffers.shares_with(s.ranks[0].buffers)) << "rank " << r;
  }
  for (Rank r = 0; r < s.world_size; ++r) {
    std::size_t collectives = 0;
    for (const Op& op : s.ranks[r].ops) {
      if (!is_collective(op.kind)) continue;
      ++collectives;
      const std::vector<Rank>& members = s.groups.at(op.group).ranks;
      ASSERT_TRUE(std::binary_search(members.begin(), members.end(), r))
          << "rank " << r << " runs a collective on " << s.groups[op.group].name;
    }
    EXPECT_GT(collectives, 0u);
  }
}

}  // namespace
}  // namespace hpz
