#include "sim/ir/projection.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <set>

namespace hpz {
namespace {

bool parameter_role(BufferRole r) {
  return r == BufferRole::kSecondary || r == BufferRole::kFull;
}

std::string unit_name(const Schedule& s, UnitId u) {
  return u >= 0 && static_cast<std::size_t>(u) < s.units.size() ? s.units[u].name : "-";
}

/** The wait loop's canonical form (the header): in each run of S_ag lines of one hook (same
 *  `where`) made only of records, throttles, handle waits and unpacks, the handle waits with
 *  their unpacks go first, sorted, then the records and throttles in their order. */
void canonical_wait_loops(std::vector<ProjectedOp>& v) {
  auto loop_line = [](const std::string& l) {
    return l.starts_with("record S_ag#") || l.starts_with("host waits for S_ag#") ||
           l.starts_with("wait on S_ag for ") || l.starts_with("alloc on S_ag full:") ||
           (l.starts_with("copy on S_ag ") && l.find(" w:full:") != std::string::npos);
  };
  auto unpack_line = [](const std::string& l) {
    return l.starts_with("alloc on S_ag full:") || l.starts_with("copy on S_ag ");
  };
  std::size_t i = 0;
  while (i < v.size()) {
    if (!loop_line(v[i].line)) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < v.size() && loop_line(v[end].line) && v[end].where == v[i].where) ++end;
    std::vector<std::vector<ProjectedOp>> waits;
    std::vector<ProjectedOp> rest;
    bool in_wait = false;  // the lines since the last handle wait are all its unpack
    for (std::size_t k = i; k < end; ++k) {
      if (v[k].line.starts_with("wait on S_ag for ")) {
        waits.push_back({v[k]});
        in_wait = true;
      } else if (in_wait && unpack_line(v[k].line)) {
        waits.back().push_back(v[k]);
      } else {
        rest.push_back(v[k]);
        in_wait = false;
      }
    }
    std::stable_sort(waits.begin(), waits.end(),
                     [](const auto& a, const auto& b) { return a.front().line < b.front().line; });
    std::size_t k = i;
    for (const auto& w : waits) {
      for (const ProjectedOp& o : w) v[k++] = o;
    }
    for (const ProjectedOp& o : rest) v[k++] = o;
    i = end;
  }
}

/** A release's canonical form (the header): in each run of one hook's lines (same `where`) that
 *  are per-parameter releases, each one parameter's secondary allocation, copy into it and host
 *  wait for its stream, ending with the free of its gathered copy, the releases are sorted by
 *  that free. A run's lines after its last free stay where they are. */
void canonical_releases(std::vector<ProjectedOp>& v) {
  auto release_line = [](const std::string& l) {
    return (l.starts_with("free on ") && l.find(" full:") != std::string::npos) ||
           (l.starts_with("alloc on ") && l.find(" secondary:") != std::string::npos) ||
           (l.starts_with("copy on ") && l.find(" w:secondary:") != std::string::npos) ||
           l.starts_with("host waits for ");
  };
  std::size_t i = 0;
  while (i < v.size()) {
    if (!v[i].line.starts_with("free on ") && !v[i].line.starts_with("alloc on ") &&
        !v[i].line.starts_with("copy on ")) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < v.size() && release_line(v[end].line) && v[end].where == v[i].where) ++end;
    std::vector<std::vector<ProjectedOp>> releases;
    std::size_t from = i;
    for (std::size_t k = i; k < end; ++k) {
      if (v[k].line.starts_with("free on ") && v[k].line.find(" full:") != std::string::npos) {
        releases.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(from),
                              v.begin() + static_cast<std::ptrdiff_t>(k + 1));
        from = k + 1;
      }
    }
    if (releases.size() > 1) {
      std::stable_sort(releases.begin(), releases.end(),
                       [](const auto& a, const auto& b) { return a.back().line < b.back().line; });
      std::size_t k = i;
      for (const auto& r : releases) {
        for (const ProjectedOp& o : r) v[k++] = o;
      }
    }
    i = std::max(end, i + 1);
  }
}

/** Writes one rank's ops as projection lines, naming each recorded event as it goes. */
class RankProjector {
 public:
  RankProjector(const Schedule& s, Rank r) : s_(s), r_(r), rs_(s.ranks[r]) {}

  /** Names the event an init op records (with init left out), apart from the others. */
  void skip_init(const Op& op) {
    if (op.kind == OpKind::kEventRecord) {
      event_name_[op.event] =
          stream(op.stream) + "#init" + std::to_string(init_records_[op.stream]++);
    }
  }

  /** Sets `line` to op's line; false for an op the projection leaves out. */
  bool line_of(const Op& op, std::string& line) {
    switch (op.kind) {
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
      case OpKind::kAllReduce:
      case OpKind::kAllToAll:
        line = std::string(to_string(op.kind)) + " on " + stream(op.stream) + " group " +
               s_.groups[op.group].name + " bytes " + std::to_string(op.comm_bytes);
        return true;
      case OpKind::kCopy:
        return copy_line(op, line);
      case OpKind::kAlloc:
      case OpKind::kFree: {
        const Buffer& b = rs_.buffers[op.buffer];
        if (!parameter_role(b.role)) return false;
        line = std::string(to_string(op.kind)) + " on " + stream(op.stream) + " " +
               std::string(to_string(b.role)) + ":" + unit_name(s_, b.unit);
        return true;
      }
      case OpKind::kEventRecord: {
        const std::string name = stream(op.stream) + "#" + std::to_string(records_[op.stream]++);
        event_name_[op.event] = name;
        line = "record " + name;
        return true;
      }
      case OpKind::kStreamWaitEvent:
        line = "wait on " + stream(op.stream) + " for " + event_name_[op.event];
        return true;
      case OpKind::kHostStreamSync:
        line = "host waits for " + stream(op.stream);
        return true;
      case OpKind::kHostDeviceSync:
        line = "host waits for the device";
        return true;
      case OpKind::kHostEventSync:
        line = "host waits for " + event_name_[op.event];
        return true;
      default:
        return false;
    }
  }

 private:
  std::string stream(StreamId id) const {
    return id == kHostStream ? std::string("host") : rs_.streams[id].name;
  }

  /** A copy's line: the parameter and primary buffers it reads and writes; false for a copy that
   *  writes no parameter and reads no secondary partition. */
  bool copy_line(const Op& op, std::string& line) const {
    bool relevant = false;
    std::set<std::string> parts;
    for (const Access& a : s_.accesses_of(r_, op)) {
      const Buffer& b = rs_.buffers[a.buffer];
      if (!parameter_role(b.role) && b.role != BufferRole::kPrimary) continue;
      if (a.mode == AccessMode::kWrite && parameter_role(b.role)) relevant = true;
      if (a.mode == AccessMode::kRead && b.role == BufferRole::kSecondary) relevant = true;
      parts.insert(std::string(a.mode == AccessMode::kRead ? "r:" : "w:") +
                   std::string(to_string(b.role)) + ":" + unit_name(s_, b.unit));
    }
    if (!relevant) return false;
    line = "copy on " + stream(op.stream);
    for (const std::string& p : parts) line += " " + p;
    return true;
  }

  const Schedule& s_;
  Rank r_;
  const RankSchedule& rs_;
  std::map<EventId, std::string> event_name_;  // recorded event -> "stream#n"
  std::map<StreamId, int> records_;
  std::map<StreamId, int> init_records_;  // counted apart, so that init's own ops do not shift
                                          // the ordinals when init is left out
};

/** Where an op was issued: "step N phase", and " at label" when it has one. */
std::string where_of(const Schedule& s, const Op& op) {
  std::string where = "step " + std::to_string(op.step) + " " + std::string(to_string(op.phase));
  if (op.label >= 0 && static_cast<std::size_t>(op.label) < s.labels.size()) {
    where += " at " + s.labels[op.label];
  }
  return where;
}

}  // namespace

std::vector<ProjectedOp> project(const Schedule& s, Rank r, bool with_init) {
  const RankSchedule& rs = s.ranks[r];
  std::vector<ProjectedOp> out;
  RankProjector projector(s, r);
  for (std::size_t i = 0; i < rs.ops.size(); ++i) {
    const Op& op = rs.ops[i];
    if (!with_init && op.phase == Phase::kInit) {
      projector.skip_init(op);
      continue;
    }
    std::string line;
    if (!projector.line_of(op, line)) continue;
    if (is_host_sync(op.kind) && !out.empty() && out.back().line == line) continue;
    out.push_back({i, std::move(line), where_of(s, op)});
  }
  canonical_wait_loops(out);
  canonical_releases(out);
  return out;
}

std::size_t first_difference(const std::vector<ProjectedOp>& a, const std::vector<ProjectedOp>& b) {
  std::size_t k = 0;
  while (k < a.size() && k < b.size() && a[k].line == b[k].line) ++k;
  return k == a.size() && k == b.size() ? kEqual : k;
}

std::string numbered(const std::vector<ProjectedOp>& v, std::size_t i) {
  if (i >= v.size()) return "(ends)";
  return std::to_string(i) + " " + v[i].line + "   [" + v[i].where + ", op " +
         std::to_string(v[i].op) + "]";
}

namespace {

/** first_divergence's text for projections that first differ at k. */
std::string divergence_at(std::size_t k, const std::vector<ProjectedOp>& expected,
                          const std::string& expected_name, const std::vector<ProjectedOp>& actual,
                          const std::string& actual_name, std::size_t context) {
  std::string out = "first divergence at projected op " + std::to_string(k) + " (" +
                    std::to_string(expected.size()) + " in " + expected_name + ", " +
                    std::to_string(actual.size()) + " in " + actual_name + ")\n";
  const std::size_t from = k > context ? k - context : 0;
  auto show = [&](const std::vector<ProjectedOp>& v, const std::string& name) {
    out += name + ":\n";
    for (std::size_t i = from; i < std::min(v.size(), k + 3); ++i) {
      out += (i == k ? "  > " : "    ") + numbered(v, i) + "\n";
    }
    if (k >= v.size()) out += "  > " + numbered(v, k) + "\n";
  };
  show(expected, expected_name);
  show(actual, actual_name);
  return out;
}

}  // namespace

std::string first_divergence(const std::vector<ProjectedOp>& expected,
                             const std::string& expected_name,
                             const std::vector<ProjectedOp>& actual, const std::string& actual_name,
                             std::size_t context) {
  const std::size_t k = first_difference(expected, actual);
  if (k == kEqual) return {};
  return divergence_at(k, expected, expected_name, actual, actual_name, context);
}

std::vector<Rank> recorded_ranks(const Schedule& rec) {
  std::vector<Rank> out;
  const auto it = rec.source.find("recorded_rank");
  if (it != rec.source.end() && it->second == "all") {
    for (Rank r = 0; r < rec.world_size; ++r) out.push_back(r);
    return out;
  }
  if (it != rec.source.end()) {
    const std::string& text = it->second;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t comma = std::min(text.find(',', at), text.size());
      try {
        const int r = std::stoi(text.substr(at, comma - at));
        if (r >= 0 && r < rec.world_size) out.push_back(r);
      } catch (const std::exception&) {  // not a number: rank 0 below, if nothing else
      }
      at = comma + 1;
    }
  }
  if (out.empty()) out.push_back(0);
  return out;
}

RecordingComparison compare_recording(const Schedule& rec, const Schedule& built) {
  RecordingComparison out;
  out.ranks = recorded_ranks(rec);
  if (built.world_size != rec.world_size) {
    out.error = fmt::format("the builder made {} ranks, the recording holds {}", built.world_size,
                            rec.world_size);
    return out;
  }
  for (const Rank r : out.ranks) {
    const auto expected = project(rec, r, true);
    const auto actual = project(built, r, true);
    out.ops += expected.size();
    const std::size_t k = first_difference(expected, actual);
    if (k != kEqual) {
      out.divergence =
          divergence_at(k, expected, "DeepSpeed (recorded)", actual, "builder", kDivergenceContext);
      out.diverging_rank = r;
      out.recorded_op = numbered(expected, k);
      out.built_op = numbered(actual, k);
      break;
    }
  }
  return out;
}

std::string describe(const RecordingComparison& c) {
  std::string ranks;
  for (const Rank r : c.ranks) {
    if (!ranks.empty()) ranks += ',';
    ranks += std::to_string(r);
  }
  if (!c.error.empty()) return "builder: cannot build this scenario: " + c.error;
  if (c.divergence.empty()) {
    return fmt::format(
        "builder: equal to this recording, op for op ({} projected ops of rank{} {})", c.ops,
        c.ranks.size() == 1 ? "" : "s", ranks);
  }
  const std::string first = c.divergence.substr(0, c.divergence.find('\n'));
  return fmt::format(
      "builder: differs from this recording on rank {}, {}: DeepSpeed {}, the "
      "builder {} (--json has the context; {})",
      c.diverging_rank, first, c.recorded_op, c.built_op,
      c.expected_because.empty() ? "please report it" : "expected: " + c.expected_because);
}

}  // namespace hpz
