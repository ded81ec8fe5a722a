// Reading accelerate's config file as `accelerate launch --config_file FILE script.py` reads it.
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
#include "sim/accelerate_config.hpp"

#include <fmt/format.h>
#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/scenario.hpp"
#include "sim/text.hpp"

namespace hpz {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

/** A YAML value for a message: a string in single quotes as the YAML may write it ('no'),
 *  anything else as JSON. */
std::string quoted(const json& value) {
  return value.is_string() ? "'" + shown(value.get<std::string>()) + "'" : shown_json(value);
}

// ---------------------------------------------------------------------------------------------
// YAML -> JSON, typed as PyYAML's safe_load types it.

constexpr std::string_view kTagPrefix = "tag:yaml.org,2002:";

/** A place in the YAML file, for messages: the file and libyaml's 0-based mark. */
struct YamlPlace {
  const std::string& file;
  yaml_mark_t mark;
};

[[noreturn]] void fail_at(const YamlPlace& at, const std::string& what) {
  throw InputError(
      at.file, "",
      fmt::format("line {}, column {}: {}", at.mark.line + 1, at.mark.column + 1, what));
}

/** `digits` in `base` (no sign, no '_'); none when empty, not such digits, or past 2^64 - 1. */
std::optional<std::uint64_t> magnitude(std::string_view digits, unsigned base) {
  if (digits.empty()) return std::nullopt;
  std::uint64_t value = 0;
  for (const char c : digits) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const unsigned d = is_digit(l)              ? static_cast<unsigned>(l - '0')
                       : (l >= 'a' && l <= 'f') ? static_cast<unsigned>(l - 'a' + 10)
                                                : base;
    if (d >= base || __builtin_mul_overflow(value, base, &value) ||
        __builtin_add_overflow(value, d, &value)) {
      return std::nullopt;
    }
  }
  return value;
}

/** PyYAML's int pattern (resolver.py 186-193): 0b101, 0x1F, 0755 (octal), 0, 1_000, 1:30
 *  (sexagesimal), each with an optional sign. */
bool int_pattern(std::string_view s) {
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  if (s.empty()) return false;
  const auto all = [](std::string_view t, std::string_view set) {
    return !t.empty() && t.find_first_not_of(set) == std::string_view::npos;
  };
  if (s.starts_with("0b")) return all(s.substr(2), "01_");
  if (s.starts_with("0x")) return all(s.substr(2), "0123456789abcdefABCDEF_");
  if (s == "0") return true;
  if (s[0] == '0') return all(s.substr(1), "01234567_");
  if (!is_digit(s[0])) return false;
  std::size_t i = 1;
  while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
  if (i == s.size()) return true;
  // (?::[0-5]?[0-9])+ to the end
  while (i < s.size()) {
    if (s[i] != ':') return false;
    ++i;
    if (i + 1 < s.size() && s[i] >= '0' && s[i] <= '5' && is_digit(s[i + 1])) {
      i += 2;
    } else if (i < s.size() && is_digit(s[i])) {
      ++i;
    } else {
      return false;
    }
  }
  return true;
}

/** [eE][-+][0-9]+, or nothing. */
bool exponent_pattern(std::string_view s) {
  if (s.empty()) return true;
  return s.size() >= 3 && (s[0] == 'e' || s[0] == 'E') && (s[1] == '+' || s[1] == '-') &&
         s.substr(2).find_first_not_of("0123456789") == std::string_view::npos;
}

/** PyYAML's float pattern (resolver.py 177-184): a '.' is needed (1e5 is a string, 1.0e+5 a
 *  float, the exponent's sign too), 1:30.5 (sexagesimal), .inf and .nan. */
bool float_pattern(std::string_view s) {
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return true;
  const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
  if (sign) s.remove_prefix(1);
  if (s == ".inf" || s == ".Inf" || s == ".INF") return true;
  if (s.empty()) return false;
  std::size_t i = 0;
  if (s[0] == '.') {  // \.[0-9][0-9_]*(?:[eE][-+][0-9]+)?, without a sign
    if (sign || s.size() < 2 || !is_digit(s[1])) return false;
    i = 2;
    while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
    return exponent_pattern(s.substr(i));
  }
  if (!is_digit(s[0])) return false;
  i = 1;
  while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
    return exponent_pattern(s.substr(i));
  }
  int groups = 0;
  while (i < s.size() && s[i] == ':') {
    ++i;
    if (i + 1 < s.size() && s[i] >= '0' && s[i] <= '5' && is_digit(s[i + 1])) {
      i += 2;
    } else if (i < s.size() && is_digit(s[i])) {
      ++i;
    } else {
      return false;
    }
    ++groups;
  }
  if (groups == 0 || i >= s.size() || s[i] != '.') return false;
  return s.substr(i + 1).find_first_not_of("0123456789_") == std::string_view::npos;
}

std::string without_underscores(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c != '_') out += c;
  }
  return out;
}

/** construct_yaml_int (constructor.py 237-263): none when out of int64's range or not digits. */
std::optional<std::int64_t> yaml_int(std::string_view text) {
  std::string v = without_underscores(text);
  const bool negative = !v.empty() && v[0] == '-';
  if (!v.empty() && (v[0] == '+' || v[0] == '-')) v.erase(0, 1);
  if (v.empty()) return std::nullopt;
  std::optional<std::uint64_t> m;
  if (v == "0") {
    m = 0;
  } else if (v.starts_with("0b")) {
    m = magnitude(std::string_view(v).substr(2), 2);
  } else if (v.starts_with("0x")) {
    m = magnitude(std::string_view(v).substr(2), 16);
  } else if (v[0] == '0') {
    m = magnitude(v, 8);
  } else if (v.find(':') != std::string::npos) {
    std::uint64_t total = 0;
    std::size_t begin = 0;
    while (begin <= v.size()) {
      const std::size_t end = std::min(v.find(':', begin), v.size());
      const std::optional<std::uint64_t> part =
          magnitude(std::string_view(v).substr(begin, end - begin), 10);
      if (!part || __builtin_mul_overflow(total, 60u, &total) ||
          __builtin_add_overflow(total, *part, &total)) {
        return std::nullopt;
      }
      begin = end + 1;
    }
    m = total;
  } else {
    m = magnitude(v, 10);
  }
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (!m || *m > kMax + (negative ? 1 : 0)) return std::nullopt;
  if (!negative) return static_cast<std::int64_t>(*m);
  return *m == kMax + 1 ? std::numeric_limits<std::int64_t>::min() : -static_cast<std::int64_t>(*m);
}

/** Python's float() of `text`, as far as a config needs it: a whole decimal number. */
std::optional<double> decimal_double(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || stop != end) return std::nullopt;
  return value;
}

/** construct_yaml_float (constructor.py 270-292); none for what is not a number. A non-finite
 *  value (.inf, .nan) is returned as such. */
std::optional<double> yaml_float(std::string_view text) {
  std::string v = lower(without_underscores(text));
  const double sign = !v.empty() && v[0] == '-' ? -1.0 : 1.0;
  if (!v.empty() && (v[0] == '+' || v[0] == '-')) v.erase(0, 1);
  if (v.empty()) return std::nullopt;
  if (v == ".inf") return sign * std::numeric_limits<double>::infinity();
  if (v == ".nan") return std::numeric_limits<double>::quiet_NaN();
  if (v.find(':') == std::string::npos) {
    const std::optional<double> d = decimal_double(v);
    return d ? std::optional<double>(sign * *d) : std::nullopt;
  }
  double total = 0;
  std::size_t begin = 0;
  while (begin <= v.size()) {
    const std::size_t end = std::min(v.find(':', begin), v.size());
    const std::optional<double> part =
        decimal_double(std::string_view(v).substr(begin, end - begin));
    if (!part) return std::nullopt;
    total = total * 60 + *part;
    begin = end + 1;
  }
  return sign * total;
}

json integer_of(std::string_view text, const YamlPlace& at) {
  if (const std::optional<std::int64_t> v = yaml_int(text)) return *v;
  fail_at(at, fmt::format("'{}' is not an integer from {} to {}", shown(text),
                          std::numeric_limits<std::int64_t>::min(),
                          std::numeric_limits<std::int64_t>::max()));
}

json float_of(std::string_view text, const YamlPlace& at) {
  const std::optional<double> v = yaml_float(text);
  if (!v) fail_at(at, fmt::format("'{}' is not a number", shown(text)));
  if (!std::isfinite(*v)) {
    fail_at(at, fmt::format("'{}' is not a finite number (allowed: finite numbers)", shown(text)));
  }
  return *v;
}

const std::set<std::string_view>& true_words() {
  static const std::set<std::string_view> words = {"yes",  "Yes", "YES", "true", "True",
                                                   "TRUE", "on",  "On",  "ON"};
  return words;
}

const std::set<std::string_view>& false_words() {
  static const std::set<std::string_view> words = {"no",    "No",  "NO",  "false", "False",
                                                   "FALSE", "off", "Off", "OFF"};
  return words;
}

/** A plain scalar without a tag, resolved as PyYAML's implicit resolvers resolve it. */
json implicit_scalar(const std::string& text, const YamlPlace& at) {
  if (true_words().count(text) != 0) return true;
  if (false_words().count(text) != 0) return false;
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return nullptr;
  }
  if (float_pattern(text)) return float_of(text, at);
  if (int_pattern(text)) return integer_of(text, at);
  if (text == "=") {
    // resolver.py 216-219 tags it tag:yaml.org,2002:value, which SafeConstructor refuses.
    fail_at(at, "a plain '=' (yaml.safe_load refuses it; allowed: quote it, '=')");
  }
  // Timestamps (2024-01-31) stay strings: PyYAML's dates only reach str() in accelerate.
  return text;
}

/** A scalar with an explicit tag (!!str, !!int, ...): the standard ones only. */
json tagged_scalar(const std::string& text, std::string_view tag, const YamlPlace& at) {
  if (tag == "!" || tag == std::string(kTagPrefix) + "str") return text;
  if (tag == std::string(kTagPrefix) + "int") return integer_of(text, at);
  if (tag == std::string(kTagPrefix) + "float") return float_of(text, at);
  if (tag == std::string(kTagPrefix) + "null") return nullptr;
  if (tag == std::string(kTagPrefix) + "bool") {
    const std::string word = lower(text);
    if (word == "yes" || word == "true" || word == "on") return true;
    if (word == "no" || word == "false" || word == "off") return false;
    fail_at(at, fmt::format("!!bool '{}' is not a boolean (allowed: true, false, yes, no, on, off)",
                            shown(text)));
  }
  fail_at(at, fmt::format("the tag '{}' is not supported (allowed: !!str, !!int, !!float, "
                          "!!bool, !!null, !!map, !!seq)",
                          shown(tag)));
}

/** The scalar of a YAML_SCALAR_EVENT as a JSON value. */
json scalar_value(const yaml_event_t& e, const YamlPlace& at) {
  const std::string text(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
  if (e.data.scalar.tag != nullptr) {
    return tagged_scalar(text, reinterpret_cast<const char*>(e.data.scalar.tag), at);
  }
  return e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? implicit_scalar(text, at) : json(text);
}

/** libyaml's parser, deleted on every way out. */
class YamlParser {
 public:
  explicit YamlParser(const std::string& text) {
    if (yaml_parser_initialize(&parser_) == 0) {
      throw InputError("", "", "libyaml could not start (out of memory)");
    }
    yaml_parser_set_input_string(&parser_, reinterpret_cast<const unsigned char*>(text.data()),
                                 text.size());
  }
  ~YamlParser() { yaml_parser_delete(&parser_); }
  YamlParser(const YamlParser&) = delete;
  YamlParser& operator=(const YamlParser&) = delete;

  /** The next event into `event`; false on a syntax error (then error() says which). */
  bool next(yaml_event_t& event) { return yaml_parser_parse(&parser_, &event) != 0; }
  const yaml_parser_t& error() const { return parser_; }

 private:
  yaml_parser_t parser_{};
};

/** One event, deleted when it goes out of scope. */
struct YamlEvent {
  yaml_event_t event{};
  YamlEvent() = default;
  YamlEvent(const YamlEvent&) = delete;
  YamlEvent& operator=(const YamlEvent&) = delete;
  ~YamlEvent() { yaml_event_delete(&event); }
};

/** libyaml's syntax error as one line with its line and column. */
[[noreturn]] void syntax_error(const yaml_parser_t& p, const std::string& text,
                               const std::string& file) {
  if (p.error == YAML_MEMORY_ERROR) throw InputError(file, "", "libyaml ran out of memory");
  yaml_mark_t mark = p.problem_mark;
  std::string problem = p.problem != nullptr ? p.problem : "unknown error";
  if (p.error == YAML_READER_ERROR) {
    // A reader error (bad UTF-8, a control character) has a byte offset, not a mark.
    const std::size_t offset = std::min(p.problem_offset, text.size());
    const std::string_view before = std::string_view(text).substr(0, offset);
    const std::size_t last_newline = before.rfind('\n');
    mark.line = static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
    mark.column = last_newline == std::string_view::npos ? offset : offset - last_newline - 1;
    if (p.problem_value != -1) problem += fmt::format(" (#{:X})", p.problem_value);
  }
  std::string what = fmt::format("YAML syntax error at line {}, column {}: {}", mark.line + 1,
                                 mark.column + 1, problem);
  if (p.context != nullptr) {
    what += fmt::format(" ({} at line {}, column {})", p.context, p.context_mark.line + 1,
                        p.context_mark.column + 1);
  }
  throw InputError(file, "", what);
}

/** Builds the JSON value from libyaml's events: a stack of the open mappings and sequences. */
class JsonFromYaml {
 public:
  explicit JsonFromYaml(const std::string& file) : file_(file) {}

  /** Takes one event; true at the end of the stream. */
  bool take(const yaml_event_t& e) {
    const YamlPlace at{file_, e.start_mark};
    switch (e.type) {
      case YAML_STREAM_END_EVENT:
        return true;
      case YAML_DOCUMENT_START_EVENT:
        if (++documents_ > 1) {
          fail_at(at, "a second YAML document (yaml.safe_load reads one; allowed: one)");
        }
        break;
      case YAML_MAPPING_START_EVENT:
        refuse_anchor(e.data.mapping_start.anchor, at);
        check_collection_tag(e.data.mapping_start.tag, "map", at);
        open(json::object(), at);
        break;
      case YAML_SEQUENCE_START_EVENT:
        refuse_anchor(e.data.sequence_start.anchor, at);
        check_collection_tag(e.data.sequence_start.tag, "seq", at);
        open(json::array(), at);
        break;
      case YAML_MAPPING_END_EVENT:
      case YAML_SEQUENCE_END_EVENT: {
        json done = std::move(open_.back().value);
        open_.pop_back();
        place(std::move(done));
        break;
      }
      case YAML_SCALAR_EVENT:
        refuse_anchor(e.data.scalar.anchor, at);
        scalar(e, at);
        break;
      case YAML_ALIAS_EVENT:
        fail_at(at,
                "an alias (*name): anchors and aliases are not supported (allowed: the value "
                "written out)");
      default:
        break;
    }
    return false;
  }

  json result() { return root_ ? std::move(*root_) : json(nullptr); }

 private:
  struct Open {
    json value;                      ///< the object or array being filled
    std::optional<std::string> key;  ///< an object's key waiting for its value
  };

  static void refuse_anchor(const yaml_char_t* anchor, const YamlPlace& at) {
    if (anchor == nullptr) return;
    fail_at(at, fmt::format("an anchor (&{}): anchors and aliases are not supported (allowed: the "
                            "value written out)",
                            shown(reinterpret_cast<const char*>(anchor))));
  }

  static void check_collection_tag(const yaml_char_t* tag, const char* kind, const YamlPlace& at) {
    if (tag == nullptr) return;
    const std::string name = reinterpret_cast<const char*>(tag);
    if (name == "!" || name == std::string(kTagPrefix) + kind) return;
    fail_at(at, fmt::format("the tag '{}' is not supported (allowed: !!{})", shown(name), kind));
  }

  bool expects_key() const {
    return !open_.empty() && open_.back().value.is_object() && !open_.back().key;
  }

  void open(json collection, const YamlPlace& at) {
    if (expects_key()) {
      fail_at(at, "a mapping or list as a key (allowed: a name)");
    }
    if (open_.size() >= kMaxJsonDepth) {
      fail_at(at, fmt::format("nested more than {} levels", kMaxJsonDepth));
    }
    open_.push_back({std::move(collection), std::nullopt});
  }

  void scalar(const yaml_event_t& e, const YamlPlace& at) {
    if (!expects_key()) {
      place(scalar_value(e, at));
      return;
    }
    std::string key(reinterpret_cast<const char*>(e.data.scalar.value), e.data.scalar.length);
    if (e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && e.data.scalar.tag == nullptr &&
        key == "<<") {
      fail_at(at, "a merge key (<<) is not supported (allowed: the keys written out)");
    }
    if (open_.back().value.contains(key)) {
      fail_at(at, fmt::format("'{}' is given twice in one mapping (allowed: once)", shown(key)));
    }
    open_.back().key = std::move(key);
  }

  void place(json value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return;
    }
    Open& parent = open_.back();
    if (parent.value.is_array()) {
      parent.value.push_back(std::move(value));
    } else {
      parent.value[*parent.key] = std::move(value);
      parent.key.reset();
    }
  }

  const std::string& file_;
  std::vector<Open> open_;
  std::optional<json> root_;
  int documents_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The accelerate config.

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

/** The keys whose ACCELERATE_* variable _deepspeed_config_checks refuses next to a
 *  deepspeed_config_file (dataclasses.py 1505-1530), as it names them. */
const std::vector<std::string>& keys_refused_with_a_file() {
  static const std::vector<std::string> keys = {
      "gradient_accumulation_steps", "gradient_clipping",     "zero_stage",
      "offload_optimizer_device",    "offload_param_device",  "offload_param_nvme_path",
      "offload_optimizer_nvme_path", "zero3_save_16bit_model"};
  return keys;
}

/** Python's truth of a YAML value (process_config's `config_dict["fp16"]`). */
bool truthy(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();
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

/** What one accelerate config says, read key by key (the file, its notes). */
class AccelerateReader {
 public:
  AccelerateReader(std::string file, json doc) : file_(std::move(file)), doc_(std::move(doc)) {}

  AccelerateConfig read() {
    if (!doc_.is_object()) {
      throw InputError(
          file_, "",
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

 private:
  /** deepspeed_config's `key` when given and not null (null is no value: the launch argument
   *  stays None, launch.py 1270-1271, and DeepSpeedPlugin takes its default). */
  const json* present(const std::string& key) const {
    const auto it = ds_.find(key);
    return it == ds_.end() || it->is_null() ? nullptr : &*it;
  }

  void note(std::string text) {
    // The names and paths in notes come from the user's file: shown() keeps a note one line.
    config_.notes.push_back(fmt::format("accelerate config {}: {}", shown(file_), text));
  }

  [[noreturn]] void refuse(const std::string& key, const std::string& what) const {
    throw InputError(file_, key, what);
  }

  void check_keys() const {
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

  void check_environment() const {
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
  void read_mixed_precision() {
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
  std::optional<int> count(const char* key, bool minus_one_is_absent) const {
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

  void read_cluster() {
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
      refuse(
          "num_processes",
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
  void read_parallelism() {
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

  void check_deepspeed_keys() {
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

  // --- deepspeed_config_file (dataclasses.py 1265-1298) ------------------------------------

  void from_file(const json& value) {
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
  void refuse_inline_keys() const {
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
  static bool fill_auto(json& config, const std::string& dotted, const json& filled) {
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

  // --- the inline keys (dataclasses.py 1227-1263 and 1299-1321) -----------------------------

  /** zero_stage: int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", 2)), the variable being
   *  str(value) (utils/launch.py 566-567). */
  int zero_stage() {
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
  std::string offload_device(const std::string& key) {
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
  json accumulation() {
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
  std::optional<json> clipping() {
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
  bool save_16bit() const {
    const json* v = present("zero3_save_16bit_model");
    if (v == nullptr) return false;
    if (v->is_boolean()) return v->get<bool>();
    return v->is_string() && lower(v->get<std::string>()) == "true";
  }

  void from_inline_keys() {
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
    json config = {
        {"train_batch_size", "auto"},
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

  // --- after either -------------------------------------------------------------------------

  /** DeepSpeedPlugin.set_mixed_precision (1413-1444) with what AcceleratorState passes it (state.py
   *  975): the launch's mixed_precision, 'no' when the YAML gives none. */
  void set_mixed_precision() {
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
      note(fmt::format("\"auto\" precision filled for mixed_precision '{}': {}", mp,
                       joined(filled)));
    }
  }

  /** zero3_init_flag: str_to_bool of the variable str(value).lower() (utils/launch.py 576-577;
   *  environment.py 59-71), else whether the ds_config is ZeRO-3 (dataclasses.py 1325-1337). */
  void read_zero3_init() {
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

  /** The dotted names of the "auto" values in `v` (objects only: a list's are not filled). */
  static void auto_keys(const json& v, const std::string& prefix, std::vector<std::string>& out) {
    if (!v.is_object()) return;
    for (const auto& [name, child] : v.items()) {
      if (child.is_string() && child.get<std::string>() == "auto") {
        out.push_back(shown(prefix + name));
      } else {
        auto_keys(child, prefix + name + ".", out);
      }
    }
  }

  void note_auto() {
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

  void note_ignored() {
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

  std::string file_;
  json doc_;
  json ds_;  ///< deepspeed_config
  std::string mixed_precision_ = "no";
  bool mixed_from_file_ = false;  ///< the YAML gave mixed_precision (or the old fp16 key)
  std::vector<std::string> defaults_;
  std::vector<std::string> ignored_;
  AccelerateConfig config_;
};

}  // namespace

bool is_accelerate_config_path(const std::string& path) {
  const std::string name = lower(path);
  return name.ends_with(".yaml") || name.ends_with(".yml");
}

json parse_yaml_input(const std::string& text, const std::string& file) {
  YamlParser parser(text);
  JsonFromYaml builder(file);
  for (;;) {
    YamlEvent event;
    if (!parser.next(event.event)) syntax_error(parser.error(), text, file);
    if (builder.take(event.event)) return builder.result();
  }
}

AccelerateConfig read_accelerate_config(const std::string& path, const std::string& where,
                                        const std::string& key) {
  const std::string text =
      read_input_file(path, where.empty() ? path : where, key, "cannot read '" + shown(path) + "'");
  return AccelerateReader(path, parse_yaml_input(text, path)).read();
}

}  // namespace hpz
