#include "sim/time/collective.hpp"

namespace hpz::time {

CollectivePlan plan_collective(OpKind kind, std::uint64_t comm_bytes, int members,
                               CollectiveModel model) {
  CollectivePlan plan;
  if (members < 2) return plan;
  const auto n = static_cast<std::uint64_t>(members);
  switch (kind) {
    case OpKind::kAllToAll:
      return {members - 1, comm_bytes / n, true};
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
