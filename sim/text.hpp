// Small text helpers shared by the input readers' messages.
#pragma once

#include <string>
#include <vector>

namespace hpz {

/** "a, b, c": names for an "allowed:" list or a note. */
inline std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace hpz
