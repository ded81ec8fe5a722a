// The ds_config accelerate hands DeepSpeed (DeepSpeedPlugin, utils/dataclasses.py): the JSON file
// deepspeed_config_file names, or the one accelerate builds from deepspeed_config's inline keys;
// then the launch's mixed precision and zero3_init_flag. sim/accelerate/detail.hpp cites the
// accelerate code followed.
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

namespace hpz::accelerate_detail {
namespace {

namespace fs = std::filesystem;

/** The keys whose ACCELERATE_* variable _deepspeed_config_checks refuses next to a
 *  deepspeed_config_file (dataclasses.py 1505-1530), as it names them. */
const std::vector<std::string>& keys_refused_with_a_file() {
  static const std::vector<std::string> keys = {
      "gradient_accumulation_steps", "gradient_clipping",     "zero_stage",
      "offload_optimizer_device",    "offload_param_device",  "offload_param_nvme_path",
      "offload_optimizer_nvme_path", "zero3_save_16bit_model"};
  return keys;
}

/** An ASCII decimal integer, as Python's int() reads one (surrounding spaces allowed). */
std::optional<std::int64_t> python_int(std::string_view text) {
  const std::size_t first = text.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return std::nullopt;
  text = text.substr(first, text.find_last_not_of(" \t\n\r") - first + 1);
  const bool negative = text[0] == '-';
  if (text[0] == '+' || text[0] == '-') text.remove_prefix(1);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  const std::optional<std::uint64_t> m = magnitude(text, 10);
  if (!m || *m > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return std::nullopt;
  }
  return negative ? -static_cast<std::int64_t>(*m) : static_cast<std::int64_t>(*m);
}

}  // namespace

// --- deepspeed_config_file (dataclasses.py 1265-1298) ----------------------------------------

void AccelerateReader::from_file(const json& value) {
  const std::string key = "deepspeed_config.deepspeed_config_file";
  if (!value.is_string() || value.get<std::string>().empty() ||
      value.get<std::string>().find('\0') != std::string::npos) {
    refuse(key, "expected the path of a DeepSpeed config JSON, got " + quoted(value));
  }
  const std::string path = value.get<std::string>();
  std::error_code ec;
  if (!fs::exists(fs::path(path), ec)) {
    // HfDeepSpeedConfig (deepspeed.py 141-156) opens it if os.path.exists, in the launched
    // script's directory; else it tries the text as JSON or base64, which hpzlab does not.
    const fs::path beside = fs::path(file_).parent_path() / path;
    refuse(key, fmt::format("cannot read '{}': no such file in the current directory {} "
                            "(accelerate opens it from the directory it launches in){} "
                            "(allowed: a path from that directory, or an absolute one)",
                            path, fs::current_path(ec).string(),
                            fs::path(path).is_relative() && fs::exists(beside, ec)
                                ? fmt::format("; '{}' exists: run hpzlab from that directory",
                                              beside.string())
                                : ""));
  }
  const std::string text = read_input_file(path, file_, key, "cannot read '" + path + "'");
  json config = parse_json_input(text, path, "malformed JSON read for " + key);
  if (!config.is_object()) {
    throw InputError(path, "", "expected a JSON object (read for " + file_ + "'s " + key + ")");
  }
  config_.ds_config_file = path;
  std::vector<std::string> added;
  if (!config.contains("gradient_accumulation_steps")) {
    config["gradient_accumulation_steps"] = 1;
    added.emplace_back("gradient_accumulation_steps 1 (absent)");
  }
  if (!config.contains("zero_optimization")) {
    throw InputError(path, "zero_optimization",
                     "missing: accelerate refuses it ('Please specify the ZeRO optimization "
                     "config in the DeepSpeed config') (allowed: a zero_optimization object)");
  }
  refuse_inline_keys();
  // fill_match(must_match=False) with the plugin's own values (1278-1292): none of them came
  // from the YAML (refused above), so these are DeepSpeedPlugin's defaults (1227-1263).
  const std::vector<std::pair<std::string, json>> defaults = {
      {"gradient_accumulation_steps", "auto"},
      {"gradient_clipping", "auto"},
      {"zero_optimization.stage", 2},
      {"zero_optimization.offload_optimizer.device", "none"},
      {"zero_optimization.offload_param.device", "none"},
      {"zero_optimization.offload_param.nvme_path", "none"},
      {"zero_optimization.offload_optimizer.nvme_path", "none"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", false}};
  for (const auto& [dotted, filled] : defaults) {
    if (fill_auto(config, dotted, filled)) {
      added.push_back(fmt::format("{} {} for \"auto\"", dotted, filled.dump()));
    }
  }
  config_.ds_config = std::move(config);
  note(
      fmt::format("the ds_config is deepspeed_config_file {}, opened from the current "
                  "directory as the launched script opens it{}",
                  shown(path), added.empty() ? "" : "; accelerate sets " + joined(added)));
}

/** _deepspeed_config_checks (1505-1530): with a deepspeed_config_file, the keys that would
 *  set DeepSpeed's values beside it are refused, mixed_precision among them when the YAML
 *  gives it (launch.py 1388-1391). */
void AccelerateReader::refuse_inline_keys() const {
  const std::vector<std::string>& refused = keys_refused_with_a_file();
  for (const auto& [name, value] : ds_.items()) {
    // ACCELERATE_CONFIG_DS_FIELDS is lower-cased (utils/launch.py 564), and the check
    // compares names only: mixed_precision under deepspeed_config counts too.
    const std::string field = lower(name);
    if (field != "mixed_precision" &&
        std::find(refused.begin(), refused.end(), field) == refused.end()) {
      continue;
    }
    refuse("deepspeed_config." + name,
           "given with deepspeed_config_file: accelerate refuses it ('When using "
           "`deepspeed_config_file`, the following accelerate config variables will be "
           "ignored') (allowed: set it in the DeepSpeed config file, and leave it out here)");
  }
  if (mixed_from_file_) {
    refuse("mixed_precision",
           "given with deepspeed_config.deepspeed_config_file: accelerate refuses it (as "
           "_deepspeed_config_checks refuses the DeepSpeed keys) (allowed: bf16 or fp16 in "
           "the DeepSpeed config file, and no mixed_precision here)");
  }
}

/** fill_match (1355-1371) with must_match=False: the value at `dotted` becomes `filled` when
 *  it is "auto"; true when it did. A path through something that is not an object is left as
 *  it is (DeepSpeed's config reader refuses it later). */
bool AccelerateReader::fill_auto(json& config, const std::string& dotted, const json& filled) {
  json* node = &config;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t dot = dotted.find('.', begin);
    const std::string name = dotted.substr(begin, dot - begin);
    if (!node->is_object()) return false;
    const auto it = node->find(name);
    if (it == node->end()) return false;
    if (dot == std::string::npos) {
      if (!(it->is_string() && it->get<std::string>() == "auto") || filled == *it) return false;
      *it = filled;
      return true;
    }
    node = &*it;
    begin = dot + 1;
  }
}

// --- the inline keys (dataclasses.py 1227-1263 and 1299-1321) ---------------------------------

/** zero_stage: int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", 2)), the variable being
 *  str(value) (utils/launch.py 566-567). */
int AccelerateReader::zero_stage() {
  const json* v = present("zero_stage");
  if (v == nullptr) {
    defaults_.emplace_back("zero_stage 2");
    return 2;
  }
  std::optional<std::int64_t> stage;
  if (v->is_number_integer()) stage = v->get<std::int64_t>();
  if (v->is_string()) stage = python_int(v->get<std::string>());
  if (!stage || *stage < 0 || *stage > 3) {
    refuse("deepspeed_config.zero_stage",
           fmt::format("{} is not a ZeRO stage (allowed: 0, 1, 2, 3)", quoted(*v)));
  }
  return static_cast<int>(*stage);
}

/** offload_*_device: str(value).lower() (utils/launch.py 572-575), a DeepSpeed offload device;
 *  "none" when absent. */
std::string AccelerateReader::offload_device(const std::string& key) {
  const json* v = present(key);
  if (v == nullptr) {
    defaults_.push_back(key + " none");
    return "none";
  }
  const std::vector<std::string> devices = {"none", "cpu", "nvme"};
  const std::string name = v->is_string() ? lower(v->get<std::string>()) : "";
  if (std::find(devices.begin(), devices.end(), name) == devices.end()) {
    refuse("deepspeed_config." + key,
           fmt::format("{} is not an offload device DeepSpeed knows (allowed: {})", quoted(*v),
                       joined(devices)));
  }
  return name;
}

/** gradient_accumulation_steps: the variable str(value), read back `int(gas) if
 *  gas.isdigit() else gas`; "auto" when absent (Accelerator.prepare fills it). */
json AccelerateReader::accumulation() {
  const json* v = present("gradient_accumulation_steps");
  if (v == nullptr) {
    defaults_.emplace_back("gradient_accumulation_steps \"auto\"");
    return "auto";
  }
  if (v->is_string() && v->get<std::string>() == "auto") return "auto";
  std::optional<std::int64_t> steps;
  if (v->is_number_integer()) steps = v->get<std::int64_t>();
  if (v->is_string() && !v->get<std::string>().empty() &&
      v->get<std::string>().find_first_not_of("0123456789") == std::string::npos) {
    steps = python_int(v->get<std::string>());
  }
  if (!steps || *steps < 1 || *steps > std::numeric_limits<int>::max()) {
    refuse("deepspeed_config.gradient_accumulation_steps",
           fmt::format("{} is not a number of steps (allowed: 1 to {}, or \"auto\")", quoted(*v),
                       std::numeric_limits<int>::max()));
  }
  return *steps;
}

/** gradient_clipping: the variable str(value).lower(), "auto" or float() of it; "auto" when
 *  absent. None for 0: `if self.gradient_clipping:` leaves the key out. */
std::optional<json> AccelerateReader::clipping() {
  const json* v = present("gradient_clipping");
  if (v == nullptr) {
    defaults_.emplace_back("gradient_clipping \"auto\"");
    return json("auto");
  }
  std::optional<double> norm;
  if (v->is_number()) norm = v->get<double>();
  if (v->is_string()) {
    const std::string text = lower(v->get<std::string>());
    if (text == "auto") return json("auto");
    const std::size_t first = text.find_first_not_of(" \t\n\r");
    if (first != std::string::npos) {
      norm = decimal_double(
          std::string_view(text).substr(first, text.find_last_not_of(" \t\n\r") - first + 1));
    }
  }
  if (!norm || !std::isfinite(*norm)) {
    refuse("deepspeed_config.gradient_clipping",
           fmt::format("{} is not a clipping norm (allowed: a finite number, 0 for none, or "
                       "\"auto\")",
                       quoted(*v)));
  }
  if (*norm == 0) return std::nullopt;
  return json(*norm);
}

/** zero3_save_16bit_model: the variable str(value).lower(), true only when "true"
 *  (dataclasses.py 1253-1255). */
bool AccelerateReader::save_16bit() const {
  const json* v = present("zero3_save_16bit_model");
  if (v == nullptr) return false;
  if (v->is_boolean()) return v->get<bool>();
  return v->is_string() && lower(v->get<std::string>()) == "true";
}

void AccelerateReader::from_inline_keys() {
  const int stage = zero_stage();
  const std::string optimizer_device = offload_device("offload_optimizer_device");
  const std::string param_device = offload_device("offload_param_device");
  const json steps = accumulation();
  const std::optional<json> clip = clipping();
  for (const char* ignored : {"offload_optimizer_nvme_path", "offload_param_nvme_path"}) {
    // prepare_deepspeed_cmd_env sets no variable for them: the plugin's "none" (1245-1250).
    if (ds_.contains(ignored)) ignored_.push_back(std::string("deepspeed_config.") + ignored);
  }
  const auto nvme = [](const std::string& device) {
    return device == "nvme" ? json("none") : json(nullptr);
  };
  json config = {{"train_batch_size", "auto"},
                 {"train_micro_batch_size_per_gpu", "auto"},
                 {"gradient_accumulation_steps", steps},
                 {"zero_optimization",
                  {{"stage", stage},
                   {"offload_optimizer",
                    {{"device", optimizer_device}, {"nvme_path", nvme(optimizer_device)}}},
                   {"offload_param", {{"device", param_device}, {"nvme_path", nvme(param_device)}}},
                   {"stage3_gather_16bit_weights_on_model_save", save_16bit()}}}};
  if (clip) config["gradient_clipping"] = *clip;
  // steps_per_print = inf (1324) only quiets DeepSpeed's log: left out, as JSON has no inf.
  config_.ds_config = std::move(config);
  note(fmt::format(
      "no deepspeed_config_file, so the ds_config is the one accelerate builds "
      "from deepspeed_config's keys (DeepSpeedPlugin): zero_optimization.stage "
      "{}, offload_param {}, offload_optimizer {}, gradient_accumulation_steps {}, "
      "gradient_clipping {}, train_micro_batch_size_per_gpu \"auto\"",
      stage, param_device, optimizer_device, steps.dump(), clip ? clip->dump() : "left out (0)"));
  if (!defaults_.empty()) {
    note("accelerate's defaults for what deepspeed_config leaves out: " + joined(defaults_));
  }
}

// --- after either -----------------------------------------------------------------------------

/** DeepSpeedPlugin.set_mixed_precision (1413-1444) with what AcceleratorState passes it (state.py
 *  975): the launch's mixed_precision, 'no' when the YAML gives none. */
void AccelerateReader::set_mixed_precision() {
  if (!mixed_from_file_) {
    note(
        "no mixed_precision: accelerate launches with 'no', so bf16 and fp16 are off unless "
        "the ds_config enables one (a script's Accelerator(mixed_precision=...) or the HF "
        "Trainer's --bf16 / --fp16 would change that: set training.dtype with --set then)");
  }
  if (mixed_precision_ == "fp8") {
    refuse("mixed_precision",
           "'fp8': accelerate runs DeepSpeed in bf16 with fp8 layers (TransformerEngine, "
           "MS-AMP or torchao), which hpzlab does not model (allowed: no, fp16, bf16)");
  }
  json& config = config_.ds_config;
  const std::string& mp = mixed_precision_;
  if (mp == "fp16" && !config.contains("fp16")) {
    config["fp16"] = {{"enabled", true}, {"auto_cast", true}};
  } else if (mp == "bf16" && !config.contains("bf16")) {
    config["bf16"] = {{"enabled", true}};
  }
  if (mp != "no") {
    const std::string other = mp == "fp16" ? "bf16" : "fp16";
    const auto it = config.find(other);
    if (it != config.end() && it->is_object() && it->contains("enabled")) {
      const json& enabled = (*it)["enabled"];
      if ((enabled.is_boolean() && enabled.get<bool>()) ||
          (enabled.is_string() && lower(enabled.get<std::string>()) == "true")) {
        refuse("mixed_precision",
               fmt::format("'{}' with {}.enabled in the DeepSpeed config: accelerate refuses "
                           "it ('--mixed_precision arg cannot be set to {} when {} is set in "
                           "the DeepSpeed config file') (allowed: one of the two)",
                           mp, other, mp, other));
      }
    }
  }
  for (const char* dtype : {"fp16", "bf16"}) {
    if (!config.contains(dtype)) config[dtype] = {{"enabled", false}};
  }
  std::vector<std::string> filled;
  for (const char* dtype : {"fp16", "bf16"}) {
    const bool on = mp == dtype;
    if (fill_auto(config, std::string(dtype) + ".enabled", on)) {
      filled.push_back(fmt::format("{}.enabled {}", dtype, on));
    }
  }
  if (!filled.empty()) {
    note(fmt::format("\"auto\" precision filled for mixed_precision '{}': {}", mp, joined(filled)));
  }
}

/** zero3_init_flag: str_to_bool of the variable str(value).lower() (utils/launch.py 576-577;
 *  environment.py 59-71), else whether the ds_config is ZeRO-3 (dataclasses.py 1325-1337). */
void AccelerateReader::read_zero3_init() {
  // is_zero3 (deepspeed.py 166, 246-247): zero_optimization.stage == 3.
  const auto zero = config_.ds_config.find("zero_optimization");
  const bool zero3 = zero != config_.ds_config.end() && zero->is_object() &&
                     zero->contains("stage") && (*zero)["stage"].is_number() &&
                     (*zero)["stage"].get<double>() == 3;
  const json* v = present("zero3_init_flag");
  bool flag = zero3;
  if (v != nullptr) {
    std::string word;
    if (v->is_boolean()) word = v->get<bool>() ? "true" : "false";
    if (v->is_number_integer()) word = std::to_string(v->get<std::int64_t>());
    if (v->is_string()) word = lower(v->get<std::string>());
    const std::set<std::string> yes = {"y", "yes", "t", "true", "on", "1"};
    const std::set<std::string> no = {"n", "no", "f", "false", "off", "0"};
    if (yes.count(word) == 0 && no.count(word) == 0) {
      refuse("deepspeed_config.zero3_init_flag",
             fmt::format("{} is not a truth value accelerate reads (allowed: true, false, yes, "
                         "no, on, off, 1, 0)",
                         quoted(*v)));
    }
    flag = yes.count(word) != 0;
  }
  if (flag && !zero3) {
    note("zero3_init_flag is on below ZeRO-3: accelerate turns it off (with a warning)");
    flag = false;
  }
  if (!flag && zero3) {
    note(
        "zero3_init_flag is off: accelerate builds the model without deepspeed.zero.Init and "
        "DeepSpeed partitions it in deepspeed.initialize, which hpzlab does not model (its "
        "schedule starts from zero.Init's partitions)");
  }
  config_.zero3_init = flag;
}

}  // namespace hpz::accelerate_detail
