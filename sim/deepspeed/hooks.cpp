// The hook program: each family's layer forward and backward, non-reentrant checkpointing, and
// the micro-step around them.
#include "sim/deepspeed/hooks.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {
namespace {

/** The hooks a forward walk appends as transformers calls the modules, with grad or not, in a
 *  first forward or a recompute. */
class ForwardWalk {
 public:
  ForwardWalk(const Model& md, bool recompute, bool grad, std::vector<Hook>& out)
      : md_(md), recompute_(recompute), grad_(grad), out_(out) {}
  /** A module run whole: its pre-forward hook, its kernel, its forward hook; none for -1. */
  void leaf(int m) {
    if (m < 0) return;
    if (hooked(m)) out_.push_back({Ev::kPreFwd, m, recompute_, grad_});
    out_.push_back({Ev::kFwdKernel, m, recompute_, grad_});
    if (hooked(m)) out_.push_back({Ev::kPostFwd, m, recompute_, grad_});
  }
  /** A container's pre-forward hook, before its children run. */
  void open(int m) {
    if (hooked(m)) out_.push_back({Ev::kPreFwd, m, recompute_, grad_});
  }
  /** A container's forward hook, after its children ran. */
  void close(int m) {
    if (hooked(m)) out_.push_back({Ev::kPostFwd, m, recompute_, grad_});
  }
  /** The model's own wait for the compute stream (a data-dependent size). */
  void host_sync() { out_.push_back({Ev::kHostSync, -1, recompute_, grad_}); }

 private:
  /** A module under a z3 leaf has no hooks: only its kernel runs. */
  bool hooked(int m) const { return !md_.modules[static_cast<std::size_t>(m)].under_leaf; }

  const Model& md_;
  const bool recompute_, grad_;
  std::vector<Hook>& out_;
};

void gpt2_layer_forward(const Model::Layer& L, ForwardWalk& w) {
  // GPT2Block.forward: x + attn(ln_1(x)), then + mlp(ln_2(.)); GPT2Attention: c_attn, the
  // attention core with attn_dropout, c_proj, resid_dropout; GPT2MLP: c_fc, act, c_proj,
  // dropout.
  w.leaf(L.in_ln);
  w.open(L.attn);
  w.leaf(L.q);
  w.leaf(L.attn_drop);
  w.leaf(L.o);
  w.leaf(L.post_attn_drop);
  w.close(L.attn);
  w.leaf(L.post_ln);
  w.open(L.mlp);
  w.leaf(L.up);
  w.leaf(L.act);
  w.leaf(L.down);
  w.leaf(L.post_mlp_drop);
  w.close(L.mlp);
}

void neox_phi3_layer_forward(const Model::Layer& L, ForwardWalk& w) {
  // GPTNeoXLayer.forward (use_parallel_residual): attention(input_layernorm(x)) with its
  // dropout, then mlp(post_attention_layernorm(x)) with its. Phi3DecoderLayer.forward
  // (modeling_phi3.py:300-320 at 4.51.3) calls the same modules in the same order: x +
  // resid_attn_dropout(self_attn(input_layernorm(x))), then + resid_mlp_dropout(mlp(
  // post_attention_layernorm(.))), Phi3MLP being down_proj(up * activation_fn(gate)) of one
  // gate_up_proj.
  w.leaf(L.in_ln);
  w.open(L.attn);
  w.leaf(L.q);
  w.leaf(L.rot);
  w.leaf(L.attn_drop);
  w.leaf(L.o);
  w.close(L.attn);
  w.leaf(L.post_attn_drop);
  w.leaf(L.post_ln);
  w.open(L.mlp);
  w.leaf(L.up);
  w.leaf(L.act);
  w.leaf(L.down);
  w.close(L.mlp);
  w.leaf(L.post_mlp_drop);
}

// FalconDecoderLayer.forward at 4.35.2: ln_attn and ln_mlp on the layer's input, or one
// input_layernorm for both, then self_attention, then mlp.
void falcon_layer_forward(const Model::Layer& L, ForwardWalk& w) {
  w.leaf(L.in_ln);
  w.leaf(L.post_ln);
  w.open(L.attn);
  w.leaf(L.q);
  w.leaf(L.rot);
  w.leaf(L.o);
  w.close(L.attn);
  w.open(L.mlp);
  w.leaf(L.up);
  w.leaf(L.act);
  w.leaf(L.down);
  w.close(L.mlp);
}

// LlamaDecoderLayer.forward and those of the families made as Llama's tree, sparse blocks
// included.
void llama_layer_forward(const Model::Layer& L, ForwardWalk& w) {
  // Qwen3Attention.forward (modeling_qwen3.py:217-218): q_norm(q_proj(x)), k_norm(k_proj(x)).
  // DeepseekV2Attention.forward (modeling_deepseek_v2.py:336-345 at 4.57.1): q_proj, or
  // q_b_proj(q_a_layernorm(q_a_proj(x))); then kv_b_proj(kv_a_layernorm(kv_a_proj_with_mqa(x))).
  w.leaf(L.in_ln);
  w.open(L.attn);
  w.leaf(L.q);
  w.leaf(L.q_a);
  w.leaf(L.q_a_norm);
  w.leaf(L.q_b);
  w.leaf(L.q_norm);
  w.leaf(L.k);
  w.leaf(L.k_norm);
  w.leaf(L.v);
  w.leaf(L.kv_a);
  w.leaf(L.kv_norm);
  w.leaf(L.kv_b);
  w.leaf(L.rot);
  w.leaf(L.o);
  w.close(L.attn);
  w.leaf(L.post_ln);
  w.open(L.mlp);
  // The sparse block (MixtralSparseMoeBlock.forward at 4.51.3): the router, then every
  // expert in turn, whether or not a token was routed to it; Qwen2-MoE's shared expert and
  // its gate after them. DeepseekV2MoE.forward (modeling_deepseek_v2.py:108-147 at 4.57.1):
  // the gate, then moe() runs each expert that received a token, after reading its count on
  // the host (`if num_tokens == 0`, then the slice bounds: .item() each), then the shared
  // experts. We take every expert to receive tokens: the count is data, which the builder
  // does not have (docs/deepspeed-builder.md).
  auto expert = [&](const Model::Layer::Expert& x) {
    w.open(x.mod);
    w.leaf(x.gate);
    w.leaf(x.act);
    w.leaf(x.up);
    w.leaf(x.down);
    w.close(x.mod);
  };
  // transformers 5's Qwen2MoeSparseMoeBlock.forward runs the shared expert first, then the
  // router and the experts, then the shared expert's gate (modeling_qwen2_moe.py:339-351 at
  // 5.24.0).
  const bool shared_first = L.fused >= 0 && L.shared.mod >= 0;
  if (shared_first) expert(L.shared);
  w.leaf(L.router);
  for (const Model::Layer::Expert& x : L.experts) {
    // idx, top_x = torch.where(expert_mask[expert_idx]): nonzero, whose CUDA kernel copies
    // its count to the host and waits for the stream (the recorder logs it: hpzrec/ops.py).
    w.host_sync();
    expert(x);
  }
  // transformers 5's MixtralExperts: grouped_mm over the tokens sorted by expert, whose
  // offsets stay on the device (integrations/moe.py:355-384 at 5.24.0): no host read.
  w.leaf(L.fused);
  if (L.shared.mod >= 0 && !shared_first) expert(L.shared);
  w.leaf(L.shared_gate);
  w.leaf(L.gate);
  w.leaf(L.act);
  w.leaf(L.up);
  w.leaf(L.down);
  w.close(L.mlp);
}

/** The forward of one decoder layer. Llama (TF:LlamaDecoderLayer.forward, LlamaAttention.forward:
 *  q, k, v, rotary_emb, o; LlamaMLP.forward: down(act(gate(x)) * up(x))). Falcon
 *  (FalconDecoderLayer.forward at 4.35.2: ln_attn and ln_mlp on the layer's input, or one
 *  input_layernorm for both, then self_attention {query_key_value, maybe_rotary, dense}, then
 *  mlp {dense_h_to_4h, act, dense_4h_to_h}). */
void layer_forward(const Model& md, const Model::Layer& L, bool recompute, bool grad,
                   std::vector<Hook>& out, bool with_layer_hooks = true) {
  ForwardWalk w(md, recompute, grad, out);
  if (with_layer_hooks) w.open(L.layer);
  if (md.family == Family::kGpt2) {
    gpt2_layer_forward(L, w);
  } else if (md.family == Family::kGptNeox || md.family == Family::kPhi3) {
    neox_phi3_layer_forward(L, w);
  } else if (md.family == Family::kFalcon) {
    falcon_layer_forward(L, w);
  } else {
    llama_layer_forward(L, w);
  }
  if (with_layer_hooks) w.close(L.layer);
}

/** The hooks a backward walk appends as autograd runs the modules. */
class BackwardWalk {
 public:
  BackwardWalk(const Model& md, std::vector<Hook>& out) : md_(md), out_(out) {}
  /** A module's pre-backward hook (a PreBackwardFunction on its outputs). */
  void pre(int m) { out_.push_back({Ev::kPreBwd, m}); }
  /** A module run whole: its pre-backward hook, its backward kernel, and its post-backward
   *  hook where it has parameters; no hook below a z3 leaf; nothing for -1. */
  void leaf(int m) {
    if (m < 0) return;
    const bool hooked = !under_leaf(m);
    if (hooked) out_.push_back({Ev::kPreBwd, m});
    out_.push_back({Ev::kBwdKernel, m});
    if (hooked && !md_.modules[m].params.empty()) out_.push_back({Ev::kPostBwd, m});
  }
  /** Any other hook or kernel. */
  void push(Ev ev, int m) { out_.push_back({ev, m}); }
  bool under_leaf(int m) const { return md_.modules[static_cast<std::size_t>(m)].under_leaf; }

 private:
  const Model& md_;
  std::vector<Hook>& out_;
};

void gpt2_layer_backward(const Model::Layer& L, BackwardWalk& w) {
  // Sequential, as Llama's (the recording tiny-gpt2-0.13.4).
  w.pre(L.mlp);
  w.leaf(L.post_mlp_drop);
  w.leaf(L.down);
  w.leaf(L.act);
  w.leaf(L.up);
  w.leaf(L.post_ln);
  w.pre(L.attn);
  w.leaf(L.post_attn_drop);
  w.leaf(L.o);
  w.leaf(L.attn_drop);
  w.leaf(L.q);
  w.leaf(L.in_ln);
}

void neox_phi3_layer_backward(const Model::Layer& L, BackwardWalk& w) {
  // As the recording tiny-gptneox-0.13.4 shows: the MLP branch through its LayerNorm first,
  // then the attention branch; rotary_emb's cos and sin need no gradient. Phi-3's sequential
  // layer, its dropouts outside the containers, runs the same (tiny-phi3-tf4.51-0.13.4; it
  // has no rotary_emb or attention_dropout module).
  w.leaf(L.post_mlp_drop);
  w.pre(L.mlp);
  w.leaf(L.down);
  w.leaf(L.act);
  w.leaf(L.up);
  w.leaf(L.post_ln);
  w.leaf(L.post_attn_drop);
  w.pre(L.attn);
  w.leaf(L.o);
  w.leaf(L.attn_drop);
  w.leaf(L.q);
  w.leaf(L.in_ln);
}

void falcon_layer_backward(const Model::Layer& L, BackwardWalk& w) {
  w.leaf(L.down);
  w.leaf(L.act);
  w.leaf(L.up);
  w.pre(L.attn);
  w.leaf(L.o);
  if (L.rot >= 0) {
    // maybe_rotary returns two tensors (query, key): DeepSpeed puts a PreBackwardFunction on
    // each and counts them (applied_pre_backward_ref_cnt, PO:328-360), so its pre-backward
    // hook runs twice, once per gradient.
    w.pre(L.rot);
    w.pre(L.rot);
    w.push(Ev::kBwdKernel, L.rot);
  }
  w.leaf(L.q);
  w.leaf(L.post_ln);
  w.leaf(L.in_ln);
}

// Llama's tree and those made as it is, after the MLP's pre-backward hook: the MLP (a dense one,
// or a sparse block), then the attention.
void llama_layer_backward(const Model::Layer& L, bool z3_leaf, BackwardWalk& w) {
  // A sparse block backward (the recordings tiny-mixtral-tf4.51-0.13.4 and
  // tiny-qwen2-moe-tf4.51-0.13.4): the shared expert's gate and the shared expert, the experts
  // from the last to the first, then the router.
  auto expert = [&](const Model::Layer::Expert& x) {
    if (!w.under_leaf(x.mod)) {
      w.pre(x.mod);
    }
    w.leaf(x.down);
    w.leaf(x.up);
    w.leaf(x.act);
    w.leaf(x.gate);
  };
  w.leaf(L.shared_gate);
  if (L.shared.mod >= 0) expert(L.shared);
  for (auto x = L.experts.rbegin(); x != L.experts.rend(); ++x) expert(*x);
  w.leaf(L.fused);
  w.leaf(L.router);
  if (z3_leaf) {
    // torch runs the input's BackwardHookFunction, then the full backward hook (the block's
    // gradients reduced), then DeepSpeed's PostBackwardFunction on the input (its forward
    // pre-hook ran before BackwardHook.setup_input_hook): the release.
    w.push(Ev::kLeafGradHook, L.mlp);
    w.push(Ev::kPostBwd, L.mlp);
  }
  w.leaf(L.down);
  w.leaf(L.up);
  w.leaf(L.act);
  w.leaf(L.gate);
  w.leaf(L.post_ln);
  w.pre(L.attn);
  w.leaf(L.o);
  w.leaf(L.kv_b);
  w.leaf(L.kv_norm);
  w.leaf(L.kv_a);
  w.leaf(L.v);
  w.leaf(L.k_norm);
  w.leaf(L.k);
  w.leaf(L.q_norm);
  w.leaf(L.q_b);
  w.leaf(L.q_a_norm);
  w.leaf(L.q_a);
  w.leaf(L.q);
  w.leaf(L.in_ln);
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
  BackwardWalk w(md, out);
  w.pre(L.layer);
  if (md.family == Family::kGpt2) {
    gpt2_layer_backward(L, w);
    return;
  }
  if (md.family == Family::kGptNeox || md.family == Family::kPhi3) {
    neox_phi3_layer_backward(L, w);
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
  w.pre(L.mlp);
  if (z3_leaf && L.fused < 0) w.pre(L.mlp);
  if (md.family == Family::kFalcon) {
    falcon_layer_backward(L, w);
    return;
  }
  llama_layer_backward(L, z3_leaf, w);
}

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

}  // namespace

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

}  // namespace hpz::deepspeed
