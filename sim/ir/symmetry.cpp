#include "sim/ir/symmetry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>

namespace hpz {
namespace {

constexpr std::uint64_t kOdd = 0x9e3779b97f4a7c15ull;

// Past this many classes the ranks are taken as all different: each class keeps its
// representative's access code (2 words an access) while classes are found, and a check by class
// saves little where classes are many.
constexpr std::size_t kMaxClasses = 64;

/** A rank's accesses with their offsets abstracted: what must be equal for ranks of one class.
 *  `shape` is each access's buffer, mode, slice count and stride. `code` has, per access, the
 *  positions of its offset and end among the distinct ends of its buffer's accesses (with 0 and
 *  the buffer's size), then each buffer's number of distinct ends: equal codes put every overlap,
 *  gap and containment in the same place. An access whose offsets cannot move (a strided one,
 *  whose slices' ends would be needed too, and every access of its buffer; every access where
 *  the caching allocator is modelled, whose reuse puts different buffers in one block) is in
 *  the code as its offset and bytes. */
struct AccessCode {
  std::uint64_t shape = 0;  ///< hash of the shape
  std::uint64_t hash = 0;   ///< hash of the code
  std::vector<std::uint64_t> code;
};

std::uint64_t shape_of(const Access& a) {
  return std::uint64_t{a.buffer} << 24 ^ std::uint64_t{a.count} << 8 ^
         static_cast<std::uint64_t>(a.mode) ^ std::uint64_t{a.stride} << 40;
}

/** Per buffer, the sorted distinct ends of its accesses (with 0 and its size; or every end,
 *  repeats kept, where asked), in one array
 *  (a vector per buffer cost a rank's thousands of buffers a malloc each): buffer b's are
 *  count[b] values from start[b]; none for a buffer whose offsets are kept as they are. */
struct Ends {
  std::vector<std::uint32_t> start;
  std::vector<std::uint32_t> count;
  std::vector<std::uint64_t> values;

  /** The position of v among buffer b's ends: how many are less than v. */
  std::uint64_t at(BufferId b, std::uint64_t v) const {
    const auto first = values.begin() + start[b];
    return static_cast<std::uint64_t>(std::lower_bound(first, first + count[b], v) - first);
  }
  /** How many of buffer b's ends are at most v. */
  std::uint64_t up_to(BufferId b, std::uint64_t v) const {
    const auto first = values.begin() + start[b];
    return static_cast<std::uint64_t>(std::upper_bound(first, first + count[b], v) - first);
  }
};

Ends ends_by_buffer(const RankSchedule& rs, bool allocator, bool distinct = true) {
  const std::size_t nb = rs.buffers.size();
  std::vector<std::uint8_t> fixed(nb, allocator ? 1 : 0);
  Ends e;
  e.count.assign(nb, 0);
  for (const Access& a : rs.accesses) {
    if (a.buffer >= nb) continue;  // malformed: the checker says so
    if (a.strided()) fixed[a.buffer] = 1;
    e.count[a.buffer] += 2;
  }
  e.start.assign(nb, 0);
  std::uint32_t total = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    e.count[b] = fixed[b] != 0 ? 0 : e.count[b] + 2;
    e.start[b] = total;
    total += e.count[b];
  }
  e.values.resize(total);
  std::vector<std::uint32_t> next = e.start;
  for (std::size_t b = 0; b < nb; ++b) {
    if (fixed[b] != 0) continue;
    e.values[next[b]++] = 0;
    e.values[next[b]++] = rs.buffers[b].bytes;
  }
  for (const Access& a : rs.accesses) {
    if (a.buffer >= nb || fixed[a.buffer] != 0) continue;
    e.values[next[a.buffer]++] = a.offset;
    e.values[next[a.buffer]++] = a.end();
  }
  for (std::size_t b = 0; b < nb; ++b) {
    const auto first = e.values.begin() + e.start[b];
    const auto last = first + e.count[b];
    std::sort(first, last);
    if (distinct) e.count[b] = static_cast<std::uint32_t>(std::unique(first, last) - first);
  }
  return e;
}

AccessCode access_code(const RankSchedule& rs, bool allocator) {
  AccessCode c;
  const Ends e = ends_by_buffer(rs, allocator);
  const std::size_t nb = rs.buffers.size();
  c.code.reserve(2 * rs.accesses.size() + nb);
  for (const Access& a : rs.accesses) {
    c.shape = (c.shape ^ shape_of(a)) * kOdd;
    if (a.buffer >= nb || e.count[a.buffer] == 0) {
      c.code.push_back(a.offset);
      c.code.push_back(a.bytes);
    } else {
      c.code.push_back(e.at(a.buffer, a.offset));
      c.code.push_back(e.at(a.buffer, a.end()));
    }
  }
  for (std::size_t b = 0; b < nb; ++b) c.code.push_back(e.count[b]);
  c.hash = c.code.size();
  for (const std::uint64_t v : c.code) c.hash = (c.hash ^ v) * kOdd;
  return c;
}

bool same_shape(const AccessList& a, const AccessList& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const Access& x, const Access& y) {
    return x.buffer == y.buffer && x.mode == y.mode && x.count == y.count && x.stride == y.stride;
  });
}

bool same_ops_but_groups(const OpList& a, const OpList& b) {
  if (a.shares_with(b)) return true;
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    Op x = a[i];
    Op y = b[i];
    x.group = y.group;  // each rank on its own groups; the checker matches them across ranks
    if (!(x == y)) return false;
  }
  return true;
}

bool same_streams(const RankSchedule& a, const RankSchedule& b) {
  return std::equal(a.streams.begin(), a.streams.end(), b.streams.begin(), b.streams.end(),
                    [](const Stream& x, const Stream& y) { return x.name == y.name; });
}

/** Ranks a and b issue the same ops on the same buffers with the same streams. */
bool same_issue(const RankSchedule& a, const RankSchedule& b) {
  return same_streams(a, b) && same_ops_but_groups(a.ops, b.ops) &&
         (a.buffers.shares_with(b.buffers) || a.buffers.get() == b.buffers.get());
}

/** A rank of a class that others may share their op list, accesses' base and buffers with,
 *  and (made when one first does) every end of its accesses by buffer, repeats kept. */
struct Exemplar {
  Rank rank = 0;
  std::optional<Ends> all_ends;
};

/** Exemplars a class keeps at most: one per op list its ranks issue (a DeepSpeed world's kinds
 *  of ranks: 16,384 GPUs of llama2-70b.toml put ranks of several kinds in one class). */
constexpr std::size_t kMaxExemplars = 16;

/** A class while classes are found: its representative's access code, and its exemplars (the
 *  representative first), each a rank of the class with an op list none before it shares. */
struct Candidate {
  AccessCode code;
  std::vector<Exemplar> exemplars;
};

/** Whether rank b reads the op list, accesses' base and buffers of rank a, on its streams. */
bool shares_lists(const RankSchedule& a, const RankSchedule& b) {
  return b.accesses.shares_with(a.accesses) && b.ops.shares_with(a.ops) &&
         b.buffers.shares_with(a.buffers) && same_streams(a, b);
}

/** Both ends of one access that differs between a rank and a representative sharing their
 *  accesses' base: the rank's and the representative's. */
struct EndPair {
  BufferId buffer = 0;
  std::uint64_t ours = 0, theirs = 0;
  auto operator<=>(const EndPair&) const = default;
};

/** Whether rank `rs` has representative `rep`'s access code, for two ranks whose accesses read
 *  one shared base (AccessList::shares_with), from the accesses where the two differ alone:
 *  an index outside both own blocks holds the same access in both. Codes are equal when every
 *  differing access has the same shape, its offsets (kept as they are on a buffer whose offsets
 *  cannot move) or else its ends take the same place among the others: among the ends of
 *  accesses both share (how many are below each end, and how many at or below it, from the
 *  representative's `all_ends` less its own differing ends) and among each other (the rank's
 *  ends sorted put the representative's in the same order, ties where it has ties). */
bool same_code_by_difference(const RankSchedule& rep, const Ends& all_ends,
                             const RankSchedule& rs) {
  // Own blocks are whole ops' blocks (AccessList::share_blocks) and both ranks issue one op
  // list: a block of either is one block of the other too, its own or its base's.
  std::vector<std::pair<std::size_t, std::size_t>> theirs_own, ours_own, ranges;
  rep.accesses.for_each_own_range(
      [&](std::size_t b, std::size_t e) { theirs_own.emplace_back(b, e); });
  rs.accesses.for_each_own_range(
      [&](std::size_t b, std::size_t e) { ours_own.emplace_back(b, e); });
  std::set_union(theirs_own.begin(), theirs_own.end(), ours_own.begin(), ours_own.end(),
                 std::back_inserter(ranges));
  const std::size_t nb = rep.buffers.size();
  std::vector<EndPair> ends;
  std::size_t done = 0;  // indices below this were compared
  AccessList::BlockReader our_blocks(rs.accesses), their_blocks(rep.accesses);
  for (const auto& [first, last] : ranges) {
    if (first < done) return false;  // blocks that overlap: not blocks of one op list
    const auto count = static_cast<std::uint32_t>(last - first);
    const std::span<const Access> ours = our_blocks.block(static_cast<std::uint32_t>(first), count);
    const std::span<const Access> theirs =
        their_blocks.block(static_cast<std::uint32_t>(first), count);
    for (std::size_t k = 0; k < count; ++k) {
      const Access& x = ours[k];
      const Access& y = theirs[k];
      if (x == y) continue;
      if (x.buffer != y.buffer || x.mode != y.mode || x.count != y.count || x.stride != y.stride) {
        return false;
      }
      // Equal shapes and other offsets: a buffer whose offsets are kept as they are differs.
      if (x.buffer >= nb || all_ends.count[x.buffer] == 0) return false;
      ends.push_back({x.buffer, x.offset, y.offset});
      ends.push_back({x.buffer, x.end(), y.end()});
    }
    done = last;
  }
  if (ends.empty()) return true;
  std::sort(ends.begin(), ends.end());
  // The representative's differing ends by buffer, sorted, to take from its all_ends.
  for (std::size_t lo = 0; lo < ends.size();) {
    const BufferId b = ends[lo].buffer;
    std::size_t hi = lo;
    std::vector<std::uint64_t> theirs;
    while (hi < ends.size() && ends[hi].buffer == b) theirs.push_back(ends[hi++].theirs);
    std::sort(theirs.begin(), theirs.end());
    const auto below = [&](std::uint64_t v) {  // shared ends below v, and at or below it
      const auto lt = all_ends.at(b, v) -
                      static_cast<std::uint64_t>(std::lower_bound(theirs.begin(), theirs.end(), v) -
                                                 theirs.begin());
      const auto le = all_ends.up_to(b, v) -
                      static_cast<std::uint64_t>(std::upper_bound(theirs.begin(), theirs.end(), v) -
                                                 theirs.begin());
      return std::pair{lt, le};
    };
    for (std::size_t k = lo; k < hi; ++k) {
      if (below(ends[k].ours) != below(ends[k].theirs)) return false;
      // Sorted by ours, then theirs: the representative's must rise where ours rise, and tie
      // where ours tie.
      if (k + 1 < hi) {
        const EndPair& a = ends[k];
        const EndPair& c = ends[k + 1];
        if (a.ours == c.ours ? a.theirs != c.theirs : a.theirs >= c.theirs) return false;
      }
    }
    lo = hi;
  }
  return true;
}

/** One class per rank: the answer for a world with more kinds of ranks than kMaxClasses. */
RankClasses per_rank(std::size_t n) {
  RankClasses out;
  out.capped = true;
  for (std::size_t r = 0; r < n; ++r) {
    out.class_of.push_back(static_cast<std::int32_t>(r));
    out.classes.push_back({static_cast<Rank>(r), {static_cast<Rank>(r)}});
  }
  return out;
}

}  // namespace

RankClasses rank_classes(const Schedule& schedule) {
  RankClasses out;
  const std::size_t n = schedule.ranks.size();
  out.class_of.assign(n, -1);
  // Classes by the hashes of their representatives' codes; compared in full before joining.
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> by_hash;
  std::vector<Candidate> candidates;  // per class
  for (std::size_t r = 0; r < n; ++r) {
    const RankSchedule& rs = schedule.ranks[r];
    std::int32_t cls = -1;
    // A rank that shares its accesses' base, ops and buffers with an exemplar of the class of
    // the rank at its place one hpZ group (a node, in a DeepSpeed world) before it, is compared
    // with it from the accesses where the two differ (the exemplar has the representative's
    // code). The likely class only: any other is found by the whole code, as is this one where
    // that comparison says no.
    const auto before = static_cast<std::size_t>(std::max(schedule.hpz_size, 1));
    if (r >= before) {
      const std::int32_t likely = out.class_of[r - before];
      for (Exemplar& e : candidates[static_cast<std::size_t>(likely)].exemplars) {
        const RankSchedule& ex = schedule.ranks[static_cast<std::size_t>(e.rank)];
        if (!shares_lists(ex, rs)) continue;
        if (!e.all_ends) e.all_ends = ends_by_buffer(ex, schedule.allocator, false);
        if (same_code_by_difference(ex, *e.all_ends, rs)) cls = likely;
        break;
      }
    }
    if (cls < 0) {
      AccessCode code = access_code(rs, schedule.allocator);
      std::vector<std::int32_t>& same = by_hash[code.shape * kOdd ^ code.hash];
      for (const std::int32_t k : same) {
        const auto i = static_cast<std::size_t>(k);
        const RankSchedule& rep = schedule.ranks[out.classes[i].representative];
        if (candidates[i].code.code == code.code && same_shape(rep.accesses, rs.accesses) &&
            same_issue(rep, rs)) {
          cls = k;
          break;
        }
      }
      if (cls < 0 && out.classes.size() == kMaxClasses) return per_rank(n);
      if (cls < 0) {
        cls = static_cast<std::int32_t>(out.classes.size());
        out.classes.push_back({static_cast<Rank>(r), {}});
        same.push_back(cls);
        candidates.push_back({std::move(code), {}});
      }
      // A rank whose lists no exemplar of its class shares becomes one.
      std::vector<Exemplar>& ex = candidates[static_cast<std::size_t>(cls)].exemplars;
      const bool known = std::any_of(ex.begin(), ex.end(), [&](const Exemplar& e) {
        return shares_lists(schedule.ranks[static_cast<std::size_t>(e.rank)], rs);
      });
      if (!known && ex.size() < kMaxExemplars) ex.push_back({static_cast<Rank>(r), {}});
    }
    out.class_of[r] = cls;
    out.classes[static_cast<std::size_t>(cls)].ranks.push_back(static_cast<Rank>(r));
  }
  return out;
}

std::string describe_classes(const RankClasses& classes) {
  std::string alone;
  for (const RankClass& c : classes.classes) {
    if (c.ranks.size() == 1 && classes.classes.size() > 1) {
      alone += fmt::format("{}{}", alone.empty() ? "" : ",", c.representative);
    }
  }
  const std::size_t n = classes.class_of.size();
  if (classes.capped)
    return fmt::format("{} ranks in more than {} symmetry classes", n, kMaxClasses);
  std::string line = fmt::format("{} rank{} in {} symmetry class{}", n, n == 1 ? "" : "s",
                                 classes.classes.size(), classes.classes.size() == 1 ? "" : "es");
  if (!alone.empty() && !classes.per_rank()) line += fmt::format(" (rank {} alone)", alone);
  return line;
}

}  // namespace hpz
