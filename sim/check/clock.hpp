// Vector clocks for the race checker, sized for a thousand ranks.
//
// A clock has one component per *thread* of every rank: thread 0 is the rank's host, thread
// 1 + s its stream s. Races are only ever between ops of one rank (each rank's ops list only its
// own bytes), so the checker compares only the components of the op's own rank: `Clock::own`, a
// small dense array. What a rank knows about other ranks matters only because it can come back:
// rank r's stream A starts a collective, rank m learns of it, m's later collective tells r's
// stream B. That remote knowledge is stored as a shared, immutable dense `ClockBase` (one tick per
// thread of every rank, built rarely: at world-sized rendezvous) plus a short sorted `delta` of
// the ranks that are known better than the base (an hpZ group's peers). Bases record which older
// bases they dominate, so most joins are a pointer comparison.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sim/schedule.hpp"

namespace hpz::check {

/** Most threads per rank: the host plus up to 7 streams. */
inline constexpr int kMaxThreads = 8;
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
  std::vector<Tick> ticks;               ///< rank * threads + thread
  std::vector<std::uint32_t> dominates;  ///< sorted ids of bases known to be <= this one
};

/** What one rank's thread knows about one other rank beyond the base. */
struct RemoteTicks {
  Rank rank = 0;
  RankTicks ticks{};
};

/** Knowledge about other ranks: a shared dense base and a few better-known ranks. */
struct Knowledge {
  const ClockBase* base = nullptr;
  std::vector<RemoteTicks> delta;  ///< sorted by rank, only entries that exceed the base
};

/** A thread's vector clock: its own rank densely, every other rank through Knowledge. */
struct Clock {
  RankTicks own{};
  Knowledge remote;
};

/** Creates and joins clock bases; every base lives as long as the arena. */
class ClockArena {
 public:
  /** `threads` components per rank, for `ranks` ranks. */
  ClockArena(int ranks, int threads);

  /** The base that knows nothing. */
  const ClockBase* zero() const { return bases_.front().get(); }
  /** Components per rank. */
  int threads() const { return threads_; }
  /** How many bases exist (a statistic for benchmarks). */
  std::size_t base_count() const { return bases_.size(); }

  /** What `k` knows about rank r's threads. */
  RankTicks ticks_of(const Knowledge& k, Rank r) const;
  /** into = max(into, from). */
  void join(Knowledge& into, const Knowledge& from);
  /** into = max(into, from), both own rank `self`: own parts by element, remote by join. */
  void join(Clock& into, const Clock& from);
  /** The element-wise maximum of many clocks of different ranks (a collective's rendezvous):
   *  each clock's remote knowledge plus its own part as rank `ranks[i]`. */
  Knowledge rendezvous(std::span<const Clock* const> clocks, std::span<const Rank> ranks);

 private:
  const ClockBase* join_bases(const ClockBase* a, const ClockBase* b);
  bool known_le(const ClockBase* a, const ClockBase* b) const;
  const ClockBase* make_base(std::vector<Tick> ticks, std::span<const ClockBase* const> parents);
  void absorb(std::vector<Tick>& dense, const Knowledge& k) const;
  void drop_covered(Knowledge& k) const;

  int ranks_;
  int threads_;
  std::vector<std::unique_ptr<ClockBase>> bases_;
  std::unordered_map<std::uint64_t, const ClockBase*> join_cache_;
};

}  // namespace hpz::check
