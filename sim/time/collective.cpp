#include "sim/time/collective.hpp"

namespace hpz::time {

CollectivePlan plan_collective(OpKind kind, std::uint64_t comm_bytes, int members,
                               CollectiveModel model) {
  CollectivePlan plan;
  if (members < 2) return plan;
  const auto n = static_cast<std::uint64_t>(members);
  switch (kind) {
    case OpKind::kAllToAll:
      if (model == CollectiveModel::kFine) return {members - 1, comm_bytes / n, true};
      // Coarse: the n - 1 chunks a member sends leave through its own links either way; folding
      // them into one send to the ring neighbour keeps each member's bytes on its links and
      // NIC while cutting n(n-1) concurrent flows to n (the max-min solver's cost grows with
      // the square of the flows it couples).
      plan = {members - 1, comm_bytes / n, false};
      break;
    case OpKind::kAllReduce:
      plan = {2 * (members - 1), (comm_bytes + n - 1) / n, false};
      break;
    default:  // AllGather, ReduceScatter
      plan = {members - 1, comm_bytes, false};
      break;
  }
  if (model == CollectiveModel::kCoarse) {
    plan.step_bytes *= static_cast<std::uint64_t>(plan.steps);
    plan.steps = 1;
  }
  return plan;
}

}  // namespace hpz::time
