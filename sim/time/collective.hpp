// How a collective moves bytes: the steps NCCL's ring (or its all-to-all) would run. The same
// plan drives the fine model (one SimGrid transfer per ring step and rank) and the coarse one
// (one transfer per ring edge for the whole collective).
#pragma once

#include <cstdint>

#include "sim/ir/schedule.hpp"

namespace hpz::time {

/** Fine: every ring step is a transfer. Coarse: each ring edge carries all its steps at once. */
enum class CollectiveModel : std::uint8_t { kFine, kCoarse };

/** The transfers one member of a collective makes. */
struct CollectivePlan {
  int steps = 0;                 ///< ring steps (sends per member, in order)
  std::uint64_t step_bytes = 0;  ///< bytes per send
  bool all_to_all = false;       ///< sends go to every other member at once, not around a ring
};

/** The plan for `kind` with `comm_bytes` (see OpKind) over `members` ranks:
 *  AllGather and ReduceScatter n-1 ring steps of comm_bytes, AllReduce 2(n-1) steps of
 *  comm_bytes / n, AllToAll n-1 concurrent sends of comm_bytes / n. The coarse model folds
 *  a ring's steps into one send of steps x step_bytes, and an AllToAll's n-1 sends into one
 *  send of (n-1) x comm_bytes / n to the ring neighbour. */
CollectivePlan plan_collective(OpKind kind, std::uint64_t comm_bytes, int members,
                               CollectiveModel model);

}  // namespace hpz::time
