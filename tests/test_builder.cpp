// The builder emits DeepSpeed's issue order: structural properties of the schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"

namespace hpz {
namespace {

constexpr StreamId kS0 = 0, kSag = 1, kSnccl = 2;

/** 2 nodes x 4 GPUs, hpZ 4, the tiny model with every parameter partitioned. */
Scenario small(Variant variant = Variant::kStock) {
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
  sc.run.builder = "coarse";  // the builder these tests are about
  sc.run.variant = variant;
  return sc;
}

bool is_hpz_gather(const Schedule& s, const Op& op) {
  return op.kind == OpKind::kAllGather && s.groups.at(op.group).kind == GroupKind::kHpz;
}

/** Index of the first op at or after `from` on rank r matching pred. */
template <typename Pred>
std::optional<std::size_t> find_op(const Schedule& s, Rank r, std::size_t from, Pred pred) {
  const auto& ops = s.ranks[r].ops;
  for (std::size_t i = from; i < ops.size(); ++i) {
    if (pred(ops[i])) return i;
  }
  return std::nullopt;
}

/** The pairs (secondary copy, first hpZ gather of the same unit after it) of rank r, after init. */
std::vector<std::pair<std::size_t, std::size_t>> copy_gather_pairs(const Schedule& s, Rank r) {
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  const auto& ops = s.ranks[r].ops;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& c = ops[i];
    if (c.purpose != Purpose::kSecondaryPartitionCopy || c.phase == Phase::kInit) continue;
    auto g = find_op(s, r, i + 1,
                     [&](const Op& op) { return is_hpz_gather(s, op) && op.unit == c.unit; });
    if (g) pairs.emplace_back(i, *g);
  }
  return pairs;
}

/** Does anything between copy and gather order the copy (S0) before the gather (S_ag/S_nccl)?
 *  A host sync of S0 or the device, or an S0 event recorded after the copy that S_ag or S_nccl
 *  waits for before the gather. (A deliberately narrow check of the builder's output; the
 *  checker computes full happens-before.) */
bool ordered(const Schedule& s, Rank r, std::size_t copy, std::size_t gather) {
  const auto& ops = s.ranks[r].ops;
  const StreamId copy_stream = ops[copy].stream;
  if (ops[gather].stream == copy_stream) return true;
  std::vector<EventId> after_copy;
  for (std::size_t k = copy + 1; k < gather; ++k) {
    const Op& op = ops[k];
    if (op.kind == OpKind::kHostDeviceSync) return true;
    if (op.kind == OpKind::kHostStreamSync && op.stream == copy_stream) return true;
    if (op.kind == OpKind::kEventRecord && op.stream == copy_stream) after_copy.push_back(op.event);
    if (op.kind == OpKind::kStreamWaitEvent && (op.stream == kSag || op.stream == kSnccl) &&
        std::count(after_copy.begin(), after_copy.end(), op.event) > 0) {
      return true;
    }
  }
  return false;
}

TEST(Builder, StockLeavesTheSecondaryCopyAndTheHpzGatherUnordered) {
  const Schedule s = build_schedule(small(Variant::kStock));
  for (Rank r : {0, 5}) {
    const auto pairs = copy_gather_pairs(s, r);
    ASSERT_FALSE(pairs.empty()) << "rank " << r << " has no copy followed by an hpZ gather";
    for (auto [copy, gather] : pairs) {
      EXPECT_EQ(s.ranks[r].ops[copy].stream, kS0);
      EXPECT_EQ(s.ranks[r].ops[gather].stream, kSnccl);
      EXPECT_FALSE(ordered(s, r, copy, gather)) << "rank " << r << " copy " << copy;
    }
  }
}

TEST(Builder, EventWaitOrdersEveryCopyBeforeItsGatherWithAnEvent) {
  const Schedule s = build_schedule(small(Variant::kEventWait));
  for (Rank r = 0; r < s.world_size; ++r) {
    const auto pairs = copy_gather_pairs(s, r);
    ASSERT_FALSE(pairs.empty());
    for (auto [copy, gather] : pairs) {
      EXPECT_TRUE(ordered(s, r, copy, gather));
      const auto& ops = s.ranks[r].ops;
      // Fix B: an event recorded on S0 right after the copy, S_ag waits on it before the gather,
      // and the host never blocks.
      ASSERT_EQ(ops[copy + 1].purpose, Purpose::kFixEventRecord);
      const EventId e = ops[copy + 1].event;
      auto w = find_op(s, r, copy + 2, [&](const Op& op) {
        return op.kind == OpKind::kStreamWaitEvent && op.event == e;
      });
      ASSERT_TRUE(w.has_value());
      EXPECT_LT(*w, gather);
      EXPECT_EQ(ops[*w].stream, kSag);
      EXPECT_EQ(ops[*w].purpose, Purpose::kFixEventWait);
    }
    EXPECT_FALSE(
        find_op(s, r, 0, [](const Op& op) { return op.purpose == Purpose::kFixHostSync; }));
  }
}

TEST(Builder, HostSyncBlocksTheHostAfterEveryCopy) {
  const Schedule s = build_schedule(small(Variant::kHostSync));
  for (Rank r = 0; r < s.world_size; ++r) {
    const auto pairs = copy_gather_pairs(s, r);
    ASSERT_FALSE(pairs.empty());
    for (auto [copy, gather] : pairs) {
      const Op& next = s.ranks[r].ops[copy + 1];
      EXPECT_EQ(next.kind, OpKind::kHostStreamSync);
      EXPECT_EQ(next.purpose, Purpose::kFixHostSync);
      EXPECT_EQ(next.stream, kS0);
      EXPECT_TRUE(ordered(s, r, copy, gather));
    }
    EXPECT_FALSE(
        find_op(s, r, 0, [](const Op& op) { return op.purpose == Purpose::kFixEventWait; }));
  }
}

TEST(Builder, OverlapCommOffPutsCopyAndGatherLaunchOnOneStream) {
  Scenario sc = small(Variant::kStock);
  sc.zero.overlap_comm = false;
  const Schedule s = build_schedule(sc);
  for (Rank r : {0, 7}) {
    const auto& ops = s.ranks[r].ops;
    EXPECT_FALSE(find_op(s, r, 0, [](const Op& op) { return op.stream == kSag; }))
        << "nothing may run on S_ag when overlap_comm is false";
    const auto pairs = copy_gather_pairs(s, r);
    ASSERT_FALSE(pairs.empty());
    for (auto [copy, gather] : pairs) {
      // The gather is launched from S0: NCCL's stream waits for an S0 event after the copy.
      ASSERT_EQ(ops[gather - 1].kind, OpKind::kStreamWaitEvent);
      ASSERT_EQ(ops[gather - 2].kind, OpKind::kEventRecord);
      EXPECT_EQ(ops[gather - 2].stream, ops[copy].stream);
      EXPECT_TRUE(ordered(s, r, copy, gather));
    }
  }
}

TEST(Builder, OffloadKeepsShardsOnTheHostAndBlocksOnEveryCopy) {
  Scenario sc = small(Variant::kStock);
  sc.zero.offload_param = true;
  const Schedule s = build_schedule(sc);
  const auto& rank = s.ranks[1];
  bool saw_copy = false;
  for (std::size_t i = 0; i < rank.ops.size(); ++i) {
    const Op& op = rank.ops[i];
    if (op.purpose != Purpose::kSecondaryPartitionCopy) continue;
    saw_copy = true;
    const Access w = s.accesses_of(1, op)[1];
    EXPECT_TRUE(rank.buffers[w.buffer].on_host);
    EXPECT_EQ(rank.ops[i + 1].kind, OpKind::kHostStreamSync);
  }
  EXPECT_TRUE(saw_copy);
}

TEST(Builder, HpzOffGathersOverTheWorldOnly) {
  Scenario sc = small();
  sc.zero.zero_hpz_partition_size = 1;
  const Schedule s = build_schedule(sc);
  for (const auto& g : s.groups) EXPECT_NE(g.kind, GroupKind::kHpz);
  EXPECT_FALSE(find_op(s, 0, 0, [](const Op& op) {
    return op.purpose == Purpose::kSecondaryPartitionCopy || op.purpose == Purpose::kSecondaryAlloc;
  }));
}

TEST(Builder, FirstStepRecordsTheTraceAndLaterStepsPrefetch) {
  const Schedule s = build_schedule(small());
  std::size_t prefetch_step0 = 0, prefetch_step1 = 0;
  for (const Op& op : s.ranks[0].ops) {
    if (op.kind == OpKind::kAllGather && op.purpose == Purpose::kPrefetch) {
      (op.step == 0 ? prefetch_step0 : prefetch_step1)++;
    }
  }
  EXPECT_EQ(prefetch_step0, 0u);
  EXPECT_GT(prefetch_step1, 0u);
}

TEST(Builder, SecondariesAreCreatedAtInitAndAfterEveryInvalidation) {
  const Schedule s = build_schedule(small());
  std::size_t copies_init = 0, copies_step0 = 0, copies_step1 = 0, invalidations = 0;
  for (const Op& op : s.ranks[2].ops) {
    if (op.purpose == Purpose::kSecondaryInvalidate) ++invalidations;
    if (op.purpose != Purpose::kSecondaryPartitionCopy) continue;
    if (op.phase == Phase::kInit)
      ++copies_init;
    else
      (op.step == 0 ? copies_step0 : copies_step1)++;
  }
  const std::size_t units = s.units.size();
  EXPECT_EQ(copies_init, units);  // every unit of the tiny model has real data at position 2
  EXPECT_EQ(copies_step0, 0u);    // secondaries from init still exist in step 0
  // Recreated after the step-0 invalidation. lm_head is the exception that proves the rule:
  // when its forward runs, the prefetcher has already popped its backward use (the very next
  // module), so it stays gathered and gets its secondary at the release after its backward.
  EXPECT_EQ(copies_step1, units);
  EXPECT_EQ(invalidations, 2 * units);
  std::optional<Phase> lm_head_copy_phase;
  for (const Op& op : s.ranks[2].ops) {
    if (op.purpose == Purpose::kSecondaryPartitionCopy && op.step == 1 &&
        s.units[op.unit].name == "lm_head") {
      lm_head_copy_phase = op.phase;
    }
  }
  EXPECT_EQ(lm_head_copy_phase, Phase::kBackward);
}

// run.spin_before_copy_us: a spin kernel on S0 right before every secondary copy of a training
// step, touching no memory, and nothing else changes.
TEST(Builder, SpinBeforeCopyPrecedesEveryTrainingStepCopyOnS0) {
  Scenario sc = small();
  const Schedule plain = build_schedule(sc);
  sc.run.spin_before_copy_us = 150;
  const Schedule s = build_schedule(sc);
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const auto& ops = s.ranks[r].ops;
    std::size_t spins = 0, copies = 0;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].purpose == Purpose::kSecondaryPartitionCopy && ops[i].phase != Phase::kInit) {
        ++copies;
        ASSERT_GT(i, 0u);
        EXPECT_EQ(ops[i - 1].purpose, Purpose::kReproSpin);
        EXPECT_EQ(ops[i - 1].unit, ops[i].unit);
      }
      if (ops[i].purpose != Purpose::kReproSpin) continue;
      ++spins;
      EXPECT_EQ(ops[i].kind, OpKind::kKernel);
      EXPECT_EQ(ops[i].stream, 0);  // S0, the stream the copy runs on
      EXPECT_EQ(ops[i].spin_us, 150.0F);
      EXPECT_EQ(ops[i].access_count, 0u);
      EXPECT_NE(ops[i].phase, Phase::kInit);
    }
    EXPECT_GT(copies, 0u);
    EXPECT_EQ(spins, copies);
    EXPECT_EQ(ops.size(), plain.ranks[r].ops.size() + spins);
  }
}

TEST(Builder, SkippedInvalidationNeverRefreshesSecondaries) {
  Scenario sc = small(Variant::kEventWait);
  sc.bugs.skip_secondary_invalidation = true;
  sc.run.steps = 3;
  const Schedule s = build_schedule(sc);
  for (const Op& op : s.ranks[0].ops) {
    EXPECT_NE(op.purpose, Purpose::kSecondaryInvalidate);
    if (op.purpose == Purpose::kSecondaryPartitionCopy) {
      EXPECT_EQ(op.phase, Phase::kInit);
    }
  }
}

TEST(Builder, ZeroElementSecondarySliceCopiesNothingAndReadsNothing) {
  Scenario sc = small();
  sc.model.hidden = 4;  // norms of 4 elements over 8 ranks: positions 2 and 3 hold only padding
  sc.model.heads = 2;
  sc.model.kv_heads = 2;
  const Schedule s = build_schedule(sc);
  const auto norm = std::find_if(s.units.begin(), s.units.end(), [](const ParamUnit& u) {
    return u.name == "layers.0.input_norm";
  });
  ASSERT_NE(norm, s.units.end());
  const UnitId u = static_cast<UnitId>(norm - s.units.begin());
  EXPECT_EQ(norm->padded_numel, 8u);
  EXPECT_EQ(norm->secondary_numel, 2u);
  for (Rank r : {3, 7}) {  // hpZ group position 3: slice [6, 8) is all padding
    for (const Op& op : s.ranks[r].ops) {
      if (op.unit != u) continue;
      EXPECT_NE(op.purpose, Purpose::kSecondaryPartitionCopy) << "rank " << r;
      if (is_hpz_gather(s, op)) {
        for (const Access& a : s.accesses_of(r, op)) {
          if (a.mode == AccessMode::kRead) ADD_FAILURE() << "reads padding on rank " << r;
        }
      }
    }
  }
  // Position 1 holds [2, 4): real data, copied.
  EXPECT_TRUE(std::any_of(s.ranks[1].ops.begin(), s.ranks[1].ops.end(), [&](const Op& op) {
    return op.unit == u && op.purpose == Purpose::kSecondaryPartitionCopy &&
           op.phase != Phase::kInit;
  }));
}

TEST(Builder, LegacyCopyBoundsSkipRanksWhosePrimaryShardReachesPadding) {
  Scenario sc = small(Variant::kEventWait);
  sc.model.hidden = 6;  // 6 elements over 8 ranks: ranks 6 and 7 hold only padding
  sc.model.heads = 2;
  sc.model.kv_heads = 2;
  sc.bugs.legacy_copy_bounds = true;
  const Schedule s = build_schedule(sc);
  const auto count_copies = [&](Rank r) {
    return std::count_if(s.ranks[r].ops.begin(), s.ranks[r].ops.end(), [&](const Op& op) {
      return op.purpose == Purpose::kSecondaryPartitionCopy &&
             s.units[op.unit].name == "final_norm";
    });
  };
  EXPECT_GT(count_copies(5), 0);
  EXPECT_EQ(count_copies(6), 0);  // position 2 of group 1: slice [4, 6) is real but never written
}

TEST(Builder, MismatchRankGathersOverTheWorldWhereItsPeersUseTheHpzGroup) {
  Scenario sc = small(Variant::kEventWait);
  sc.bugs.secondary_mismatch_rank = 1;
  const Schedule s = build_schedule(sc);
  const auto hpz_gathers = [&](Rank r) {
    return std::count_if(s.ranks[r].ops.begin(), s.ranks[r].ops.end(),
                         [&](const Op& op) { return is_hpz_gather(s, op); });
  };
  EXPECT_EQ(hpz_gathers(1), 0);
  EXPECT_GT(hpz_gathers(0), 0);
}

TEST(Builder, QgzReducesWithTwoAllToAllsInsteadOfReduceScatter) {
  Scenario sc = small();
  sc.zero.zero_quantized_gradients = true;
  const Schedule s = build_schedule(sc);
  std::size_t a2a_intra = 0, a2a_inter = 0, rs = 0;
  for (const Op& op : s.ranks[0].ops) {
    if (op.kind == OpKind::kReduceScatter) ++rs;
    if (op.kind == OpKind::kAllToAll) {
      (s.groups[op.group].kind == GroupKind::kIntraNode ? a2a_intra : a2a_inter)++;
    }
  }
  EXPECT_EQ(rs, 0u);
  EXPECT_GT(a2a_intra, 0u);
  EXPECT_EQ(a2a_intra, a2a_inter);
}

TEST(Builder, EveryRankIssuesTheSameCollectivesOnEachGroupWhenNoBugIsOn) {
  Scenario sc = small();
  sc.zero.zero_quantized_gradients = true;
  sc.zero.zero_quantized_weights = true;
  const Schedule s = build_schedule(sc);
  for (GroupId g = 0; g < static_cast<GroupId>(s.groups.size()); ++g) {
    std::optional<std::vector<std::pair<OpKind, std::uint64_t>>> first;
    for (Rank r : s.groups[g].ranks) {
      std::vector<std::pair<OpKind, std::uint64_t>> seq;
      for (const Op& op : s.ranks[r].ops) {
        if (op.group == g) seq.emplace_back(op.kind, op.comm_bytes);
      }
      if (!first) first = seq;
      EXPECT_EQ(seq, *first) << "group " << s.groups[g].name << " rank " << r;
    }
  }
}

TEST(Builder, RejectsAWorldNotDivisibleByTheHpzSize) {
  Scenario sc = small();
  sc.zero.zero_hpz_partition_size = 3;
  EXPECT_THROW(build_schedule(sc), InputError);
}

}  // namespace
}  // namespace hpz

namespace hpz {
namespace {

TEST(Builder, GradientAccumulationReducesEveryMicroStepAndStepsOnce) {
  Scenario sc = small();
  sc.training.grad_accum = 3;
  const Schedule s = build_schedule(sc);
  std::size_t reductions = 0, optimizer_kernels = 0, accumulating = 0;
  for (const Op& op : s.ranks[0].ops) {
    if (op.kind == OpKind::kReduceScatter) {
      ++reductions;
      // From the second micro-step on, the reduction adds into the shard: it reads it too.
      bool reads_shard = false;
      for (const Access& a : s.accesses_of(0, op)) {
        reads_shard |= a.mode == AccessMode::kRead &&
                       s.ranks[0].buffers[a.buffer].role == BufferRole::kGradShard;
      }
      EXPECT_EQ(reads_shard, op.micro_step > 0);
      accumulating += reads_shard;
    }
    if (op.kind == OpKind::kKernel && op.purpose == Purpose::kOptimizerStep) ++optimizer_kernels;
  }
  const std::size_t units = s.units.size();
  EXPECT_EQ(reductions, 2 * 3 * units);  // 2 steps x 3 micro-steps
  EXPECT_EQ(accumulating, 2 * 2 * units);
  EXPECT_EQ(optimizer_kernels, 2 * units);
}

TEST(Builder, SameScenarioGivesTheSameSchedule) {
  const Schedule a = build_schedule(small());
  const Schedule b = build_schedule(small());
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (std::size_t r = 0; r < a.ranks.size(); ++r) {
    ASSERT_EQ(a.ranks[r].ops.size(), b.ranks[r].ops.size());
    for (std::size_t i = 0; i < a.ranks[r].ops.size(); ++i) {
      EXPECT_EQ(a.ranks[r].ops[i].purpose, b.ranks[r].ops[i].purpose);
      EXPECT_EQ(a.ranks[r].ops[i].event, b.ranks[r].ops[i].event);
    }
  }
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

// Both builders give every rank of a 2 x 4 world one copy of the ops, and each rank's
// collectives still run on groups it belongs to.
TEST(OpList, BuildersShareOneCopyAndEveryRankReadsItsOwnGroups) {
  for (const std::string builder : {"coarse", "deepspeed"}) {
    Scenario sc = small();
    sc.zero.zero_quantized_gradients = true;
    sc.run.builder = builder;
    const Schedule s = build_schedule(sc);
    for (Rank r = 1; r < s.world_size; ++r) {
      EXPECT_TRUE(s.ranks[r].ops.shares_with(s.ranks[0].ops)) << builder << " rank " << r;
      EXPECT_TRUE(s.ranks[r].buffers.shares_with(s.ranks[0].buffers)) << builder << " rank " << r;
    }
    for (Rank r = 0; r < s.world_size; ++r) {
      std::size_t collectives = 0;
      for (const Op& op : s.ranks[r].ops) {
        if (!is_collective(op.kind)) continue;
        ++collectives;
        const std::vector<Rank>& members = s.groups.at(op.group).ranks;
        ASSERT_TRUE(std::binary_search(members.begin(), members.end(), r))
            << builder << ": rank " << r << " runs a collective on " << s.groups[op.group].name;
      }
      EXPECT_GT(collectives, 0u);
    }
  }
}

}  // namespace
}  // namespace hpz
