#include "sim/check/symmetric_world.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "sim/check/checker.hpp"

namespace hpz::check {
namespace {

enum class Shape : std::uint8_t { kWorld, kBlock, kColumn };

/** A group's place in the chain of sizes: the world, a block of `level` contiguous ranks
 *  starting at a multiple of it, or a column of ranks `level` apart starting below it. */
struct GroupShape {
  Shape shape = Shape::kWorld;
  int level = 0;
};

bool ascending(const std::vector<Rank>& m, int n) {
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i] < 0 || m[i] >= n || (i > 0 && m[i] <= m[i - 1])) return false;
  }
  return true;
}

std::optional<GroupShape> shape_of(const Group& g, int n) {
  const std::vector<Rank>& m = g.ranks;
  const int size = static_cast<int>(m.size());
  if (size == 0 || n % size != 0 || !ascending(m, n)) return std::nullopt;
  if (size == n) return GroupShape{Shape::kWorld, n};
  if (m.back() - m.front() + 1 == size && m.front() % size == 0) {
    return GroupShape{Shape::kBlock, size};
  }
  const int stride = m[1] - m[0];  // size >= 2 here: a block of one is caught above
  if (stride * size != n || m[0] >= stride) return std::nullopt;
  for (int i = 0; i < size; ++i) {
    if (m[static_cast<std::size_t>(i)] != m[0] + i * stride) return std::nullopt;
  }
  return GroupShape{Shape::kColumn, stride};
}

/** The groups' families: groups of one kind and shape, each holding its own ranks, the k-th
 *  of several with the same members (DeepSpeed's world group and its clone) apart. */
struct Families {
  std::vector<int> family;                  ///< per group
  std::vector<std::vector<GroupId>> owner;  ///< per family, per rank: its group, or kNoGroup
};

struct Reason {
  std::string* why;
  std::nullopt_t operator()(std::string text) const {
    if (why != nullptr) *why = std::move(text);
    return std::nullopt;
  }
};

/** The chain's levels and each group's free digits, or the reason there is none. */
std::optional<std::vector<GroupShape>> shapes(const Schedule& s, std::vector<int>& levels,
                                              const Reason& no) {
  const int n = static_cast<int>(s.ranks.size());
  std::vector<GroupShape> out;
  std::set<int> chain = {1, n};
  for (const Group& g : s.groups) {
    const std::optional<GroupShape> sh = shape_of(g, n);
    if (!sh) {
      no(fmt::format("group {} is neither the world, a block of contiguous ranks nor a column",
                     g.name));
      return std::nullopt;
    }
    if (sh->shape != Shape::kWorld) chain.insert(sh->level);
    out.push_back(*sh);
  }
  levels.assign(chain.begin(), chain.end());
  for (std::size_t i = 1; i < levels.size(); ++i) {
    if (levels[i] % levels[i - 1] != 0) {
      no(fmt::format("the groups' sizes {} and {} do not nest", levels[i - 1], levels[i]));
      return std::nullopt;
    }
  }
  return out;
}

std::optional<Families> families(const Schedule& s, const std::vector<GroupShape>& sh,
                                 const Reason& no) {
  const int n = static_cast<int>(s.ranks.size());
  Families f;
  std::map<std::tuple<int, int, int, Rank>, int> seen;  // the k-th group of these members
  std::map<std::tuple<int, int, int, int>, int> index;  // (kind, shape, level, k) -> family
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const Group& grp = s.groups[g];
    const int kind = static_cast<int>(grp.kind);
    const int shape = static_cast<int>(sh[g].shape);
    const int k = seen[{kind, shape, sh[g].level, grp.ranks.front()}]++;
    const auto [it, fresh] =
        index.try_emplace({kind, shape, sh[g].level, k}, static_cast<int>(f.owner.size()));
    if (fresh) f.owner.emplace_back(static_cast<std::size_t>(n), kNoGroup);
    f.family.push_back(it->second);
    std::vector<GroupId>& owner = f.owner[static_cast<std::size_t>(it->second)];
    for (const Rank r : grp.ranks) owner[static_cast<std::size_t>(r)] = static_cast<GroupId>(g);
  }
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const std::vector<GroupId>& owner = f.owner[static_cast<std::size_t>(f.family[g])];
    if (std::count(owner.begin(), owner.end(), kNoGroup) != 0) {
      no(fmt::format("the groups like {} leave some ranks out", s.groups[g].name));
      return std::nullopt;
    }
  }
  return f;
}

/** Whether an op leaves every clock as it was: a kernel, copy or (de)quantization on a device
 *  stream (Checker::run_work) only has its accesses checked, under the clock its stream already
 *  has; the host's knowledge it takes in, the stream's next op that orders anything takes in
 *  too. */
bool moves_no_clock(const Op& op) {
  return op.stream != kHostStream && op.group == kNoGroup &&
         (op.kind == OpKind::kKernel || op.kind == OpKind::kCopy || op.kind == OpKind::kQuantize ||
          op.kind == OpKind::kDequantize);
}

/** The host stream syncs of `ops` that order nothing the list does not order without them
 *  (rank 0's per-parameter sync of a checkpoint load: run.load = "pretrained"). A sync of stream
 *  s gives the host s's clock after p, s's last op before it; every op on a device stream t
 *  then takes in the host's clock (Checker::absorb_host). It adds nothing when each such op up
 *  to the point where the host learns that clock anyway (its next sync of s, a device sync, or
 *  an event sync of a record that knows p) is on a stream that already knows p by this rank's
 *  own edges: t is s, or t waited for an event recorded on a stream that knew p. Every stream's
 *  clock is then the same with the sync as without it (up to the sync's own ticks), on every
 *  rank and in any world, so removing it changes no happens-before: it orders nothing, as work
 *  that moves no clock does. The host's own clock differs until then; it reaches other ranks
 *  only through the streams, but a host op that touches bytes there, or any use of the caching
 *  allocator (which asks what the host knows), keeps the sync all the same (cautious: not needed
 *  by the argument). `allocator`: Schedule::allocator. Marks are per op of the list. */
std::vector<char> redundant_syncs(const OpList& ops, std::size_t streams, bool allocator) {
  const std::size_t n = ops.size();
  std::vector<char> out(n, 0);
  if (allocator) return out;
  std::vector<char> knows(streams);
  std::unordered_set<EventId> recorded;  // events recorded since the sync (their streams knew p)
  for (std::size_t i = 0; i < n; ++i) {
    const Op& sync = ops.stored(i);
    if (sync.kind != OpKind::kHostStreamSync || sync.stream < 0 ||  // kHostStream is -1
        static_cast<std::size_t>(sync.stream) >= streams) {
      continue;
    }
    std::fill(knows.begin(), knows.end(), 0);
    knows[static_cast<std::size_t>(sync.stream)] = 1;
    recorded.clear();
    bool redundant = true;
    for (std::size_t j = i + 1; j < n && redundant; ++j) {
      const Op& op = ops.stored(j);
      if (op.kind == OpKind::kHostDeviceSync) break;
      if (op.stream == kHostStream) {
        if (op.kind == OpKind::kHostEventSync) {
          if (recorded.contains(op.event)) break;
          continue;
        }
        // A host op that touches bytes does so under the host's clock.
        if (op.access_count > 0 && !is_ordering(op.kind)) redundant = false;
        continue;
      }
      if (op.stream < 0 || static_cast<std::size_t>(op.stream) >= streams) {
        redundant = false;  // malformed: the checker says so, rank by rank
        break;
      }
      const auto t = static_cast<std::size_t>(op.stream);
      if (op.kind == OpKind::kStreamWaitEvent) {
        // The wait takes in the host's clock (absorb_host), then the event's, and touches no
        // bytes: t's clock after it is the same either way when t or the event knew p.
        if (knows[t] == 0 && !recorded.contains(op.event)) redundant = false;
        knows[t] = 1;
        continue;
      }
      if (knows[t] == 0) {
        redundant = false;
        break;
      }
      if (op.kind == OpKind::kEventRecord) recorded.insert(op.event);  // t knows p
      if (op.kind == OpKind::kHostStreamSync && op.stream == sync.stream) break;
    }
    out[i] = redundant ? 1 : 0;
  }
  return out;
}

/** An op list found to order its ops as rank 0's does: the first rank that issues it (others
 *  share its copy: OpList::shares_with) and the groups its shared copy names, each once. */
struct Pattern {
  Rank rank = 0;
  std::vector<GroupId> stored_groups;
};

/** Checks (and collects) the groups `ops`' shared copy names; false on a group that is none. */
bool stored_groups_of(const Schedule& s, const OpList& ops, std::vector<GroupId>& out) {
  const auto groups = static_cast<GroupId>(s.groups.size());
  std::vector<char> named(s.groups.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const GroupId c = ops.stored(i).group;
    if (c == kNoGroup) continue;
    const GroupId g0 = ops.own_group(c);
    if (c < 0 || c >= groups || g0 < 0 || g0 >= groups) return false;
    if (named[static_cast<std::size_t>(c)] == 0) out.push_back(c);
    named[static_cast<std::size_t>(c)] = 1;
  }
  return true;
}

/** True when rank r orders its ops as rank 0 does: the same ops but those that move no clock
 *  (moves_no_clock), each on its own group of the same family. A list seen before (`patterns`)
 *  costs a look at its groups; a new one is compared op by op, and kept. */
bool orders_alike(const Schedule& s, Rank r, const Families& f, std::vector<Pattern>& patterns,
                  const std::vector<char>& rank0_syncs) {
  const OpList& o = s.ranks[static_cast<std::size_t>(r)].ops;
  const auto expected = [&](GroupId g0) {
    return f.owner[static_cast<std::size_t>(f.family[static_cast<std::size_t>(g0)])]
                  [static_cast<std::size_t>(r)];
  };
  for (const Pattern& p : patterns) {
    const OpList& t = s.ranks[static_cast<std::size_t>(p.rank)].ops;
    if (!o.shares_with(t)) continue;
    return std::all_of(p.stored_groups.begin(), p.stored_groups.end(),
                       [&](GroupId c) { return o.own_group(c) == expected(t.own_group(c)); });
  }
  const OpList& t = s.ranks[0].ops;
  const std::vector<char> syncs =
      redundant_syncs(o, s.ranks[static_cast<std::size_t>(r)].streams.size(), s.allocator);
  // Whether op j of r is op i of rank 0, on r's own group of the same family.
  const auto same = [&](std::size_t i, std::size_t j) {
    const Op a = t[i];
    Op b = o[j];
    if ((a.group == kNoGroup) != (b.group == kNoGroup)) return false;
    if (a.group != kNoGroup) {
      if (b.group != expected(a.group)) return false;
      b.group = a.group;
    }
    // Where its accesses start moves with the ops left out; how many a device op has (a
    // gather of a slice that lies in the padding reads none) ticks nothing (Checker::run_work).
    b.access_begin = a.access_begin;
    if (a.stream != kHostStream) b.access_count = a.access_count;
    return a == b;
  };
  // Ops that move no clock are passed over on either side, and a sync that orders nothing where
  // the other list has no such op there. Syncs in both lists are matched: one may order
  // something in one list only (a kernel only one rank issues on another stream after it).
  std::size_t i = 0;
  std::size_t j = 0;
  while (true) {
    while (i < t.size() && moves_no_clock(t.stored(i))) ++i;
    while (j < o.size() && moves_no_clock(o.stored(j))) ++j;
    const bool in_t = i < t.size();
    const bool in_o = j < o.size();
    if (!in_t && !in_o) break;
    if (in_t && in_o && same(i, j)) {
      ++i;
      ++j;
    } else if (in_t && rank0_syncs[i] != 0) {
      ++i;
    } else if (in_o && syncs[j] != 0) {
      ++j;
    } else {
      return false;
    }
  }
  Pattern p{r, {}};
  if (!stored_groups_of(s, o, p.stored_groups)) return false;
  patterns.push_back(std::move(p));
  return true;
}

}  // namespace

std::optional<SymmetricWorld> symmetric_world(const Schedule& s, std::string* why) {
  const Reason no{why};
  const int n = static_cast<int>(s.ranks.size());
  if (n < 2) return no("one rank");
  for (int r = 0; r < n; ++r) {
    if (s.ranks[static_cast<std::size_t>(r)].rank != r) return no("ranks out of order");
  }
  std::vector<int> levels;
  const std::optional<std::vector<GroupShape>> sh = shapes(s, levels, no);
  if (!sh) return std::nullopt;
  const std::optional<Families> f = families(s, *sh, no);
  if (!f) return std::nullopt;
  const OpList& t = s.ranks[0].ops;
  std::vector<Pattern> patterns(1);
  if (!stored_groups_of(s, t, patterns[0].stored_groups)) return no("an op names no group");
  SymmetricWorld w;
  w.digits = static_cast<int>(levels.size()) - 1;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const Op& op = t.stored(i);
    if (is_collective(op.kind) && op.group != kNoGroup) {
      w.instances += static_cast<std::uint64_t>(n) /
                     s.groups[static_cast<std::size_t>(t.own_group(op.group))].ranks.size();
    }
  }
  const std::vector<char> rank0_syncs = redundant_syncs(t, s.ranks[0].streams.size(), s.allocator);
  for (int r = 1; r < n; ++r) {
    const RankSchedule& rs = s.ranks[static_cast<std::size_t>(r)];
    if (rs.streams.size() != s.ranks[0].streams.size() ||
        !orders_alike(s, r, *f, patterns, rank0_syncs)) {
      return no(fmt::format("rank {} issues other ops than rank 0 or uses other groups", r));
    }
  }
  return w;
}

namespace {

/** Collectives a rank issued that are not complete (Walk indices), in no order: a few inline,
 *  any more in `more`. walk_runs touches the current rank's at every arrival, and a vector each
 *  missed the cache there on most of them at 16,384 ranks. */
struct Pending {
  std::array<std::uint32_t, 6> in{};
  std::uint32_t n = 0;
  std::vector<std::uint32_t> more;

  void add(std::uint32_t k) {
    if (n < in.size()) {
      in[n++] = k;
    } else {
      more.push_back(k);
    }
  }
  void remove(std::uint32_t k) {
    for (std::uint32_t i = 0; i < n; ++i) {
      if (in[i] != k) continue;
      in[i] = in[--n];
      if (!more.empty()) {
        in[n++] = more.back();
        more.pop_back();
      }
      return;
    }
    std::erase(more, k);
  }
  /** The least of f(k) over the pending k, or `least` when it is less. */
  template <class F>
  std::uint32_t min_of(F f, std::uint32_t least) const {
    for (std::uint32_t i = 0; i < n; ++i) least = std::min(least, f(in[i]));
    for (const std::uint32_t k : more) least = std::min(least, f(k));
    return least;
  }
};

/** Where one rank of walk_runs is. */
struct Walker {
  std::uint32_t next = 0;        ///< next op
  std::uint32_t collective = 0;  ///< index of the next collective in Walk::collectives
  bool blocked = false;
  Pending pending;  ///< collectives issued, not complete
};

/** The shared op list's collectives, and for each the first later op that waits for it: the
 *  next op on its stream (Checker::step: FIFO) or the next device sync. */
struct Walk {
  std::vector<std::uint32_t> collectives;  ///< op indices, ascending
  std::vector<std::uint32_t> needed_at;    ///< per collective: the op that waits for it

  explicit Walk(const OpList& ops) {
    const auto n = static_cast<std::uint32_t>(ops.size());
    std::vector<std::uint32_t> next_on(128, n);  // per stream id
    std::uint32_t next_sync = n;
    for (std::uint32_t i = n; i-- > 0;) {
      const Op& op = ops.stored(i);
      if (is_collective(op.kind) && op.stream != kHostStream) {
        collectives.push_back(i);
        needed_at.push_back(std::min(next_on[static_cast<std::size_t>(op.stream)], next_sync));
      }
      if (op.stream != kHostStream && op.stream >= 0) {
        next_on[static_cast<std::size_t>(op.stream)] = i;
      }
      if (op.kind == OpKind::kHostDeviceSync) next_sync = i;
    }
    std::reverse(collectives.begin(), collectives.end());
    std::reverse(needed_at.begin(), needed_at.end());
  }
};

}  // namespace

std::optional<std::vector<RankRun>> walk_runs(const Schedule& s, const RunFilter& keep) {
  // One Walk per op list: ranks that share a copy (OpList::shares_with) share its Walk. Every
  // rank issues rank 0's collectives in its order (symmetric_world), so (group, ordinal) names
  // an instance.
  std::vector<Rank> owners;
  std::vector<Walk> walks;
  std::vector<std::uint32_t> walk_of(s.ranks.size());
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const OpList& o = s.ranks[r].ops;
    std::size_t w = 0;
    while (w < owners.size() && !o.shares_with(s.ranks[static_cast<std::size_t>(owners[w])].ops)) {
      ++w;
    }
    if (w == owners.size()) {
      owners.push_back(static_cast<Rank>(r));
      walks.emplace_back(o);
    }
    walk_of[r] = static_cast<std::uint32_t>(w);
  }
  // Each rank's group for each group its list's shared copy names (a slot), in one array: a
  // lookup in every rank's own group list at every arrival missed the cache at 16,384 ranks.
  std::vector<std::vector<std::uint32_t>> slot_of(walks.size());  // per walk, per collective
  std::vector<std::vector<GroupId>> slot_group(walks.size());     // per walk, per slot: stored
  std::size_t slots = 1;
  for (std::size_t w = 0; w < walks.size(); ++w) {
    const OpList& t = s.ranks[static_cast<std::size_t>(owners[w])].ops;
    for (const std::uint32_t p : walks[w].collectives) {
      const GroupId c = t.stored(p).group;
      auto& seen = slot_group[w];
      const auto at = std::find(seen.begin(), seen.end(), c);
      slot_of[w].push_back(static_cast<std::uint32_t>(at - seen.begin()));
      if (at == seen.end()) seen.push_back(c);
    }
    slots = std::max(slots, slot_group[w].size());
  }
  std::vector<GroupId> group_at(s.ranks.size() * slots, kNoGroup);
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    const std::uint32_t w = walk_of[r];
    const OpList& t = s.ranks[static_cast<std::size_t>(owners[w])].ops;
    const OpList& o = s.ranks[r].ops;
    for (std::size_t slot = 0; slot < slot_group[w].size(); ++slot) {
      const GroupId c = slot_group[w][slot];
      group_at[r * slots + slot] = o.shares_with(t) ? o.own_group(c) : c;
    }
  }
  std::vector<Walker> walkers(s.ranks.size());
  std::unordered_map<std::uint64_t, std::vector<Rank>> arrived;
  std::deque<Rank> ready;
  std::vector<RankRun> runs;
  const auto arrive = [&](Rank r, std::uint32_t k) {
    const std::uint32_t w = walk_of[static_cast<std::size_t>(r)];
    const GroupId g = group_at[static_cast<std::size_t>(r) * slots + slot_of[w][k]];
    const std::uint64_t key = std::uint64_t{static_cast<std::uint32_t>(g)} << 32 | k;
    std::vector<Rank>& at = arrived[key];
    at.push_back(r);
    walkers[static_cast<std::size_t>(r)].pending.add(k);
    if (at.size() < s.groups[static_cast<std::size_t>(g)].ranks.size()) return;
    for (const Rank m : at) {  // Checker::complete: the members in the order they arrived
      Walker& mw = walkers[static_cast<std::size_t>(m)];
      mw.pending.remove(k);
      if (mw.blocked) {
        mw.blocked = false;
        ready.push_back(m);
      }
    }
    arrived.erase(key);
  };
  for (std::size_t r = 0; r < s.ranks.size(); ++r) ready.push_back(static_cast<Rank>(r));
  while (!ready.empty()) {
    const Rank r = ready.front();
    ready.pop_front();
    const Walk& walk = walks[walk_of[static_cast<std::size_t>(r)]];
    const auto n_ops = static_cast<std::uint32_t>(s.ranks[static_cast<std::size_t>(r)].ops.size());
    Walker& w = walkers[static_cast<std::size_t>(r)];
    const std::uint32_t from = w.next;
    while (true) {
      const std::uint32_t block =
          w.pending.min_of([&walk](std::uint32_t k) { return walk.needed_at[k]; }, n_ops);
      const std::uint32_t k = w.collective;
      const std::uint32_t next = k < walk.collectives.size() ? walk.collectives[k] : n_ops;
      if (next < block) {
        w.next = next + 1;
        ++w.collective;
        arrive(r, k);
        continue;
      }
      w.next = block;
      w.blocked = block < n_ops;
      break;
    }
    if (w.next > from && keep(r, from, w.next)) runs.push_back({r, w.next});
  }
  if (!arrived.empty()) return std::nullopt;
  return runs;
}

}  // namespace hpz::check
