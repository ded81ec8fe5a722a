#include "sim/replay/explore.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>

namespace hpz::replay {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

/** The IR's happens-before as a scheduler: hosts issue ahead, streams run FIFO (schedule.hpp). */
class OrderScheduler {
 public:
  explicit OrderScheduler(const Schedule& s) : s_(s) {
    // Each collective op's members (rank, op index) in its group's rank order, the n-th op of a
    // group on every member being one collective; computed once, read at every step.
    std::map<std::pair<GroupId, int>, std::map<Rank, std::uint32_t>> by_ordinal;
    std::vector<std::vector<int>> ordinal(s.ranks.size());
    event_count_.assign(s.ranks.size(), 0);
    event_slot_.resize(s.ranks.size());
    for (std::size_t r = 0; r < s.ranks.size(); ++r) {
      const RankSchedule& rs = s.ranks[r];
      std::map<GroupId, int> count;
      std::map<EventId, std::size_t> dense;
      ordinal[r].assign(rs.ops.size(), -1);
      event_slot_[r].assign(rs.ops.size(), -1);
      for (std::size_t i = 0; i < rs.ops.size(); ++i) {
        const Op& op = rs.ops[i];
        if (op.event != kNoEvent) {
          // Dense per-rank numbers: an event id can be any int32 in a schedule file.
          const auto [it, added] = dense.try_emplace(op.event, event_count_[r]);
          if (added) ++event_count_[r];
          event_slot_[r][i] = static_cast<std::int32_t>(it->second);
        }
        if (!is_collective(op.kind)) continue;
        by_ordinal[{op.group, count[op.group]}][rs.rank] = static_cast<std::uint32_t>(i);
        ordinal[r][i] = count[op.group]++;
      }
    }
    members_.resize(s.ranks.size());
    for (std::size_t r = 0; r < s.ranks.size(); ++r) {
      const RankSchedule& rs = s.ranks[r];
      members_[r].resize(rs.ops.size());
      for (std::size_t i = 0; i < rs.ops.size(); ++i) {
        if (ordinal[r][i] < 0) continue;
        const Op& op = rs.ops[i];
        const auto& found = by_ordinal.at({op.group, ordinal[r][i]});
        auto& out = members_[r][i];
        for (const Rank m : s.groups.at(static_cast<std::size_t>(op.group)).ranks) {
          const auto it = found.find(m);
          // A member that never issues this collective: it can never be ready.
          out.emplace_back(m, it == found.end() ? kAbsent : it->second);
        }
      }
    }
  }

  ExploredOrder run(const OrderChooser& choose, const std::optional<HoldBack>& hold_in) {
    reset();
    std::optional<HoldBack> hold = hold_in;
    ExploredOrder out;
    std::vector<StreamRef> enabled;
    std::vector<std::uint32_t> heads;
    for (std::uint64_t step = 0;; ++step) {
      const double t = 2.0 * static_cast<double>(step);
      advance_hosts(t);
      enabled_heads(hold, enabled, heads);
      if (enabled.empty() && hold && !ran_[hold->rank][hold->until] &&
          !ran_[hold->rank][hold->held]) {
        // Nothing else can run: happens-before puts the held op before the other one.
        out.held_back_ran = false;
        hold.reset();
        enabled_heads(hold, enabled, heads);
      }
      if (enabled.empty()) break;
      const std::size_t k = choose(enabled, heads, step);
      execute(enabled.at(k).rank, heads.at(k), t);
    }
    for (std::size_t r = 0; r < ran_.size(); ++r) {
      out.complete =
          out.complete && std::all_of(ran_[r].begin(), ran_[r].end(), [](bool b) { return b; });
    }
    out.timeline = std::move(timeline_);
    return out;
  }

 private:
  void reset() {
    const std::size_t n = s_.ranks.size();
    host_pc_.assign(n, 0);
    fifo_.assign(n, {});
    events_.resize(n);
    ran_.assign(n, {});
    timeline_ = Timeline{};
    timeline_.ranks.resize(n);
    for (std::size_t r = 0; r < n; ++r) {
      fifo_[r].resize(s_.ranks[r].streams.size());
      events_[r].assign(event_count_[r], 0);
      ran_[r].assign(s_.ranks[r].ops.size(), false);
      timeline_.ranks[r].assign(s_.ranks[r].ops.size(), {kNan, kNan, kNan});
    }
  }

  bool host_may_pass(std::size_t r, std::size_t pc) const {
    const Op& op = s_.ranks[r].ops[pc];
    switch (op.kind) {
      case OpKind::kHostStreamSync:
        return fifo_[r].at(static_cast<std::size_t>(op.stream)).empty();
      case OpKind::kHostDeviceSync:
        return std::all_of(fifo_[r].begin(), fifo_[r].end(),
                           [](const auto& q) { return q.empty(); });
      case OpKind::kHostEventSync:
        return recorded(r, pc);
      default:
        return true;
    }
  }

  /** Every host issues until a host sync it cannot pass yet. */
  void advance_hosts(double t) {
    for (std::size_t r = 0; r < s_.ranks.size(); ++r) {
      const auto& ops = s_.ranks[r].ops;
      for (std::size_t& pc = host_pc_[r]; pc < ops.size(); ++pc) {
        const Op& op = ops[pc];
        if (on_host(op)) {
          if (!host_may_pass(r, pc)) break;
          timeline_.ranks[r][pc] = {t, t, t};
          ran_[r][pc] = true;
          continue;
        }
        fifo_[r][static_cast<std::size_t>(op.stream)].push_back(static_cast<std::uint32_t>(pc));
        timeline_.ranks[r][pc].issue_s = t;
      }
    }
  }

  bool at_head(Rank r, std::uint32_t i) const {
    const auto& q = fifo_[static_cast<std::size_t>(r)].at(
        static_cast<std::size_t>(s_.ranks[static_cast<std::size_t>(r)].ops[i].stream));
    return !q.empty() && q.front() == i;
  }

  /** Whether the record of op i's event (rank r) has run. */
  bool recorded(std::size_t r, std::size_t i) const {
    const std::int32_t e = event_slot_[r][i];
    return e >= 0 && events_[r][static_cast<std::size_t>(e)] != 0;
  }

  /** The members' ops of the collective op i of rank r, if each is at the head of its stream. */
  const std::vector<std::pair<Rank, std::uint32_t>>* collective_ready(Rank r,
                                                                      std::uint32_t i) const {
    const auto& members = members_[static_cast<std::size_t>(r)][i];
    for (const auto& [m, j] : members) {
      if (j == kAbsent || !at_head(m, j)) return nullptr;
    }
    return &members;
  }

  bool head_enabled(std::size_t r, std::uint32_t h, const std::optional<HoldBack>& hold) const {
    auto held = [&](Rank rank, std::uint32_t i) {
      return hold && hold->rank == rank && hold->held == i && !ran_[rank][hold->until];
    };
    if (held(static_cast<Rank>(r), h)) return false;
    const Op& op = s_.ranks[r].ops[h];
    if (op.kind == OpKind::kStreamWaitEvent) return recorded(r, h);
    if (!is_collective(op.kind)) return true;
    const auto* members = collective_ready(static_cast<Rank>(r), h);
    if (members == nullptr) return false;
    return std::none_of(members->begin(), members->end(),
                        [&](const auto& m) { return held(m.first, m.second); });
  }

  void enabled_heads(const std::optional<HoldBack>& hold, std::vector<StreamRef>& enabled,
                     std::vector<std::uint32_t>& heads) const {
    enabled.clear();
    heads.clear();
    for (std::size_t r = 0; r < fifo_.size(); ++r) {
      for (std::size_t st = 0; st < fifo_[r].size(); ++st) {
        if (fifo_[r][st].empty()) continue;
        const std::uint32_t h = fifo_[r][st].front();
        if (!head_enabled(r, h, hold)) continue;
        enabled.push_back({static_cast<Rank>(r), static_cast<StreamId>(st)});
        heads.push_back(h);
      }
    }
  }

  void run_one(Rank r, std::uint32_t i, double t) {
    const auto ru = static_cast<std::size_t>(r);
    const Op& op = s_.ranks[ru].ops[i];
    fifo_[ru][static_cast<std::size_t>(op.stream)].pop_front();
    ran_[ru][i] = true;
    timeline_.ranks[ru][i].start_s = t;
    timeline_.ranks[ru][i].end_s = t + 1;
    if (op.kind == OpKind::kEventRecord && event_slot_[ru][i] >= 0) {
      events_[ru][static_cast<std::size_t>(event_slot_[ru][i])] = 1;
    }
  }

  void execute(Rank r, std::uint32_t i, double t) {
    if (!is_collective(s_.ranks[static_cast<std::size_t>(r)].ops[i].kind)) {
      run_one(r, i, t);
      return;
    }
    const auto* members = collective_ready(r, i);
    for (const auto& [m, j] : *members) run_one(m, j, t);
  }

  static constexpr std::uint32_t kAbsent = std::numeric_limits<std::uint32_t>::max();

  const Schedule& s_;
  /// members_[rank][op]: the collective's members (empty for other ops).
  std::vector<std::vector<std::vector<std::pair<Rank, std::uint32_t>>>> members_;
  std::vector<std::size_t> event_count_;
  std::vector<std::vector<std::int32_t>> event_slot_;  // [rank][op]: its event's dense number
  std::vector<std::size_t> host_pc_;
  std::vector<std::vector<std::deque<std::uint32_t>>> fifo_;
  std::vector<std::vector<char>> events_;  // events_[rank][event]: its record has run
  std::vector<std::vector<bool>> ran_;
  Timeline timeline_;
};

}  // namespace

ExploredOrder run_order(const Schedule& schedule, const OrderChooser& choose,
                        const std::optional<HoldBack>& hold) {
  return OrderScheduler(schedule).run(choose, hold);
}

OrderChooser pct_chooser(const Schedule& s, std::uint64_t seed, int depth, std::uint64_t steps) {
  std::mt19937_64 rng(seed);
  std::vector<StreamRef> streams;
  for (const RankSchedule& rs : s.ranks) {
    for (std::size_t st = 0; st < rs.streams.size(); ++st)
      streams.push_back({rs.rank, static_cast<StreamId>(st)});
  }
  std::shuffle(streams.begin(), streams.end(), rng);
  auto priority = std::make_shared<std::map<std::pair<Rank, StreamId>, double>>();
  for (std::size_t k = 0; k < streams.size(); ++k) {
    (*priority)[{streams[k].rank, streams[k].stream}] = static_cast<double>(depth + k);
  }
  auto changes = std::make_shared<std::map<std::uint64_t, int>>();  // step -> change point i
  std::uniform_int_distribution<std::uint64_t> at(0, steps == 0 ? 0 : steps - 1);
  for (int i = 1; i < depth; ++i) changes->emplace(at(rng), i);
  return [priority, changes, depth](const std::vector<StreamRef>& enabled,
                                    const std::vector<std::uint32_t>&, std::uint64_t step) {
    std::size_t best = 0;
    for (std::size_t k = 1; k < enabled.size(); ++k) {
      if (priority->at({enabled[k].rank, enabled[k].stream}) >
          priority->at({enabled[best].rank, enabled[best].stream})) {
        best = k;
      }
    }
    if (const auto c = changes->find(step); c != changes->end()) {
      (*priority)[{enabled[best].rank, enabled[best].stream}] =
          static_cast<double>(depth - c->second);
    }
    return best;
  };
}

OrderChooser timing_chooser(const Timeline& timing) {
  return [&timing](const std::vector<StreamRef>& enabled, const std::vector<std::uint32_t>& heads,
                   std::uint64_t) {
    auto start = [&](std::size_t k) {
      const double s =
          timing.ranks.at(static_cast<std::size_t>(enabled[k].rank)).at(heads[k]).start_s;
      return std::isfinite(s) ? s : std::numeric_limits<double>::infinity();
    };
    std::size_t best = 0;
    for (std::size_t k = 1; k < enabled.size(); ++k)
      if (start(k) < start(best)) best = k;
    return best;
  };
}

namespace {

/** One step of two replays, bit for bit: the loss's bits and health, the weights' hash, and
 *  the bad elements, ranks and units. */
bool same_step(const StepRecord& x, const StepRecord& y) {
  return std::bit_cast<std::uint64_t>(x.loss) == std::bit_cast<std::uint64_t>(y.loss) &&
         x.loss_health == y.loss_health && x.weights_hash == y.weights_hash &&
         x.bad_elements == y.bad_elements && x.bad_ranks == y.bad_ranks &&
         x.bad_units == y.bad_units;
}

}  // namespace

int first_difference(const ReplayResult& a, const ReplayResult& ref) {
  const std::size_t common = std::min(a.steps.size(), ref.steps.size());
  for (std::size_t k = 0; k < common; ++k) {
    if (!same_step(a.steps[k], ref.steps[k])) return static_cast<int>(k);
  }
  return a.steps.size() == ref.steps.size() ? -1 : static_cast<int>(common);
}

bool same_result(const ReplayResult& a, const ReplayResult& b) {
  return first_difference(a, b) < 0;
}

ExploreResult explore(const ReplayInputs& scenario, const Schedule& given,
                      const std::vector<RacePair>& pairs, const Timeline& timing,
                      const ExploreOptions& o) {
  // Every order is replayed: strided accesses written out once, not at each replay().
  std::optional<Schedule> unfolded;
  if (has_strided_accesses(given)) unfolded = unfold_strided(given);
  const Schedule& schedule = unfolded ? *unfolded : given;
  ExploreResult out;
  const Timeline serialized = serialized_timeline(schedule);
  out.reference = replay(scenario, schedule, serialized, o.mode);
  for (const auto& ops : serialized.ranks) {
    out.reference_complete =
        out.reference_complete &&
        std::all_of(ops.begin(), ops.end(), [](const OpTime& t) { return std::isfinite(t.end_s); });
  }
  for (std::size_t k = 0; k < out.reference.steps.size() && out.reference_bad_step < 0; ++k) {
    const StepRecord& step = out.reference.steps[k];
    const bool bad = o.mode == Mode::kNumeric
                         ? !std::isfinite(step.loss)
                         : step.loss_health != Health::kGood || step.bad_elements > 0;
    if (bad) out.reference_bad_step = static_cast<int>(k);
  }
  OrderScheduler scheduler(schedule);
  int done = 0;
  auto judge = [&](ExploredOrder order, const std::string& phase,
                   const std::optional<RacePair>& pair, bool second_first) {
    if (!order.complete) ++out.incomplete;
    ReplayResult r = replay(scenario, schedule, order.timeline, o.mode);
    const int order_index = done++;
    if (o.progress) o.progress(done, o.budget);
    const int bad = first_difference(r, out.reference);
    if (bad < 0) return false;
    Counterexample c;
    c.phase = phase;
    c.pair = pair;
    c.second_first = second_first;
    c.order = order_index;
    c.first_bad_step = bad;
    c.timeline = std::move(order.timeline);
    c.result = std::move(r);
    out.counterexample = std::move(c);
    return true;
  };
  const OrderChooser by_timing = timing_chooser(timing);
  for (const RacePair& p : pairs) {
    for (const bool second_first : {true, false}) {
      if (done >= o.budget) return out;
      const HoldBack hold =
          second_first ? HoldBack{p.rank, p.first, p.second} : HoldBack{p.rank, p.second, p.first};
      ExploredOrder order = scheduler.run(by_timing, hold);
      ++out.targeted;
      if (!order.held_back_ran) ++out.unreorderable;
      const auto& times = order.timeline.ranks.at(static_cast<std::size_t>(p.rank));
      if (!std::isfinite(times.at(p.first).end_s) || !std::isfinite(times.at(p.second).end_s)) {
        ++out.unreached;
      }
      if (judge(std::move(order), "targeted", p, second_first)) return out;
    }
  }
  std::uint64_t total_ops = 0;
  for (const RankSchedule& rs : schedule.ranks) total_ops += rs.ops.size();
  while (done < o.budget) {
    const std::uint64_t seed =
        o.seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(out.random);
    ExploredOrder order =
        scheduler.run(pct_chooser(schedule, seed, o.depth, total_ops), std::nullopt);
    ++out.random;
    if (judge(std::move(order), "random", std::nullopt, false)) return out;
  }
  return out;
}

}  // namespace hpz::replay
