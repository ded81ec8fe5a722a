#include "sim/record_inputs.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>

#include "sim/accelerate_config.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/model_shape.hpp"

namespace hpz {
namespace {

using nlohmann::json;

json read_user_json(const std::string& path, const std::string& key) {
  const std::string text = read_input_file(path, path, key, "cannot read it");
  return parse_json_input(text, path, "malformed JSON read for " + key);
}

/** Sets a dimension under the first of `names` the config already has, else under the first
 *  (when `add` says the key belongs in this config). */
void set_dimension(json& config, std::initializer_list<const char*> names, std::int64_t value,
                   bool add) {
  for (const char* name : names) {
    if (config.contains(name)) {
      config[name] = value;
      return;
    }
  }
  if (add) config[*names.begin()] = value;
}

bool is_auto(const json& value) {
  return value.is_string() && value.get<std::string>() == "auto";
}

/** Removes every "auto" value left (the HF Trainer fills them; none changes the schedule). */
void drop_auto(json& value) {
  if (!value.is_object()) return;
  for (auto it = value.begin(); it != value.end();) {
    if (is_auto(*it)) {
      it = value.erase(it);
    } else {
      drop_auto(*it);
      ++it;
    }
  }
}

}  // namespace

json recorder_hf_config(const Scenario& sc) {
  const ModelConfig& m = sc.model;
  const bool from_file = !m.hf_config.empty();
  if (!from_file && !m.gated_mlp) {
    throw InputError(sc.path, "model.preset",
                     "--record needs the model's Hugging Face config for a model that is not a "
                     "Llama (give model.hf_config or --hf-config)");
  }
  json config = from_file ? read_user_json(m.hf_config, "model.hf_config")
                          : json{{"model_type", "llama"},
                                 {"architectures", {"LlamaForCausalLM"}},
                                 {"max_position_embeddings", 4096}};
  // The names read_hf_config reads them by (Falcon's older configs: n_layer, n_head, n_head_kv).
  set_dimension(config, {"num_hidden_layers", "n_layer"}, m.layers, true);
  set_dimension(config, {"hidden_size"}, m.hidden, true);
  set_dimension(config, {"num_attention_heads", "n_head"}, m.heads, true);
  set_dimension(config, {"vocab_size"}, m.vocab, true);
  set_dimension(config, {"intermediate_size", "ffn_hidden_size"}, m.ffn, !from_file);
  set_dimension(config, {"num_key_value_heads", "num_kv_heads", "n_head_kv"}, m.kv_heads,
                !from_file);
  return config;
}

json recorder_ds_config(const Scenario& sc) {
  // An accelerate config (--ds-config accelerate.yaml): the ds_config accelerate launches with.
  json ds = sc.zero.ds_config.empty() ? json::object()
            : is_accelerate_config_path(sc.zero.ds_config)
                ? read_accelerate_config(sc.zero.ds_config, "", "zero.ds_config").ds_config
                : read_user_json(sc.zero.ds_config, "zero.ds_config");
  json zero = ds.value("zero_optimization", json::object());
  // DeepSpeed's aliases without stage3_ (ds_key in sim/scenario/ds_config.cpp): the stage3_
  // names are set.
  for (const char* alias : {"prefetch_bucket_size", "max_live_parameters", "max_reuse_distance",
                            "param_persistence_threshold"}) {
    zero.erase(alias);
  }
  const ZeroConfig& z = sc.zero;
  // ZeRO-1 and ZeRO-2 are recorded as they are (issue 32: their own ordering bugs); hpZ and
  // ZeRO++'s quantization exist at stage 3 only (the scenario turned them off with a note).
  const bool stage3 = z.stage == 3;
  zero["stage"] = z.stage;
  zero["zero_hpz_partition_size"] = stage3 ? z.zero_hpz_partition_size : 1;
  zero["zero_quantized_weights"] = stage3 && z.zero_quantized_weights;
  zero["zero_quantized_gradients"] = stage3 && z.zero_quantized_gradients;
  zero["overlap_comm"] = z.overlap_comm;
  zero["stage3_prefetch_bucket_size"] = z.stage3_prefetch_bucket_size;
  zero["stage3_max_live_parameters"] = z.stage3_max_live_parameters;
  zero["stage3_max_reuse_distance"] = z.stage3_max_reuse_distance;
  zero["stage3_param_persistence_threshold"] = z.stage3_param_persistence_threshold;
  zero["reduce_bucket_size"] = z.reduce_bucket_size;
  if (!z.offload_param) {
    zero.erase("offload_param");
  } else if (!zero.contains("offload_param") || !zero["offload_param"].is_object()) {
    zero["offload_param"] = {{"device", "cpu"}};
  }
  ds["zero_optimization"] = zero;
  const TrainingConfig& t = sc.training;
  ds["train_micro_batch_size_per_gpu"] = t.micro_batch;
  ds["gradient_accumulation_steps"] = t.grad_accum;
  // train_batch_size is left to DeepSpeed to derive: the recorder's DeepSpeed checks the batch
  // keys before it knows the world (hpzlab record: DeepSpeed sees a world of 1 at that point).
  ds.erase("train_batch_size");
  ds.erase("bfloat16");  // bf16's old name: bf16 is set below
  for (const char* dtype : {"bf16", "fp16"}) {
    if (!ds.contains(dtype) || !ds[dtype].is_object()) ds[dtype] = json::object();
    ds[dtype]["enabled"] = t.dtype == dtype;
  }
  // The Trainer's default max_grad_norm (TrainingArguments, 1.0), as the recorder fills it.
  if (const auto it = ds.find("gradient_clipping"); it != ds.end() && is_auto(*it)) *it = 1.0;
  drop_auto(ds);
  return ds;
}

std::vector<std::string> recorder_args(const Scenario& sc) {
  std::vector<std::string> args = {"--nodes",
                                   std::to_string(sc.cluster.nodes),
                                   "--gpus-per-node",
                                   std::to_string(sc.cluster.gpus_per_node),
                                   "--deepspeed",
                                   sc.zero.deepspeed_version,
                                   "--transformers",
                                   transformers_version_of(sc.model, sc.run.torch_version),
                                   "--steps",
                                   std::to_string(sc.run.steps),
                                   "--micro-batch",
                                   std::to_string(sc.training.micro_batch),
                                   "--seq-len",
                                   std::to_string(sc.training.seq_len),
                                   "--grad-checkpointing",
                                   sc.training.grad_checkpointing ? "on" : "off"};
  // run.torch_version: the recorder's environment of that torch (it refuses one it has none of).
  if (!sc.run.torch_version.empty()) {
    args.push_back("--torch");
    args.push_back(sc.run.torch_version);
  }
  // training.param_groups: the HF Trainer's own optimizer, two groups.
  if (sc.training.param_groups != "model") {
    args.push_back("--param-groups");
    args.push_back(sc.training.param_groups);
  }
  // ZeRO-1/2: every allocation, free and record_stream call, for the caching allocator's rules
  // (docs/checker.md); stage 3 is recorded as before, op for op what the builder is held to.
  if (sc.zero.stage != 3) args.push_back("--allocator");
  // run.load (issue 7606): the recorder loads a checkpoint as from_pretrained does, through
  // transformers' ZeRO-3 loader. Below stage 3 from_pretrained loads the weights before
  // DeepSpeed sees the model: nothing of the schedule changes, and the recorder refuses it.
  if (sc.run.load != "none" && sc.zero.stage == 3) {
    args.push_back("--load");
    args.push_back(sc.run.load);
  }
  return args;
}

}  // namespace hpz
