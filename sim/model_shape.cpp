#include "sim/model_shape.hpp"

#include <cstdint>

#include "sim/deepspeed_releases.hpp"

namespace hpz {
namespace {

/** A norm's parameters: a weight, and a bias for a LayerNorm with one. */
double norm(const ModelConfig& m, double width) {
  return m.norm_bias ? 2 * width : width;
}

/** A gated (gate, up, down) or plain (up, down) MLP of width `ffn`, with biases if any. */
double mlp(const ModelConfig& m, double ffn) {
  const double h = m.hidden;
  const bool bias = m.linear_bias || m.mlp_bias;
  if (m.gated_mlp) return 3 * h * ffn + (bias ? 2 * ffn + h : 0);
  return 2 * h * ffn + (bias ? ffn + h : 0);
}

bool is_moe_layer(const ModelConfig& m, int layer) {
  return m.experts > 0 && layer >= m.dense_layers;
}

}  // namespace

bool llama_shaped(const ModelConfig& m) {
  return (m.family == "llama" || m.family == "mistral") && m.gated_mlp && !m.tied_embeddings &&
         !m.qkv_bias && !m.linear_bias && !m.o_bias && !m.mlp_bias && !m.norm_bias && !m.qk_norm &&
         m.experts == 0 && m.kv_lora_rank == 0 && m.learned_positions == 0 &&
         m.norms_per_layer == 2 &&
         (m.head_dim == 0 || static_cast<std::int64_t>(m.head_dim) * m.heads == m.hidden);
}

bool in_transformers_4_35(const ModelConfig& m) {
  return m.family == "llama" || m.family == "mistral" || m.family == "falcon" ||
         m.family == "gpt_neox" || m.family == "gpt2";
}

bool own_head_dim(const ModelConfig& m) {
  return m.head_dim > 0 && static_cast<std::int64_t>(m.head_dim) * m.heads != m.hidden;
}

std::string transformers_version_of(const ModelConfig& m, const std::string& torch) {
  if (m.transformers_version != "auto") return m.transformers_version;
  if (!torch.empty() && compare_versions(torch, "2.10") >= 0) return "5.24.0";
  if (m.family == "deepseek_v2") return "4.57.1";
  const bool mlp_bias = m.family == "llama" && m.mlp_bias;  // LlamaMLP's, transformers 4.41 on
  return in_transformers_4_35(m) && !own_head_dim(m) && !mlp_bias ? "4.35.2" : "4.51.3";
}

double attention_width(const ModelConfig& m) {
  const double head = m.head_dim > 0 ? m.head_dim : static_cast<double>(m.hidden) / m.heads;
  return m.heads * head;
}

LayerShape layer_shape(const ModelConfig& m, int layer) {
  const double h = m.hidden;
  LayerShape s;
  s.input_norm = norm(m, h);
  s.post_norm = m.norms_per_layer >= 2 ? norm(m, h) : 0;
  if (m.kv_lora_rank > 0) {
    // DeepSeek-V2's multi-head latent attention (modeling_deepseek_v2.py, DeepseekV2Attention,
    // transformers 4.57.1): q_proj (or q_a_proj, q_a_layernorm, q_b_proj), kv_a_proj_with_mqa,
    // kv_a_layernorm, kv_b_proj, o_proj; attention_bias on q_a_proj, kv_a_proj_with_mqa and
    // o_proj (qkv_bias and o_bias here).
    const double q_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double q = m.q_lora_rank > 0
                         ? h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * m.heads * q_head
                         : h * m.heads * q_head;
    s.attn = q + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
             static_cast<double>(m.kv_lora_rank) * m.heads * (m.qk_nope_head_dim + m.v_head_dim) +
             static_cast<double>(m.heads) * m.v_head_dim * h;
    if (m.qkv_bias)
      s.attn += (m.q_lora_rank > 0 ? m.q_lora_rank : 0) + m.kv_lora_rank + m.qk_rope_head_dim;
    if (m.o_bias) s.attn += h;
  } else {
    const double q = attention_width(m);
    const double kv = q / m.heads * m.kv_heads;
    s.attn = h * (q + 2 * kv) + q * h;
    if (m.qkv_bias || m.linear_bias) s.attn += q + 2 * kv;
    if (m.linear_bias || m.o_bias) s.attn += h;
    if (m.qk_norm) s.attn += 2 * (q / m.heads);
  }
  if (!is_moe_layer(m, layer)) {
    s.mlp = mlp(m, m.ffn);
    return s;
  }
  s.experts = m.experts;
  s.expert = mlp(m, m.expert_ffn);
  s.mlp = h * m.experts;  // the router
  if (m.shared_expert_ffn > 0) s.mlp += mlp(m, m.shared_expert_ffn);
  if (m.shared_expert_gate) s.mlp += h;
  return s;
}

double embedding_params(const ModelConfig& m) {
  return (static_cast<double>(m.vocab) + m.learned_positions) * m.hidden;
}

double final_norm_params(const ModelConfig& m) {
  return norm(m, m.hidden);
}

double head_params(const ModelConfig& m) {
  return m.tied_embeddings ? 0 : static_cast<double>(m.vocab) * m.hidden;
}

double parameter_count(const ModelConfig& m) {
  double total = embedding_params(m) + final_norm_params(m) + head_params(m);
  for (int l = 0; l < m.layers; ++l) {
    const LayerShape s = layer_shape(m, l);
    total += s.input_norm + s.attn + s.post_norm + s.mlp + s.expert * s.experts;
  }
  return total;
}

}  // namespace hpz
