// The race checker: each rule on small hand-built schedules (including what must NOT be
// reported), the verdicts on every shipped scenario, and the text report's golden output.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/report.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/scenario.hpp"
#include "tests/hand_schedule.hpp"
#include "tests/paths.hpp"

namespace hpz::check {
namespace {

std::uint64_t total(const CheckResult& r) {
  std::uint64_t n = 0;
  for (FindingKind k : kAllKinds) n += r.count(k);
  return n;
}

// ---- race ----

TEST(Race, UnorderedWriteAndReadOnTwoStreamsIsReported) {
  Builder b(1);
  const BufferId x = b.buffer("x", 256);
  b.op(0, 0, {W(x, 0, 256)});
  b.op(0, 1, {R(x, 0, 256)});
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(total(r), 1u);
  const Finding& f = r.groups[0].example;
  EXPECT_EQ(f.first.stream, "S0");
  EXPECT_EQ(f.second.stream, "S1");
  EXPECT_EQ(f.first.index, 0u);
  EXPECT_EQ(f.second.index, 1u);
  EXPECT_EQ(f.buffer, "x");
  EXPECT_EQ(f.offset, 0u);
  EXPECT_EQ(f.bytes, 256u);
  // The occurrence list names the same pair, for the engines that time it.
  ASSERT_EQ(r.groups[0].occurrences.size(), 1u);
  EXPECT_EQ(r.groups[0].occurrences[0].rank, 0);
  EXPECT_EQ(r.groups[0].occurrences[0].first, 0u);
  EXPECT_EQ(r.groups[0].occurrences[0].second, 1u);
  EXPECT_NE(f.fix.find("record an event on S0"), std::string::npos) << f.fix;
  EXPECT_NE(f.fix.find("make S1 wait"), std::string::npos) << f.fix;
}

TEST(Race, WriteAfterUnorderedReadIsReported) {
  Builder b(1);
  const BufferId x = b.buffer("x", 256);
  b.op(0, kHostStream, {W(x, 0, 256)});
  b.op(0, 0, {R(x, 0, 256)});
  b.op(0, 1, {W(x, 0, 256)});
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(r.groups[0].example.first_mode, AccessMode::kRead);
  EXPECT_EQ(r.groups[0].example.second_mode, AccessMode::kWrite);
}

TEST(Race, DisjointSlicesOfOneBufferDoNotConflict) {
  Builder b(1);
  const BufferId x = b.buffer("x", 256);
  b.op(0, 0, {W(x, 0, 128)});
  b.op(0, 1, {W(x, 128, 128)});
  b.op(0, 2, {R(x, 128, 64)});  // ordered? no, but S1 wrote it: a race with S1 only
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(r.groups[0].example.first.stream, "S1");
  EXPECT_EQ(r.groups[0].example.offset, 128u);
}

TEST(Race, OverlappingViewsConflictEvenWithDifferentStartPointers) {
  Builder b(1);
  const BufferId x = b.buffer("x", 1024);
  b.op(0, kHostStream, {W(x, 0, 1024)});
  b.op(0, 0, {W(x, 256, 256)});  // a copy into a slice
  b.op(0, 1, {R(x, 0, 1024)});   // a gather reading the whole view
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(r.groups[0].example.offset, 256u);
  EXPECT_EQ(r.groups[0].example.bytes, 256u);
}

TEST(Race, ReadsNeverConflictWithReads) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, kHostStream, {W(x, 0, 64)});
  b.op(0, 0, {R(x, 0, 64)});
  b.op(0, 1, {R(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, FifoOrdersOpsOfOneStream) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.op(0, 0, {R(x, 0, 64)});
  b.op(0, 0, {W(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, EventRecordedAfterTheWriteOrdersIt) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.wait(0, 1, b.record(0, 0));
  b.op(0, 1, {R(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, EventRecordedBeforeTheWriteDoesNotOrderIt) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  const EventId e = b.record(0, 0);
  b.op(0, 0, {W(x, 0, 64)});
  b.wait(0, 1, e);
  b.op(0, 1, {R(x, 0, 64)});
  EXPECT_EQ(b.check().count(FindingKind::kRace), 1u);
}

TEST(Race, EventsAreTransitive) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.wait(0, 1, b.record(0, 0));
  b.wait(0, 2, b.record(0, 1));
  b.op(0, 2, {R(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, HostStreamSyncOrdersLaterIssuedWork) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.host_sync(0, 0);
  b.op(0, 1, {R(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, HostSyncOfTheWrongStreamDoesNotOrder) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.host_sync(0, 2);
  b.op(0, 1, {R(x, 0, 64)});
  EXPECT_EQ(b.check().count(FindingKind::kRace), 1u);
}

TEST(Race, DeviceSyncOrdersEveryStream) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  const BufferId y = b.buffer("y", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.op(0, 2, {W(y, 0, 64)});
  b.device_sync(0);
  b.op(0, 1, {R(x, 0, 64), W(y, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, HostEventSyncOrdersWhatTheRecordCapturedBeforeLaterIssuedWork) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  const EventId e = b.record(0, 0);
  b.host_event_sync(0, e);
  b.op(0, 1, {R(x, 0, 64)});
  b.op(0, kHostStream, {R(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Race, HostEventSyncDoesNotOrderWorkIssuedAfterTheRecord) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  const BufferId y = b.buffer("y", 64);
  const BufferId z = b.buffer("z", 64);
  b.op(0, 0, {W(x, 0, 64)});
  const EventId e = b.record(0, 0);
  b.op(0, 0, {W(y, 0, 64)});  // after the record on the same stream: not captured
  b.op(0, 2, {W(z, 0, 64)});  // another stream: not captured either
  b.host_event_sync(0, e);
  b.op(0, 1, {R(x, 0, 64), R(y, 0, 64), R(z, 0, 64)});
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 2u);  // y and z; x is ordered
  std::set<std::string> buffers;
  for (const FindingGroup& g : r.groups) buffers.insert(g.example.buffer);
  EXPECT_EQ(buffers, (std::set<std::string>{"y", "z"}));
}

TEST(Race, HostReadAfterUnsyncedStreamWriteIsReported) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  b.op(0, kHostStream, {R(x, 0, 64)});
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_NE(r.groups[0].example.fix.find("host synchronize S0"), std::string::npos);
}

TEST(Race, CollectiveRendezvousOrdersTwoOpsOfOneRank) {
  // Rank 0 writes x on S0 then joins collective A on S0; rank 1 finishes A, its host waits for
  // it and issues collective B; rank 0's B on S1 completes after rank 1's B started, so rank
  // 0's read of x on S1 after B is ordered after the write only through rank 1.
  for (bool rank1_syncs : {true, false}) {
    Builder b(2);
    const BufferId x = b.buffer("x", 64);
    const BufferId send = b.buffer("send", 64);
    const GroupId g = b.group({0, 1});
    const GroupId h = b.group({0, 1});
    b.op(0, kHostStream, {W(send, 0, 64)});
    b.op(0, 0, {W(x, 0, 64)});
    b.collective(0, 0, g, {});
    b.collective(0, 1, h, {});
    b.op(0, 1, {R(x, 0, 64)});
    b.collective(1, 0, g, {});
    if (rank1_syncs) b.host_sync(1, 0);
    b.collective(1, 1, h, {});
    const CheckResult r = b.check();
    EXPECT_EQ(r.count(FindingKind::kRace), rank1_syncs ? 0u : 1u) << rank1_syncs;
    EXPECT_EQ(total(r), rank1_syncs ? 0u : 1u);
  }
}

TEST(Race, RendezvousOrdersOnlyTheCompletionNotTheCollectivesOwnAccess) {
  // Rank 0's write on S0 reaches rank 1 through collective A; rank 1 then starts B. Rank 0's B
  // on S1 reads x: it may read before rank 1 arrives, so it still races with the write.
  Builder b(2);
  const BufferId x = b.buffer("x", 64);
  const GroupId g = b.group({0, 1});
  const GroupId h = b.group({0, 1});
  b.op(0, 0, {W(x, 0, 64)});
  b.collective(0, 0, g, {});
  b.collective(0, 1, h, {R(x, 0, 64)});
  b.collective(1, 0, g, {});
  b.host_sync(1, 0);
  b.collective(1, 1, h, {});
  EXPECT_EQ(b.check().count(FindingKind::kRace), 1u);
}

TEST(Race, WorldSizedRendezvousChainsAcrossManyRanks) {
  // 96 ranks (past the sparse-clock limit): rank 0's write is known to rank 95 through a world
  // collective; rank 95's host syncs and joins a pair collective with rank 0, whose later
  // read on another stream is then ordered.
  const int n = 96;
  Builder b(n);
  const BufferId x = b.buffer("x", 64);
  const GroupId pair = b.group({0, n - 1});
  b.op(0, 0, {W(x, 0, 64)});
  for (Rank r = 0; r < n; ++r) b.collective(r, 0, 0, {}, 4, OpKind::kAllReduce);
  b.host_sync(n - 1, 0);
  b.collective(n - 1, 1, pair, {});
  b.collective(0, 1, pair, {});
  b.op(0, 1, {R(x, 0, 64)});
  const CheckResult r = b.check();
  EXPECT_TRUE(r.clean());
  EXPECT_EQ(r.stats.collectives, 2u);
}

TEST(Race, RepeatsAreGroupedWithACount) {
  Builder b(2);
  for (int i = 0; i < 80; ++i) {
    const BufferId x = b.buffer("x" + std::to_string(i), 64);
    for (Rank r = 0; r < 2; ++r) {
      b.op(r, 0, {W(x, 0, 64)});
      b.op(r, 1, {R(x, 0, 64)});
    }
  }
  const CheckResult r = b.check();
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(r.groups[0].count, 160u);
  EXPECT_EQ(r.groups[0].ranks.size(), 2u);
}

// ---- uninitialized-read ----

TEST(Uninitialized, ReadOfFreshAllocationIsReported) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.alloc(0, 0, x);
  b.op(0, 0, {W(x, 0, 32)});
  b.op(0, 0, {R(x, 0, 64)});
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kUninitializedRead), 1u);
  EXPECT_EQ(total(r), 1u);
  EXPECT_EQ(r.groups[0].example.offset, 32u);
  EXPECT_EQ(r.groups[0].example.bytes, 32u);
  EXPECT_EQ(r.groups[0].example.first.kind, OpKind::kAlloc);
}

TEST(Uninitialized, FullyWrittenBufferIsClean) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.alloc(0, 0, x);
  b.op(0, 0, {W(x, 0, 32)});
  b.op(0, 0, {W(x, 32, 32)});
  b.op(0, 0, {R(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

TEST(Uninitialized, ANewAllocationForgetsEarlierWrites) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.alloc(0, 0, x);
  b.op(0, 0, {W(x, 0, 64)});
  b.free(0, 0, x);
  b.alloc(0, 0, x);
  b.op(0, 0, {R(x, 0, 64)});
  EXPECT_EQ(b.check().count(FindingKind::kUninitializedRead), 1u);
}

TEST(Uninitialized, AccessesInDifferentLifetimesNeverRace) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.alloc(0, 0, x);
  b.op(0, 0, {W(x, 0, 64)});
  b.free(0, 0, x);
  b.alloc(0, 1, x);
  b.op(0, 1, {W(x, 0, 64)});
  EXPECT_TRUE(b.check().clean());
}

// ---- stale-read ----

struct StaleFixture {
  Builder b{1};
  BufferId primary = b.buffer("u.primary", 64, BufferRole::kPrimary, 0);
  BufferId full = b.buffer("u.full", 128, BufferRole::kFull, 0);
  BufferId secondary = b.buffer("u.secondary", 64, BufferRole::kSecondary, 0);

  void gather_and_copy() {
    b.op(0, 0, {R(primary, 0, 64), W(full, 0, 128)});
    b.op(0, 0, {R(full, 0, 64), W(secondary, 0, 64)}, OpKind::kCopy,
         Purpose::kSecondaryPartitionCopy);
  }
  void optimizer() {
    b.op(0, 0, {R(primary, 0, 64), W(primary, 0, 64)}).purpose = Purpose::kOptimizerStep;
  }
  void read_secondary() { b.op(0, 0, {R(secondary, 0, 64), W(full, 0, 128)}); }
};

TEST(Stale, SecondaryReadAfterThePrimaryChangedIsReported) {
  StaleFixture s;
  s.b.op(0, 0, {W(s.primary, 0, 64)});
  s.gather_and_copy();
  s.optimizer();
  s.read_secondary();
  const CheckResult r = s.b.check();
  ASSERT_EQ(r.count(FindingKind::kStaleRead), 1u);
  EXPECT_EQ(total(r), 1u);
  EXPECT_EQ(r.groups[0].example.first.purpose, Purpose::kOptimizerStep);
}

TEST(Stale, InvalidatedAndRecopiedSecondaryIsClean) {
  StaleFixture s;
  s.b.op(0, 0, {W(s.primary, 0, 64)});
  s.gather_and_copy();
  s.optimizer();
  s.b.free(0, 0, s.secondary);
  s.b.alloc(0, 0, s.secondary);
  s.gather_and_copy();
  s.read_secondary();
  EXPECT_TRUE(s.b.check().clean());
}

// ---- a secondary rewritten with the data it holds ----

// DeepSpeed 0.13.4 copies into the secondary on every release. A copy that writes the data the
// secondary already holds changes no byte, so a read on another stream unordered with it is no
// race (and is counted apart); a copy of new data after the optimizer step, or into a freshly
// allocated secondary, races with the same read.
TEST(SameDataRewrite, AnUnorderedReadOfARewrittenSecondaryIsNoRace) {
  StaleFixture s;
  s.b.op(0, 0, {W(s.primary, 0, 64)});
  s.gather_and_copy();  // the secondary's data, written on S0
  const EventId copied = s.b.record(0, 0);
  s.b.wait(0, 1, copied);                 // S1 ordered after that copy
  s.gather_and_copy();                    // a release: the same data again, on S0
  s.b.op(0, 1, {R(s.secondary, 0, 64)});  // a gather on S1, unordered with it
  CheckResult r = s.b.check();
  EXPECT_TRUE(r.clean());
  EXPECT_EQ(r.stats.same_data_rewrites, 1u);
  EXPECT_NE(TextReporter().render_one(r).find("1 unordered pair left out: a secondary rewritten "
                                              "with the data it held"),
            std::string::npos);

  s.optimizer();                          // new weights
  s.gather_and_copy();                    // new data into the secondary
  s.b.op(0, 1, {R(s.secondary, 0, 64)});  // unordered with it: a race
  r = s.b.check();
  // Both S1 reads race with the copy of new data: the earlier one may see it (write after
  // read), the later one may miss it.
  EXPECT_EQ(r.count(FindingKind::kRace), 2u);
}

TEST(SameDataRewrite, AFreshSecondaryIsNeverARewrite) {
  StaleFixture s;
  s.b.op(0, 0, {W(s.primary, 0, 64)});
  s.gather_and_copy();
  const EventId copied = s.b.record(0, 0);
  s.b.wait(0, 1, copied);
  s.b.free(0, 0, s.secondary);  // invalidate_secondary_tensor
  s.b.alloc(0, 0, s.secondary);
  s.gather_and_copy();  // same version, but into a fresh allocation
  s.b.op(0, 1, {R(s.secondary, 0, 64)});
  const CheckResult r = s.b.check();
  EXPECT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(r.stats.same_data_rewrites, 0u);
}

TEST(Stale, OnlySecondaryShardsAreStale) {
  StaleFixture s;
  s.b.op(0, 0, {W(s.primary, 0, 64)});
  s.gather_and_copy();
  s.optimizer();
  s.b.op(0, 0, {R(s.full, 0, 128)});  // the old full parameter: not a stale-read
  EXPECT_TRUE(s.b.check().clean());
}

// ---- collective-mismatch ----

TEST(Mismatch, DifferentSizesAtOnePositionAreReported) {
  Builder b(2);
  b.collective(0, 0, 0, {}, 100);
  b.collective(1, 0, 0, {}, 200);
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kCollectiveMismatch), 1u);
  EXPECT_EQ(total(r), 1u);
  EXPECT_EQ(r.groups[0].example.group, "world");
  EXPECT_EQ(r.groups[0].example.position, 0u);
}

TEST(Mismatch, AMissingCollectiveIsAHang) {
  Builder b(2);
  const BufferId x = b.buffer("x", 64);
  b.op(0, kHostStream, {W(x, 0, 64)});
  b.collective(0, 0, 0, {});
  b.op(0, 0, {R(x, 0, 64)});  // blocked behind the collective until it is forced
  b.collective(1, 0, 0, {});
  b.collective(1, 0, 0, {});
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kCollectiveMismatch), 1u);
  EXPECT_EQ(total(r), 1u);
  EXPECT_EQ(r.groups[0].example.position, 1u);
}

TEST(Mismatch, CrossedOrderOnTwoGroupsDeadlocksButCheckingGoesOn) {
  Builder b(2);
  const GroupId g = b.group({0, 1});
  const BufferId x = b.buffer("x", 64);
  b.collective(0, 0, 0, {});
  b.op(0, 0, {});
  b.collective(0, 0, g, {});
  b.collective(1, 0, g, {});
  b.op(1, 0, {});
  b.collective(1, 0, 0, {});
  b.op(1, 0, {W(x, 0, 64)});
  b.op(1, 1, {R(x, 0, 64)});  // still checked after the hang
  const CheckResult r = b.check();
  EXPECT_GE(r.count(FindingKind::kCollectiveMismatch), 1u);
  EXPECT_EQ(r.count(FindingKind::kRace), 1u);
}

TEST(Mismatch, MatchingSequencesAreClean) {
  Builder b(4);
  const GroupId g = b.group({0, 1});
  for (Rank r = 0; r < 4; ++r) {
    b.collective(r, 0, 0, {}, 64);
    if (r < 2) b.collective(r, 1, g, {}, 32);
    b.collective(r, 0, 0, {}, 128, OpKind::kReduceScatter);
  }
  EXPECT_TRUE(b.check().clean());
}

// ---- malformed input ----

TEST(Malformed, WaitForAnUnrecordedEventThrows) {
  Builder b(1);
  b.wait(0, 0, 7);
  EXPECT_THROW(b.check(), std::invalid_argument);
}

TEST(Malformed, HostEventSyncOnAnUnrecordedEventThrows) {
  Builder b(1);
  b.host_event_sync(0, 3);
  EXPECT_THROW(b.check(), std::invalid_argument);
}

TEST(Malformed, AccessPastTheEndThrows) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 32, 64)});
  EXPECT_THROW(b.check(), std::invalid_argument);
}

// A recording of DeepSpeed with qgZ has 8 streams a rank (docs/record.md): the clock holds the
// host and up to kMaxThreads - 1 = 9 streams; the last of them still orders and races.
TEST(Streams, NineStreamsAreCheckedAndTenRefused) {
  Builder b(2);
  for (auto& rs : b.schedule().ranks) {
    while (rs.streams.size() < 9) rs.streams.push_back({"S" + std::to_string(rs.streams.size())});
  }
  const BufferId x = b.buffer("x", 256);
  const BufferId y = b.buffer("y", 256);
  b.op(0, 0, {W(x, 0, 256)});
  b.wait(0, 8, b.record(0, 0));
  b.op(0, 8, {R(x, 0, 256)});  // ordered by the event
  b.op(0, 7, {W(y, 0, 256)});
  b.op(0, 8, {R(y, 0, 256)});  // not ordered: a race between S7 and S8
  const CheckResult r = b.check();
  ASSERT_EQ(r.count(FindingKind::kRace), 1u);
  EXPECT_EQ(total(r), 1u);
  EXPECT_EQ(r.groups[0].example.first.stream, "S7");
  EXPECT_EQ(r.groups[0].example.second.stream, "S8");

  b.schedule().ranks[1].streams.push_back({"S9"});
  try {
    b.check();
    FAIL() << "ten streams were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("a rank has 10 streams, at most 9 supported"),
              std::string::npos)
        << e.what();
  }
}

// ---- reports ----

TEST(Report, FirstLineSaysCleanOrCounts) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.op(0, 0, {W(x, 0, 64)});
  const CheckResult clean = b.check();
  EXPECT_NE(TextReporter().render_one(clean).find("clean"), std::string::npos);
  b.op(0, 1, {R(x, 0, 64)});
  const std::string text = TextReporter().render_one(b.check());
  EXPECT_EQ(text.substr(0, text.find('\n')), "hand-built [test]: 1 finding: 1 race (1 group)");
  const CheckResult results[] = {b.check()};
  const std::string json = JsonReporter().render(results);
  EXPECT_NE(json.find("\"findings\""), std::string::npos);
  EXPECT_NE(json.find("\"kind\": \"race\""), std::string::npos);
}

TEST(Report, RankListsCollapseRangesAndStridesWhereShorter) {
  EXPECT_EQ(format_ranges({}), "none");
  EXPECT_EQ(format_ranges({0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 14, 15}), "0-7,9,12-15");
  EXPECT_EQ(format_ranges({3, 4}), "3-4");
  // Every other rank: the first two and the last where that is shorter, listed where not.
  std::set<int> every_other;
  for (int r = 64; r <= 126; r += 2) every_other.insert(r);
  EXPECT_EQ(format_ranges(every_other), "64,66,...,126");
  EXPECT_EQ(format_ranges({0, 2, 4, 6}), "0,2,4,6");
  // A strided run that is not shorter leaves the next range whole.
  EXPECT_EQ(format_ranges({0, 5, 10, 11, 12}), "0,5,10-12");
  std::set<int> mixed = {1, 2, 3};
  for (int r = 100; r <= 200; r += 10) mixed.insert(r);
  mixed.insert(201);
  EXPECT_EQ(format_ranges(mixed), "1-3,100,110,...,190,200-201");
  // 4 ranks in every 8 past 8,192, as the padding reads at 16,384 GPUs: one short line.
  std::set<int> blocks;
  for (int r = 8192; r < 16384; r += 8) {
    for (int j = 0; j < 4; ++j) blocks.insert(r + j);
  }
  EXPECT_EQ(format_ranges(blocks), "8192-8195,8200-8203,...,16376-16379");
  blocks.insert(16381);
  EXPECT_EQ(format_ranges(blocks), "8192-8195,8200-8203,...,16376-16379,16381");
}

TEST(Report, ARecordedOpIsNamedByItsLabelAndTheHeaderByItsDeepSpeed) {
  Builder b(1);
  const BufferId x = b.buffer("x", 64);
  b.schedule().labels = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp"};
  b.schedule().source = {{"deepspeed", "0.13.4"}, {"recorder", "hpzlab record"}};
  b.op(0, 0, {W(x, 0, 64)}).label = 0;
  b.op(0, 1, {R(x, 0, 64)}).label = 1;
  const CheckResult r = b.check();
  const std::string text = TextReporter().render_one(r);
  EXPECT_EQ(text.substr(0, text.find('\n')),
            "hand-built [test, DeepSpeed 0.13.4 recorded]: 1 finding: 1 race (1 group)");
  // The DeepSpeed builder's schedules name the version they were built for.
  b.schedule().source = {{"deepspeed", "0.13.4"}, {"builder", "deepspeed"}};
  const std::string built = TextReporter().render_one(b.check());
  EXPECT_EQ(built.substr(0, built.find('\n')),
            "hand-built [test, DeepSpeed 0.13.4 built]: 1 finding: 1 race (1 group)");
  b.schedule().source = {{"deepspeed", "0.13.4"}, {"recorder", "hpzlab record"}};
  EXPECT_NE(text.find("(step 0, layers.0.attn, forward, at model.layers.0.self_attn.q_proj)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("at model.layers.0.mlp"), std::string::npos) << text;
  const CheckResult results[] = {r};
  const std::string json = JsonReporter().render(results);
  EXPECT_NE(json.find("\"label\": \"model.layers.0.mlp\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"deepspeed\": \"0.13.4\""), std::string::npos) << json;
}

// ---- schedules read from files (tests/data/schedule/) ----

Schedule data_schedule(const std::string& name) {
  return read_schedule_file(test::source_dir() + "/tests/data/schedule/" + name);
}

// The host waits for the event recorded after the copy, so the read it issues afterwards on
// another stream is ordered after the copy; without the sync the two race.
TEST(ScheduleFile, AHostEventSyncOrdersTheCopyBeforeTheRead) {
  EXPECT_TRUE(check_schedule(data_schedule("host-event-sync.json")).clean());
  const CheckResult racy = check_schedule(data_schedule("host-event-sync-missing.json"));
  ASSERT_EQ(racy.count(FindingKind::kRace), 1u);
  EXPECT_EQ(racy.groups.size(), 1u);
  const Finding& f = racy.groups[0].example;
  EXPECT_EQ(f.first.kind, OpKind::kCopy);
  EXPECT_EQ(f.second.stream, "S1");
  EXPECT_EQ(f.buffer, "dst");
}

// What `hpzlab check --schedule FILE` does is what `hpzlab check SCENARIO` does: the schedule
// written to a file and read back gets the same verdict, finding for finding.
TEST(ScheduleFile, CheckingAWrittenScheduleEqualsCheckingTheScenario) {
  for (const char* variant : {"stock", "event-wait"}) {
    const Schedule built =
        build_schedule(load_scenario(test::scenario_path("tiny"), {{"run.variant", variant}}));
    const std::string path = ::testing::TempDir() + "hpzlab-check-" + variant + ".json";
    {
      std::ofstream out(path);
      out << schedule_to_json(built).dump();
    }
    const CheckResult direct = check_schedule(built);
    const CheckResult from_file = check_schedule(read_schedule_file(path));
    std::filesystem::remove(path);
    const CheckResult both[] = {direct};
    const CheckResult file[] = {from_file};
    EXPECT_EQ(JsonReporter().render(file), JsonReporter().render(both)) << variant;
    EXPECT_EQ(TextReporter().render(file), TextReporter().render(both)) << variant;
    EXPECT_EQ(from_file.stats.ops, direct.stats.ops);
    EXPECT_EQ(from_file.clean(), std::string(variant) != "stock");
  }
}

// ---- shipped scenarios ----

using test::scenario_path;

CheckResult check_scenario(const std::string& name, const std::vector<Override>& sets = {}) {
  return check_schedule(build_schedule(load_scenario(scenario_path(name), sets)));
}

std::vector<FindingKind> kinds_of(const CheckResult& r) {
  std::vector<FindingKind> out;
  for (FindingKind k : kAllKinds) {
    if (r.count(k) > 0) out.push_back(k);
  }
  return out;
}

class ModelScenario : public testing::TestWithParam<std::string> {};

TEST_P(ModelScenario, StockIsRacyOnTheSecondaryShard) {
  const CheckResult r = check_scenario(GetParam());
  EXPECT_EQ(kinds_of(r), std::vector<FindingKind>{FindingKind::kRace});
  bool secondary = false;
  for (const auto& g : r.groups) {
    secondary = secondary || (g.example.role == BufferRole::kSecondary &&
                              g.example.first.purpose == Purpose::kSecondaryPartitionCopy);
  }
  EXPECT_TRUE(secondary);
}

TEST_P(ModelScenario, BothFixesAreClean) {
  EXPECT_TRUE(check_scenario(GetParam(), {{"run.variant", "host-sync"}}).clean());
  EXPECT_TRUE(check_scenario(GetParam(), {{"run.variant", "event-wait"}}).clean());
}

TEST_P(ModelScenario, NoOverlapIsCleanWithoutAFix) {
  EXPECT_TRUE(check_scenario(GetParam(), {{"zero.overlap_comm", "false"}}).clean());
}

INSTANTIATE_TEST_SUITE_P(Shipped, ModelScenario,
                         testing::Values("tiny", "llama2-7b", "llama2-13b", "llama2-70b",
                                         "falcon-40b"));

TEST(BugScenario, EachIsReportedUnderItsOwnKindOnly) {
  const std::pair<const char*, FindingKind> cases[] = {
      {"stale-after-step", FindingKind::kStaleRead},
      {"stale-after-load", FindingKind::kStaleRead},
      {"zero-element-slice", FindingKind::kUninitializedRead},
      {"mismatched-collectives", FindingKind::kCollectiveMismatch},
  };
  for (const auto& [name, kind] : cases) {
    EXPECT_EQ(kinds_of(check_scenario(name)), std::vector<FindingKind>{kind}) << name;
  }
}

TEST(Golden, DefaultScenarioReport) {
  const CheckResult r = check_scenario("llama2-7b");
  CheckResult shown = r;
  shown.scenario = "scenarios/llama2-7b.toml";
  const std::string text = TextReporter().render_one(shown);
  const std::string golden_path = test::source_dir() + "/tests/golden/check-llama2-7b.txt";
  if (std::getenv("HPZLAB_UPDATE_GOLDEN")) std::ofstream(golden_path) << text;
  std::ifstream in(golden_path);
  ASSERT_TRUE(in) << "missing " << golden_path << " (run with HPZLAB_UPDATE_GOLDEN=1)";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(text, expected.str());
}

}  // namespace
}  // namespace hpz::check
