// What the race checker reports: findings, each naming two ops, and groups of findings that are
// the same bug repeated on many layers, ranks and steps.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sim/ir/schedule.hpp"

namespace hpz::check {

/** The four kinds of ordering bug the checker proves or refutes. */
enum class FindingKind : std::uint8_t {
  kRace,                ///< overlapping bytes, one a write, not ordered by happens-before
  kUseAfterFree,        ///< a freed buffer's memory reused while another stream still used it
  kStaleRead,           ///< a secondary shard read after its unit's primary shard changed
  kUninitializedRead,   ///< bytes read that nothing wrote since the allocation
  kCollectiveMismatch,  ///< ranks of one group issue different collectives: the job hangs
};

/** Kinds from worst to mildest: silent corruption first, a loud hang last. */
inline constexpr FindingKind kAllKinds[] = {
    FindingKind::kRace, FindingKind::kUseAfterFree, FindingKind::kStaleRead,
    FindingKind::kUninitializedRead, FindingKind::kCollectiveMismatch};

/** "race", "use-after-free", "stale-read", "uninitialized-read", "collective-mismatch". */
std::string_view to_string(FindingKind k);

/** One op of a schedule, with every label a report needs (so reports outlive the schedule). */
struct OpLabel {
  Rank rank = 0;
  std::uint32_t index = 0;  ///< position in the rank's issue order
  std::string stream;       ///< "S0", "S_ag", ..., or "host"
  OpKind kind = OpKind::kKernel;
  Purpose purpose = Purpose::kParamInit;
  Phase phase = Phase::kInit;
  std::int32_t step = 0;
  std::int32_t micro_step = 0;
  std::string unit;         ///< parameter unit name, "" when none
  std::int32_t layer = -1;  ///< decoder layer of the unit, -1 when none
  std::string label;        ///< Schedule::labels entry of a recorded op, "" when none
};

/** One concrete bug: two ops and the bytes or the collective position they disagree on. */
struct Finding {
  FindingKind kind = FindingKind::kRace;
  /** The earlier op in host order: the unordered writer, the allocation, the primary write,
   *  the freed buffer's pending use, or (mismatch) the op most ranks issued. */
  OpLabel first;
  /** The later op: the unordered access, the read, the reused memory's new owner's access, or
   *  (mismatch) the op that disagrees. */
  OpLabel second;
  AccessMode first_mode = AccessMode::kWrite;
  AccessMode second_mode = AccessMode::kRead;
  std::string buffer;  ///< buffer name ("" for a mismatch; use-after-free: the freed one)
  BufferRole role = BufferRole::kScratch;
  std::uint64_t offset = 0;  ///< first byte involved
  std::uint64_t bytes = 0;   ///< bytes involved
  std::string reused;        ///< use-after-free: the buffer that got the freed memory
  BufferRole reused_role = BufferRole::kScratch;
  std::string group;           ///< mismatch: the process group
  std::uint32_t position = 0;  ///< mismatch: the 0-based collective position on that group
  std::string detail;          ///< one sentence: what goes wrong
  std::string fix;             ///< the edge (or change) that would order or repair it
};

/** An uninitialized read of a gathered parameter by zero.Init's own broadcast at init: the
 *  module's constructor left the parameter unwritten (torch.empty), the report says so. */
inline bool unwritten_at_init(const Finding& f) {
  return f.kind == FindingKind::kUninitializedRead && f.role == BufferRole::kFull &&
         f.second.purpose == Purpose::kParamInit;
}

/** One occurrence of a race, uninitialized read or stale read: the rank and its two ops, in the
 *  roles of Finding::first and Finding::second (first is kNoOp when there is none, e.g. a read
 *  of a buffer never allocated). */
struct OpPair {
  Rank rank = 0;
  std::uint32_t first = 0;
  std::uint32_t second = 0;
};

/** The same bug repeated: one worked example, a count, and what it spans. */
struct FindingGroup {
  Finding example;
  std::uint64_t count = 0;
  /** Every occurrence, in the order the checker found them (count of them), for the engines
   *  that time or replay them; empty for collective mismatches, which span two ranks. */
  std::vector<OpPair> occurrences;
  std::set<Rank> ranks;
  std::set<std::int32_t> layers;
  std::set<std::int32_t> steps;
};

}  // namespace hpz::check
