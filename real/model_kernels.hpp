// The numeric replay's gradient norm and optimizer step (NumericDomain::grad_norm,
// replay::adam_step) as CUDA kernels, so that a real run computes on the GPU what the replay
// computes on the CPU (the Llama's module kernels run on the host: cuda_backend.cpp). Every
// function only launches work on `stream` (it never allocates nor synchronizes: it is issued
// while a race is timed) and returns cudaGetLastError(). Results are deterministic: no
// floating-point atomics, every sum in a fixed order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hpz::real::model {

/** Floats of device scratch that one call of sum_squares needs (the scratch must be 8-byte
 *  aligned, as cudaMalloc's is; it may be reused between calls on the same stream). */
std::size_t scratch_floats();

/** *out = (float) sum over parts k, in order, of sum over i of (double) p[k][i]^2, as
 *  NumericDomain::grad_norm (each part summed by a fixed tree, so the rounding of the double sum
 *  may differ from the CPU's serial one). parts/n are HOST arrays of `count` device
 *  pointers/lengths. scratch_doubles: 257 doubles, e.g. the scratch of scratch_floats(). */
cudaError_t sum_squares(const float* const* parts, const std::uint64_t* n, int count, float* out,
                        double* scratch_doubles, cudaStream_t stream);

/** replay::adam_step (NumericDomain::adam) over n elements: p_out may alias p_in. norm_sq: one
 *  device float (the summed squares) or nullptr (taken as 0). scale = 1 / (world * grad_accum);
 *  step = op.step (t = step + 1). m, v: Adam state, n floats each, updated in place. */
cudaError_t adam(float* p_out, const float* p_in, const float* grad, const float* norm_sq, float* m,
                 float* v, std::uint64_t n, float scale, int step, cudaStream_t stream);

}  // namespace hpz::real::model
