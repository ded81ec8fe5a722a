#include "sim/check/class_findings.hpp"

#include <algorithm>
#include <utility>

namespace hpz::check {

/** (buffer, end) -> an access with that end, for one representative: sorted by key. */
struct ClassFindings::Ends {
  using Key = std::pair<BufferId, std::uint64_t>;
  std::vector<std::pair<Key, OffsetRef>> refs;

  const OffsetRef* find(BufferId b, std::uint64_t v) const {
    const Key k{b, v};
    auto it = std::lower_bound(refs.begin(), refs.end(), k,
                               [](const auto& e, const Key& x) { return e.first < x; });
    return it == refs.end() || it->first != k ? nullptr : &it->second;
  }
};

std::uint64_t OffsetRef::of(const RankSchedule& rs) const {
  switch (kind) {
    case Kind::kAccessOffset:
      return rs.accesses[access].offset;
    case Kind::kAccessEnd:
      return rs.accesses[access].end();
    case Kind::kValue:
      break;
  }
  return value;
}

ClassFindings::ClassFindings(const Schedule& schedule, const RankClasses& classes)
    : schedule_(schedule), classes_(classes), by_class_(classes.classes.size()) {}

ClassFindings::~ClassFindings() = default;

OffsetRef ClassFindings::ref(Rank rep, BufferId b, std::uint64_t v) {
  const RankClass& c = classes_.classes[static_cast<std::size_t>(classes_.class_of[rep])];
  const RankSchedule& rs = schedule_.ranks[static_cast<std::size_t>(rep)];
  if (c.ranks.size() == 1 || v == 0 || v == rs.buffers[b].bytes) {
    return {OffsetRef::Kind::kValue, 0, v};
  }
  std::unique_ptr<Ends>& ends = ends_[rep];
  if (!ends) {
    ends = std::make_unique<Ends>();
    for (std::size_t j = 0; j < rs.accesses.size(); ++j) {
      const Access& a = rs.accesses[j];
      if (a.strided()) continue;
      const auto at = static_cast<std::uint32_t>(j);
      ends->refs.push_back({{a.buffer, a.offset}, {OffsetRef::Kind::kAccessOffset, at, 0}});
      ends->refs.push_back({{a.buffer, a.end()}, {OffsetRef::Kind::kAccessEnd, at, 0}});
    }
    // Any access with the end will do: the classes keep each end's position among the
    // buffer's ends on every rank. Stable: the first access with it, for a reproducible choice.
    std::stable_sort(ends->refs.begin(), ends->refs.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  // Not an end of a plain access: a slice bound of a strided access, whose buffer the classes
  // hold at equal offsets on every rank (sim/ir/symmetry.cpp).
  const OffsetRef* found = ends->find(b, v);
  return found == nullptr ? OffsetRef{OffsetRef::Kind::kValue, 0, v} : *found;
}

bool ClassFindings::any_in(Rank r, std::uint32_t from, std::uint32_t to) const {
  const std::vector<ClassFinding>& found = of_class(r);  // ascending by op
  auto it = std::lower_bound(found.begin(), found.end(), from,
                             [](const ClassFinding& f, std::uint32_t op) { return f.op < op; });
  return it != found.end() && it->op < to;
}

void ClassFindings::replay(const std::vector<RankRun>& runs, FindingLog& log) const {
  // Each rank walks its ops in order: a cursor per rank into its class's findings.
  std::vector<std::uint32_t> cursor(classes_.class_of.size(), 0);
  for (const RankRun& run : runs) {
    const std::vector<ClassFinding>& found = of_class(run.rank);
    std::uint32_t& at = cursor[static_cast<std::size_t>(run.rank)];
    for (; at < found.size() && found[at].op < run.to; ++at) emit(run.rank, found[at], log);
  }
}

void ClassFindings::emit(Rank r, const ClassFinding& f, FindingLog& log) const {
  const RankSchedule& rs = schedule_.ranks[static_cast<std::size_t>(r)];
  switch (f.kind) {
    case FindingKind::kRace:
      log.race(r, f.first, f.first_mode, f.op, f.mode, f.buffer, f.lo.of(rs), f.hi.of(rs));
      return;
    case FindingKind::kUseAfterFree:
      log.use_after_free(r, f.use, f.op, f.mode, f.buffer);
      return;
    case FindingKind::kUninitializedRead:
      log.uninitialized(r, f.first, f.op, f.buffer, f.lo.of(rs), f.hi.of(rs));
      return;
    case FindingKind::kStaleRead:
      log.stale(r, f.first, f.copy, f.op, f.buffer);
      return;
    case FindingKind::kCollectiveMismatch:
      break;  // found across ranks, logged as the check meets them
  }
}

}  // namespace hpz::check
