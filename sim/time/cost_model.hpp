// How long a kernel, a quantize kernel or a copy takes on one GPU, and what the host pays to
// launch it. The timing engine uses it for every non-network op; the real-GPU executor reuses it
// to size its spin kernels. All constants come from the [cluster] GPU preset and the [sim]
// section (TimingInputs, sim/platform.hpp; docs/timing.md): nothing here is tuned to a
// measurement.
#pragma once

#include "sim/ir/schedule.hpp"
#include "sim/platform.hpp"

namespace hpz::time {

/** A roofline for kernels, HBM bandwidth for device copies, PCIe for host copies. */
class CostModel {
 public:
  /** Reads the GPU preset and the [sim] efficiencies, latencies and bandwidths. */
  explicit CostModel(const TimingInputs& in);

  /** Seconds a kernel (kKernel, kQuantize, kDequantize) runs: the larger of its compute time
   *  (flops / (peak x compute_efficiency)) and its memory time (mem_bytes / (HBM x
   *  memory_efficiency)), at least kernel_latency. */
  double kernel_s(double flops, double mem_bytes) const;
  /** Seconds a device-to-device copy runs: mem_bytes (read + write) / (HBM x memory_efficiency),
   *  at least kernel_latency. */
  double device_copy_s(double mem_bytes) const;
  /** Seconds a host <-> device copy of `bytes` runs over PCIe, at least kernel_latency. */
  double host_copy_s(double bytes) const;
  /** Seconds the host spends issuing one stream op (cudaLaunchKernel, cudaEventRecord, ...). */
  double launch_s() const { return launch_s_; }

  /** Seconds op `op` of schedule rank `rank` occupies its stream, before jitter; 0 for events,
   *  allocations, host syncs and collectives (the network model times those). A spin kernel
   *  (Op::spin_us > 0) runs exactly its spin time. */
  double op_s(const Schedule& schedule, Rank rank, const Op& op) const;

 private:
  double flops_per_s_;
  double hbm_bytes_per_s_;
  double pcie_bytes_per_s_;
  double min_s_;
  double launch_s_;
};

}  // namespace hpz::time
