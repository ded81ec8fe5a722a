#include <cuda_fp16.h>

#include "real/kernels.hpp"
#include "real/pattern.hpp"

namespace hpz::real::kernels {
namespace {

constexpr int kMaxSources = 16;
struct Sources {
  const void* p[kMaxSources];
};

__device__ float ld(const void* base, std::uint64_t i, int eb) {
  return eb == 4 ? static_cast<const float*>(base)[i]
                 : __half2float(static_cast<const __half*>(base)[i]);
}
__device__ void st(void* base, std::uint64_t i, int eb, float v) {
  if (eb == 4) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<__half*>(base)[i] = __float2half_rn(v);
  }
}

__device__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = now_ns();
  while (now_ns() - start < ns) {
  }
}

__global__ void pattern_kernel(void* dst, std::uint64_t n, int eb, std::uint32_t salt,
                               std::int32_t unit, std::uint64_t base) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    st(dst, i, eb, pattern_bits(salt, unit, base + i));
  }
}

__global__ void sum_kernel(void* dst, Sources src, int count, bool add_dst, std::uint64_t n,
                           int eb) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    float acc = add_dst ? ld(dst, i, eb) : ld(src.p[0], i, eb);
    for (int k = add_dst ? 0 : 1; k < count; ++k) acc = __fadd_rn(acc, ld(src.p[k], i, eb));
    st(dst, i, eb, acc);
  }
}

__global__ void scale_kernel(void* dst, const void* src, float a, bool axpy, std::uint64_t n,
                             int eb) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    // _rn: no fused multiply-add, so the host reference computes the same bits.
    const float x = __fmul_rn(ld(src, i, eb), a);
    st(dst, i, eb, axpy ? __fadd_rn(ld(dst, i, eb), x) : x);
  }
}

/** Sums a value over the block; the result is valid in thread 0. Integer addition modulo 2^64,
 *  so any order of summation gives the same bits. */
__device__ unsigned long long block_sum(unsigned long long v) {
  __shared__ unsigned long long warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0;
  if (warp == 0) {
    v = lane < (blockDim.x + 31) / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  __syncthreads();  // warp_sums is reused by the caller's next block_sum
  return v;
}

// The probe sits inside the gather's timed window, so it must be cheap: one atomic per block
// and counter (a per-thread atomic on two addresses serialized ~500 k atomics per gather and
// made the gathers look milliseconds slower than the simulator predicts).
__global__ void probe_kernel(const void* p, std::uint64_t n, int eb, unsigned long long* out) {
  unsigned long long hash = 0, nans = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t bits =
        eb == 4 ? static_cast<const std::uint32_t*>(p)[i] : static_cast<const std::uint16_t*>(p)[i];
    hash += bits * (2 * i + 1);
    nans += isnan(ld(p, i, eb)) ? 1 : 0;
  }
  hash = block_sum(hash);
  nans = block_sum(nans);
  if (threadIdx.x == 0) {
    atomicAdd(out, hash);
    atomicAdd(out + 1, nans);
  }
}

unsigned blocks(std::uint64_t n) {
  const std::uint64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1024 ? 1024 : b));
}

}  // namespace

cudaError_t spin(std::uint64_t ns, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

cudaError_t pattern(void* dst, std::uint64_t n, int eb, std::uint32_t salt, std::int32_t unit,
                    std::uint64_t base, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  pattern_kernel<<<blocks(n), 256, 0, stream>>>(dst, n, eb, salt, unit, base);
  return cudaGetLastError();
}

cudaError_t sum(void* dst, const void* const* src, int count, std::uint64_t n, int eb,
                cudaStream_t stream) {
  if (n == 0 || count == 0) return cudaSuccess;
  // More sources than one launch takes: the first launch sums kMaxSources, later ones add to
  // dst. The order of additions is fixed, so results are deterministic.
  for (int first = 0; first < count; first += kMaxSources) {
    Sources s{};
    const int m = count - first < kMaxSources ? count - first : kMaxSources;
    for (int k = 0; k < m; ++k) s.p[k] = src[first + k];
    sum_kernel<<<blocks(n), 256, 0, stream>>>(dst, s, m, first > 0, n, eb);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t scale(void* dst, const void* src, float a, bool axpy, std::uint64_t n, int eb,
                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<blocks(n), 256, 0, stream>>>(dst, src, a, axpy, n, eb);
  return cudaGetLastError();
}

cudaError_t probe(const void* p, std::uint64_t n, int eb, unsigned long long* out,
                  cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  probe_kernel<<<blocks(n), 256, 0, stream>>>(p, n, eb, out);
  return cudaGetLastError();
}

}  // namespace hpz::real::kernels
