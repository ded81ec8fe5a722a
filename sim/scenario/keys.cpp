// The keys: one table, the single source of the names a scenario accepts, each with the setter
// that reads its value into the Scenario; and the errors for a name that is not in it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/scenario/detail.hpp"
#include "sim/text.hpp"

namespace hpz::scenario_detail {

const std::vector<std::string> kDtypeNames = {"bf16", "fp16", "fp32"};

namespace {

std::uint64_t seed_of(const Setting& s, const std::string& key) {
  const std::int64_t value = int64_of(s, key);
  if (value < 0) {
    throw InputError(s.where, key, fmt::format("must be a non-negative integer, got {}", value));
  }
  return static_cast<std::uint64_t>(value);
}

const std::vector<std::string> kVariantNames = {"stock", "host-sync", "event-wait"};
const std::vector<std::string> kFillNames = {"nan", "stale", "zero"};
const std::vector<std::string> kLoadNames = {"none", "pretrained", "checkpoint"};
const std::vector<std::string> kParamGroupNames = {"model", "hf-trainer"};
const std::vector<std::string> kStepStreamNames = {"default", "side"};
/** run.skipped_steps (parse_step_list). */
std::vector<int> step_list_of(const Setting& s, const std::string& key) {
  return parse_step_list(string_of(s, key), s.where, key);
}

/** A torch version as numbers ("2.10", "2.10.0"; a local suffix such as "+cu130" dropped). */
std::string torch_version_of(const Setting& s, const std::string& key) {
  std::string value = string_of(s, key);
  value = value.substr(0, value.find('+'));
  const bool numbers = !value.empty() && value.front() != '.' && value.back() != '.' &&
                       value.find("..") == std::string::npos &&
                       value.find_first_not_of("0123456789.") == std::string::npos &&
                       value.size() <= 16;
  if (!numbers) {
    throw InputError(s.where, key,
                     fmt::format("'{}' is not a torch version (allowed: numbers such as 2.1.2 or "
                                 "2.10.0)",
                                 shown(string_of(s, key))));
  }
  return value;
}

/** A DeepSpeed release (sim/deepspeed_releases.hpp) or "latest", as the release it names. Whether
 *  the builder models it is the builder's to say (it names the rule it lacks). */
std::string deepspeed_release_of(const Setting& s, const std::string& key) {
  const std::string value = string_of(s, key);
  const std::string release = canonical_deepspeed_version(value);
  if (is_deepspeed_release(release)) return release;
  std::vector<std::string> names;
  for (const DeepSpeedRelease& r : deepspeed_releases()) names.emplace_back(r.version);
  throw InputError(
      s.where, key,
      fmt::format("unknown value '{}'{} (allowed: a DeepSpeed release from {} to {}, "
                  "or latest)",
                  shown(value), did_you_mean(closest(value, names)), names.front(), names.back()));
}

// The transformers releases whose module trees sim/deepspeed/ walks (the recorder's
// requirements: tools/recorder/requirements/base.txt and transformers-*.txt).
const std::vector<std::string> kTransformersVersions = {"auto", "4.35.2", "4.51.3", "4.57.1",
                                                        "5.24.0"};
const std::vector<std::string> kCollectiveModelNames = {"fine", "coarse"};
const std::vector<std::string> kNetworkModelNames = {"CM02", "LV08"};

#define HPZ_SET(field, conversion) \
  [](Scenario& sc, const Setting& v, const std::string& k) { sc.field = conversion(v, k); }

/** [cluster]. */
std::vector<KeySpec> cluster_keys() {
  return {
      {"cluster", "nodes", Kind::kInteger, HPZ_SET(cluster.nodes, int_of)},
      {"cluster", "gpus_per_node", Kind::kInteger, HPZ_SET(cluster.gpus_per_node, int_of)},
      {"cluster", "gpu", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.cluster.gpu = gpu_preset(choice_of(v, k, gpu_preset_names()));
       }},
      {"cluster", "nvlink_gbytes_per_s", Kind::kNumber,
       HPZ_SET(cluster.nvlink_gbytes_per_s, double_of)},
      {"cluster", "nvlink_latency_us", Kind::kNumber,
       HPZ_SET(cluster.nvlink_latency_us, double_of)},
      {"cluster", "nic_gbps", Kind::kNumber, HPZ_SET(cluster.nic_gbps, double_of)},
      {"cluster", "nics_per_node", Kind::kInteger, HPZ_SET(cluster.nics_per_node, int_of)},
      {"cluster", "internode_latency_us", Kind::kNumber,
       HPZ_SET(cluster.internode_latency_us, double_of)},
  };
}

/** [model]. */
std::vector<KeySpec> model_keys() {
  return {
      {"model", "preset", Kind::kText, nullptr},
      {"model", "hf_config", Kind::kText, nullptr},
      {"model", "layers", Kind::kInteger, HPZ_SET(model.layers, int_of)},
      {"model", "hidden", Kind::kInteger, HPZ_SET(model.hidden, int_of)},
      {"model", "ffn", Kind::kInteger, HPZ_SET(model.ffn, int_of)},
      {"model", "heads", Kind::kInteger, HPZ_SET(model.heads, int_of)},
      {"model", "kv_heads", Kind::kInteger, HPZ_SET(model.kv_heads, int_of)},
      {"model", "vocab", Kind::kInteger, HPZ_SET(model.vocab, int_of)},
      {"model", "gated_mlp", Kind::kBool, HPZ_SET(model.gated_mlp, bool_of)},
      {"model", "transformers_version", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.model.transformers_version = choice_of(v, k, kTransformersVersions);
       }},
  };
}

/** [training]. */
std::vector<KeySpec> training_keys() {
  return {
      {"training", "seq_len", Kind::kInteger, HPZ_SET(training.seq_len, int_of)},
      {"training", "micro_batch", Kind::kInteger, HPZ_SET(training.micro_batch, int_of)},
      {"training", "grad_accum", Kind::kInteger, HPZ_SET(training.grad_accum, int_of)},
      {"training", "grad_checkpointing", Kind::kBool,
       HPZ_SET(training.grad_checkpointing, bool_of)},
      {"training", "hf_trainer", Kind::kBool, HPZ_SET(training.hf_trainer, bool_of)},
      {"training", "param_groups", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.training.param_groups = choice_of(v, k, kParamGroupNames);
       }},
      {"training", "gradient_clipping", Kind::kNumber,
       HPZ_SET(training.gradient_clipping, double_of)},
      {"training", "dtype", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.training.dtype = choice_of(v, k, kDtypeNames);
       }},
  };
}

/** [zero], but deepspeed_version (run_keys). */
std::vector<KeySpec> zero_keys() {
  return {
      {"zero", "ds_config", Kind::kText, nullptr},
      {"zero", "stage", Kind::kInteger, HPZ_SET(zero.stage, int_of)},
      {"zero", "zero_hpz_partition_size", Kind::kInteger,
       HPZ_SET(zero.zero_hpz_partition_size, int_of)},
      {"zero", "zero_quantized_weights", Kind::kBool,
       HPZ_SET(zero.zero_quantized_weights, bool_of)},
      {"zero", "zero_quantized_gradients", Kind::kBool,
       HPZ_SET(zero.zero_quantized_gradients, bool_of)},
      {"zero", "overlap_comm", Kind::kBool, HPZ_SET(zero.overlap_comm, bool_of)},
      {"zero", "stage3_prefetch_bucket_size", Kind::kInteger,
       HPZ_SET(zero.stage3_prefetch_bucket_size, int64_of)},
      {"zero", "stage3_max_live_parameters", Kind::kInteger,
       HPZ_SET(zero.stage3_max_live_parameters, int64_of)},
      {"zero", "stage3_max_reuse_distance", Kind::kInteger,
       HPZ_SET(zero.stage3_max_reuse_distance, int64_of)},
      {"zero", "stage3_param_persistence_threshold", Kind::kInteger,
       HPZ_SET(zero.stage3_param_persistence_threshold, int64_of)},
      {"zero", "reduce_bucket_size", Kind::kInteger, HPZ_SET(zero.reduce_bucket_size, int64_of)},
      {"zero", "sub_group_size", Kind::kInteger, HPZ_SET(zero.sub_group_size, int64_of)},
      {"zero", "offload_param", Kind::kBool, HPZ_SET(zero.offload_param, bool_of)},
  };
}

/** run.builder: "deepspeed", the one builder, is accepted and changes nothing; the coarse
 *  builder was retired (issue 31). */
void builder_of(Scenario&, const Setting& s, const std::string& key) {
  const std::string name = string_of(s, key);
  if (name == "coarse") {
    throw InputError(s.where, key,
                     "the coarse builder was retired: every schedule is DeepSpeed's (allowed: "
                     "\"deepspeed\", or no run.builder)");
  }
  choice_of(s, key, {"deepspeed"});
}

/** The [bugs] keys the coarse builder re-created, now DeepSpeed's own releases' or a run key:
 *  refused whatever their value, naming what to set instead. */
[[noreturn]] void retired_bug(const Setting& s, const std::string& key, const char* why,
                              const char* instead) {
  throw InputError(s.where, key,
                   fmt::format("retired with the coarse builder: {} ({})", why, instead));
}
void retired_4851(Scenario&, const Setting& s, const std::string& key) {
  retired_bug(s, key, "DeepSpeed issue 4851 is 0.13.1's own",
              "remove it and set zero.deepspeed_version = \"0.13.1\"");
}
void retired_7606(Scenario&, const Setting& s, const std::string& key) {
  retired_bug(s, key, "issue 7606's load is run.load",
              "remove it and set run.load = \"checkpoint\"");
}
void retired_copy_bounds(Scenario&, const Setting& s, const std::string& key) {
  retired_bug(s, key, "the copy bounds before PR 5216 are DeepSpeed 0.13.4's own",
              "remove it and set zero.deepspeed_version = \"0.13.4\"");
}

/** [run], and zero.deepspeed_version after run.builder: the table's order is the order keys
 *  are applied in and suggested from, so it stays where it always was. */
std::vector<KeySpec> run_keys() {
  return {
      {"run", "variant", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         const std::string name = choice_of(v, k, kVariantNames);
         sc.run.variant = name == "stock"       ? Variant::kStock
                          : name == "host-sync" ? Variant::kHostSync
                                                : Variant::kEventWait;
       }},
      {"run", "builder", Kind::kText, builder_of},
      {"zero", "deepspeed_version", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.zero.deepspeed_version = deepspeed_release_of(v, k);
       }},
      {"run", "fill", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         const std::string name = choice_of(v, k, kFillNames);
         sc.run.fill = name == "nan" ? Fill::kNan : name == "stale" ? Fill::kStale : Fill::kZero;
       }},
      {"run", "seed", Kind::kInteger, HPZ_SET(run.seed, seed_of)},
      {"run", "steps", Kind::kInteger, HPZ_SET(run.steps, int_of)},
      {"run", "spin_before_copy_us", Kind::kNumber, HPZ_SET(run.spin_before_copy_us, double_of)},
      {"run", "torch_version", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.run.torch_version = torch_version_of(v, k);
       }},
      {"run", "load", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.run.load = choice_of(v, k, kLoadNames);
       }},
      {"run", "step_stream", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.run.step_stream = choice_of(v, k, kStepStreamNames);
       }},
      {"run", "skipped_steps", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.run.skipped_steps = step_list_of(v, k);
       }},
  };
}

/** [bugs]. */
std::vector<KeySpec> bugs_keys() {
  return {
      {"bugs", "skip_secondary_invalidation", Kind::kBool, retired_4851},
      {"bugs", "checkpoint_load_at_step", Kind::kInteger, retired_7606},
      {"bugs", "legacy_copy_bounds", Kind::kBool, retired_copy_bounds},
      {"bugs", "secondary_mismatch_rank", Kind::kInteger,
       HPZ_SET(bugs.secondary_mismatch_rank, int_of)},
  };
}

/** [sim]. */
std::vector<KeySpec> sim_keys() {
  return {
      {"sim", "compute_efficiency", Kind::kNumber, HPZ_SET(sim.compute_efficiency, double_of)},
      {"sim", "memory_efficiency", Kind::kNumber, HPZ_SET(sim.memory_efficiency, double_of)},
      {"sim", "launch_overhead_us", Kind::kNumber, HPZ_SET(sim.launch_overhead_us, double_of)},
      {"sim", "kernel_latency_us", Kind::kNumber, HPZ_SET(sim.kernel_latency_us, double_of)},
      {"sim", "pcie_gbytes_per_s", Kind::kNumber, HPZ_SET(sim.pcie_gbytes_per_s, double_of)},
      {"sim", "jitter", Kind::kNumber, HPZ_SET(sim.jitter, double_of)},
      {"sim", "collective_model", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.sim.collective_model = choice_of(v, k, kCollectiveModelNames);
       }},
      {"sim", "network_model", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.sim.network_model = choice_of(v, k, kNetworkModelNames);
       }},
      {"sim", "bandwidth_factor", Kind::kNumber, HPZ_SET(sim.bandwidth_factor, double_of)},
      {"sim", "latency_factor", Kind::kNumber, HPZ_SET(sim.latency_factor, double_of)},
  };
}

#undef HPZ_SET

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"cluster", "model", "training", "zero",
                                                 "run",     "bugs",  "sim"};
  return names;
}

std::vector<std::string> key_names(const std::string& section) {
  std::vector<std::string> names;
  for (const KeySpec& spec : key_specs()) {
    if (spec.section == section) names.push_back(spec.name);
  }
  return names;
}

/** A likely intended key for an unknown `section.name` (or a bare `name`). */
std::optional<std::string> suggest_key(const std::string& section, const std::string& name) {
  if (auto in_section = closest(name, key_names(section))) return section + "." + *in_section;
  for (const KeySpec& spec : key_specs()) {
    if (spec.name == name) return spec.dotted();
  }
  std::vector<std::string> all;
  for (const KeySpec& spec : key_specs()) all.push_back(spec.dotted());
  return closest(section.empty() ? name : section + "." + name, all);
}

}  // namespace

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = [] {
    std::vector<KeySpec> all;
    for (const std::vector<KeySpec>& section : {cluster_keys(), model_keys(), training_keys(),
                                                zero_keys(), run_keys(), bugs_keys(), sim_keys()}) {
      all.insert(all.end(), section.begin(), section.end());
    }
    return all;
  }();
  return specs;
}

const KeySpec* find_spec(const std::string& dotted) {
  for (const KeySpec& spec : key_specs()) {
    if (spec.dotted() == dotted) return &spec;
  }
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& section,
                              const std::string& name) {
  const bool known_section =
      std::find(section_names().begin(), section_names().end(), section) != section_names().end();
  const std::string key = section.empty() ? name : section + "." + name;
  const std::string hint = did_you_mean(suggest_key(section, name));
  if (section.empty()) {
    throw InputError(
        where, key,
        "a key must belong to a section" + hint + " (sections: " + joined(section_names()) + ")");
  }
  if (!known_section) {
    throw InputError(where, key,
                     "unknown section '" + shown(section) + "'" + hint + allowed(section_names()));
  }
  throw InputError(
      where, key,
      "unknown key" + hint + " (allowed in [" + section + "]: " + joined(key_names(section)) + ")");
}

const char* expected_of(Kind kind) {
  switch (kind) {
    case Kind::kBool:
      return "a boolean (true or false)";
    case Kind::kInteger:
      return "an integer";
    case Kind::kNumber:
      return "a number";
    case Kind::kText:
      return "a string";
  }
  return "a value";
}

}  // namespace hpz::scenario_detail
