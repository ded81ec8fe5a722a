// The module tree transformers builds for a model family, as DeepSpeed's ZeRO-3 hooks it
// (PO:262-275): modules and their parameters in zero.Init's order, the z3 leaf modules, and the
// persistence of each parameter (set by build.cpp).
//
// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/scenario.hpp"

namespace hpz::deepspeed {

/** One parameter as zero.Init converts it (its ds_id is its index in Model::params). */
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

/** What a module computes, for its kernel's cost. */
enum class ModKind { kContainer, kEmbedding, kLinear, kNorm, kRotary, kAct, kHead };

/** One module of the tree, as named_modules() names it; DeepSpeed hooks each. */
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
/** The decoder layer's layout and walk: Llama's tree stands for every family made as it is. */
enum class Family { kLlama, kFalcon, kGptNeox, kGpt2, kPhi3 };

/** The whole module tree and its parameters. */
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
void mark_z3_leaf_modules(Model& md);

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
Model build_model(const ModelConfig& m, bool model_rotary, bool fused_experts = false);

}  // namespace hpz::deepspeed
