// One error policy for the whole program.
//
// User mistakes (a bad scenario file, a bad key, a bad flag) throw InputError carrying the file,
// the key and the allowed values; main() catches it, prints one line and exits with code 2.
// Programmer errors are assertions.
#pragma once

#include <stdexcept>
#include <string>

namespace hpz {

/** A mistake in the user's input: one line naming the file, the key and what is allowed. */
class InputError : public std::runtime_error {
 public:
  /** `where` is a file (or "--set"), `key` a dotted key or flag, `what` the problem and the
   *  allowed values. Any of where/key may be empty. */
  InputError(const std::string& where, const std::string& key, const std::string& what)
      : std::runtime_error(compose(where, key, what)) {}

 private:
  static std::string compose(const std::string& where, const std::string& key,
                             const std::string& what) {
    std::string line = where;
    if (!key.empty()) line += (line.empty() ? "" : ": ") + key;
    return line.empty() ? what : line + ": " + what;
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
