#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>

#include "sim/time/report.hpp"

namespace hpz::time {
namespace {

/** Whole nanoseconds: every time the trace shows, rounded once. */
std::int64_t to_ns(double s) {
  return std::llround(s * 1e9);
}

/** Nanoseconds as the format's microseconds with three decimals, exactly ("12.345"). */
std::string us(std::int64_t ns) {
  return fmt::format("{}.{:03}", ns / 1000, ns % 1000);
}

/** An op's slice on its track, [start_ns, end_ns), at least 1 ns long. */
struct Span {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  bool shown = false;  ///< the op ran, so it has a slice
};

/** Host ops go on the host track: syncs block the host, record_stream is a host call. */
int tid_of(const Op& op) {
  return on_host(op) ? 0 : op.stream + 1;
}

/** Every op's slice, rank by rank. Both ends are rounded to whole nanoseconds from the same
 *  times and the duration is their difference, so that consecutive ops on one track, which end
 *  before the next starts, never overlap (rounding start and duration separately made them
 *  overlap by 1 ns). An op of no duration (event records, satisfied waits, allocations) is
 *  drawn 1 ns long: a flow event binds to the slice that encloses its timestamp, [start, end),
 *  and an empty slice encloses nothing. Such a slice can push the slices after it on its track
 *  a few nanoseconds later; that is all the times move. */
std::vector<std::vector<Span>> spans_of(const Schedule& s, const SimResult& r) {
  std::vector<std::vector<Span>> spans(s.ranks.size());
  for (const RankSchedule& rs : s.ranks) {
    const auto rank = static_cast<std::size_t>(rs.rank);
    const auto& times = r.timeline.ranks[rank];
    auto& out = spans[rank];
    out.resize(rs.ops.size());
    std::map<int, std::vector<std::uint32_t>> tracks;
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      // An op that never ran: -1 from the engine, NaN from the real executor.
      const OpTime& t = times[i];
      if (std::isfinite(t.start_s) && std::isfinite(t.end_s) && t.end_s >= 0) {
        tracks[tid_of(rs.ops[i])].push_back(i);
      }
    }
    for (auto& [tid, ops] : tracks) {
      std::stable_sort(ops.begin(), ops.end(), [&](std::uint32_t a, std::uint32_t b) {
        return to_ns(times[a].start_s) < to_ns(times[b].start_s);
      });
      std::int64_t free_from = std::numeric_limits<std::int64_t>::min();
      for (const std::uint32_t i : ops) {
        Span& span = out[i];
        span.start_ns = std::max(to_ns(times[i].start_s), free_from);
        span.end_ns = std::max(to_ns(times[i].end_s), span.start_ns + 1);
        span.shown = true;
        free_from = span.end_ns;
      }
    }
  }
  return spans;
}

/** Appends trace events; tids are 0 for the host and stream + 1 for streams. */
class TraceWriter {
 public:
  void meta(Rank r, int tid, const char* what, const std::string& name) {
    event(fmt::format(R"("ph":"M","pid":{},"tid":{},"name":"{}","args":{{"name":"{}"}})", r, tid,
                      what, name));
  }
  void slice(Rank r, int tid, const std::string& name, std::string_view cat, const Span& span,
             const std::string& args, bool highlight) {
    event(fmt::format(R"("ph":"X","pid":{},"tid":{},"name":"{}","cat":"{}","ts":{},)"
                      R"("dur":{},"args":{{{}}}{})",
                      r, tid, name, cat, us(span.start_ns), us(span.end_ns - span.start_ns), args,
                      highlight ? R"(,"cname":"terrible")" : ""));
  }
  /** An arrow from the slice on (r0, tid0) that encloses t0 to the one on (r1, tid1) that
   *  encloses t1: "s" binds to its enclosing slice, "f" with "bp":"e" too (without it, "f"
   *  would bind to the next slice that starts after t1). */
  void flow(std::string_view name, Rank r0, int tid0, std::int64_t t0, Rank r1, int tid1,
            std::int64_t t1) {
    const std::uint64_t id = next_id_++;
    event(fmt::format(R"("ph":"s","id":{},"name":"{}","cat":"flow","pid":{},"tid":{},"ts":{})", id,
                      name, r0, tid0, us(t0)));
    event(fmt::format(
        R"("ph":"f","bp":"e","id":{},"name":"{}","cat":"flow","pid":{},"tid":{},"ts":{})", id, name,
        r1, tid1, us(t1)));
  }
  void instant(Rank r, int tid, const std::string& name, std::int64_t t, const std::string& args,
               std::string_view colour = "terrible") {
    event(fmt::format(R"("ph":"i","s":"p","pid":{},"tid":{},"name":"{}","ts":{},)"
                      R"("cname":"{}","args":{{{}}})",
                      r, tid, name, us(t), colour, args));
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

/** The last nanosecond inside a slice: where an arrow leaving it (or ending as it ends) binds. */
std::int64_t last_ns(const Span& span) {
  return span.end_ns - 1;
}

/** Whether `list` is empty (everything) or holds `x`. */
template <typename T>
bool chosen(const std::vector<T>& list, T x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

void name_tracks(const Schedule& s, const TraceFilter& filter, TraceWriter& w) {
  for (const RankSchedule& rs : s.ranks) {
    if (!chosen(filter.ranks, rs.rank)) continue;
    w.meta(rs.rank, 0, "process_name", fmt::format("rank {}", rs.rank));
    w.meta(rs.rank, 0, "thread_name", "host");
    for (std::size_t i = 0; i < rs.streams.size(); ++i) {
      w.meta(rs.rank, static_cast<int>(i) + 1, "thread_name", rs.streams[i].name);
    }
  }
}

void slices(const Schedule& s, const SimResult& r, const std::vector<std::vector<Span>>& spans,
            const std::set<std::pair<Rank, std::uint32_t>>& hot, TraceWriter& w) {
  for (const RankSchedule& rs : s.ranks) {
    const auto& times = r.timeline.ranks[static_cast<std::size_t>(rs.rank)];
    const auto& span = spans[static_cast<std::size_t>(rs.rank)];
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      if (!span[i].shown) continue;
      const Op& op = rs.ops[i];
      const std::string unit =
          op.unit >= 0 ? s.units[static_cast<std::size_t>(op.unit)].name : std::string();
      const std::string args = fmt::format(R"("op":{},"step":{},"unit":"{}","issue_s":{:.9f})", i,
                                           op.step, unit, times[i].issue_s);
      w.slice(rs.rank, tid_of(op), std::string(to_string(op.purpose)), to_string(op.kind), span[i],
              args, hot.count({rs.rank, i}) != 0);
    }
  }
}

/** Record -> wait: from the record's last nanosecond (it has run) to the stream wait's start
 *  (the stream goes on from there) or the host event sync's last nanosecond (the host is
 *  released as it ends). */
void event_flows(const Schedule& s, const std::vector<std::vector<Span>>& spans, TraceWriter& w) {
  for (const RankSchedule& rs : s.ranks) {
    const auto& span = spans[static_cast<std::size_t>(rs.rank)];
    std::unordered_map<EventId, std::uint32_t> record;
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      if (op.kind == OpKind::kEventRecord) record[op.event] = i;
      const bool waits = op.kind == OpKind::kStreamWaitEvent || op.kind == OpKind::kHostEventSync;
      if (!waits || !span[i].shown) continue;
      const auto it = record.find(op.event);
      if (it == record.end() || !span[it->second].shown) continue;
      const std::int64_t released =
          op.kind == OpKind::kHostEventSync ? last_ns(span[i]) : span[i].start_ns;
      w.flow("event", rs.rank, tid_of(rs.ops[it->second]), last_ns(span[it->second]), rs.rank,
             tid_of(op), released);
    }
  }
}

/** The group's lowest rank's collective -> each other member's: start to start. */
void rendezvous_flows(const Schedule& s, const std::vector<std::vector<Span>>& spans,
                      TraceWriter& w) {
  std::map<std::pair<GroupId, std::uint32_t>, std::pair<Rank, std::uint32_t>> leader;
  for (const RankSchedule& rs : s.ranks) {
    std::unordered_map<GroupId, std::uint32_t> position;
    const auto& span = spans[static_cast<std::size_t>(rs.rank)];
    for (std::uint32_t i = 0; i < rs.ops.size(); ++i) {
      const Op& op = rs.ops[i];
      if (!is_collective(op.kind)) continue;
      const auto [it, fresh] = leader.try_emplace({op.group, position[op.group]++}, rs.rank, i);
      if (fresh || !span[i].shown) continue;
      const auto [lr, li] = it->second;
      const Span& lspan = spans[static_cast<std::size_t>(lr)][li];
      if (!lspan.shown) continue;
      const Op& lop = s.ranks[static_cast<std::size_t>(lr)].ops[li];
      w.flow("rendezvous", lr, tid_of(lop), lspan.start_ns, rs.rank, tid_of(op), span[i].start_ns);
    }
  }
}

}  // namespace

std::string TraceReporter::render(const Schedule& s, const SimResult& r) const {
  TraceWriter w;
  std::vector<std::vector<Span>> spans = spans_of(s, r);
  // The filter hides the ops of other ranks and steps: every slice, arrow and race mark below
  // draws only what is shown, so an arrow to a hidden op is left out with it.
  for (const RankSchedule& rs : s.ranks) {
    auto& span = spans[static_cast<std::size_t>(rs.rank)];
    const bool rank_in = chosen(filter_.ranks, rs.rank);
    for (std::size_t i = 0; i < rs.ops.size(); ++i) {
      if (!rank_in || !chosen(filter_.steps, rs.ops[i].step)) span[i].shown = false;
    }
  }
  std::set<std::pair<Rank, std::uint32_t>> hot;
  std::vector<std::pair<RaceInstance, Manifestation>> bitten;
  for (const RaceInstance& race : r.race_instances) {
    const Manifestation m = manifestation(r.timeline, race);
    if (!m.manifested) continue;
    hot.insert({race.rank, race.first});
    hot.insert({race.rank, race.second});
    bitten.emplace_back(race, m);
  }
  name_tracks(s, filter_, w);
  slices(s, r, spans, hot, w);
  event_flows(s, spans, w);
  rendezvous_flows(s, spans, w);
  // A race instance's mark on the reader's start and its arrow from the writer; `bit`: the
  // reader started while the writer still ran, and the arrow leaves the writer at that moment
  // (or at its start, if the reader started first); otherwise from its last nanosecond.
  const auto draw = [&](const RaceInstance& race, bool bit, const char* what, double seconds) {
    const auto& ops = s.ranks[static_cast<std::size_t>(race.rank)].ops;
    const auto& span = spans[static_cast<std::size_t>(race.rank)];
    const Span& writer = span[race.first];
    const Span& reader = span[race.second];
    if (!writer.shown || !reader.shown) return;
    w.instant(race.rank, tid_of(ops[race.second]), bit ? "RACE manifested" : "race missed",
              reader.start_ns,
              fmt::format(R"("writer_op":{},"reader_op":{},"{}":{:.9f})", race.first, race.second,
                          what, seconds),
              bit ? "terrible" : "good");
    w.flow(bit ? "race" : "race margin", race.rank, tid_of(ops[race.first]),
           bit ? std::clamp(reader.start_ns, writer.start_ns, last_ns(writer)) : last_ns(writer),
           race.rank, tid_of(ops[race.second]), reader.start_ns);
  };
  for (const auto& [race, m] : bitten) draw(race, true, "overlap_s", m.overlap_s);
  // Each race group whose closest instance did not bite (issue 37), with its margin, so that
  // the trace shows how close it came.
  for (const RaceReport& report : r.races) {
    if (report.has_margin && report.min_margin_s >= 0) {
      draw(report.closest, false, "margin_s", report.min_margin_s);
    }
  }
  return w.done();
}

}  // namespace hpz::time
