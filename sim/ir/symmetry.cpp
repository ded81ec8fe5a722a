#include "sim/ir/symmetry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

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

/** Per buffer, the sorted distinct ends of its accesses (with 0 and its size), in one array
 *  (a vector per buffer cost a rank's thousands of buffers a malloc each): buffer b's are
 *  count[b] values from start[b]; none for a buffer whose offsets are kept as they are. */
struct Ends {
  std::vector<std::uint32_t> start;
  std::vector<std::uint32_t> count;
  std::vector<std::uint64_t> values;

  /** The position of v among buffer b's ends. */
  std::uint64_t at(BufferId b, std::uint64_t v) const {
    const auto first = values.begin() + start[b];
    return static_cast<std::uint64_t>(std::lower_bound(first, first + count[b], v) - first);
  }
};

Ends ends_by_buffer(const RankSchedule& rs, bool allocator) {
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
    e.count[b] = static_cast<std::uint32_t>(std::unique(first, last) - first);
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

/** A class while classes are found: its representative's access code. */
struct Candidate {
  std::int32_t cls = 0;
  AccessCode code;
};

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
  std::unordered_map<std::uint64_t, std::vector<Candidate>> by_hash;
  for (std::size_t r = 0; r < n; ++r) {
    const RankSchedule& rs = schedule.ranks[r];
    AccessCode code = access_code(rs, schedule.allocator);
    std::vector<Candidate>& same = by_hash[code.shape * kOdd ^ code.hash];
    std::int32_t cls = -1;
    for (const Candidate& c : same) {
      const RankSchedule& rep = schedule.ranks[out.classes[c.cls].representative];
      if (c.code.code == code.code && same_shape(rep.accesses, rs.accesses) &&
          same_issue(rep, rs)) {
        cls = c.cls;
        break;
      }
    }
    if (cls < 0 && out.classes.size() == kMaxClasses) return per_rank(n);
    if (cls < 0) {
      cls = static_cast<std::int32_t>(out.classes.size());
      out.classes.push_back({static_cast<Rank>(r), {}});
      same.push_back({cls, std::move(code)});
    }
    out.class_of[r] = cls;
    out.classes[cls].ranks.push_back(static_cast<Rank>(r));
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
