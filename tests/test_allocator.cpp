// The caching allocator model (sim/check/allocator.hpp) rule by rule, and the checker's
// use-after-free rule on hand-built schedules: what must be reported and what must not.
#include <gtest/gtest.h>

#include <string>

#include "sim/check/allocator.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/report.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"
#include "tests/hand_schedule.hpp"

namespace hpz::check {
namespace {

using CA = CachingAllocator;

PendingUses one_use(std::uint32_t op) {
  PendingUse u;
  u.stamp = AccessStamp{op, 5, 2};
  return {u};
}

// ---- the allocator's rules ----

TEST(CachingAllocator, RoundsRequestsUpTo512Bytes) {
  EXPECT_EQ(CA::round_size(1), 512u);
  EXPECT_EQ(CA::round_size(512), 512u);
  EXPECT_EQ(CA::round_size(513), 1024u);
  EXPECT_EQ(CA::round_size(0), 512u);
}

TEST(CachingAllocator, ReusesAFreedBlockOnlyOnItsOwnStream) {
  CA a;
  const auto [x, none] = a.allocate(0, 4096);
  EXPECT_TRUE(none.empty());
  a.free(x, one_use(7));
  // Another stream's request of the same size gets fresh memory: pools are per stream.
  const auto [y, y_uses] = a.allocate(1, 4096);
  EXPECT_NE(y, x);
  EXPECT_TRUE(y_uses.empty());
  // The block's own stream gets it back, with the use that may still run.
  const auto [z, z_uses] = a.allocate(0, 4096);
  EXPECT_EQ(z, x);
  ASSERT_EQ(z_uses.size(), 1u);
  EXPECT_EQ(z_uses[0].stamp.op, 7u);
}

TEST(CachingAllocator, BestFitTakesTheSmallestFreeBlockThatHolds) {
  CA a;
  // Live blocks between them keep the two freed ones from merging with anything.
  const auto [big, u1] = a.allocate(0, 64 * 1024);
  const auto [gap, u2] = a.allocate(0, 512);
  const auto [small, u3] = a.allocate(0, 8 * 1024);
  const auto [gap2, u4] = a.allocate(0, 512);
  a.free(big, one_use(1));
  a.free(small, one_use(2));
  const auto [got, uses] = a.allocate(0, 6 * 1024);
  EXPECT_EQ(got, small);
  ASSERT_EQ(uses.size(), 1u);
  EXPECT_EQ(uses[0].stamp.op, 2u);
  (void)gap;
  (void)gap2;
}

TEST(CachingAllocator, SplitsASmallBlockAndKeepsTheRestFree) {
  CA a;
  const auto [x, u] = a.allocate(0, 1000);  // 1024 of a fresh 2 MiB segment
  EXPECT_EQ(a.segment_count(), 1u);
  EXPECT_EQ(a.block_count(), 2u);  // the request and the rest of the segment
  const auto [y, v] = a.allocate(0, 1000);
  EXPECT_EQ(y, x + 1024);  // carved from the rest, no new segment
  EXPECT_EQ(a.segment_count(), 1u);
}

TEST(CachingAllocator, LargeBlocksSplitOnlyWhenMoreThan1MiBRemains) {
  CA a;
  const auto [x, u] = a.allocate(0, 3u << 20);  // a 20 MiB segment, split: 17 MiB remain
  EXPECT_EQ(a.block_count(), 2u);
  a.free(x, {});  // merges back into one 20 MiB block
  EXPECT_EQ(a.block_count(), 1u);
  const auto [y, v] = a.allocate(0, (20u << 20) - (1u << 20));  // 1 MiB would remain: no split
  EXPECT_EQ(y, x);
  EXPECT_EQ(a.block_count(), 1u);
}

TEST(CachingAllocator, PendingUsesFollowTheBytesThroughMergeAndSplit) {
  CA a;
  const auto [x, u1] = a.allocate(0, 4096);
  const auto [y, u2] = a.allocate(0, 4096);
  a.free(x, one_use(1));
  a.free(y, {});  // merges with x and the segment's rest
  // A request that fits in x's bytes gets x's pending use; the next one, past x, does not.
  const auto [p, p_uses] = a.allocate(0, 4096);
  EXPECT_EQ(p, x);
  ASSERT_EQ(p_uses.size(), 1u);
  const auto [q, q_uses] = a.allocate(0, 4096);
  EXPECT_EQ(q, y);
  EXPECT_TRUE(q_uses.empty());
}

// ---- the checker's rule ----

/** x allocated on S0, read on S1, freed; y allocated on S0 next and written there. */
struct Reuse {
  Builder b{1};
  BufferId x = b.buffer("x", 4096);
  BufferId y = b.buffer("y", 4096);
  Reuse() { b.schedule().allocator = true; }
  void use_x_on_s1() {
    b.alloc(0, 0, x);
    b.op(0, 0, {W(x, 0, 4096)});
    const EventId e = b.record(0, 0);
    b.wait(0, 1, e);
    b.op(0, 1, {R(x, 0, 4096)});
  }
  void free_x_and_reuse() {
    b.free(0, 0, x);
    b.alloc(0, 0, y);
    b.op(0, 0, {W(y, 0, 4096)});
  }
};

TEST(UseAfterFree, ABlockFreedWhileAnotherStreamReadsItIsReported) {
  Reuse t;
  t.use_x_on_s1();
  t.free_x_and_reuse();
  const CheckResult r = t.b.check();
  ASSERT_EQ(r.count(FindingKind::kUseAfterFree), 1u) << TextReporter().render({&r, 1});
  const Finding& f = r.groups[0].example;
  EXPECT_EQ(f.first.stream, "S1");
  EXPECT_EQ(f.first_mode, AccessMode::kRead);
  EXPECT_EQ(f.second.stream, "S0");
  EXPECT_EQ(f.second_mode, AccessMode::kWrite);
  EXPECT_EQ(f.buffer, "x");
  EXPECT_NE(f.fix.find("x.record_stream(S1)"), std::string::npos) << f.fix;
  EXPECT_EQ(r.count(FindingKind::kRace), 0u);  // different lifetimes: no race on x itself
}

TEST(UseAfterFree, RecordStreamHoldsTheBlockUntilTheStreamIsDone) {
  Reuse t;
  t.use_x_on_s1();
  t.b.record_stream(0, 1, t.x);
  t.free_x_and_reuse();
  EXPECT_TRUE(t.b.check().clean());
}

TEST(UseAfterFree, ARecordOfAnotherStreamDoesNotHelp) {
  Reuse t;
  t.use_x_on_s1();
  t.b.record_stream(0, 2, t.x);
  t.free_x_and_reuse();
  EXPECT_EQ(t.b.check().count(FindingKind::kUseAfterFree), 1u);
}

TEST(UseAfterFree, AHostSyncBeforeTheFreeOrdersTheUse) {
  Reuse t;
  t.use_x_on_s1();
  t.b.host_sync(0, 1);
  t.free_x_and_reuse();
  EXPECT_TRUE(t.b.check().clean());
}

TEST(UseAfterFree, TheNewOwnerWaitingForTheStreamIsOrdered) {
  Reuse t;
  t.use_x_on_s1();
  t.b.free(0, 0, t.x);
  t.b.alloc(0, 0, t.y);
  const EventId e = t.b.record(0, 1);
  t.b.wait(0, 0, e);  // S0 waits for S1's read before it writes y
  t.b.op(0, 0, {W(t.y, 0, 4096)});
  EXPECT_TRUE(t.b.check().clean());
}

TEST(UseAfterFree, AnAllocationOnAnotherStreamGetsOtherMemory) {
  Reuse t;
  t.use_x_on_s1();
  t.b.free(0, 0, t.x);
  t.b.alloc(0, 2, t.y);
  t.b.op(0, 2, {W(t.y, 0, 4096)});
  EXPECT_TRUE(t.b.check().clean());
}

TEST(UseAfterFree, ASmallerRequestCarvedFromTheBlockIsReported) {
  Reuse t;
  const BufferId z = t.b.buffer("z", 1000);
  t.use_x_on_s1();
  t.b.free(0, 0, t.x);
  t.b.alloc(0, 0, z);
  t.b.op(0, 0, {W(z, 0, 1000)});
  EXPECT_EQ(t.b.check().count(FindingKind::kUseAfterFree), 1u);
}

TEST(UseAfterFree, TwoReadsOfReusedMemoryDoNotConflict) {
  Reuse t;
  t.use_x_on_s1();
  t.b.free(0, 0, t.x);
  t.b.alloc(0, 0, t.y);
  t.b.op(0, 0, {R(t.y, 0, 4096)});  // reads garbage: an uninitialized read, not a reuse bug
  const CheckResult r = t.b.check();
  EXPECT_EQ(r.count(FindingKind::kUseAfterFree), 0u);
  EXPECT_EQ(r.count(FindingKind::kUninitializedRead), 1u);
}

TEST(UseAfterFree, APendingWriteAgainstTheNewOwnersReadIsReported) {
  Reuse t;
  t.b.alloc(0, 0, t.x);
  const EventId e = t.b.record(0, 0);
  t.b.wait(0, 1, e);
  t.b.op(0, 1, {W(t.x, 0, 4096)});  // S1 writes x, nobody waits for it
  t.b.free(0, 0, t.x);
  t.b.alloc(0, 0, t.y);
  t.b.op(0, 0, {W(t.y, 0, 4096)});
  t.b.op(0, 0, {R(t.y, 0, 4096)});
  const CheckResult r = t.b.check();
  ASSERT_EQ(r.count(FindingKind::kUseAfterFree), 1u);  // once per old use and new lifetime
  EXPECT_EQ(r.groups[0].example.first_mode, AccessMode::kWrite);
}

TEST(UseAfterFree, ACollectivesOwnUseIsRecordedByProcessGroupNccl) {
  Reuse t;
  t.b.alloc(0, 0, t.x);
  t.b.op(0, 0, {W(t.x, 0, 4096)});
  const EventId e = t.b.record(0, 0);
  t.b.wait(0, 1, e);
  t.b.collective(0, 1, 0, {R(t.x, 0, 4096)});
  t.free_x_and_reuse();
  EXPECT_TRUE(t.b.check().clean());
}

TEST(UseAfterFree, SchedulesWithoutTheAllocatorKeepLifetimesApart) {
  Reuse t;
  t.b.schedule().allocator = false;
  t.use_x_on_s1();
  t.free_x_and_reuse();
  EXPECT_TRUE(t.b.check().clean());
}

TEST(UseAfterFree, TheTextReportNamesTheMissingRecordStream) {
  Reuse t;
  t.use_x_on_s1();
  t.free_x_and_reuse();
  const CheckResult r = t.b.check();
  const std::string text = TextReporter().render({&r, 1});
  EXPECT_NE(text.find("use-after-free"), std::string::npos) << text;
  EXPECT_NE(text.find("still used by:"), std::string::npos) << text;
  EXPECT_NE(text.find("reused by:"), std::string::npos) << text;
}

// ---- DeepSpeed issue 8061: a bucket filled from several streams ----
// The pattern of PR 8080's diff (stage_1_and_2.py, first in 0.19.3), hand-built: the recorder
// cannot show it, since the bucket copies land on several streams only under torch.compile's
// CUDA graphs, which a CPU recording does not run (docs/research-allocator-bugs.md, section 6).
// S0 is the hook's current stream, S1 a second producer, S2 the reduction stream.

/** Two gradient copies into one bucket, from S1 and S0; then the reduction on S2 waits for the
 *  streams in `waited` and divides the bucket in place. */
CheckResult bucket_from_two_streams(std::initializer_list<StreamId> waited) {
  Builder b(1);
  const BufferId bucket = b.buffer("ipg_bucket", 400);
  b.alloc(0, 0, bucket);
  const EventId made = b.record(0, 0);
  b.wait(0, 1, made);
  b.op(0, 1, {W(bucket, 0, 200)}, OpKind::kCopy, Purpose::kBackwardCompute);
  b.op(0, 0, {W(bucket, 200, 200)}, OpKind::kCopy, Purpose::kBackwardCompute);
  for (const StreamId s : waited) b.wait(0, 2, b.record(0, s));  // reduction_stream.wait_stream
  b.op(0, 2, {R(bucket, 0, 400), W(bucket, 0, 400)}, OpKind::kKernel, Purpose::kGradReduce);
  return b.check();
}

TEST(BucketProducers, WaitingOnlyOnTheCurrentStreamRacesWithTheOtherProducer) {
  // Before PR 8080: average_tensor's reduction_stream.wait_stream(current_stream()).
  const CheckResult r = bucket_from_two_streams({0});
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(r.groups[0].example.first.stream, "S1");
  EXPECT_EQ(r.groups[0].example.second.stream, "S2");
}

TEST(BucketProducers, WaitingOnEveryProducerStreamIsClean) {
  // PR 8080: a wait on every stream in bucket.copy_streams.
  EXPECT_TRUE(bucket_from_two_streams({0, 1}).clean());
}

// ---- the IR ----

TEST(RecordStreamOp, RoundTripsThroughJsonWithTheAllocatorFlag) {
  Reuse t;
  t.use_x_on_s1();
  t.b.record_stream(0, 1, t.x);
  t.free_x_and_reuse();
  const Schedule back = schedule_from_json(schedule_to_json(t.b.schedule()), "t.json");
  EXPECT_TRUE(back.allocator);
  const Op op = back.ranks[0].ops[5];
  EXPECT_EQ(op.kind, OpKind::kRecordStream);
  EXPECT_EQ(op.stream, 1);
  EXPECT_EQ(op.buffer, t.x);
}

TEST(RecordStreamOp, OnTheHostIsRefusedWithItsKey) {
  Reuse t;
  t.use_x_on_s1();
  t.b.record_stream(0, kHostStream, t.x);
  try {
    schedule_from_json(schedule_to_json(t.b.schedule()), "t.json");
    FAIL() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ops[5].stream"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hpz::check
