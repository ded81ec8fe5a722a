#include "real/device.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "real/backend.hpp"

#ifdef HPZLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hpz::real {

#ifdef HPZLAB_WITH_CUDA
cudaError_t launch_spin(long long cycles, cudaStream_t stream);

namespace {
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}
}  // namespace

void claim_hardware_queues() {
  // Enough hardware queues for every stream of the emulated ranks, so that unrelated streams
  // are not serialized behind one another (the race needs them concurrent; with CUDA's default
  // of 8, stock hpZ was never corrupted on an H100). Read when the CUDA context is created, so
  // this runs before any CUDA call; a value the user set is kept.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

DeviceInfo probe_devices() {
  claim_hardware_queues();
  DeviceInfo info;
  const char* queues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  info.hardware_queues = std::clamp(queues != nullptr ? std::atoi(queues) : 8, 1, 32);
  const cudaError_t err = cudaGetDeviceCount(&info.count);
  if (err != cudaSuccess) {
    info.count = 0;
    info.problem = cudaGetErrorString(err);
    return info;
  }
  if (info.count == 0) {
    info.problem = "the CUDA runtime reports no device";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    info.name = prop.name;
    info.memory_bytes = prop.totalGlobalMem;
  }
  return info;
}

double spin_for(double micros) {
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute");
  cudaEvent_t start{}, stop{};
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, nullptr), "cudaEventRecord");
  check(launch_spin(static_cast<long long>(micros * clock_khz / 1000.0), nullptr), "spin_kernel");
  check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1000.0;
}
#else
void claim_hardware_queues() {}

DeviceInfo probe_devices() {
  DeviceInfo info;
  info.problem = "hpzlab was built without CUDA (HPZLAB_WITH_CUDA=OFF)";
  return info;
}

double spin_for(double) {
  throw std::runtime_error("hpzlab was built without CUDA");
}

std::unique_ptr<Backend> make_cuda_backend(bool) {
  throw std::runtime_error("hpzlab was built without CUDA (HPZLAB_WITH_CUDA=OFF)");
}

std::unique_ptr<Backend> make_nccl_backend(const Schedule&, Rank, int, Store&, bool) {
  throw std::runtime_error("hpzlab was built without CUDA (HPZLAB_WITH_CUDA=OFF)");
}
#endif

}  // namespace hpz::real
