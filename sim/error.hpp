// One error policy for the whole program.
//
// User mistakes (a bad scenario file, a bad key, a bad flag) throw InputError carrying the file,
// the key and the allowed values; main() catches it, prints one line and exits with code 2.
// Programmer errors are assertions.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace hpz {

/** Longest value a message quotes whole (shown() cuts longer ones). */
inline constexpr std::size_t kShownMax = 80;

/** `value` as a message quotes it: control characters escaped (\n, \t, \xNN, so a value can
 *  neither split the one-line message nor forge a second one) and, past `max` characters, cut
 *  with "... (N bytes)". Every message builder passes user-supplied values through it. */
inline std::string shown(std::string_view value, std::size_t max = kShownMax) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (out.size() >= max) {
      return out + "... (" + std::to_string(value.size()) + " bytes)";
    }
    const auto c = static_cast<unsigned char>(value[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

/** A mistake in the user's input: one line naming the file, the key and what is allowed. */
class InputError : public std::runtime_error {
 public:
  /** `where` is a file (or "--set"), `key` a dotted key or flag, `what` the problem and the
   *  allowed values. Any of where/key may be empty. The line is made safe here whatever the
   *  callers passed: control characters escaped, a long file or key name cut (shown()). */
  InputError(const std::string& where, const std::string& key, const std::string& what)
      : std::runtime_error(compose(where, key, what)) {}

 private:
  static constexpr std::size_t kNameMax = 200;   ///< longest file or key name shown
  static constexpr std::size_t kWhatMax = 4000;  ///< the rest; the allowed values fit in it

  static std::string compose(const std::string& where, const std::string& key,
                             const std::string& what) {
    std::string line = shown(where, kNameMax);
    if (!key.empty()) line += (line.empty() ? "" : ": ") + shown(key, kNameMax);
    const std::string problem = shown(what, kWhatMax);
    return line.empty() ? problem : line + ": " + problem;
  }
};

/** Process exit codes shared by every subcommand. */
enum ExitCode : int {
  kExitOk = 0,
  kExitFindings = 1,   ///< a check or comparison found problems
  kExitBadInput = 2,   ///< InputError
  kExitNoDevice = 3,   ///< `hpzlab real` without a CUDA device
  kExitInternal = 70,  ///< a bug in hpzlab (EX_SOFTWARE)
};

}  // namespace hpz
