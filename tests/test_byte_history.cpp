// The checker's byte history: a strided read kept as one entry gives the answers its slices
// give one by one, on random access sequences, and keeps a gather's flat buffer in a few
// segments where its slices would split it once per rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "sim/check/byte_history.hpp"

namespace hpz::check {
namespace {

struct Reported {
  std::vector<std::pair<std::uint32_t, AccessMode>> priors;  // in order of first report
  std::map<std::uint32_t, std::vector<ByteRange>> ranges;    // every range reported per prior
  bool unwritten = false;
  std::uint64_t unwritten_lo = 0;
  std::uint64_t unwritten_hi = 0;
};

// True when every byte of r is in one of p's slices.
bool inside(ByteRange r, const Slices& p) {
  for (std::uint64_t at = r.lo; at < r.hi;) {
    const ByteRange s = first_piece(p, at, r.hi);
    if (s.empty() || s.lo != at) return false;
    at = s.hi;
  }
  return true;
}

// One access, either slice by slice or strided; `ordered` is a function of the prior op and
// this one, the same for both histories.
Reported run(ByteHistory& h, const Slices& p, AccessMode mode, AccessStamp stamp, bool sliced) {
  Reported out;
  auto ordered = [&](const AccessStamp& prior) {
    return ((prior.op * 2654435761u) ^ (stamp.op * 40503u)) % 3 == 0;
  };
  auto conflict = [&](const AccessStamp& prior, AccessMode m, std::uint64_t lo, std::uint64_t hi) {
    const auto key = std::make_pair(prior.op, m);
    bool seen = false;
    for (const auto& k : out.priors) seen = seen || k == key;
    if (!seen) out.priors.push_back(key);
    out.ranges[prior.op].push_back({lo, hi});
  };
  auto unwritten = [&](std::uint64_t lo, std::uint64_t hi) {
    if (!out.unwritten) out.unwritten_lo = lo;
    out.unwritten = true;
    out.unwritten_hi = hi;
  };
  if (sliced) {
    for (std::uint64_t i = 0; i < p.count; ++i) {
      const std::uint64_t b = p.offset + i * p.stride;
      h.access(b, b + p.bytes, mode, stamp, ordered, conflict, unwritten);
    }
  } else {
    h.access(p, mode, stamp, ordered, conflict, unwritten);
  }
  return out;
}

TEST(ByteHistory, AStridedReadAnswersAsItsSlicesOneByOne) {
  std::mt19937_64 rng(20261125);
  constexpr std::uint64_t kSize = 64;
  int strided_reads = 0;
  for (int trial = 0; trial < 400; ++trial) {
    ByteHistory sliced, strided;
    sliced.reset(kSize);
    strided.reset(kSize);
    std::map<std::uint32_t, std::pair<Slices, AccessMode>> done;  // what each op accessed
    std::vector<Tick> ticks(3, 0);
    for (std::uint32_t op = 0; op < 40; ++op) {
      Slices p;
      p.count = static_cast<std::uint32_t>(1 + rng() % 5);
      p.bytes = 1 + rng() % 8;
      p.stride = p.count > 1 ? p.bytes + rng() % 12 : 0;
      const std::uint64_t span = p.end() - p.offset;
      if (span > kSize) continue;
      p.offset = rng() % (kSize - span + 1);
      const AccessMode mode = rng() % 4 == 0 ? AccessMode::kWrite : AccessMode::kRead;
      const auto thread = static_cast<std::uint8_t>(rng() % 3);
      const AccessStamp stamp{op, ++ticks[thread], thread};
      if (mode == AccessMode::kRead && p.count > 1) ++strided_reads;
      const Reported a = run(sliced, p, mode, stamp, true);
      const Reported b = run(strided, p, mode, stamp, false);
      ASSERT_EQ(std::set(a.priors.begin(), a.priors.end()),
                std::set(b.priors.begin(), b.priors.end()))
          << "trial " << trial << " op " << op;
      ASSERT_EQ(a.unwritten, b.unwritten) << "trial " << trial << " op " << op;
      if (a.unwritten) {
        EXPECT_EQ(a.unwritten_lo, b.unwritten_lo);
        EXPECT_EQ(a.unwritten_hi, b.unwritten_hi);
      }
      // Every range reported is bytes both accesses touched.
      for (const auto& [prior, ranges] : b.ranges) {
        for (const ByteRange& r : ranges) {
          ASSERT_FALSE(r.empty());
          EXPECT_TRUE(inside(r, p)) << "trial " << trial << " op " << op;
          EXPECT_TRUE(inside(r, done.at(prior).first)) << "trial " << trial << " op " << op;
        }
      }
      done[op] = {p, mode};
    }
  }
  EXPECT_GT(strided_reads, 1000);  // the sequences did exercise strided reads
}

// A coalesced gather's flat buffer at 1,024 ranks: written whole by the collective, then four
// parameters each read back with one slice per rank. Slice by slice that is 4 x 1,024 pieces.
TEST(ByteHistory, AGathersFlatBufferStaysInAFewSegments) {
  constexpr std::uint64_t kRanks = 1024;
  const std::vector<std::uint64_t> chunk = {64, 16, 16, 256};
  const std::uint64_t partition = 64 + 16 + 16 + 256;
  auto never = [](const AccessStamp&) { return false; };
  int conflicts = 0;
  auto count = [&](const AccessStamp&, AccessMode, std::uint64_t, std::uint64_t) { ++conflicts; };
  auto none = [](std::uint64_t, std::uint64_t) {};
  for (const bool sliced : {false, true}) {
    ByteHistory h;
    h.reset(partition * kRanks);
    h.access(0, partition * kRanks, AccessMode::kWrite, {0, 1, 1}, never, count, none);
    std::uint64_t offset = 0;
    for (std::uint32_t i = 0; i < chunk.size(); ++i) {
      const Slices p{offset, chunk[i], partition, static_cast<std::uint32_t>(kRanks)};
      conflicts = 0;
      (void)run(h, p, AccessMode::kRead, {i + 1, i + 1, 2}, sliced);
      offset += chunk[i];
    }
    if (sliced) {
      EXPECT_GT(h.segment_count(), 4 * kRanks - 1);
    } else {
      EXPECT_LE(h.segment_count(), 2 * chunk.size() + 1);
    }
  }
  // The reads conflict with the unordered write once per parameter, not once per slice: the
  // checker reports one race per pair of ops.
  ByteHistory h;
  h.reset(partition * kRanks);
  h.access(0, partition * kRanks, AccessMode::kWrite, {0, 1, 1}, never, count, none);
  conflicts = 0;
  h.access(Slices{0, 64, partition, static_cast<std::uint32_t>(kRanks)}, AccessMode::kRead,
           {1, 1, 2}, never, count, none);
  EXPECT_EQ(conflicts, 1);
}

TEST(ByteHistory, PiecesOfSlices) {
  const Slices p{10, 4, 10, 3};  // [10,14) [20,24) [30,34)
  EXPECT_EQ(p.end(), 34u);
  const ByteRange a = first_piece(p, 0, 100);
  EXPECT_EQ(a.lo, 10u);
  EXPECT_EQ(a.hi, 14u);
  const ByteRange b = first_piece(p, 14, 100);  // in the gap after the first slice
  EXPECT_EQ(b.lo, 20u);
  const ByteRange c = first_piece(p, 22, 31);
  EXPECT_EQ(c.lo, 22u);
  EXPECT_EQ(c.hi, 24u);
  EXPECT_TRUE(first_piece(p, 24, 30).empty());
  EXPECT_TRUE(first_piece(p, 34, 40).empty());
  const ByteRange d = last_piece(p, 0, 31);
  EXPECT_EQ(d.lo, 30u);
  EXPECT_EQ(d.hi, 31u);
  EXPECT_TRUE(last_piece(p, 14, 20).empty());
  EXPECT_TRUE(disjoint_in(p, Slices{14, 6, 10, 3}, 0, 100));
  EXPECT_FALSE(disjoint_in(p, Slices{13, 6, 10, 3}, 0, 100));
  EXPECT_TRUE(disjoint_in(p, Slices{13, 6, 10, 3}, 14, 20));  // they meet outside [14, 20)
  EXPECT_FALSE(disjoint_in(p, Slices{31, 2, 0, 1}, 0, 100));
}

}  // namespace
}  // namespace hpz::check
