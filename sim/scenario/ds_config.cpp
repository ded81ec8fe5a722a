// zero.ds_config: a DeepSpeed config JSON (or an accelerate config YAML, sim/accelerate_config.hpp)
// read as DeepSpeed reads it: its zero_optimization keys under their DeepSpeed names and aliases,
// the keys each release accepts, "auto" values as the HF Trainer fills them, precision, clipping
// and the batch-size rule.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sim/accelerate_config.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/scenario/detail.hpp"
#include "sim/text.hpp"

namespace hpz::scenario_detail {
namespace {

/** DeepSpeed's zero_optimization keys we model; DeepSpeed accepts the stage3_ names without it. */
std::optional<std::string> ds_key(const std::string& name) {
  static const std::map<std::string, std::string> aliases = {
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size"},
      {"max_live_parameters", "stage3_max_live_parameters"},
      {"max_reuse_distance", "stage3_max_reuse_distance"},
      {"param_persistence_threshold", "stage3_param_persistence_threshold"},
  };
  if (const auto it = aliases.find(name); it != aliases.end()) return "zero." + it->second;
  if (name == "ds_config") return std::nullopt;
  if (find_spec("zero." + name)) return "zero." + name;
  return std::nullopt;
}

/** offload_param is an object in DeepSpeed: {"device": "cpu" | "nvme" | "none", ...}. */
Setting ds_offload(const json& value, const std::string& file) {
  const std::string key = "zero_optimization.offload_param";
  if (value.is_null()) return Setting{Raw{false}, file, {}};
  if (value.is_boolean()) return Setting{Raw{value.get<bool>()}, file, {}};
  if (!value.is_object()) {
    throw InputError(file, key,
                     "expected an object like {\"device\": \"cpu\"}, got " + shown_json(value));
  }
  const json device = value.value("device", json("none"));
  const std::vector<std::string> devices = {"none", "cpu", "nvme"};
  const std::string name =
      choice_of(json_setting(device, file, key + ".device", "a string"), key + ".device", devices);
  if (name == "nvme") {
    // zero.offload_param = true is the CPU (docs/research-offload.md); NVMe swaps shards through
    // AsyncPartitionedParameterSwapper's aio reads and writes (partition_parameters.py, v0.13.4
    // lines 989-990, 1421-1426), which no builder models.
    throw InputError(file, key + ".device",
                     "nvme is not modelled by hpzlab (the shards' asynchronous swaps to NVMe "
                     "and back) (allowed: none, cpu)");
  }
  return Setting{Raw{name != "none"}, file, {}};
}

/** The keys DeepSpeed's DeepSpeedZeroConfig accepts in zero_optimization for `version`: its
 *  fields and their aliases. Its config model forbids any other key (runtime/config_utils.py,
 *  v0.10.0 and v0.13.4 line 109 `extra = "forbid"`; v0.17.6 line 110 `extra="forbid"`), so
 *  DeepSpeed refuses a ds_config with a misspelt key. Each key with the first release whose
 *  class DeepSpeedZeroConfig (runtime/zero/config.py) has it, and the first that dropped it:
 *  read tag by tag from v0.10.0 (37 keys) to v0.19.5, and from the PyPI sdists of 0.19.6 to
 *  0.19.8 (docs/deepspeed-releases.md). */
std::vector<std::string> deepspeed_zero_keys(const std::string& version) {
  struct ZeroKey {
    const char* name;
    const char* first = "0.10.0";
    const char* dropped = "";  ///< "" = still there in the newest release
  };
  static const ZeroKey kKeys[] = {
      {"stage"},
      {"contiguous_gradients"},
      {"reduce_scatter"},
      {"reduce_bucket_size"},
      {"allgather_partitions"},
      {"allgather_bucket_size"},
      {"overlap_comm"},
      {"load_from_fp32_weights"},
      {"elastic_checkpoint"},
      {"offload_param"},
      {"offload_optimizer"},
      {"sub_group_size"},
      {"cpu_offload_param"},
      {"cpu_offload_use_pin_memory"},
      {"cpu_offload"},
      {"prefetch_bucket_size"},
      {"stage3_prefetch_bucket_size"},
      {"param_persistence_threshold"},
      {"stage3_param_persistence_threshold"},
      {"model_persistence_threshold"},
      {"stage3_model_persistence_threshold"},
      {"max_live_parameters"},
      {"stage3_max_live_parameters"},
      {"max_reuse_distance"},
      {"stage3_max_reuse_distance"},
      {"gather_16bit_weights_on_model_save"},
      {"stage3_gather_16bit_weights_on_model_save"},
      {"stage3_gather_fp16_weights_on_model_save"},
      {"ignore_unused_parameters"},
      {"legacy_stage1"},
      {"round_robin_gradients"},
      {"zero_hpz_partition_size"},
      {"zero_quantized_weights"},
      {"zero_quantized_gradients"},
      {"memory_efficient_linear"},
      {"mics_shard_size", "0.10.0", "0.19.7"},
      {"mics_hierarchical_params_gather", "0.10.0", "0.19.7"},
      {"pipeline_loading_checkpoint", "0.10.1"},
      {"override_module_apply", "0.10.1"},
      {"zero_quantized_nontrainable_weights", "0.10.2"},
      {"use_multi_rank_bucket_allreduce", "0.12.4"},
      {"use_all_reduce_for_fetch_params", "0.14.3"},
      {"stage3_use_all_reduce_for_fetch_params", "0.14.3"},
      {"module_granularity_threshold", "0.16.0"},
      {"stage3_module_granularity_threshold", "0.16.0"},
      {"zeropp_loco_param", "0.16.2", "0.19.8"},
      {"log_trace_cache_warnings", "0.16.4"},
      {"zenflow", "0.17.5"},
      {"enable_sanity_checks", "0.17.6"},
      {"leaf_module", "0.18.0"},
      {"allgather_sequential", "0.18.5"},
      {"stage3_allgather_sequential", "0.18.5"},
      {"save_muon_momentum_buffer_in_memory", "0.18.9"},
      {"parameter_alignment", "0.19.7"},
      {"compute_grad_norm", "0.19.7"},
  };
  std::vector<std::string> keys;
  for (const ZeroKey& k : kKeys) {
    if (compare_versions(version, k.first) < 0) continue;
    if (*k.dropped != '\0' && compare_versions(version, k.dropped) >= 0) continue;
    keys.emplace_back(k.name);
  }
  return keys;
}

/** Whether a ds_config's zero_optimization.leaf_module is DeepSpeed's default
 *  (DeepSpeedZeroLeafModuleConfig, runtime/zero/leaf_module_config.py:11-35 at v0.18.2): null,
 *  or an object whose classes (a string or a list) name the default classes and whose names and
 *  name_suffixes are empty. */
bool default_leaf_modules(const json& value) {
  if (value.is_null()) return true;
  if (!value.is_object()) return false;
  auto listed = [&](const char* field) -> std::optional<std::set<std::string>> {
    std::set<std::string> out;
    if (!value.contains(field)) return std::nullopt;
    const json& v = value.at(field);
    if (v.is_string()) {
      out.insert(v.get<std::string>());
      return out;
    }
    if (!v.is_array()) return std::set<std::string>{"(not a list)"};
    for (const json& e : v) out.insert(e.is_string() ? e.get<std::string>() : e.dump());
    return out;
  };
  const std::set<std::string> classes{
      "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
      "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
      "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock"};
  for (const auto& [field, v] : value.items()) {
    if (field != "classes" && field != "names" && field != "name_suffixes") return false;
  }
  const auto c = listed("classes");
  const auto n = listed("names");
  const auto x = listed("name_suffixes");
  return (!c || *c == classes) && (!n || n->empty()) && (!x || x->empty());
}

/** The releases that define zero_optimization key `name` ("0.18.0-0.19.8 (12 releases)"), ""
 *  when none does. */
std::string release_defining_key(const std::string& name) {
  std::vector<std::string> with;
  for (const DeepSpeedRelease& r : deepspeed_releases()) {
    const std::vector<std::string> keys = deepspeed_zero_keys(r.version);
    if (std::find(keys.begin(), keys.end(), name) != keys.end()) with.emplace_back(r.version);
  }
  return with.empty() ? "" : releases_label(with);
}

/** A top-level batch key of the ds_config: none when absent or "auto" (the HF Trainer fills
 *  "auto" values itself, from its own arguments; DeepSpeed never sees them: the key is listed in
 *  batch.auto_keys), else a positive integer. */
std::optional<std::int64_t> ds_batch_key(DsBatch& batch, const json& config,
                                         const std::string& name, const std::string& file) {
  if (!config.contains(name)) return std::nullopt;
  const json& value = config[name];
  if (value.is_string() && value.get<std::string>() == "auto") {
    batch.auto_keys.push_back(name);
    return std::nullopt;
  }
  const std::int64_t v = int64_of(json_setting(value, file, name, "an integer"), name);
  if (v < 1 || v > std::numeric_limits<int>::max()) {
    throw InputError(
        file, name,
        fmt::format("{} is out of range (allowed: 1 to {})", v, std::numeric_limits<int>::max()));
  }
  return v;
}

/** bf16 / fp16 as DeepSpeed reads them: {"enabled": bool}, false when absent (runtime/config.py,
 *  v0.13.4 lines 158-169: bf16 also under its old name "bfloat16"); none when "auto", which the
 *  HF Trainer fills from its own --bf16 / --fp16 arguments. */
std::optional<bool> ds_precision_enabled(const json& config, const std::vector<std::string>& names,
                                         const std::string& file) {
  for (const std::string& name : names) {
    if (!config.contains(name)) continue;
    const json& section = config[name];
    if (!section.is_object())
      throw InputError(file, name, "expected an object such as {\"enabled\": true}");
    if (!section.contains("enabled")) return false;
    const json& enabled = section["enabled"];
    if (enabled.is_string() && enabled.get<std::string>() == "auto") return std::nullopt;
    return bool_of(json_setting(enabled, file, name + ".enabled", "a boolean"), name + ".enabled");
  }
  return false;
}

/** The dtype the ds_config trains in: bf16, fp16, else fp32 (DeepSpeed refuses both); when one
 *  is "auto" and neither is enabled, the scenario's training.dtype stays (a note). */
void apply_ds_precision(Scenario& sc, const json& config, const std::string& file,
                        Origins& origins) {
  const std::optional<bool> bf16 = ds_precision_enabled(config, {"bf16", "bfloat16"}, file);
  const std::optional<bool> fp16 = ds_precision_enabled(config, {"fp16"}, file);
  if (bf16.value_or(false) && fp16.value_or(false)) {
    // runtime/config.py, v0.13.4 line 831: 'bfloat16 and fp16 modes cannot be simultaneously
    // enabled'.
    throw InputError(file, "bf16",
                     "and fp16 are both enabled (allowed: at most one, as DeepSpeed)");
  }
  if (!bf16.value_or(false) && !fp16.value_or(false) && (!bf16 || !fp16)) {
    sc.notes.push_back(fmt::format(
        "ds_config {}: {}.enabled is \"auto\" (the HF Trainer fills it from its --bf16 / --fp16 "
        "arguments): training.dtype is the scenario's, or its default bf16 (set it with --set)",
        file, !bf16 ? "bf16" : "fp16"));
    return;
  }
  sc.training.dtype = bf16.value_or(false) ? "bf16" : fp16.value_or(false) ? "fp16" : "fp32";
  origins["training.dtype"] = file;
  if (sc.training.dtype == "fp32") {
    sc.notes.push_back(
        fmt::format("ds_config {}: neither bf16 nor fp16 enabled: training.dtype = fp32", file));
  }
}

/** The ds_config's gradient_clipping (DeepSpeed's get_gradient_clipping, runtime/config.py:
 *  a number, default 0.0); "auto" is the HF Trainer's max_grad_norm, 1.0 by default, as
 *  transformers fills it (integrations/deepspeed.py, trainer_config_process). */
void apply_ds_clipping(Scenario& sc, const json& config, const std::string& file,
                       Origins& origins) {
  const auto it = config.find("gradient_clipping");
  if (it == config.end()) return;
  if (it->is_string() && it->get<std::string>() == "auto") {
    sc.training.gradient_clipping = 1.0;
    sc.notes.push_back(fmt::format(
        "ds_config {}: gradient_clipping is \"auto\": 1.0, the HF Trainer's default "
        "max_grad_norm (set training.gradient_clipping with --set if the run gives another)",
        file));
  } else if (it->is_number()) {
    sc.training.gradient_clipping = it->get<double>();
  } else {
    throw InputError(file, "gradient_clipping",
                     "expected a number (0 for none) or \"auto\", got " + shown_json(*it));
  }
  origins["training.gradient_clipping"] = file;
}

/** A zero_optimization key given as "auto": filled as the HF Trainer fills it when the run uses
 *  it (training.hf_trainer), else DeepSpeed's default kept; a note either way. The Trainer fills
 *  three keys from the model's hidden size h at ZeRO-3 (transformers 4.35.2
 *  integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_finalize; accelerate,
 *  axolotl and LLaMA-Factory fill the same values): reduce_bucket_size h^2,
 *  stage3_prefetch_bucket_size 0.9 h^2 (as an integer, as later transformers write it) and
 *  stage3_param_persistence_threshold 10 h. */
void apply_auto(Scenario& sc, const std::string& dotted, const std::string& key,
                const std::string& file, bool hf_trainer, Origins& origins) {
  const std::int64_t h = sc.model.hidden;
  std::optional<std::int64_t> filled;
  std::int64_t* field = nullptr;
  if (dotted == "zero.reduce_bucket_size") {
    filled = h * h;
    field = &sc.zero.reduce_bucket_size;
  } else if (dotted == "zero.stage3_prefetch_bucket_size") {
    filled = static_cast<std::int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h));
    field = &sc.zero.stage3_prefetch_bucket_size;
  } else if (dotted == "zero.stage3_param_persistence_threshold") {
    filled = 10 * h;
    field = &sc.zero.stage3_param_persistence_threshold;
  }
  if (!filled) {
    sc.notes.push_back(fmt::format(
        "ds_config {}: {} is \"auto\", which the HF Trainer does not fill: the default is kept",
        file, key));
  } else if (hf_trainer) {
    *field = *filled;
    origins[dotted] = file;
    sc.notes.push_back(
        fmt::format("ds_config {}: {} is \"auto\": {} as the HF Trainer fills it "
                    "(hidden size {})",
                    file, key, *filled, h));
  } else {
    sc.notes.push_back(fmt::format(
        "ds_config {}: {} is \"auto\": DeepSpeed's default {} is kept (the HF Trainer would "
        "fill {}: --hf-trainer or training.hf_trainer = true if the run uses it)",
        file, key, *field, *filled));
  }
}

/** An accelerate config's notes, and its machines and processes as the cluster. */
void apply_launch(Scenario& scenario, const AccelerateConfig& launch, const std::string& file,
                  Origins& origins) {
  scenario.notes.insert(scenario.notes.end(), launch.notes.begin(), launch.notes.end());
  if (launch.num_processes) {
    // num_processes is the total; read_accelerate_config refused a pair that does not divide.
    // Origins name the YAML, so --nodes / --gpus-per-node / --set override it with a note and
    // a scenario file's cluster keys give way to it as to any file the user names.
    scenario.cluster.nodes = launch.num_machines.value_or(1);
    scenario.cluster.gpus_per_node = *launch.num_processes / scenario.cluster.nodes;
    origins["cluster.nodes"] = file;
    origins["cluster.gpus_per_node"] = file;
  }
}

/** training.param_groups as the HF Trainer makes its optimizer. */
void apply_hf_trainer_optimizer(Scenario& scenario, const json& config, const std::string& file,
                                Origins& origins) {
  // The HF Trainer hands DeepSpeed a DummyOptim of model.parameters() when the ds_config names
  // an optimizer, else its own, from create_optimizer: two groups (transformers 4.51.3
  // integrations/deepspeed.py:371-389, trainer.py:1200-1224; 4.35.2 and 5.24.0 alike).
  const bool own = !config.contains("optimizer");
  scenario.training.param_groups = own ? "hf-trainer" : "model";
  origins["training.param_groups"] = file;
  scenario.notes.push_back(fmt::format(
      "ds_config {}: {}: training.param_groups = {}", file,
      own ? "no \"optimizer\" section, so the HF Trainer makes its own optimizer, with two "
            "parameter groups (with weight decay and without)"
          : "an \"optimizer\" section, so DeepSpeed makes the optimizer, with one parameter "
            "group",
      scenario.training.param_groups));
}

/** The ds_config's top-level keys hpzlab does not read. */
std::vector<std::string> ignored_top_level_keys(const json& config) {
  std::vector<std::string> ignored;
  const std::set<std::string> read_here = {"zero_optimization",
                                           "train_batch_size",
                                           "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps",
                                           "bf16",
                                           "bfloat16",
                                           "fp16",
                                           "gradient_clipping"};
  for (const auto& [name, value] : config.items()) {
    if (read_here.count(name) == 0) ignored.push_back(name);
  }
  return ignored;
}

/** The three batch keys into `batch`, with a note for those given as "auto". */
void read_ds_batch(Scenario& scenario, DsBatch& batch, const json& config,
                   const std::string& file) {
  batch.train_batch = ds_batch_key(batch, config, "train_batch_size", file);
  batch.micro = ds_batch_key(batch, config, "train_micro_batch_size_per_gpu", file);
  batch.accum = ds_batch_key(batch, config, "gradient_accumulation_steps", file);
  if (!batch.auto_keys.empty()) {
    // The HF Trainer fills these from its own arguments (per_device_train_batch_size,
    // gradient_accumulation_steps: transformers 4.35.2 integrations/deepspeed.py,
    // HfTrainerDeepSpeedConfig.trainer_config_process), which hpzlab does not see.
    scenario.notes.push_back(
        fmt::format("ds_config {}: {} \"auto\" (the HF Trainer fills {} from its arguments): "
                    "training.micro_batch and training.grad_accum are the scenario's, or their "
                    "defaults 1 and 1 "
                    "(set them with --set)",
                    file, joined(batch.auto_keys) + (batch.auto_keys.size() == 1 ? " is" : " are"),
                    batch.auto_keys.size() == 1 ? "it" : "them"));
  }
}

/** Refuses a zero_optimization key that DeepSpeed `version` does not define. */
[[noreturn]] void refuse_unknown_zero_key(const std::string& name, const std::string& key,
                                          const std::vector<std::string>& known,
                                          const std::string& version, const std::string& file) {
  if (const std::string other = release_defining_key(name); !other.empty()) {
    // A key of another release: that DeepSpeed refuses this ds_config, as a release (a
    // matrix of releases shows it on this release's line and goes on).
    throw ReleaseRefusal(file, key,
                         fmt::format("DeepSpeed {} refuses it (its DeepSpeedZeroConfig "
                                     "forbids keys it does not define; {} defines it)",
                                     version, other));
  }
  const std::optional<std::string> near = closest(name, known);
  throw InputError(
      file, key,
      fmt::format("unknown key: DeepSpeed {} refuses it (its DeepSpeedZeroConfig "
                  "forbids keys it does not define){} (allowed: {})",
                  version, near ? fmt::format("; did you mean '{}'?", *near) : "", joined(known)));
}

/** zero_optimization's module_granularity_threshold, under either of its names. */
bool is_granularity_key(const std::string& name) {
  return name == "stage3_module_granularity_threshold" || name == "module_granularity_threshold";
}

/** Refuses a zero_optimization value that asks for what hpzlab does not model. */
void refuse_unmodelled_zero_value(const std::string& name, const json& value,
                                  const std::string& key, const std::string& file) {
  if (name == "mics_shard_size" && value.is_number() && value.get<double>() > 0) {
    // DeepSpeed runs MiCS (its own partitioning, MiCS_Init and MiCS_Optimizer) when the shard
    // size is positive (runtime/engine.py, v0.13.4 line 1574); hpzlab models neither.
    throw InputError(file, key,
                     fmt::format("{}: MiCS is not modelled by hpzlab (allowed: -1, "
                                 "DeepSpeed's default, or leave it out)",
                                 shown_json(value)));
  }
  if (name == "leaf_module" && !default_leaf_modules(value)) {
    // zero_optimization.leaf_module (PR 7604, v0.18.0) picks the z3 leaf modules; hpzlab models
    // DeepSpeed's default (rule default-moe-leaf-modules), not another choice of leaves.
    throw InputError(file, key,
                     fmt::format("{}: only DeepSpeed's default leaf modules are modelled "
                                 "(Mixtral's, Qwen2-MoE's and Qwen3-MoE's sparse blocks) "
                                 "(allowed: {{}}, the default lists, or leave it out)",
                                 shown_json(value)));
  }
  if (is_granularity_key(name) && !(value.is_number() && value.get<double>() <= 0)) {
    // A positive threshold makes the modules below it z3 leaves with fast sharding
    // (parameter_offload.py:157-163 at v0.18.2), which hpzlab does not model.
    throw InputError(file, key,
                     fmt::format("{}: z3 leaf modules by granularity (fast sharding) are not "
                                 "modelled by hpzlab (allowed: 0, DeepSpeed's default, or leave "
                                 "it out)",
                                 shown_json(value)));
  }
}

/** zero_optimization's keys into `scenario`, each under DeepSpeed `version`'s rules; those not
 *  modelled into `ignored`. */
void apply_zero_optimization(Scenario& scenario, const json& zero, const std::string& file,
                             const std::string& version, bool fill_auto, Origins& origins,
                             std::vector<std::string>& ignored) {
  std::map<std::string, std::string> spelled;  // dotted key -> the name it was given by
  const std::vector<std::string> known = deepspeed_zero_keys(version);
  for (const auto& [name, value] : zero.items()) {
    const std::string key = "zero_optimization." + name;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      refuse_unknown_zero_key(name, key, known, version, file);
    }
    const std::optional<std::string> dotted = ds_key(name);
    if (dotted) {
      // DeepSpeed reads one of an alias and its stage3_ name, chosen by its own precedence; the
      // other value is dropped silently (an invalid one never reported).
      if (const auto [it, fresh] = spelled.try_emplace(*dotted, name); !fresh) {
        throw InputError(file, key,
                         fmt::format("given together with its alias zero_optimization.{} "
                                     "(allowed: one of the two)",
                                     it->second));
      }
    }
    refuse_unmodelled_zero_value(name, value, key, file);
    const bool granularity = is_granularity_key(name);
    if (!dotted) {
      // The default leaf modules and a threshold of 0 are what the DeepSpeed builder models.
      if (name != "leaf_module" && !granularity) ignored.push_back(key);
    } else if (value.is_string() && value.get<std::string>() == "auto") {
      apply_auto(scenario, *dotted, key, file, fill_auto, origins);
    } else {
      const KeySpec& spec = *find_spec(*dotted);
      const Setting setting = spec.name == "offload_param"
                                  ? ds_offload(value, file)
                                  : json_setting(value, file, key, expected_of(spec.kind));
      spec.apply(scenario, setting, key);
      origins[*dotted] = file;
    }
  }
}

}  // namespace

void apply_ds_config(Scenario& scenario, const Setting& s, Origins& origins, DsBatch& batch,
                     const std::string& version, bool hf_trainer) {
  const fs::path path = resolve(s, "zero.ds_config");
  const std::string file = path.string();
  // An accelerate config (FILE.yaml, issue 35): the ds_config accelerate launches with, and its
  // cluster. Its notes name the YAML; zero.ds_config stays the file the user gave.
  std::optional<AccelerateConfig> launch;
  if (is_accelerate_config_path(file)) {
    launch = read_accelerate_config(file, s.where, "zero.ds_config");
  }
  const json config = launch ? launch->ds_config : read_json(s, "zero.ds_config", path);
  // Accelerator.prepare fills the hidden-size "auto" keys as the HF Trainer does
  // (accelerate v1.14.0 accelerator.py lines 2289-2320).
  const bool fill_auto = hf_trainer || launch.has_value();
  if (launch) apply_launch(scenario, *launch, file, origins);
  if (hf_trainer) apply_hf_trainer_optimizer(scenario, config, file, origins);
  std::vector<std::string> ignored = ignored_top_level_keys(config);
  batch.file = file;
  scenario.zero.ds_config = file;
  read_ds_batch(scenario, batch, config, file);
  apply_ds_precision(scenario, config, file, origins);
  apply_ds_clipping(scenario, config, file, origins);
  const json zero = config.value("zero_optimization", json::object());
  if (!zero.is_object()) {
    throw InputError(file, "zero_optimization", "expected an object, got " + shown_json(zero));
  }
  apply_zero_optimization(scenario, zero, file, version, fill_auto, origins, ignored);
  if (!ignored.empty()) {
    scenario.notes.push_back(
        fmt::format("ds_config {}: ignored (not modelled): {}", file, joined(ignored)));
  }
  if (!zero.contains("stage")) {
    // get_zero_config builds DeepSpeedZeroConfig from zero_optimization (or {} without it), and
    // its stage defaults to 0 (deepspeed/runtime/zero/config.py, v0.13.4 lines 63-70 and 87).
    scenario.zero.stage = 0;
    origins["zero.stage"] = file;
    scenario.notes.push_back(fmt::format(
        "ds_config {}: no zero_optimization.stage: DeepSpeed's default, stage 0 (ZeRO off)", file));
  }
}

/** DeepSpeed's batch rule (runtime/config.py, v0.13.4 lines 914-974): of train_batch_size,
 *  train_micro_batch_size_per_gpu and gradient_accumulation_steps, the missing ones follow from
 *  the others and the world size (accumulation 1 when only one is given), and the three must
 *  satisfy train = micro x accumulation x world. Sets training.micro_batch and grad_accum unless
 *  the scenario or --set gave them (a note when those differ from the ds_config's). */
void reconcile_batch(Scenario& sc, const DsBatch& b, const Origins& origins) {
  if (!b.train_batch && !b.micro) {
    if (b.auto_keys.empty()) {
      sc.notes.push_back(fmt::format(
          "ds_config {}: neither train_batch_size nor train_micro_batch_size_per_gpu is given "
          "(DeepSpeed asserts one is): training.micro_batch stays {}",
          b.file, sc.training.micro_batch));
    }
    if (!b.accum) return;
  }
  const std::int64_t world = sc.cluster.world_size();
  std::int64_t micro = b.micro.value_or(sc.training.micro_batch);
  // "auto" accumulation is the Trainer's argument, which the scenario stands for.
  const bool accum_auto = std::find(b.auto_keys.begin(), b.auto_keys.end(),
                                    "gradient_accumulation_steps") != b.auto_keys.end();
  std::int64_t accum = b.accum.value_or(accum_auto ? sc.training.grad_accum : 1);
  if (b.train_batch) {
    // The missing ones by DeepSpeed's integer divisions, then its assertion
    // train == micro x accum x world (checked by division: the product could overflow).
    const std::int64_t train = *b.train_batch;
    if (b.micro && !b.accum) accum = train / micro / world;
    if (!b.micro) micro = train / world / accum;
    const bool holds = micro >= 1 && accum >= 1 && train % world == 0 &&
                       (train / world) % accum == 0 && train / world / accum == micro;
    if (!holds) {
      // Name a derived factor as derived: a file without the key reads "0" otherwise.
      const std::string accum_of =
          b.accum ? std::to_string(accum)
                  : fmt::format("{} (not in the file: {} // ({} x {}), as DeepSpeed derives it)",
                                accum, train, micro, world);
      const std::string micro_of =
          b.micro ? std::to_string(micro)
                  : fmt::format("{} (not in the file: {} // {} // {}, as DeepSpeed derives it)",
                                micro, train, world, accum);
      throw InputError(
          b.file, "train_batch_size",
          fmt::format("{} != train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} "
                      "x world size {} (DeepSpeed refuses this; allowed: the product)",
                      train, micro_of, accum_of, world));
    }
  }
  auto take = [&](int& field, std::int64_t value, const std::string& key, const char* name) {
    if (origins.count(key) != 0) {
      if (field != value) {
        sc.notes.push_back(fmt::format("{} = {} from {} overrides the ds_config's {} {}", key,
                                       field, origins.at(key), name, value));
      }
      return;
    }
    field = static_cast<int>(std::min<std::int64_t>(value, std::numeric_limits<int>::max()));
  };
  take(sc.training.micro_batch, micro, "training.micro_batch", "train_micro_batch_size_per_gpu");
  take(sc.training.grad_accum, accum, "training.grad_accum", "gradient_accumulation_steps");
}

}  // namespace hpz::scenario_detail
