#include "sim/replay/tiny_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "sim/replay/fp32_math.hpp"

namespace hpz::replay {
namespace {

using fp32::CSpan;
using fp32::matmul_t;
using fp32::matmul_t_backward;
using fp32::mix;
using fp32::silu;
using fp32::silu_grad;
using fp32::uniform;
using fp32::Vec;

/** Prefix mean over positions of a [t x n] matrix. */
Vec causal_mean(CSpan a, int t, int n) {
  Vec m(a.size());
  std::vector<float> run(n, 0.0f);
  for (int r = 0; r < t; ++r) {
    for (int k = 0; k < n; ++k) {
      run[k] += a[r * n + k];
      m[r * n + k] = run[k] / static_cast<float>(r + 1);
    }
  }
  return m;
}

/** Backward of causal_mean: da[s] = sum over r >= s of dm[r] / (r + 1). */
Vec causal_mean_backward(CSpan dm, int t, int n) {
  Vec da(dm.size());
  std::vector<float> run(n, 0.0f);
  for (int r = t - 1; r >= 0; --r) {
    for (int k = 0; k < n; ++k) {
      run[k] += dm[r * n + k] / static_cast<float>(r + 1);
      da[r * n + k] = run[k];
    }
  }
  return da;
}

Vec rms_forward(const TinyDims& d, CSpan g, CSpan x) {
  return fp32::rms_forward(g, x, d.seq, d.hidden, 1e-6f);
}

Vec rms_backward(const TinyDims& d, CSpan g, CSpan x, CSpan dy, std::span<float> dg) {
  return fp32::rms_backward(g, x, dy, d.seq, d.hidden, 1e-6f, dg);
}

/** The intermediate values of the attention unit. */
struct AttnState {
  Vec u, tk, pv, v;
};

AttnState attn_state(const TinyDims& d, CSpan w, CSpan x) {
  const int h = d.hidden, t = d.seq;
  const std::size_t m = static_cast<std::size_t>(h) * h;
  AttnState s;
  s.u = matmul_t(x, w.subspan(0, m), t, h, h);
  for (float& v : s.u) v = std::tanh(v);
  s.tk = matmul_t(x, w.subspan(m, m), t, h, h);
  for (float& v : s.tk) v = std::tanh(v);
  s.pv = matmul_t(x, w.subspan(2 * m, m), t, h, h);
  Vec prod(s.tk.size());
  for (std::size_t i = 0; i < prod.size(); ++i) prod[i] = s.tk[i] * s.pv[i];
  s.v = causal_mean(prod, t, h);
  return s;
}

Vec attn_forward(const TinyDims& d, CSpan w, CSpan x) {
  const int h = d.hidden;
  const std::size_t m = static_cast<std::size_t>(h) * h;
  const AttnState s = attn_state(d, w, x);
  Vec uv(s.u.size());
  for (std::size_t i = 0; i < uv.size(); ++i) uv[i] = s.u[i] * s.v[i];
  Vec y = matmul_t(uv, w.subspan(3 * m, m), d.seq, h, h);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
  return y;
}

Vec attn_backward(const TinyDims& d, CSpan w, CSpan x, CSpan dy, std::span<float> dw) {
  const int h = d.hidden, t = d.seq;
  const std::size_t m = static_cast<std::size_t>(h) * h;
  const AttnState s = attn_state(d, w, x);
  Vec uv(s.u.size());
  for (std::size_t i = 0; i < uv.size(); ++i) uv[i] = s.u[i] * s.v[i];
  Vec duv(uv.size(), 0.0f);
  matmul_t_backward(uv, w.subspan(3 * m, m), dy, t, h, h, duv, dw.subspan(3 * m, m));
  Vec dpq(uv.size()), dv(uv.size());
  for (std::size_t i = 0; i < uv.size(); ++i) {
    dpq[i] = duv[i] * s.v[i] * (1 - s.u[i] * s.u[i]);
    dv[i] = duv[i] * s.u[i];
  }
  const Vec dprod = causal_mean_backward(dv, t, h);
  Vec dpk(uv.size()), dpv(uv.size());
  for (std::size_t i = 0; i < uv.size(); ++i) {
    dpk[i] = dprod[i] * s.pv[i] * (1 - s.tk[i] * s.tk[i]);
    dpv[i] = dprod[i] * s.tk[i];
  }
  Vec dx(dy.begin(), dy.end());
  matmul_t_backward(x, w.subspan(0, m), dpq, t, h, h, dx, dw.subspan(0, m));
  matmul_t_backward(x, w.subspan(m, m), dpk, t, h, h, dx, dw.subspan(m, m));
  matmul_t_backward(x, w.subspan(2 * m, m), dpv, t, h, h, dx, dw.subspan(2 * m, m));
  return dx;
}

Vec mlp_forward(const TinyDims& d, CSpan w, CSpan x) {
  const int h = d.hidden, f = d.ffn, t = d.seq;
  const std::size_t m = static_cast<std::size_t>(h) * f;
  const Vec g = matmul_t(x, w.subspan(0, m), t, h, f);
  const Vec up = matmul_t(x, w.subspan(m, m), t, h, f);
  Vec a(g.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = silu(g[i]) * up[i];
  Vec y = matmul_t(a, w.subspan(2 * m, m), t, f, h);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
  return y;
}

Vec mlp_backward(const TinyDims& d, CSpan w, CSpan x, CSpan dy, std::span<float> dw) {
  const int h = d.hidden, f = d.ffn, t = d.seq;
  const std::size_t m = static_cast<std::size_t>(h) * f;
  const Vec g = matmul_t(x, w.subspan(0, m), t, h, f);
  const Vec up = matmul_t(x, w.subspan(m, m), t, h, f);
  Vec a(g.size());
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = silu(g[i]) * up[i];
  Vec da(a.size(), 0.0f);
  matmul_t_backward(a, w.subspan(2 * m, m), dy, t, f, h, da, dw.subspan(2 * m, m));
  Vec dg(a.size()), dup(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    dg[i] = da[i] * up[i] * silu_grad(g[i]);
    dup[i] = da[i] * silu(g[i]);
  }
  Vec dx(dy.begin(), dy.end());
  matmul_t_backward(x, w.subspan(0, m), dg, t, h, f, dx, dw.subspan(0, m));
  matmul_t_backward(x, w.subspan(m, m), dup, t, h, f, dx, dw.subspan(m, m));
  return dx;
}

}  // namespace

UnitFn unit_fn(const std::string& n) {
  if (n == "embed") return UnitFn::kEmbed;
  if (n == "lm_head") return UnitFn::kHead;
  if (n.ends_with(".attn")) return UnitFn::kAttn;
  if (n.ends_with(".mlp")) return UnitFn::kMlp;
  return UnitFn::kNorm;
}

std::vector<float> unit_forward(UnitFn fn, const TinyDims& d, CSpan w, CSpan x,
                                std::span<const int> tokens) {
  switch (fn) {
    case UnitFn::kEmbed: {
      Vec y(static_cast<std::size_t>(d.seq) * d.hidden);
      for (int r = 0; r < d.seq; ++r) {
        std::copy_n(w.begin() + tokens[r] * d.hidden, d.hidden, y.begin() + r * d.hidden);
      }
      return y;
    }
    case UnitFn::kNorm:
      return rms_forward(d, w, x);
    case UnitFn::kAttn:
      return attn_forward(d, w, x);
    case UnitFn::kMlp:
      return mlp_forward(d, w, x);
    case UnitFn::kHead:
      return matmul_t(x, w, d.seq, d.hidden, d.vocab);
  }
  return {};
}

std::vector<float> unit_backward(UnitFn fn, const TinyDims& d, CSpan w, CSpan x,
                                 std::span<const int> tokens, CSpan dy, std::span<float> dw) {
  std::fill(dw.begin(), dw.end(), 0.0f);
  switch (fn) {
    case UnitFn::kEmbed:
      for (int r = 0; r < d.seq; ++r) {
        for (int k = 0; k < d.hidden; ++k) dw[tokens[r] * d.hidden + k] += dy[r * d.hidden + k];
      }
      return Vec(dy.begin(), dy.end());
    case UnitFn::kNorm:
      return rms_backward(d, w, x, dy, dw);
    case UnitFn::kAttn:
      return attn_backward(d, w, x, dy, dw);
    case UnitFn::kMlp:
      return mlp_backward(d, w, x, dy, dw);
    case UnitFn::kHead: {
      Vec dx(static_cast<std::size_t>(d.seq) * d.hidden, 0.0f);
      matmul_t_backward(x, w, dy, d.seq, d.hidden, d.vocab, dx, dw);
      return dx;
    }
  }
  return {};
}

float next_token_loss(const TinyDims& d, CSpan logits, std::span<const int> tokens,
                      std::vector<float>& dlogits) {
  dlogits.assign(logits.size(), 0.0f);
  const int n = d.seq - 1;
  double loss = 0;
  for (int r = 0; r < n; ++r) {
    const CSpan row = logits.subspan(static_cast<std::size_t>(r) * d.vocab, d.vocab);
    const float mx = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (float v : row) z += std::exp(static_cast<double>(v - mx));
    const int target = tokens[r + 1];
    loss += std::log(z) - static_cast<double>(row[target] - mx);
    for (int k = 0; k < d.vocab; ++k) {
      const double p = std::exp(static_cast<double>(row[k] - mx)) / z;
      dlogits[r * d.vocab + k] = static_cast<float>((p - (k == target ? 1.0 : 0.0)) / n);
    }
  }
  // A NaN logit slips past max_element's comparisons; make it show in the loss.
  for (float v : logits) {
    if (std::isnan(v)) return std::nanf("");
  }
  return static_cast<float>(loss / n);
}

std::vector<float> initial_weights(UnitFn fn, const TinyDims& d, std::uint64_t numel,
                                   std::uint64_t seed, int unit) {
  Vec w(numel);
  if (fn == UnitFn::kNorm) {
    std::fill(w.begin(), w.end(), 1.0f);
    return w;
  }
  const int fan_in = fn == UnitFn::kEmbed ? 1 : d.hidden;
  const float scale = fn == UnitFn::kEmbed ? 1.0f : std::sqrt(3.0f / static_cast<float>(fan_in));
  const std::uint64_t s = mix(seed * 1000003u + static_cast<std::uint64_t>(unit));
  for (std::uint64_t i = 0; i < numel; ++i) w[i] = scale * uniform(s, i);
  return w;
}

void adam_step(std::span<float> p, std::span<const float> grad, std::span<float> m,
               std::span<float> v, float norm_sq, float scale, int step, float max_grad_norm) {
  constexpr float kLearningRate = 1e-2f;
  constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
  const float total = std::sqrt(norm_sq) * scale;
  const float clip = max_grad_norm > 0 ? std::min(1.0f, max_grad_norm / (total + 1e-6f)) : 1.0f;
  const float t = static_cast<float>(step + 1);
  const float c1 = 1 - std::pow(kBeta1, t), c2 = 1 - std::pow(kBeta2, t);
  for (std::size_t i = 0; i < p.size() && i < grad.size(); ++i) {
    const float gi = grad[i] * scale * clip;
    m[i] = kBeta1 * m[i] + (1 - kBeta1) * gi;
    v[i] = kBeta2 * v[i] + (1 - kBeta2) * gi * gi;
    p[i] -= kLearningRate * (m[i] / c1) / (std::sqrt(v[i] / c2) + kEps);
  }
}

std::vector<int> synthetic_tokens(const TinyDims& d, std::uint64_t seed, int rank, int step,
                                  int micro) {
  // token[t + 1] = (5 token[t] + 17) mod vocab from a random start: the next token is a
  // function of the current one, so the model can learn it and the loss falls.
  std::vector<int> tok(d.seq);
  const std::uint64_t key =
      mix(seed ^ mix((static_cast<std::uint64_t>(rank) << 40) ^
                     (static_cast<std::uint64_t>(step) << 8) ^ static_cast<std::uint64_t>(micro)));
  tok[0] = static_cast<int>(key % static_cast<std::uint64_t>(d.vocab));
  for (int t = 1; t < d.seq; ++t) tok[t] = (5 * tok[t - 1] + 17) % d.vocab;
  return tok;
}

}  // namespace hpz::replay
