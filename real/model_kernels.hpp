// The numeric replay's tiny transformer (sim/replay/tiny_model.cpp) and optimizer step
// (replay::adam_step, NumericDomain::grad_norm) as CUDA kernels, so that a real run computes on the
// GPU what the replay computes on the CPU. Every function only launches work on `stream` (it
// never allocates nor synchronizes: it is issued while a race is timed) and returns
// cudaGetLastError(). Results are deterministic: no floating-point atomics, every sum in a fixed
// order, mostly the CPU code's (close to its results, not bit-equal: expf/tanhf differ by an ulp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace hpz::real::model {

/** Sizes of the model, as replay::TinyDims. */
struct Dims {
  int seq = 0, hidden = 0, ffn = 0, vocab = 0;
};

/** Floats of device scratch that one call of any function below needs for these dims (the
 *  scratch must be 8-byte aligned, as cudaMalloc's is; it may be reused between calls on the
 *  same stream). No function needs scratch in proportion to a unit's parameters: unit_backward
 *  writes its dw where the caller says. */
std::size_t scratch_floats(const Dims& d);

/** Forward of one unit. fn: static_cast<int>(replay::UnitFn) (0 embed, 1 norm, 2 attn, 3 mlp,
 *  4 head). w: the unit's weights; x [seq x hidden] (ignored by embed); tokens: seq ints on the
 *  device (an embed row of a token outside [0, vocab) is NaN). y [seq x hidden] (head:
 *  [seq x vocab]); y may alias x. cudaErrorInvalidValue for an unknown fn. */
cudaError_t unit_forward(int fn, const Dims& d, const float* w, const float* x, const int* tokens,
                         float* y, float* scratch, cudaStream_t stream);

/** Backward of one unit: from dy (the gradient of its output) dx [seq x hidden] and dw: the
 *  unit's `numel` gradient floats, overwritten (not accumulated; past the unit's own parameters
 *  zeroed). dx may alias dy. cudaErrorInvalidValue for an unknown fn or a numel below the unit's
 *  parameter count. */
cudaError_t unit_backward(int fn, const Dims& d, std::uint64_t numel, const float* w,
                          const float* x, const int* tokens, const float* dy, float* dx, float* dw,
                          float* scratch, cudaStream_t stream);

/** Mean next-token cross entropy of logits [seq x vocab] into *loss (one device float, NaN if
 *  any logit is NaN, as the CPU code); dlogits [seq x vocab] (may alias logits). */
cudaError_t next_token_loss(const Dims& d, const float* logits, const int* tokens, float* dlogits,
                            float* loss, float* scratch, cudaStream_t stream);

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
