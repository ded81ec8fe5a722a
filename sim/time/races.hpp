// Which of the checker's races bite in a given timing. The checker (sim/check) proves which op
// pairs are unordered; a race *manifests* in a run when the later op of a pair (in host order)
// started before the earlier one ended: the read began before the write finished (or the write
// began before the read finished, for write-after-read).
#pragma once

#include <cstdint>
#include <vector>

#include "sim/check/checker.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"

namespace hpz::time {

/** One racing op pair of one rank. */
struct RaceInstance {
  std::uint32_t group = 0;  ///< index into CheckResult::groups
  Rank rank = 0;
  std::uint32_t first = 0;   ///< earlier op in host order
  std::uint32_t second = 0;  ///< later op in host order
};

/** The timing of one race instance in one run. */
struct Manifestation {
  bool manifested = false;
  double first_end_s = 0;     ///< when the earlier op ended
  double second_start_s = 0;  ///< when the later op started
  double overlap_s = 0;       ///< first_end_s - second_start_s (> 0 when manifested)
};

/** Every op pair behind the race groups of `result`, as the checker found them
 *  (FindingGroup::occurrences), each pair once. */
std::vector<RaceInstance> race_instances(const check::CheckResult& result);

/** How `race` played out in `timeline`. */
Manifestation manifestation(const Timeline& timeline, const RaceInstance& race);

struct NodeQuotient;

/** How `race` played out in `timeline`, which with `quotient` may be a run by class's, of the
 *  simulated ranks only: then on the one that stands for the race's rank (by_class.hpp). */
Manifestation manifestation(const Timeline& timeline, RaceInstance race,
                            const NodeQuotient* quotient);

}  // namespace hpz::time
