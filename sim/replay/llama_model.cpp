#include "sim/replay/llama_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include "sim/replay/fp32_math.hpp"

namespace hpz::replay {
namespace {

using fp32::CSpan;
using fp32::Vec;

constexpr float kRmsEps = 1e-6f;        // LlamaConfig.rms_norm_eps
constexpr double kRopeTheta = 10000.0;  // LlamaConfig.rope_theta
constexpr float kInitStd = 0.02f;       // LlamaConfig.initializer_range

/** RoPE on [tokens x heads*hd] as modeling_llama's apply_rotary_pos_emb (rotate_half): each
 *  head's pair (i, i + hd/2) turned by pos * theta^(-2i/hd), pos the token's place in its
 *  sequence. `inverse` turns back (the backward of a rotation is its transpose). */
Vec rope(CSpan x, int tokens, int seq, int heads, int hd, bool inverse) {
  Vec y(x.begin(), x.end());
  const int half = hd / 2;
  const int width = heads * hd;
  for (int t = 0; t < tokens; ++t) {
    const double pos = t % seq;
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(kRopeTheta, -2.0 * i / hd);
      const auto c = static_cast<float>(std::cos(angle));
      const float s = static_cast<float>(std::sin(angle)) * (inverse ? -1.0f : 1.0f);
      for (int h = 0; h < heads; ++h) {
        const std::size_t lo = static_cast<std::size_t>(t) * width + h * hd + i;
        const float a = x[lo], b = x[lo + half];
        y[lo] = a * c - b * s;
        y[lo + half] = b * c + a * s;
      }
    }
  }
  return y;
}

float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

std::optional<LlamaParam> llama_param(const std::string& name) {
  if (name == "model.embed_tokens.weight") return LlamaParam{LlamaPart::kEmbed, -1};
  if (name == "model.norm.weight") return LlamaParam{LlamaPart::kFinalNorm, -1};
  if (name == "lm_head.weight") return LlamaParam{LlamaPart::kHead, -1};
  static const std::string kLayers = "model.layers.";
  if (!name.starts_with(kLayers)) return std::nullopt;
  const std::size_t dot_at = name.find('.', kLayers.size());
  if (dot_at == std::string::npos || dot_at == kLayers.size()) return std::nullopt;
  int layer = 0;
  for (std::size_t i = kLayers.size(); i < dot_at; ++i) {
    if (name[i] < '0' || name[i] > '9' || layer > 1'000'000) return std::nullopt;
    layer = layer * 10 + (name[i] - '0');
  }
  static const std::map<std::string, LlamaPart, std::less<>> kParts = {
      {"input_layernorm.weight", LlamaPart::kInputNorm},
      {"self_attn.q_proj.weight", LlamaPart::kQ},
      {"self_attn.k_proj.weight", LlamaPart::kK},
      {"self_attn.v_proj.weight", LlamaPart::kV},
      {"self_attn.o_proj.weight", LlamaPart::kO},
      {"post_attention_layernorm.weight", LlamaPart::kPostNorm},
      {"mlp.gate_proj.weight", LlamaPart::kGate},
      {"mlp.up_proj.weight", LlamaPart::kUp},
      {"mlp.down_proj.weight", LlamaPart::kDown}};
  const auto it = kParts.find(name.substr(dot_at + 1));
  if (it == kParts.end()) return std::nullopt;
  return LlamaParam{it->second, layer};
}

std::uint64_t llama_numel(const LlamaDims& d, LlamaPart part) {
  const auto h = static_cast<std::uint64_t>(d.hidden);
  const auto q = static_cast<std::uint64_t>(d.heads) * static_cast<std::uint64_t>(d.head_dim());
  const auto kv = static_cast<std::uint64_t>(d.kv_heads) * static_cast<std::uint64_t>(d.head_dim());
  switch (part) {
    case LlamaPart::kEmbed:
    case LlamaPart::kHead:
      return static_cast<std::uint64_t>(d.vocab) * h;
    case LlamaPart::kInputNorm:
    case LlamaPart::kPostNorm:
    case LlamaPart::kFinalNorm:
      return h;
    case LlamaPart::kQ:
    case LlamaPart::kO:
      return q * h;
    case LlamaPart::kK:
    case LlamaPart::kV:
      return kv * h;
    case LlamaPart::kGate:
    case LlamaPart::kUp:
    case LlamaPart::kDown:
      return static_cast<std::uint64_t>(d.ffn) * h;
  }
  return 0;
}

std::vector<float> llama_initial_weights(const LlamaDims& d, LlamaPart part, std::uint64_t seed,
                                         std::uint64_t salt) {
  const std::uint64_t n = llama_numel(d, part);
  if (part == LlamaPart::kInputNorm || part == LlamaPart::kPostNorm ||
      part == LlamaPart::kFinalNorm) {
    return Vec(n, 1.0f);  // LlamaRMSNorm: torch.ones
  }
  // Uniform in [-a, a) has standard deviation a / sqrt(3).
  const float a = kInitStd * std::sqrt(3.0f);
  const std::uint64_t s = fp32::mix(seed * 1000003u + salt);
  Vec w(n);
  for (std::uint64_t i = 0; i < n; ++i) w[i] = a * fp32::uniform(s, i);
  return w;
}

LlamaPass::LlamaPass(const LlamaDims& d) : d_(d) {}

const std::vector<float>& LlamaPass::need(const std::vector<float>& v, const char* what) const {
  if (v.empty()) {
    throw std::logic_error(std::string("the Llama replay reached a kernel before ") + what +
                           " was computed (the schedule does not run a Llama's modules in order)");
  }
  return v;
}

void LlamaPass::begin(std::vector<int> tokens) {
  tokens_ = std::move(tokens);
  layers_.assign(static_cast<std::size_t>(d_.layers), Layer{});
  for (Vec* v : {&cur_, &hf_, &nf_, &logits_, &dlogits_, &dh_, &dn_, &dm_, &da_, &dq_, &dk_, &dv_})
    v->clear();
}

void LlamaPass::forward(LlamaParam p, std::span<const float> w, bool recompute) {
  const int T = d_.tokens(), h = d_.hidden, hd = d_.head_dim();
  const int qw = d_.heads * hd, kvw = d_.kv_heads * hd;
  if (p.layer >= d_.layers) throw std::logic_error("the Llama replay got a layer it does not have");
  Layer* L = p.layer >= 0 ? &layers_[static_cast<std::size_t>(p.layer)] : nullptr;
  switch (p.part) {
    case LlamaPart::kEmbed:
      cur_.assign(static_cast<std::size_t>(T) * h, 0.0f);
      for (int t = 0; t < T; ++t) {
        std::copy_n(w.begin() + static_cast<std::ptrdiff_t>(tokens_[t]) * h, h,
                    cur_.begin() + static_cast<std::ptrdiff_t>(t) * h);
      }
      return;
    case LlamaPart::kInputNorm: {
      Vec h0 = recompute ? need(L->h0, "the layer's kept input") : need(cur_, "the layer input");
      *L = Layer{};  // a rerun computes every activation of the layer again
      L->h0 = std::move(h0);
      L->n1 = fp32::rms_forward(w, L->h0, T, h, kRmsEps);
      return;
    }
    case LlamaPart::kQ:
      L->q = fp32::matmul_t(need(L->n1, "input_layernorm"), w, T, h, qw);
      return;
    case LlamaPart::kK:
      L->k = fp32::matmul_t(need(L->n1, "input_layernorm"), w, T, h, kvw);
      return;
    case LlamaPart::kV:
      L->v = fp32::matmul_t(need(L->n1, "input_layernorm"), w, T, h, kvw);
      return;
    case LlamaPart::kO: {
      attention(*L);
      L->h1 = fp32::matmul_t(L->a, w, T, qw, h);
      for (std::size_t i = 0; i < L->h1.size(); ++i) L->h1[i] += L->h0[i];
      return;
    }
    case LlamaPart::kPostNorm:
      L->n2 = fp32::rms_forward(w, need(L->h1, "o_proj"), T, h, kRmsEps);
      return;
    case LlamaPart::kGate:
      L->gate = fp32::matmul_t(need(L->n2, "post_attention_layernorm"), w, T, h, d_.ffn);
      return;
    case LlamaPart::kUp:
      L->up = fp32::matmul_t(need(L->n2, "post_attention_layernorm"), w, T, h, d_.ffn);
      return;
    case LlamaPart::kDown: {
      cur_ = fp32::matmul_t(mlp_product(*L), w, T, d_.ffn, h);
      for (std::size_t i = 0; i < cur_.size(); ++i) cur_[i] += L->h1[i];
      return;
    }
    case LlamaPart::kFinalNorm:
      hf_ = need(cur_, "the last layer");
      nf_ = fp32::rms_forward(w, hf_, T, h, kRmsEps);
      return;
    case LlamaPart::kHead:
      logits_ = fp32::matmul_t(need(nf_, "model.norm"), w, T, h, d_.vocab);
      return;
  }
}

// torch.utils.checkpoint's non-reentrant rerun stops once every tensor backward saved is
// recomputed (torch/utils/checkpoint.py: _StopRecomputationError, line 994 in 2.1.2, 1077 in
// 2.10.0): down_proj's input is the
// MLP product, which the rerun then makes without running down_proj itself.
const std::vector<float>& LlamaPass::mlp_product(Layer& L) {
  if (L.m.empty()) {
    need(L.gate, "gate_proj");
    need(L.up, "up_proj");
    L.m.resize(L.gate.size());
    for (std::size_t i = 0; i < L.m.size(); ++i) L.m[i] = fp32::silu(L.gate[i]) * L.up[i];
  }
  return L.m;
}

void LlamaPass::attention(Layer& L) {
  const int S = d_.seq, B = d_.batch, H = d_.heads, hd = d_.head_dim();
  const int group = H / d_.kv_heads, qw = H * hd, kvw = d_.kv_heads * hd;
  const Vec qr = rope(need(L.q, "q_proj"), d_.tokens(), S, H, hd, false);
  const Vec kr = rope(need(L.k, "k_proj"), d_.tokens(), S, d_.kv_heads, hd, false);
  const Vec& v = need(L.v, "v_proj");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  L.probs.assign(static_cast<std::size_t>(B) * H * S * S, 0.0f);
  L.a.assign(static_cast<std::size_t>(d_.tokens()) * qw, 0.0f);
  std::vector<float> score(static_cast<std::size_t>(S));
  for (int b = 0; b < B; ++b) {
    for (int hh = 0; hh < H; ++hh) {
      const int g = hh / group;
      for (int i = 0; i < S; ++i) {
        const int row = b * S + i;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j <= i; ++j) {
          score[j] = dot(&qr[row * qw + hh * hd], &kr[(b * S + j) * kvw + g * hd], hd) * scale;
          mx = std::max(mx, score[j]);  // a NaN score stays in score[j] and spreads below
        }
        float sum = 0;
        for (int j = 0; j <= i; ++j) sum += (score[j] = std::exp(score[j] - mx));
        float* p = &L.probs[((static_cast<std::size_t>(b) * H + hh) * S + i) * S];
        float* out = &L.a[static_cast<std::size_t>(row) * qw + hh * hd];
        for (int j = 0; j <= i; ++j) {
          p[j] = score[j] / sum;
          const float* vj = &v[static_cast<std::size_t>(b * S + j) * kvw + g * hd];
          for (int k = 0; k < hd; ++k) out[k] += p[j] * vj[k];
        }
      }
    }
  }
}

void LlamaPass::attention_backward(Layer& L) {
  const int S = d_.seq, B = d_.batch, H = d_.heads, hd = d_.head_dim(), T = d_.tokens();
  const int group = H / d_.kv_heads, qw = H * hd, kvw = d_.kv_heads * hd;
  const Vec qr = rope(need(L.q, "q_proj"), T, S, H, hd, false);
  const Vec kr = rope(need(L.k, "k_proj"), T, S, d_.kv_heads, hd, false);
  const Vec& v = need(L.v, "v_proj");
  need(L.probs, "the attention");
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Vec dqr(static_cast<std::size_t>(T) * qw, 0.0f), dkr(static_cast<std::size_t>(T) * kvw, 0.0f);
  dv_.assign(static_cast<std::size_t>(T) * kvw, 0.0f);
  std::vector<float> dp(static_cast<std::size_t>(S));
  for (int b = 0; b < B; ++b) {
    for (int hh = 0; hh < H; ++hh) {
      const int g = hh / group;
      for (int i = 0; i < S; ++i) {
        const int row = b * S + i;
        const float* p = &L.probs[((static_cast<std::size_t>(b) * H + hh) * S + i) * S];
        const float* dout = &da_[static_cast<std::size_t>(row) * qw + hh * hd];
        float rs = 0;
        for (int j = 0; j <= i; ++j) {
          const std::size_t at = static_cast<std::size_t>(b * S + j) * kvw + g * hd;
          dp[j] = dot(dout, &v[at], hd);
          rs += p[j] * dp[j];
          for (int k = 0; k < hd; ++k) dv_[at + k] += p[j] * dout[k];
        }
        for (int j = 0; j <= i; ++j) {
          const float ds = p[j] * (dp[j] - rs) * scale;
          const std::size_t at = static_cast<std::size_t>(b * S + j) * kvw + g * hd;
          const std::size_t qa = static_cast<std::size_t>(row) * qw + hh * hd;
          for (int k = 0; k < hd; ++k) {
            dqr[qa + k] += ds * kr[at + k];
            dkr[at + k] += ds * qr[qa + k];
          }
        }
      }
    }
  }
  dq_ = rope(dqr, T, S, H, hd, true);
  dk_ = rope(dkr, T, S, d_.kv_heads, hd, true);
}

float LlamaPass::loss() {
  const int S = d_.seq, V = d_.vocab;
  const Vec& logits = need(logits_, "lm_head");
  dlogits_.assign(logits.size(), 0.0f);
  const int n = d_.batch * (S - 1);
  double loss = 0;
  for (int b = 0; b < d_.batch; ++b) {
    for (int t = 0; t + 1 < S; ++t) {
      const int r = b * S + t;
      const CSpan row = CSpan(logits).subspan(static_cast<std::size_t>(r) * V, V);
      const float mx = *std::max_element(row.begin(), row.end());
      double z = 0;
      for (float v : row) z += std::exp(static_cast<double>(v - mx));
      const int target = tokens_[r + 1];
      loss += std::log(z) - static_cast<double>(row[target] - mx);
      for (int k = 0; k < V; ++k) {
        const double p = std::exp(static_cast<double>(row[k] - mx)) / z;
        dlogits_[static_cast<std::size_t>(r) * V + k] =
            static_cast<float>((p - (k == target ? 1.0 : 0.0)) / n);
      }
    }
  }
  // A NaN logit slips past max_element's comparisons; make it show in the loss.
  if (std::any_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }))
    return std::nanf("");
  return n > 0 ? static_cast<float>(loss / n) : 0.0f;
}

std::vector<float> LlamaPass::backward(LlamaParam p, std::span<const float> w) {
  const int T = d_.tokens(), h = d_.hidden, hd = d_.head_dim(), f = d_.ffn;
  const int qw = d_.heads * hd, kvw = d_.kv_heads * hd;
  if (p.layer >= d_.layers) throw std::logic_error("the Llama replay got a layer it does not have");
  Layer* L = p.layer >= 0 ? &layers_[static_cast<std::size_t>(p.layer)] : nullptr;
  Vec dw(llama_numel(d_, p.part), 0.0f);
  const auto zeros = [](std::size_t n) { return Vec(n, 0.0f); };
  switch (p.part) {
    case LlamaPart::kHead:
      dn_ = zeros(static_cast<std::size_t>(T) * h);
      fp32::matmul_t_backward(need(nf_, "model.norm"), w, need(dlogits_, "the loss"), T, h,
                              d_.vocab, dn_, dw);
      break;
    case LlamaPart::kFinalNorm:
      dh_ = fp32::rms_backward(w, need(hf_, "the last layer"), need(dn_, "lm_head's backward"), T,
                               h, kRmsEps, dw);
      break;
    case LlamaPart::kDown:
      dm_ = zeros(static_cast<std::size_t>(T) * f);
      fp32::matmul_t_backward(mlp_product(*L), w, need(dh_, "the layer above"), T, f, h, dm_, dw);
      dn_ = zeros(static_cast<std::size_t>(T) * h);
      break;
    case LlamaPart::kUp:
    case LlamaPart::kGate: {
      need(dm_, "down_proj's backward");
      need(L->gate, "gate_proj");
      need(L->up, "up_proj");
      Vec dy(dm_.size());
      for (std::size_t i = 0; i < dy.size(); ++i) {
        dy[i] = p.part == LlamaPart::kUp ? dm_[i] * fp32::silu(L->gate[i])
                                         : dm_[i] * L->up[i] * fp32::silu_grad(L->gate[i]);
      }
      fp32::matmul_t_backward(L->n2, w, dy, T, h, f, dn_, dw);
      break;
    }
    case LlamaPart::kPostNorm: {
      const Vec dx = fp32::rms_backward(w, need(L->h1, "o_proj"), need(dn_, "the MLP's backward"),
                                        T, h, kRmsEps, dw);
      for (std::size_t i = 0; i < dh_.size(); ++i) dh_[i] += dx[i];
      break;
    }
    case LlamaPart::kO:
      da_ = zeros(static_cast<std::size_t>(T) * qw);
      if (L->a.empty()) attention(*L);  // a rerun that stopped before o_proj, as for down_proj
      fp32::matmul_t_backward(L->a, w, need(dh_, "the MLP's backward"), T, qw, h, da_, dw);
      dn_ = zeros(static_cast<std::size_t>(T) * h);
      dq_.clear();
      break;
    case LlamaPart::kQ:
    case LlamaPart::kK:
    case LlamaPart::kV: {
      need(da_, "o_proj's backward");
      if (dq_.empty()) attention_backward(*L);
      const Vec& dy = p.part == LlamaPart::kQ ? dq_ : p.part == LlamaPart::kK ? dk_ : dv_;
      fp32::matmul_t_backward(need(L->n1, "input_layernorm"), w, dy, T, h,
                              p.part == LlamaPart::kQ ? qw : kvw, dn_, dw);
      break;
    }
    case LlamaPart::kInputNorm: {
      const Vec dx = fp32::rms_backward(w, need(L->h0, "the layer input"),
                                        need(dn_, "the attention's backward"), T, h, kRmsEps, dw);
      for (std::size_t i = 0; i < dh_.size(); ++i) dh_[i] += dx[i];
      break;
    }
    case LlamaPart::kEmbed:
      need(dh_, "layer 0's backward");
      for (int t = 0; t < T; ++t) {
        for (int k = 0; k < h; ++k)
          dw[static_cast<std::size_t>(tokens_[t]) * h + k] += dh_[t * h + k];
      }
      break;
  }
  return dw;
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

std::vector<int> synthetic_tokens(const LlamaDims& d, std::uint64_t seed, int rank, int step,
                                  int micro) {
  // token[t + 1] = (5 token[t] + 17) mod vocab from a random start: the next token is a
  // function of the current one, so the model can learn it and the loss falls.
  std::vector<int> tok(static_cast<std::size_t>(d.tokens()));
  const std::uint64_t key = fp32::mix(seed ^ fp32::mix((static_cast<std::uint64_t>(rank) << 40) ^
                                                       (static_cast<std::uint64_t>(step) << 8) ^
                                                       static_cast<std::uint64_t>(micro)));
  tok[0] = static_cast<int>(key % static_cast<std::uint64_t>(d.vocab));
  for (int t = 1; t < d.tokens(); ++t) tok[t] = (5 * tok[t - 1] + 17) % d.vocab;
  return tok;
}

}  // namespace hpz::replay
