#include "sim/replay/standin_timeline.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "sim/time/cost_model.hpp"

namespace hpz::replay {
namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
constexpr double kNever = std::numeric_limits<double>::infinity();

std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/** Plays every rank's host forward, blocking a rank only on what it cannot know yet. */
class StandIn {
 public:
  StandIn(const Scenario& sc, const Schedule& s, std::uint64_t seed)
      : sc_(sc), s_(s), seed_(seed), cost_(sc) {
    const std::size_t n = s.ranks.size();
    tl_.seed = seed;
    tl_.ranks.resize(n);
    ranks_.resize(n);
    for (std::size_t r = 0; r < n; ++r) {
      tl_.ranks[r].assign(s.ranks[r].ops.size(), {kNever, kNever, kNever});
      ranks_[r].free.assign(s.ranks[r].streams.size(), 0.0);
    }
  }

  Timeline run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t r = 0; r < s_.ranks.size(); ++r) progress |= advance(static_cast<Rank>(r));
    }
    return std::move(tl_);
  }

 private:
  struct RankState {
    std::size_t next = 0;
    double host = 0;
    std::vector<double> free;  // per stream: when everything issued on it ends (NaN: unknown)
    std::map<EventId, double> events;
    std::map<GroupId, int> issued;  // collectives issued per group
  };
  struct Arrival {
    Rank r;
    std::uint32_t i;
    double ready;
  };

  double factor(Rank r, std::uint32_t i) const {
    const std::uint64_t x = mix(seed_ ^ mix((static_cast<std::uint64_t>(r) << 32) ^ i));
    return 0.8 + 0.4 * static_cast<double>(x >> 11) * 0x1.0p-53;
  }

  double duration(Rank r, std::uint32_t i, const Op& op) const {
    double d = 0;
    if (is_collective(op.kind)) {
      const Group& g = s_.groups[op.group];
      const double n = static_cast<double>(g.ranks.size());
      const int gpn = sc_.cluster.gpus_per_node;
      const bool one_node = g.ranks.front() / gpn == g.ranks.back() / gpn;
      const double bw = one_node ? sc_.cluster.nvlink_gbytes_per_s * 1e9
                                 : sc_.cluster.nic_gbps * 1e9 / 8 * sc_.cluster.nics_per_node / gpn;
      d = static_cast<double>(op.comm_bytes) * (n - 1) / bw;
    } else {
      d = cost_.op_s(s_, r, op);  // the timing engine's roofline; 0 for events, syncs, allocs
      if (d == 0) return 0;
    }
    return std::max(d, kMinOpS) * factor(r, i);
  }

  // Advances rank r as far as it can; true if it moved.
  bool advance(Rank r) {
    RankState& st = ranks_[r];
    const auto& ops = s_.ranks[r].ops;
    bool moved = false;
    while (st.next < ops.size() && step(r, st, static_cast<std::uint32_t>(st.next), ops[st.next])) {
      ++st.next;
      moved = true;
    }
    return moved;
  }

  bool step(Rank r, RankState& st, std::uint32_t i, const Op& op) {
    OpTime& t = tl_.ranks[r][i];
    if (op.kind == OpKind::kHostDeviceSync || op.stream == kHostStream) {
      double until = st.host;
      for (double f : st.free) until = std::max(until, f);
      if (std::isnan(until)) return false;
      t = {st.host, st.host, until};
      st.host = until;
      return true;
    }
    double& free = st.free[op.stream];
    if (std::isnan(free)) return false;
    if (op.kind == OpKind::kHostStreamSync) {
      const double until = std::max(st.host, free);
      t = {st.host, st.host, until};
      st.host = until;
      return true;
    }
    const double issue = st.host;
    double ready = std::max(issue + (op.stream == 0 ? kBacklogS : 0.0), free);
    if (op.kind == OpKind::kStreamWaitEvent) {
      const auto it = st.events.find(op.event);
      if (it != st.events.end()) ready = std::max(ready, it->second);
    }
    st.host += kLaunchS;
    if (is_collective(op.kind)) return arrive(r, st, i, op, issue, ready);
    const double end = ready + duration(r, i, op);
    t = {issue, ready, end};
    free = end;
    if (op.kind == OpKind::kEventRecord) st.events[op.event] = end;
    return true;
  }

  bool arrive(Rank r, RankState& st, std::uint32_t i, const Op& op, double issue, double ready) {
    const int k = st.issued[op.group]++;
    auto& arrivals = waiting_[{op.group, k}];
    arrivals.push_back({r, i, ready});
    tl_.ranks[r][i].issue_s = issue;
    st.free[op.stream] = kUnknown;
    if (arrivals.size() < s_.groups[op.group].ranks.size()) return true;
    double start = 0;
    for (const Arrival& a : arrivals) start = std::max(start, a.ready);
    for (const Arrival& a : arrivals) {
      const Op& o = s_.ranks[a.r].ops[a.i];
      const double end = start + duration(a.r, a.i, o);
      tl_.ranks[a.r][a.i].start_s = start;
      tl_.ranks[a.r][a.i].end_s = end;
      ranks_[a.r].free[o.stream] = end;
    }
    return true;
  }

  const Scenario& sc_;
  const Schedule& s_;
  std::uint64_t seed_;
  time::CostModel cost_;
  Timeline tl_;
  std::vector<RankState> ranks_;
  std::map<std::pair<GroupId, int>, std::vector<Arrival>> waiting_;
};

}  // namespace

Timeline standin_timeline(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed) {
  return StandIn(scenario, schedule, seed).run();
}

}  // namespace hpz::replay
