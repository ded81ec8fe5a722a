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

enum Fn { kEmbed = 0, kNorm = 1, kAttn = 2, kMlp = 3, kHead = 4 };

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

__device__ float nan_value() {
  return __int_as_float(0x7fc00000);
}

__device__ float silu(float v) {
  return div_rn(v, add_rn(1.0f, expf(-v)));
}
__device__ float silu_grad(float v) {
  const float s = div_rn(1.0f, add_rn(1.0f, expf(-v)));
  return mul_rn(s, add_rn(1.0f, mul_rn(v, sub_rn(1.0f, s))));
}

__device__ std::uint64_t first_index() {
  return blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
}
__device__ std::uint64_t grid_stride() {
  return std::uint64_t{gridDim.x} * blockDim.x;
}

/** 1 / rms of row r of x [t x h], as rms_forward. */
__device__ float rms_inv(const float* x, int r, int h) {
  const float* xr = x + static_cast<std::size_t>(r) * h;
  float ss = 0;
  for (int k = 0; k < h; ++k) ss = add_rn(ss, mul_rn(xr[k], xr[k]));
  return div_rn(1.0f, __fsqrt_rn(add_rn(div_rn(ss, static_cast<float>(h)), 1e-6f)));
}

__global__ void embed_forward_kernel(const float* w, const int* tokens, Dims d, float* y) {
  const std::uint64_t n = static_cast<std::uint64_t>(d.seq) * d.hidden;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const int r = static_cast<int>(i / d.hidden), k = static_cast<int>(i % d.hidden);
    const int tok = tokens[r];
    y[i] =
        tok >= 0 && tok < d.vocab ? w[static_cast<std::size_t>(tok) * d.hidden + k] : nan_value();
  }
}

/** One thread per row: it reads its row of x before writing the same row of y, so y may
 *  alias x. */
__global__ void rms_forward_kernel(const float* g, const float* x, Dims d, float* y) {
  for (std::uint64_t r = first_index(); r < static_cast<std::uint64_t>(d.seq); r += grid_stride()) {
    const int h = d.hidden;
    const float inv = rms_inv(x, static_cast<int>(r), h);
    for (int k = 0; k < h; ++k) {
      const std::size_t i = r * h + k;
      y[i] = mul_rn(mul_rn(x[i], inv), g[k]);
    }
  }
}

/** y[t x out] = x[t x in] w' (w [out x in]), then tanh or + residual [t x out] (read only at
 *  the element written, so y may alias residual). */
__global__ void matmul_t_kernel(const float* x, const float* w, int t, int in, int out,
                                bool tanh_out, const float* residual, float* y) {
  const std::uint64_t n = static_cast<std::uint64_t>(t) * out;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const float* xr = x + i / out * in;
    const float* wo = w + i % out * in;
    float s = 0;
    for (int k = 0; k < in; ++k) s = add_rn(s, mul_rn(xr[k], wo[k]));
    if (tanh_out) s = tanhf(s);
    if (residual != nullptr) s = add_rn(s, residual[i]);
    y[i] = s;
  }
}

/** Up to three products g [t x out] times w [out x in] summed into one dx [t x in]. */
struct Terms {
  const float* g[3];
  const float* w[3];
  int count;
};

/** dx[r, k] = init[r, k] (or 0) + sum over terms j, o of g_j[r, o] w_j[o, k], added one at a
 *  time in the order of matmul_t_backward's calls and loops. init is read only at the element
 *  written, so dx may alias init. */
__global__ void matmul_t_dx_kernel(const float* init, Terms terms, int t, int in, int out,
                                   float* dx) {
  const std::uint64_t n = static_cast<std::uint64_t>(t) * in;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const std::uint64_t r = i / in, k = i % in;
    float acc = init == nullptr ? 0.0f : init[i];
    for (int j = 0; j < terms.count; ++j) {
      const float* gr = terms.g[j] + r * out;
      for (int o = 0; o < out; ++o) acc = add_rn(acc, mul_rn(gr[o], terms.w[j][o * in + k]));
    }
    dx[i] = acc;
  }
}

/** dw[o, k] = sum over r, in order, of g[r, o] x[r, k] (x [t x in], g [t x out]). */
__global__ void matmul_t_dw_kernel(const float* x, const float* g, int t, int in, int out,
                                   float* dw) {
  const std::uint64_t n = static_cast<std::uint64_t>(out) * in;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const std::uint64_t o = i / in, k = i % in;
    float acc = 0;
    for (int r = 0; r < t; ++r) acc = add_rn(acc, mul_rn(g[r * out + o], x[r * in + k]));
    dw[i] = acc;
  }
}

/** One thread per column k: v = causal mean of tk * pv, uv = u * v. */
__global__ void causal_mean_kernel(const float* u, const float* tk, const float* pv, int t, int h,
                                   float* v, float* uv) {
  for (std::uint64_t k = first_index(); k < static_cast<std::uint64_t>(h); k += grid_stride()) {
    float run = 0;
    for (int r = 0; r < t; ++r) {
      const std::size_t i = static_cast<std::size_t>(r) * h + k;
      run = add_rn(run, mul_rn(tk[i], pv[i]));
      v[i] = div_rn(run, static_cast<float>(r + 1));
      uv[i] = mul_rn(u[i], v[i]);
    }
  }
}

/** From duv: dpq (through tanh) and dv. */
__global__ void attn_uv_backward_kernel(const float* duv, const float* u, const float* v,
                                        std::uint64_t n, float* dpq, float* dv) {
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    dpq[i] = mul_rn(mul_rn(duv[i], v[i]), sub_rn(1.0f, mul_rn(u[i], u[i])));
    dv[i] = mul_rn(duv[i], u[i]);
  }
}

/** One thread per column k: dprod = causal_mean_backward(dv), then dpk (through tanh), dpv. */
__global__ void causal_mean_backward_kernel(const float* dv, const float* tk, const float* pv,
                                            int t, int h, float* dpk, float* dpv) {
  for (std::uint64_t k = first_index(); k < static_cast<std::uint64_t>(h); k += grid_stride()) {
    float run = 0;
    for (int r = t - 1; r >= 0; --r) {
      const std::size_t i = static_cast<std::size_t>(r) * h + k;
      run = add_rn(run, div_rn(dv[i], static_cast<float>(r + 1)));
      dpk[i] = mul_rn(mul_rn(run, pv[i]), sub_rn(1.0f, mul_rn(tk[i], tk[i])));
      dpv[i] = mul_rn(run, tk[i]);
    }
  }
}

__global__ void gate_kernel(const float* g, const float* up, std::uint64_t n, float* a) {
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) a[i] = mul_rn(silu(g[i]), up[i]);
}

__global__ void gate_backward_kernel(const float* da, const float* g, const float* up,
                                     std::uint64_t n, float* dg, float* dup) {
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    dg[i] = mul_rn(mul_rn(da[i], up[i]), silu_grad(g[i]));
    dup[i] = mul_rn(da[i], silu(g[i]));
  }
}

__global__ void rms_inv_kernel(const float* x, Dims d, float* inv) {
  for (std::uint64_t r = first_index(); r < static_cast<std::uint64_t>(d.seq); r += grid_stride()) {
    inv[r] = rms_inv(x, static_cast<int>(r), d.hidden);
  }
}

/** One thread per k: dgain[k] = sum over rows, in order, of dy x inv. */
__global__ void rms_gain_backward_kernel(const float* x, const float* dy, const float* inv, Dims d,
                                         float* dgain) {
  for (std::uint64_t k = first_index(); k < static_cast<std::uint64_t>(d.hidden);
       k += grid_stride()) {
    float acc = 0;
    for (int r = 0; r < d.seq; ++r) {
      const std::size_t i = static_cast<std::size_t>(r) * d.hidden + k;
      acc = add_rn(acc, mul_rn(mul_rn(dy[i], x[i]), inv[r]));
    }
    dgain[k] = acc;
  }
}

/** One thread per row: it reads its row of dy before writing the same row of dx, so dx may
 *  alias dy. */
__global__ void rms_dx_kernel(const float* g, const float* x, const float* dy, const float* inv,
                              Dims d, float* dx) {
  const int h = d.hidden;
  for (std::uint64_t r = first_index(); r < static_cast<std::uint64_t>(d.seq); r += grid_stride()) {
    const float* xr = x + r * h;
    const float* dyr = dy + r * h;
    float dot = 0;
    for (int k = 0; k < h; ++k) dot = add_rn(dot, mul_rn(mul_rn(dyr[k], g[k]), xr[k]));
    const float ir = inv[r];
    for (int k = 0; k < h; ++k) {
      const float back = div_rn(mul_rn(mul_rn(mul_rn(xr[k], ir), ir), dot), static_cast<float>(h));
      dx[r * h + k] = mul_rn(ir, sub_rn(mul_rn(dyr[k], g[k]), back));
    }
  }
}

/** For each row r: whether it is its token's first row (or -1 for a token outside the
 *  vocabulary) and the next row with the same token (seq if none). */
__global__ void token_chain_kernel(const int* tokens, Dims d, int* first, int* next) {
  for (std::uint64_t r = first_index(); r < static_cast<std::uint64_t>(d.seq); r += grid_stride()) {
    const int tok = tokens[r];
    int is_first = tok >= 0 && tok < d.vocab ? 1 : -1;
    for (std::uint64_t q = 0; q < r && is_first == 1; ++q) is_first = tokens[q] == tok ? 0 : 1;
    int after = d.seq;
    for (int q = static_cast<int>(r) + 1; q < d.seq; ++q) {
      if (tokens[q] == tok) {
        after = q;
        break;
      }
    }
    first[r] = is_first;
    next[r] = after;
  }
}

/** One thread per (first row of a token, k): dw[token, k] = the sum over that token's rows, in
 *  order, of dy[r, k] (dw zeroed before). */
__global__ void embed_backward_kernel(const int* tokens, const int* first, const int* next,
                                      const float* dy, Dims d, float* dw) {
  const int h = d.hidden;
  const std::uint64_t n = static_cast<std::uint64_t>(d.seq) * h;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const int r0 = static_cast<int>(i / h), k = static_cast<int>(i % h);
    if (first[r0] != 1) continue;
    float acc = 0;
    for (int r = r0; r < d.seq; r = next[r])
      acc = add_rn(acc, dy[static_cast<std::size_t>(r) * h + k]);
    dw[static_cast<std::size_t>(tokens[r0]) * h + k] = acc;
  }
}

/** One thread per row: max (as std::max_element), the softmax denominator and the row's loss
 *  (rows before the last), and whether the row holds a NaN (every row). */
__global__ void loss_rows_kernel(const float* logits, const int* tokens, Dims d, float* mx,
                                 double* z, double* row_loss, int* has_nan) {
  const int vocab = d.vocab;
  for (std::uint64_t r = first_index(); r < static_cast<std::uint64_t>(d.seq); r += grid_stride()) {
    const float* row = logits + r * vocab;
    int nan = 0;
    for (int k = 0; k < vocab; ++k) nan |= isnan(row[k]) ? 1 : 0;
    has_nan[r] = nan;
    if (r + 1 >= static_cast<std::uint64_t>(d.seq)) continue;
    float m = row[0];
    for (int k = 1; k < vocab; ++k) {
      if (m < row[k]) m = row[k];
    }
    double sum = 0;
    for (int k = 0; k < vocab; ++k) sum += exp(static_cast<double>(row[k] - m));
    const int target = tokens[r + 1];
    mx[r] = m;
    z[r] = sum;
    row_loss[r] = target >= 0 && target < vocab ? log(sum) - static_cast<double>(row[target] - m)
                                                : static_cast<double>(nan_value());
  }
}

/** One thread per logit: reads logits only at the element written (the row statistics are in
 *  scratch), so dlogits may alias logits. */
__global__ void dlogits_kernel(const float* logits, const int* tokens, Dims d, const float* mx,
                               const double* z, float* dlogits) {
  const int n_rows = d.seq - 1;
  const std::uint64_t n = static_cast<std::uint64_t>(d.seq) * d.vocab;
  for (std::uint64_t i = first_index(); i < n; i += grid_stride()) {
    const int r = static_cast<int>(i / d.vocab), k = static_cast<int>(i % d.vocab);
    if (r >= n_rows) {
      dlogits[i] = 0.0f;
      continue;
    }
    const double p = exp(static_cast<double>(logits[i] - mx[r])) / z[r];
    dlogits[i] = static_cast<float>((p - (k == tokens[r + 1] ? 1.0 : 0.0)) / n_rows);
  }
}

/** One thread: the rows' losses summed in order. */
__global__ void loss_total_kernel(const double* row_loss, const int* has_nan, int seq,
                                  float* loss) {
  const int n_rows = seq - 1;
  double sum = 0;
  for (int r = 0; r < n_rows; ++r) sum += row_loss[r];
  int nan = 0;
  for (int r = 0; r < seq; ++r) nan |= has_nan[r];
  *loss = nan != 0 ? nan_value() : static_cast<float>(sum / n_rows);
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

std::size_t size(int a, int b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

/** Carves the scratch into regions (256-byte aligned); with a null base it only counts, for
 *  scratch_floats. */
class Arena {
 public:
  explicit Arena(float* base) : base_(base) {}
  float* floats(std::size_t n) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (n + kAlign - 1) / kAlign * kAlign;
    return p;
  }
  int* ints(std::size_t n) { return reinterpret_cast<int*>(floats(n)); }
  double* doubles(std::size_t n) { return reinterpret_cast<double*>(floats(2 * n)); }
  std::size_t used() const { return used_; }

 private:
  static constexpr std::size_t kAlign = 64;
  float* base_;
  std::size_t used_ = 0;
};

/** The attention unit's intermediates, [seq x hidden] each. */
struct AttnScratch {
  float *u, *tk, *pv, *v, *uv, *duv, *dpq, *dv, *dpk, *dpv;
  AttnScratch(Arena& a, const Dims& d) {
    for (float** p : {&u, &tk, &pv, &v, &uv, &duv, &dpq, &dv, &dpk, &dpv}) {
      *p = a.floats(size(d.seq, d.hidden));
    }
  }
};

/** The MLP unit's intermediates, [seq x ffn] each. */
struct MlpScratch {
  float *g, *up, *a, *da, *dg, *dup;
  MlpScratch(Arena& arena, const Dims& d) {
    for (float** p : {&g, &up, &a, &da, &dg, &dup}) *p = arena.floats(size(d.seq, d.ffn));
  }
};

/** The loss's per-row statistics. */
struct LossScratch {
  float* mx;
  double *z, *row_loss;
  int* has_nan;
  LossScratch(Arena& a, const Dims& d)
      : mx(a.floats(size(d.seq, 1))),
        z(a.doubles(size(d.seq, 1))),
        row_loss(a.doubles(size(d.seq, 1))),
        has_nan(a.ints(size(d.seq, 1))) {}
};

/** Parameters of a unit: the layout of tiny_model.hpp. */
std::uint64_t param_count(int fn, const Dims& d) {
  const std::uint64_t h = static_cast<std::uint64_t>(d.hidden);
  switch (fn) {
    case kEmbed:
    case kHead:
      return static_cast<std::uint64_t>(d.vocab) * h;
    case kNorm:
      return h;
    case kAttn:
      return 4 * h * h;
    case kMlp:
      return 3 * h * static_cast<std::uint64_t>(d.ffn);
    default:
      return 0;
  }
}

/** u = tanh(x Wq'), tk = tanh(x Wk'), pv = x Wv', v = cmean(tk * pv), uv = u * v. */
void attn_state(const Dims& d, const float* w, const float* x, const AttnScratch& b,
                cudaStream_t s) {
  const int t = d.seq, h = d.hidden;
  const std::size_t m = size(h, h), th = size(t, h);
  launch(th, s, matmul_t_kernel, x, w, t, h, h, true, nullptr, b.u);
  launch(th, s, matmul_t_kernel, x, w + m, t, h, h, true, nullptr, b.tk);
  launch(th, s, matmul_t_kernel, x, w + 2 * m, t, h, h, false, nullptr, b.pv);
  launch(h, s, causal_mean_kernel, b.u, b.tk, b.pv, t, h, b.v, b.uv);
}

void attn_forward(const Dims& d, const float* w, const float* x, float* y, float* scratch,
                  cudaStream_t s) {
  Arena arena(scratch);
  const AttnScratch b(arena, d);
  const int t = d.seq, h = d.hidden;
  attn_state(d, w, x, b, s);
  // Reads x only as the residual of the element written: y may alias x.
  launch(size(t, h), s, matmul_t_kernel, b.uv, w + 3 * size(h, h), t, h, h, false, x, y);
}

void attn_backward(const Dims& d, const float* w, const float* x, const float* dy, float* dx,
                   float* dw, float* scratch, cudaStream_t s) {
  Arena arena(scratch);
  const AttnScratch b(arena, d);
  const int t = d.seq, h = d.hidden;
  const std::size_t m = size(h, h), th = size(t, h);
  attn_state(d, w, x, b, s);
  launch(th, s, matmul_t_dx_kernel, nullptr, Terms{{dy}, {w + 3 * m}, 1}, t, h, h, b.duv);
  launch(m, s, matmul_t_dw_kernel, b.uv, dy, t, h, h, dw + 3 * m);
  launch(th, s, attn_uv_backward_kernel, b.duv, b.u, b.v, th, b.dpq, b.dv);
  launch(h, s, causal_mean_backward_kernel, b.dv, b.tk, b.pv, t, h, b.dpk, b.dpv);
  launch(m, s, matmul_t_dw_kernel, x, b.dpq, t, h, h, dw);
  launch(m, s, matmul_t_dw_kernel, x, b.dpk, t, h, h, dw + m);
  launch(m, s, matmul_t_dw_kernel, x, b.dpv, t, h, h, dw + 2 * m);
  // Last, and reading dy only at the element written: dx may alias dy.
  const Terms qkv{{b.dpq, b.dpk, b.dpv}, {w, w + m, w + 2 * m}, 3};
  launch(th, s, matmul_t_dx_kernel, dy, qkv, t, h, h, dx);
}

/** g = x Wg', up = x Wu', a = silu(g) * up. */
void mlp_state(const Dims& d, const float* w, const float* x, const MlpScratch& b, cudaStream_t s) {
  const int t = d.seq, h = d.hidden, f = d.ffn;
  const std::size_t m = size(h, f), tf = size(t, f);
  launch(tf, s, matmul_t_kernel, x, w, t, h, f, false, nullptr, b.g);
  launch(tf, s, matmul_t_kernel, x, w + m, t, h, f, false, nullptr, b.up);
  launch(tf, s, gate_kernel, b.g, b.up, tf, b.a);
}

void mlp_forward(const Dims& d, const float* w, const float* x, float* y, float* scratch,
                 cudaStream_t s) {
  Arena arena(scratch);
  const MlpScratch b(arena, d);
  const int t = d.seq, h = d.hidden, f = d.ffn;
  mlp_state(d, w, x, b, s);
  // Reads x only as the residual of the element written: y may alias x.
  launch(size(t, h), s, matmul_t_kernel, b.a, w + 2 * size(h, f), t, f, h, false, x, y);
}

void mlp_backward(const Dims& d, const float* w, const float* x, const float* dy, float* dx,
                  float* dw, float* scratch, cudaStream_t s) {
  Arena arena(scratch);
  const MlpScratch b(arena, d);
  const int t = d.seq, h = d.hidden, f = d.ffn;
  const std::size_t m = size(h, f), tf = size(t, f);
  mlp_state(d, w, x, b, s);
  launch(tf, s, matmul_t_dx_kernel, nullptr, Terms{{dy}, {w + 2 * m}, 1}, t, f, h, b.da);
  launch(m, s, matmul_t_dw_kernel, b.a, dy, t, f, h, dw + 2 * m);
  launch(tf, s, gate_backward_kernel, b.da, b.g, b.up, tf, b.dg, b.dup);
  launch(m, s, matmul_t_dw_kernel, x, b.dg, t, h, f, dw);
  launch(m, s, matmul_t_dw_kernel, x, b.dup, t, h, f, dw + m);
  // Last, and reading dy only at the element written: dx may alias dy.
  launch(size(t, h), s, matmul_t_dx_kernel, dy, Terms{{b.dg, b.dup}, {w, w + m}, 2}, t, h, f, dx);
}

/** The head's output or input gradient goes through scratch when it aliases an input it is
 *  computed from (its rows differ in length). */
cudaError_t head_forward(const Dims& d, const float* w, const float* x, float* y, float* scratch,
                         cudaStream_t s) {
  const std::size_t tv = size(d.seq, d.vocab);
  float* out = y == x ? Arena(scratch).floats(tv) : y;
  launch(tv, s, matmul_t_kernel, x, w, d.seq, d.hidden, d.vocab, false, nullptr, out);
  if (out == y) return cudaSuccess;
  return cudaMemcpyAsync(y, out, tv * sizeof(float), cudaMemcpyDeviceToDevice, s);
}

cudaError_t head_backward(const Dims& d, const float* w, const float* x, const float* dy, float* dx,
                          float* dw, float* scratch, cudaStream_t s) {
  const std::size_t th = size(d.seq, d.hidden);
  launch(size(d.vocab, d.hidden), s, matmul_t_dw_kernel, x, dy, d.seq, d.hidden, d.vocab, dw);
  float* out = dx == dy || dx == x ? Arena(scratch).floats(th) : dx;
  launch(th, s, matmul_t_dx_kernel, nullptr, Terms{{dy}, {w}, 1}, d.seq, d.hidden, d.vocab, out);
  if (out == dx) return cudaSuccess;
  return cudaMemcpyAsync(dx, out, th * sizeof(float), cudaMemcpyDeviceToDevice, s);
}

void norm_backward(const Dims& d, const float* g, const float* x, const float* dy, float* dx,
                   float* dg, float* scratch, cudaStream_t s) {
  float* inv = Arena(scratch).floats(size(d.seq, 1));
  launch(d.seq, s, rms_inv_kernel, x, d, inv);
  launch(d.hidden, s, rms_gain_backward_kernel, x, dy, inv, d, dg);
  launch(d.seq, s, rms_dx_kernel, g, x, dy, inv, d, dx);
}

cudaError_t embed_backward(const Dims& d, std::uint64_t numel, const int* tokens, const float* dy,
                           float* dx, float* dw, float* scratch, cudaStream_t s) {
  Arena arena(scratch);
  int* first = arena.ints(size(d.seq, 1));
  int* next = arena.ints(size(d.seq, 1));
  cudaError_t err = cudaMemsetAsync(dw, 0, numel * sizeof(float), s);
  if (err != cudaSuccess) return err;
  launch(d.seq, s, token_chain_kernel, tokens, d, first, next);
  launch(size(d.seq, d.hidden), s, embed_backward_kernel, tokens, first, next, dy, d, dw);
  if (dx == dy) return cudaSuccess;
  return cudaMemcpyAsync(dx, dy, size(d.seq, d.hidden) * sizeof(float), cudaMemcpyDeviceToDevice,
                         s);
}

}  // namespace

std::size_t scratch_floats(const Dims& d) {
  Arena attn(nullptr), mlp(nullptr), head(nullptr), norm(nullptr), embed(nullptr), loss(nullptr),
      sums(nullptr);
  (void)AttnScratch(attn, d);
  (void)MlpScratch(mlp, d);
  head.floats(size(d.seq, d.vocab > d.hidden ? d.vocab : d.hidden));
  norm.floats(size(d.seq, 1));
  embed.ints(size(d.seq, 1));
  embed.ints(size(d.seq, 1));
  (void)LossScratch(loss, d);
  sums.doubles(kSumBlocks + 1);
  std::size_t most = 0;
  for (const Arena* a : {&attn, &mlp, &head, &norm, &embed, &loss, &sums}) {
    most = a->used() > most ? a->used() : most;
  }
  return most;
}

cudaError_t unit_forward(int fn, const Dims& d, const float* w, const float* x, const int* tokens,
                         float* y, float* scratch, cudaStream_t stream) {
  switch (fn) {
    case kEmbed:  // reads no x: y may alias it
      launch(size(d.seq, d.hidden), stream, embed_forward_kernel, w, tokens, d, y);
      break;
    case kNorm:
      launch(d.seq, stream, rms_forward_kernel, w, x, d, y);
      break;
    case kAttn:
      attn_forward(d, w, x, y, scratch, stream);
      break;
    case kMlp:
      mlp_forward(d, w, x, y, scratch, stream);
      break;
    case kHead: {
      const cudaError_t err = head_forward(d, w, x, y, scratch, stream);
      if (err != cudaSuccess) return err;
      break;
    }
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t unit_backward(int fn, const Dims& d, std::uint64_t numel, const float* w,
                          const float* x, const int* tokens, const float* dy, float* dx, float* dw,
                          float* scratch, cudaStream_t stream) {
  const std::uint64_t own = param_count(fn, d);
  if (own == 0 || numel < own) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (numel > own && fn != kEmbed) {
    err = cudaMemsetAsync(dw + own, 0, (numel - own) * sizeof(float), stream);
  }
  if (err != cudaSuccess) return err;
  switch (fn) {
    case kEmbed:
      err = embed_backward(d, numel, tokens, dy, dx, dw, scratch, stream);
      break;
    case kNorm:
      norm_backward(d, w, x, dy, dx, dw, scratch, stream);
      break;
    case kAttn:
      attn_backward(d, w, x, dy, dx, dw, scratch, stream);
      break;
    case kMlp:
      mlp_backward(d, w, x, dy, dx, dw, scratch, stream);
      break;
    default:
      err = head_backward(d, w, x, dy, dx, dw, scratch, stream);
      break;
  }
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

cudaError_t next_token_loss(const Dims& d, const float* logits, const int* tokens, float* dlogits,
                            float* loss, float* scratch, cudaStream_t stream) {
  Arena arena(scratch);
  const LossScratch b(arena, d);
  launch(d.seq, stream, loss_rows_kernel, logits, tokens, d, b.mx, b.z, b.row_loss, b.has_nan);
  launch(size(d.seq, d.vocab), stream, dlogits_kernel, logits, tokens, d, b.mx, b.z, dlogits);
  loss_total_kernel<<<1, 1, 0, stream>>>(b.row_loss, b.has_nan, d.seq, loss);
  return cudaGetLastError();
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
