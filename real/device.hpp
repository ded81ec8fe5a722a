// The real-GPU side's view of the machine. Everything here builds without CUDA; without it, or
// without a device, it says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace hpz::real {

/** What CUDA reports about this machine. */
struct DeviceInfo {
  int count = 0;                   ///< usable CUDA devices
  std::string name;                ///< device 0's name, when count > 0
  std::uint64_t memory_bytes = 0;  ///< device 0's global memory, when count > 0
  std::string problem;             ///< why count is 0 (no driver, not built with CUDA, ...)
  /** Hardware work queues CUDA gives this process's streams: CUDA_DEVICE_MAX_CONNECTIONS as
   *  CUDA reads it (default 8, at most 32); streams beyond it share queues. */
  int hardware_queues = 0;
};

/** Sets CUDA_DEVICE_MAX_CONNECTIONS to 32 (unless set) so the emulated ranks' streams get
 *  hardware queues of their own; must run before the first CUDA call of the process. */
void claim_hardware_queues();

/** Asks the CUDA runtime for devices (claiming the hardware queues first); never throws. */
DeviceInfo probe_devices();

/** Runs a kernel that holds device 0's default stream for about `micros` microseconds and
 *  returns the elapsed time CUDA events measured, in microseconds. Requires a device. */
double spin_for(double micros);

}  // namespace hpz::real
