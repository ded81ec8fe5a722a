// Names: "did you mean" for every name the loader refuses, and the small parsers of the public
// header (parse_step_list, parse_override, to_string).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/scenario.hpp"
#include "sim/scenario/detail.hpp"
#include "sim/text.hpp"

namespace hpz {
namespace scenario_detail {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> previous(b.size() + 1);
  std::vector<std::size_t> current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

}  // namespace

std::string allowed(const std::vector<std::string>& names) {
  return " (allowed: " + joined(names) + ")";
}

/** The known name closest to `name`, if it is close enough to be a plausible typo. */
std::optional<std::string> closest(const std::string& name, const std::vector<std::string>& known) {
  if (name.size() > 200) return std::nullopt;  // no name is that long; spares the distances
  // A unique completion ('h100' -> 'h100-sxm') beats a closer but different name ('h200').
  std::vector<std::string> completions;
  for (const std::string& candidate : known) {
    if (name.size() >= 2 && candidate.starts_with(name)) completions.push_back(candidate);
  }
  if (completions.size() == 1) return completions.front();
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(2, name.size() / 3) + 1;
  for (const std::string& candidate : known) {
    const std::size_t distance = edit_distance(name, candidate);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::string did_you_mean(const std::optional<std::string>& suggestion) {
  return suggestion ? "; did you mean '" + *suggestion + "'?" : "";
}

}  // namespace scenario_detail

std::vector<int> parse_step_list(const std::string& text, const std::string& where,
                                 const std::string& key) {
  std::vector<int> out;
  std::size_t from = 0;
  while (!text.empty() && from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string part = text.substr(from, comma - from);
    int step = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), step);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || step < 0 ||
        (!out.empty() && step <= out.back())) {
      throw InputError(where, key,
                       fmt::format("'{}' is not a list of steps (allowed: step numbers from 0, "
                                   "ascending and comma-separated, such as \"0,1\", or \"\" "
                                   "for none)",
                                   shown(text)));
    }
    out.push_back(step);
    from = comma + 1;
  }
  return out;
}

std::optional<std::string> closest_name(const std::string& name,
                                        const std::vector<std::string>& known) {
  return scenario_detail::closest(name, known);
}

Override parse_override(const std::string& text) {
  const auto equals = text.find('=');
  const auto trim = [](std::string s) {
    const auto first = s.find_first_not_of(" \t");
    const auto last = s.find_last_not_of(" \t");
    return first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
  };
  if (equals == std::string::npos) {
    throw InputError(scenario_detail::kSetWhere, text,
                     "expected section.key=value, e.g. --set zero.overlap_comm=false");
  }
  Override override{trim(text.substr(0, equals)), trim(text.substr(equals + 1))};
  if (override.first.empty()) {
    throw InputError(scenario_detail::kSetWhere, text,
                     "missing key before '=' (expected section.key=value)");
  }
  return override;
}

const char* to_string(Variant v) {
  switch (v) {
    case Variant::kStock:
      return "stock";
    case Variant::kHostSync:
      return "host-sync";
    case Variant::kEventWait:
      return "event-wait";
  }
  return "unknown";
}

}  // namespace hpz
