// What the parts of the accelerate config reader share (private to sim/accelerate/;
// sim/accelerate_config.hpp is the public face). The parts:
//   yaml.cpp       YAML -> JSON, typed as PyYAML's safe_load types it (parse_yaml_input)
//   config.cpp     the config's top-level keys: environment, precision, cluster, parallelism
//   ds_config.cpp  the ds_config accelerate hands DeepSpeed: deepspeed_config_file or the inline
//                  keys, then mixed precision and zero3_init_flag
//
// Followed from huggingface/accelerate v1.14.0 (tag commit
// beb0672aa8444ea7647aee056f624effe5996346; main at
// 16cb6eb80dd9aa8b4df1a63ef57863e455d53b83, 1.15.0.dev0, has the same code, a line or two lower in
// dataclasses.py). The path of a key from the YAML to DeepSpeed:
//   commands/config/config_args.py  load_config_from_file (43-72): yaml.safe_load, ClusterConfig
//                                   unless compute_environment is SageMaker's; process_config
//                                   (102-126) and from_yaml_file (148-160): unknown keys refused
//   commands/launch.py              _validate_launch_command (1196-1381): deepspeed_config's keys
//                                   become launch arguments (1258-1277), mixed_precision 'no' when
//                                   absent (1281-1286), num_processes -1 refused (1299-1300);
//                                   launch_command (1388-1391): the DeepSpeed keys the YAML gave
//   utils/launch.py                 prepare_deepspeed_cmd_env (429-590): num_processes //
//                                   num_machines a machine (475, 488, 497), the keys as
//                                   ACCELERATE_* variables (550-585)
//   utils/dataclasses.py            DeepSpeedPlugin.__post_init__ (1224-1353): the ds_config from
//                                   the JSON file (1265-1298) or from the inline keys
//                                   (1299-1321); zero3_init_flag (1325-1337); fill_match (1355);
//                                   set_mixed_precision (1413-1444), which AcceleratorState calls
//                                   (state.py 975); _deepspeed_config_checks (1505-1530)
//   utils/deepspeed.py              HfDeepSpeedConfig (119-201): the file opened as named
//   accelerator.py                  _prepare_deepspeed (2134-2347): the "auto" fills, at prepare()
// and PyYAML 6.0's types (yaml/pyyaml d51d8a138f7230834fc6e95635ff09ebd329185f,
// lib/yaml/resolver.py 170-205, lib/yaml/constructor.py 224-292), which safe_load gives them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/accelerate_config.hpp"

namespace hpz::accelerate_detail {

using json = nlohmann::json;

/** `text` in lower case (ASCII). */
std::string lower(std::string_view text);

/** A YAML value for a message: a string in single quotes as the YAML may write it ('no'),
 *  anything else as JSON. */
std::string quoted(const json& value);

/** `digits` in `base` (no sign, no '_'); none when empty, not such digits, or past 2^64 - 1. */
std::optional<std::uint64_t> magnitude(std::string_view digits, unsigned base);

/** Python's float() of `text`, as far as a config needs it: a whole decimal number. */
std::optional<double> decimal_double(std::string_view text);

/** What one accelerate config says, read key by key (the file, its notes). */
class AccelerateReader {
 public:
  AccelerateReader(std::string file, json doc) : file_(std::move(file)), doc_(std::move(doc)) {}

  /** The config as `accelerate launch --config_file` gives it to DeepSpeed; throws InputError. */
  AccelerateConfig read();

 private:
  // The top-level keys (config.cpp).
  const json* present(const std::string& key) const;  ///< deepspeed_config's key, if given
  void note(std::string text);                        ///< adds a note naming the file
  [[noreturn]] void refuse(const std::string& key, const std::string& what) const;
  void check_keys() const;         ///< refuses a key accelerate does not know
  void check_environment() const;  ///< a local DeepSpeed run only
  void read_mixed_precision();     ///< mixed_precision, or the old fp16 key
  /// A positive integer of the top level, or none when absent.
  std::optional<int> count(const char* key, bool minus_one_is_absent) const;
  void read_cluster();          ///< num_processes over num_machines
  void read_parallelism();      ///< refuses tensor, context and sequence parallelism
  void check_deepspeed_keys();  ///< notes deepspeed_config's keys accelerate ignores
  /// The dotted names of the "auto" values in `v`.
  static void auto_keys(const json& v, const std::string& prefix, std::vector<std::string>& out);
  void note_auto();     ///< the "auto" values Accelerator.prepare fills
  void note_ignored();  ///< the keys hpzlab does not model

  // The ds_config (ds_config.cpp).
  void from_file(const json& value);  ///< deepspeed_config_file's ds_config
  void refuse_inline_keys() const;    ///< the keys accelerate refuses beside that file
  /// fill_match: the "auto" value at `dotted` becomes `filled`; true when it did.
  static bool fill_auto(json& config, const std::string& dotted, const json& filled);
  // The inline keys, each as the launch passes it to DeepSpeedPlugin.
  int zero_stage();                                    ///< zero_stage, 2 when absent
  std::string offload_device(const std::string& key);  ///< offload_*_device, "none" when absent
  json accumulation();             ///< gradient_accumulation_steps, "auto" when absent
  std::optional<json> clipping();  ///< gradient_clipping, "auto" when absent; none for 0
  bool save_16bit() const;         ///< zero3_save_16bit_model
  void from_inline_keys();         ///< the ds_config accelerate builds from deepspeed_config's keys
  void set_mixed_precision();      ///< the launch's mixed_precision into the ds_config
  void read_zero3_init();          ///< zero3_init_flag

  std::string file_;
  json doc_;
  json ds_;  ///< deepspeed_config
  std::string mixed_precision_ = "no";
  bool mixed_from_file_ = false;  ///< the YAML gave mixed_precision (or the old fp16 key)
  std::vector<std::string> defaults_;
  std::vector<std::string> ignored_;
  AccelerateConfig config_;
};

}  // namespace hpz::accelerate_detail
