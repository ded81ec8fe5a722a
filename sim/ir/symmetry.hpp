// Symmetry classes of a schedule's ranks: ranks that issue the same ops (each on its own groups)
// on the same buffers, whose accesses differ at most in where their byte ranges fall, in an
// order that keeps every overlap, gap and containment between them (a rank's slice of a
// gathered parameter at its own offset). Computed from the schedule, never assumed: a rank that
// issues anything else (a recording's expert that got other tokens, `bugs.secondary_mismatch_rank`)
// is a class of its own. The race checker checks one rank per class (sim/check/checker.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"

namespace hpz {

/** Ranks alike: the representative (the lowest) and every rank it stands for. */
struct RankClass {
  Rank representative = 0;
  std::vector<Rank> ranks;  ///< ascending, the representative first
};

/** The classes of a schedule's ranks. A rank's offset that corresponds to its representative's
 *  is the same end (offset or end) of its access at the same index, the buffer's start or size:
 *  the classes keep no offsets of their own. */
struct RankClasses {
  std::vector<RankClass> classes;
  std::vector<std::int32_t> class_of;  ///< per rank: index into classes
  bool capped = false;  ///< more than 64 classes: taken as one per rank, the ranks not compared

  /** True when no two ranks are alike: one class per rank. */
  bool per_rank() const { return classes.size() == class_of.size(); }
};

/** The symmetry classes of `schedule`'s ranks. A rank whose accesses, ops and buffers share
 *  those of the representative of its likely class (AccessList::shares_with) is compared with
 *  it from the accesses where the two differ, not from its whole code; the classes are the same
 *  either way. Where the caching allocator is modelled
 *  (Schedule::allocator), ranks of one class have equal offsets too: its reuse puts different
 *  buffers in one block, whose overlaps the per-buffer order of offsets does not keep. */
RankClasses rank_classes(const Schedule& schedule);

/** One line on the classes: "1024 ranks in 8 symmetry classes", with the ranks alone named. */
std::string describe_classes(const RankClasses& classes);

}  // namespace hpz
