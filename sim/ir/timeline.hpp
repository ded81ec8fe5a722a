// A timeline: when every op of every rank was issued, started and finished, in simulated (or
// measured) seconds. The timing engine (`hpzlab sim`) produces one per run; the data replay
// (`hpzlab repro`) and the sim-vs-real comparison read it. It is indexed exactly like the
// schedule it times: ranks[r][i] belongs to schedule.ranks[r].ops[i].
#pragma once

#include <cstdint>
#include <vector>

namespace hpz {

/** The times of one op. For stream ops: issue <= start <= end. Host ops (syncs) have
 *  start = issue and end = when the host could move on. Event records and waits take no time on
 *  their stream (start == end). A collective's start is when this rank's part of it began
 *  moving data (after every member arrived), its end when this rank's part finished. */
struct OpTime {
  double issue_s = 0;  ///< the host reached the op
  double start_s = 0;  ///< the op began executing
  double end_s = 0;    ///< the op finished
};

/** One simulated (or measured) run of a schedule. */
struct Timeline {
  std::vector<std::vector<OpTime>> ranks;  ///< ranks[r][i] times schedule.ranks[r].ops[i]
  std::uint64_t seed = 0;                  ///< the jitter seed this run used
};

}  // namespace hpz
