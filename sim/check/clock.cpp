#include "sim/check/clock.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <stdexcept>

namespace hpz::check {
namespace {

// Past this many better-known ranks a Knowledge is folded into a new dense base: deltas are
// copied at every join, a base once per rendezvous.
constexpr std::size_t kDeltaLimit = 48;

std::vector<RemoteTicks> merge_deltas(const std::vector<RemoteTicks>& a,
                                      const std::vector<RemoteTicks>& b) {
  std::vector<RemoteTicks> out;
  out.reserve(a.size() + b.size());
  auto ia = a.begin();
  auto ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->rank < ib->rank)) {
      out.push_back(*ia++);
    } else if (ia == a.end() || ib->rank < ia->rank) {
      out.push_back(*ib++);
    } else {
      out.push_back(*ia++);
      merge_ticks(out.back().ticks, ib++->ticks);
    }
  }
  return out;
}

}  // namespace

bool merge_ticks(RankTicks& into, const RankTicks& from) {
  bool changed = false;
  for (int t = 0; t < kMaxThreads; ++t) {
    if (from[t] > into[t]) {
      into[t] = from[t];
      changed = true;
    }
  }
  return changed;
}

bool ticks_le(const RankTicks& a, const RankTicks& b) {
  for (int t = 0; t < kMaxThreads; ++t) {
    if (a[t] > b[t]) return false;
  }
  return true;
}

ClockArena::ClockArena(int ranks, int threads) : ranks_(ranks), threads_(threads) {
  if (threads < 1 || threads > kMaxThreads) {
    throw std::invalid_argument(
        fmt::format("race checker: a rank has more than {} streams", kMaxThreads - 1));
  }
}

RankTicks ClockArena::ticks_of(const Knowledge& k, Rank r) const {
  RankTicks out{};
  const std::size_t at = static_cast<std::size_t>(r) * threads_;
  for (int i = 0; i < k.base_count; ++i) {
    const Tick* row = k.bases[i]->ticks.data() + at;
    for (int t = 0; t < threads_; ++t) out[t] = std::max(out[t], row[t]);
  }
  auto it = std::lower_bound(k.delta.begin(), k.delta.end(), r,
                             [](const RemoteTicks& e, Rank x) { return e.rank < x; });
  if (it != k.delta.end() && it->rank == r) merge_ticks(out, it->ticks);
  return out;
}

bool ClockArena::base_le(const ClockBase* a, const ClockBase* b) {
  if (a == b) return true;
  const std::uint64_t key = (std::uint64_t{a->id} << 32) | b->id;
  if (auto it = le_cache_.find(key); it != le_cache_.end()) return it->second;
  bool le = true;
  for (std::size_t i = 0; i < a->ticks.size() && le; ++i) le = a->ticks[i] <= b->ticks[i];
  le_cache_.emplace(key, le);
  return le;
}

const ClockBase* ClockArena::make_base(std::vector<Tick> ticks) {
  auto base = std::make_unique<ClockBase>();
  base->id = static_cast<std::uint32_t>(bases_.size());
  base->ticks = std::move(ticks);
  bases_.push_back(std::move(base));
  return bases_.back().get();
}

std::vector<Tick> ClockArena::dense(const Knowledge& k) const {
  std::vector<Tick> out(static_cast<std::size_t>(ranks_) * threads_, 0);
  for (int i = 0; i < k.base_count; ++i) {
    const std::vector<Tick>& b = k.bases[i]->ticks;
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = std::max(out[j], b[j]);
  }
  for (const RemoteTicks& e : k.delta) {
    Tick* row = out.data() + static_cast<std::size_t>(e.rank) * threads_;
    for (int t = 0; t < threads_; ++t) row[t] = std::max(row[t], e.ticks[t]);
  }
  return out;
}

// Folds every base and the delta into one new base.
void ClockArena::fold(Knowledge& k) {
  const ClockBase* b = make_base(dense(k));
  k.bases[0] = b;
  k.base_count = 1;
  k.delta.clear();
}

// Adds b unless a held base dominates it; drops held bases b dominates. May overflow into
// kMaxBases + 1 pending bases: the caller folds then.
void ClockArena::add_base(Knowledge& k, const ClockBase* b) {
  for (int i = 0; i < k.base_count; ++i) {
    if (base_le(b, k.bases[i])) return;
  }
  int out = 0;
  for (int i = 0; i < k.base_count; ++i) {
    if (!base_le(k.bases[i], b)) k.bases[out++] = k.bases[i];
  }
  k.base_count = static_cast<std::uint8_t>(out);
  if (k.base_count == kMaxBases) {
    // Full: fold what is held, then keep the new one beside it.
    fold(k);
  }
  k.bases[k.base_count++] = b;
}

void ClockArena::drop_covered(Knowledge& k) const {
  if (k.base_count == 0) return;
  std::erase_if(k.delta, [&](const RemoteTicks& e) {
    const std::size_t at = static_cast<std::size_t>(e.rank) * threads_;
    for (int t = 0; t < threads_; ++t) {
      bool covered = false;
      for (int i = 0; i < k.base_count && !covered; ++i) {
        covered = e.ticks[t] <= k.bases[i]->ticks[at + t];
      }
      if (!covered) return false;
    }
    return true;
  });
}

void ClockArena::join(Knowledge& into, const Knowledge& from) {
  bool bases_changed = false;
  for (int i = 0; i < from.base_count; ++i) {
    const ClockBase* b = from.bases[i];
    if (std::find(into.bases.begin(), into.bases.begin() + into.base_count, b) !=
        into.bases.begin() + into.base_count) {
      continue;
    }
    add_base(into, b);
    bases_changed = true;
  }
  if (!from.delta.empty()) into.delta = merge_deltas(into.delta, from.delta);
  if (bases_changed) drop_covered(into);
  if (into.delta.size() > kDeltaLimit) fold(into);
}

void ClockArena::join(Clock& into, const Clock& from) {
  merge_ticks(into.own, from.own);
  join(into.remote, from.remote);
}

Knowledge ClockArena::rendezvous(std::span<const Clock* const> clocks,
                                 std::span<const Rank> ranks) {
  assert(clocks.size() == ranks.size());
  Knowledge out;
  if (clocks.size() <= kDeltaLimit) {
    // A small group (hpZ, one node): members mostly know the same few ranks, so the merged
    // delta stays short; fold only if it does not.
    for (std::size_t i = 0; i < clocks.size(); ++i) {
      for (int b = 0; b < clocks[i]->remote.base_count; ++b) {
        const ClockBase* base = clocks[i]->remote.bases[b];
        if (std::find(out.bases.begin(), out.bases.begin() + out.base_count, base) ==
            out.bases.begin() + out.base_count) {
          add_base(out, base);
        }
      }
      std::vector<RemoteTicks> own{RemoteTicks{ranks[i], clocks[i]->own}};
      out.delta = merge_deltas(out.delta, clocks[i]->remote.delta);
      out.delta = merge_deltas(out.delta, own);
    }
    drop_covered(out);
    if (out.delta.size() > kDeltaLimit) fold(out);
    return out;
  }
  // A large group: one dense pass over the distinct bases, then every member's delta and own.
  std::vector<const ClockBase*> seen;
  std::vector<Tick> ticks(static_cast<std::size_t>(ranks_) * threads_, 0);
  for (std::size_t i = 0; i < clocks.size(); ++i) {
    const Knowledge& k = clocks[i]->remote;
    for (int b = 0; b < k.base_count; ++b) {
      if (std::find(seen.begin(), seen.end(), k.bases[b]) != seen.end()) continue;
      seen.push_back(k.bases[b]);
      const std::vector<Tick>& src = k.bases[b]->ticks;
      for (std::size_t j = 0; j < ticks.size(); ++j) ticks[j] = std::max(ticks[j], src[j]);
    }
    for (const RemoteTicks& e : k.delta) {
      Tick* row = ticks.data() + static_cast<std::size_t>(e.rank) * threads_;
      for (int t = 0; t < threads_; ++t) row[t] = std::max(row[t], e.ticks[t]);
    }
    Tick* row = ticks.data() + static_cast<std::size_t>(ranks[i]) * threads_;
    for (int t = 0; t < threads_; ++t) row[t] = std::max(row[t], clocks[i]->own[t]);
  }
  out.bases[0] = make_base(std::move(ticks));
  out.base_count = 1;
  return out;
}

}  // namespace hpz::check
