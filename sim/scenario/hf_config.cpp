// model.hf_config: a model from a Hugging Face config.json, as transformers builds it for its
// model_type (the modeling_*.py of each family).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/scenario/detail.hpp"
#include "sim/text.hpp"

namespace hpz::scenario_detail {
namespace {

/** A model dimension of the HF config, by its first name present; 1 or more, and errors name
 *  the config file and the key as written there. */
std::optional<int> hf_int(const json& config, const std::string& file,
                          std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    const int value = int_of(json_setting(*it, file, name, "an integer"), name);
    if (value < 1) {
      throw InputError(file, name, fmt::format("must be at least 1, got {}", value));
    }
    return value;
  }
  return std::nullopt;
}

/** An integer key whose null means none (0); `absent` (the config class's default) when the key
 *  is not there. */
int hf_int_or_null(const json& config, const std::string& file, const char* name, int absent) {
  if (!config.contains(name)) return absent;
  return hf_int(config, file, {name}).value_or(0);
}

int hf_required(const json& config, const std::string& file,
                std::initializer_list<const char*> names) {
  if (std::optional<int> value = hf_int(config, file, names)) return *value;
  throw InputError(file, *names.begin(),
                   "missing (needed to build the model from model.hf_config)");
}

/** A true/false key of the HF config; `fallback` (the config class's default) when absent. */
bool hf_bool(const json& config, const std::string& file, const char* name, bool fallback) {
  const auto it = config.find(name);
  if (it == config.end() || it->is_null()) return fallback;
  return bool_of(json_setting(*it, file, name, "a boolean"), name);
}

/** The Hugging Face model types read_hf_config understands, as transformers names them. */
const std::vector<std::string>& hf_model_types() {
  static const std::vector<std::string> types = {
      "llama",     "mistral",   "qwen2",       "qwen3",      "gemma",
      "phi3",      "falcon",    "gpt_neox",    "gpt2",       "mixtral",
      "qwen2_moe", "qwen3_moe", "deepseek_v2", "RefinedWeb", "RefinedWebModel"};
  return types;
}

/** Falcon's model types: transformers' own and tiiuae's custom code before it. */
bool is_falcon(const std::string& type) {
  return type == "falcon" || type == "RefinedWeb" || type == "RefinedWebModel";
}

/** The config's model_type, one hpzlab models; errors list those. */
std::string hf_model_type(const json& config, const std::string& file) {
  const json type_value = config.value("model_type", json());
  if (!type_value.is_string()) {
    throw InputError(
        file, "model_type",
        (type_value.is_null() ? std::string("missing")
                              : "expected a string, got " + shown_json(type_value)) +
            " (transformers picks the model by it; allowed: " + joined(hf_model_types()) + ")");
  }
  const std::string type = type_value.get<std::string>();
  const std::vector<std::string>& types = hf_model_types();
  if (std::find(types.begin(), types.end(), type) == types.end()) {
    throw InputError(file, "model_type",
                     fmt::format("'{}' is an architecture hpzlab does not model (allowed: {})",
                                 shown(type), joined(types)));
  }
  return type;
}

/** Refuses a config whose architectures name a head other than a causal LM's. */
void check_causal_lm_head(const json& config, const std::string& file) {
  // The head: hpzlab builds the causal-LM model (an lm_head of vocab_size x hidden_size). A
  // config saved from another head (GPT2ForSequenceClassification's `score`, a bare LlamaModel)
  // has other parameters, and is refused by name rather than counted as the LM.
  if (const auto arch = config.find("architectures"); arch != config.end() && !arch->is_null()) {
    if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
      throw InputError(
          file, "architectures",
          "expected a list of class names, e.g. [\"LlamaForCausalLM\"], got " + shown_json(*arch));
    }
    const std::string head = (*arch)[0].get<std::string>();
    if (!head.ends_with("ForCausalLM") && head != "GPT2LMHeadModel") {
      throw InputError(
          file, "architectures",
          fmt::format("'{}' is a head hpzlab does not model (allowed: a causal-LM head, "
                      "...ForCausalLM or GPT2LMHeadModel, which has lm_head); remove the key if "
                      "your training script loads the model with AutoModelForCausalLM",
                      shown(head)));
    }
  }
}

/** layers, hidden, heads, vocab and the MLP's width. */
void read_hf_dimensions(ModelConfig& model, const json& config, const std::string& file,
                        const std::string& type) {
  // GPT-2 spells the dimensions n_embd / n_layer / n_head; Falcon's older configs n_layer /
  // n_head / n_head_kv.
  model.layers = hf_required(config, file, {"num_hidden_layers", "n_layer"});
  model.hidden = hf_required(config, file, {"hidden_size", "n_embd"});
  model.heads = hf_required(config, file, {"num_attention_heads", "n_head"});
  model.vocab = hf_required(config, file, {"vocab_size"});
  const bool four_h =
      is_falcon(type) || type == "gpt2";  // ffn_hidden_size / n_inner: None = 4 x hidden
  std::optional<int> ffn =
      hf_int(config, file, {"intermediate_size", "ffn_hidden_size", "n_inner"});
  if (!ffn && four_h) {
    const std::int64_t width = std::int64_t{4} * model.hidden;
    if (width > std::numeric_limits<int>::max()) {
      throw InputError(file, "hidden_size",
                       fmt::format("{} is too large: the MLP is 4 x hidden_size = {} wide "
                                   "(allowed: at most {})",
                                   model.hidden, width, std::numeric_limits<int>::max() / 4));
    }
    ffn = static_cast<int>(width);
  }
  if (!ffn) {
    throw InputError(file, "intermediate_size",
                     "missing (needed to build the model from model.hf_config)");
  }
  model.ffn = *ffn;
}

/** The key/value heads; returns whether the config is Falcon's new decoder architecture, which
 *  decides them (and its norms, read_hf_family_details). */
bool read_hf_kv_heads(ModelConfig& model, const json& config, const std::string& file,
                      const std::string& type) {
  const bool falcon = is_falcon(type);
  std::optional<int> kv =
      hf_int(config, file, {"num_key_value_heads", "num_kv_heads", "n_head_kv"});
  // A RefinedWeb / RefinedWebModel config (tiiuae's custom code, before Falcon was in
  // transformers) has no new_decoder_architecture: transformers' conversion of such a checkpoint
  // sets it exactly when n_head_kv is given (models/falcon/convert_custom_code_checkpoint.py,
  // transformers 4.33 on), as Falcon-40B's (RefinedWeb, ln_attn and ln_mlp) against
  // Falcon-7B's (RefinedWebModel, one input_layernorm).
  const bool legacy_falcon = type == "RefinedWeb" || type == "RefinedWebModel";
  const bool new_arch = falcon && hf_bool(config, file, "new_decoder_architecture",
                                          legacy_falcon && config.contains("n_head_kv") &&
                                              !config.at("n_head_kv").is_null());
  if (!kv && falcon && !new_arch && hf_bool(config, file, "multi_query", true)) {
    kv = 1;  // Falcon-7B: multi-query attention, one key/value head (FalconConfig's default)
  }
  if (type == "gpt2" || type == "gpt_neox") kv.reset();  // always full multi-head attention
  model.kv_heads = kv.value_or(model.heads);
  return new_arch;
}

/** A head dimension of its own, for the families whose attention reads head_dim. */
void read_hf_head_dim(ModelConfig& model, const json& config, const std::string& file,
                      const std::string& type) {
  if (const std::optional<int> hd = hf_int(config, file, {"head_dim"});
      hd && (type == "llama" || type == "mistral" || type == "gemma" || type == "qwen3" ||
             type == "qwen3_moe")) {
    model.head_dim = *hd;
  } else if (type == "qwen3") {
    // Qwen3Config's head_dim defaults to 128 (configuration_qwen3.py:160 at transformers 4.51.3,
    // :67 at 5.24.0), which Qwen3Attention reads (getattr(config, "head_dim", ...)); Qwen3MoeConfig
    // has no such default in 4.51.3, so its attention falls back to hidden / heads.
    model.head_dim = 128;
  }
}

/** The output layer's tying, and each family's norms, biases and block layout. */
void read_hf_family_details(ModelConfig& model, const json& config, const std::string& file,
                            const std::string& type, bool new_arch) {
  const bool falcon = is_falcon(type);
  // tie_word_embeddings: PretrainedConfig's default is true; these families' configs default it
  // to false (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Phi3Config, GPTNeoXConfig,
  // MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV2Config).
  const bool tied_default = falcon || type == "gpt2" || type == "gemma";
  model.tied_embeddings = hf_bool(config, file, "tie_word_embeddings", tied_default);
  if (falcon) {
    // FalconDecoderLayer: LayerNorms (with biases); new_decoder_architecture has ln_attn and
    // ln_mlp, parallel attention otherwise one input_layernorm, sequential two.
    model.gated_mlp = false;
    model.norm_bias = true;
    model.linear_bias = hf_bool(config, file, "bias", false);
    const bool parallel = hf_bool(config, file, "parallel_attn", true);
    model.norms_per_layer = new_arch || !parallel ? 2 : 1;
    model.parallel_blocks = new_arch || parallel;
    model.alibi = hf_bool(config, file, "alibi", false);
  } else if (type == "gpt2" || type == "gpt_neox") {
    // GPT2Block / GPTNeoXLayer: LayerNorms and Linears (Conv1D) all with biases, a 2-matrix MLP;
    // GPT-2 learns its position embeddings (wpe, n_positions rows).
    model.gated_mlp = false;
    model.norm_bias = true;
    // GPT-NeoX's attention_bias covers query_key_value and dense; its MLP's Linears always
    // have biases (GPTNeoXMLP, transformers 4.55.4).
    model.linear_bias = type == "gpt2" || hf_bool(config, file, "attention_bias", true);
    model.mlp_bias = type == "gpt_neox";
    if (type == "gpt2") model.learned_positions = hf_required(config, file, {"n_positions"});
    // GPTNeoXLayer: x + attention(ln1(x)) + mlp(ln2(x)) unless use_parallel_residual is false.
    if (type == "gpt_neox") {
      model.parallel_blocks = hf_bool(config, file, "use_parallel_residual", true);
    }
  } else if (type == "qwen2" || type == "qwen2_moe") {
    model.qkv_bias = true;  // Qwen2Attention: q/k/v_proj with bias=True
  } else if (type == "qwen3" || type == "qwen3_moe") {
    // Qwen3Attention: q, k, v and o_proj all take bias=config.attention_bias
    // (modeling_qwen3.py:183-194 at transformers 4.51.3); q_norm and k_norm over head_dim.
    // Qwen3MoeAttention likewise (modeling_qwen3_moe.py).
    model.qkv_bias = model.o_bias = hf_bool(config, file, "attention_bias", false);
    model.qk_norm = true;
  } else if (type == "llama") {
    // LlamaAttention: q, k, v and o_proj all take bias=config.attention_bias; LlamaMLP's three
    // take config.mlp_bias (transformers 4.55.4 modeling_llama.py:146-148, 207-218; 4.35.2 has
    // attention_bias alone). MistralAttention and MistralMLP have no biases whatever the config.
    model.qkv_bias = model.o_bias = hf_bool(config, file, "attention_bias", false);
    model.mlp_bias = hf_bool(config, file, "mlp_bias", false);
  }
}

/** Qwen2's and Qwen3's sliding-window layers. */
void read_hf_sliding_layers(ModelConfig& model, const json& config, const std::string& file,
                            const std::string& type) {
  if (type == "qwen2" || type == "qwen3") {
    // layer_types as given, else "sliding_attention" for the layers from max_window_layers (28)
    // on when use_sliding_window keeps sliding_window (configuration_qwen2.py:73-93 and
    // configuration_qwen3.py:76-96 at transformers 5.24.0).
    if (const auto given = config.find("layer_types"); given != config.end() && !given->is_null()) {
      if (!given->is_array()) {
        throw InputError(file, "layer_types",
                         "expected a list of \"full_attention\" and \"sliding_attention\", got " +
                             shown_json(*given));
      }
      for (const json& t : *given) model.sliding_layers |= t == "sliding_attention";
    } else if (hf_bool(config, file, "use_sliding_window", false)) {
      const auto window = config.find("sliding_window");
      const int from = hf_int(config, file, {"max_window_layers"}).value_or(28);
      model.sliding_layers = (window == config.end() || !window->is_null()) && model.layers > from;
    }
  }
}

/** The heads' divisibility, under the config's own key names. */
void check_hf_heads(const ModelConfig& model, const json& config, const std::string& file,
                    const std::string& type) {
  // The divisibility rules check_model applies, reported here under the config's own key names
  // (issue 20 item 13: not as the scenario's model.heads, a key the user never wrote).
  const auto spelled = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (config.contains(name)) return std::string(name);
    }
    return std::string(*names.begin());
  };
  if (model.head_dim == 0 && model.kv_lora_rank == 0 && type != "deepseek_v2" &&
      model.hidden % model.heads != 0) {
    throw InputError(file, spelled({"num_attention_heads", "n_head"}),
                     fmt::format("{} heads do not divide {} = {} (allowed: a divisor of it)",
                                 model.heads, spelled({"hidden_size", "n_embd"}), model.hidden));
  }
  if (model.heads % model.kv_heads != 0) {
    throw InputError(
        file, spelled({"num_key_value_heads", "num_kv_heads", "n_head_kv"}),
        fmt::format("{} key/value heads do not divide {} = {} (allowed: a divisor "
                    "of it)",
                    model.kv_heads, spelled({"num_attention_heads", "n_head"}), model.heads));
  }
}

/** DeepSeek-V2's experts and multi-head latent attention. */
void read_deepseek_v2(ModelConfig& model, const json& config, const std::string& file) {
  // As transformers 4.57.1 builds it natively (configuration_deepseek_v2.py:146-183 for the
  // defaults of absent keys; modeling_deepseek_v2.py for the modules): every layer from
  // first_k_dense_replace on is a DeepseekV2MoE, whatever moe_layer_freq says (it reads no
  // such key), so a config that asks for another frequency is refused.
  const std::optional<int> routed = hf_int(config, file, {"n_routed_experts"});
  if (config.contains("n_routed_experts") && !routed) {
    throw InputError(file, "n_routed_experts",
                     "null builds no expert list in transformers 4.57.1 (allowed: an integer)");
  }
  model.experts = routed.value_or(64);
  model.experts_per_token = hf_required(config, file, {"num_experts_per_tok"});
  model.expert_ffn = hf_int(config, file, {"moe_intermediate_size"}).value_or(1407);
  // DeepseekV2MoE: a shared DeepseekV2MLP of moe_intermediate_size x n_shared_experts unless
  // n_shared_experts is null (its default, absent, is 2).
  model.shared_expert_ffn = hf_int_or_null(config, file, "n_shared_experts", 2) * model.expert_ffn;
  model.dense_layers = hf_int(config, file, {"first_k_dense_replace"}).value_or(0);
  if (hf_int(config, file, {"moe_layer_freq"}).value_or(1) != 1) {
    throw InputError(file, "moe_layer_freq",
                     "transformers 4.57.1 makes every layer after first_k_dense_replace sparse "
                     "(allowed: 1)");
  }
  model.kv_lora_rank = hf_int(config, file, {"kv_lora_rank"}).value_or(512);
  // q_lora_rank null: one q_proj (DeepSeek-V2-Lite); absent: the default 1536.
  model.q_lora_rank = hf_int_or_null(config, file, "q_lora_rank", 1536);
  model.qk_nope_head_dim = hf_int(config, file, {"qk_nope_head_dim"}).value_or(128);
  model.qk_rope_head_dim = hf_int(config, file, {"qk_rope_head_dim"}).value_or(64);
  model.v_head_dim = hf_int(config, file, {"v_head_dim"}).value_or(128);
  // DeepseekV2Attention: attention_bias on q_a_proj, kv_a_proj_with_mqa and o_proj (q_proj,
  // q_b_proj and kv_b_proj have none); DeepseekV2MLP: mlp_bias on its three Linears, the
  // experts' and the shared experts' too.
  model.qkv_bias = model.o_bias = hf_bool(config, file, "attention_bias", false);
  model.mlp_bias = hf_bool(config, file, "mlp_bias", false);
}

/** A mixture of experts' routed and shared experts (Mixtral, Qwen2-MoE, Qwen3-MoE,
 *  DeepSeek-V2); nothing for a dense model. */
void read_hf_experts(ModelConfig& model, const json& config, const std::string& file,
                     const std::string& type) {
  if (type == "mixtral") {
    model.experts = hf_required(config, file, {"num_local_experts"});
    model.experts_per_token = hf_required(config, file, {"num_experts_per_tok"});
    model.expert_ffn = model.ffn;  // each expert's w1/w2/w3 are intermediate_size wide
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    model.experts = hf_required(config, file, {"num_experts"});
    model.experts_per_token = hf_required(config, file, {"num_experts_per_tok"});
    model.expert_ffn = hf_required(config, file, {"moe_intermediate_size"});
    if (type == "qwen2_moe") {
      model.shared_expert_ffn = hf_required(config, file, {"shared_expert_intermediate_size"});
      model.shared_expert_gate = true;
    }
    const std::optional<int> step = hf_int(config, file, {"decoder_sparse_step"});
    const json only = config.value("mlp_only_layers", json::array());
    if (step.value_or(1) != 1 || !only.is_array() || !only.empty()) {
      throw InputError(file, "decoder_sparse_step",
                       "only every layer sparse is modelled (allowed: decoder_sparse_step 1 and "
                       "mlp_only_layers [])");
    }
  } else if (type == "deepseek_v2") {
    read_deepseek_v2(model, config, file);
  }
}

}  // namespace

/** A model from a Hugging Face config.json, as transformers builds it for its model_type (the
 *  modeling_*.py of each family; parameter counts checked against transformers for 20 public
 *  configs in tests/data/hf). A model_type not understood is refused, never read as a Llama. */
ModelConfig read_hf_config(const Setting& s) {
  const fs::path path = resolve(s, "model.hf_config");
  const json config = read_json(s, "model.hf_config", path);
  const std::string file = path.string();
  const std::string type = hf_model_type(config, file);
  check_causal_lm_head(config, file);
  ModelConfig model;
  model.name = file;
  model.hf_config = file;
  model.family = is_falcon(type) ? "falcon" : type;
  read_hf_dimensions(model, config, file, type);
  const bool new_arch = read_hf_kv_heads(model, config, file, type);
  read_hf_head_dim(model, config, file, type);
  read_hf_family_details(model, config, file, type, new_arch);
  read_hf_sliding_layers(model, config, file, type);
  check_hf_heads(model, config, file, type);
  read_hf_experts(model, config, file, type);
  return model;
}

}  // namespace hpz::scenario_detail
