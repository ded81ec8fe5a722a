// The numeric replay's model: real fp32 forward and hand-written backward for the builder's
// parameter units of a decoder-only transformer (embed, per layer input_norm / attn /
// post_norm / mlp, final_norm, lm_head), each unit a function of the previous unit's output
// only (the builder's activation chain), plus a next-token cross-entropy loss. Each unit's flat
// parameters are cut into matrices in a fixed order (docs/repro.md):
//   embed [vocab x h]; norms: gain [h]; lm_head [vocab x h];
//   attn: Wq, Wk, Wv, Wo [h x h]: y = x + ((tanh(x Wq') * cmean(tanh(x Wk') * (x Wv'))) Wo'),
//         cmean = causal prefix mean over positions (a linear-attention stand-in);
//   mlp (gated): Wg, Wu [ffn x h], Wd [h x ffn]: y = x + (silu(x Wg') * (x Wu')) Wd'.
// Activations are [seq x h] row-major (logits [seq x vocab]).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace hpz::replay {

/** Which function a parameter unit computes. */
enum class UnitFn { kEmbed, kNorm, kAttn, kMlp, kHead };

/** UnitFn from the builder's unit name ("embed", "layers.0.attn", "final_norm", ...). */
UnitFn unit_fn(const std::string& unit_name);

/** Sizes of the model. */
struct TinyDims {
  int seq = 0;
  int hidden = 0;
  int ffn = 0;
  int vocab = 0;
};

/** Forward of one unit. `x` is the input activation (ignored by embed), `tokens` the batch. */
std::vector<float> unit_forward(UnitFn fn, const TinyDims& d, std::span<const float> w,
                                std::span<const float> x, std::span<const int> tokens);

/** Backward of one unit: from dy (gradient of its output) the gradient of its input (returned)
 *  and of its parameters (written into dw, numel elements). */
std::vector<float> unit_backward(UnitFn fn, const TinyDims& d, std::span<const float> w,
                                 std::span<const float> x, std::span<const int> tokens,
                                 std::span<const float> dy, std::span<float> dw);

/** Mean next-token cross entropy of logits [seq x vocab]; writes dlogits. */
float next_token_loss(const TinyDims& d, std::span<const float> logits, std::span<const int> tokens,
                      std::vector<float>& dlogits);

/** A checkpoint load's weights are initial_weights with the seed offset by this, so that they
 *  differ from the init kernel's. */
inline constexpr std::uint64_t kCheckpointSeedOffset = 7777;

/** The optimizer step on one rank's primary shard `p`, in place: each gradient times `scale`,
 *  clipped to a global norm of max_grad_norm (norm_sq: the summed squares of every gradient
 *  before scaling; 0 or less: not clipped), then Adam (lr 1e-2, betas 0.9 and 0.999, eps 1e-8)
 *  at t = step + 1 with the moments m and v (p's size each), updated in place. */
void adam_step(std::span<float> p, std::span<const float> grad, std::span<float> m,
               std::span<float> v, float norm_sq, float scale, int step,
               float max_grad_norm = 1.0f);

/** Deterministic initial weights of a unit (same on every rank for a seed). */
std::vector<float> initial_weights(UnitFn fn, const TinyDims& d, std::uint64_t numel,
                                   std::uint64_t seed, int unit);

/** The synthetic batch of one rank, step and micro-step: a learnable token sequence. */
std::vector<int> synthetic_tokens(const TinyDims& d, std::uint64_t seed, int rank, int step,
                                  int micro);

}  // namespace hpz::replay
