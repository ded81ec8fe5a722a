// Reading accelerate's config file as `accelerate launch --config_file FILE script.py` reads it:
// its top-level keys (the environment, the precision, the cluster, parallelism) and the notes on
// what it leaves to the script. sim/accelerate/detail.hpp cites the accelerate code followed;
// ds_config.cpp builds the ds_config, yaml.cpp reads the YAML.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/accelerate/detail.hpp"
#include "sim/accelerate_config.hpp"
#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/scenario.hpp"
#include "sim/text.hpp"

namespace hpz {
namespace accelerate_detail {
namespace {

/** ClusterConfig's fields (config_args.py: BaseConfig 75-81, ClusterConfig 178-217) and the two
 *  old keys process_config converts before from_yaml_file refuses any other (113-119, 153-159). */
const std::vector<std::string>& cluster_config_keys() {
  static const std::vector<std::string> keys = {"compute_environment",
                                                "distributed_type",
                                                "mixed_precision",
                                                "use_cpu",
                                                "debug",
                                                "num_processes",
                                                "machine_rank",
                                                "num_machines",
                                                "gpu_ids",
                                                "main_process_ip",
                                                "main_process_port",
                                                "rdzv_backend",
                                                "same_network",
                                                "main_training_function",
                                                "enable_cpu_affinity",
                                                "fp8_config",
                                                "deepspeed_config",
                                                "fsdp_config",
                                                "parallelism_config",
                                                "megatron_lm_config",
                                                "mpirun_config",
                                                "downcast_bf16",
                                                "tpu_name",
                                                "tpu_zone",
                                                "tpu_use_cluster",
                                                "tpu_use_sudo",
                                                "command_file",
                                                "commands",
                                                "tpu_vm",
                                                "tpu_env",
                                                "dynamo_config",
                                                "fp16",
                                                "dynamo_backend"};
  return keys;
}

/** The keys of deepspeed_config that become `accelerate launch` arguments (launch.py 409-509,
 *  "DeepSpeed Arguments"); any other key of it is set on the arguments and read by nothing. */
const std::vector<std::string>& deepspeed_keys() {
  static const std::vector<std::string> keys = {"deepspeed_config_file",
                                                "zero_stage",
                                                "offload_optimizer_device",
                                                "offload_param_device",
                                                "offload_optimizer_nvme_path",
                                                "offload_param_nvme_path",
                                                "gradient_accumulation_steps",
                                                "gradient_clipping",
                                                "zero3_init_flag",
                                                "zero3_save_16bit_model",
                                                "deepspeed_hostfile",
                                                "deepspeed_exclusion_filter",
                                                "deepspeed_inclusion_filter",
                                                "deepspeed_multinode_launcher",
                                                "deepspeed_moe_layer_cls_names"};
  return keys;
}

/** DistributedType's values (dataclasses.py 602-638). */
const std::vector<std::string>& distributed_types() {
  static const std::vector<std::string> names = {
      "NO",         "MULTI_CPU",   "MULTI_GPU", "MULTI_NPU",   "MULTI_MLU",
      "MULTI_SDAA", "MULTI_MUSA",  "MULTI_XPU", "DEEPSPEED",   "FSDP",
      "XLA",        "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON"};
  return names;
}

/** Python's truth of a YAML value (process_config's `config_dict["fp16"]`). */
bool truthy(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();
}

}  // namespace

/** A YAML value for a message: a string in single quotes as the YAML may write it ('no'),
 *  anything else as JSON. */
std::string quoted(const json& value) {
  return value.is_string() ? "'" + shown(value.get<std::string>()) + "'" : shown_json(value);
}

AccelerateConfig AccelerateReader::read() {
  if (!doc_.is_object()) {
    throw InputError(file_, "",
                     fmt::format("expected a mapping of accelerate's keys (yaml.safe_load of it "
                                 "gives a dict to accelerate), got {}",
                                 doc_.is_null() ? std::string("an empty document") : quoted(doc_)));
  }
  check_keys();
  check_environment();
  read_mixed_precision();
  read_cluster();
  read_parallelism();
  ds_ = doc_.value("deepspeed_config", json::object());
  if (ds_.is_null()) ds_ = json::object();  // ClusterConfig.__post_init__ (219-221)
  if (!ds_.is_object()) {
    throw InputError(file_, "deepspeed_config",
                     "expected a mapping of accelerate's DeepSpeed keys, got " + quoted(ds_));
  }
  check_deepspeed_keys();
  const json* file_key = present("deepspeed_config_file");
  if (file_key != nullptr && !(file_key->is_string() && file_key->get<std::string>() == "none")) {
    from_file(*file_key);
  } else {
    from_inline_keys();
  }
  set_mixed_precision();
  read_zero3_init();
  note_auto();
  note_ignored();
  config_.mixed_precision = mixed_precision_;
  return std::move(config_);
}

/** deepspeed_config's `key` when given and not null (null is no value: the launch argument
 *  stays None, launch.py 1270-1271, and DeepSpeedPlugin takes its default). */
const json* AccelerateReader::present(const std::string& key) const {
  const auto it = ds_.find(key);
  return it == ds_.end() || it->is_null() ? nullptr : &*it;
}

void AccelerateReader::note(std::string text) {
  // The names and paths in notes come from the user's file: shown() keeps a note one line.
  config_.notes.push_back(fmt::format("accelerate config {}: {}", shown(file_), text));
}

[[noreturn]] void AccelerateReader::refuse(const std::string& key, const std::string& what) const {
  throw InputError(file_, key, what);
}

void AccelerateReader::check_keys() const {
  const std::vector<std::string>& known = cluster_config_keys();
  for (const auto& [name, value] : doc_.items()) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::optional<std::string> near = closest_name(name, known);
    refuse(name,
           fmt::format("unknown key: accelerate refuses it (from_yaml_file: 'had unknown "
                       "keys'){} (allowed: {})",
                       near ? fmt::format("; did you mean '{}'?", *near) : "", joined(known)));
  }
}

void AccelerateReader::check_environment() const {
  if (const auto it = doc_.find("compute_environment");
      it != doc_.end() && !(it->is_string() && it->get<std::string>() == "LOCAL_MACHINE")) {
    // load_config_from_file (65-72): anything else is SageMakerConfig, a run on SageMaker.
    refuse("compute_environment",
           fmt::format("{} is not a local cluster, which hpzlab models (allowed: LOCAL_MACHINE)",
                       quoted(*it)));
  }
  const auto it = doc_.find("distributed_type");
  if (it == doc_.end()) {
    refuse("distributed_type",
           "missing: accelerate requires it (process_config: 'A `distributed_type` must be "
           "specified') (allowed: DEEPSPEED)");
  }
  if (it->is_string() && it->get<std::string>() == "DEEPSPEED") return;
  const std::vector<std::string>& types = distributed_types();
  const bool known = it->is_string() &&
                     std::find(types.begin(), types.end(), it->get<std::string>()) != types.end();
  refuse("distributed_type",
         fmt::format("{} is {} (allowed: DEEPSPEED)", quoted(*it),
                     known ? "not DeepSpeed" : "not a distributed type accelerate knows"));
}

/** process_config (113-116), then _validate_launch_command (1281-1286) and
 *  prepare_deepspeed_cmd_env's PrecisionType(args.mixed_precision.lower()) (550). */
void AccelerateReader::read_mixed_precision() {
  const auto it = doc_.find("mixed_precision");
  if (it == doc_.end()) {
    const auto fp16 = doc_.find("fp16");  // the old key
    if (fp16 != doc_.end() && truthy(*fp16)) {
      mixed_precision_ = "fp16";
      mixed_from_file_ = true;
    }
    return;
  }
  if (it->is_null()) return;
  const std::vector<std::string> allowed = {"no", "fp16", "bf16", "fp8"};
  if (it->is_string()) {
    const std::string name = lower(it->get<std::string>());
    if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) {
      mixed_precision_ = name;
      mixed_from_file_ = true;
      return;
    }
  }
  refuse("mixed_precision",
         fmt::format("{} is not a precision accelerate knows{} (allowed: {})", quoted(*it),
                     it->is_boolean() ? " (YAML reads an unquoted no as false: write 'no')" : "",
                     joined(allowed)));
}

/** A positive integer of the top level, or none when absent. */
std::optional<int> AccelerateReader::count(const char* key, bool minus_one_is_absent) const {
  const auto it = doc_.find(key);
  if (it == doc_.end()) return std::nullopt;
  if (it->is_number_integer()) {
    const std::int64_t v = it->get<std::int64_t>();
    if (v == -1 && minus_one_is_absent) return std::nullopt;
    if (v >= 1 && v <= std::numeric_limits<int>::max()) return static_cast<int>(v);
  }
  refuse(key, fmt::format("{} is not a number of {} (allowed: 1 to {})", quoted(*it),
                          minus_one_is_absent ? "processes" : "machines",
                          std::numeric_limits<int>::max()));
}

void AccelerateReader::read_cluster() {
  // ClusterConfig's num_processes -1 means "give --num_processes" (180; launch.py 1299-1300).
  config_.num_processes = count("num_processes", true);
  config_.num_machines = count("num_machines", false);
  if (!config_.num_processes) {
    note(
        "num_processes is not given (accelerate launch then wants --num_processes): the "
        "cluster is the scenario's, or --nodes and --gpus-per-node's");
    return;
  }
  const int processes = *config_.num_processes;
  const int machines = config_.num_machines.value_or(1);  // ClusterConfig's default (182)
  if (processes % machines != 0) {
    refuse("num_processes",
           fmt::format("{} is not a multiple of num_machines {} (accelerate launches "
                       "num_processes // num_machines = {} a machine, {} in all; allowed: a "
                       "multiple of num_machines)",
                       processes, machines, processes / machines, processes / machines * machines));
  }
  note(
      fmt::format("num_processes {} (the total) over num_machines {}{}: cluster.nodes {} and "
                  "cluster.gpus_per_node {}",
                  processes, machines, config_.num_machines ? "" : " (accelerate's default)",
                  machines, processes / machines));
}

/** parallelism_config (tensor, context or sequence parallelism with DeepSpeed's ALST/Ulysses)
 *  splits the work in ways the schedule hpzlab builds has not. */
void AccelerateReader::read_parallelism() {
  const auto it = doc_.find("parallelism_config");
  if (it == doc_.end() || it->is_null()) return;
  if (!it->is_object()) {
    refuse("parallelism_config", "expected a mapping, got " + quoted(*it));
  }
  for (const auto& [name, value] : it->items()) {
    const bool splits = name.ends_with("_size") && name != "parallelism_config_dp_shard_size";
    if (splits && !(value.is_number_integer() && value.get<std::int64_t>() <= 1)) {
      refuse("parallelism_config." + name,
             fmt::format("{}: tensor, context and sequence parallelism are not modelled by "
                         "hpzlab (allowed: 1, or leave it out)",
                         quoted(value)));
    }
  }
}

void AccelerateReader::check_deepspeed_keys() {
  const std::vector<std::string>& known = deepspeed_keys();
  for (const auto& [name, value] : ds_.items()) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::optional<std::string> near = closest_name(name, known);
    note(fmt::format("deepspeed_config.{} is not a key accelerate reads (it ignores it){}",
                     shown(name), near ? fmt::format("; did you mean '{}'?", *near) : ""));
  }
  if (const json* moe = present("deepspeed_moe_layer_cls_names")) {
    // Accelerator._prepare_deepspeed -> set_moe_leaf_modules (dataclasses.py 1532-1550).
    refuse("deepspeed_config.deepspeed_moe_layer_cls_names",
           fmt::format("{}: accelerate makes these ZeRO-3 leaf modules (set_z3_leaf_modules), "
                       "which hpzlab does not model (allowed: leave it out)",
                       quoted(*moe)));
  }
}

/** The dotted names of the "auto" values in `v` (objects only: a list's are not filled). */
void AccelerateReader::auto_keys(const json& v, const std::string& prefix,
                                 std::vector<std::string>& out) {
  if (!v.is_object()) return;
  for (const auto& [name, child] : v.items()) {
    if (child.is_string() && child.get<std::string>() == "auto") {
      out.push_back(shown(prefix + name));
    } else {
      auto_keys(child, prefix + name + ".", out);
    }
  }
}

void AccelerateReader::note_auto() {
  std::vector<std::string> keys;
  auto_keys(config_.ds_config, "", keys);
  if (keys.empty()) return;
  // Accelerator._prepare_deepspeed (accelerator.py 2172-2228, 2289-2320, 2346).
  note(fmt::format(
      "{} \"auto\" in what accelerate hands the script: its Accelerator.prepare fills "
      "train_micro_batch_size_per_gpu from the DataLoader's batch_size, "
      "gradient_accumulation_steps from the Accelerator's, gradient_clipping with 1.0 and "
      "reduce_bucket_size, stage3_prefetch_bucket_size and stage3_param_persistence_threshold "
      "from the model's hidden size as the HF Trainer does (hpzlab fills these as with "
      "--hf-trainer)",
      joined(keys) + (keys.size() == 1 ? " is" : " are")));
}

void AccelerateReader::note_ignored() {
  const std::set<std::string> read_here = {
      "compute_environment", "distributed_type", "mixed_precision", "fp16",
      "num_processes",       "num_machines",     "deepspeed_config"};
  for (const auto& [name, value] : doc_.items()) {
    if (read_here.count(name) == 0) ignored_.push_back(name);
  }
  for (const char* name : {"deepspeed_multinode_launcher", "deepspeed_hostfile",
                           "deepspeed_inclusion_filter", "deepspeed_exclusion_filter"}) {
    if (ds_.contains(name)) ignored_.push_back(std::string("deepspeed_config.") + name);
  }
  if (!ignored_.empty()) {
    note("ignored (hpzlab does not model them): " + joined(ignored_));
  }
  const json* launcher = present("deepspeed_multinode_launcher");
  const bool filtered = present("deepspeed_inclusion_filter") != nullptr ||
                        present("deepspeed_exclusion_filter") != nullptr;
  if (filtered && config_.num_machines.value_or(1) > 1 &&
      !(launcher != nullptr && *launcher == "standard")) {
    // prepare_deepspeed_cmd_env (utils/launch.py 451-475): no --num_gpus with a filter.
    note(
        "with deepspeed_inclusion_filter or deepspeed_exclusion_filter the hostfile and the "
        "filter decide each machine's GPUs, not num_processes: hpzlab takes num_processes / "
        "num_machines");
  }
}

}  // namespace accelerate_detail

bool is_accelerate_config_path(const std::string& path) {
  const std::string name = accelerate_detail::lower(path);
  return name.ends_with(".yaml") || name.ends_with(".yml");
}

AccelerateConfig read_accelerate_config(const std::string& path, const std::string& where,
                                        const std::string& key) {
  const std::string text =
      read_input_file(path, where.empty() ? path : where, key, "cannot read '" + shown(path) + "'");
  return accelerate_detail::AccelerateReader(path, parse_yaml_input(text, path)).read();
}

}  // namespace hpz
