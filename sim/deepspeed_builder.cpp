#include "sim/deepspeed_builder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/deepspeed_offload.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/model_shape.hpp"
#include "sim/ir/shard.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz {
namespace {

/** The elements of a parameter that `_partition_param_sec` copies into the secondary of the
 *  rank `rank` at position `pos` of its hpZ group, always to the secondary's start, by the
 *  version's bounds; std::nullopt where torch's narrow() raises instead. `groups` is
 *  ds_secondary_tensor_num_of_groups, the world over the hpZ size (PP:948, 1104). */
std::optional<ElemRange> secondary_copy(const ShardLayout& l, CopyBounds bounds, int rank, int pos,
                                        std::uint64_t groups) {
  const std::uint64_t numel = l.numel();
  const ElemRange sec = l.secondary_slice(pos);
  switch (bounds) {
    case CopyBounds::kLegacy: {
      // v0.13.4 PP:1637-1651: a primary slice inside the parameter copies the whole secondary
      // slice if that is inside too, else nothing; the primary slice holding the parameter's
      // end copies (numel - start) x groups elements; one past the end copies nothing.
      if (l.legacy_copy_happens(rank)) {
        return sec.end <= numel ? sec : ElemRange{sec.begin, sec.begin};
      }
      const ElemRange pri = l.primary_slice(rank);
      if (pri.begin >= numel) return ElemRange{sec.begin, sec.begin};
      const std::uint64_t n = (numel - pri.begin) * groups;
      if (sec.begin + n > numel) return std::nullopt;  // one_dim_param.narrow() past its end
      return ElemRange{sec.begin, sec.begin + n};
    }
    case CopyBounds::kSecNumel:
      // v0.13.5 PP:1640: sec_numel = numel - secondary_start past the end, which is negative
      // for a slice that starts past it: narrow() raises (issue 5642).
      if (sec.end <= numel) return sec;
      if (sec.begin > numel) return std::nullopt;
      return ElemRange{sec.begin, numel};
    case CopyBounds::kZeroFilled:
      // v0.19.5 PP:1900-1902 (PR 8210): the clamped count, copied only where it is positive.
      if (sec.begin >= numel) return ElemRange{sec.begin, sec.begin};
      return l.valid(sec);
    case CopyBounds::kClamped:
      // v0.14.4 PP:1688-1696, v0.17.6 PP:1798-1809: sec_numel is clamped to 0, but
      // one_dim_param.narrow(0, secondary_start, 0) still raises where secondary_start lies
      // past the parameter's end (torch's narrow() checks start <= size; issue 6659, a [32]
      // parameter at world 2048, hpZ 16; fixed by PR 8210 in 0.19.5). The hidden-12 model
      // recorded as every rank raised so on ranks 7 and 15 with 0.14.4 (2026-11-26).
      if (sec.begin > numel) return std::nullopt;
      return l.valid(sec);
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The module tree (transformers builds it; DeepSpeed hooks every module, PO:262-275).

struct DsParam {
  std::string name;
  int module = -1;  // the module whose own parameter it is
  std::uint64_t numel = 0;
  std::uint64_t rows = 0;  // first dimension, for GEMM shapes (0: a vector)
  int layer = -1;
  bool persist = false;  // ds_persist
  // lm_head's own weight in a tie_word_embeddings model: zero.Init converts it when the model
  // builds lm_head, then from_pretrained's tie_weights() replaces it by the embedding's
  // (transformers 4.35.2 modeling_utils.py:3502, _tie_or_clone_weights). Only zero.Init ever
  // sees it: model.parameters() no longer yields it.
  bool orphan = false;
  // Made by torch.empty and written by no constructor: DeepseekV2MoEGate's weight
  // (modeling_deepseek_v2.py:61 at transformers 4.57.1), whose values come from the
  // _init_weights pass (line 470-473) that from_pretrained skips for the checkpoint's. zero.Init
  // broadcasts what its memory held (the recording tiny-deepseek-v2-tf4.57-0.13.4).
  bool unwritten = false;
  // The z3 leaf module it lies under (`param.ds_z3_leaf_module`, PO:290-292 at v0.18.2), -1 for
  // none: its gradient is reduced from the leaf's full backward hook, not its own (S3:1252-1255).
  int leaf = -1;
};

enum class ModKind { kContainer, kEmbedding, kLinear, kNorm, kRotary, kAct, kHead };

struct DsModule {
  std::string path;
  ModKind kind = ModKind::kContainer;
  // Its own parameters (named_parameters(recurse=False): weight, then bias), by ds_id.
  std::vector<int> params;
  // The attention core (scores and their product with V), which is no module, runs next to
  // this one: its FLOPs are counted in this module's kernel. The layer's rotary_emb where
  // the attention has one (transformers 4.35), GPT-2's attn_dropout, else o_proj, which
  // follows it.
  bool attn_core = false;
  // The share of the micro-batch's tokens its kernel computes: a routed expert's, top_k /
  // experts of them (an even load), 1 elsewhere.
  double token_share = 1.0;
  // Its bias's gradient reaches DeepSpeed before its weight's. A module's weight and bias are
  // ready together, and their AccumulateGrad nodes (whose sequence_nr, UINT64_MAX, runs them
  // ahead of every other ready node: torch/csrc/autograd/functions/accumulate_grad.cpp) run in
  // the order of the backward node's edges. zero.Init replaces F.linear with zero3_linear_wrap
  // for good (PP:545-550 at v0.13.4; every version here), whose LinearFunctionForZeroStage3
  // takes (input, weight, bias): an nn.Linear's weight first, as a norm's. GPT-2's Conv1D calls
  // torch.addmm(bias, x, weight) itself: its bias first. Both seen in recordings with
  // 5000-element reduce buckets, whose boundaries fall between the two (2026-11-26).
  bool bias_grad_first = false;
  // A z3 leaf module (`_z3_leaf`, rule default-moe-leaf-modules): its hooks fetch and release
  // `subtree`, every parameter below it in named_parameters order (COORD:39-40, 300, 437).
  bool z3_leaf = false;
  std::vector<int> subtree;
  // Below a z3 leaf: DeepSpeed registers no hooks on it (`_register_deepspeed_module` does not
  // recurse into a leaf, PO:294-296), so only its kernels run.
  bool under_leaf = false;
};

// Phi-3 (transformers 4.51.3): fused qkv_proj and gate_up_proj, and residual dropouts.
enum class Family { kLlama, kFalcon, kGptNeox, kGpt2, kPhi3 };

struct Model {
  Family family = Family::kLlama;
  // transformers 4.51.3's trees: one rotary_emb in the base model, run once per forward before
  // the layers (LlamaModel.forward), none in the attention; 4.35.2's: one in each attention.
  bool model_rotary = false;
  int rotary = -1;              // the base model's rotary_emb
  std::vector<DsParam> params;  // by ds_id: the order zero.Init converts them
  std::vector<DsModule> modules;
  int causal_lm = -1, base = -1, embed = -1, pos_embed = -1, emb_drop = -1, norm = -1, head = -1;
  bool tied = false;  // lm_head's parameter is the embedding's
  /** One decoder layer's modules; -1 where the family has none. Llama: input_layernorm,
   *  self_attn {q, k, v, rotary_emb, o}, post_attention_layernorm, mlp {gate, act, up, down}.
   *  Falcon: ln_attn (or input_layernorm) in in_ln, ln_mlp in post_ln, self_attention
   *  {query_key_value in q, maybe_rotary, dense in o}, mlp {dense_h_to_4h in up, act,
   *  dense_4h_to_h in down}. GPT-NeoX: as Falcon's, with input_layernorm and
   *  post_attention_layernorm, rotary_emb, and its Dropout modules (attention.attention_dropout,
   *  post_attention_dropout, post_mlp_dropout), each hooked as any module. GPT-2: ln_1 in
   *  in_ln, attn {c_attn in q, attn_dropout, c_proj in o, resid_dropout in post_attn_drop},
   *  ln_2 in post_ln, mlp {c_fc in up, act, c_proj in down, dropout in post_mlp_drop}.
   *  Qwen3 (4.51.3): Llama's, with self_attn {q, k, v, o, q_norm, k_norm} and no rotary_emb.
   *  Phi-3 (4.51.3): input_layernorm, self_attn {qkv_proj in q, o_proj}, resid_attn_dropout in
   *  post_attn_drop, post_attention_layernorm, mlp {gate_up_proj in up, activation_fn,
   *  down_proj}, resid_mlp_dropout in post_mlp_drop.
   *  DeepSeek-V2 (4.57.1): Llama's, with self_attn {q_proj or q_a_proj, q_a_layernorm, q_b_proj;
   *  kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}, and from first_k_dense_replace on
   *  a sparse mlp {experts.N, gate, shared_experts}. */
  struct Layer {
    int layer = -1, in_ln = -1, attn = -1, q = -1, k = -1, v = -1, rot = -1, o = -1, post_ln = -1,
        mlp = -1, gate = -1, act = -1, up = -1, down = -1, attn_drop = -1, post_attn_drop = -1,
        post_mlp_drop = -1, q_norm = -1, k_norm = -1;
    // DeepSeek-V2's multi-head latent attention: q (q_proj) or q_a_proj, q_a_layernorm and
    // q_b_proj, then kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, and o (o_proj).
    int q_a = -1, q_a_norm = -1, q_b = -1, kv_a = -1, kv_norm = -1, kv_b = -1;
    // A mixture-of-experts layer (mlp is its sparse block): the router, each expert's MLP
    // (Mixtral: w1 in gate, w3 in up, w2 in down), Qwen2-MoE's shared expert and its gate.
    struct Expert {
      int mod = -1, gate = -1, act = -1, up = -1, down = -1;
    };
    int router = -1, shared_gate = -1;
    std::vector<Expert> experts;
    // transformers 5's MixtralExperts (modeling_mixtral.py:57-67 at 5.24.0): every expert's
    // weights in one module, as two 3-D parameters (gate_up_proj, down_proj) run by grouped_mm.
    int fused = -1;
    Expert shared;
  };
  std::vector<Layer> layers;

  /** iter_params(m, recurse=z3_leaf_module(m)) (COORD:39-40): a leaf's subtree, else the
   *  module's own parameters. */
  const std::vector<int>& hooked(int m) const {
    const DsModule& mod = modules[static_cast<std::size_t>(m)];
    return mod.z3_leaf ? mod.subtree : mod.params;
  }
  /** iter_params(m, recurse=True) for each module m: every parameter below it, each once
   *  (named_parameters drops duplicates: a tied head's weight is the embedding's), by ds_id.
   *  Filled once by mark_z3_leaf_modules, the only place that needs it: a leaf's subtree, and the
   *  reuse scan when a leaf is released (params_to_release). */
  std::vector<std::vector<int>> below;
};

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
Model build_model(const ModelConfig& m, bool model_rotary, bool fused_experts = false) {
  Model md;
  md.family = m.family == "falcon"     ? Family::kFalcon
              : m.family == "gpt_neox" ? Family::kGptNeox
              : m.family == "gpt2"     ? Family::kGpt2
              : m.family == "phi3"     ? Family::kPhi3
                                       : Family::kLlama;
  md.model_rotary = model_rotary;
  const bool phi3 = md.family == Family::kPhi3;
  const bool mixtral = m.family == "mixtral";
  const bool qwen3_moe = m.family == "qwen3_moe";
  const bool deepseek = m.family == "deepseek_v2";
  const bool gpt2 = md.family == Family::kGpt2;
  const bool falcon = md.family == Family::kFalcon || gpt2;  // GPT-2's base is "transformer" too
  const bool neox = md.family == Family::kGptNeox;
  const auto h = static_cast<std::uint64_t>(m.hidden);
  // config.head_dim where the family reads it (transformers 4.51.3's Llama, Mistral, Qwen3,
  // Gemma: `getattr(config, "head_dim", hidden_size // num_attention_heads)`).
  const std::uint64_t head_dim = m.head_dim > 0 ? static_cast<std::uint64_t>(m.head_dim)
                                                : h / static_cast<std::uint64_t>(m.heads);
  const std::uint64_t q_width = head_dim * static_cast<std::uint64_t>(m.heads);
  const std::uint64_t kv = head_dim * static_cast<std::uint64_t>(m.kv_heads);
  const auto ffn = static_cast<std::uint64_t>(m.ffn);
  const auto vocab = static_cast<std::uint64_t>(m.vocab);
  auto module = [&](std::string path, ModKind kind) {
    if (kind == ModKind::kRotary && falcon && m.alibi) return -1;  // no maybe_rotary module
    DsModule mod;
    mod.path = std::move(path);
    mod.kind = kind;
    md.modules.push_back(std::move(mod));
    return static_cast<int>(md.modules.size() - 1);
  };
  auto param = [&](int mod, const char* what, std::uint64_t rows, std::uint64_t cols, int layer) {
    md.modules[mod].params.push_back(static_cast<int>(md.params.size()));
    md.params.push_back(
        {md.modules[mod].path + "." + what, mod, rows * cols, cols > 1 ? rows : 0, layer});
  };
  // nn.Linear(in, out, bias): weight [out, in], then bias [out].
  auto linear = [&](int mod, std::uint64_t out, std::uint64_t in, bool bias, int layer) {
    param(mod, "weight", out, in, layer);
    if (bias) param(mod, "bias", out, 1, layer);
  };
  // RMSNorm: weight; LayerNorm: weight, then bias.
  auto norm = [&](int mod, int layer, std::uint64_t width) {
    param(mod, "weight", width, 1, layer);
    if (m.norm_bias) param(mod, "bias", width, 1, layer);
  };
  // Module paths as the recorder labels them (named_modules; the root is "model").
  const std::string base = falcon ? "transformer" : neox ? "gpt_neox" : "model";
  md.causal_lm = module("model", ModKind::kContainer);
  md.base = module(base, ModKind::kContainer);
  md.embed = module(base + (gpt2     ? ".wte"
                            : falcon ? ".word_embeddings"
                            : neox   ? ".embed_in"
                                     : ".embed_tokens"),
                    ModKind::kEmbedding);
  param(md.embed, "weight", vocab, h, -1);  // the base model's __init__ makes it first
  if (gpt2) {
    // GPT2Model.__init__: wte, wpe (the learned positions), drop.
    md.pos_embed = module(base + ".wpe", ModKind::kEmbedding);
    param(md.pos_embed, "weight", static_cast<std::uint64_t>(m.learned_positions), h, -1);
    md.emb_drop = module(base + ".drop", ModKind::kAct);
  }
  if (neox) md.emb_drop = module(base + ".emb_dropout", ModKind::kAct);
  for (int i = 0; i < m.layers; ++i) {
    const std::string p = base + (falcon ? ".h." : ".layers.") + std::to_string(i);
    Model::Layer L;
    L.layer = module(p, ModKind::kContainer);
    if (gpt2) {
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
      for (const int conv1d : {L.q, L.o, L.up, L.down}) md.modules[conv1d].bias_grad_first = true;
      norm(L.in_ln, i, h);
      linear(L.q, 3 * h, h, true, i);
      linear(L.o, h, h, true, i);
      norm(L.post_ln, i, h);
      linear(L.up, ffn, h, true, i);
      linear(L.down, h, ffn, true, i);
    } else if (neox) {
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
    } else if (phi3) {
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
    } else if (falcon) {
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
    } else {
      const std::string a = p + ".self_attn";
      L.attn = module(a, ModKind::kContainer);
      if (deepseek) {
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
      if (!model_rotary) L.rot = module(p + ".self_attn.rotary_emb", ModKind::kRotary);
      if (m.qk_norm) {
        L.q_norm = module(p + ".self_attn.q_norm", ModKind::kNorm);
        L.k_norm = module(p + ".self_attn.k_norm", ModKind::kNorm);
      }
      const bool sparse = m.experts > 0 && i >= m.dense_layers;
      if (sparse) {
        // MixtralSparseMoeBlock (block_sparse_moe: gate, experts.N {w1, w2, w3, act_fn};
        // modeling_mixtral.py at 4.51.3), Qwen2MoeSparseMoeBlock (mlp: gate, experts.N
        // {gate_proj, up_proj, down_proj, act_fn}, shared_expert, shared_expert_gate) or
        // DeepseekV2MoE (mlp: experts.N as Qwen2-MoE's, gate, shared_experts;
        // modeling_deepseek_v2.py:92-105 at 4.57.1). DeepseekV2MoEGate is no Linear, but its
        // forward is F.linear of its own weight (line 65), which zero.Init has replaced.
        // transformers 5's Mixtral names the block mlp (MixtralDecoderLayer, :338 at 5.24.0).
        const std::string b = p + (mixtral && !fused_experts ? ".block_sparse_moe" : ".mlp");
        L.mlp = module(b, ModKind::kContainer);
        // transformers 5's Qwen3MoeSparseMoeBlock registers its experts before its router
        // (modeling_qwen3_moe.py:272-275 at 5.24.0).
        const bool router_after_experts = deepseek || (qwen3_moe && fused_experts);
        if (!router_after_experts) L.router = module(b + ".gate", ModKind::kLinear);
        auto expert = [&](const std::string& e, double share) {
          Model::Layer::Expert x;
          x.mod = module(e, ModKind::kContainer);
          x.gate = module(e + (mixtral ? ".w1" : ".gate_proj"), ModKind::kLinear);
          if (mixtral) x.down = module(e + ".w2", ModKind::kLinear);
          x.up = module(e + (mixtral ? ".w3" : ".up_proj"), ModKind::kLinear);
          if (!mixtral) x.down = module(e + ".down_proj", ModKind::kLinear);
          x.act = module(e + ".act_fn", ModKind::kAct);
          for (const int mod : {x.gate, x.up, x.down, x.act}) md.modules[mod].token_share = share;
          return x;
        };
        const double routed =
            static_cast<double>(m.experts_per_token) / static_cast<double>(m.experts);
        if (fused_experts) {
          // One kernel over every expert's weights: each token through top_k of them.
          L.fused = module(b + ".experts", ModKind::kLinear);
          md.modules[L.fused].token_share = routed;
        }
        for (int e = 0; e < m.experts && !fused_experts; ++e) {
          L.experts.push_back(expert(b + ".experts." + std::to_string(e), routed));
        }
        if (router_after_experts) L.router = module(b + ".gate", ModKind::kLinear);
        if (m.shared_expert_ffn > 0) {
          L.shared = expert(b + (deepseek ? ".shared_experts" : ".shared_expert"), 1.0);
        }
        if (m.shared_expert_gate) {
          L.shared_gate = module(b + ".shared_expert_gate", ModKind::kLinear);
        }
      } else {
        L.mlp = module(p + ".mlp", ModKind::kContainer);
        L.gate = module(p + ".mlp.gate_proj", ModKind::kLinear);
        L.up = module(p + ".mlp.up_proj", ModKind::kLinear);
        L.down = module(p + ".mlp.down_proj", ModKind::kLinear);
        L.act = module(p + ".mlp.act_fn", ModKind::kAct);
      }
      L.in_ln = module(p + ".input_layernorm", ModKind::kNorm);
      L.post_ln = module(p + ".post_attention_layernorm", ModKind::kNorm);
      if (deepseek) {
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
        linear(L.kv_b, heads * (static_cast<std::uint64_t>(m.qk_nope_head_dim) + v_head), kv_rank,
               false, i);
        linear(L.o, h, heads * v_head, m.o_bias, i);
      } else {
        if (qwen3_moe && !fused_experts) {
          // Qwen3MoeDecoderLayer.__init__ (modeling_qwen3_moe.py:313-327 at transformers
          // 4.51.3) makes a Qwen3MoeAttention and a dense Qwen3MoeMLP(config) first, then
          // replaces both: zero.Init converts their parameters (q, k, v, o_proj, q_norm,
          // k_norm; gate, up, down_proj of intermediate_size), which no module holds after.
          // 5.24.0's makes each once (modeling_qwen3_moe.py:306-318).
          auto orphan = [&](std::uint64_t rows, std::uint64_t cols) {
            DsParam gone;
            gone.name = "param" + std::to_string(md.params.size());  // as the recorder names it
            gone.numel = rows * cols;
            gone.rows = cols > 1 ? rows : 0;
            gone.layer = i;
            gone.orphan = true;
            md.params.push_back(gone);
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
        // LlamaAttention: bias=config.attention_bias on all four projections.
        linear(L.q, q_width, h, m.qkv_bias, i);
        linear(L.k, kv, h, m.qkv_bias, i);
        linear(L.v, kv, h, m.qkv_bias, i);
        linear(L.o, h, q_width, m.o_bias, i);
      }
      if (m.qk_norm) {  // Qwen3RMSNorm(head_dim): one weight shared by the heads
        norm(L.q_norm, i, head_dim);
        norm(L.k_norm, i, head_dim);
      }
      if (sparse) {
        // The router, then each expert's Linears as its __init__ makes them (Mixtral's
        // MixtralBlockSparseTop2MLP: w1, w2, w3; Qwen2MoeMLP: gate, up, down_proj), none with a
        // bias; Qwen2-MoE's shared expert, then its Linear(hidden, 1) gate. DeepSeek-V2: the
        // experts (DeepseekV2MLP, mlp_bias on all three), then the gate's weight [experts,
        // hidden], then the shared experts.
        const bool bias = deepseek && m.mlp_bias;
        const auto router = [&] {
          linear(L.router, static_cast<std::uint64_t>(m.experts), h, false, i);
        };
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
          if (mixtral) md.params.back().unwritten = true;
          param(L.fused, "gate_up_proj", e * 2 * w, h, i);
          md.params.back().unwritten = true;
          param(L.fused, "down_proj", e * h, w, i);
          md.params.back().unwritten = true;
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
          md.params.back().unwritten = true;
        }
        if (L.shared.mod >= 0) expert(L.shared, static_cast<std::uint64_t>(m.shared_expert_ffn));
        if (L.shared_gate >= 0) linear(L.shared_gate, 1, h, false, i);
      } else {
        // LlamaMLP: bias=config.mlp_bias on all three (transformers 4.41 and on; 0 for Mistral).
        linear(L.gate, ffn, h, m.mlp_bias, i);
        linear(L.up, ffn, h, m.mlp_bias, i);
        linear(L.down, h, ffn, m.mlp_bias, i);
      }
      norm(L.in_ln, i, h);
      norm(L.post_ln, i, h);
    }
    md.layers.push_back(L);
  }
  md.norm = module(base + (falcon ? ".ln_f"
                           : neox ? ".final_layer_norm"
                                  : ".norm"),
                   ModKind::kNorm);
  if (model_rotary) md.rotary = module(base + ".rotary_emb", ModKind::kRotary);
  for (Model::Layer& L : md.layers) {
    const int core = L.rot >= 0 ? L.rot : L.attn_drop >= 0 && gpt2 ? L.attn_drop : L.o;
    md.modules[core].attn_core = true;
  }
  md.head = module(neox ? "embed_out" : "lm_head", ModKind::kHead);
  norm(md.norm, -1, h);
  linear(md.head, vocab, h, false, -1);
  if (m.tied_embeddings) {
    const int own = md.modules[md.head].params.front();
    DsParam& p = md.params[static_cast<std::size_t>(own)];
    p.name = "param" + std::to_string(own);  // as the recorder names it
    p.module = -1;
    p.orphan = true;
    md.modules[md.head].params = md.modules[md.embed].params;
    md.tied = true;
  }
  return md;
}

// ---------------------------------------------------------------------------------------------
// The hook program of one micro-step: what fires, in order.

enum class Ev {
  kPreFwd,   // forward pre-hook: fetch_sub_module (PO:441-452)
  kPostFwd,  // forward hook: release_sub_module
  kPreBwd,   // PreBackwardFunction on the module's outputs (PO:328-360)
  kPostBwd,  // PostBackwardFunction on its inputs (PO:380-410)
  kFwdKernel,
  kBwdKernel,  // the module's backward kernel, then its parameter's gradient hook
  kLoss,
  kHostSync,  // the model's own wait for the compute stream (a data-dependent size)
  // A z3 leaf's full backward hook: the gradients of every parameter below it reduced, in
  // model.parameters() order (S3:1261-1274 at v0.18.2, PR 7592).
  kLeafGradHook,
};

struct Hook {
  Ev ev;
  int module;
  bool recompute = false;
  bool grad_enabled = true;
};

/** The forward of one decoder layer. Llama (TF:LlamaDecoderLayer.forward, LlamaAttention.forward:
 *  q, k, v, rotary_emb, o; LlamaMLP.forward: down(act(gate(x)) * up(x))). Falcon
 *  (FalconDecoderLayer.forward at 4.35.2: ln_attn and ln_mlp on the layer's input, or one
 *  input_layernorm for both, then self_attention {query_key_value, maybe_rotary, dense}, then
 *  mlp {dense_h_to_4h, act, dense_4h_to_h}). */
void layer_forward(const Model& md, const Model::Layer& L, bool recompute, bool grad,
                   std::vector<Hook>& out, bool with_layer_hooks = true) {
  // A module under a z3 leaf has no hooks: only its kernel runs.
  auto hooked = [&](int m) { return !md.modules[static_cast<std::size_t>(m)].under_leaf; };
  auto leaf = [&](int m) {
    if (m < 0) return;
    if (hooked(m)) out.push_back({Ev::kPreFwd, m, recompute, grad});
    out.push_back({Ev::kFwdKernel, m, recompute, grad});
    if (hooked(m)) out.push_back({Ev::kPostFwd, m, recompute, grad});
  };
  auto open = [&](int m) {
    if (hooked(m)) out.push_back({Ev::kPreFwd, m, recompute, grad});
  };
  auto close = [&](int m) {
    if (hooked(m)) out.push_back({Ev::kPostFwd, m, recompute, grad});
  };
  if (with_layer_hooks) open(L.layer);
  if (md.family == Family::kGpt2) {
    // GPT2Block.forward: x + attn(ln_1(x)), then + mlp(ln_2(.)); GPT2Attention: c_attn, the
    // attention core with attn_dropout, c_proj, resid_dropout; GPT2MLP: c_fc, act, c_proj,
    // dropout.
    leaf(L.in_ln);
    open(L.attn);
    leaf(L.q);
    leaf(L.attn_drop);
    leaf(L.o);
    leaf(L.post_attn_drop);
    close(L.attn);
    leaf(L.post_ln);
    open(L.mlp);
    leaf(L.up);
    leaf(L.act);
    leaf(L.down);
    leaf(L.post_mlp_drop);
    close(L.mlp);
  } else if (md.family == Family::kGptNeox || md.family == Family::kPhi3) {
    // GPTNeoXLayer.forward (use_parallel_residual): attention(input_layernorm(x)) with its
    // dropout, then mlp(post_attention_layernorm(x)) with its. Phi3DecoderLayer.forward
    // (modeling_phi3.py:300-320 at 4.51.3) calls the same modules in the same order: x +
    // resid_attn_dropout(self_attn(input_layernorm(x))), then + resid_mlp_dropout(mlp(
    // post_attention_layernorm(.))), Phi3MLP being down_proj(up * activation_fn(gate)) of one
    // gate_up_proj.
    leaf(L.in_ln);
    open(L.attn);
    leaf(L.q);
    leaf(L.rot);
    leaf(L.attn_drop);
    leaf(L.o);
    close(L.attn);
    leaf(L.post_attn_drop);
    leaf(L.post_ln);
    open(L.mlp);
    leaf(L.up);
    leaf(L.act);
    leaf(L.down);
    close(L.mlp);
    leaf(L.post_mlp_drop);
  } else if (md.family == Family::kFalcon) {
    leaf(L.in_ln);
    leaf(L.post_ln);
    open(L.attn);
    leaf(L.q);
    leaf(L.rot);
    leaf(L.o);
    close(L.attn);
    open(L.mlp);
    leaf(L.up);
    leaf(L.act);
    leaf(L.down);
    close(L.mlp);
  } else {
    // Qwen3Attention.forward (modeling_qwen3.py:217-218): q_norm(q_proj(x)), k_norm(k_proj(x)).
    // DeepseekV2Attention.forward (modeling_deepseek_v2.py:336-345 at 4.57.1): q_proj, or
    // q_b_proj(q_a_layernorm(q_a_proj(x))); then kv_b_proj(kv_a_layernorm(kv_a_proj_with_mqa(x))).
    leaf(L.in_ln);
    open(L.attn);
    leaf(L.q);
    leaf(L.q_a);
    leaf(L.q_a_norm);
    leaf(L.q_b);
    leaf(L.q_norm);
    leaf(L.k);
    leaf(L.k_norm);
    leaf(L.v);
    leaf(L.kv_a);
    leaf(L.kv_norm);
    leaf(L.kv_b);
    leaf(L.rot);
    leaf(L.o);
    close(L.attn);
    leaf(L.post_ln);
    open(L.mlp);
    // The sparse block (MixtralSparseMoeBlock.forward at 4.51.3): the router, then every
    // expert in turn, whether or not a token was routed to it; Qwen2-MoE's shared expert and
    // its gate after them. DeepseekV2MoE.forward (modeling_deepseek_v2.py:108-147 at 4.57.1):
    // the gate, then moe() runs each expert that received a token, after reading its count on
    // the host (`if num_tokens == 0`, then the slice bounds: .item() each), then the shared
    // experts. We take every expert to receive tokens: the count is data, which the builder
    // does not have (docs/deepspeed-builder.md).
    auto expert = [&](const Model::Layer::Expert& x) {
      open(x.mod);
      leaf(x.gate);
      leaf(x.act);
      leaf(x.up);
      leaf(x.down);
      close(x.mod);
    };
    // transformers 5's Qwen2MoeSparseMoeBlock.forward runs the shared expert first, then the
    // router and the experts, then the shared expert's gate (modeling_qwen2_moe.py:339-351 at
    // 5.24.0).
    const bool shared_first = L.fused >= 0 && L.shared.mod >= 0;
    if (shared_first) expert(L.shared);
    leaf(L.router);
    for (const Model::Layer::Expert& x : L.experts) {
      // idx, top_x = torch.where(expert_mask[expert_idx]): nonzero, whose CUDA kernel copies
      // its count to the host and waits for the stream (the recorder logs it: hpzrec/ops.py).
      out.push_back({Ev::kHostSync, -1, recompute, grad});
      expert(x);
    }
    // transformers 5's MixtralExperts: grouped_mm over the tokens sorted by expert, whose
    // offsets stay on the device (integrations/moe.py:355-384 at 5.24.0): no host read.
    leaf(L.fused);
    if (L.shared.mod >= 0 && !shared_first) expert(L.shared);
    leaf(L.shared_gate);
    leaf(L.gate);
    leaf(L.act);
    leaf(L.up);
    leaf(L.down);
    close(L.mlp);
  }
  if (with_layer_hooks) close(L.layer);
}

/** Backward of one decoder layer: autograd runs the modules in reverse order of their forward;
 *  a module's PreBackwardFunction fires before its children's (it sits on its outputs).
 *  Parameter-less modules' post-backward hooks release nothing and are left out. Llama's
 *  rotary_emb, whose outputs (cos, sin) need no gradient, gets none; Falcon's maybe_rotary
 *  returns the rotated query and key, and does. Falcon's parallel blocks: of the nodes ready
 *  after the sum, autograd's ready queue runs the one made last first (the higher sequence
 *  number), so the whole MLP before the attention, then ln_mlp, then ln_attn (the recording
 *  tiny-falcon-0.13.4 shows that order). */
void layer_backward(const Model& md, const Model::Layer& L, std::vector<Hook>& out) {
  auto leaf = [&](int m) {
    if (m < 0) return;
    const bool hooked = !md.modules[static_cast<std::size_t>(m)].under_leaf;
    if (hooked) out.push_back({Ev::kPreBwd, m});
    out.push_back({Ev::kBwdKernel, m});
    if (hooked && !md.modules[m].params.empty()) out.push_back({Ev::kPostBwd, m});
  };
  out.push_back({Ev::kPreBwd, L.layer});
  if (md.family == Family::kGpt2) {
    // Sequential, as Llama's (the recording tiny-gpt2-0.13.4).
    out.push_back({Ev::kPreBwd, L.mlp});
    leaf(L.post_mlp_drop);
    leaf(L.down);
    leaf(L.act);
    leaf(L.up);
    leaf(L.post_ln);
    out.push_back({Ev::kPreBwd, L.attn});
    leaf(L.post_attn_drop);
    leaf(L.o);
    leaf(L.attn_drop);
    leaf(L.q);
    leaf(L.in_ln);
    return;
  }
  if (md.family == Family::kGptNeox || md.family == Family::kPhi3) {
    // As the recording tiny-gptneox-0.13.4 shows: the MLP branch through its LayerNorm first,
    // then the attention branch; rotary_emb's cos and sin need no gradient. Phi-3's sequential
    // layer, its dropouts outside the containers, runs the same (tiny-phi3-tf4.51-0.13.4; it
    // has no rotary_emb or attention_dropout module).
    leaf(L.post_mlp_drop);
    out.push_back({Ev::kPreBwd, L.mlp});
    leaf(L.down);
    leaf(L.act);
    leaf(L.up);
    leaf(L.post_ln);
    leaf(L.post_attn_drop);
    out.push_back({Ev::kPreBwd, L.attn});
    leaf(L.o);
    leaf(L.attn_drop);
    leaf(L.q);
    leaf(L.in_ln);
    return;
  }
  // A z3 leaf block (rule default-moe-leaf-modules): DeepSpeed's pre-backward function sits on
  // each of its outputs, and with the full backward hook's BackwardHookFunction, which
  // materializes a zero gradient for an output the loss never used (torch/nn/modules/
  // _functions.py), router_logits' fires too: twice (the recording tiny-mixtral-tf4.51-0.18.2
  // traces both). Before 0.18.0 router_logits gets no gradient.
  // transformers 5's block returns the hidden states alone (MixtralSparseMoeBlock.forward,
  // modeling_mixtral.py:124-132 at 5.24.0): once.
  const bool z3_leaf = md.modules[static_cast<std::size_t>(L.mlp)].z3_leaf;
  out.push_back({Ev::kPreBwd, L.mlp});
  if (z3_leaf && L.fused < 0) out.push_back({Ev::kPreBwd, L.mlp});
  if (md.family == Family::kFalcon) {
    leaf(L.down);
    leaf(L.act);
    leaf(L.up);
    out.push_back({Ev::kPreBwd, L.attn});
    leaf(L.o);
    if (L.rot >= 0) {
      // maybe_rotary returns two tensors (query, key): DeepSpeed puts a PreBackwardFunction on
      // each and counts them (applied_pre_backward_ref_cnt, PO:328-360), so its pre-backward
      // hook runs twice, once per gradient.
      out.push_back({Ev::kPreBwd, L.rot});
      out.push_back({Ev::kPreBwd, L.rot});
      out.push_back({Ev::kBwdKernel, L.rot});
    }
    leaf(L.q);
    leaf(L.post_ln);
    leaf(L.in_ln);
    return;
  }
  // A sparse block backward (the recordings tiny-mixtral-tf4.51-0.13.4 and
  // tiny-qwen2-moe-tf4.51-0.13.4): the shared expert's gate and the shared expert, the experts
  // from the last to the first, then the router.
  auto expert = [&](const Model::Layer::Expert& x) {
    if (!md.modules[static_cast<std::size_t>(x.mod)].under_leaf) {
      out.push_back({Ev::kPreBwd, x.mod});
    }
    leaf(x.down);
    leaf(x.up);
    leaf(x.act);
    leaf(x.gate);
  };
  leaf(L.shared_gate);
  if (L.shared.mod >= 0) expert(L.shared);
  for (auto x = L.experts.rbegin(); x != L.experts.rend(); ++x) expert(*x);
  leaf(L.fused);
  leaf(L.router);
  if (z3_leaf) {
    // torch runs the input's BackwardHookFunction, then the full backward hook (the block's
    // gradients reduced), then DeepSpeed's PostBackwardFunction on the input (its forward
    // pre-hook ran before BackwardHook.setup_input_hook): the release.
    out.push_back({Ev::kLeafGradHook, L.mlp});
    out.push_back({Ev::kPostBwd, L.mlp});
  }
  leaf(L.down);
  leaf(L.up);
  leaf(L.act);
  leaf(L.gate);
  leaf(L.post_ln);
  out.push_back({Ev::kPreBwd, L.attn});
  leaf(L.o);
  leaf(L.kv_b);
  leaf(L.kv_norm);
  leaf(L.kv_a);
  leaf(L.v);
  leaf(L.k_norm);
  leaf(L.k);
  leaf(L.q_norm);
  leaf(L.q_b);
  leaf(L.q_a_norm);
  leaf(L.q_a);
  leaf(L.q);
  leaf(L.in_ln);
}

/** How the model's forward and backward run, beyond its module tree. */
struct Walk {
  bool checkpointing = false;  ///< training.grad_checkpointing
  /// transformers 5: torch.utils.checkpoint with use_reentrant=False (modeling_utils.py:3157-3158
  /// at 5.24.0, when gradient_checkpointing_enable gets no kwargs) of the decoder layer's
  /// `forward`, so the layer's own hooks stay outside the checkpoint (modeling_layers.py:85-126).
  bool non_reentrant = false;
  /// transformers 5 with checkpointing: one data-dependent check after the embedding for each
  /// attention mask the model makes (below).
  int mask_host_waits = 0;
};

/** The hooks of one checkpointed layer's backward under non-reentrant checkpointing (torch 2.10
 *  torch/utils/checkpoint.py). The first forward ran with grad, so DeepSpeed's pre-backward
 *  functions sit on the original outputs and fire as the gradient arrives: the layer's, its
 *  MLP's and down_proj's (which gathers it). The recompute runs at the first unpack of a saved
 *  tensor (unpack_hook, :1154-1176), down_proj's backward, without the layer's own hooks; early
 *  stop (on by default, :1595) ends it once the last saved tensor is packed again (:1117-1120),
 *  inside the last forward kernel's module after its pre-forward hook: that kernel and every
 *  post-forward hook after it never run, so down_proj is released by its post-backward alone. */
void non_reentrant_layer_backward(const Model& md, const Model::Layer& L, std::vector<Hook>& out) {
  std::vector<Hook> bwd, rec;
  layer_backward(md, L, bwd);
  layer_forward(md, L, true, true, rec, /*with_layer_hooks=*/false);  // outside the checkpoint
  auto last =
      std::find_if(rec.rbegin(), rec.rend(), [](const Hook& k) { return k.ev == Ev::kFwdKernel; });
  if (last != rec.rend()) rec.erase(std::prev(last.base()), rec.end());
  const auto unpack =
      std::find_if(bwd.begin(), bwd.end(), [](const Hook& k) { return k.ev == Ev::kBwdKernel; });
  out.insert(out.end(), bwd.begin(), unpack);
  out.insert(out.end(), rec.begin(), rec.end());
  out.insert(out.end(), unpack, bwd.end());
}

std::vector<Hook> micro_step_hooks(const Model& md, const Walk& walk) {
  const bool checkpointing = walk.checkpointing;
  std::vector<Hook> h;
  auto leaf = [&](int m, bool grad) {
    h.push_back({Ev::kPreFwd, m, false, grad});
    h.push_back({Ev::kFwdKernel, m, false, grad});
    h.push_back({Ev::kPostFwd, m, false, grad});
  };
  h.push_back({Ev::kPreFwd, md.causal_lm});
  h.push_back({Ev::kPreFwd, md.base});
  leaf(md.embed, true);
  if (md.pos_embed >= 0) leaf(md.pos_embed, true);
  if (md.emb_drop >= 0) leaf(md.emb_drop, true);
  // transformers 5.24.0: LlamaModel.forward's create_causal_mask (modeling_llama.py:382) reaches
  // find_packed_sequence_indices (masking_utils.py:864-870: no attention mask and no cache),
  // whose `(packed_sequence_mask[:, -1] == 0).all()` in an `if` (:761) reads the device. The
  // cache is None because merge_with_config_defaults turns use_cache off under gradient
  // checkpointing in training (utils/generic.py:1134-1146); without checkpointing a DynamicCache
  // skips the check (tiny-0.19.8-torch2.10-no-checkpointing). Mistral and Gemma make one mask
  // (modeling_mistral.py:355, modeling_gemma.py:403); Qwen2 and Qwen3 a second, sliding-window
  // one where a layer slides (Qwen2Model.forward, Qwen3Model.forward: create_causal_mask, then
  // create_sliding_window_causal_mask if has_sliding_layers; modeling_qwen3.py:397-401), each
  // through _preprocess_mask_arguments' check.
  for (int i = 0; i < walk.mask_host_waits; ++i) h.push_back({Ev::kHostSync, -1, false, true});
  // transformers 4.51.3: position_embeddings = self.rotary_emb(hidden_states, position_ids), once,
  // outside the checkpointed layers (modeling_qwen3.py:553); its forward is under no_grad, so
  // its outputs get no backward hook.
  if (md.rotary >= 0) leaf(md.rotary, true);
  // Reentrant checkpointing (TF:LlamaModel.forward, FalconModel.forward, torch.utils.checkpoint)
  // runs each layer's first forward without grad; non-reentrant with grad.
  for (const auto& L : md.layers) {
    layer_forward(md, L, false, !checkpointing || walk.non_reentrant, h);
  }
  leaf(md.norm, true);
  h.push_back({Ev::kPostFwd, md.base});
  leaf(md.head, true);
  h.push_back({Ev::kPostFwd, md.causal_lm});
  h.push_back({Ev::kLoss, -1});
  // Backward.
  h.push_back({Ev::kPreBwd, md.causal_lm});
  h.push_back({Ev::kPreBwd, md.head});
  h.push_back({Ev::kBwdKernel, md.head});
  h.push_back({Ev::kPostBwd, md.head});
  h.push_back({Ev::kPreBwd, md.base});
  h.push_back({Ev::kPreBwd, md.norm});
  h.push_back({Ev::kBwdKernel, md.norm});
  h.push_back({Ev::kPostBwd, md.norm});
  for (auto it = md.layers.rbegin(); it != md.layers.rend(); ++it) {
    if (checkpointing && walk.non_reentrant) {
      non_reentrant_layer_backward(md, *it, h);
      continue;
    }
    if (checkpointing) layer_forward(md, *it, true, true, h);
    layer_backward(md, *it, h);
  }
  // The embedding's input (token ids) needs no gradient: no post-backward hook fires, and the
  // embedding stays gathered until the optimizer step releases everything.
  if (md.emb_drop >= 0) {
    h.push_back({Ev::kPreBwd, md.emb_drop});
    h.push_back({Ev::kBwdKernel, md.emb_drop});
  }
  if (md.pos_embed >= 0) {  // made after wte's output: its backward runs first
    h.push_back({Ev::kPreBwd, md.pos_embed});
    h.push_back({Ev::kBwdKernel, md.pos_embed});
  }
  h.push_back({Ev::kPreBwd, md.embed});
  h.push_back({Ev::kBwdKernel, md.embed});
  return h;
}

/** Whether the step checks the gradients for overflow (and can skip on it): fp16, or every dtype
 *  up to 0.11.1 (rule overflow-check-every-dtype). */
bool checks_overflow(const Scenario& sc, const VersionRules& v) {
  return sc.training.dtype == "fp16" || v.overflow_check_every_dtype;
}

// ---------------------------------------------------------------------------------------------
// One rank's emission.

enum class Status { kNotAvailable, kInflight, kAvailable };

struct Handle {
  bool coalesced = false;
  bool complete = false;
  EventId end = kNoEvent;              // the NCCL end event
  std::vector<int> params;             // sorted by ds_id
  BufferId flat = kNoBuffer;           // coalesced: the flat buffer
  StreamId flat_stream = kHostStream;  // the stream it was allocated on
  std::size_t registered = 0;          // params still in __inflight_param_registry
  std::uint64_t per_rank_elems = 0;    // coalesced: partition_sz
  std::vector<std::uint64_t> offsets;  // coalesced: each param's offset in a rank's partition
  std::vector<std::uint64_t> chunk;    // coalesced: each param's elements per rank
  int group_size = 0;
  // qwZ: the int8 gather's buffer, the scales' buffer and the scales' collective's end event.
  bool quantized = false;
  BufferId qbuf = kNoBuffer, sbuf = kNoBuffer;
  StreamId q_stream = kHostStream;  // the stream both were allocated on
  EventId scale_end = kNoEvent;
};

struct ParamState {
  Status status = Status::kNotAvailable;
  bool has_secondary = false;
  bool has_primary = false;            // ds_tensor is set
  std::set<int> active;                // ds_active_sub_modules
  EventId secondary_ready = kNoEvent;  // event-wait: recorded after the last secondary copy
  int handle = -1;                     // in __inflight_param_registry
  BufferId primary = kNoBuffer, secondary = kNoBuffer, full = kNoBuffer, grad = kNoBuffer;
};

struct TraceEntry {
  int param;
  int step_id;
};

// OpEmitter: the offload model's copies and stagings (sim/deepspeed_offload.hpp) emit through it.
class RankBuilder final : private OpEmitter {
 public:
  RankBuilder(const Scenario& sc, const VersionRules& v, const Model& md, const Walk& walk,
              Schedule& s, Rank r);
  RankSchedule build();

 private:
  // OpEmitter.
  Op& emit(OpKind kind, StreamId s, Purpose p, std::span<const Access> acc) override {
    return push(kind, s, p, acc);
  }
  BufferId new_buffer(std::string name, BufferRole role, UnitId unit,
                      std::uint64_t bytes) override {
    return buffer(std::move(name), role, unit, bytes);
  }
  const Buffer& buffer_of(BufferId b) const override { return out_.buffers[b]; }
  /** offload_param: buffer b lives in host memory (Buffer::on_host). */
  void place_on_host(BufferId b, bool host) { out_.buffers.mut()[b].on_host = host; }

  // IR emission.
  Op& push(OpKind kind, StreamId s, Purpose p, std::initializer_list<Access> acc = {});
  Op& push(OpKind kind, StreamId s, Purpose p, std::span<const Access> acc);
  EventId record(StreamId s, Purpose p);
  void wait(StreamId s, EventId e, Purpose p);
  void wait_stream(StreamId waiter, StreamId other, Purpose p);
  StreamId nccl_stream(GroupId g);
  EventId collective(OpKind kind, GroupId g, std::uint64_t bytes, std::vector<Access> acc);
  BufferId buffer(std::string name, BufferRole role, UnitId unit, std::uint64_t bytes);
  void alloc(BufferId b, StreamId s, Purpose p) override;
  void free(BufferId b, StreamId s, Purpose p);
  Access part(int p, BufferId b, ElemRange slice, AccessMode mode, bool in_full) const;

  // DeepSpeed.
  void init();
  void run_hook(const Hook& h);
  void fetch_sub_module(int module, bool forward);
  void release_sub_module(int module);
  void release_backward_leftovers();
  void release_param_as(int p, LabelId label);
  void release_param(int p);
  void partition(int p, bool has_been_updated = false);
  void gather_blocking(int p);
  void gather_blocking_list(const std::vector<int>& list);
  void load_pretrained();
  void load_checkpoint();
  int module_group_end(int first) const;
  /** The optimizer's param groups (training.param_groups), each in model.parameters() order. */
  std::vector<std::vector<int>> make_param_groups() const;
  /** The optimizer's sub-groups: each param group cut by _create_fp16_sub_groups. */
  std::vector<std::vector<int>> make_sub_groups(const std::vector<std::vector<int>>& groups) const;
  /** The group gradients are reduced and their norm summed over: the optimizer's clone of the
   *  world, or from PR 8060 the parameters' own (the world). */
  GroupId reduce_group() const { return v_.grads_on_param_group ? world_group_ : grad_group_; }
  void overflow_check();
  void invalidate_secondaries();
  void barrier();
  void world_round_trip(const char* name, std::uint64_t bytes, bool read, Purpose p);
  void gather_persistent();
  void all_gather_params(const std::vector<int>& params, bool forward);
  void all_gather_coalesced(std::vector<int> params, bool forward);
  void all_gather_quantized(Handle& h, GroupId g, bool use_secondary, int rank_in_group);
  Access shard_read(int p, bool use_secondary, int rank_in_group) const;
  std::uint64_t lay_out_partition(Handle& h, bool use_secondary) const;
  void wait_handle(int h);
  /// PR 8215's casts around qwZ's quantizer (rule qwz-bf16-cast): from 0.19.6, for parameters
  /// that are not fp16 (`param.to(dtype=torch.half)` is no copy for an fp16 one).
  bool half_cast() const { return v_.qwz_half_cast && sc_.training.dtype != "fp16"; }
  std::set<int> params_to_release(int module, int step_id);
  void reset_step();
  void grad_ready(int p);
  void reduce_ipg();
  void reduce_quantized();
  void optimizer_step();
  void offload_write_back(const std::vector<int>& group);
  void kernel(int module, bool backward);

  const Scenario& sc_;
  const VersionRules& v_;
  const ParamOffload offload_;  ///< zero.offload_param (sim/deepspeed_offload.hpp)
  const Model& md_;
  const Walk& walk_;
  Schedule& s_;
  Rank rank_;
  int world_, hpz_, dt_;
  GroupId world_group_ = kNoGroup, hpz_group_ = kNoGroup, grad_group_ = kNoGroup;
  GroupId intra_group_ = kNoGroup, inter_group_ = kNoGroup;  // qgZ
  RankSchedule out_;
  /// S0 is the default stream; S_step the one run.step_stream = "side" issues forward and
  /// backward from (S0 otherwise): current_ during them.
  StreamId s0_ = 0, sag_ = -1, srs_ = -1, sstep_ = 0;
  std::map<GroupId, StreamId> nccl_;
  StreamId current_ = 0;
  EventId next_event_ = 0;
  Phase phase_ = Phase::kInit;
  Purpose purpose_ = Purpose::kParamInit;
  int step_ = -1;
  int micro_ = 0;
  UnitId unit_ = kNoUnit;
  LabelId label_ = kNoLabel;
  std::vector<LabelId> module_label_;
  std::vector<ShardLayout> layouts_;
  std::vector<ParamState> ps_;
  /** The optimizer's parameters, in model.parameters() order: all but the orphan (a tied
   *  model's own lm_head weight, which only zero.Init ever sees; DsParam::orphan). */
  std::vector<int> optimized_;
  std::vector<std::vector<int>> sub_groups_;  ///< make_sub_groups(), fixed at construction
  /** The optimized parameters in fp16_groups order: the sub-groups one after the other (the
   *  param groups in turn, each in model.parameters() order), which the flat buffer, the
   *  gradient hooks' registration and the secondaries' invalidation follow. */
  std::vector<int> fp16_order_;
  std::vector<Handle> handles_;
  /** __active_backward_submodules (COORD:160 at 0.19.8): modules whose backward fetch ran and
   *  whose post-backward hook has not, in the order recorded. */
  std::vector<int> active_backward_;

  // PartitionedParameterCoordinator (COORD:78-130).
  // COORD:94 at v0.13.4 starts in RECORD; from v0.15.4 (PR 6662) the trace starts INVALID (COORD:98
  // at v0.17.6) and the first reset_step turns it to RECORD.
  enum class Trace { kInvalid, kRecord, kComplete } trace_ = Trace::kRecord;
  std::vector<int> submodule_order_;
  std::vector<TraceEntry> param_order_;
  std::deque<TraceEntry> queue_;
  std::map<int, int> most_recent_;  // param -> step id (absent: -1e10)
  int step_id_ = 0;
  std::int64_t n_available_ = 0;
  std::deque<EventId> ongoing_fetch_events_;
  std::map<std::pair<int, int>, std::set<int>> release_cache_;  // the lru_cache (COORD:487)

  // Stage 3 gradients (S3:1213-1280).
  std::vector<int> ipg_params_;
  std::uint64_t ipg_elems_ = 0;
  std::map<int, Access> ipg_grad_;  // where each bucketed gradient is read from
  BufferId ipg_buffer_ = kNoBuffer;
  std::deque<EventId> param_reduce_events_;
  BufferId grad_shard_ = kNoBuffer;
};

RankBuilder::RankBuilder(const Scenario& sc, const VersionRules& v, const Model& md,
                         const Walk& walk, Schedule& s, Rank r)
    : sc_(sc),
      v_(v),
      offload_(param_offload(sc)),
      md_(md),
      walk_(walk),
      s_(s),
      rank_(r),
      world_(s.world_size),
      hpz_(s.hpz_size),
      dt_(s.dtype_bytes) {
  for (std::size_t g = 0; g < s_.groups.size(); ++g) {
    const Group& grp = s_.groups[g];
    if (std::find(grp.ranks.begin(), grp.ranks.end(), r) == grp.ranks.end()) continue;
    if (grp.name == "world") world_group_ = static_cast<GroupId>(g);
    if (grp.name == "world1") grad_group_ = static_cast<GroupId>(g);
    if (grp.kind == GroupKind::kHpz) hpz_group_ = static_cast<GroupId>(g);
    if (grp.kind == GroupKind::kIntraNode) intra_group_ = static_cast<GroupId>(g);
    if (grp.kind == GroupKind::kInterNode) inter_group_ = static_cast<GroupId>(g);
  }
  if (v.reset_at_forward_start) trace_ = Trace::kInvalid;
  for (const DsModule& m : md_.modules) {
    const auto it = std::find(s_.labels.begin(), s_.labels.end(), m.path);
    module_label_.push_back(static_cast<LabelId>(it - s_.labels.begin()));
  }
  for (const DsParam& p : md_.params) layouts_.emplace_back(p.numel, world_, hpz_);
  ps_.resize(md_.params.size());
  for (int p = 0; p < static_cast<int>(md_.params.size()); ++p) {
    if (!md_.params[p].orphan) optimized_.push_back(p);
  }
  sub_groups_ = make_sub_groups(make_param_groups());
  for (const auto& g : sub_groups_) fp16_order_.insert(fp16_order_.end(), g.begin(), g.end());
  out_.rank = r;
  out_.streams.push_back({"S0"});
}

Op& RankBuilder::push(OpKind kind, StreamId s, Purpose p, std::initializer_list<Access> acc) {
  return push(kind, s, p, std::span<const Access>(acc.begin(), acc.size()));
}

Op& RankBuilder::push(OpKind kind, StreamId s, Purpose p, std::span<const Access> acc) {
  Op op;
  op.kind = kind;
  op.stream = s;
  op.phase = phase_;
  op.purpose = p;
  op.step = step_;
  op.micro_step = micro_;
  op.unit = unit_;
  op.label = label_;
  op.access_begin = static_cast<std::uint32_t>(out_.accesses.size());
  for (const Access& a : acc) {
    if (a.bytes > 0) out_.accesses.push_back(a);
  }
  op.access_count = static_cast<std::uint32_t>(out_.accesses.size() - op.access_begin);
  std::vector<Op>& ops = out_.ops.mut();
  ops.push_back(op);
  return ops.back();
}

EventId RankBuilder::record(StreamId s, Purpose p) {
  Op& op = push(OpKind::kEventRecord, s, p);
  op.event = next_event_++;
  return op.event;
}

void RankBuilder::wait(StreamId s, EventId e, Purpose p) {
  push(OpKind::kStreamWaitEvent, s, p).event = e;
}

// torch.cuda.Stream.wait_stream: an event recorded on `other`, waited for on `waiter`.
// On the same stream it orders nothing; the recorder logs nothing for it either.
void RankBuilder::wait_stream(StreamId waiter, StreamId other, Purpose p) {
  if (waiter == other) return;
  wait(waiter, record(other, p), p);
}

// PG: one NCCL stream per process group, made at the group's first collective.
StreamId RankBuilder::nccl_stream(GroupId g) {
  auto it = nccl_.find(g);
  if (it != nccl_.end()) return it->second;
  const Group& grp = s_.groups[g];
  std::string name = grp.kind == GroupKind::kHpz         ? "nccl.hpz"
                     : grp.kind == GroupKind::kIntraNode ? "nccl.intra_node"
                     : grp.kind == GroupKind::kInterNode ? "nccl.inter_node"
                                                         : "nccl.world";
  if (grp.name == "world1") name = "nccl.world.clone_world_group";
  out_.streams.push_back({name});
  const auto id = static_cast<StreamId>(out_.streams.size() - 1);
  nccl_.emplace(g, id);
  return id;
}

// PG's collective(): the NCCL stream waits for an event on the caller's stream, runs the
// collective, and records its end event, which the work handle's wait() waits for.
EventId RankBuilder::collective(OpKind kind, GroupId g, std::uint64_t bytes,
                                std::vector<Access> acc) {
  const StreamId ns = nccl_stream(g);
  const Purpose hp = (purpose_ == Purpose::kParamFetch || purpose_ == Purpose::kPrefetch)
                         ? Purpose::kNcclHandshake
                         : purpose_;
  wait(ns, record(current_, hp), hp);
  Op& op = push(kind, ns, purpose_);
  op.group = g;
  op.comm_bytes = bytes;
  op.access_begin = static_cast<std::uint32_t>(out_.accesses.size());
  for (const Access& a : acc) {
    if (a.bytes > 0) out_.accesses.push_back(a);
  }
  op.access_count = static_cast<std::uint32_t>(out_.accesses.size() - op.access_begin);
  return record(ns, hp);
}

BufferId RankBuilder::buffer(std::string name, BufferRole role, UnitId unit, std::uint64_t bytes) {
  out_.buffers.push_back({std::move(name), role, unit, bytes, false});
  return static_cast<BufferId>(out_.buffers.size() - 1);
}

void RankBuilder::alloc(BufferId b, StreamId s, Purpose p) {
  // offload_param: torch.empty(device="cpu") (and pin_memory()) is the host's; no stream.
  if (out_.buffers[b].on_host) s = kHostStream;
  Op& op = push(OpKind::kAlloc, s, p);
  op.buffer = b;
  op.fill = static_cast<std::uint8_t>(sc_.run.fill);
}

void RankBuilder::free(BufferId b, StreamId s, Purpose p) {
  if (out_.buffers[b].on_host) s = kHostStream;  // offload_param: host memory, see alloc()
  push(OpKind::kFree, s, p).buffer = b;
}

// The meaningful bytes of `slice` of parameter p, in a buffer that holds the slice (in_full:
// the whole parameter, offsets from its start).
Access RankBuilder::part(int p, BufferId b, ElemRange slice, AccessMode mode, bool in_full) const {
  const ElemRange v = layouts_[p].valid(slice);
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const std::uint64_t off = in_full ? v.begin : v.begin - slice.begin;
  return {b, mode, off * dt, v.size() * dt};
}

// zero.Init (PP:1064-1110, _zero_init_param 1008): each parameter is made whole, broadcast
// from rank 0, and partitioned: secondary first, then primary, then the whole tensor freed.
void RankBuilder::init() {
  phase_ = Phase::kInit;
  step_ = -1;
  // A module's parameters are made by its __init__ (all allocated and initialized there), then
  // converted one by one by zero.Init's _post_init_method (PP:1064-1110, named_parameters order).
  const int n = static_cast<int>(md_.params.size());
  for (int first = 0; first < n;) {
    const int end = module_group_end(first);
    purpose_ = Purpose::kParamInit;
    std::vector<Access> made;
    double bytes = 0;
    for (int p = first; p < end; ++p) {
      const DsParam& dp = md_.params[p];
      unit_ = static_cast<UnitId>(p);
      ps_[p].full = buffer(dp.name + ".full", BufferRole::kFull, unit_, dp.numel * dt_);
      alloc(ps_[p].full, s0_, Purpose::kParamInit);
      if (dp.unwritten) continue;
      made.push_back(part(p, ps_[p].full, {0, dp.numel}, AccessMode::kWrite, true));
      bytes += static_cast<double>(dp.numel * dt_);
    }
    unit_ = static_cast<UnitId>(first);
    if (!made.empty()) {
      push(OpKind::kKernel, s0_, Purpose::kParamInit, std::span<const Access>(made)).mem_bytes =
          bytes;
    }
    for (int p = first; p < end; ++p) {
      const DsParam& dp = md_.params[p];
      ParamState& st = ps_[p];
      unit_ = static_cast<UnitId>(p);
      const ElemRange all{0, dp.numel};
      const EventId done = collective(OpKind::kAllReduce, world_group_, dp.numel * dt_,
                                      {part(p, st.full, all, AccessMode::kRead, true),
                                       part(p, st.full, all, AccessMode::kWrite, true)});
      wait(current_, done, Purpose::kParamInit);
      st.status = Status::kAvailable;
      if (hpz_ > 1) {
        st.secondary = buffer(dp.name + ".secondary", BufferRole::kSecondary, unit_,
                              layouts_[p].secondary_numel() * dt_);
        place_on_host(st.secondary, offload_.secondary_on_host());  // PP:1616-1621
      }
      st.primary = buffer(dp.name + ".primary", BufferRole::kPrimary, unit_,
                          layouts_[p].shard_numel() * dt_);
      place_on_host(st.primary, offload_.primary_on_host(dp.persist, false));  // PP:1533-1547
      partition(p);
    }
    first = end;
  }
  unit_ = kNoUnit;
  if (sc_.run.load == "pretrained") load_pretrained();
  // The stage-3 optimizer's constructor (S3:87-382). _create_fp16_partitions_with_defragmentation
  // (S3:661-700) starts with a barrier and moves every primary shard into one flat buffer
  // (defragment, S3:526-560: each shard copied out, empty_cache(), the flat buffer back on the
  // device and each shard a view of it).
  barrier();
  std::vector<BufferId> moved(md_.params.size(), kNoBuffer);
  for (const int p : fp16_order_) {
    moved[p] = buffer(md_.params[p].name + ".primary", BufferRole::kPrimary, static_cast<UnitId>(p),
                      layouts_[p].shard_numel() * dt_);
    // offload_param: the pinned host flat buffer of _create_param_groups_fp16_flat_cpu_memory
    // (S3:652-655) instead of the device one, persistent parameters' shards included.
    place_on_host(moved[p], offload_.primary_on_host(md_.params[p].persist, true));
    unit_ = static_cast<UnitId>(p);
    alloc(moved[p], current_, Purpose::kParamInit);
  }
  for (const int p : fp16_order_) {
    const std::uint64_t shard = layouts_[p].shard_numel() * dt_;
    unit_ = static_cast<UnitId>(p);
    // The whole shard is copied (its bytes timed), but only the parameter's own elements mean
    // anything: a shard's padding is never written (PP:1633-1645 copy the parameter's elements
    // only) and every gather drops it, as the step's gathers' reads do (shard_read).
    const ElemRange mine = layouts_[p].primary_slice(rank_);
    // offload_param: _move_to_flat_buffer's `dest.data.copy_(src.data)` (S3:629-631), a host
    // memcpy, or a device-to-host copy and sync for a persistent parameter's device shard.
    blocking_copy(*this, current_, Purpose::kParamInit,
                  part(p, ps_[p].primary, mine, AccessMode::kRead, false),
                  part(p, moved[p], mine, AccessMode::kWrite, false),
                  static_cast<double>(2 * shard));
    ps_[p].primary = moved[p];
  }
  unit_ = kNoUnit;
  // empty_cache() is defragment's (S3:556); offload_param's branch has none (S3:700-733).
  if (!offload_.enabled) push(OpKind::kHostDeviceSync, kHostStream, Purpose::kParamInit);
  // _setup_for_real_optimizer (S3:470-483): the fp32 partitions, a barrier, the optimizer
  // states, a barrier.
  barrier();
  if (v_.optimizer_step_at_init) {
    // initialize_optimizer_states ran the optimizer once per sub-group (S3:1014-1015 at v0.13.1)
    // to create its states (sub_groups_). The recorder's AdamW logs a host sync per step, as
    // in optimizer_step().
    for (std::size_t g = 0; g < sub_groups_.size(); ++g) {
      push(OpKind::kKernel, s0_, Purpose::kParamInit);
      if (sc_.run.as_recorded) push(OpKind::kHostStreamSync, s0_, Purpose::kParamInit);
    }
  }
  barrier();
  // create_reduce_and_remove_grad_hooks (S3:1108-1143): each trainable parameter, in
  // fp16_groups order (S3:1116-1117 at v0.13.4), is gathered whole so that its AccumulateGrad
  // hook can be registered, then partitioned again.
  for (const int p : fp16_order_) {
    gather_blocking(p);
    partition(p);
  }
  unit_ = kNoUnit;
}

// dist.barrier(): ProcessGroupNCCL's barrier all-reduces a one-element tensor of its own on the
// world group and waits for it on the host (ProcessGroupNCCL.cpp barrier(); the recorder logs it
// the same way).
void RankBuilder::barrier() {
  world_round_trip("barrier", 4, true, purpose_);
}

// A small tensor made on the device (an allocation and a write, none when it is empty), a
// blocking all-reduce of it on the world group from the current stream (a broadcast is logged
// the same way by the recorder), and, when `read`, the host reading it back (`.item()` or
// `.cpu()`: a host sync of that stream).
void RankBuilder::world_round_trip(const char* name, std::uint64_t bytes, bool read, Purpose p) {
  const BufferId t = buffer(name, BufferRole::kScratch, kNoUnit, bytes);
  if (bytes > 0) {
    alloc(t, current_, p);
    push(OpKind::kKernel, current_, p, {{t, AccessMode::kWrite, 0, bytes}});
  }
  const EventId done =
      collective(OpKind::kAllReduce, world_group_, bytes,
                 {{t, AccessMode::kRead, 0, bytes}, {t, AccessMode::kWrite, 0, bytes}});
  wait(current_, done, p);
  if (read) push(OpKind::kHostStreamSync, current_, p);
}

// param.all_gather() (PP:1114) on one parameter: _all_gather (PP:1432-1462) with async_op
// false calls _allgather_params (PP:1822-1870): a flat buffer of partition_size * world, this
// rank's shard copied into its slot, a blocking all_gather_into_tensor on the parameter's
// ds_process_group (the world), and the parameter's new data copied out of the flat buffer.
void RankBuilder::gather_blocking(int p) {
  const DsParam& dp = md_.params[p];
  ParamState& st = ps_[p];
  const ShardLayout& l = layouts_[p];
  const std::uint64_t shard = l.shard_numel() * dt_;
  if (v_.sequential_blocking_gather) {
    // _allgather_params_sequential (PP:1997-2050 at v0.18.5, PR 7661), which a blocking gather
    // of one parameter takes from v0.18.5 (PP:1618): all_gather_into_tensor from the shard
    // itself into a flat tensor that becomes the parameter's data (a narrowed view, no copy),
    // then a device synchronize.
    st.full = buffer(dp.name + ".full", BufferRole::kFull, static_cast<UnitId>(p),
                     l.padded_numel() * dt_);
    unit_ = kNoUnit;
    alloc(st.full, current_, Purpose::kParamInit);
    // offload_param: `param.ds_tensor.to(device)` (PP:2146 at v0.19.8) stages a host shard.
    Access sent = shard_read(p, false, rank_);
    const BufferId staged =
        stage_to_device(*this, current_, Purpose::kParamInit, sent, dp.name + ".to_device", p);
    const EventId done =
        collective(OpKind::kAllGather, world_group_, shard,
                   {sent, {st.full, AccessMode::kWrite, 0, l.padded_numel() * dt_}});
    if (staged != kNoBuffer) free(staged, current_, Purpose::kOffloadCopy);
    wait(current_, done, Purpose::kParamInit);
    push(OpKind::kHostDeviceSync, kHostStream, Purpose::kParamInit);
    st.status = Status::kAvailable;
    return;
  }
  const BufferId flat =
      buffer(dp.name + ".gather_flat", BufferRole::kScratch, kNoUnit, l.padded_numel() * dt_);
  unit_ = kNoUnit;
  alloc(flat, current_, Purpose::kParamInit);
  // This rank's own elements (the padding means nothing, as in the defragment above), in its
  // slot of the flat buffer.
  const Access own = part(p, st.primary, l.primary_slice(rank_), AccessMode::kRead, false);
  const std::uint64_t slot = static_cast<std::uint64_t>(rank_) * shard + own.offset;
  // offload_param: `partitions[i].narrow(...).copy_(param.ds_tensor.data)` from host memory
  // (PP:1842 at v0.13.4), which the host waits for.
  blocking_copy(*this, current_, Purpose::kParamInit, own,
                {flat, AccessMode::kWrite, slot, own.bytes}, static_cast<double>(2 * shard));
  const EventId done = collective(OpKind::kAllGather, world_group_, shard,
                                  {{flat, AccessMode::kRead, slot, own.bytes},
                                   {flat, AccessMode::kWrite, 0, l.padded_numel() * dt_}});
  wait(current_, done, Purpose::kParamInit);  // the work's wait() (PG), async_op false
  st.full = buffer(dp.name + ".full", BufferRole::kFull, static_cast<UnitId>(p), dp.numel * dt_);
  alloc(st.full, current_, Purpose::kParamInit);
  push(OpKind::kCopy, current_, Purpose::kParamInit,
       {{flat, AccessMode::kRead, 0, dp.numel * dt_},
        part(p, st.full, {0, dp.numel}, AccessMode::kWrite, true)})
      .mem_bytes = static_cast<double>(2 * dp.numel * dt_);
  st.status = Status::kAvailable;
}

// param.partition() -> Init._partition (PP:1470-1478): the secondary (PP:1603), then the
// primary (PP:1483), whose last act is free_param (PP:276) on the current stream.
void RankBuilder::partition(int p, bool has_been_updated) {
  ParamState& st = ps_[p];
  const UnitId saved = unit_;
  unit_ = p;
  // [bugs] secondary_mismatch_rank (the bug class of DeepSpeed issue 5030 as hpzlab re-creates
  // it): that rank's parameters never get a secondary, so its ds_secondary_tensor stays None and
  // its gathers take the world group (PP:1156-1260's use_secondary_tensor) while its hpZ peers
  // take theirs.
  const bool mismatched = rank_ == sc_.bugs.secondary_mismatch_rank;
  if (hpz_ > 1 && st.status == Status::kAvailable && !mismatched) {
    const bool create = !st.has_secondary;
    // The early return (PP:1611-1613 at v0.13.1, PP:1772-1773 at v0.18.2) skips the copy when a
    // secondary exists, unless has_been_updated reaches it (VersionRules::secondary_sees_update).
    if (create || !v_.copy_only_on_create || (has_been_updated && v_.secondary_sees_update)) {
      if (create) {
        alloc(st.secondary, current_, Purpose::kSecondaryAlloc);
        st.has_secondary = true;
      } else if (has_been_updated && v_.secondary_realloc_on_update) {
        // Up to v0.13.1 an update makes the secondary anew: torch.empty, then the assignment
        // drops the old one (PP:1619-1632 at v0.13.1).
        const BufferId old = st.secondary;
        st.secondary = buffer(md_.params[p].name + ".secondary", BufferRole::kSecondary, unit_,
                              layouts_[p].secondary_numel() * dt_);
        place_on_host(st.secondary, offload_.secondary_on_host());
        alloc(st.secondary, current_, Purpose::kSecondaryAlloc);
        free(old, current_, Purpose::kSecondaryAlloc);
      }
      const int pos = rank_ % hpz_;
      if (v_.zero_fill_secondary) {
        // PP:1899 at v0.19.5 (PR 8210): ds_secondary_tensor.zero_(), padding included; with
        // offload_param a memset of host memory by the host thread (PP:1940 at v0.19.8).
        push(OpKind::kKernel, offload_.secondary_on_host() ? kHostStream : current_,
             Purpose::kSecondaryPartitionCopy,
             {{st.secondary, AccessMode::kWrite, 0, layouts_[p].secondary_numel() * dt_}});
      }
      const std::optional<ElemRange> copied = secondary_copy(
          layouts_[p], v_.copy_bounds, rank_, pos, static_cast<std::uint64_t>(world_ / hpz_));
      if (!copied) {
        // What torch's narrow() says, and where DeepSpeed's tracker has it.
        const char* why =
            v_.copy_bounds == CopyBounds::kSecNumel
                ? "narrow(): length must be non-negative; issue 5642, handled by PR 5652 in "
                  "0.14.4 where the slice starts inside the parameter"
            : v_.copy_bounds == CopyBounds::kClamped
                ? "narrow(): start out of range; issue 6659, fixed by PR 8210 in 0.19.5"
                : "narrow() past the parameter's end";
        throw ReleaseRefusal(
            sc_.path, "zero.deepspeed_version",
            fmt::format("DeepSpeed {} raises at its secondary copy of {} on rank {} "
                        "(its secondary slice starts at element {} of the "
                        "parameter's {} in _partition_param_sec: {}); allowed: "
                        "0.13.4, whose bounds skip that copy, or another world or "
                        "hpZ size",
                        v_.name, md_.params[p].name, rank_, layouts_[p].secondary_slice(pos).begin,
                        layouts_[p].numel(), why));
      }
      const ElemRange sec = *copied;
      if (!sec.empty()) {
        // run.spin_before_copy_us (a what-if): a spin kernel holds the copy's stream ahead of
        // each copy of a training step, as a reproduction on a GPU does.
        if (phase_ != Phase::kInit && sc_.run.spin_before_copy_us > 0) {
          push(OpKind::kKernel, current_, Purpose::kReproSpin).spin_us =
              static_cast<float>(sc_.run.spin_before_copy_us);
        }
        // offload_param: a device-to-host copy_ without non_blocking, which the host waits for
        // (PP:1643-1651 at v0.13.4, PP:1943-1945 at v0.19.8; deepspeed_offload.hpp).
        blocking_copy(*this, current_, Purpose::kSecondaryPartitionCopy,
                      part(p, st.full, sec, AccessMode::kRead, true),
                      part(p, st.secondary, sec, AccessMode::kWrite, false),
                      static_cast<double>(2 * layouts_[p].valid(sec).size() * dt_));
      }
      if (v_.host_sync_after_copy || sc_.run.variant == Variant::kHostSync) {
        push(OpKind::kHostStreamSync, current_, Purpose::kFixHostSync);
      } else if (sc_.run.variant == Variant::kEventWait) {
        st.secondary_ready = record(current_, Purpose::kFixEventRecord);
      }
    }
  }
  if (st.status == Status::kAvailable) {
    // ds_tensor is None (the first partition, PP:1501), or has_been_updated: the full tensor's
    // slice is copied into the shard (PP:1662-1700 at v0.18.2).
    if (!st.has_primary || has_been_updated) {
      const Purpose why = st.has_primary ? purpose_ : Purpose::kParamInit;
      if (!st.has_primary) alloc(st.primary, current_, Purpose::kParamInit);
      st.has_primary = true;
      const ElemRange pri = layouts_[p].primary_slice(rank_);
      // offload_param: `param.ds_tensor.copy_(src_tensor)` into host memory (PP:1556 at
      // v0.13.4), which the host waits for.
      blocking_copy(*this, current_, why, part(p, st.full, pri, AccessMode::kRead, true),
                    part(p, st.primary, pri, AccessMode::kWrite, false), 0);
    }
    free(st.full, current_, phase_ == Phase::kInit ? Purpose::kParamInit : Purpose::kParamRelease);
  }
  st.status = Status::kNotAvailable;
  unit_ = saved;
}

void RankBuilder::kernel(int module, bool backward) {
  const DsModule& m = md_.modules[module];
  const double tokens =
      static_cast<double>(sc_.training.micro_batch) * sc_.training.seq_len * m.token_share;
  const double h = sc_.model.hidden;
  Op* op = nullptr;
  const Purpose p = backward ? Purpose::kBackwardCompute : Purpose::kForwardCompute;
  if (!m.params.empty()) {
    // One kernel for the module: it reads its parameters (weight and bias) and, backward,
    // writes their gradients.
    std::vector<Access> acc;
    double n = 0, matrix = 0;
    for (const int q : m.params) {
      const ElemRange all{0, md_.params[q].numel};
      acc.push_back(part(q, ps_[q].full, all, AccessMode::kRead, true));
      if (backward) {
        ParamState& st = ps_[q];
        if (st.grad == kNoBuffer) {
          st.grad = buffer(md_.params[q].name + ".grad", BufferRole::kGradFull, q,
                           md_.params[q].numel * dt_);
        }
        acc.push_back(part(q, st.grad, all, AccessMode::kWrite, true));
      }
      n += static_cast<double>(md_.params[q].numel);
      if (md_.params[q].rows > 0) matrix += static_cast<double>(md_.params[q].numel);
    }
    op = &push(OpKind::kKernel, current_, p, std::span<const Access>(acc));
    if (m.kind == ModKind::kLinear || m.kind == ModKind::kHead) {
      op->flops = 2 * tokens * matrix * (backward ? 2 : 1);
    }
    op->mem_bytes = n * dt_ + 2 * tokens * h * dt_;
  } else {
    op = &push(OpKind::kKernel, current_, p);
    op->mem_bytes = 2 * tokens * h * dt_;
  }
  if (m.attn_core) {
    // Attention scores (over the query/key heads' width) and their product with V (over the
    // value heads'); DeepSeek-V2's heads have nope + rope query/key and v_head_dim value width.
    const ModelConfig& c = sc_.model;
    const double qk = c.kv_lora_rank > 0
                          ? static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim) * c.heads
                      : c.head_dim > 0 ? static_cast<double>(c.head_dim) * c.heads
                                       : h;
    const double v = c.kv_lora_rank > 0 ? static_cast<double>(c.v_head_dim) * c.heads : qk;
    op->flops += 2 * tokens * sc_.training.seq_len * (qk + v) * (backward ? 2 : 1);
  }
}

// COORD:261-391.
void RankBuilder::fetch_sub_module(int module, bool forward) {
  if (trace_ == Trace::kRecord) submodule_order_.push_back(module);  // record_module (PO:447)
  const LabelId saved = label_;
  label_ = module_label_[module];
  // iter_params(module, recurse=z3_leaf_module(module)) (COORD:300 at v0.18.2): its own
  // parameters (PO:60-61), weight before bias; a z3 leaf's whole subtree.
  const std::vector<int>& to_fetch = md_.hooked(module);
  // Kick off the module's own gathers.
  std::vector<int> missing;
  for (int p : to_fetch) {
    if (ps_[p].status == Status::kNotAvailable) missing.push_back(p);
  }
  if (!missing.empty()) {
    purpose_ = Purpose::kParamFetch;
    all_gather_params(missing, forward);
  }
  // Wait for them, inside `with stream(S_ag)`, throttling the host (COORD:296-313).
  purpose_ = Purpose::kFetchWait;
  for (int p : to_fetch) {
    ps_[p].active.insert(module);
    if (ps_[p].handle >= 0) {
      const StreamId saved_stream = current_;
      current_ = sag_;
      // Event.query() answers "not done" (the recorder's convention, docs/record.md): only
      // the synchronize of the oldest beyond __max_ongoing_fetch_events = 2 happens.
      if (ongoing_fetch_events_.size() > 2) {
        push(OpKind::kHostEventSync, kHostStream, Purpose::kHostThrottle).event =
            ongoing_fetch_events_.front();
        ongoing_fetch_events_.pop_front();
      }
      const int h = ps_[p].handle;
      ps_[p].handle = -1;
      wait_handle(h);
      // `__inflight_param_registry.pop(param).wait()`: the last pop drops the handle, and with
      // it the partitions that keep a coalesced gather's flat tensor alive (PP:640-702), so the
      // allocator takes the flat buffer back (on the stream it was allocated on). A qwZ
      // handle's QuantizationInfo goes with it, after the partitions (attributes go in the
      // order they were set): the int8 gather buffer, then the scales' (PP:1241-1245, 1303-1307).
      if (Handle& hd = handles_[static_cast<std::size_t>(h)]; --hd.registered == 0) {
        if (hd.coalesced && hd.flat != kNoBuffer)
          free(hd.flat, hd.flat_stream, Purpose::kFetchWait);
        if (hd.quantized) {
          free(hd.qbuf, hd.q_stream, Purpose::kFetchWait);
          free(hd.sbuf, hd.q_stream, Purpose::kFetchWait);
        }
      }
      ongoing_fetch_events_.push_back(record(sag_, Purpose::kFetchWait));
      current_ = saved_stream;
    }
  }
  // Every hook: the current stream waits for the all-gather stream (COORD:317-318).
  wait_stream(current_, sag_, Purpose::kFetchWait);

  if (trace_ == Trace::kComplete) {
    // Pop the module's own entries (COORD:327-343).
    std::set<int> not_fetched;
    for (int p : to_fetch) {
      auto it = most_recent_.find(p);
      if (it == most_recent_.end() || it->second < step_id_) not_fetched.insert(p);
    }
    std::set<int> discarded;
    while (!queue_.empty() && discarded.size() < not_fetched.size()) {
      const TraceEntry e = queue_.front();
      queue_.pop_front();
      most_recent_[e.param] = e.step_id;
      discarded.insert(e.param);
    }
    if (discarded != not_fetched) {
      throw std::logic_error(
          "DeepSpeed builder: the parameter trace diverged at coordinator step " +
          std::to_string(step_id_) + " (" + md_.modules[module].path + ")");
    }
    // Prefetch within the per-call budget (COORD:353-386).
    const std::int64_t bucket = sc_.zero.stage3_prefetch_bucket_size;
    if (bucket > 0) {
      const std::int64_t budget =
          std::min<std::int64_t>(sc_.zero.stage3_max_live_parameters - n_available_, bucket);
      std::vector<int> prefetch;
      std::int64_t numel = 0;
      while (!queue_.empty() && numel < budget) {
        const TraceEntry e = queue_.front();
        queue_.pop_front();
        bool do_prefetch = ps_[e.param].status == Status::kNotAvailable;
        if (std::find(prefetch.begin(), prefetch.end(), e.param) != prefetch.end()) {
          do_prefetch = false;
        }
        auto it = most_recent_.find(e.param);
        most_recent_[e.param] =
            it == most_recent_.end() ? e.step_id : std::max(it->second, e.step_id);
        if (do_prefetch) {
          prefetch.push_back(e.param);
          // Saturating at the budget: near 2^63 the sum overflowed.
          numel += std::min(static_cast<std::int64_t>(md_.params[e.param].numel), budget - numel);
        }
      }
      if (numel > 0) {
        purpose_ = Purpose::kPrefetch;
        all_gather_params(prefetch, forward);
      }
    }
  }
  ++step_id_;
  label_ = saved;
}

// COORD:423-455: parameters with a secondary and those without go in separate calls (from
// v0.13.2), each inside `with stream(S_ag)`.
void RankBuilder::all_gather_params(const std::vector<int>& params, bool forward) {
  std::vector<int> partitioned;
  for (int p : params) {
    if (ps_[p].status == Status::kNotAvailable) partitioned.push_back(p);
  }
  if (partitioned.empty()) return;
  for (int p : partitioned) n_available_ += static_cast<std::int64_t>(md_.params[p].numel);
  std::vector<std::vector<int>> calls;
  if (v_.split_by_secondary) {
    std::vector<int> with, without;
    for (int p : partitioned) (ps_[p].has_secondary ? with : without).push_back(p);
    if (!with.empty()) calls.push_back(with);
    if (!without.empty()) calls.push_back(without);
  } else {
    calls.push_back(partitioned);
  }
  for (auto& call : calls) {
    const StreamId saved = current_;
    current_ = sag_;
    all_gather_coalesced(call, forward);
    current_ = saved;
  }
}

// PP:1156-1260 (all_gather_coalesced) and 1120-1154 (_all_gather_dtype).
void RankBuilder::all_gather_coalesced(std::vector<int> params, bool forward) {
  std::sort(params.begin(), params.end());  // by ds_id
  const bool use_secondary =
      ps_[params[0]].has_secondary && hpz_ > 1 && !(v_.secondary_only_backward && forward);
  const bool hpz_group = hpz_ > 1 && (v_.secondary_only_backward ? !forward : use_secondary);
  const GroupId g = hpz_group ? hpz_group_ : world_group_;
  const int group_size = hpz_group ? hpz_ : world_;
  const int rank_in_group = hpz_group ? rank_ % hpz_ : rank_;
  // event-wait (fix B): the gathering stream waits for the copy that wrote each secondary read.
  for (int p : params) {
    if (use_secondary && ps_[p].secondary_ready != kNoEvent) {
      wait(current_, ps_[p].secondary_ready, Purpose::kFixEventWait);
      ps_[p].secondary_ready = kNoEvent;
    }
  }
  for (int p : params) ps_[p].status = Status::kInflight;
  Handle h;
  h.params = params;
  h.group_size = group_size;
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  if (sc_.zero.zero_quantized_weights) {
    all_gather_quantized(h, g, use_secondary, rank_in_group);
  } else if (params.size() == 1) {
    // One parameter: gathered straight into its full buffer (PP:1202-1222).
    const int p = params[0];
    ParamState& st = ps_[p];
    const UnitId saved_unit = unit_;
    unit_ = p;
    alloc(st.full, current_, purpose_);
    const std::uint64_t in_elems =
        use_secondary ? layouts_[p].secondary_numel() : layouts_[p].shard_numel();
    // offload_param: `param_ds_tensor.to(device)` (PP:1218 at v0.13.4) on S_ag, a temporary
    // dropped when _dist_allgather_fn returns.
    Access sent = shard_read(p, use_secondary, rank_in_group);
    const BufferId staged =
        stage_to_device(*this, current_, purpose_, sent, md_.params[p].name + ".to_device", p);
    h.end = collective(
        OpKind::kAllGather, g, in_elems * dt,
        {sent, part(p, st.full, ElemRange{0, md_.params[p].numel}, AccessMode::kWrite, true)});
    if (staged != kNoBuffer) free(staged, current_, Purpose::kOffloadCopy);
    unit_ = saved_unit;
  } else {
    // Several: a flat buffer, torch.cat of the shards into this rank's partition, one
    // collective; the per-parameter copies out of it happen at wait() (PP:664-703).
    const std::uint64_t partition_sz = lay_out_partition(h, use_secondary);
    h.coalesced = true;
    h.flat = buffer("allgather.flat", BufferRole::kScratch, kNoUnit,
                    partition_sz * static_cast<std::uint64_t>(group_size) * dt);
    alloc(h.flat, current_, purpose_);
    h.flat_stream = current_;
    const std::uint64_t base = partition_sz * static_cast<std::uint64_t>(rank_in_group) * dt;
    // offload_param: the list comprehension inside torch.cat, `p.ds_secondary_tensor.to(device)`
    // (or ds_tensor's) for each parameter on S_ag (PP:1137-1143 at v0.13.4), before the cat.
    std::vector<Access> reads;
    std::vector<BufferId> staged;
    for (const int p : params) {
      reads.push_back(shard_read(p, use_secondary, rank_in_group));
      const UnitId saved_unit = unit_;
      unit_ = p;
      staged.push_back(stage_to_device(*this, current_, purpose_, reads.back(),
                                       md_.params[p].name + ".to_device", p));
      unit_ = saved_unit;
    }
    Op& cat = push(OpKind::kCopy, current_, purpose_);
    cat.unit = params[0];
    // The collective sends this rank's whole partition, but only the parameters' own elements
    // in it mean anything: a shard's padding is never written (init above), and each
    // parameter's copy out of the flat buffer drops it (wait_handle). So the send reads what the
    // torch.cat wrote, adjacent slots as one range.
    std::vector<Access> sent;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const int p = params[i];
      const ElemRange mine = use_secondary ? layouts_[p].secondary_slice(rank_in_group)
                                           : layouts_[p].primary_slice(rank_);
      const Access a = reads[i];
      if (a.bytes > 0) out_.accesses.push_back(a);
      const ElemRange v = layouts_[p].valid(mine);
      if (!v.empty()) {
        const Access w{h.flat, AccessMode::kWrite,
                       base + (h.offsets[i] + v.begin - mine.begin) * dt, v.size() * dt};
        out_.accesses.push_back(w);
        if (!sent.empty() && sent.back().end() == w.offset) {
          sent.back().bytes += w.bytes;
        } else {
          sent.push_back({h.flat, AccessMode::kRead, w.offset, w.bytes});
        }
      }
      cat.mem_bytes += 2.0 * static_cast<double>(v.size() * dt);
    }
    cat.access_count = static_cast<std::uint32_t>(out_.accesses.size() - cat.access_begin);
    for (const BufferId b : staged) {  // the list is dropped once the cat has run
      if (b != kNoBuffer) free(b, current_, Purpose::kOffloadCopy);
    }
    const UnitId saved_unit = unit_;
    unit_ = params[0];
    sent.push_back({h.flat, AccessMode::kWrite, 0,
                    partition_sz * static_cast<std::uint64_t>(group_size) * dt});
    h.end = collective(OpKind::kAllGather, g, partition_sz * dt, sent);
    unit_ = saved_unit;
  }
  h.registered = params.size();
  handles_.push_back(std::move(h));
  for (int p : params) ps_[p].handle = static_cast<int>(handles_.size() - 1);
}

// What a gather reads of parameter p on this rank: its slice of the secondary (hpZ group) or of
// the primary (world).
Access RankBuilder::shard_read(int p, bool use_secondary, int rank_in_group) const {
  const ElemRange mine =
      use_secondary ? layouts_[p].secondary_slice(rank_in_group) : layouts_[p].primary_slice(rank_);
  return part(p, use_secondary ? ps_[p].secondary : ps_[p].primary, mine, AccessMode::kRead, false);
}

// A coalesced gather's per-rank partition (PP:1262-1265): each parameter's shard (or secondary)
// back to back; its offsets and chunks go into the handle, its size is returned.
std::uint64_t RankBuilder::lay_out_partition(Handle& h, bool use_secondary) const {
  std::uint64_t partition_sz = 0;
  for (int p : h.params) {
    h.offsets.push_back(partition_sz);
    const std::uint64_t n =
        use_secondary ? layouts_[p].secondary_numel() : layouts_[p].shard_numel();
    h.chunk.push_back(n);
    partition_sz += n;
  }
  h.per_rank_elems = partition_sz;
  return partition_sz;
}

// CUDAQuantizer.quantize's group count (PP:735-757): the smallest count from numel / 8000 up
// that divides numel into groups of a multiple of 8, doubled while that holds and groups stay
// above 8000 elements. DeepSpeed asserts a multiple of 8 elements and groups under 16000.
std::uint64_t quantizer_groups(std::uint64_t numel, const std::string& what) {
  constexpr std::uint64_t kTarget = 8000;
  std::uint64_t groups = (numel + kTarget - 1) / kTarget;
  while (groups < numel && numel % (8 * groups) != 0) ++groups;
  while (numel % (8 * groups * 2) == 0 && numel / groups > kTarget) groups *= 2;
  if (groups == 0 || numel % (8 * groups) != 0 || numel / groups >= 16000 || numel <= groups) {
    throw InputError("", "zero.zero_quantized_weights",
                     "DeepSpeed's qwZ quantizer (CUDAQuantizer.quantize, "
                     "runtime/zero/partition_parameters.py:751 at v0.13.4) asserts that a gathered "
                     "shard holds a multiple of 8 elements; " +
                         what + " holds " + std::to_string(numel) +
                         ", so DeepSpeed itself stops here");
  }
  return groups;
}

// qwZ (all_gather_coalesced with quantize, PP:1224-1247 for one parameter, 1260-1318 for
// several): the int8 gather buffer, the shard (or the torch.cat of the shards, on S_ag)
// quantized to int8 with one fp32 scale a group, then two all-gathers on the same group, the
// values' and the scales'. wait_handle dequantizes.
void RankBuilder::all_gather_quantized(Handle& h, GroupId g, bool use_secondary,
                                       int rank_in_group) {
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  const auto group_size = static_cast<std::uint64_t>(h.group_size);
  h.quantized = true;
  const std::uint64_t partition_sz = lay_out_partition(h, use_secondary);
  h.coalesced = h.params.size() > 1;
  const UnitId saved_unit = unit_;
  unit_ = h.params[0];
  h.qbuf = buffer("allgather.int8", BufferRole::kQuantized, kNoUnit, partition_sz * group_size);
  h.q_stream = current_;
  alloc(h.qbuf, current_, purpose_);
  std::vector<Access> src;
  for (int p : h.params) src.push_back(shard_read(p, use_secondary, rank_in_group));
  const std::string what =
      "the gather of " + md_.params[h.params[0]].name +
      (h.params.size() > 1 ? " and " + std::to_string(h.params.size() - 1) + " more" : "");
  const std::uint64_t groups = quantizer_groups(partition_sz, what);
  const BufferId q =
      buffer("quantize.out", BufferRole::kQuantized, kNoUnit, partition_sz + groups * 4);
  BufferId cat = kNoBuffer;
  if (h.coalesced) {
    // torch.cat of the shards, then the quantize kernel on it.
    cat = buffer("allgather.cat", BufferRole::kScratch, kNoUnit, partition_sz * dt);
    alloc(cat, current_, purpose_);
    src.push_back({cat, AccessMode::kWrite, 0, partition_sz * dt});
    push(OpKind::kCopy, current_, purpose_, src).mem_bytes =
        2.0 * static_cast<double>(partition_sz * dt);
    src = {{cat, AccessMode::kRead, 0, partition_sz * dt}};
  }
  // From 0.19.6 (PR 8215) CUDAQuantizer.quantize first casts a parameter that is not fp16 to an
  // fp16 temporary (PP:890 at 0.19.8), which the kernel reads and which is dropped when quantize
  // returns, before the caller drops its torch.cat.
  BufferId half = kNoBuffer;
  std::uint64_t kernel_in = partition_sz * dt;
  if (half_cast()) {
    half = buffer("quantize.fp16", BufferRole::kScratch, kNoUnit, partition_sz * 2);
    alloc(half, current_, purpose_);
    src.push_back({half, AccessMode::kWrite, 0, partition_sz * 2});
    push(OpKind::kCopy, current_, purpose_, src).mem_bytes =
        static_cast<double>(partition_sz * dt + partition_sz * 2);
    src = {{half, AccessMode::kRead, 0, partition_sz * 2}};
    kernel_in = partition_sz * 2;
  }
  alloc(q, current_, purpose_);
  src.push_back({q, AccessMode::kWrite, 0, partition_sz + groups * 4});
  push(OpKind::kQuantize, current_, purpose_, src).mem_bytes =
      static_cast<double>(kernel_in + partition_sz + groups * 4);
  if (half != kNoBuffer) free(half, current_, purpose_);
  // The torch.cat was quantize()'s argument only: dropped when it returns (PP:1283-1290).
  if (h.coalesced) free(cat, current_, purpose_);
  h.sbuf = buffer("allgather.scales", BufferRole::kScratch, kNoUnit, groups * 4 * group_size);
  // The scales' buffer is made before the values' gather when several are gathered (PP:1292),
  // after it for one (PP:1234-1239).
  if (h.coalesced) alloc(h.sbuf, current_, purpose_);
  h.end = collective(OpKind::kAllGather, g, partition_sz,
                     {{q, AccessMode::kRead, 0, partition_sz},
                      {h.qbuf, AccessMode::kWrite, 0, partition_sz * group_size}});
  if (!h.coalesced) alloc(h.sbuf, current_, purpose_);
  h.scale_end = collective(OpKind::kAllGather, g, groups * 4,
                           {{q, AccessMode::kRead, partition_sz, groups * 4},
                            {h.sbuf, AccessMode::kWrite, 0, groups * 4 * group_size}});
  // quantized_param and scales are the function's locals: dropped when it returns with the
  // handle (PP:1247, 1318); the collectives' own use is the allocator's business (record_stream).
  free(q, current_, purpose_);
  unit_ = saved_unit;
}

// AllGatherHandle.wait (PP:631-638) and AllGatherCoalescedHandle.wait (PP:664-703): the current
// stream (S_ag) waits for the NCCL end event; a coalesced gather then cats each parameter out
// of the flat buffer.
void RankBuilder::wait_handle(int hid) {
  Handle& h = handles_[hid];
  if (h.complete) return;
  const Purpose hp = Purpose::kNcclHandshake;
  wait(current_, h.end, hp);
  if (h.quantized) {
    // The scales' handle too, then dequantize (CUDAQuantizer.dequantize, PP:761): one kernel
    // writes the parameter (one gathered) or a flat tensor of them all (several).
    wait(current_, h.scale_end, hp);
    const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
    const std::uint64_t per_rank = h.per_rank_elems;
    const std::uint64_t total = per_rank * static_cast<std::uint64_t>(h.group_size);
    BufferId out = kNoBuffer;
    std::uint64_t out_bytes = 0;
    std::uint64_t out_elem = dt;  // the kernel's output element: fp16 where a cast follows
    if (h.coalesced) {
      out = h.flat = buffer("allgather.dequantized", BufferRole::kScratch, kNoUnit, total * dt);
      h.flat_stream = current_;
      out_bytes = total * dt;
      alloc(out, current_, Purpose::kFetchWait);
    } else if (half_cast()) {
      // From 0.19.6 (PR 8215): dequantize(..., dtype=param.dtype) writes the kernel's fp16
      // output, then casts it to the parameter's dtype; the fp16 tensor is dropped at the
      // reassignment (PP:727-730, 896-901 at 0.19.8).
      const std::uint64_t numel = md_.params[h.params[0]].numel;
      out = buffer("dequantize.fp16", BufferRole::kScratch, kNoUnit, numel * 2);
      out_bytes = numel * 2;
      out_elem = 2;
      alloc(out, current_, Purpose::kFetchWait);
    } else {
      const int p = h.params[0];
      const UnitId saved = unit_;
      unit_ = p;
      alloc(ps_[p].full, current_, Purpose::kFetchWait);
      unit_ = saved;
      out = ps_[p].full;
      out_bytes = md_.params[p].numel * dt;
    }
    const UnitId saved = unit_;
    unit_ = h.params[0];
    push(OpKind::kDequantize, current_, Purpose::kParamFetch,
         {{h.qbuf, AccessMode::kRead, 0, std::min(total, out_bytes / out_elem)},
          {h.sbuf, AccessMode::kRead, 0, out_.buffers[h.sbuf].bytes},
          {out, AccessMode::kWrite, 0, out_bytes}})
        .mem_bytes = static_cast<double>(total + out_bytes);
    if (!h.coalesced && half_cast()) {
      const int p = h.params[0];
      const std::uint64_t numel = md_.params[p].numel;
      alloc(ps_[p].full, current_, Purpose::kFetchWait);
      push(OpKind::kCopy, current_, Purpose::kParamFetch,
           {{out, AccessMode::kRead, 0, numel * 2},
            {ps_[p].full, AccessMode::kWrite, 0, numel * dt}})
          .mem_bytes = static_cast<double>(numel * 2 + numel * dt);
      free(out, current_, Purpose::kFetchWait);
    }
    unit_ = saved;
  }
  if (h.coalesced) {
    const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
    for (std::size_t i = 0; i < h.params.size(); ++i) {
      const int p = h.params[i];
      const UnitId saved = unit_;
      unit_ = p;
      alloc(ps_[p].full, current_, Purpose::kFetchWait);
      Op& cat = push(OpKind::kCopy, current_, Purpose::kParamFetch);
      const std::uint64_t numel = md_.params[p].numel;
      // One slice per rank that holds some of p (PP:688-694), each at p's offset in that rank's
      // partition: one strided read for the ranks whose chunk is whole, one plain read for a
      // last, shorter one (the rest of the world holds padding).
      const std::uint64_t chunk = h.chunk[i];
      const std::uint64_t whole =
          chunk == 0
              ? 0
              : std::min<std::uint64_t>(numel / chunk, static_cast<std::uint64_t>(h.group_size));
      const std::uint64_t stride = h.per_rank_elems * dt;
      if (whole > 1 && whole <= std::numeric_limits<std::uint16_t>::max() &&
          stride <= std::numeric_limits<std::uint32_t>::max()) {
        Access a{h.flat, AccessMode::kRead, h.offsets[i] * dt, chunk * dt};
        a.count = static_cast<std::uint16_t>(whole);
        a.stride = static_cast<std::uint32_t>(stride);
        out_.accesses.push_back(a);
      } else {  // one slice, or beyond what Access's count and stride hold: slice by slice
        for (std::uint64_t r = 0; r < whole; ++r) {
          out_.accesses.push_back(
              {h.flat, AccessMode::kRead, r * stride + h.offsets[i] * dt, chunk * dt});
        }
      }
      if (whole < static_cast<std::uint64_t>(h.group_size) && whole * chunk < numel) {
        out_.accesses.push_back({h.flat, AccessMode::kRead,
                                 (whole * h.per_rank_elems + h.offsets[i]) * dt,
                                 (numel - whole * chunk) * dt});
      }
      out_.accesses.push_back({ps_[p].full, AccessMode::kWrite, 0, numel * dt});
      cat.access_count = static_cast<std::uint32_t>(out_.accesses.size() - cat.access_begin);
      cat.mem_bytes = 2.0 * static_cast<double>(numel * dt);
      unit_ = saved;
    }
  }
  for (int p : h.params) ps_[p].status = Status::kAvailable;
  h.complete = true;
}

// COORD:487-517, lru_cache'd on (module, step_id) for the coordinator's lifetime.
std::set<int> RankBuilder::params_to_release(int module, int step_id) {
  const auto key = std::make_pair(module, step_id);
  if (auto it = release_cache_.find(key); it != release_cache_.end()) return it->second;
  std::set<int> out;
  const std::vector<int>& own_params = md_.hooked(module);
  for (const int own : own_params) {
    if (!md_.params[own].persist) out.insert(own);  // COORD:491-493
  }
  for (const int own : own_params) {
    if (auto it = most_recent_.find(own); it != most_recent_.end() && it->second > step_id) {
      out.erase(own);
    }
  }
  // The scan iterates each later module with recurse=z3_leaf_module(the module released)
  // (COORD:555 at v0.18.2): releasing a leaf, every later module's whole subtree counts;
  // releasing any other, only a later module's own parameters (none for a leaf block).
  const bool recurse = md_.modules[static_cast<std::size_t>(module)].z3_leaf;
  std::int64_t traversed = 0;
  for (std::size_t i = static_cast<std::size_t>(step_id); i < submodule_order_.size(); ++i) {
    const std::int64_t distance = sc_.zero.stage3_max_reuse_distance;
    if (traversed >= distance) break;
    const int later = submodule_order_[i];
    for (const int p : recurse ? md_.below[static_cast<std::size_t>(later)]
                               : md_.modules[static_cast<std::size_t>(later)].params) {
      out.erase(p);
      // Saturating at the distance: a distance near 2^63 overflowed the sum.
      traversed += std::min(static_cast<std::int64_t>(md_.params[p].numel), distance - traversed);
    }
  }
  release_cache_.emplace(key, out);
  return out;
}

// COORD:395-404 and __release_param (COORD:477-484).
void RankBuilder::release_sub_module(int module) {
  const std::vector<int>& own = md_.hooked(module);
  if (own.empty()) return;
  const std::set<int> rel = trace_ == Trace::kComplete ? params_to_release(module, step_id_)
                                                       : std::set<int>(own.begin(), own.end());
  for (const int p : own) {
    ps_[p].active.erase(module);
    if (rel.count(p)) {
      release_param_as(p, module_label_[module]);
    }
  }
}

// release_backward_leftovers (COORD:554-566 at 0.19.8, PR 8148 in v0.19.3), from the stage-3
// optimizer's backward_epilogue (S3:3068), after the engine's allreduce_gradients: the modules
// whose post-backward hook never ran, last recorded first, each parameter but a persistent one
// released as that hook would have.
void RankBuilder::release_backward_leftovers() {
  purpose_ = Purpose::kParamRelease;
  while (!active_backward_.empty()) {
    const int m = active_backward_.back();
    active_backward_.pop_back();
    for (const int p : md_.hooked(m)) {
      ps_[p].active.erase(m);
      if (md_.params[p].persist) continue;
      release_param_as(p, module_label_[m]);
    }
  }
}

// release_param with its ops labelled `label` (the module whose hook releases it, or none).
void RankBuilder::release_param_as(int p, LabelId label) {
  const LabelId saved = label_;
  label_ = label;
  release_param(p);
  label_ = saved;
}

void RankBuilder::release_param(int p) {
  if (ps_[p].status == Status::kAvailable && ps_[p].active.empty()) {
    partition(p);
    n_available_ -= static_cast<std::int64_t>(md_.params[p].numel);
  }
}

// COORD:195-240: the first forward+backward records the trace; reset_step completes it.
void RankBuilder::reset_step() {
  const Purpose p = purpose_;
  // assert_ints_same_as_other_ranks: up to v0.17.5 one broadcast of the list (int64s) from
  // the compute stream (utils.py get_lst_from_rank0); from v0.17.6 (PR 7525) first the length's
  // broadcast and `.item()`, then the list's broadcast and `.item()` of each element (one host
  // sync on a GPU after `.cpu()`; none for an empty list). The recorder logs a broadcast as an
  // all-reduce of the same bytes, as the builder does at init.
  auto assert_ints = [&](std::size_t n) {
    if (v_.length_broadcast_in_trace_check) {
      world_round_trip("rank0_len", 8, true, p);
      world_round_trip("rank0_list", 8 * n, n > 0, p);
    } else {
      const EventId done = collective(OpKind::kAllReduce, world_group_, 8 * n, {});
      wait(current_, done, p);
    }
  };
  if (trace_ != Trace::kComplete) {
    // COORD:210-229 (v0.13.4), 235-254 (v0.17.6): the module order is checked; a recorded
    // trace is completed (its parameter ids and step ids checked too), an invalid one starts
    // recording.
    assert_ints(submodule_order_.size());
    if (trace_ == Trace::kRecord) {
      param_order_.clear();
      for (std::size_t i = 0; i < submodule_order_.size(); ++i) {
        // record_parameters: iter_params(m, recurse=z3_leaf_module(m)) sorted by ds_id
        // (COORD:218 at v0.18.2).
        for (const int q : md_.hooked(submodule_order_[i])) {
          param_order_.push_back({q, static_cast<int>(i)});
        }
      }
      assert_ints(param_order_.size());
      assert_ints(param_order_.size());
      trace_ = Trace::kComplete;
    } else {
      trace_ = Trace::kRecord;
    }
  }
  queue_.assign(param_order_.begin(), param_order_.end());
  most_recent_.clear();
  step_id_ = 0;
  // 0.16.0-0.16.7 keep the count across resets (PR 6726); release_and_reset_all zeroes it.
  if (!v_.available_kept_across_reset) n_available_ = 0;
}

// The gradient hook (S3:1213-1245): S_rs waits for the compute stream, the gradient is copied
// into the bucket on S_rs; a full bucket is reduced first.
void RankBuilder::grad_ready(int p) {
  const Phase saved = phase_;
  phase_ = Phase::kGradReduce;
  purpose_ = Purpose::kGradReduce;
  const std::uint64_t numel = md_.params[p].numel;
  // reduce_independent_p_g_buckets_and_remove_grads (S3:1213-1228), reduce_bucket_size in
  // elements (zero.reduce_bucket_size).
  const auto bucket = static_cast<std::uint64_t>(sc_.zero.reduce_bucket_size);
  if (ipg_elems_ + numel > bucket && ipg_elems_ > 0) reduce_ipg();
  // __add_grad_to_ipg_bucket waits on the default stream (S3:1363 at v0.18.7), from v0.18.8 on
  // the current one, the stream the gradient hook runs on (PR 7897): the compute stream,
  // S_step where run.step_stream = "side" (with torch 2.10 or later, the stream the forward
  // ran on: issue 7898).
  wait_stream(srs_, v_.reduce_waits_current_stream ? current_ : s0_, Purpose::kGradReduce);
  // __add_grad_to_ipg_bucket (S3:1230-1245): a gradient that fits is moved into the flat
  // bucket; one that does not (a vocabulary-sized embedding above reduce_bucket_size) stays
  // where it is and is reduced from there, alone.
  // v0.10.0-v0.10.3 compare with `<` (S3:1088 at v0.10.0).
  if (v_.bucket_strict_bound ? ipg_elems_ + numel < bucket : ipg_elems_ + numel <= bucket) {
    push(OpKind::kCopy, srs_, Purpose::kGradReduce,
         {{ps_[p].grad, AccessMode::kRead, 0, numel * dt_},
          {ipg_buffer_, AccessMode::kWrite, ipg_elems_ * dt_, numel * dt_}})
        .mem_bytes = 2.0 * static_cast<double>(numel * dt_);
    ipg_grad_[p] = {ipg_buffer_, AccessMode::kRead, ipg_elems_ * dt_, numel * dt_};
  } else {
    ipg_grad_[p] = {ps_[p].grad, AccessMode::kRead, 0, numel * dt_};
  }
  ipg_params_.push_back(p);
  ipg_elems_ += numel;
  phase_ = saved;
}

// __reduce_and_partition_ipg_grads (S3:1249-1300): throttle, then on S_rs one reduce-scatter of
// the bucket over the cloned world group, waited for at once, and an event for the throttle.
void RankBuilder::reduce_ipg() {
  if (ipg_params_.empty()) return;
  const Phase saved = phase_;
  phase_ = Phase::kGradReduce;
  purpose_ = Purpose::kGradReduce;
  if (param_reduce_events_.size() > 2) {
    push(OpKind::kHostEventSync, kHostStream, Purpose::kHostThrottle).event =
        param_reduce_events_.front();
    param_reduce_events_.pop_front();
  }
  const StreamId saved_stream = current_;
  current_ = srs_;
  if (sc_.zero.zero_quantized_gradients && sc_.cluster.nodes > 1) {
    reduce_quantized();
  } else {
    std::uint64_t bytes = 0;
    for (const int p : ipg_params_) bytes += md_.params[p].numel * dt_;
    // __avg_scatter_grads hands the bucket's gradients as a list to reduce_scatter_coalesced
    // (S3:1330-1343; coalesced_collectives.py 84-150 at v0.13.4), which pads each tensor to
    // ceil(numel / world) elements a rank, a primary shard's size: this rank's output is the
    // sum of those.
    std::uint64_t shard = 0;
    for (const int p : ipg_params_) shard += layouts_[p].shard_numel() * dt_;
    std::vector<Access> acc;
    bool in_bucket = true;
    for (const int p : ipg_params_) in_bucket = in_bucket && ipg_grad_[p].buffer == ipg_buffer_;
    if (in_bucket) {  // consecutive in the flat buffer, from the first one's offset
      acc.push_back(
          {ipg_buffer_, AccessMode::kRead, ipg_grad_.at(ipg_params_.front()).offset, bytes});
    } else {
      for (const int p : ipg_params_) acc.push_back(ipg_grad_[p]);
    }
    acc.push_back({grad_shard_, AccessMode::kWrite, 0, shard});
    const EventId done = collective(OpKind::kReduceScatter, reduce_group(), shard, std::move(acc));
    wait(srs_, done, Purpose::kGradReduce);
  }
  param_reduce_events_.push_back(record(srs_, Purpose::kGradReduce));
  current_ = saved_stream;
  ipg_params_.clear();
  ipg_grad_.clear();
  if (!v_.bucket_count_never_reset) ipg_elems_ = 0;
  phase_ = saved;
}

// qgZ: __avg_scatter_grads (S3:1327-1341) hands the bucket's gradients, by ds_id, to
// all_to_all_quant_reduce (runtime/comm/coalesced_collectives.py:30-76 at v0.13.4), on S_rs. A
// 1-D gradient, or one whose numel is not a multiple of 2 x world, goes through
// reduce_scatter_coalesced([g]) with no group: the world group (44-52). Every other one is
// quantized to int4 (swizzle_quant), all-to-all'd with its scales in the node, dequantized,
// reduced and requantized (quantized_reduction), all-to-all'd with its scales across nodes, and
// dequantized and averaged over the nodes (53-74). Every collective is blocking (the current
// stream waits for it). Sizes are the CUDA bindings' (csrc/quantization/pt_binding.cpp:179-250):
// int4 packs two values a byte, one fp32 scale a group (symmetric), `max(rows, cols, world)`
// groups in the node and that over the GPUs of a node across nodes.
void RankBuilder::reduce_quantized() {
  std::vector<int> params = ipg_params_;
  std::sort(params.begin(), params.end());
  const std::uint64_t local = static_cast<std::uint64_t>(sc_.cluster.gpus_per_node);
  const std::uint64_t dt = static_cast<std::uint64_t>(dt_);
  for (int p : params) {
    const DsParam& dp = md_.params[p];
    const Access grad = ipg_grad_.at(p);
    const std::uint64_t shard = layouts_[p].shard_numel() * dt;
    const Access out{grad_shard_, AccessMode::kWrite, 0, shard};
    const bool divides = dp.numel % (2 * static_cast<std::uint64_t>(world_)) == 0;
    if (dp.rows != 0 && !divides && v_.qgz_no_fallback) {
      // Before 0.13.2 such a gradient goes to the all-to-all too, which cannot split it
      // (coalesced_collectives.py:41-46 at v0.13.1; PR 5056).
      throw ReleaseRefusal(
          sc_.path, "zero.deepspeed_version",
          fmt::format("DeepSpeed {} raises at qgZ's all-to-all of the gradient of {} ({} "
                      "elements, not a multiple of 2 x world = {}: PR 5056 falls back to "
                      "reduce_scatter from 0.13.2); allowed: 0.13.2 or later, another world, or "
                      "zero_quantized_gradients off",
                      v_.name, dp.name, dp.numel, 2 * world_));
    }
    if (dp.rows == 0 || !divides) {
      // reduce_scatter_coalesced (84-150): the (padded) flat tensor divided, then one
      // reduce-scatter whose output is this rank's chunk.
      push(OpKind::kKernel, srs_, Purpose::kGradReduce, {grad}).mem_bytes =
          2.0 * static_cast<double>(dp.numel * dt);
      const EventId done = collective(OpKind::kReduceScatter, world_group_, shard, {grad, out});
      wait(srs_, done, Purpose::kGradReduce);
      continue;
    }
    const std::uint64_t cols = dp.numel / dp.rows;
    const std::uint64_t intra_groups =
        std::max({dp.rows, cols, static_cast<std::uint64_t>(world_)});
    const std::uint64_t inter_groups = intra_groups / local;
    const std::uint64_t q1 = dp.numel / 2, s1 = intra_groups * 4;
    const std::uint64_t q2 = q1 / local, s2 = inter_groups * 4;
    const BufferId qa = buffer("qgz.q", BufferRole::kScratch, kNoUnit, q1 + s1);
    const BufferId qb = buffer("qgz.q_recv", BufferRole::kScratch, kNoUnit, q1 + s1);
    const BufferId qc = buffer("qgz.q2", BufferRole::kScratch, kNoUnit, q2 + s2);
    const BufferId qd = buffer("qgz.q2_recv", BufferRole::kScratch, kNoUnit, q2 + s2);
    for (BufferId b : {qa, qb}) alloc(b, srs_, Purpose::kGradReduce);
    push(OpKind::kQuantize, srs_, Purpose::kGradReduce,
         {grad, {qa, AccessMode::kWrite, 0, q1 + s1}})
        .mem_bytes = static_cast<double>(dp.numel * dt + q1 + s1);
    auto all_to_all = [&](GroupId g, BufferId from, BufferId to, std::uint64_t at,
                          std::uint64_t bytes) {
      const EventId done =
          collective(OpKind::kAllToAll, g, bytes,
                     {{from, AccessMode::kRead, at, bytes}, {to, AccessMode::kWrite, at, bytes}});
      wait(srs_, done, Purpose::kGradReduce);
    };
    all_to_all(intra_group_, qa, qb, 0, q1);
    all_to_all(intra_group_, qa, qb, q1, s1);
    for (BufferId b : {qc, qd}) alloc(b, srs_, Purpose::kGradReduce);
    push(OpKind::kDequantize, srs_, Purpose::kGradReduce,
         {{qb, AccessMode::kRead, 0, q1 + s1}, {qc, AccessMode::kWrite, 0, q2 + s2}})
        .mem_bytes = static_cast<double>(q1 + s1 + q2 + s2);
    all_to_all(inter_group_, qc, qd, 0, q2);
    all_to_all(inter_group_, qc, qd, q2, s2);
    push(OpKind::kDequantize, srs_, Purpose::kGradReduce,
         {{qd, AccessMode::kRead, 0, q2 + s2}, out})
        .mem_bytes = static_cast<double>(q2 + s2 + shard);
  }
}

// DeepSpeedZeroOptimizer_Stage3.step (S3:2016-2060): release everything still gathered
// (release_and_reset_all, PO:162), the global gradient norm, Adam on the primary shards,
// invalidate the secondaries (_post_step, S3:1991). The script's loss.item() follows in build().
void RankBuilder::optimizer_step() {
  phase_ = Phase::kOptimizer;
  purpose_ = Purpose::kParamRelease;
  for (const int p : optimized_) {
    ps_[p].active.clear();
    release_param_as(p, kNoLabel);
  }
  // release_and_reset_all's own reset, 0.16.0-0.16.7 only (COORD:432 at v0.16.0; PR 7258 moved
  // it back into reset_step). Elsewhere the count runs on, below zero after a reset, as
  // DeepSpeed's does.
  if (v_.available_kept_across_reset) n_available_ = 0;
  const bool overflow_checked = checks_overflow(sc_, v_);
  if (overflow_checked) overflow_check();
  // run.skipped_steps: a step whose gradients overflowed returns right after the check
  // (_overflow_check_and_loss_scale_update, then `return`: S3:2023-2027 at v0.13.4, S3:2880-2894
  // at 0.19.8): no norm, no update, no persistent gather, no invalidation. Held to
  // tiny-0.19.8-torch2.10-fp16-overflow.
  const bool skipped =
      std::binary_search(sc_.run.skipped_steps.begin(), sc_.run.skipped_steps.end(), step_);
  if (skipped && overflow_checked) return;
  purpose_ = Purpose::kGradNorm;
  // _get_norm_groups: get_grad_norm_direct per sub-group, each its own all-reduce of the summed
  // squares (S3:1702-1740 at v0.13.4); up to 0.12.6 each followed by its `.item()`.
  const std::vector<std::vector<int>>& groups = sub_groups_;
  const bool sync_each = v_.grad_norm_sync == NormSync::kAfterNorm && v_.norm_sync_per_sub_group;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const EventId norm = collective(OpKind::kAllReduce, reduce_group(), 8, {});
    wait(current_, norm, Purpose::kGradNorm);
    if (sync_each) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
  }
  switch (v_.grad_norm_sync) {
    case NormSync::kAfterNorm:  // math.sqrt of the norm tensor (get_global_norm)
      if (!sync_each) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
      break;
    case NormSync::kWhenClipping:  // per sub-group, with its update (below)
      break;
    case NormSync::kNone:
      break;
  }
  // 0.19.8: is_invalid_grad_norm's bool() of the combined norm (S3:2878-2893).
  if (v_.norm_validity_sync) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
  // 0.19.8's invalid norm (bf16, fp32): overflow set, then the same cleanup and `return`
  // (S3:2888-2894).
  if (skipped) return;
  // Each sub-group in turn (S3:2111-2126 at v0.16.4): unscale_and_clip_grads, whose
  // `if clip > 1` on a device tensor waits for it in 0.14.1-0.14.2 (S3:2109-2118 at v0.14.2);
  // _optimizer_step, Adam over the sub-group's fp32 partition; then its primaries written back
  // (_reassign_or_swap_out_partitioned_parameters). The recorder runs torch's AdamW in place of
  // FusedAdam (a CUDA kernel that reads nothing back); each of its steps logs one more host sync
  // of S0 (docs/record.md: every .item() is logged as a sync on the CPU), issued only to compare
  // with a recording (RunConfig::as_recorded): a GPU run has no such sync, and it would order
  // what the optimizer's step leaves unordered.
  const bool clip_sync =
      v_.grad_norm_sync == NormSync::kWhenClipping && sc_.training.gradient_clipping > 0;
  for (const std::vector<int>& group : groups) {
    if (clip_sync) push(OpKind::kHostStreamSync, s0_, Purpose::kGradNorm);
    push(OpKind::kKernel, s0_, Purpose::kOptimizerStep, {{grad_shard_, AccessMode::kRead, 0, 0}});
    if (sc_.run.as_recorded) push(OpKind::kHostStreamSync, s0_, Purpose::kOptimizerStep);
    if (offload_.enabled) {
      offload_write_back(group);
      continue;
    }
    for (const int p : group) {
      unit_ = static_cast<UnitId>(p);
      const ElemRange pri = layouts_[p].primary_slice(rank_);
      push(OpKind::kKernel, s0_, Purpose::kOptimizerStep,
           {{grad_shard_, AccessMode::kRead, 0, 0},
            part(p, ps_[p].primary, pri, AccessMode::kRead, false),
            part(p, ps_[p].primary, pri, AccessMode::kWrite, false)})
          .mem_bytes = 16.0 * static_cast<double>(layouts_[p].shard_numel());
    }
    unit_ = kNoUnit;  // the next sub-group's step names no parameter
  }
  gather_persistent();
  if (v_.invalidate_after_step) invalidate_secondaries();
}

// offload_param: _reassign_or_swap_out_partitioned_parameters (S3:1999-2004 at v0.13.4,
// S3:2760-2766 at v0.19.8) copies the sub-group's updated fp32 partition, on the device without
// offload_optimizer (S3:225), into its fp16 flat buffer, which is pinned host memory
// (S3:652-655): one device-to-host copy_ without non_blocking, which the host waits for
// (deepspeed_offload.hpp); the primaries are views of that buffer (S3:1945-1950).
void RankBuilder::offload_write_back(const std::vector<int>& group) {
  std::vector<Access> written;
  double bytes = 0;
  for (const int p : group) {
    const ElemRange pri = layouts_[p].primary_slice(rank_);
    written.push_back(part(p, ps_[p].primary, pri, AccessMode::kWrite, false));
    bytes += static_cast<double>(layouts_[p].shard_numel() * (4 + dt_));
  }
  unit_ = group.empty() ? kNoUnit : static_cast<UnitId>(group.front());
  push(OpKind::kCopy, s0_, Purpose::kOptimizerStep, std::span<const Access>(written)).mem_bytes =
      bytes;
  push(OpKind::kHostStreamSync, s0_, Purpose::kOffloadCopy);
  unit_ = kNoUnit;
}

// invalidate_secondary_tensor (S3:568-572 at v0.18.2): every optimized parameter's secondary,
// in fp16_groups order (S3:465-468 at v0.13.4), dropped, freed on the compute stream.
void RankBuilder::invalidate_secondaries() {
  for (const int p : fp16_order_) {
    if (!ps_[p].has_secondary) continue;
    unit_ = static_cast<UnitId>(p);
    free(ps_[p].secondary, s0_, Purpose::kSecondaryInvalidate);
    ps_[p].has_secondary = false;
    ps_[p].secondary_ready = kNoEvent;
  }
  unit_ = kNoUnit;
}

// _overflow_check_and_loss_scale_update -> has_overflow (S3:2696-2730 at v0.19.5, S3:2016-2049
// at v0.11.1): the inf/nan tracker and its uint8 clone on S_rs, read from the gradient
// partitions; the default stream waits for S_rs; a 1-byte MAX all-reduce over the gradients'
// group from the current stream, waited for there; `overflow_gpu[0].item()`. A step without an
// overflow goes on (the skipped step is data-dependent and not modelled).
void RankBuilder::overflow_check() {
  purpose_ = Purpose::kGradNorm;
  push(OpKind::kKernel, srs_, Purpose::kGradNorm, {{grad_shard_, AccessMode::kRead, 0, 0}});
  wait_stream(s0_, srs_, Purpose::kGradNorm);
  const EventId done = collective(OpKind::kAllReduce, grad_group_, 1, {});
  wait(current_, done, Purpose::kGradNorm);
  push(OpKind::kHostStreamSync, current_, Purpose::kGradNorm);
}

// The optimizer's param groups. "model": one, model.parameters() (the recorder's AdamW, and
// DeepSpeed's own optimizer). "hf-trainer": Trainer.create_optimizer's two, the parameters
// get_decay_parameter_names names first, then the others, each in named_parameters order
// (transformers 4.51.3 trainer.py:1200-1224). get_decay_parameter_names leaves out every
// parameter inside a module of a class in ALL_LAYERNORM_LAYERS: nn.LayerNorm (GPT-2's,
// GPT-NeoX's and Falcon's norms) and, up to 4.51.3, LlamaRMSNorm, which modeling_llama.py
// appends to that list when it is imported (line 110 at 4.35.2; Mistral's, Qwen's and Gemma's
// norms are classes of their own); 4.57.1 and 5.24.0 append nothing. And, by its name in lower
// case:
// 4.35.2 one containing "bias" (trainer.py:935-944); 4.51.3 also "layernorm" or "rmsnorm"
// (trainer.py:1189-1198, trainer_pt_utils.py:1122-1141); 4.57.1 and 5.24.0 also "norm" as a
// whole component of the name or a component ending in "_norm" (trainer.py:1408-1418 at 5.24.0,
// 1274 at 4.57.1).
std::vector<std::vector<int>> RankBuilder::make_param_groups() const {
  if (sc_.training.param_groups != "hf-trainer") return {optimized_};
  const std::string tf = transformers_version_of(sc_.model, sc_.run.torch_version);
  const std::string& f = sc_.model.family;
  const bool layer_norm_class = f == "gpt2" || f == "gpt_neox" || f == "falcon" ||
                                (f == "llama" && (tf == "4.35.2" || tf == "4.51.3"));
  const auto decays = [&](int p) {
    const DsParam& param = md_.params[p];
    if (layer_norm_class && param.module >= 0 && md_.modules[param.module].kind == ModKind::kNorm) {
      return false;
    }
    std::string name = param.name;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name.find("bias") != std::string::npos) return false;
    if (tf == "4.35.2") return true;
    if (name.find("layernorm") != std::string::npos || name.find("rmsnorm") != std::string::npos) {
      return false;
    }
    if (tf == "4.51.3") return true;
    // (?:^|\.)norm(?:$|\.) and _norm(?:$|\.): a component "norm" or ending in "_norm".
    std::size_t from = 0;
    while (from <= name.size()) {
      const std::size_t dot = std::min(name.find('.', from), name.size());
      const std::string part = name.substr(from, dot - from);
      if (part == "norm" || part.ends_with("_norm")) return false;
      from = dot + 1;
    }
    return true;
  };
  std::vector<std::vector<int>> groups(2);
  for (const int p : optimized_) groups[decays(p) ? 0 : 1].push_back(p);
  return groups;
}

// _create_fp16_sub_groups (S3:903-925 at v0.13.4), per param group
// (_create_fp16_partitions_with_defragmentation, S3:661-673): a group whole if its partitions'
// elements do not pass zero.sub_group_size; else cut after each parameter that brings the
// running count to sub_group_size or more, and after the last. An empty group (a model with
// nothing the Trainer exempts from weight decay) is one empty sub-group, as DeepSpeed's.
std::vector<std::vector<int>> RankBuilder::make_sub_groups(
    const std::vector<std::vector<int>>& param_groups) const {
  const auto size = static_cast<std::uint64_t>(sc_.zero.sub_group_size);
  std::vector<std::vector<int>> out;
  for (const std::vector<int>& group : param_groups) {
    std::uint64_t total = 0;
    for (const int p : group) total += layouts_[p].shard_numel();
    if (size >= total) {
      out.push_back(group);
      continue;
    }
    out.emplace_back();
    std::uint64_t running = 0;
    for (const int p : group) {
      out.back().push_back(p);
      running += layouts_[p].shard_numel();
      if (running >= size && p != group.back()) {
        out.emplace_back();
        running = 0;
      }
    }
  }
  return out;
}

// The parameters from `first` that zero.Init converts, and from_pretrained loads, together:
// those of one module, consecutive in named_parameters order.
int RankBuilder::module_group_end(int first) const {
  const int n = static_cast<int>(md_.params.size());
  int end = first + 1;
  while (end < n && md_.params[end].module >= 0 &&
         md_.params[end].module == md_.params[first].module) {
    ++end;
  }
  return end;
}

// _post_step (S3:1984-1986): persistent_parameters[0].all_gather(persistent_parameters), a
// blocking gather of every persistent parameter (all released by release_and_reset_all). One
// parameter goes through _allgather_params (PP:1822) as at init; several through
// _allgather_params_coalesced (PP:1718-1820): a full-size buffer each, one async
// all_gather_into_tensor each from the primary on ds_process_group (the world), a wait on the
// last handle only, the buffers become the parameters' data, and a device synchronize.
void RankBuilder::gather_persistent() {
  std::vector<int> list;
  for (int p = 0; p < static_cast<int>(md_.params.size()); ++p) {
    const DsParam& dp = md_.params[p];
    if (dp.persist && !dp.orphan && ps_[p].status == Status::kNotAvailable) list.push_back(p);
  }
  if (list.empty()) return;
  const Purpose saved_purpose = purpose_;
  purpose_ = Purpose::kOptimizerStep;
  gather_blocking_list(list);
  purpose_ = saved_purpose;
}

// params[0].all_gather(param_list=params) with async_op false (_all_gather, PP:1593-1629 at
// v0.18.2): one parameter through _allgather_params (gather_blocking), several through
// _allgather_params_coalesced.
void RankBuilder::gather_blocking_list(const std::vector<int>& list) {
  if (list.empty()) return;
  if (list.size() == 1) {
    gather_blocking(list.front());
    return;
  }
  for (int p : list) {
    ps_[p].full = buffer(md_.params[p].name + ".full", BufferRole::kFull, static_cast<UnitId>(p),
                         layouts_[p].padded_numel() * dt_);
    unit_ = static_cast<UnitId>(p);
    alloc(ps_[p].full, current_, purpose_);
  }
  unit_ = kNoUnit;
  std::vector<EventId> launched;
  // offload_param: `local_tensors.append(param.ds_tensor.to(device))` for every parameter
  // first (PP:1738 at v0.13.4), each staged on the current stream; dropped on return.
  std::vector<Access> sent;
  std::vector<BufferId> staged;
  for (int p : list) {
    sent.push_back(shard_read(p, false, rank_));
    unit_ = static_cast<UnitId>(p);
    staged.push_back(stage_to_device(*this, current_, purpose_, sent.back(),
                                     md_.params[p].name + ".to_device", p));
  }
  unit_ = kNoUnit;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const int p = list[i];
    const std::uint64_t shard = layouts_[p].shard_numel() * dt_;
    // The shard's own elements only, as every gather reads it (shard_read).
    launched.push_back(collective(
        OpKind::kAllGather, world_group_, shard,
        {sent[i], {ps_[p].full, AccessMode::kWrite, 0, layouts_[p].padded_numel() * dt_}}));
  }
  if (v_.wait_every_blocking_handle) {
    for (const EventId e : launched) wait(current_, e, purpose_);  // PP:2111-2112 at 0.19.8
  } else {
    wait(current_, launched.back(), purpose_);  // launch_handles[-1].wait()
  }
  push(OpKind::kHostDeviceSync, kHostStream, purpose_);
  for (const BufferId b : staged) {
    if (b != kNoBuffer) free(b, current_, Purpose::kOffloadCopy);
  }
  for (int p : list) ps_[p].status = Status::kAvailable;
}

// run.load = "pretrained": transformers' from_pretrained under zero.Init loads the checkpoint
// module by module, before deepspeed.initialize (_load_state_dict_into_zero3_model,
// modeling_utils.py at 4.51.3): a module's own parameters in one GatheredParameters(params,
// modifier_rank=0) (PP:2333-2348 at v0.18.2): gathered whole, written by rank 0's
// _load_from_state_dict (a copy from the host), broadcast from rank 0 on the parameter's group
// (the world, async, each handle waited), then partition(has_been_updated=True). Whether that
// partition re-copies an existing secondary is issue 7606 (VersionRules::secondary_sees_update).
void RankBuilder::load_pretrained() {
  phase_ = Phase::kCheckpointLoad;
  purpose_ = Purpose::kCheckpointLoad;
  const int n = static_cast<int>(md_.params.size());
  for (int first = 0; first < n;) {
    const int end = module_group_end(first);
    std::vector<int> list;
    for (int p = first; p < end; ++p) {
      if (!md_.params[p].orphan) list.push_back(p);  // tied away: not in the state dict's keys
    }
    first = end;
    if (list.empty()) continue;
    gather_blocking_list(list);
    if (rank_ == 0) {
      for (const int p : list) {
        unit_ = static_cast<UnitId>(p);
        const std::uint64_t numel = md_.params[p].numel;
        push(OpKind::kCopy, current_, Purpose::kCheckpointLoad,
             {part(p, ps_[p].full, {0, numel}, AccessMode::kWrite, true)})
            .mem_bytes = static_cast<double>(numel * dt_);
        // A copy from pageable host memory waits for its stream (memcpy_and_sync, PyTorch's
        // aten/src/ATen/native/cuda/Copy.cu), as the recorder logs it.
        push(OpKind::kHostStreamSync, current_, Purpose::kCheckpointLoad);
      }
    }
    std::vector<EventId> sent;
    for (const int p : list) {
      unit_ = static_cast<UnitId>(p);
      const std::uint64_t numel = md_.params[p].numel;
      // A broadcast (logged as an all-reduce, as the recorder logs it): rank 0 sends its
      // tensor, every other rank's is overwritten unread.
      std::vector<Access> acc;
      if (rank_ == 0) acc.push_back(part(p, ps_[p].full, {0, numel}, AccessMode::kRead, true));
      acc.push_back(part(p, ps_[p].full, {0, numel}, AccessMode::kWrite, true));
      sent.push_back(collective(OpKind::kAllReduce, world_group_, numel * dt_, std::move(acc)));
    }
    for (const EventId e : sent) wait(current_, e, Purpose::kCheckpointLoad);
    for (const int p : list) partition(p, true);
  }
  unit_ = kNoUnit;
  phase_ = Phase::kInit;
  purpose_ = Purpose::kParamInit;
}

// run.load = "checkpoint": engine.load_checkpoint of a ZeRO checkpoint after
// deepspeed.initialize (engine.py _load_checkpoint, S3:2791-2834, 2993-3000 at v0.18.2):
// checkpoint_event_prologue partitions every parameter; _rigid_load_state_dict copies the
// saved fp32 partitions in from the host and the fp16 flat buffers (the primary shards) from
// them; checkpoint_event_epilogue invalidates the secondaries from v0.18.3 (PR 7707) and
// gathers the persistent parameters. Nothing re-copies a secondary before it.
void RankBuilder::load_checkpoint() {
  phase_ = Phase::kCheckpointLoad;
  purpose_ = Purpose::kCheckpointLoad;
  for (int p = 0; p < static_cast<int>(md_.params.size()); ++p) {
    if (ps_[p].status == Status::kAvailable) partition(p);
  }
  for (const int p : optimized_) {
    unit_ = static_cast<UnitId>(p);
    const ElemRange pri = layouts_[p].primary_slice(rank_);
    // offload_param: the saved partition into a host shard is the host's own memcpy.
    push(OpKind::kCopy, out_.buffers[ps_[p].primary].on_host ? kHostStream : s0_,
         Purpose::kCheckpointLoad, {part(p, ps_[p].primary, pri, AccessMode::kWrite, false)})
        .mem_bytes = static_cast<double>(layouts_[p].shard_numel() * (4 + dt_));
  }
  unit_ = kNoUnit;
  // The saved partitions are host tensors (torch.load to the CPU): pageable copies that the
  // host waits for.
  push(OpKind::kHostStreamSync, s0_, Purpose::kCheckpointLoad);
  if (v_.invalidate_after_checkpoint_load) invalidate_secondaries();
  gather_persistent();
}

void RankBuilder::run_hook(const Hook& h) {
  const bool bwd_phase = phase_ == Phase::kBackward;
  switch (h.ev) {
    case Ev::kPreFwd:
      // fetch_sub_module(forward=True) (PO:452); v0.13.1 passes torch.is_grad_enabled().
      // v0.10.0-v0.10.1 pass forward=True (PO:494 at v0.10.0).
      fetch_sub_module(h.module, v_.secondary_only_backward && v_.forward_passes_grad_enabled
                                     ? h.grad_enabled
                                     : true);
      break;
    case Ev::kPostFwd:
      purpose_ = Purpose::kParamRelease;
      release_sub_module(h.module);
      break;
    case Ev::kPreBwd:
      // COORD:340-341 at 0.19.8: a backward fetch records the module, once, in
      // __active_backward_submodules (insertion order).
      if (std::find(active_backward_.begin(), active_backward_.end(), h.module) ==
          active_backward_.end()) {
        active_backward_.push_back(h.module);
      }
      fetch_sub_module(h.module, false);
      break;
    case Ev::kPostBwd:
      std::erase(active_backward_, h.module);  // COORD:524
      purpose_ = Purpose::kParamRelease;
      release_sub_module(h.module);
      break;
    case Ev::kFwdKernel: {
      const LabelId saved = label_;
      label_ = kNoLabel;
      const std::vector<int>& own = md_.modules[h.module].params;
      unit_ = own.empty() ? kNoUnit : own.front();
      kernel(h.module, false);
      if (bwd_phase) out_.ops.mut().back().purpose = Purpose::kRecomputeForward;
      unit_ = kNoUnit;
      label_ = saved;
      break;
    }
    case Ev::kBwdKernel: {
      const std::vector<int>& own = md_.modules[h.module].params;
      unit_ = own.empty() ? kNoUnit : own.front();
      kernel(h.module, true);
      unit_ = kNoUnit;
      // A tied weight's AccumulateGrad runs once, after its last use in the backward (the
      // embedding): autograd sums both gradients before it (torch/csrc/autograd/input_buffer).
      // Weight and bias in the order their AccumulateGrad nodes run (DsModule::bias_grad_first).
      // Below a z3 leaf no parameter has a gradient hook of its own (S3:1252-1255 at v0.18.2).
      if (!(md_.tied && h.module == md_.head) && !md_.modules[h.module].under_leaf) {
        if (md_.modules[h.module].bias_grad_first && own.size() == 2) {
          grad_ready(own[1]);
          grad_ready(own[0]);
        } else {
          for (const int p : own) grad_ready(p);
        }
      }
      break;
    }
    case Ev::kLeafGradHook:
      // reduce_leaf_module_grads (S3:1261-1274 at v0.18.2): every parameter below the leaf in
      // fp16_groups order; a parameter without a gradient would get zeros_like first, which
      // transformers 4.51.3's blocks never need (every expert runs).
      for (const int p : fp16_order_) {
        if (md_.params[p].leaf == h.module) grad_ready(p);
      }
      break;
    case Ev::kHostSync:
      push(OpKind::kHostStreamSync, current_,
           bwd_phase ? Purpose::kRecomputeForward : Purpose::kForwardCompute);
      break;
    case Ev::kLoss:
      push(OpKind::kKernel, current_, Purpose::kLossGradient).mem_bytes =
          static_cast<double>(sc_.training.micro_batch) * sc_.training.seq_len * sc_.model.vocab *
          4.0;
      phase_ = Phase::kBackward;
      // v0.10.0 logs it only off the accumulation boundary (ENG:1881-1884 at v0.10.0).
      if (v_.loss_item_in_backward &&
          !(v_.loss_item_off_boundary_only && micro_ == sc_.training.grad_accum - 1)) {
        push(OpKind::kHostStreamSync, current_, Purpose::kStepSync);
      }
      break;
  }
}

RankSchedule RankBuilder::build() {
  // Streams as DeepSpeed makes them: S_ag in DeepSpeedZeRoOffload (PO:138-139, the default
  // stream without overlap_comm), S_rs in the stage-3 optimizer (S3:227-228).
  sag_ = s0_;
  if (sc_.zero.overlap_comm) {
    out_.streams.push_back({"S_ag"});
    sag_ = static_cast<StreamId>(out_.streams.size() - 1);
  }
  init();
  srs_ = s0_;  // S3:227-228: the default stream without overlap_comm
  if (sc_.zero.overlap_comm) {
    out_.streams.push_back({"S_rs"});
    srs_ = static_cast<StreamId>(out_.streams.size() - 1);
  }
  if (sc_.run.step_stream == "side") {
    out_.streams.push_back({"S_step"});
    sstep_ = static_cast<StreamId>(out_.streams.size() - 1);
  }
  if (sc_.run.load == "checkpoint") load_checkpoint();
  std::uint64_t total = 0;
  for (const DsParam& p : md_.params) total += p.numel;
  std::uint64_t shards = 0;  // every gradient's padded chunk (reduce_ipg)
  for (const ShardLayout& l : layouts_) shards += l.shard_numel();
  // DeepSpeed's bucket holds reduce_bucket_size elements (S3:540); no more than the model's are
  // ever written, but where 0.17.2's count runs on from step to step (bucket_count_never_reset).
  const auto bucket = static_cast<std::uint64_t>(sc_.zero.reduce_bucket_size);
  ipg_buffer_ = buffer("ipg_bucket", BufferRole::kScratch, kNoUnit,
                       (v_.bucket_count_never_reset ? bucket : std::min(total, bucket)) * dt_);
  grad_shard_ = buffer("grad_partitions", BufferRole::kGradShard, kNoUnit, shards * dt_);
  const std::vector<Hook> hooks = micro_step_hooks(md_, walk_);
  for (step_ = 0; step_ < sc_.run.steps; ++step_) {
    // Every micro-batch: forward, backward (its gradients reduced into the partitions every
    // micro-step, engine.allreduce_gradients: "ZeRO stage >= 2 communicates during non gradient
    // accumulation boundaries as well"), engine.step(), which steps the optimizer only at the
    // accumulation boundary (engine.py is_gradient_accumulation_boundary).
    for (micro_ = 0; micro_ < sc_.training.grad_accum; ++micro_) {
      phase_ = Phase::kForward;
      // The training script's batch.to(device) before the forward: a pageable host-to-device
      // copy that synchronizes the current stream (the HF Trainer's and accelerate's default;
      // the recorder's --batch-copy blocking).
      push(OpKind::kHostStreamSync, s0_, Purpose::kForwardCompute);
      // run.step_stream = "side": `side.wait_stream(current_stream())`, then forward and
      // engine.backward under `torch.cuda.stream(side)`.
      if (sstep_ != s0_) wait_stream(sstep_, s0_, Purpose::kForwardCompute);
      current_ = sstep_;
      if (v_.reset_at_forward_start) {
        purpose_ = Purpose::kForwardCompute;
        reset_step();
      }
      for (const Hook& h : hooks) run_hook(h);
      // The optimizer's backward() ends with reset_step (S3:2215); then the engine's gradient
      // epilogue reduces the last bucket and drains S_rs (S3:1082-1088).
      current_ = sstep_;
      if (!v_.reset_at_forward_start) reset_step();
      reduce_ipg();
      phase_ = Phase::kBackward;
      push(OpKind::kHostStreamSync, srs_, Purpose::kBackwardCompute);
      if (v_.release_backward_leftovers) release_backward_leftovers();
      active_backward_.clear();
      // The script's `current_stream().wait_stream(side)` before engine.step(), on S0.
      if (sstep_ != s0_) wait_stream(s0_, sstep_, Purpose::kBackwardCompute);
      current_ = s0_;
      if (micro_ == sc_.training.grad_accum - 1) optimizer_step();
    }
    micro_ = 0;
    phase_ = Phase::kOptimizer;
    push(OpKind::kHostStreamSync, s0_, Purpose::kStepSync);  // the script's loss.item()
  }
  out_.accesses.shrink_to_fit();  // a large world keeps every rank's: no growth slack
  return std::move(out_);
}

}  // namespace

RunTraits run_traits(const Scenario& sc) {
  RunTraits t;
  t.torch = sc.run.torch_version;
  t.grad_accum = sc.training.grad_accum;
  t.family = sc.model.family;
  t.qwz_non_fp16 = sc.zero.zero_quantized_weights && sc.training.dtype != "fp16";
  t.qgz = sc.zero.zero_quantized_gradients;
  t.step_off_default_stream = sc.run.step_stream == "side";
  return t;
}

std::vector<const ReleaseRule*> scenario_defects(const Scenario& sc) {
  if (sc.run.builder != "deepspeed") return {};
  const std::string v = canonical_deepspeed_version(sc.zero.deepspeed_version);
  return is_deepspeed_release(v) ? known_defects(v, run_traits(sc))
                                 : std::vector<const ReleaseRule*>{};
}

Schedule build_deepspeed_schedule(const Scenario& sc, const std::string& version) {
  const VersionRules v = version_rules(version, run_traits(sc), sc.path);
  auto refuse = [&](const std::string& what, const std::string& instead) {
    throw InputError(sc.path, "run.builder",
                     "the DeepSpeed builder does not model " + what + " yet (" + instead +
                         ", or run.builder = \"coarse\")");
  };
  // The module tree transformers builds for the family, at the release the scenario names
  // (model.transformers_version): each is held to recordings of real DeepSpeed made with that
  // release (traces/deepspeed/README.md).
  const ModelConfig& m = sc.model;
  const std::string tf = transformers_version_of(m, sc.run.torch_version);
  const bool tf451 = tf == "4.51.3";
  const bool tf457 = tf == "4.57.1";
  const bool tf5 = tf.starts_with("5.");
  const bool own_heads = own_head_dim(m);
  const std::string& f = m.family;
  const bool deepseek = f == "deepseek_v2";
  if (deepseek && !tf457) {
    // transformers 4.35.2 has no DeepSeek-V2; 4.51.3 runs only DeepSeek's remote code, another
    // implementation, which no recording holds the builder to.
    throw InputError(sc.path, "model.transformers_version",
                     "transformers " + tf +
                         " has no native model_type deepseek_v2 (allowed here: \"4.57.1\", the "
                         "release its recordings were made with, or \"auto\")");
  }
  if (tf457 && !deepseek) {
    throw InputError(sc.path, "model.transformers_version",
                     "the DeepSpeed builder walks model_type " + f +
                         " as transformers 4.35.2 or 4.51.3 builds it, the releases its "
                         "recordings were made with; 4.57.1 only for deepseek_v2 (allowed here: "
                         "\"4.35.2\", \"4.51.3\" or \"auto\")");
  }
  if (tf == "4.35.2") {
    // transformers 4.35.2 has no Qwen2, Qwen3, Gemma or Phi-3; its Llama and Mistral read
    // neither head_dim (head_dim = hidden_size // num_attention_heads) nor mlp_bias: they would
    // build another model than the config says.
    const char* why = !in_transformers_4_35(m)     ? "has no model_type"
                      : own_heads                  ? "ignores the config's head_dim for model_type"
                      : m.mlp_bias && f == "llama" ? "ignores the config's mlp_bias for model_type"
                                                   : nullptr;
    if (why != nullptr) {
      throw InputError(
          sc.path, "model.transformers_version",
          fmt::format("transformers {} {} {} (allowed here: \"4.51.3\" or \"auto\")", tf, why, f));
    }
  }
  // Llama's tree (MistralForCausalLM, Qwen2's, Qwen3's and Gemma's have its modules; Qwen3 adds
  // q_norm and k_norm), with each projection's bias as the family sets it (Llama's
  // attention_bias and mlp_bias, Qwen2's on q, k and v, Qwen3's attention_bias), tied or not.
  // Mixtral's and Qwen2-MoE's are Llama's with a sparse block for the MLP, in every layer.
  const bool moe = f == "mixtral" || f == "qwen2_moe" || f == "qwen3_moe";
  const bool llama_tree =
      f == "llama" || f == "mistral" || f == "qwen2" || f == "qwen3" || f == "gemma" || moe;
  const bool dense_rms = m.gated_mlp && !m.linear_bias && !m.norm_bias && (m.experts > 0) == moe &&
                         m.dense_layers == 0 && m.kv_lora_rank == 0 && m.learned_positions == 0 &&
                         m.norms_per_layer == 2 && !m.alibi;
  const bool llama_walkable =
      llama_tree && dense_rms && (!m.qk_norm || f == "qwen3" || f == "qwen3_moe");
  if (f == "qwen3_moe" && (m.qkv_bias || m.o_bias)) {
    // The replaced attention's Linears would each be converted with their bias, as one group.
    throw InputError(m.name, "attention_bias",
                     "true is not modelled yet for Qwen3-MoE: its layers' replaced "
                     "attention (transformers 4.51.3 builds it twice) is walked without biases "
                     "(allowed: attention_bias false, as Qwen3-MoE's public configs have it)");
  }
  // DeepSeek-V2 (transformers 4.57.1): Llama's tree with multi-head latent attention, dense MLPs
  // in the first first_k_dense_replace layers and a DeepseekV2MoE after them.
  const bool deepseek_walkable = deepseek && tf457 && m.gated_mlp && !m.linear_bias &&
                                 !m.norm_bias && m.kv_lora_rank > 0 && m.learned_positions == 0 &&
                                 m.norms_per_layer == 2 && !m.alibi && !m.qk_norm;
  const bool phi3_walkable = f == "phi3" && tf451 && dense_rms && !m.qkv_bias && !m.o_bias &&
                             !m.mlp_bias && !m.qk_norm && !own_heads;
  const bool falcon_walkable = f == "falcon" && !tf451 && !m.gated_mlp && m.norm_bias &&
                               m.parallel_blocks && !m.alibi && !m.qkv_bias && !m.qk_norm &&
                               m.experts == 0 && m.kv_lora_rank == 0 && m.learned_positions == 0 &&
                               m.head_dim == 0 &&
                               (m.norms_per_layer == 1 || m.norms_per_layer == 2);
  const bool neox_walkable = f == "gpt_neox" && !tf451 && !m.gated_mlp && m.norm_bias &&
                             m.parallel_blocks && m.experts == 0 && m.head_dim == 0;
  const bool gpt2_walkable = f == "gpt2" && !tf451 && !m.gated_mlp && m.norm_bias &&
                             m.linear_bias && m.learned_positions > 0 && m.experts == 0 &&
                             m.head_dim == 0;
  // transformers 5's Mixtral, Qwen2-MoE and Qwen3-MoE: their fused experts module as the z3
  // leaf's child, held to tiny-mixtral-0.19.8-torch2.10 and tiny-{qwen2,qwen3}-moe-0.18.2-
  // torch2.10-pretrained; before
  // 0.18.0 the experts module has hooks of its own, and no recording shows how they fetch its
  // 3-D parameters. qgZ would split them by shape (all_to_all_quant_reduce), which the builder
  // reads for 2-D parameters only.
  const bool tf5_moe = tf5 && (f == "mixtral" || f == "qwen2_moe" || f == "qwen3_moe") &&
                       llama_walkable && v.default_moe_leaf;
  if (tf5_moe && sc.zero.zero_quantized_gradients) {
    throw InputError(sc.path, "zero.zero_quantized_gradients",
                     "true is not modelled with transformers " + tf +
                         "'s fused MoE experts (3-D parameters) (allowed: false, or "
                         "model.transformers_version \"4.51.3\")");
  }
  if (tf5 && !tf5_moe && (moe || !llama_walkable)) {
    // transformers 5's dense Llama-tree families (Llama, Mistral, Qwen2, Qwen3, Gemma): their
    // masks and non-reentrant checkpointing, held to recordings (tiny-*-torch2.10); Mixtral
    // from DeepSpeed 0.18.0, where its sparse block is a z3 leaf module.
    throw InputError(sc.path, "model.transformers_version",
                     "the DeepSpeed builder walks transformers " + tf +
                         " for model_type llama, mistral, qwen2, qwen3 and gemma, and mixtral, "
                         "qwen2_moe and qwen3_moe from DeepSpeed 0.18.0, the models its "
                         "recordings were made with" +
                         (sc.model.transformers_version == "auto"
                              ? " (\"auto\" takes it with run.torch_version 2.10 or later)"
                              : std::string()) +
                         " (allowed here: \"4.51.3\", the tree of transformers 4)");
  }
  if (tf451 && (f == "falcon" || f == "gpt_neox" || f == "gpt2")) {
    throw InputError(sc.path, "model.transformers_version",
                     "the DeepSpeed builder walks model_type " + f +
                         " as transformers 4.35.2 builds it, the release its recordings were "
                         "made with (allowed here: \"4.35.2\" or \"auto\")");
  }
  if (!llama_walkable && !phi3_walkable && !falcon_walkable && !neox_walkable && !gpt2_walkable &&
      !deepseek_walkable) {
    refuse("model_type " + f +
               " with this shape (it walks the trees of transformers' Llama, Mistral, Qwen2, "
               "Qwen3, Gemma and Phi-3, Mixtral's and Qwen2-MoE's with every layer sparse, "
               "DeepSeek-V2's, "
               "Falcon's with parallel attention and rotary embeddings, GPT-NeoX's with "
               "parallel residuals, and GPT-2's)",
           "a model of those families and shapes");
  }
  if (sc.zero.stage != 3) {
    // ZeRO-0/1/2 issue none of stage 3's gathers: a stage-3 schedule in their place would check
    // another run. hpZ is stage 3's (zero.Init builds the secondary partitions), so none of its
    // bugs can occur; ZeRO-1/2's own ordering bugs are not modelled.
    throw InputError(
        sc.path, "zero.stage",
        fmt::format("{} (zero_optimization.stage): the DeepSpeed builder models ZeRO stage 3 only, "
                    "so this run gets no verdict; hpZ exists only at stage 3, so none of hpZ's "
                    "ordering bugs can occur in it; ZeRO-1/2's own (DeepSpeed issues 5545, 7188, "
                    "7965) are checked on a recording of real DeepSpeed: add --record "
                    "(allowed: 3)",
                    sc.zero.stage));
  }
  // offload_param = cpu is modelled (sim/deepspeed_offload.hpp); what is not is refused there
  // (nvme: at the ds_config, sim/scenario.cpp).
  param_offload(sc);
  if (!sc.run.skipped_steps.empty() && !checks_overflow(sc, v) && !v.norm_validity_sync) {
    // Only an overflow (fp16; every dtype up to 0.11.1, PR 4512) or 0.19.8's invalid norm skips
    // a step: otherwise a NaN gradient is applied.
    throw InputError(sc.path, "run.skipped_steps",
                     fmt::format("DeepSpeed {} skips no {} step: it checks for overflow in fp16 "
                                 "only (every dtype up to 0.11.1) and the norm's validity from "
                                 "0.19.8, so a NaN gradient is applied, not skipped (allowed: "
                                 "\"\", or training.dtype fp16)",
                                 v.name, sc.training.dtype));
  }
  // Three [bugs] keys re-create in the coarse builder what DeepSpeed's own releases do here: a
  // key that would be silently ignored is refused, naming the release or key that has it.
  // (secondary_mismatch_rank is applied: RankBuilder::partition.)
  const BugConfig none;
  const BugConfig& bugs = sc.bugs;
  if (bugs.skip_secondary_invalidation != none.skip_secondary_invalidation) {
    refuse("bugs.skip_secondary_invalidation (issue 4851 is DeepSpeed 0.13.1's own)",
           "remove it and set zero.deepspeed_version = \"0.13.1\"");
  }
  if (bugs.checkpoint_load_at_step != none.checkpoint_load_at_step) {
    refuse("bugs.checkpoint_load_at_step (issue 7606's load is run.load)",
           "remove it and set run.load = \"checkpoint\"");
  }
  if (bugs.legacy_copy_bounds != none.legacy_copy_bounds) {
    refuse("bugs.legacy_copy_bounds (the copy bounds before PR 5216 are DeepSpeed 0.13.4's own)",
           "remove it and set zero.deepspeed_version = \"0.13.4\"");
  }

  Model md = build_model(sc.model, tf451 || tf457 || tf5, tf5_moe);
  // DeepseekV2MoE is not among the default leaf classes (its blocks keep their hooks).
  if (v.default_moe_leaf && moe) mark_z3_leaf_modules(md);
  Walk walk;
  walk.checkpointing = sc.training.grad_checkpointing;
  walk.non_reentrant = tf5;
  if (tf5 && walk.checkpointing) {
    walk.mask_host_waits = 1 + ((f == "qwen2" || f == "qwen3") && m.sliding_layers ? 1 : 0);
  }
  // ds_persist: mark_persistent_parameters (PO:242-260) over named_parameters, with
  // model_persistence_threshold at its default (sys.maxsize); zero.Init marks the same ones
  // (PP:1086).
  for (DsParam& p : md.params) {
    p.persist = static_cast<std::int64_t>(p.numel) <= sc.zero.stage3_param_persistence_threshold;
  }
  Schedule s;
  s.scenario = sc.path;
  s.variant = to_string(sc.run.variant);
  s.world_size = sc.cluster.world_size();
  s.hpz_size = sc.zero.zero_hpz_partition_size;
  s.dtype_bytes = sc.training.dtype_bytes();
  s.source["builder"] = "deepspeed";
  s.source["deepspeed"] = v.name;
  s.source["transformers"] = tf;
  for (const DsParam& p : md.params) {
    const ShardLayout l(p.numel, s.world_size, s.hpz_size);
    ParamUnit u;
    u.name = p.name;
    u.layer = p.layer;
    u.numel = p.numel;
    u.padded_numel = l.padded_numel();
    u.shard_numel = l.shard_numel();
    u.secondary_numel = s.hpz_size > 1 ? l.secondary_numel() : 0;
    u.persistent = p.persist;
    s.units.push_back(u);
  }
  // Groups: hpZ blocks (DeepSpeed utils/groups.py _create_zero_param_parallel_group), the
  // world, and the world's clone that stage 3 reduces gradients over (groups.py
  // _clone_world_group).
  const int world = s.world_size;
  if (s.hpz_size > 1) {
    for (int b = 0; b < world / s.hpz_size; ++b) {
      Group g{"hpz" + std::to_string(b), GroupKind::kHpz, {}};
      for (int r = b * s.hpz_size; r < (b + 1) * s.hpz_size; ++r) g.ranks.push_back(r);
      s.groups.push_back(g);
    }
  }
  Group w{"world", GroupKind::kWorld, {}};
  for (int r = 0; r < world; ++r) w.ranks.push_back(r);
  s.groups.push_back(w);
  // qgZ's all-to-all groups (utils/groups.py _get_local_all_to_all_group at v0.13.4, made by
  // the stage-3 optimizer, S3:265-268): the ranks of each node, and the ranks with the same
  // local index on every node; on one node only the first (groups.py:367-370: local_0), and
  // the gradients are reduce-scattered (S3:1338-1341).
  if (sc.zero.zero_quantized_gradients) {
    const int local = sc.cluster.gpus_per_node;
    for (int n = 0; n < sc.cluster.nodes; ++n) {
      Group g{"intra_node" + std::to_string(n), GroupKind::kIntraNode, {}};
      for (int i = 0; i < local; ++i) g.ranks.push_back(n * local + i);
      s.groups.push_back(g);
    }
    for (int i = 0; i < local && sc.cluster.nodes > 1; ++i) {
      Group g{"inter_node" + std::to_string(i), GroupKind::kInterNode, {}};
      for (int n = 0; n < sc.cluster.nodes; ++n) g.ranks.push_back(n * local + i);
      s.groups.push_back(g);
    }
  }
  w.name = "world1";
  s.groups.push_back(w);
  for (const DsModule& mod : md.modules) {
    if (std::find(s.labels.begin(), s.labels.end(), mod.path) == s.labels.end()) {
      s.labels.push_back(mod.path);
    }
  }
  s.ranks.reserve(static_cast<std::size_t>(world));
  for (Rank r = 0; r < world; ++r) {
    s.ranks.push_back(RankBuilder(sc, v, md, walk, s, r).build());
    // Every rank issues rank 0's ops on its own groups: one copy for all (issue 16's 1,024 ranks).
    if (r > 0) share_alike(s.ranks.back(), s.ranks.front());
  }
  return s;
}

}  // namespace hpz
