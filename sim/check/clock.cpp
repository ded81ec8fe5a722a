#include "sim/check/clock.hpp"

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
    throw std::invalid_argument("race checker: a rank has more than 7 streams");
  }
  make_base(std::vector<Tick>(static_cast<std::size_t>(ranks) * threads, 0), {});
}

RankTicks ClockArena::ticks_of(const Knowledge& k, Rank r) const {
  RankTicks out{};
  const Tick* row = k.base->ticks.data() + static_cast<std::size_t>(r) * threads_;
  std::copy(row, row + threads_, out.begin());
  auto it = std::lower_bound(k.delta.begin(), k.delta.end(), r,
                             [](const RemoteTicks& e, Rank x) { return e.rank < x; });
  if (it != k.delta.end() && it->rank == r) merge_ticks(out, it->ticks);
  return out;
}

bool ClockArena::known_le(const ClockBase* a, const ClockBase* b) const {
  return a == b || std::binary_search(b->dominates.begin(), b->dominates.end(), a->id);
}

const ClockBase* ClockArena::make_base(std::vector<Tick> ticks,
                                       std::span<const ClockBase* const> parents) {
  auto base = std::make_unique<ClockBase>();
  base->id = static_cast<std::uint32_t>(bases_.size());
  base->ticks = std::move(ticks);
  for (const ClockBase* p : parents) {
    std::vector<std::uint32_t> merged;
    merged.reserve(base->dominates.size() + p->dominates.size() + 1);
    std::set_union(base->dominates.begin(), base->dominates.end(), p->dominates.begin(),
                   p->dominates.end(), std::back_inserter(merged));
    auto at = std::lower_bound(merged.begin(), merged.end(), p->id);
    if (at == merged.end() || *at != p->id) merged.insert(at, p->id);
    base->dominates = std::move(merged);
  }
  bases_.push_back(std::move(base));
  return bases_.back().get();
}

const ClockBase* ClockArena::join_bases(const ClockBase* a, const ClockBase* b) {
  if (known_le(a, b)) return b;
  if (known_le(b, a)) return a;
  const std::uint64_t key = (std::uint64_t{std::min(a->id, b->id)} << 32) | std::max(a->id, b->id);
  if (auto it = join_cache_.find(key); it != join_cache_.end()) return it->second;
  std::vector<Tick> ticks = a->ticks;
  bool b_grew = false;
  bool a_grew = false;
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    if (b->ticks[i] > ticks[i]) {
      ticks[i] = b->ticks[i];
      a_grew = true;
    } else if (b->ticks[i] < ticks[i]) {
      b_grew = true;
    }
  }
  const ClockBase* result = nullptr;
  // Remember plain dominance on the larger base so the next join is a lookup.
  auto remember = [this](const ClockBase* small, const ClockBase* large) {
    auto& dom = bases_[large->id]->dominates;
    dom.insert(std::lower_bound(dom.begin(), dom.end(), small->id), small->id);
    return large;
  };
  if (!a_grew) {
    result = remember(b, a);
  } else if (!b_grew) {
    result = remember(a, b);
  } else {
    const ClockBase* parents[] = {a, b};
    result = make_base(std::move(ticks), parents);
  }
  join_cache_.emplace(key, result);
  return result;
}

void ClockArena::absorb(std::vector<Tick>& dense, const Knowledge& k) const {
  for (const RemoteTicks& e : k.delta) {
    Tick* row = dense.data() + static_cast<std::size_t>(e.rank) * threads_;
    for (int t = 0; t < threads_; ++t) row[t] = std::max(row[t], e.ticks[t]);
  }
}

void ClockArena::drop_covered(Knowledge& k) const {
  std::erase_if(k.delta, [&](const RemoteTicks& e) {
    const Tick* row = k.base->ticks.data() + static_cast<std::size_t>(e.rank) * threads_;
    for (int t = 0; t < threads_; ++t) {
      if (e.ticks[t] > row[t]) return false;
    }
    return true;
  });
}

void ClockArena::join(Knowledge& into, const Knowledge& from) {
  if (from.delta.empty() && known_le(from.base, into.base)) return;
  const ClockBase* base = join_bases(into.base, from.base);
  const bool base_changed = base != into.base || base != from.base;
  if (!from.delta.empty()) into.delta = merge_deltas(into.delta, from.delta);
  into.base = base;
  if (base_changed) drop_covered(into);
  if (into.delta.size() > kDeltaLimit) {
    std::vector<Tick> dense = base->ticks;
    absorb(dense, into);
    const ClockBase* parents[] = {base};
    into.base = make_base(std::move(dense), parents);
    into.delta.clear();
  }
}

void ClockArena::join(Clock& into, const Clock& from) {
  merge_ticks(into.own, from.own);
  join(into.remote, from.remote);
}

Knowledge ClockArena::rendezvous(std::span<const Clock* const> clocks, std::span<const Rank> ranks) {
  assert(clocks.size() == ranks.size());
  // The distinct bases that no other distinct base is known to dominate.
  std::vector<const ClockBase*> bases;
  std::size_t entries = clocks.size();
  for (const Clock* c : clocks) {
    entries += c->remote.delta.size();
    if (std::find(bases.begin(), bases.end(), c->remote.base) == bases.end()) {
      bases.push_back(c->remote.base);
    }
  }
  std::erase_if(bases, [&](const ClockBase* b) {
    return std::any_of(bases.begin(), bases.end(),
                       [&](const ClockBase* o) { return o != b && known_le(b, o); });
  });
  Knowledge out;
  if (entries <= kDeltaLimit) {
    out.base = bases.front();
    for (std::size_t i = 1; i < bases.size(); ++i) out.base = join_bases(out.base, bases[i]);
    for (std::size_t i = 0; i < clocks.size(); ++i) {
      std::vector<RemoteTicks> own{RemoteTicks{ranks[i], clocks[i]->own}};
      out.delta = merge_deltas(out.delta, clocks[i]->remote.delta);
      out.delta = merge_deltas(out.delta, own);
    }
    drop_covered(out);
    return out;
  }
  // A large group: one dense pass is cheaper than merging a thousand deltas.
  std::vector<Tick> dense = bases.front()->ticks;
  for (std::size_t b = 1; b < bases.size(); ++b) {
    for (std::size_t i = 0; i < dense.size(); ++i) dense[i] = std::max(dense[i], bases[b]->ticks[i]);
  }
  for (std::size_t i = 0; i < clocks.size(); ++i) {
    absorb(dense, clocks[i]->remote);
    Tick* row = dense.data() + static_cast<std::size_t>(ranks[i]) * threads_;
    for (int t = 0; t < threads_; ++t) row[t] = std::max(row[t], clocks[i]->own[t]);
  }
  out.base = make_base(std::move(dense), bases);
  return out;
}

}  // namespace hpz::check
