// How many parameters each part of a model has, counted as transformers' modules hold them:
// one place for the builder's parameter units, the size checks and the summaries. Counts are
// exact for the Hugging Face families read_hf_config understands (tests/data/hf: 20 public
// configs, counted with transformers by tools/count-hf-params); doubles, exact below 2^53.
#pragma once

#include "sim/scenario.hpp"

namespace hpz {

/** One decoder layer's parameters, by the parameter unit the builder makes of each. */
struct LayerShape {
  double input_norm = 0;  ///< the norm before attention (Falcon-7B: the layer's only one)
  double attn = 0;        ///< attention: projections, their biases, q/k norms, MLA's parts
  double post_norm = 0;   ///< the norm before the MLP (0: none)
  double mlp = 0;         ///< the dense MLP, or an MoE layer's router and shared experts
  double expert = 0;      ///< one routed expert's MLP (0: a dense layer)
  int experts = 0;        ///< routed experts in this layer
};

/** A model of Llama-2's shape: Llama's (or Mistral's) module tree with no biases, experts, tied
 *  output layer or head dimension of its own. What the DeepSpeed builder walks and what the
 *  numeric replay's model computes. */
bool llama_shaped(const ModelConfig& m);

/** True when transformers 4.35.2 has the model's family (Llama, Mistral, Falcon, GPT-NeoX,
 *  GPT-2). */
bool in_transformers_4_35(const ModelConfig& m);

/** True when config.head_dim sets heads of another width than hidden / heads. */
bool own_head_dim(const ModelConfig& m);

/** The transformers release whose module tree the model is walked in: m.transformers_version,
 *  or for "auto": 5.24.0 when the run's torch (`torch`, run.torch_version; "" = older) is 2.10
 *  or later (the recorder's torch 2.10 environment has that transformers and no other);
 *  else 4.35.2 (the recorder's default) where that release builds the model as its
 *  config says (Llama, Mistral, Falcon, GPT-NeoX, GPT-2 without a head dimension of their own,
 *  and Llama without mlp_bias: 4.35.2 ignores both), 4.57.1 for DeepSeek-V2 (natively in
 *  transformers since 4.55; 4.51.3 runs only DeepSeek's remote code), else 4.51.3. */
std::string transformers_version_of(const ModelConfig& m, const std::string& torch);

/** Width of the attention's query/output projection: heads x head dimension. */
double attention_width(const ModelConfig& m);

/** Layer `layer`'s parameters. */
LayerShape layer_shape(const ModelConfig& m, int layer);

/** The token embedding (and a learned position embedding). */
double embedding_params(const ModelConfig& m);

/** The final norm. */
double final_norm_params(const ModelConfig& m);

/** The output layer's own weight: 0 when tied to the token embedding. */
double head_params(const ModelConfig& m);

/** The model's parameters, a tied weight once (as `sum(p.numel() for p in
 *  model.parameters())` counts them). */
double parameter_count(const ModelConfig& m);

}  // namespace hpz
