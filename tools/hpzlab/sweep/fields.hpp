// Reading back what a sweep or its commands wrote (issue 34): a child's JSON (DIR/out/pP-vV.json,
// DIR/work/...), `hpzlab repro`'s JSON, a results.jsonl row and DIR/sweep.json. Every field read
// from them goes through Field, which knows the file and the key: a value that is not what a
// sweep writes there is one line, InputError(FILE, KEY, "expected ..., got ...") (exit 2), never a
// nlohmann exception ("internal error", exit 70).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hpz::sweep {

/** One value of a file read back, with where it is (the file, and the key path inside it such as
 *  runs[0].step_time_s). A member that is absent is a Field too: reading it says "missing". */
class Field {
 public:
  /** The whole document of `file`. */
  Field(const nlohmann::json& value, std::string file);

  const std::string& file() const { return file_; }
  const std::string& key() const { return key_; }
  /** Whether the member this Field stands for is there. */
  bool present() const { return value_ != nullptr; }
  /** Present and null. */
  bool is_null() const { return value_ != nullptr && value_->is_null(); }

  /** Member `name` of this object (absent: a Field that is not present()). Throws InputError
   *  when this is not an object. */
  Field at(const std::string& name) const;
  /** Element `i` of this array (size() first). */
  Field item(std::size_t i) const;
  /** The size of this array; throws InputError when it is not an array. */
  std::size_t size() const;
  /** Checks that this is an object (for a file whose top must be one). */
  void object() const;

  bool boolean() const;                          ///< true or false
  double number() const;                         ///< a number
  std::optional<double> number_or_null() const;  ///< a number or null
  /** A whole number from `min` to `max`. */
  std::int64_t integer(std::int64_t min, std::int64_t max) const;
  /** A whole number from `min` to `max`, or null. */
  std::optional<std::int64_t> integer_or_null(std::int64_t min, std::int64_t max) const;
  std::string string() const;                ///< a string
  std::vector<std::string> strings() const;  ///< an array of strings
  /** One of `allowed` (a string). */
  std::string one_of(const std::vector<std::string>& allowed) const;
  /** The value, whatever it is (present). */
  const nlohmann::json& json() const;

  /** Throws InputError(file, key, "expected <expected>, got <value>") or, for an absent member,
   *  "missing (expected <expected>)". */
  [[noreturn]] void fail(const std::string& expected) const;

 private:
  Field(const nlohmann::json* value, std::string file, std::string key);

  const nlohmann::json* value_;
  std::string file_, key_;
};

/** `text` with every byte sequence that is not UTF-8 replaced by U+FFFD: a child's standard
 *  error is any bytes, and nlohmann::json refuses to dump a string that is not UTF-8. */
std::string valid_utf8(std::string_view text);

}  // namespace hpz::sweep
