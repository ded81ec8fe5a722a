#include "tools/hpzlab/sweep/fields.hpp"

#include <fmt/format.h>

#include <limits>

#include "sim/error.hpp"
#include "sim/input.hpp"

namespace hpz::sweep {

namespace {

std::string whole_number(std::int64_t min, std::int64_t max) {
  if (max == std::numeric_limits<std::int64_t>::max()) {
    return fmt::format("a whole number, {} or more", min);
  }
  return fmt::format("a whole number from {} to {}", min, max);
}

}  // namespace

Field::Field(const nlohmann::json& value, std::string file)
    : value_(&value), file_(std::move(file)) {}

Field::Field(const nlohmann::json* value, std::string file, std::string key)
    : value_(value), file_(std::move(file)), key_(std::move(key)) {}

void Field::fail(const std::string& expected) const {
  if (value_ == nullptr) throw InputError(file_, key_, "missing (expected " + expected + ")");
  throw InputError(file_, key_, "expected " + expected + ", got " + shown_json(*value_));
}

void Field::object() const {
  if (value_ == nullptr || !value_->is_object()) fail("an object");
}

Field Field::at(const std::string& name) const {
  object();
  const auto it = value_->find(name);
  return {it == value_->end() ? nullptr : &*it, file_, key_.empty() ? name : key_ + "." + name};
}

std::size_t Field::size() const {
  if (value_ == nullptr || !value_->is_array()) fail("an array");
  return value_->size();
}

Field Field::item(std::size_t i) const {
  if (i >= size()) fail(fmt::format("an array of more than {} elements", i));
  return {&(*value_)[i], file_, fmt::format("{}[{}]", key_, i)};
}

bool Field::boolean() const {
  if (value_ == nullptr || !value_->is_boolean()) fail("true or false");
  return value_->get<bool>();
}

double Field::number() const {
  if (value_ == nullptr || !value_->is_number()) fail("a number");
  return value_->get<double>();
}

std::optional<double> Field::number_or_null() const {
  if (is_null()) return std::nullopt;
  if (value_ == nullptr || !value_->is_number()) fail("a number or null");
  return value_->get<double>();
}

std::int64_t Field::integer(std::int64_t min, std::int64_t max) const {
  const std::string expected = whole_number(min, max);
  if (value_ == nullptr || !value_->is_number_integer()) fail(expected);
  if (value_->is_number_unsigned()) {
    const auto u = value_->get<std::uint64_t>();
    if (max < 0 || u > static_cast<std::uint64_t>(max)) fail(expected);
    if (static_cast<std::int64_t>(u) < min) fail(expected);
    return static_cast<std::int64_t>(u);
  }
  const auto v = value_->get<std::int64_t>();
  if (v < min || v > max) fail(expected);
  return v;
}

std::optional<std::int64_t> Field::integer_or_null(std::int64_t min, std::int64_t max) const {
  if (is_null()) return std::nullopt;
  if (value_ == nullptr || !value_->is_number_integer()) {
    fail(whole_number(min, max) + ", or null");
  }
  return integer(min, max);
}

std::string Field::string() const {
  if (value_ == nullptr || !value_->is_string()) fail("a string");
  return value_->get<std::string>();
}

std::vector<std::string> Field::strings() const {
  if (value_ == nullptr || !value_->is_array()) fail("an array of strings");
  std::vector<std::string> out;
  out.reserve(value_->size());
  for (std::size_t i = 0; i < value_->size(); ++i) out.push_back(item(i).string());
  return out;
}

std::string Field::one_of(const std::vector<std::string>& allowed) const {
  std::string list;
  for (std::size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) list += i + 1 == allowed.size() ? " or " : ", ";
    list += allowed[i];
  }
  if (value_ == nullptr || !value_->is_string()) fail(list);
  const std::string& s = value_->get_ref<const std::string&>();
  for (const std::string& a : allowed) {
    if (s == a) return s;
  }
  fail(list);
}

const nlohmann::json& Field::json() const {
  if (value_ == nullptr) fail("a value");
  return *value_;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto continuation = [&](std::size_t i) {
    return i < text.size() && (byte(i) & 0xc0) == 0x80;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = byte(i);
    std::size_t n = 0;  // the sequence's length when it is well formed (RFC 3629)
    if (c < 0x80) {
      n = 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = continuation(i + 1) ? 2 : 0;
    } else if (c >= 0xe0 && c <= 0xef) {
      const bool second_ok = continuation(i + 1) && !(c == 0xe0 && byte(i + 1) < 0xa0) &&
                             !(c == 0xed && byte(i + 1) > 0x9f);  // no overlong, no surrogate
      n = second_ok && continuation(i + 2) ? 3 : 0;
    } else if (c >= 0xf0 && c <= 0xf4) {
      const bool second_ok = continuation(i + 1) && !(c == 0xf0 && byte(i + 1) < 0x90) &&
                             !(c == 0xf4 && byte(i + 1) > 0x8f);  // no overlong, <= U+10FFFF
      n = second_ok && continuation(i + 2) && continuation(i + 3) ? 4 : 0;
    }
    if (n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD for the one byte that starts no sequence
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace hpz::sweep
