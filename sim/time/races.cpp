#include "sim/time/races.hpp"

#include <algorithm>
#include <unordered_map>

namespace hpz::time {
namespace {

std::string_view stream_name(const RankSchedule& rs, const Op& op) {
  return op.stream == kHostStream
             ? std::string_view("host")
             : std::string_view(rs.streams[static_cast<std::size_t>(op.stream)].name);
}

bool matches(const RankSchedule& rs, const Op& op, const check::OpLabel& label) {
  return op.purpose == label.purpose && op.kind == label.kind &&
         stream_name(rs, op) == label.stream;
}

/** The last access of a buffer by an op with the first side's signature. */
struct Pending {
  std::uint32_t op = 0;
  std::uint64_t lo = 0, hi = 0;
};

void expand(const Schedule& schedule, std::uint32_t g, const check::Finding& f, Rank r,
            std::vector<RaceInstance>& out) {
  const RankSchedule& rs = schedule.ranks[static_cast<std::size_t>(r)];
  std::unordered_map<BufferId, Pending> open;
  for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
    const Op& op = rs.ops[i];
    if (op.kind == OpKind::kAlloc || op.kind == OpKind::kFree) open.erase(op.buffer);
    const bool is_second = matches(rs, op, f.second);
    const bool is_first = matches(rs, op, f.first);
    for (const Access& a : schedule.accesses_of(r, op)) {
      if (rs.buffers[a.buffer].role != f.role) continue;
      const auto it = open.find(a.buffer);
      if (is_second && a.mode == f.second_mode && it != open.end() && a.offset < it->second.hi &&
          it->second.lo < a.offset + a.bytes) {
        out.push_back({g, r, it->second.op, i});
        open.erase(it);  // like the checker: one race per write, with its first unordered access
        continue;
      }
      if (is_first && a.mode == f.first_mode) open[a.buffer] = {i, a.offset, a.offset + a.bytes};
    }
  }
}

}  // namespace

std::vector<RaceInstance> race_instances(const Schedule& schedule,
                                         const check::CheckResult& result) {
  std::vector<RaceInstance> out;
  for (std::uint32_t g = 0; g < result.groups.size(); ++g) {
    const check::FindingGroup& group = result.groups[g];
    if (group.example.kind != check::FindingKind::kRace) continue;
    for (Rank r : group.ranks) expand(schedule, g, group.example, r, out);
  }
  // One pair once, even when it shares several buffers.
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

}  // namespace hpz::time
