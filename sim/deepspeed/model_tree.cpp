// The module tree per family (TreeBuilder) and the z3 leaf modules.
#include "sim/deepspeed/model_tree.hpp"

#include <set>
#include <string>
#include <utility>
#include <vector>

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

/** DeepSpeed's default z3 leaf modules from v0.18.0 (rule default-moe-leaf-modules):
 *  DEFAULT_LEAF_MODULE_CLASSES (leaf_module_config.py:11-15 at v0.18.2) names
 *  MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock and Qwen3MoeSparseMoeBlock;
 *  `_do_set_z3_leaf_modules` marks each by class name (utils/z3_leaf_module.py:57-86).
 *  Each sparse layer's block becomes a leaf and everything in it falls under the leaf. */
void mark_z3_leaf_modules(Model& md) {
  md.below.assign(md.modules.size(), {});
  for (std::size_t m = 0; m < md.modules.size(); ++m) {
    const std::string& path = md.modules[m].path;
    std::set<int> out;
    for (const DsModule& other : md.modules) {
      const std::string& p = other.path;
      if (static_cast<int>(m) == md.causal_lm || p == path ||
          (p.starts_with(path) && p[path.size()] == '.')) {
        out.insert(other.params.begin(), other.params.end());
      }
    }
    md.below[m].assign(out.begin(), out.end());
  }
  for (const Model::Layer& L : md.layers) {
    if (L.experts.empty() && L.fused < 0) continue;  // a dense layer
    DsModule& block = md.modules[static_cast<std::size_t>(L.mlp)];
    block.z3_leaf = true;
    // named_parameters order: the block's children in registration order, which build_model
    // follows with ds_ids (router, experts, shared expert, its gate; no orphan lies below it).
    block.subtree = md.below[static_cast<std::size_t>(L.mlp)];
    for (const int p : block.subtree) md.params[static_cast<std::size_t>(p)].leaf = L.mlp;
    const std::string prefix = block.path + ".";
    for (DsModule& m : md.modules) {
      if (m.path.starts_with(prefix)) m.under_leaf = true;
    }
  }
}

namespace {

/** Makes one Model: the modules of each family's __init__ and their parameters, in the order
 *  they are created (zero.Init's ds_id). */
class TreeBuilder {
 public:
  TreeBuilder(const ModelConfig& m, bool model_rotary, bool fused_experts);
  Model build();

 private:
  int module(std::string path, ModKind kind);
  void param(int mod, const char* what, std::uint64_t rows, std::uint64_t cols, int layer);
  /** nn.Linear(in, out, bias): weight [out, in], then bias [out]. */
  void linear(int mod, std::uint64_t out, std::uint64_t in, bool bias, int layer);
  /** RMSNorm: weight; LayerNorm: weight, then bias. */
  void norm(int mod, int layer, std::uint64_t width);

  void gpt2_layer(const std::string& p, int i, Model::Layer& L);
  void neox_layer(const std::string& p, int i, Model::Layer& L);
  void phi3_layer(const std::string& p, int i, Model::Layer& L);
  void falcon_layer(const std::string& p, int i, Model::Layer& L);
  void llama_layer(const std::string& p, int i, Model::Layer& L);
  void llama_attention_modules(const std::string& p, Model::Layer& L);
  Model::Layer::Expert expert_modules(const std::string& e, double share);
  void sparse_block_modules(const std::string& p, Model::Layer& L);
  void deepseek_attention_params(int i, const Model::Layer& L);
  void llama_attention_params(int i, const Model::Layer& L);
  void qwen3_moe_replaced_params(int i);
  void sparse_block_params(int i, const Model::Layer& L);

  const ModelConfig& m_;
  const bool fused_experts_;
  Model md_;
  bool phi3_ = false, mixtral_ = false, qwen3_moe_ = false, deepseek_ = false, gpt2_ = false;
  bool falcon_ = false;  ///< Falcon's or GPT-2's: the base is "transformer"
  bool neox_ = false;
  std::uint64_t h_ = 0, head_dim_ = 0, q_width_ = 0, kv_ = 0, ffn_ = 0, vocab_ = 0;
};

TreeBuilder::TreeBuilder(const ModelConfig& m, bool model_rotary, bool fused_experts)
    : m_(m), fused_experts_(fused_experts) {
  md_.family = m.family == "falcon"     ? Family::kFalcon
               : m.family == "gpt_neox" ? Family::kGptNeox
               : m.family == "gpt2"     ? Family::kGpt2
               : m.family == "phi3"     ? Family::kPhi3
                                        : Family::kLlama;
  md_.model_rotary = model_rotary;
  phi3_ = md_.family == Family::kPhi3;
  mixtral_ = m.family == "mixtral";
  qwen3_moe_ = m.family == "qwen3_moe";
  deepseek_ = m.family == "deepseek_v2";
  gpt2_ = md_.family == Family::kGpt2;
  falcon_ = md_.family == Family::kFalcon || gpt2_;  // GPT-2's base is "transformer" too
  neox_ = md_.family == Family::kGptNeox;
  h_ = static_cast<std::uint64_t>(m.hidden);
  // config.head_dim where the family reads it (transformers 4.51.3's Llama, Mistral, Qwen3,
  // Gemma: `getattr(config, "head_dim", hidden_size // num_attention_heads)`).
  head_dim_ = m.head_dim > 0 ? static_cast<std::uint64_t>(m.head_dim)
                             : h_ / static_cast<std::uint64_t>(m.heads);
  q_width_ = head_dim_ * static_cast<std::uint64_t>(m.heads);
  kv_ = head_dim_ * static_cast<std::uint64_t>(m.kv_heads);
  ffn_ = static_cast<std::uint64_t>(m.ffn);
  vocab_ = static_cast<std::uint64_t>(m.vocab);
}

int TreeBuilder::module(std::string path, ModKind kind) {
  if (kind == ModKind::kRotary && falcon_ && m_.alibi) return -1;  // no maybe_rotary module
  DsModule mod;
  mod.path = std::move(path);
  mod.kind = kind;
  md_.modules.push_back(std::move(mod));
  return static_cast<int>(md_.modules.size() - 1);
}

void TreeBuilder::param(int mod, const char* what, std::uint64_t rows, std::uint64_t cols,
                        int layer) {
  md_.modules[mod].params.push_back(static_cast<int>(md_.params.size()));
  md_.params.push_back(
      {md_.modules[mod].path + "." + what, mod, rows * cols, cols > 1 ? rows : 0, layer});
}

void TreeBuilder::linear(int mod, std::uint64_t out, std::uint64_t in, bool bias, int layer) {
  param(mod, "weight", out, in, layer);
  if (bias) param(mod, "bias", out, 1, layer);
}

void TreeBuilder::norm(int mod, int layer, std::uint64_t width) {
  param(mod, "weight", width, 1, layer);
  if (m_.norm_bias) param(mod, "bias", width, 1, layer);
}

Model TreeBuilder::build() {
  const std::uint64_t h = h_;
  // Module paths as the recorder labels them (named_modules; the root is "model").
  const std::string base = falcon_ ? "transformer" : neox_ ? "gpt_neox" : "model";
  md_.causal_lm = module("model", ModKind::kContainer);
  md_.base = module(base, ModKind::kContainer);
  md_.embed = module(base + (gpt2_     ? ".wte"
                             : falcon_ ? ".word_embeddings"
                             : neox_   ? ".embed_in"
                                       : ".embed_tokens"),
                     ModKind::kEmbedding);
  param(md_.embed, "weight", vocab_, h, -1);  // the base model's __init__ makes it first
  if (gpt2_) {
    // GPT2Model.__init__: wte, wpe (the learned positions), drop.
    md_.pos_embed = module(base + ".wpe", ModKind::kEmbedding);
    param(md_.pos_embed, "weight", static_cast<std::uint64_t>(m_.learned_positions), h, -1);
    md_.emb_drop = module(base + ".drop", ModKind::kAct);
  }
  if (neox_) md_.emb_drop = module(base + ".emb_dropout", ModKind::kAct);
  for (int i = 0; i < m_.layers; ++i) {
    const std::string p = base + (falcon_ ? ".h." : ".layers.") + std::to_string(i);
    Model::Layer L;
    L.layer = module(p, ModKind::kContainer);
    if (gpt2_) {
      gpt2_layer(p, i, L);
    } else if (neox_) {
      neox_layer(p, i, L);
    } else if (phi3_) {
      phi3_layer(p, i, L);
    } else if (falcon_) {
      falcon_layer(p, i, L);
    } else {
      llama_layer(p, i, L);
    }
    md_.layers.push_back(L);
  }
  md_.norm = module(base + (falcon_ ? ".ln_f"
                            : neox_ ? ".final_layer_norm"
                                    : ".norm"),
                    ModKind::kNorm);
  if (md_.model_rotary) md_.rotary = module(base + ".rotary_emb", ModKind::kRotary);
  for (Model::Layer& L : md_.layers) {
    const int core = L.rot >= 0 ? L.rot : L.attn_drop >= 0 && gpt2_ ? L.attn_drop : L.o;
    md_.modules[core].attn_core = true;
  }
  md_.head = module(neox_ ? "embed_out" : "lm_head", ModKind::kHead);
  norm(md_.norm, -1, h);
  linear(md_.head, vocab_, h, false, -1);
  if (m_.tied_embeddings) {
    const int own = md_.modules[md_.head].params.front();
    DsParam& p = md_.params[static_cast<std::size_t>(own)];
    p.name = "param" + std::to_string(own);  // as the recorder names it
    p.module = -1;
    p.orphan = true;
    md_.modules[md_.head].params = md_.modules[md_.embed].params;
    md_.tied = true;
  }
  return std::move(md_);
}

void TreeBuilder::gpt2_layer(const std::string& p, int i, Model::Layer& L) {
  const std::uint64_t h = h_, ffn = ffn_;
  // GPT2Block.__init__: ln_1, attn (c_attn, c_proj, attn_dropout, resid_dropout), ln_2,
  // mlp (c_fc, c_proj, act, dropout). Conv1D weights are [in, out]: the same elements.
  L.in_ln = module(p + ".ln_1", ModKind::kNorm);
  L.attn = module(p + ".attn", ModKind::kContainer);
  L.q = module(p + ".attn.c_attn", ModKind::kLinear);
  L.o = module(p + ".attn.c_proj", ModKind::kLinear);
  L.attn_drop = module(p + ".attn.attn_dropout", ModKind::kAct);
  L.post_attn_drop = module(p + ".attn.resid_dropout", ModKind::kAct);
  L.post_ln = module(p + ".ln_2", ModKind::kNorm);
  L.mlp = module(p + ".mlp", ModKind::kContainer);
  L.up = module(p + ".mlp.c_fc", ModKind::kLinear);
  L.down = module(p + ".mlp.c_proj", ModKind::kLinear);
  L.act = module(p + ".mlp.act", ModKind::kAct);
  L.post_mlp_drop = module(p + ".mlp.dropout", ModKind::kAct);
  for (const int conv1d : {L.q, L.o, L.up, L.down}) md_.modules[conv1d].bias_grad_first = true;
  norm(L.in_ln, i, h);
  linear(L.q, 3 * h, h, true, i);
  linear(L.o, h, h, true, i);
  norm(L.post_ln, i, h);
  linear(L.up, ffn, h, true, i);
  linear(L.down, h, ffn, true, i);
}

void TreeBuilder::neox_layer(const std::string& p, int i, Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::uint64_t h = h_, ffn = ffn_, q_width = q_width_, kv = kv_;
  // GPTNeoXLayer.__init__: the two LayerNorms, the two dropouts, attention, mlp.
  L.in_ln = module(p + ".input_layernorm", ModKind::kNorm);
  L.post_ln = module(p + ".post_attention_layernorm", ModKind::kNorm);
  L.post_attn_drop = module(p + ".post_attention_dropout", ModKind::kAct);
  L.post_mlp_drop = module(p + ".post_mlp_dropout", ModKind::kAct);
  L.attn = module(p + ".attention", ModKind::kContainer);
  L.rot = module(p + ".attention.rotary_emb", ModKind::kRotary);
  L.q = module(p + ".attention.query_key_value", ModKind::kLinear);
  L.o = module(p + ".attention.dense", ModKind::kLinear);
  L.attn_drop = module(p + ".attention.attention_dropout", ModKind::kAct);
  L.mlp = module(p + ".mlp", ModKind::kContainer);
  L.up = module(p + ".mlp.dense_h_to_4h", ModKind::kLinear);
  L.down = module(p + ".mlp.dense_4h_to_h", ModKind::kLinear);
  L.act = module(p + ".mlp.act", ModKind::kAct);
  norm(L.in_ln, i, h);
  norm(L.post_ln, i, h);
  linear(L.q, q_width + 2 * kv, h, m.linear_bias, i);
  linear(L.o, h, q_width, m.linear_bias, i);
  linear(L.up, ffn, h, true, i);  // GPTNeoXMLP: both Linears with their default bias
  linear(L.down, h, ffn, true, i);
}

void TreeBuilder::phi3_layer(const std::string& p, int i, Model::Layer& L) {
  const std::uint64_t h = h_, ffn = ffn_, q_width = q_width_, kv = kv_;
  // Phi3DecoderLayer.__init__: self_attn (o_proj, then qkv_proj), mlp (gate_up_proj,
  // down_proj, activation_fn), the two RMSNorms, then the two residual dropouts.
  L.attn = module(p + ".self_attn", ModKind::kContainer);
  L.o = module(p + ".self_attn.o_proj", ModKind::kLinear);
  L.q = module(p + ".self_attn.qkv_proj", ModKind::kLinear);
  L.mlp = module(p + ".mlp", ModKind::kContainer);
  L.up = module(p + ".mlp.gate_up_proj", ModKind::kLinear);
  L.down = module(p + ".mlp.down_proj", ModKind::kLinear);
  L.act = module(p + ".mlp.activation_fn", ModKind::kAct);
  L.in_ln = module(p + ".input_layernorm", ModKind::kNorm);
  L.post_ln = module(p + ".post_attention_layernorm", ModKind::kNorm);
  L.post_attn_drop = module(p + ".resid_attn_dropout", ModKind::kAct);
  L.post_mlp_drop = module(p + ".resid_mlp_dropout", ModKind::kAct);
  linear(L.o, h, q_width, false, i);
  linear(L.q, q_width + 2 * kv, h, false, i);
  linear(L.up, 2 * ffn, h, false, i);
  linear(L.down, h, ffn, false, i);
  norm(L.in_ln, i, h);
  norm(L.post_ln, i, h);
}

void TreeBuilder::falcon_layer(const std::string& p, int i, Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::uint64_t h = h_, ffn = ffn_, q_width = q_width_, kv = kv_;
  // FalconDecoderLayer.__init__: self_attention, mlp, then its LayerNorms.
  L.attn = module(p + ".self_attention", ModKind::kContainer);
  L.q = module(p + ".self_attention.query_key_value", ModKind::kLinear);
  L.rot = module(p + ".self_attention.maybe_rotary", ModKind::kRotary);
  L.o = module(p + ".self_attention.dense", ModKind::kLinear);
  L.mlp = module(p + ".mlp", ModKind::kContainer);
  L.up = module(p + ".mlp.dense_h_to_4h", ModKind::kLinear);
  L.act = module(p + ".mlp.act", ModKind::kAct);
  L.down = module(p + ".mlp.dense_4h_to_h", ModKind::kLinear);
  const bool two = m.norms_per_layer == 2;
  L.in_ln = module(p + (two ? ".ln_attn" : ".input_layernorm"), ModKind::kNorm);
  if (two) L.post_ln = module(p + ".ln_mlp", ModKind::kNorm);
  linear(L.q, q_width + 2 * kv, h, m.linear_bias, i);
  linear(L.o, h, q_width, m.linear_bias, i);
  linear(L.up, ffn, h, m.linear_bias, i);
  linear(L.down, h, ffn, m.linear_bias, i);
  norm(L.in_ln, i, h);
  if (two) norm(L.post_ln, i, h);
}

// Llama's tree and those made as it is: Mistral, Qwen2, Qwen3, Gemma, the mixtures of experts
// (Mixtral, Qwen2-MoE, Qwen3-MoE) and DeepSeek-V2.
void TreeBuilder::llama_layer(const std::string& p, int i, Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::uint64_t h = h_, ffn = ffn_;
  llama_attention_modules(p, L);
  const bool sparse = m.experts > 0 && i >= m.dense_layers;
  if (sparse) {
    sparse_block_modules(p, L);
  } else {
    L.mlp = module(p + ".mlp", ModKind::kContainer);
    L.gate = module(p + ".mlp.gate_proj", ModKind::kLinear);
    L.up = module(p + ".mlp.up_proj", ModKind::kLinear);
    L.down = module(p + ".mlp.down_proj", ModKind::kLinear);
    L.act = module(p + ".mlp.act_fn", ModKind::kAct);
  }
  L.in_ln = module(p + ".input_layernorm", ModKind::kNorm);
  L.post_ln = module(p + ".post_attention_layernorm", ModKind::kNorm);
  if (deepseek_) {
    deepseek_attention_params(i, L);
  } else {
    llama_attention_params(i, L);
  }
  if (m.qk_norm) {  // Qwen3RMSNorm(head_dim): one weight shared by the heads
    norm(L.q_norm, i, head_dim_);
    norm(L.k_norm, i, head_dim_);
  }
  if (sparse) {
    sparse_block_params(i, L);
  } else {
    // LlamaMLP: bias=config.mlp_bias on all three (transformers 4.41 and on; 0 for Mistral).
    linear(L.gate, ffn, h, m.mlp_bias, i);
    linear(L.up, ffn, h, m.mlp_bias, i);
    linear(L.down, h, ffn, m.mlp_bias, i);
  }
  norm(L.in_ln, i, h);
  norm(L.post_ln, i, h);
}

void TreeBuilder::llama_attention_modules(const std::string& p, Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::string a = p + ".self_attn";
  L.attn = module(a, ModKind::kContainer);
  if (deepseek_) {
    // DeepseekV2Attention.__init__ (modeling_deepseek_v2.py:292-318 at transformers 4.57.1).
    if (m.q_lora_rank > 0) {
      L.q_a = module(a + ".q_a_proj", ModKind::kLinear);
      L.q_a_norm = module(a + ".q_a_layernorm", ModKind::kNorm);
      L.q_b = module(a + ".q_b_proj", ModKind::kLinear);
    } else {
      L.q = module(a + ".q_proj", ModKind::kLinear);
    }
    L.kv_a = module(a + ".kv_a_proj_with_mqa", ModKind::kLinear);
    L.kv_norm = module(a + ".kv_a_layernorm", ModKind::kNorm);
    L.kv_b = module(a + ".kv_b_proj", ModKind::kLinear);
  } else {
    L.q = module(a + ".q_proj", ModKind::kLinear);
    L.k = module(a + ".k_proj", ModKind::kLinear);
    L.v = module(a + ".v_proj", ModKind::kLinear);
  }
  L.o = module(a + ".o_proj", ModKind::kLinear);
  if (!md_.model_rotary) L.rot = module(p + ".self_attn.rotary_emb", ModKind::kRotary);
  if (m.qk_norm) {
    L.q_norm = module(p + ".self_attn.q_norm", ModKind::kNorm);
    L.k_norm = module(p + ".self_attn.k_norm", ModKind::kNorm);
  }
}

// One expert's MLP module and its children (Mixtral: w1 in gate, w2 in down, w3 in up), each
// kernel computing `share` of the tokens.
Model::Layer::Expert TreeBuilder::expert_modules(const std::string& e, double share) {
  const bool mixtral = mixtral_;
  Model::Layer::Expert x;
  x.mod = module(e, ModKind::kContainer);
  x.gate = module(e + (mixtral ? ".w1" : ".gate_proj"), ModKind::kLinear);
  if (mixtral) x.down = module(e + ".w2", ModKind::kLinear);
  x.up = module(e + (mixtral ? ".w3" : ".up_proj"), ModKind::kLinear);
  if (!mixtral) x.down = module(e + ".down_proj", ModKind::kLinear);
  x.act = module(e + ".act_fn", ModKind::kAct);
  for (const int mod : {x.gate, x.up, x.down, x.act}) md_.modules[mod].token_share = share;
  return x;
}

void TreeBuilder::sparse_block_modules(const std::string& p, Model::Layer& L) {
  const ModelConfig& m = m_;
  const bool fused_experts = fused_experts_, deepseek = deepseek_;
  // MixtralSparseMoeBlock (block_sparse_moe: gate, experts.N {w1, w2, w3, act_fn};
  // modeling_mixtral.py at 4.51.3), Qwen2MoeSparseMoeBlock (mlp: gate, experts.N
  // {gate_proj, up_proj, down_proj, act_fn}, shared_expert, shared_expert_gate) or
  // DeepseekV2MoE (mlp: experts.N as Qwen2-MoE's, gate, shared_experts;
  // modeling_deepseek_v2.py:92-105 at 4.57.1). DeepseekV2MoEGate is no Linear, but its
  // forward is F.linear of its own weight (line 65), which zero.Init has replaced.
  // transformers 5's Mixtral names the block mlp (MixtralDecoderLayer, :338 at 5.24.0).
  const std::string b = p + (mixtral_ && !fused_experts ? ".block_sparse_moe" : ".mlp");
  L.mlp = module(b, ModKind::kContainer);
  // transformers 5's Qwen3MoeSparseMoeBlock registers its experts before its router
  // (modeling_qwen3_moe.py:272-275 at 5.24.0).
  const bool router_after_experts = deepseek || (qwen3_moe_ && fused_experts);
  if (!router_after_experts) L.router = module(b + ".gate", ModKind::kLinear);
  const double routed = static_cast<double>(m.experts_per_token) / static_cast<double>(m.experts);
  if (fused_experts) {
    // One kernel over every expert's weights: each token through top_k of them.
    L.fused = module(b + ".experts", ModKind::kLinear);
    md_.modules[L.fused].token_share = routed;
  }
  for (int e = 0; e < m.experts && !fused_experts; ++e) {
    L.experts.push_back(expert_modules(b + ".experts." + std::to_string(e), routed));
  }
  if (router_after_experts) L.router = module(b + ".gate", ModKind::kLinear);
  if (m.shared_expert_ffn > 0) {
    L.shared = expert_modules(b + (deepseek ? ".shared_experts" : ".shared_expert"), 1.0);
  }
  if (m.shared_expert_gate) {
    L.shared_gate = module(b + ".shared_expert_gate", ModKind::kLinear);
  }
}

void TreeBuilder::deepseek_attention_params(int i, const Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::uint64_t h = h_;
  const auto heads = static_cast<std::uint64_t>(m.heads);
  const auto q_head = static_cast<std::uint64_t>(m.qk_nope_head_dim + m.qk_rope_head_dim);
  const auto q_rank = static_cast<std::uint64_t>(m.q_lora_rank);
  const auto kv_rank = static_cast<std::uint64_t>(m.kv_lora_rank);
  const auto v_head = static_cast<std::uint64_t>(m.v_head_dim);
  if (L.q >= 0) {
    linear(L.q, heads * q_head, h, false, i);
  } else {
    linear(L.q_a, q_rank, h, m.qkv_bias, i);
    norm(L.q_a_norm, i, q_rank);
    linear(L.q_b, heads * q_head, q_rank, false, i);
  }
  linear(L.kv_a, kv_rank + static_cast<std::uint64_t>(m.qk_rope_head_dim), h, m.qkv_bias, i);
  norm(L.kv_norm, i, kv_rank);
  linear(L.kv_b, heads * (static_cast<std::uint64_t>(m.qk_nope_head_dim) + v_head), kv_rank, false,
         i);
  linear(L.o, h, heads * v_head, m.o_bias, i);
}

void TreeBuilder::llama_attention_params(int i, const Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::uint64_t h = h_, q_width = q_width_, kv = kv_;
  if (qwen3_moe_ && !fused_experts_) qwen3_moe_replaced_params(i);
  // LlamaAttention: bias=config.attention_bias on all four projections.
  linear(L.q, q_width, h, m.qkv_bias, i);
  linear(L.k, kv, h, m.qkv_bias, i);
  linear(L.v, kv, h, m.qkv_bias, i);
  linear(L.o, h, q_width, m.o_bias, i);
}

void TreeBuilder::qwen3_moe_replaced_params(int i) {
  const std::uint64_t h = h_, ffn = ffn_, q_width = q_width_, kv = kv_, head_dim = head_dim_;
  // Qwen3MoeDecoderLayer.__init__ (modeling_qwen3_moe.py:313-327 at transformers
  // 4.51.3) makes a Qwen3MoeAttention and a dense Qwen3MoeMLP(config) first, then
  // replaces both: zero.Init converts their parameters (q, k, v, o_proj, q_norm,
  // k_norm; gate, up, down_proj of intermediate_size), which no module holds after.
  // 5.24.0's makes each once (modeling_qwen3_moe.py:306-318).
  auto orphan = [&](std::uint64_t rows, std::uint64_t cols) {
    DsParam gone;
    gone.name = "param" + std::to_string(md_.params.size());  // as the recorder names it
    gone.numel = rows * cols;
    gone.rows = cols > 1 ? rows : 0;
    gone.layer = i;
    gone.orphan = true;
    md_.params.push_back(gone);
  };
  orphan(q_width, h);
  orphan(kv, h);
  orphan(kv, h);
  orphan(h, q_width);
  orphan(head_dim, 1);
  orphan(head_dim, 1);
  orphan(ffn, h);
  orphan(ffn, h);
  orphan(h, ffn);
}

void TreeBuilder::sparse_block_params(int i, const Model::Layer& L) {
  const ModelConfig& m = m_;
  const std::uint64_t h = h_;
  const bool mixtral = mixtral_, deepseek = deepseek_, qwen3_moe = qwen3_moe_;
  // The router, then each expert's Linears as its __init__ makes them (Mixtral's
  // MixtralBlockSparseTop2MLP: w1, w2, w3; Qwen2MoeMLP: gate, up, down_proj), none with a
  // bias; Qwen2-MoE's shared expert, then its Linear(hidden, 1) gate. DeepSeek-V2: the
  // experts (DeepseekV2MLP, mlp_bias on all three), then the gate's weight [experts,
  // hidden], then the shared experts.
  const bool bias = deepseek && m.mlp_bias;
  const auto router = [&] { linear(L.router, static_cast<std::uint64_t>(m.experts), h, false, i); };
  const bool router_last = deepseek || (qwen3_moe && L.fused >= 0);
  if (!router_last) router();
  if (L.fused >= 0) {
    // MixtralTopKRouter's weight, gate_up_proj [experts, 2 x width, hidden] and down_proj
    // [experts, hidden, width], all torch.empty (modeling_mixtral.py:65-66, 101 at
    // 5.24.0) and written only by _init_weights, which from_pretrained skips.
    // Qwen2MoeExperts' are the same; Qwen2MoeTopKRouter's weight is torch.zeros
    // (modeling_qwen2_moe.py:280-281, 317 at 5.24.0).
    const auto e = static_cast<std::uint64_t>(m.experts);
    const auto w = static_cast<std::uint64_t>(m.expert_ffn);
    if (mixtral) md_.params.back().unwritten = true;
    param(L.fused, "gate_up_proj", e * 2 * w, h, i);
    md_.params.back().unwritten = true;
    param(L.fused, "down_proj", e * h, w, i);
    md_.params.back().unwritten = true;
    // Qwen3MoeTopKRouter's weight, torch.zeros, after them (modeling_qwen3_moe.py:257).
    if (qwen3_moe) router();
  }
  auto expert = [&](const Model::Layer::Expert& x, std::uint64_t width) {
    linear(x.gate, width, h, bias, i);
    if (mixtral) linear(x.down, h, width, false, i);
    linear(x.up, width, h, bias, i);
    if (!mixtral) linear(x.down, h, width, bias, i);
  };
  for (const Model::Layer::Expert& x : L.experts) {
    expert(x, static_cast<std::uint64_t>(m.expert_ffn));
  }
  if (deepseek) {
    router();
    md_.params.back().unwritten = true;
  }
  if (L.shared.mod >= 0) expert(L.shared, static_cast<std::uint64_t>(m.shared_expert_ffn));
  if (L.shared_gate >= 0) linear(L.shared_gate, 1, h, false, i);
}

}  // namespace

/** The modules and parameters of transformers' LlamaForCausalLM, FalconForCausalLM or
 *  GPTNeoXForCausalLM, with parameters in the order their modules' __init__ create them, which
 *  is zero.Init's ds_id (TF:LlamaAttention, LlamaMLP, LlamaDecoderLayer, LlamaModel,
 *  LlamaForCausalLM; FalconAttention, FalconMLP, FalconDecoderLayer, FalconModel,
 *  FalconForCausalLM; GPTNeoXLayer, GPTNeoXAttention, GPTNeoXMLP, GPTNeoXModel,
 *  GPTNeoXForCausalLM at 4.35.2). At transformers 4.51.3 (`model_rotary`): Llama's, Mistral's,
 *  Qwen2's, Qwen3's and Gemma's trees (modeling_llama.py, modeling_qwen3.py:183-196 q, k, v,
 *  o_proj, q_norm, k_norm; modeling_gemma.py) and Phi-3's (modeling_phi3.py:67-68 gate_up_proj,
 *  down_proj; 172-173 o_proj before qkv_proj; 256-262 the layer's), each base model with its
 *  rotary_emb made after norm (modeling_qwen3.py:485). */
Model build_model(const ModelConfig& m, bool model_rotary, bool fused_experts) {
  return TreeBuilder(m, model_rotary, fused_experts).build();
}

}  // namespace hpz::deepspeed
