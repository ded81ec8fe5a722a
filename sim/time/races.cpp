#include "sim/time/races.hpp"

#include <algorithm>
#include <tuple>

#include "sim/time/by_class.hpp"

namespace hpz::time {

std::vector<RaceInstance> race_instances(const check::CheckResult& result) {
  std::vector<RaceInstance> out;
  for (std::uint32_t g = 0; g < result.groups.size(); ++g) {
    const check::FindingGroup& group = result.groups[g];
    if (group.example.kind != check::FindingKind::kRace) continue;
    for (const check::OpPair& p : group.occurrences) out.push_back({g, p.rank, p.first, p.second});
  }
  // One pair once, even when the checker found it on several buffers or byte ranges.
  std::sort(out.begin(), out.end(), [](const RaceInstance& a, const RaceInstance& b) {
    return std::tie(a.group, a.rank, a.first, a.second) <
           std::tie(b.group, b.rank, b.first, b.second);
  });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const RaceInstance& a, const RaceInstance& b) {
                          return a.group == b.group && a.rank == b.rank && a.first == b.first &&
                                 a.second == b.second;
                        }),
            out.end());
  return out;
}

Manifestation manifestation(const Timeline& timeline, const RaceInstance& race) {
  const auto& times = timeline.ranks[static_cast<std::size_t>(race.rank)];
  Manifestation m;
  m.first_end_s = times[race.first].end_s;
  m.second_start_s = times[race.second].start_s;
  m.overlap_s = m.first_end_s - m.second_start_s;
  m.manifested = m.second_start_s >= 0 && m.first_end_s >= 0 && m.overlap_s > 0;
  return m;
}

Manifestation manifestation(const Timeline& timeline, RaceInstance race,
                            const NodeQuotient* quotient) {
  if (quotient != nullptr && timeline.ranks.size() < static_cast<std::size_t>(quotient->world)) {
    race.rank = quotient->index_of(race.rank);
  }
  return manifestation(timeline, race);
}

}  // namespace hpz::time
