// Vector clocks for the race checker, sized for a thousand ranks.
//
// A clock has one component per *thread* of every rank: thread 0 is the rank's host, thread
// 1 + s its stream s. Races are only ever between ops of one rank (each rank's ops list only its
// own bytes), so the checker compares only the components of the op's own rank: `Clock::own`, a
// small dense array. What a rank knows about other ranks matters only because it can come back:
// rank r's stream A starts a collective, rank m learns of it, m's later collective tells r's
// stream B. That remote knowledge is stored as a shared, immutable dense `ClockBase` (one tick per
// thread of every rank, built rarely: at large rendezvous) plus a short sorted `delta` of the
// ranks that are known better than the bases (an hpZ group's peers). A Knowledge holds a few
// bases (the latest world rendezvous, one per inter-node group); base comparisons are computed
// once per pair and cached, so most joins are pointer comparisons.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sim/ir/schedule.hpp"

namespace hpz::check {

/** Most threads per rank: the host plus up to 9 streams. A recording of DeepSpeed with qgZ has
 *  8 (compute, all-gather, reduce-scatter, and one NCCL stream for each of the world group, its
 *  clone, the hpZ group, qgZ's intra-node and inter-node groups), and one is spare. */
inline constexpr int kMaxThreads = 10;
/** A logical time on one thread; 0 means "nothing known". */
using Tick = std::uint32_t;
/** The components of one rank's threads. */
using RankTicks = std::array<Tick, kMaxThreads>;

/** Element-wise maximum, in place; true when `into` changed. */
bool merge_ticks(RankTicks& into, const RankTicks& from);
/** True when every component of a is <= the same component of b. */
bool ticks_le(const RankTicks& a, const RankTicks& b);

/** Dense knowledge about every rank; immutable once built, owned by a ClockArena. */
struct ClockBase {
  std::uint32_t id = 0;
  std::vector<Tick> ticks;  ///< rank * threads + thread
};

/** What one rank's thread knows about one other rank beyond the bases. */
struct RemoteTicks {
  Rank rank = 0;
  RankTicks ticks{};
};

/** Most bases one Knowledge holds before they are folded into a new one: enough for the latest
 *  world rendezvous plus one base per inter-node group. */
inline constexpr int kMaxBases = 12;

/** Knowledge about other ranks: the maximum of a few shared dense bases (none dominating
 *  another, as far as the arena knows) and a short list of better-known ranks. */
struct Knowledge {
  std::array<const ClockBase*, kMaxBases> bases{};
  std::uint8_t base_count = 0;
  std::vector<RemoteTicks> delta;  ///< sorted by rank, only entries that exceed the bases
};

/** A thread's vector clock: its own rank densely, every other rank through Knowledge. */
struct Clock {
  RankTicks own{};
  Knowledge remote;
};

/** Creates and compares clock bases; every base lives as long as the arena. */
class ClockArena {
 public:
  /** `threads` components per rank, for `ranks` ranks. */
  ClockArena(int ranks, int threads);

  /** Components per rank. */
  int threads() const { return threads_; }
  /** How many bases exist (a statistic for benchmarks). */
  std::size_t base_count() const { return bases_.size(); }

  /** What `k` knows about rank r's threads. */
  RankTicks ticks_of(const Knowledge& k, Rank r) const;
  /** into = max(into, from). */
  void join(Knowledge& into, const Knowledge& from);
  /** into = max(into, from), both of one rank: own parts by element, remote by join. */
  void join(Clock& into, const Clock& from);
  /** The element-wise maximum of many clocks of different ranks (a collective's rendezvous):
   *  each clock's remote knowledge plus its own part as rank `ranks[i]`. */
  Knowledge rendezvous(std::span<const Clock* const> clocks, std::span<const Rank> ranks);

 private:
  bool base_le(const ClockBase* a, const ClockBase* b);
  void add_base(Knowledge& k, const ClockBase* b);
  const ClockBase* make_base(std::vector<Tick> ticks);
  std::vector<Tick> dense(const Knowledge& k) const;
  void fold(Knowledge& k);
  void drop_covered(Knowledge& k) const;

  int ranks_;
  int threads_;
  std::vector<std::unique_ptr<ClockBase>> bases_;
  std::unordered_map<std::uint64_t, bool> le_cache_;  ///< (a, b) -> a <= b, element-wise
};

}  // namespace hpz::check
