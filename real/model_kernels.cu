#include <cmath>
#include <cstddef>
#include <cstdint>

#include "real/model_kernels.hpp"

namespace hpz::real::model {
namespace {

// replay::adam_step's constants.
constexpr float kLearningRate = 1e-2f;
constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
constexpr float kMaxGradNorm = 1.0f;

constexpr int kThreads = 256;
// sum_squares: a fixed grid, so that each part is summed in the same order on every GPU.
constexpr int kSumBlocks = 256, kSumThreads = 256;

// Float arithmetic without fused multiply-adds (nvcc contracts a * b + c by default), so that
// each expression rounds as the CPU code does.
__device__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}

__device__ std::uint64_t first_index() {
  return blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
}
__device__ std::uint64_t grid_stride() {
  return std::uint64_t{gridDim.x} * blockDim.x;
}

/** partials[b] = block b's sum of p[i]^2 over its threads' strided elements, reduced by a fixed
 *  tree. */
__global__ void sum_squares_kernel(const float* p, std::uint64_t n, double* partials) {
  __shared__ double sums[kSumThreads];
  double acc = 0;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const double g = p[i];
    acc += g * g;  // exact square of a float, so a fused multiply-add rounds as the CPU's sum
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

/** One thread: *total += the partials, in order. */
__global__ void sum_partials_kernel(const double* partials, double* total) {
  double acc = *total;
  for (int b = 0; b < kSumBlocks; ++b) acc += partials[b];
  *total = acc;
}

__global__ void double_to_float_kernel(const double* in, float* out) {
  *out = static_cast<float>(*in);
}

/** adam_step per element; c1, c2: the bias corrections, computed on the host as the CPU does. */
__global__ void adam_kernel(float* p_out, const float* p_in, const float* grad,
                            const float* norm_sq, float* m, float* v, std::uint64_t n, float scale,
                            float c1, float c2) {
  const float total = mul_rn(__fsqrt_rn(norm_sq == nullptr ? 0.0f : *norm_sq), scale);
  const float q = div_rn(kMaxGradNorm, add_rn(total, 1e-6f));
  const float clip = q < 1.0f ? q : 1.0f;  // std::min(1.0f, q): 1 for a NaN norm
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const float gi = mul_rn(mul_rn(grad[i], scale), clip);
    const float mi = add_rn(mul_rn(kBeta1, m[i]), mul_rn(1 - kBeta1, gi));
    const float vi = add_rn(mul_rn(kBeta2, v[i]), mul_rn(mul_rn(1 - kBeta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float step =
        div_rn(mul_rn(kLearningRate, div_rn(mi, c1)), add_rn(__fsqrt_rn(div_rn(vi, c2)), kEps));
    p_out[i] = sub_rn(p_in[i], step);
  }
}

unsigned blocks(std::uint64_t n) {
  const std::uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

template <typename... Params, typename... Args>
void launch(std::uint64_t n, cudaStream_t stream, void (*kernel)(Params...), Args... args) {
  kernel<<<blocks(n), kThreads, 0, stream>>>(args...);
}

}  // namespace

std::size_t scratch_floats() {
  // sum_squares' partials and its total, in doubles, 256-byte aligned as cudaMalloc's blocks.
  constexpr std::size_t kAlign = 64;
  return (2 * (kSumBlocks + 1) + kAlign - 1) / kAlign * kAlign;
}

cudaError_t sum_squares(const float* const* parts, const std::uint64_t* n, int count, float* out,
                        double* scratch_doubles, cudaStream_t stream) {
  double* total = scratch_doubles + kSumBlocks;
  const cudaError_t err = cudaMemsetAsync(total, 0, sizeof(double), stream);
  if (err != cudaSuccess) return err;
  for (int k = 0; k < count; ++k) {
    if (n[k] == 0) continue;
    sum_squares_kernel<<<kSumBlocks, kSumThreads, 0, stream>>>(parts[k], n[k], scratch_doubles);
    sum_partials_kernel<<<1, 1, 0, stream>>>(scratch_doubles, total);
  }
  double_to_float_kernel<<<1, 1, 0, stream>>>(total, out);
  return cudaGetLastError();
}

cudaError_t adam(float* p_out, const float* p_in, const float* grad, const float* norm_sq, float* m,
                 float* v, std::uint64_t n, float scale, int step, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // The host's powf, so that the bias corrections are the CPU's bits.
  const float t = static_cast<float>(step + 1);
  const float c1 = 1 - std::pow(kBeta1, t), c2 = 1 - std::pow(kBeta2, t);
  launch(n, stream, adam_kernel, p_out, p_in, grad, norm_sq, m, v, n, scale, c1, c2);
  return cudaGetLastError();
}

}  // namespace hpz::real::model
