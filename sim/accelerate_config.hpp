// Hugging Face accelerate's config file (the YAML `accelerate config` writes, or TRL's
// examples/accelerate_configs/deepspeed_zero3.yaml) read as `accelerate launch --config_file FILE`
// reads it: the DeepSpeed config accelerate hands DeepSpeed, and the cluster it launches (issue 35,
// "inputs people have"). `--ds-config FILE.yaml` goes through here (sim/scenario/ds_config.cpp,
// apply_ds_config); sim/accelerate/ cites the accelerate code it follows.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace hpz {

/** What `accelerate launch --config_file FILE` gives a DeepSpeed run. */
struct AccelerateConfig {
  /// The ds_config as accelerate's DeepSpeedPlugin builds it and AcceleratorState's
  /// set_mixed_precision completes it: the JSON file the YAML names, or the one accelerate
  /// synthesizes from the inline keys. Its "auto" values stay "auto": Accelerator.prepare fills
  /// them from the script's DataLoader and model, which the YAML does not say.
  nlohmann::json ds_config;
  std::string ds_config_file;  ///< deepspeed_config_file as accelerate opens it ("" = inline keys)
  std::optional<int> num_machines;   ///< num_machines, when the file gives it
  std::optional<int> num_processes;  ///< num_processes: the TOTAL over all machines, when given
  std::string mixed_precision;       ///< "no", "fp16" or "bf16": what accelerate launches with
  bool zero3_init = false;  ///< the model is built under deepspeed.zero.Init (zero3_init_flag)
  std::vector<std::string> notes;  ///< one sentence each: defaults taken, keys ignored, fills
};

/** Whether `path` names an accelerate config rather than a ds_config: it ends in .yaml or .yml
 *  (any case). */
bool is_accelerate_config_path(const std::string& path);

/** YAML `text` (the content of `file`) as PyYAML's yaml.safe_load types it, which accelerate
 *  reads its config with: mappings as objects, sequences as arrays, plain scalars as YAML 1.1's
 *  booleans (yes/no/on/off/true/false), null (~, null, empty), integers (0b, 0x, 0 octal, 1:30
 *  sexagesimal, _ separators) and floats (a '.' needed: 1e5 is a string), quoted scalars as
 *  strings. Throws InputError naming `file` for a syntax error (with its line and column), more
 *  than one document, an anchor, alias or merge key, a key given twice, a mapping or list as a
 *  key, an unknown tag, a number beyond int64 or not finite, and nesting deeper than
 *  kMaxJsonDepth. Timestamps stay strings (PyYAML makes dates of them). */
nlohmann::json parse_yaml_input(const std::string& text, const std::string& file);

/** The accelerate config at `path`, read as `accelerate launch --config_file path` reads it (a
 *  relative deepspeed_config_file is opened from the current directory, as the launched script
 *  opens it). Throws InputError naming the file, the key and the allowed values for anything
 *  accelerate refuses or hpzlab does not model (a distributed_type other than DEEPSPEED, fp8,
 *  sequence or tensor parallelism, MoE leaf modules) and for a num_processes that num_machines
 *  does not divide; `where` and `key` name the file's origin when it cannot be read (as
 *  ("--ds-config", "zero.ds_config")). */
AccelerateConfig read_accelerate_config(const std::string& path, const std::string& where = "",
                                        const std::string& key = "");

}  // namespace hpz
