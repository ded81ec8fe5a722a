#include "sim/time/cost_model.hpp"

#include <algorithm>

namespace hpz::time {

CostModel::CostModel(const TimingInputs& in)
    : flops_per_s_(in.cluster.gpu.peak_flops * in.sim.compute_efficiency),
      hbm_bytes_per_s_(in.cluster.gpu.hbm_bytes_per_s * in.sim.memory_efficiency),
      pcie_bytes_per_s_(in.sim.pcie_gbytes_per_s * 1e9),
      min_s_(in.sim.kernel_latency_us * 1e-6),
      launch_s_(in.sim.launch_overhead_us * 1e-6) {}

double CostModel::kernel_s(double flops, double mem_bytes) const {
  return std::max({flops / flops_per_s_, mem_bytes / hbm_bytes_per_s_, min_s_});
}

double CostModel::device_copy_s(double mem_bytes) const {
  return std::max(mem_bytes / hbm_bytes_per_s_, min_s_);
}

double CostModel::host_copy_s(double bytes) const {
  return std::max(bytes / pcie_bytes_per_s_, min_s_);
}

double CostModel::op_s(const Schedule& schedule, Rank rank, const Op& op) const {
  switch (op.kind) {
    case OpKind::kKernel:
      if (op.spin_us > 0) return static_cast<double>(op.spin_us) * 1e-6;
      [[fallthrough]];
    case OpKind::kQuantize:
    case OpKind::kDequantize:
      return kernel_s(op.flops, op.mem_bytes);
    case OpKind::kCopy: {
      const RankSchedule& rs = schedule.ranks[static_cast<std::size_t>(rank)];
      for (const Access& a : schedule.accesses_of(rank, op)) {
        // A copy touching host memory is bound by PCIe: mem_bytes counts read + write.
        if (rs.buffers[a.buffer].on_host) return host_copy_s(op.mem_bytes / 2);
      }
      return device_copy_s(op.mem_bytes);
    }
    default:
      return 0;
  }
}

}  // namespace hpz::time
