// The executor's CUDA kernels behind a plain interface, so that only kernels.cu goes through
// nvcc. Every function launches on `stream` and returns cudaGetLastError().
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hpz::real::kernels {

/** Holds the stream for `ns` nanoseconds of the GPU's global timer. */
cudaError_t spin(std::uint64_t ns, cudaStream_t stream);
/** dst[i] = pattern_bits(salt, unit, base + i), i < n; eb = bytes per element (2: fp16, 4). */
cudaError_t pattern(void* dst, std::uint64_t n, int eb, std::uint32_t salt, std::int32_t unit,
                    std::uint64_t base, cudaStream_t stream);
/** dst[i] = src[0][i] + ... + src[count-1][i], summed in float in this order. */
cudaError_t sum(void* dst, const void* const* src, int count, std::uint64_t n, int eb,
                cudaStream_t stream);
/** dst[i] = src[i] * a (axpy = false) or dst[i] + src[i] * a (axpy = true). */
cudaError_t scale(void* dst, const void* src, float a, bool axpy, std::uint64_t n, int eb,
                  cudaStream_t stream);
/** out[0] += sum of bits[i] * (2i + 1), out[1] += NaN elements (out: two device words). */
cudaError_t probe(const void* p, std::uint64_t n, int eb, unsigned long long* out,
                  cudaStream_t stream);

}  // namespace hpz::real::kernels
