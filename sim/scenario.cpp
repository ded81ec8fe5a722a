// Loading a scenario: TOML file -> settings (last assignment of each key wins, --set after the
// file) -> Scenario (model source and ds_config first, then explicit keys) -> validate().
#include "sim/scenario.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <variant>

#include "sim/accelerate_config.hpp"
#include "sim/deepspeed_releases.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/model_shape.hpp"
#include "sim/text.hpp"

namespace hpz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kSetWhere = "--set";

// ---------------------------------------------------------------------------------------------
// Names, allowed lists and "did you mean".

std::string allowed(const std::vector<std::string>& names) {
  return " (allowed: " + joined(names) + ")";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> previous(b.size() + 1);
  std::vector<std::size_t> current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

/** The known name closest to `name`, if it is close enough to be a plausible typo. */
std::optional<std::string> closest(const std::string& name, const std::vector<std::string>& known) {
  if (name.size() > 200) return std::nullopt;  // no name is that long; spares the distances
  // A unique completion ('h100' -> 'h100-sxm') beats a closer but different name ('h200').
  std::vector<std::string> completions;
  for (const std::string& candidate : known) {
    if (name.size() >= 2 && candidate.starts_with(name)) completions.push_back(candidate);
  }
  if (completions.size() == 1) return completions.front();
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(2, name.size() / 3) + 1;
  for (const std::string& candidate : known) {
    const std::size_t distance = edit_distance(name, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string did_you_mean(const std::optional<std::string>& suggestion) {
  return suggestion ? "; did you mean '" + *suggestion + "'?" : "";
}

// ---------------------------------------------------------------------------------------------
// Values and where they came from.

/** A value as written: TOML, JSON and --set values all become one of these. */
using Raw = std::variant<bool, std::int64_t, double, std::string>;

/** One assignment of a key. */
struct Setting {
  Raw raw;
  std::string where;  ///< the file it was read from, "--set", or the flag that set it
  fs::path base_dir;  ///< relative paths in the value are resolved against it
};

/** Whether a setting came from the command line (--set or a flag of its own, all "--..."),
 *  which wins over the scenario file. */
bool from_command_line(const Setting& s) {
  return s.where.rfind("--", 0) == 0;
}

std::string describe(const Raw& raw) {
  if (const bool* b = std::get_if<bool>(&raw)) return *b ? "true" : "false";
  if (const std::int64_t* i = std::get_if<std::int64_t>(&raw)) return std::to_string(*i);
  if (const double* d = std::get_if<double>(&raw)) return fmt::format("{}", *d);
  return "'" + shown(std::get<std::string>(raw)) + "'";
}

[[noreturn]] void wrong_type(const Setting& s, const std::string& key, const char* expected) {
  throw InputError(s.where, key, fmt::format("expected {}, got {}", expected, describe(s.raw)));
}

bool bool_of(const Setting& s, const std::string& key) {
  if (const bool* b = std::get_if<bool>(&s.raw)) return *b;
  wrong_type(s, key, "a boolean (true or false)");
}

std::int64_t int64_of(const Setting& s, const std::string& key) {
  if (const std::int64_t* i = std::get_if<std::int64_t>(&s.raw)) return *i;
  if (const double* d = std::get_if<double>(&s.raw)) {
    // 5e7 is a float in TOML; accept it where it is a whole number that fits.
    if (std::isfinite(*d) && std::trunc(*d) == *d && std::fabs(*d) < 9.2e18) {
      return static_cast<std::int64_t>(*d);
    }
    wrong_type(s, key, "an integer (a whole number)");
  }
  wrong_type(s, key, "an integer");
}

int int_of(const Setting& s, const std::string& key) {
  const std::int64_t value = int64_of(s, key);
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    throw InputError(
        s.where, key,
        fmt::format("{} is out of range (at most {})", value, std::numeric_limits<int>::max()));
  }
  return static_cast<int>(value);
}

std::uint64_t seed_of(const Setting& s, const std::string& key) {
  const std::int64_t value = int64_of(s, key);
  if (value < 0) {
    throw InputError(s.where, key, fmt::format("must be a non-negative integer, got {}", value));
  }
  return static_cast<std::uint64_t>(value);
}

double double_of(const Setting& s, const std::string& key) {
  if (const double* d = std::get_if<double>(&s.raw)) return *d;
  if (const std::int64_t* i = std::get_if<std::int64_t>(&s.raw)) return static_cast<double>(*i);
  wrong_type(s, key, "a number");
}

std::string string_of(const Setting& s, const std::string& key) {
  if (const std::string* text = std::get_if<std::string>(&s.raw)) return *text;
  wrong_type(s, key, "a string");
}

std::string choice_of(const Setting& s, const std::string& key,
                      const std::vector<std::string>& choices) {
  const std::string value = string_of(s, key);
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return value;
  throw InputError(s.where, key,
                   "unknown value '" + shown(value) + "'" + did_you_mean(closest(value, choices)) +
                       allowed(choices));
}

const std::vector<std::string> kVariantNames = {"stock", "host-sync", "event-wait"};
const std::vector<std::string> kFillNames = {"nan", "stale", "zero"};
const std::vector<std::string> kBuilderNames = {"coarse", "deepspeed"};
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

// The transformers releases whose module trees sim/deepspeed_builder.cpp walks (the recorder's
// requirements: tools/recorder/requirements/base.txt and transformers-*.txt).
const std::vector<std::string> kTransformersVersions = {"auto", "4.35.2", "4.51.3", "4.57.1",
                                                        "5.24.0"};
const std::vector<std::string> kDtypeNames = {"bf16", "fp16", "fp32"};
const std::vector<std::string> kCollectiveModelNames = {"fine", "coarse"};
const std::vector<std::string> kNetworkModelNames = {"CM02", "LV08"};

// ---------------------------------------------------------------------------------------------
// The keys: one table, the single source of the names a scenario accepts.

/** How a --set value is read, and what a wrong-typed value is reported as. */
enum class Kind { kBool, kInteger, kNumber, kText };

using Apply = void (*)(Scenario&, const Setting&, const std::string& key);

/** One key of the format; `apply` is null for the keys that select a source (preset, files). */
struct KeySpec {
  std::string section;
  std::string name;
  Kind kind;
  Apply apply;

  std::string dotted() const { return section + "." + name; }
};

#define HPZ_SET(field, conversion) \
  [](Scenario& sc, const Setting& v, const std::string& k) { sc.field = conversion(v, k); }

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
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
      {"run", "variant", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         const std::string name = choice_of(v, k, kVariantNames);
         sc.run.variant = name == "stock"       ? Variant::kStock
                          : name == "host-sync" ? Variant::kHostSync
                                                : Variant::kEventWait;
       }},
      {"run", "builder", Kind::kText,
       [](Scenario& sc, const Setting& v, const std::string& k) {
         sc.run.builder = choice_of(v, k, kBuilderNames);
       }},
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
      {"bugs", "skip_secondary_invalidation", Kind::kBool,
       HPZ_SET(bugs.skip_secondary_invalidation, bool_of)},
      {"bugs", "checkpoint_load_at_step", Kind::kInteger,
       HPZ_SET(bugs.checkpoint_load_at_step, int_of)},
      {"bugs", "legacy_copy_bounds", Kind::kBool, HPZ_SET(bugs.legacy_copy_bounds, bool_of)},
      {"bugs", "secondary_mismatch_rank", Kind::kInteger,
       HPZ_SET(bugs.secondary_mismatch_rank, int_of)},
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
  return specs;
}

#undef HPZ_SET

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> names = {"cluster", "model", "training", "zero",
                                                 "run",     "bugs",  "sim"};
  return names;
}

const KeySpec* find_spec(const std::string& dotted) {
  for (const KeySpec& spec : key_specs()) {
    if (spec.dotted() == dotted) return &spec;
  }
  return nullptr;
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

// ---------------------------------------------------------------------------------------------
// Reading files.

using Settings = std::map<std::string, Setting>;

/** Which file (or --set) last gave each key its value, for validation messages. */
using Origins = std::map<std::string, std::string>;

fs::path resolve(const Setting& s, const std::string& key) {
  const fs::path value = string_of(s, key);
  if (value.empty()) throw InputError(s.where, key, "expected a file path, got ''");
  return (s.base_dir / value).lexically_normal();
}

/** Reads the JSON file named by setting `s` of `key`; errors name the file. */
json read_json(const Setting& s, const std::string& key, const fs::path& path) {
  const std::string text =
      read_input_file(path.string(), s.where, key, "cannot read '" + shown(path.string()) + "'");
  json document = parse_json_input(text, path.string(), "malformed JSON read for " + key);
  if (!document.is_object()) {
    throw InputError(path.string(), "", "expected a JSON object (read for " + key + ")");
  }
  return document;
}

/** A JSON value as a Raw, so that JSON keys convert like TOML and --set ones. */
std::optional<Raw> raw_of(const json& value) {
  if (value.is_boolean()) return Raw{value.get<bool>()};
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
      return Raw{value.get<double>()};
    }
    return Raw{value.get<std::int64_t>()};
  }
  if (value.is_number_float()) return Raw{value.get<double>()};
  if (value.is_string()) return Raw{value.get<std::string>()};
  return std::nullopt;
}

Setting json_setting(const json& value, const std::string& file, const std::string& key,
                     const char* expected) {
  std::optional<Raw> raw = raw_of(value);
  if (!raw)
    throw InputError(file, key, fmt::format("expected {}, got {}", expected, shown_json(value)));
  return Setting{*raw, file, {}};
}

// ---------------------------------------------------------------------------------------------
// model.hf_config

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

/** A model from a Hugging Face config.json, as transformers builds it for its model_type (the
 *  modeling_*.py of each family; parameter counts checked against transformers for 20 public
 *  configs in tests/data/hf). A model_type not understood is refused, never read as a Llama. */
ModelConfig read_hf_config(const Setting& s) {
  const fs::path path = resolve(s, "model.hf_config");
  const json config = read_json(s, "model.hf_config", path);
  const std::string file = path.string();
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
  const bool falcon = type == "falcon" || type == "RefinedWeb" || type == "RefinedWebModel";
  ModelConfig model;
  model.name = file;
  model.hf_config = file;
  model.family = falcon ? "falcon" : type;
  // GPT-2 spells the dimensions n_embd / n_layer / n_head; Falcon's older configs n_layer /
  // n_head / n_head_kv.
  model.layers = hf_required(config, file, {"num_hidden_layers", "n_layer"});
  model.hidden = hf_required(config, file, {"hidden_size", "n_embd"});
  model.heads = hf_required(config, file, {"num_attention_heads", "n_head"});
  model.vocab = hf_required(config, file, {"vocab_size"});
  const bool four_h = falcon || type == "gpt2";  // ffn_hidden_size / n_inner: None = 4 x hidden
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
    model.shared_expert_ffn =
        hf_int_or_null(config, file, "n_shared_experts", 2) * model.expert_ffn;
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
  return model;
}

// ---------------------------------------------------------------------------------------------
// zero.ds_config

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

/** A ds_config's batch keys, reconciled once the world size is known (reconcile_batch). */
struct DsBatch {
  std::string file;
  std::optional<std::int64_t> train_batch;  ///< train_batch_size
  std::optional<std::int64_t> micro;        ///< train_micro_batch_size_per_gpu
  std::optional<std::int64_t> accum;        ///< gradient_accumulation_steps
  std::vector<std::string> auto_keys;       ///< those of the three given as "auto"
};

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
  if (launch) {
    scenario.notes.insert(scenario.notes.end(), launch->notes.begin(), launch->notes.end());
    if (launch->num_processes) {
      // num_processes is the total; read_accelerate_config refused a pair that does not divide.
      // Origins name the YAML, so --nodes / --gpus-per-node / --set override it with a note and
      // a scenario file's cluster keys give way to it as to any file the user names.
      scenario.cluster.nodes = launch->num_machines.value_or(1);
      scenario.cluster.gpus_per_node = *launch->num_processes / scenario.cluster.nodes;
      origins["cluster.nodes"] = file;
      origins["cluster.gpus_per_node"] = file;
    }
  }
  if (hf_trainer) {
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
  batch.file = file;
  scenario.zero.ds_config = file;
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
  apply_ds_precision(scenario, config, file, origins);
  apply_ds_clipping(scenario, config, file, origins);
  const json zero = config.value("zero_optimization", json::object());
  if (!zero.is_object()) {
    throw InputError(file, "zero_optimization", "expected an object, got " + shown_json(zero));
  }
  std::map<std::string, std::string> spelled;  // dotted key -> the name it was given by
  const std::vector<std::string> known = deepspeed_zero_keys(version);
  for (const auto& [name, value] : zero.items()) {
    const std::string key = "zero_optimization." + name;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      if (const std::string other = release_defining_key(name); !other.empty()) {
        // A key of another release: that DeepSpeed refuses this ds_config, as a release (a
        // matrix of releases shows it on this release's line and goes on).
        throw ReleaseRefusal(file, key,
                             fmt::format("DeepSpeed {} refuses it (its DeepSpeedZeroConfig "
                                         "forbids keys it does not define; {} defines it)",
                                         version, other));
      }
      const std::optional<std::string> near = closest(name, known);
      throw InputError(file, key,
                       fmt::format("unknown key: DeepSpeed {} refuses it (its DeepSpeedZeroConfig "
                                   "forbids keys it does not define){} (allowed: {})",
                                   version, near ? fmt::format("; did you mean '{}'?", *near) : "",
                                   joined(known)));
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
    const bool granularity =
        name == "stage3_module_granularity_threshold" || name == "module_granularity_threshold";
    if (granularity && !(value.is_number() && value.get<double>() <= 0)) {
      // A positive threshold makes the modules below it z3 leaves with fast sharding
      // (parameter_offload.py:157-163 at v0.18.2), which hpzlab does not model.
      throw InputError(file, key,
                       fmt::format("{}: z3 leaf modules by granularity (fast sharding) are not "
                                   "modelled by hpzlab (allowed: 0, DeepSpeed's default, or leave "
                                   "it out)",
                                   shown_json(value)));
    }
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

// ---------------------------------------------------------------------------------------------
// From settings to a Scenario.

const Setting* find_setting(const Settings& settings, const std::string& key) {
  const auto it = settings.find(key);
  return it == settings.end() ? nullptr : &it->second;
}

/** The model before its explicit keys: a preset, a Hugging Face config, or nothing (custom). */
void apply_model_source(Scenario& scenario, Settings& settings, Origins& origins) {
  const Setting* preset = find_setting(settings, "model.preset");
  const Setting* hf = find_setting(settings, "model.hf_config");
  if (preset && hf) {
    // A --set of one source replaces the other source given in the file.
    if (from_command_line(*preset) && !from_command_line(*hf)) {
      settings.erase("model.hf_config");
      hf = nullptr;
    } else if (from_command_line(*hf) && !from_command_line(*preset)) {
      settings.erase("model.preset");
      preset = nullptr;
    } else {
      throw InputError(hf->where, "model.hf_config",
                       "give either model.preset or model.hf_config, not both");
    }
  }
  if (preset) {
    scenario.model = model_preset(choice_of(*preset, "model.preset", model_preset_names()));
  } else if (hf) {
    scenario.model = read_hf_config(*hf);
    const ModelConfig& m = scenario.model;
    std::string details = m.tied_embeddings ? ", output layer tied to the embedding" : "";
    if (m.experts > 0) {
      details += fmt::format(
          ", {} experts of width {} ({} a token){}", m.experts, m.expert_ffn, m.experts_per_token,
          m.dense_layers > 0 ? fmt::format(" after {} dense layer(s)", m.dense_layers) : "");
    }
    scenario.notes.push_back(fmt::format(
        "model.hf_config {}: model_type {}, {} layers, hidden {}, {} parameters{}", m.hf_config,
        m.family, m.layers, m.hidden, static_cast<std::uint64_t>(parameter_count(m)), details));
  } else {
    std::vector<std::string> missing;
    for (const char* name : {"layers", "hidden", "ffn", "heads", "vocab"}) {
      if (!find_setting(settings, std::string("model.") + name)) missing.push_back(name);
    }
    if (!missing.empty()) {
      throw InputError(scenario.path, "model." + missing.front(),
                       "missing: " + joined(missing) +
                           " (without model.preset or model.hf_config, all of layers, hidden, "
                           "ffn, heads and vocab are required; presets: " +
                           joined(model_preset_names()) + ")");
    }
    scenario.model.name = "custom";
    const Setting* heads = find_setting(settings, "model.heads");
    if (!find_setting(settings, "model.kv_heads")) {
      scenario.model.kv_heads = int_of(*heads, "model.heads");
      origins["model.kv_heads"] = heads->where;
    }
    return;
  }
  // A value read from an HF config is that file's: its range errors name it, not the scenario
  // that points to it (model.name is the config's path).
  const std::string source = preset ? preset->where : scenario.model.name;
  for (const char* name : {"layers", "hidden", "ffn", "heads", "kv_heads", "vocab"}) {
    origins[std::string("model.") + name] = source;
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

Scenario build(const std::string& path, Settings& settings, Origins& origins) {
  Scenario scenario;
  scenario.path = path;
  scenario.cluster.gpu = gpu_preset("a100-80g");
  apply_model_source(scenario, settings, origins);
  DsBatch batch;
  if (const Setting* ds = find_setting(settings, "zero.ds_config")) {
    // The version whose config rules apply: the scenario's or --set's, else the default. An
    // unknown one is reported when its key is applied below; here the default's rules apply.
    std::string version = ZeroConfig{}.deepspeed_version;
    if (const Setting* v = find_setting(settings, "zero.deepspeed_version")) {
      if (const auto* text = std::get_if<std::string>(&v->raw);
          text != nullptr && is_deepspeed_release(canonical_deepspeed_version(*text))) {
        version = canonical_deepspeed_version(*text);
      }
    }
    // Whether "auto" is filled as the HF Trainer does: the scenario's or the flag's setting.
    bool hf_trainer = false;
    if (const Setting* t = find_setting(settings, "training.hf_trainer")) {
      hf_trainer = bool_of(*t, "training.hf_trainer");
    }
    apply_ds_config(scenario, *ds, origins, batch, version, hf_trainer);
  }
  // The user's ds_config and HF config set some keys above. A key given with --set (or a flag)
  // overrides them, and says so (issue 17: nothing overridden silently). A scenario file's key
  // overrides a file the scenario itself names; a file the user named on the command line
  // (--ds-config, --hf-config, --set zero.ds_config=...) wins over the scenario file's keys,
  // which fill only what it leaves (issue 35), with a note for each key that gave way.
  const Origins from_files = origins;
  std::set<std::string> user_files;
  for (const char* key : {"zero.ds_config", "model.hf_config"}) {
    const Setting* file = find_setting(settings, key);
    if (file == nullptr || !from_command_line(*file)) continue;
    user_files.insert(key == std::string("zero.ds_config") ? scenario.zero.ds_config
                                                           : scenario.model.hf_config);
  }
  // The batch keys the ds_config sets are reconciled after this loop (reconcile_batch).
  const bool ds_sets_batch = user_files.count(scenario.zero.ds_config) != 0 &&
                             (batch.train_batch || batch.micro || batch.accum);
  for (const KeySpec& spec : key_specs()) {
    const Setting* setting = find_setting(settings, spec.dotted());
    if (!setting || !spec.apply) continue;
    if (!from_command_line(*setting)) {
      const auto file = from_files.find(spec.dotted());
      const bool batch_key =
          spec.dotted() == "training.micro_batch" || spec.dotted() == "training.grad_accum";
      // A ZeRO key the user's ds_config leaves out: the scenario's value fills it, which
      // DeepSpeed running that file would not (its default instead): said once per key.
      const bool zero_key = spec.section == "zero" && spec.dotted() != "zero.ds_config" &&
                            spec.dotted() != "zero.deepspeed_version";
      const bool file_wins = file != from_files.end() && user_files.count(file->second) != 0;
      const bool batch_wins = !file_wins && batch_key && ds_sets_batch;
      const bool fills =
          !file_wins && !batch_wins && zero_key && user_files.count(scenario.zero.ds_config) != 0;
      if (file_wins || batch_wins || fills) {
        // What the scenario's key would make of the scenario: a note only where it differs.
        Scenario probe = scenario;
        spec.apply(probe, *setting, spec.dotted());
        const auto gives_way = [&](const std::string& winner) {
          scenario.notes.push_back(fmt::format(
              "{} = {} in {} gives way to {} (your file wins over the scenario's keys; --set {}= "
              "to force it)",
              spec.dotted(), describe(setting->raw), setting->where, winner, spec.dotted()));
        };
        if (file_wins) {
          if (!(probe == scenario)) gives_way(file->second);
          continue;
        }
        if (batch_wins) {
          const std::optional<std::int64_t> given =
              spec.dotted() == "training.micro_batch" ? batch.micro : batch.accum;
          const int mine = spec.dotted() == "training.micro_batch" ? probe.training.micro_batch
                                                                   : probe.training.grad_accum;
          if (!given || *given != mine) gives_way(scenario.zero.ds_config + "'s batch keys");
          continue;
        }
        if (!(probe == scenario)) {
          scenario.notes.push_back(fmt::format(
              "{} = {} from {}: your ds_config {} does not set it, so the scenario's value fills "
              "it (DeepSpeed itself would take its default)",
              spec.dotted(), describe(setting->raw), setting->where, scenario.zero.ds_config));
        }
      }
    }
    spec.apply(scenario, *setting, spec.dotted());
    origins[spec.dotted()] = setting->where;
    if (const auto it = from_files.find(spec.dotted()); it != from_files.end()) {
      // A scenario file that names a preset and sets one of its sizes overrides the preset.
      const std::string over =
          it->second == setting->where
              ? fmt::format("model.preset's value ({} names the preset too)", setting->where)
              : fmt::format("the value {} gives", it->second);
      scenario.notes.push_back(
          fmt::format("{} from {} overrides {}", spec.dotted(), setting->where, over));
    }
  }
  if (!batch.file.empty()) reconcile_batch(scenario, batch, origins);
  ZeroConfig& z = scenario.zero;
  if (z.stage >= 0 && z.stage < 3 && z.zero_hpz_partition_size > 1) {
    // DeepSpeed builds hpZ's secondary partitions in zero.Init, which only stage 3 uses.
    scenario.notes.push_back(fmt::format(
        "zero.stage = {}: DeepSpeed uses hpZ (zero_hpz_partition_size = {}) only at ZeRO stage "
        "3; hpzlab models stage 3 only and uses stage 3 without hpZ in its place",
        z.stage, z.zero_hpz_partition_size));
    z.zero_hpz_partition_size = 1;
  }
  return scenario;
}

/** A TOML value as a Raw; nullopt for tables, arrays and dates. */
std::optional<Raw> raw_of(const toml::node& node) {
  if (const auto* b = node.as_boolean()) return Raw{b->get()};
  if (const auto* i = node.as_integer()) return Raw{i->get()};
  if (const auto* d = node.as_floating_point()) return Raw{d->get()};
  if (const auto* text = node.as_string()) return Raw{text->get()};
  return std::nullopt;
}

const char* node_kind(const toml::node& node) {
  if (node.is_table()) return "a table";
  if (node.is_array()) return "an array";
  return "a date or time";
}

/** The key assigned on line `line` (1-based) of a TOML text and its kind, when that line is
 *  `name = ...` under a `[section]` of the format: a value toml++ cannot read (1e400, 2^63)
 *  fails before the key is known to it. */
const KeySpec* key_on_line(const std::string& text, std::size_t line) {
  std::istringstream in(text);
  std::string row, section;
  for (std::size_t n = 1; std::getline(in, row) && n <= line; ++n) {
    const std::size_t first = row.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    if (row[first] == '[') {
      const std::size_t close = row.find(']', first);
      if (close != std::string::npos) section = row.substr(first + 1, close - first - 1);
      continue;
    }
    if (n < line) continue;
    const std::size_t equals = row.find('=', first);
    if (equals == std::string::npos) return nullptr;
    const std::size_t last = row.find_last_not_of(" \t", equals - 1);
    return find_spec(section + "." + row.substr(first, last - first + 1));
  }
  return nullptr;
}

toml::table parse_toml(const std::string& path) {
  const std::string text = read_input_file(path, path, "", "cannot read the scenario file");
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    const std::string where =
        fmt::format("line {}, column {}: malformed TOML: {}", e.source().begin.line,
                    e.source().begin.column, e.description());
    const KeySpec* spec = key_on_line(text, e.source().begin.line);
    if (spec == nullptr) throw InputError(path, "", where);
    // A number toml++ cannot hold: say what it can.
    const bool number = e.description().find("floating-point") != std::string_view::npos ||
                        e.description().find("integer") != std::string_view::npos;
    const char* allowed_text = !number                        ? ""
                               : spec->kind == Kind::kInteger ? " (allowed: an integer of at most "
                                                                "2^63 - 1)"
                               : spec->kind == Kind::kNumber
                                   ? " (allowed: a number a double can hold, about 1.8e308 at most)"
                                   : "";
    throw InputError(path, spec->dotted(), where + allowed_text);
  }
}

void collect_file(const std::string& path, Settings& settings) {
  const toml::table root = parse_toml(path);
  const fs::path base_dir = fs::path(path).parent_path();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table* table = section_node.as_table();
    if (!table) unknown_key(path, "", section);
    for (const auto& [name_key, node] : *table) {
      const std::string name(name_key.str());
      const KeySpec* spec = find_spec(section + "." + name);
      if (!spec) unknown_key(path, section, name);
      std::optional<Raw> raw = raw_of(node);
      if (!raw) {
        throw InputError(
            path, spec->dotted(),
            fmt::format("expected {}, got {}", expected_of(spec->kind), node_kind(node)));
      }
      settings[spec->dotted()] = Setting{*raw, path, base_dir};
    }
  }
}

/** A --set value read as the key's type; what cannot be read stays text and fails conversion. */
Raw raw_of_text(const std::string& text, Kind kind) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (kind == Kind::kBool && (text == "true" || text == "false")) return Raw{text == "true"};
  if (kind == Kind::kInteger) {
    std::int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc() && ptr == end) return Raw{value};
  }
  if (kind == Kind::kInteger || kind == Kind::kNumber) {
    double value = 0;
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (ec == std::errc() && ptr == end && !text.empty()) return Raw{value};
    if (ec == std::errc::result_out_of_range && ptr == end) {
      // Too small for a double (1e-400): 0, as the TOML parser reads it; too large stays text
      // and is refused, as the TOML parser refuses it.
      const double rounded = std::strtod(text.c_str(), nullptr);
      if (std::isfinite(rounded) && std::fabs(rounded) < 1) return Raw{rounded};
    }
  }
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    return Raw{text.substr(1, text.size() - 2)};
  }
  return Raw{text};
}

void collect_override(const Override& override, Settings& settings,
                      const std::string& where = kSetWhere) {
  const auto& [key, value] = override;
  const KeySpec* spec = find_spec(key);
  if (!spec) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) unknown_key(where, "", key);
    unknown_key(where, key.substr(0, dot), key.substr(dot + 1));
  }
  settings[key] = Setting{raw_of_text(value, spec->kind), where, {}};
}

// ---------------------------------------------------------------------------------------------
// Validation: every cross-key and range check, in one place.

using WhereOf = std::function<std::string(const std::string& key)>;

void require(bool ok, const WhereOf& where_of, const std::string& key, const std::string& what) {
  if (!ok) throw InputError(where_of(key), key, what);
}

void at_least(std::int64_t value, std::int64_t minimum, const WhereOf& where_of,
              const std::string& key) {
  require(value >= minimum, where_of, key,
          fmt::format("must be at least {}, got {}", minimum, value));
}

void positive(double value, const WhereOf& where_of, const std::string& key, const char* unit) {
  require(std::isfinite(value) && value > 0, where_of, key,
          fmt::format("must be a positive number of {}, got {}", unit, value));
}

void non_negative(double value, const WhereOf& where_of, const std::string& key, const char* unit) {
  require(std::isfinite(value) && value >= 0, where_of, key,
          fmt::format("must be a non-negative number of {}, got {}", unit, value));
}

/** A physical value within what hpzlab's engines handle (0 allowed when `zero_ok`): values the
 *  type allows but no machine has crashed SimGrid (1e308 GB/s, latencies of 1e-300 us) or gave
 *  nonsense (a 200-digit step time). */
void plausible(double value, double lo, double hi, bool zero_ok, const WhereOf& where_of,
               const std::string& key, const char* unit) {
  require((zero_ok && value == 0) || (value >= lo && value <= hi), where_of, key,
          fmt::format("{} is out of range (allowed: {}{:g} to {:g} {})", value,
                      zero_ok ? "0, or " : "", lo, hi, unit));
}

void check_cluster(const ClusterConfig& c, const WhereOf& where_of) {
  at_least(c.nodes, 1, where_of, "cluster.nodes");
  at_least(c.gpus_per_node, 1, where_of, "cluster.gpus_per_node");
  constexpr std::int64_t kMaxWorld = 1 << 20;
  require(std::int64_t{c.nodes} * c.gpus_per_node <= kMaxWorld, where_of, "cluster.nodes",
          fmt::format("world size {} x {} is larger than {} ranks", c.nodes, c.gpus_per_node,
                      kMaxWorld));
  positive(c.nvlink_gbytes_per_s, where_of, "cluster.nvlink_gbytes_per_s", "GB/s");
  plausible(c.nvlink_gbytes_per_s, 1e-3, 1e5, false, where_of, "cluster.nvlink_gbytes_per_s",
            "GB/s");
  non_negative(c.nvlink_latency_us, where_of, "cluster.nvlink_latency_us", "microseconds");
  plausible(c.nvlink_latency_us, 1e-6, 1e6, true, where_of, "cluster.nvlink_latency_us",
            "microseconds");
  positive(c.nic_gbps, where_of, "cluster.nic_gbps", "Gbit/s");
  plausible(c.nic_gbps, 1e-3, 1e5, false, where_of, "cluster.nic_gbps", "Gbit/s");
  at_least(c.nics_per_node, 1, where_of, "cluster.nics_per_node");
  require(c.nics_per_node <= 1024, where_of, "cluster.nics_per_node",
          fmt::format("{} is out of range (allowed: 1 to 1024 NICs per node)", c.nics_per_node));
  non_negative(c.internode_latency_us, where_of, "cluster.internode_latency_us", "microseconds");
  plausible(c.internode_latency_us, 1e-6, 1e6, true, where_of, "cluster.internode_latency_us",
            "microseconds");
  require(
      c.gpu.peak_flops > 0 && c.gpu.hbm_bytes_per_s > 0 && c.gpu.memory_bytes > 0, where_of,
      "cluster.gpu",
      "the GPU spec must have positive FLOP/s, bandwidth and memory" + allowed(gpu_preset_names()));
}

void check_model(const ModelConfig& m, const WhereOf& where_of) {
  at_least(m.layers, 1, where_of, "model.layers");
  at_least(m.hidden, 1, where_of, "model.hidden");
  at_least(m.ffn, 1, where_of, "model.ffn");
  at_least(m.heads, 1, where_of, "model.heads");
  at_least(m.kv_heads, 1, where_of, "model.kv_heads");
  at_least(m.vocab, 1, where_of, "model.vocab");
  // A head dimension of its own (head_dim, MLA's) need not divide the hidden size.
  require(m.head_dim > 0 || m.kv_lora_rank > 0 || m.hidden % m.heads == 0, where_of, "model.heads",
          fmt::format("{} heads do not divide hidden = {} (allowed: a divisor of the hidden size)",
                      m.heads, m.hidden));
  require(m.heads % m.kv_heads == 0, where_of, "model.kv_heads",
          fmt::format("{} key/value heads do not divide heads = {} (allowed: a divisor of the "
                      "number of heads)",
                      m.kv_heads, m.heads));
}

void check_training(const TrainingConfig& t, const WhereOf& where_of) {
  at_least(t.seq_len, 1, where_of, "training.seq_len");
  at_least(t.micro_batch, 1, where_of, "training.micro_batch");
  at_least(t.grad_accum, 1, where_of, "training.grad_accum");
  require(std::isfinite(t.gradient_clipping) && t.gradient_clipping >= 0, where_of,
          "training.gradient_clipping",
          fmt::format("{} is not a clipping norm (allowed: a number >= 0; 0 for none)",
                      t.gradient_clipping));
  require(std::find(kDtypeNames.begin(), kDtypeNames.end(), t.dtype) != kDtypeNames.end(), where_of,
          "training.dtype", "unknown value '" + t.dtype + "'" + allowed(kDtypeNames));
}

std::vector<std::string> divisors(int n) {
  std::vector<std::string> found;
  for (int d = 1; d <= n && found.size() < 16; ++d) {
    if (n % d == 0) found.push_back(std::to_string(d));
  }
  return found;
}

void check_zero(const ZeroConfig& z, int world, const WhereOf& where_of) {
  require(z.stage >= 0 && z.stage <= 3, where_of, "zero.stage",
          fmt::format("{} is out of range (allowed: 0, 1, 2 or 3)", z.stage));
  const std::string hpz_key = "zero.zero_hpz_partition_size";
  const std::string allowed_hpz = allowed(divisors(world));
  at_least(z.zero_hpz_partition_size, 1, where_of, hpz_key);
  require(z.zero_hpz_partition_size <= world, where_of, hpz_key,
          fmt::format("{} is larger than the world size {} (nodes x gpus_per_node){}",
                      z.zero_hpz_partition_size, world, allowed_hpz));
  require(world % z.zero_hpz_partition_size == 0, where_of, hpz_key,
          fmt::format("{} does not divide the world size {} (nodes x gpus_per_node){}",
                      z.zero_hpz_partition_size, world, allowed_hpz));
  at_least(z.stage3_prefetch_bucket_size, 0, where_of, "zero.stage3_prefetch_bucket_size");
  at_least(z.stage3_max_live_parameters, 0, where_of, "zero.stage3_max_live_parameters");
  at_least(z.stage3_max_reuse_distance, 0, where_of, "zero.stage3_max_reuse_distance");
  at_least(z.reduce_bucket_size, 0, where_of, "zero.reduce_bucket_size");
  at_least(z.sub_group_size, 0, where_of, "zero.sub_group_size");  // 0: a sub-group a parameter
  at_least(z.stage3_param_persistence_threshold, 0, where_of,
           "zero.stage3_param_persistence_threshold");
}

void check_bugs(const BugConfig& b, int steps, int world, const WhereOf& where_of) {
  require(b.checkpoint_load_at_step == -1 ||
              (b.checkpoint_load_at_step >= 0 && b.checkpoint_load_at_step < steps),
          where_of, "bugs.checkpoint_load_at_step",
          fmt::format("{} is out of range (allowed: -1 for no load, or 0 to {} since run.steps = "
                      "{})",
                      b.checkpoint_load_at_step, steps - 1, steps));
  require(b.secondary_mismatch_rank == -1 ||
              (b.secondary_mismatch_rank >= 0 && b.secondary_mismatch_rank < world),
          where_of, "bugs.secondary_mismatch_rank",
          fmt::format("{} is out of range (allowed: -1 for none, or a rank 0 to {} of the world "
                      "size {})",
                      b.secondary_mismatch_rank, world - 1, world));
}

void check_sim(const SimConfig& m, const WhereOf& where_of) {
  require(m.compute_efficiency > 0 && m.compute_efficiency <= 1, where_of, "sim.compute_efficiency",
          fmt::format("{} is out of range (allowed: a fraction in (0, 1])", m.compute_efficiency));
  require(m.memory_efficiency > 0 && m.memory_efficiency <= 1, where_of, "sim.memory_efficiency",
          fmt::format("{} is out of range (allowed: a fraction in (0, 1])", m.memory_efficiency));
  plausible(m.compute_efficiency, 1e-3, 1, false, where_of, "sim.compute_efficiency",
            "(a fraction)");
  plausible(m.memory_efficiency, 1e-3, 1, false, where_of, "sim.memory_efficiency", "(a fraction)");
  non_negative(m.launch_overhead_us, where_of, "sim.launch_overhead_us", "microseconds");
  plausible(m.launch_overhead_us, 1e-6, 1e6, true, where_of, "sim.launch_overhead_us",
            "microseconds");
  non_negative(m.kernel_latency_us, where_of, "sim.kernel_latency_us", "microseconds");
  plausible(m.kernel_latency_us, 1e-6, 1e6, true, where_of, "sim.kernel_latency_us",
            "microseconds");
  positive(m.pcie_gbytes_per_s, where_of, "sim.pcie_gbytes_per_s", "GB/s");
  plausible(m.pcie_gbytes_per_s, 1e-3, 1e5, false, where_of, "sim.pcie_gbytes_per_s", "GB/s");
  require(m.jitter >= 0 && m.jitter <= 1, where_of, "sim.jitter",
          fmt::format("{} is out of range (allowed: a relative standard deviation in [0, 1])",
                      m.jitter));
  positive(m.bandwidth_factor, where_of, "sim.bandwidth_factor", "a factor");
  plausible(m.bandwidth_factor, 1e-3, 1e3, false, where_of, "sim.bandwidth_factor", "(a factor)");
  positive(m.latency_factor, where_of, "sim.latency_factor", "a factor");
  plausible(m.latency_factor, 1e-3, 1e3, false, where_of, "sim.latency_factor", "(a factor)");
}

// The builder counts elements and bytes in 64 bits (and activation bytes through a double):
// beyond these sizes its sums wrapped (hidden = 2e9 gave a negative attention unit, counted as
// persistent, and "params 9223373688269700349"). Far above any model trained today.
constexpr double kMaxParams = 1e13;             ///< parameters of the whole model
constexpr double kMaxActivationBytes = 0x1p50;  ///< one activation checkpoint (a PiB)

/** The model's size as the builder will count it, before anything is built. */
void check_sizes(const Scenario& s, const WhereOf& where_of) {
  const auto& m = s.model;
  const double h = m.hidden;
  const double params = parameter_count(m);
  require(params <= kMaxParams, where_of, "model",
          fmt::format("the model would have {:.3g} parameters ({} layers, hidden {}, ffn {}, "
                      "vocab {}), more than hpzlab counts (allowed: at most {:.0e})",
                      params, m.layers, m.hidden, m.ffn, m.vocab, kMaxParams));
  const double act = static_cast<double>(s.training.seq_len) * s.training.micro_batch * h *
                     s.training.dtype_bytes();
  require(act <= kMaxActivationBytes, where_of, "training.seq_len",
          fmt::format("one activation checkpoint (seq_len x micro_batch x hidden x dtype bytes) "
                      "would be {:.3g} bytes (allowed: at most 2^50, a PiB)",
                      act));
}

void check_scenario(const Scenario& s, const WhereOf& where_of) {
  check_cluster(s.cluster, where_of);
  check_model(s.model, where_of);
  check_training(s.training, where_of);
  check_zero(s.zero, s.cluster.world_size(), where_of);
  at_least(s.run.steps, 1, where_of, "run.steps");
  require(
      s.run.skipped_steps.empty() || s.run.skipped_steps.back() < s.run.steps, where_of,
      "run.skipped_steps",
      fmt::format("step {} is not built (allowed: steps from 0 to {}, run.steps - 1)",
                  s.run.skipped_steps.empty() ? 0 : s.run.skipped_steps.back(), s.run.steps - 1));
  require(s.run.spin_before_copy_us >= 0 && s.run.spin_before_copy_us <= 1e6, where_of,
          "run.spin_before_copy_us",
          fmt::format("{} is out of range (allowed: 0 to 1000000 microseconds)",
                      s.run.spin_before_copy_us));
  check_bugs(s.bugs, s.run.steps, s.cluster.world_size(), where_of);
  check_sim(s.sim, where_of);
  check_sizes(s, where_of);
}

}  // namespace

std::vector<int> parse_step_list(const std::string& text, const std::string& where,
                                 const std::string& key) {
  std::vector<int> out;
  std::size_t from = 0;
  while (!text.empty() && from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string part = text.substr(from, comma - from);
    int step = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), step);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || step < 0 ||
        (!out.empty() && step <= out.back())) {
      throw InputError(where, key,
                       fmt::format("'{}' is not a list of steps (allowed: step numbers from 0, "
                                   "ascending and comma-separated, such as \"0,1\", or \"\" "
                                   "for none)",
                                   shown(text)));
    }
    out.push_back(step);
    from = comma + 1;
  }
  return out;
}

std::optional<std::string> closest_name(const std::string& name,
                                        const std::vector<std::string>& known) {
  return closest(name, known);
}

Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides) {
  return load_scenario(path, overrides, {});
}

Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides,
                       const std::vector<FlagSetting>& flags) {
  Settings settings;
  if (!path.empty()) collect_file(path, settings);
  for (const FlagSetting& f : flags) collect_override({f.key, f.value}, settings, f.flag);
  std::string name = path;
  if (path.empty()) {
    // The one-command form: the user's own files on the documented defaults.
    const Setting* hf = find_setting(settings, "model.hf_config");
    const Setting* ds = find_setting(settings, "zero.ds_config");
    if (hf == nullptr || ds == nullptr) {
      throw InputError("", hf == nullptr ? "--hf-config" : "--ds-config",
                       "is required without a scenario file (give a scenario, or both "
                       "--hf-config FILE and --ds-config FILE)");
    }
    const auto text = [](const Setting& s) {
      const auto* t = std::get_if<std::string>(&s.raw);
      return t != nullptr ? *t : describe(s.raw);
    };
    name = text(*ds) + " + " + text(*hf);
  }
  for (const Override& override : overrides) collect_override(override, settings);
  // The one-command form fine-tunes: the Hugging Face model's weights loaded after zero.Init as
  // from_pretrained loads them, unless a flag (--from-config) or --set names run.load, or --set
  // names the coarse builder, which models no load.
  bool fine_tune = false;
  if (path.empty() && find_setting(settings, "run.load") == nullptr) {
    const Setting* builder = find_setting(settings, "run.builder");
    const auto* b = builder != nullptr ? std::get_if<std::string>(&builder->raw) : nullptr;
    if (b == nullptr || *b != "coarse") {
      collect_override({"run.load", "pretrained"}, settings, "--hf-config");
      fine_tune = true;
    }
  }
  Origins origins;
  Scenario scenario = build(name, settings, origins);
  check_scenario(scenario, [&](const std::string& key) {
    const auto it = origins.find(key);
    return it == origins.end() ? name : it->second;
  });
  if (fine_tune) {
    scenario.notes.push_back(
        "run.load = pretrained: the weights loaded after zero.Init as from_pretrained loads "
        "them (fine-tuning); --from-config for a model trained from its config");
  }
  const ModelConfig& m = scenario.model;
  const std::string walked = transformers_version_of(m, scenario.run.torch_version);
  if (scenario.run.builder == "deepspeed" && m.transformers_version == "auto" &&
      walked.starts_with("5.")) {
    scenario.notes.push_back(fmt::format(
        "run.torch_version {}: the model walked as transformers {} builds and checkpoints it, the "
        "transformers the recorder's torch 2.10 environment runs (model.transformers_version = "
        "\"4.51.3\" for transformers 4's)",
        scenario.run.torch_version, walked));
  }
  return scenario;
}

Override parse_override(const std::string& text) {
  const auto equals = text.find('=');
  const auto trim = [](std::string s) {
    const auto first = s.find_first_not_of(" \t");
    const auto last = s.find_last_not_of(" \t");
    return first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
  };
  if (equals == std::string::npos) {
    throw InputError(kSetWhere, text,
                     "expected section.key=value, e.g. --set zero.overlap_comm=false");
  }
  Override override{trim(text.substr(0, equals)), trim(text.substr(equals + 1))};
  if (override.first.empty()) {
    throw InputError(kSetWhere, text, "missing key before '=' (expected section.key=value)");
  }
  return override;
}

void validate(const Scenario& scenario) {
  check_scenario(scenario, [&](const std::string&) { return scenario.path; });
}

const char* to_string(Variant v) {
  switch (v) {
    case Variant::kStock:
      return "stock";
    case Variant::kHostSync:
      return "host-sync";
    case Variant::kEventWait:
      return "event-wait";
  }
  return "unknown";
}


}  // namespace hpz
