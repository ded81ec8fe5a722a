#include <fmt/format.h>

#include <map>
#include <set>
#include <unordered_map>

#include "sim/time/report.hpp"

namespace hpz::time {
namespace {

/** Appends trace events; tids are 0 for the host and stream + 1 for streams. */
class TraceWriter {
 public:
  void meta(Rank r, int tid, const char* what, const std::string& name) {
    event(fmt::format(R"("ph":"M","pid":{},"tid":{},"name":"{}","args":{{"name":"{}"}})", r, tid,
                      what, name));
  }
  void slice(Rank r, int tid, const std::string& name, std::string_view cat, double start,
             double end, const std::string& args, bool highlight) {
    event(fmt::format(R"("ph":"X","pid":{},"tid":{},"name":"{}","cat":"{}","ts":{:.3f},)"
                      R"("dur":{:.3f},"args":{{{}}}{})",
                      r, tid, name, cat, start * 1e6, (end - start) * 1e6, args,
                      highlight ? R"(,"cname":"terrible")" : ""));
  }
  void flow(std::string_view name, Rank r0, int tid0, double t0, Rank r1, int tid1, double t1) {
    const std::uint64_t id = next_id_++;
    event(fmt::format(R"("ph":"s","id":{},"name":"{}","cat":"flow","pid":{},"tid":{},"ts":{:.3f})",
                      id, name, r0, tid0, t0 * 1e6));
    event(fmt::format(
        R"("ph":"f","bp":"e","id":{},"name":"{}","cat":"flow","pid":{},"tid":{},"ts":{:.3f})", id,
        name, r1, tid1, t1 * 1e6));
  }
  void instant(Rank r, int tid, const std::string& name, double t, const std::string& args) {
    event(fmt::format(R"("ph":"i","s":"p","pid":{},"tid":{},"name":"{}","ts":{:.3f},)"
                      R"("cname":"terrible","args":{{{}}})",
                      r, tid, name, t * 1e6, args));
  }
  std::string done() { return out_ + "\n]}\n"; }

 private:
  void event(const std::string& body) {
    out_ += first_ ? "\n{" : ",\n{";
    out_ += body;
    out_ += "}";
    first_ = false;
  }
  std::string out_ = R"({"displayTimeUnit":"ms","traceEvents":[)";
  bool first_ = true;
  std::uint64_t next_id_ = 1;
};

/** Host syncs go on the host track: the host is what they block. */
int tid_of(const Op& op) {
  return is_host_sync(op.kind) || op.stream == kHostStream ? 0 : op.stream + 1;
}

void name_tracks(const Schedule& s, TraceWriter& w) {
  for (const RankSchedule& rs : s.ranks) {
    w.meta(rs.rank, 0, "process_name", fmt::format("rank {}", rs.rank));
    w.meta(rs.rank, 0, "thread_name", "host");
    for (std::size_t i = 0; i < rs.streams.size(); ++i) {
      w.meta(rs.rank, static_cast<int>(i) + 1, "thread_name", rs.streams[i].name);
    }
  }
}

void slices(const Schedule& s, const SimResult& r,
            const std::set<std::pair<Rank, std::uint32_t>>& hot, TraceWriter& w) {
  for (const RankSchedule& rs : s.ranks) {
    const auto& times = r.timeline.ranks[static_cast<std::size_t>(rs.rank)];
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      const OpTime& t = times[i];
      if (t.end_s < 0) continue;
      const std::string unit =
          op.unit >= 0 ? s.units[static_cast<std::size_t>(op.unit)].name : std::string();
      const std::string args = fmt::format(R"("op":{},"step":{},"unit":"{}","issue_s":{:.9f})", i,
                                           op.step, unit, t.issue_s);
      w.slice(rs.rank, tid_of(op), std::string(to_string(op.purpose)), to_string(op.kind),
              t.start_s, t.end_s, args, hot.count({rs.rank, i}) != 0);
    }
  }
}

void event_flows(const Schedule& s, const SimResult& r, TraceWriter& w) {
  for (const RankSchedule& rs : s.ranks) {
    const auto& times = r.timeline.ranks[static_cast<std::size_t>(rs.rank)];
    std::unordered_map<EventId, std::uint32_t> record;
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      if (op.kind == OpKind::kEventRecord) record[op.event] = i;
      const bool waits = op.kind == OpKind::kStreamWaitEvent || op.kind == OpKind::kHostEventSync;
      if (!waits || times[i].end_s < 0) continue;
      const auto it = record.find(op.event);
      if (it == record.end()) continue;
      // A host event sync is released when the record has run: at its end, not its start.
      const double released = op.kind == OpKind::kHostEventSync ? times[i].end_s : times[i].start_s;
      w.flow("event", rs.rank, tid_of(rs.ops[it->second]), times[it->second].end_s, rs.rank,
             tid_of(op), released);
    }
  }
}

void rendezvous_flows(const Schedule& s, const SimResult& r, TraceWriter& w) {
  std::map<std::pair<GroupId, std::uint32_t>, std::pair<Rank, std::uint32_t>> leader;
  for (const RankSchedule& rs : s.ranks) {
    std::unordered_map<GroupId, std::uint32_t> position;
    const auto& times = r.timeline.ranks[static_cast<std::size_t>(rs.rank)];
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      if (!is_collective(op.kind)) continue;
      const auto [it, fresh] = leader.try_emplace({op.group, position[op.group]++}, rs.rank, i);
      if (fresh || times[i].end_s < 0) continue;
      const auto [lr, li] = it->second;
      const Op& lop = s.ranks[static_cast<std::size_t>(lr)].ops[li];
      w.flow("rendezvous", lr, tid_of(lop),
             r.timeline.ranks[static_cast<std::size_t>(lr)][li].start_s, rs.rank, tid_of(op),
             times[i].start_s);
    }
  }
}

}  // namespace

std::string TraceReporter::render(const Schedule& s, const SimResult& r) const {
  TraceWriter w;
  std::set<std::pair<Rank, std::uint32_t>> hot;
  std::vector<std::pair<RaceInstance, Manifestation>> bitten;
  for (const RaceInstance& race : r.race_instances) {
    const Manifestation m = manifestation(r.timeline, race);
    if (!m.manifested) continue;
    hot.insert({race.rank, race.first});
    hot.insert({race.rank, race.second});
    bitten.emplace_back(race, m);
  }
  name_tracks(s, w);
  slices(s, r, hot, w);
  event_flows(s, r, w);
  rendezvous_flows(s, r, w);
  for (const auto& [race, m] : bitten) {
    const auto& ops = s.ranks[static_cast<std::size_t>(race.rank)].ops;
    w.instant(race.rank, tid_of(ops[race.second]), "RACE manifested", m.second_start_s,
              fmt::format(R"("writer_op":{},"reader_op":{},"overlap_s":{:.9f})", race.first,
                          race.second, m.overlap_s));
    w.flow("race", race.rank, tid_of(ops[race.first]), m.second_start_s, race.rank,
           tid_of(ops[race.second]), m.second_start_s);
  }
  return w.done();
}

}  // namespace hpz::time
