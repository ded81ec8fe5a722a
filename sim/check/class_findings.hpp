// The findings of class representatives (sim/ir/symmetry.hpp), kept while the checker runs and
// handed afterwards to every rank the representative stands for, in the order the check rank by
// rank meets them: the same groups, counts, examples and occurrences as that check.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "sim/check/allocator.hpp"
#include "sim/check/finding.hpp"
#include "sim/check/finding_log.hpp"
#include "sim/ir/symmetry.hpp"

namespace hpz::check {

/** A byte offset of a representative as every rank of its class has its own: an end of the
 *  access at the same index, or a value alike on all of them (the buffer's start or size, or
 *  any offset of a buffer whose accesses are equal across the class). */
struct OffsetRef {
  enum class Kind : std::uint8_t { kValue, kAccessOffset, kAccessEnd };
  Kind kind = Kind::kValue;
  std::uint32_t access = 0;  ///< index into RankSchedule::accesses
  std::uint64_t value = 0;   ///< kValue's offset

  /** Rank `rs`'s offset. */
  std::uint64_t of(const RankSchedule& rs) const;
};

/** One finding of a representative, with what FindingLog's call for it takes. */
struct ClassFinding {
  FindingKind kind = FindingKind::kRace;
  std::uint32_t op = 0;     ///< the later op (the access, the read)
  std::uint32_t first = 0;  ///< the earlier op: prior access, allocation or primary write
  std::uint32_t copy = 0;   ///< stale read: the copy that took the secondary
  AccessMode first_mode = AccessMode::kWrite;
  AccessMode mode = AccessMode::kRead;
  BufferId buffer = 0;  ///< the buffer (use-after-free: the one that reuses the memory)
  OffsetRef lo;         ///< bytes [lo, hi) of the buffer
  OffsetRef hi;
  PendingUse use;  ///< use-after-free: the freed buffer's pending use
};

/** A run of one rank's ops as the checker walked them without a stop, up to `to` (exclusive),
 *  from where its previous run with findings ended (runs without findings may be left out). */
struct RankRun {
  Rank rank = 0;
  std::uint32_t to = 0;
};

/** Findings per class, from its representative, in the representative's op order. */
class ClassFindings {
 public:
  ClassFindings(const Schedule& schedule, const RankClasses& classes);
  ~ClassFindings();

  /** Representative `rep` found f (ops visited in issue order). */
  void add(Rank rep, const ClassFinding& f) {
    by_class_[static_cast<std::size_t>(classes_.class_of[rep])].push_back(f);
  }
  /** True when no class has findings. */
  bool empty() const {
    return std::all_of(by_class_.begin(), by_class_.end(), [](const auto& f) { return f.empty(); });
  }
  /** Findings so far of rank r's class. */
  std::size_t count(Rank r) const { return of_class(r).size(); }
  /** True when rank r's class has findings at ops [from, to). */
  bool any_in(Rank r, std::uint32_t from, std::uint32_t to) const;
  /** Offset `v` of buffer b on representative `rep` (an end of one of its accesses of b, or 0
   *  or b's size, as the byte history reports), as its class's ranks have it. */
  OffsetRef ref(Rank rep, BufferId b, std::uint64_t v);
  /** Logs, for each run in order, the findings its rank's class has in the run's ops, at that
   *  rank's own offsets: the order in which the check rank by rank logs them. */
  void replay(const std::vector<RankRun>& runs, FindingLog& log) const;

 private:
  struct Ends;
  const std::vector<ClassFinding>& of_class(Rank r) const {
    return by_class_[static_cast<std::size_t>(classes_.class_of[r])];
  }
  void emit(Rank r, const ClassFinding& f, FindingLog& log) const;

  const Schedule& schedule_;
  const RankClasses& classes_;
  std::vector<std::vector<ClassFinding>> by_class_;
  /** Per representative with other ranks, the ends of its accesses by buffer; made on its
   *  first finding. */
  std::unordered_map<Rank, std::unique_ptr<Ends>> ends_;
};

}  // namespace hpz::check
