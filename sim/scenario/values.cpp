// Values and where they came from: a value as written (TOML, JSON, --set) read as its key's
// type, and the JSON files a scenario names.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "sim/scenario/detail.hpp"
#include "sim/text.hpp"

namespace hpz::scenario_detail {
namespace {

[[noreturn]] void wrong_type(const Setting& s, const std::string& key, const char* expected) {
  throw InputError(s.where, key, fmt::format("expected {}, got {}", expected, describe(s.raw)));
}

/** A JSON value as a Raw, so that JSON keys convert like TOML and --set ones: false for a value
 *  no key takes (null, an array, an object). Written into `out` (not returned as an
 *  optional<Raw>: GCC 12 at -O2 then warns that the moved string may be uninitialized). */
bool raw_of(const json& value, Raw& out) {
  if (value.is_boolean()) {
    out = value.get<bool>();
  } else if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
      out = value.get<double>();
    } else {
      out = value.get<std::int64_t>();
    }
  } else if (value.is_number_float()) {
    out = value.get<double>();
  } else if (value.is_string()) {
    out = value.get<std::string>();
  } else {
    return false;
  }
  return true;
}

}  // namespace

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

Setting json_setting(const json& value, const std::string& file, const std::string& key,
                     const char* expected) {
  Setting s{Raw{}, file, {}};
  if (!raw_of(value, s.raw)) {
    throw InputError(file, key, fmt::format("expected {}, got {}", expected, shown_json(value)));
  }
  return s;
}

}  // namespace hpz::scenario_detail
