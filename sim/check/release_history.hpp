// A finding followed across DeepSpeed releases: which releases of a checked range have it, the
// first that has it and the first that no longer does. `hpzlab check --deepspeed A..B` prints it
// under its one line per epoch, and writes it to the JSON (docs/checker.md).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "sim/check/checker.hpp"

namespace hpz::check {

/** One epoch of a release matrix: releases the builder treats alike, and their verdict. */
struct EpochVerdict {
  std::vector<std::string> releases;    ///< oldest first
  const CheckResult* result = nullptr;  ///< nullptr: not checked (the builder refused them)
};

/** One kind of finding, followed across the epochs. */
struct FindingHistory {
  /** What identifies it across releases: kind, the two ops' purposes and the buffer's role,
   *  e.g. "race: secondary-partition-copy vs allgather-read, on the secondary". */
  std::string signature;
  FindingKind kind = FindingKind::kRace;
  std::vector<std::string> spans;  ///< the runs of releases that have it, "0.13.2-0.13.4"
  std::string first;               ///< the first checked release that has it
  /** The first checked release after the last one that has it, none of whose successors has it
   *  ("" when the newest checked release still has it). */
  std::string fixed_in;
  /** Releases between the last that has it and `fixed_in` that were not checked ("" when
   *  none): the fix may lie in them. */
  std::string unchecked_before_fix;
  std::uint64_t count = 0;  ///< in the worst epoch
  std::string remedy;       ///< what a user does about it (remedy(), report.hpp)
};

/** The signature of a finding group (FindingHistory::signature). */
std::string signature_of(const FindingGroup& group);

/** Every signature found in any epoch, in order of the first epoch that has it, then as that
 *  epoch's result orders its groups (worst first). */
std::vector<FindingHistory> finding_history(std::span<const EpochVerdict> epochs);

/** "0.13.2-0.13.4", or "0.13.5" for one release. */
std::string span_of(const std::vector<std::string>& releases);

}  // namespace hpz::check
