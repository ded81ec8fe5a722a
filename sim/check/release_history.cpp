#include "sim/check/release_history.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "sim/check/report.hpp"

namespace hpz::check {

std::string signature_of(const FindingGroup& group) {
  const Finding& f = group.example;
  if (f.kind == FindingKind::kCollectiveMismatch) {
    return fmt::format("{}: {} vs {}", to_string(f.kind), to_string(f.first.purpose),
                       to_string(f.second.purpose));
  }
  return fmt::format("{}: {} vs {}, on the {}", to_string(f.kind), to_string(f.first.purpose),
                     to_string(f.second.purpose), to_string(f.role));
}

std::string span_of(const std::vector<std::string>& releases) {
  if (releases.empty()) return "";
  return releases.size() == 1 ? releases.front() : releases.front() + "-" + releases.back();
}

std::vector<FindingHistory> finding_history(std::span<const EpochVerdict> epochs) {
  std::vector<FindingHistory> out;
  std::map<std::string, std::size_t> index;
  // present[s][e]: signature s's count in epoch e (0: absent or not checked).
  std::vector<std::vector<std::uint64_t>> present;
  for (std::size_t e = 0; e < epochs.size(); ++e) {
    if (epochs[e].result == nullptr) continue;
    for (const FindingGroup& g : epochs[e].result->groups) {
      const std::string sig = signature_of(g);
      auto [it, fresh] = index.emplace(sig, out.size());
      if (fresh) {
        out.push_back({sig, g.example.kind, {}, "", "", "", 0, remedy(g.example)});
        present.emplace_back(epochs.size(), 0);
      }
      present[it->second][e] += g.count;
    }
  }
  for (std::size_t s = 0; s < out.size(); ++s) {
    FindingHistory& h = out[s];
    std::vector<std::string> run;
    std::size_t last = 0;
    for (std::size_t e = 0; e < epochs.size(); ++e) {
      const bool has = present[s][e] > 0;
      if (has) {
        h.count = std::max(h.count, present[s][e]);
        if (h.first.empty()) h.first = epochs[e].releases.front();
        run.insert(run.end(), epochs[e].releases.begin(), epochs[e].releases.end());
        last = e;
        continue;
      }
      if (!run.empty()) h.spans.push_back(span_of(run));
      run.clear();
    }
    if (!run.empty()) {
      h.spans.push_back(span_of(run));
      continue;  // the newest epoch that has it is the newest checked: not fixed
    }
    std::vector<std::string> unchecked;
    for (std::size_t e = last + 1; e < epochs.size(); ++e) {
      if (epochs[e].result == nullptr) {
        unchecked.insert(unchecked.end(), epochs[e].releases.begin(), epochs[e].releases.end());
        continue;
      }
      h.fixed_in = epochs[e].releases.front();
      break;
    }
    if (!h.fixed_in.empty()) h.unchecked_before_fix = span_of(unchecked);
  }
  return out;
}

}  // namespace hpz::check
