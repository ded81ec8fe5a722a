// YAML -> JSON, typed as PyYAML's safe_load types it (PyYAML 6.0,
// yaml/pyyaml d51d8a138f7230834fc6e95635ff09ebd329185f: lib/yaml/resolver.py 170-205,
// lib/yaml/constructor.py 224-292), which accelerate reads its config with.
#include <fmt/format.h>
#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
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
#include "sim/text.hpp"

namespace hpz::accelerate_detail {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
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

/** Python's float() of `text`, as far as a config needs it: a whole decimal number. */
std::optional<double> decimal_double(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || stop != end) return std::nullopt;
  return value;
}

namespace {

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

/** Moves i past [0-9_]*. */
void skip_digits(std::string_view s, std::size_t& i) {
  while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
}

/** One sexagesimal group, :[0-5]?[0-9], from s[i] (a ':'); false, i anywhere, when it is not. */
bool sexagesimal_group(std::string_view s, std::size_t& i) {
  if (i >= s.size() || s[i] != ':') return false;
  ++i;
  if (i + 1 < s.size() && s[i] >= '0' && s[i] <= '5' && is_digit(s[i + 1])) {
    i += 2;
    return true;
  }
  if (i < s.size() && is_digit(s[i])) {
    ++i;
    return true;
  }
  return false;
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
  skip_digits(s, i);
  // (?::[0-5]?[0-9])* to the end
  while (i < s.size()) {
    if (!sexagesimal_group(s, i)) return false;
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
    skip_digits(s, i);
    return exponent_pattern(s.substr(i));
  }
  if (!is_digit(s[0])) return false;
  i = 1;
  skip_digits(s, i);
  if (i < s.size() && s[i] == '.') {
    ++i;
    skip_digits(s, i);
    return exponent_pattern(s.substr(i));
  }
  int groups = 0;
  while (i < s.size() && s[i] == ':') {
    if (!sexagesimal_group(s, i)) return false;
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

}  // namespace
}  // namespace hpz::accelerate_detail

namespace hpz {

nlohmann::json parse_yaml_input(const std::string& text, const std::string& file) {
  accelerate_detail::YamlParser parser(text);
  accelerate_detail::JsonFromYaml builder(file);
  for (;;) {
    accelerate_detail::YamlEvent event;
    if (!parser.next(event.event)) accelerate_detail::syntax_error(parser.error(), text, file);
    if (builder.take(event.event)) return builder.result();
  }
}

}  // namespace hpz
