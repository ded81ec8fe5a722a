// The numeric replay's model for DeepSpeed's own schedules: transformers' Llama decoder in fp32,
// computed one nn.Module at a time, as the DeepSpeed builder and the recorder issue its kernels
// (one forward, recompute or backward kernel per parameter, named as PyTorch names it:
// model.embed_tokens.weight, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}.weight, model.norm.weight, lm_head.weight).
//
// The math is modeling_llama.py's (transformers 4.35.2, LlamaDecoderLayer.forward):
//   n1 = RMSNorm(h0) g1;  q, k, v = n1 Wq', n1 Wk', n1 Wv';  RoPE on q and k (rotate_half);
//   a = softmax(q k' / sqrt(d) + causal mask) v, per head, key/value heads shared by
//   heads / kv_heads query heads;  h1 = h0 + a Wo';  n2 = RMSNorm(h1) g2;
//   h2 = h1 + (silu(n2 Wg') * (n2 Wu')) Wd';  logits = RMSNorm(h_L) gF  W_head';
//   loss = mean next-token cross entropy within each sequence of the micro-batch.
// RMSNorm's eps is LlamaConfig's default 1e-6 and RoPE's base its 10000 (not read from a config:
// they change the numbers, not which of them a race corrupts). Activations are [tokens x width]
// row-major, tokens = micro_batch sequences of seq_len.
//
// A kernel's work that has no parameter (the attention's softmax and the MLP's activation,
// which the schedules issue as unlabelled kernels) is done inside the parameter kernel that
// first needs it: it reads activations only, which the compute stream orders.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace hpz::replay {

/** Sizes of the Llama the numeric replay computes. */
struct LlamaDims {
  int seq = 0;    ///< tokens of one sequence
  int batch = 0;  ///< sequences of a micro-batch
  int hidden = 0;
  int ffn = 0;
  int heads = 0;
  int kv_heads = 0;
  int vocab = 0;
  int layers = 0;
  int head_dim() const { return heads > 0 ? hidden / heads : 0; }
  int tokens() const { return seq * batch; }
};

/** Which of a Llama's parameters. */
enum class LlamaPart {
  kEmbed,
  kInputNorm,
  kQ,
  kK,
  kV,
  kO,
  kPostNorm,
  kGate,
  kUp,
  kDown,
  kFinalNorm,
  kHead
};

/** One parameter: its part and layer (-1 outside the layers). */
struct LlamaParam {
  LlamaPart part = LlamaPart::kEmbed;
  int layer = -1;
};

/** The parameter a PyTorch name denotes ("model.layers.3.mlp.up_proj.weight"), if a Llama has
 *  it. */
std::optional<LlamaParam> llama_param(const std::string& name);

/** Elements of a parameter. */
std::uint64_t llama_numel(const LlamaDims& d, LlamaPart part);

/** Deterministic initial weights of a parameter (the same on every rank for a seed): norms 1,
 *  the others uniform with the standard deviation of LlamaConfig's initializer_range (0.02). */
std::vector<float> llama_initial_weights(const LlamaDims& d, LlamaPart part, std::uint64_t seed,
                                         std::uint64_t salt);

/** A checkpoint load's weights are the initial weights with the seed offset by this, so that
 *  they differ from the init kernel's. */
inline constexpr std::uint64_t kCheckpointSeedOffset = 7777;

/** The synthetic batch of one rank, step and micro-step (d.tokens() ids below d.vocab): a
 *  learnable token sequence. */
std::vector<int> synthetic_tokens(const LlamaDims& d, std::uint64_t seed, int rank, int step,
                                  int micro);

/** The optimizer step on one rank's primary shard `p`, in place: each gradient times `scale`,
 *  clipped to a global norm of max_grad_norm (norm_sq: the summed squares of every gradient
 *  before scaling; 0 or less: not clipped), then Adam (lr 1e-2, betas 0.9 and 0.999, eps 1e-8)
 *  at t = step + 1 with the moments m and v (p's size each), updated in place. */
void adam_step(std::span<float> p, std::span<const float> grad, std::span<float> m,
               std::span<float> v, float norm_sq, float scale, int step,
               float max_grad_norm = 1.0f);

/** One rank's forward and backward of one micro-step, fed one parameter's kernel at a time
 *  with the weights that kernel read. Throws std::logic_error when a kernel comes before what
 *  it needs (a schedule that does not run a Llama's modules in a Llama's order). */
class LlamaPass {
 public:
  explicit LlamaPass(const LlamaDims& d);

  /** A new micro-step on these token ids (tokens() of them). */
  void begin(std::vector<int> tokens);

  /** The forward of the parameter's module part; `recompute`: gradient checkpointing's rerun
   *  of a layer in backward, from the layer input the forward kept. */
  void forward(LlamaParam p, std::span<const float> w, bool recompute);

  /** The loss of the last forward; keeps its gradient for backward. NaN when any logit is. */
  float loss();

  /** The backward of the parameter's module part: the parameter's gradient. */
  std::vector<float> backward(LlamaParam p, std::span<const float> w);

 private:
  struct Layer {
    std::vector<float> h0, n1, q, k, v, probs, a, h1, n2, gate, up, m;
  };
  const std::vector<float>& need(const std::vector<float>& v, const char* what) const;
  const std::vector<float>& mlp_product(Layer& L);
  void attention(Layer& L);
  void attention_backward(Layer& L);

  LlamaDims d_;
  std::vector<int> tokens_;
  std::vector<Layer> layers_;
  std::vector<float> cur_;  ///< the residual stream after the last forward part
  std::vector<float> hf_, nf_, logits_, dlogits_;
  // Backward: the residual stream's gradient, the current norm output's, the MLP product's and
  // the attention output's, and q, k, v's once the attention's backward ran.
  std::vector<float> dh_, dn_, dm_, da_, dq_, dk_, dv_;
};

}  // namespace hpz::replay
