// The numeric replay's dense fp32 building blocks, used by the per-module Llama
// (llama_model.hpp): row-major matrices, weights in
// nn.Linear's [out x in] layout, and the replay's one source of pseudo-random numbers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace hpz::replay::fp32 {

using CSpan = std::span<const float>;
using Vec = std::vector<float>;

/** Y[t x out] = X[t x in] W', W [out x in] (nn.Linear without a bias). */
Vec matmul_t(CSpan x, CSpan w, int t, int in, int out);

/** dX[t x in] += dY[t x out] W and dW[out x in] += dY' X. */
void matmul_t_backward(CSpan x, CSpan w, CSpan dy, int t, int in, int out, Vec& dx,
                       std::span<float> dw);

float silu(float v);
/** d silu(v) / dv. */
float silu_grad(float v);

/** RMSNorm of each of the `rows` rows of x [rows x h]: x / sqrt(mean(x^2) + eps) * g. */
Vec rms_forward(CSpan g, CSpan x, int rows, int h, float eps);

/** Backward of rms_forward: returns dx; adds the gain's gradient into dg. */
Vec rms_backward(CSpan g, CSpan x, CSpan dy, int rows, int h, float eps, std::span<float> dg);

/** qwZ's int8 weight quantization and dequantization in place, as DeepSpeed's quantizer kernel
 *  does them (CUDAQuantizer, Symmetric, 8 bits: csrc/includes/quantization_utils.h lines 50-93
 *  at v0.13.4): `groups` equal contiguous groups, each scaled by 256 / (2 max|x|) (1 when the
 *  maximum is 0), rounded to the nearest even integer, clamped to [-128, 127], multiplied by
 *  the stored 1 / scale. A NaN is left out of its group's maximum (__hmax2 returns the other
 *  operand) and converts to 0 (__float2int_rn); a group of NaNs only stays NaN. Does nothing
 *  when groups is 0 or does not divide the size. */
void int8_symmetric_round_trip(std::span<float> v, std::uint64_t groups);

/** SplitMix64. */
std::uint64_t mix(std::uint64_t z);

/** Uniform in [-1, 1), the i-th value of the stream `seed`. */
float uniform(std::uint64_t seed, std::uint64_t i);

}  // namespace hpz::replay::fp32
