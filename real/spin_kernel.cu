// A kernel that holds its stream for a given number of GPU clock cycles: the stand-in for a
// compute kernel whose duration the timing engine predicts.
#include <cuda_runtime.h>

namespace hpz::real {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

cudaError_t launch_spin(long long cycles, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}

}  // namespace hpz::real
