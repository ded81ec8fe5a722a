#include "sim/check/explain.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "sim/parallel.hpp"

namespace hpz::check {
namespace {

/** "model.layers.12.mlp" -> "model.layers.*.mlp": a module label without its layer numbers. */
std::string pattern_of(const std::string& label) {
  std::string out;
  std::size_t i = 0;
  while (i <= label.size()) {
    const std::size_t dot = std::min(label.find('.', i), label.size());
    const std::string part = label.substr(i, dot - i);
    const bool number = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    if (!out.empty()) out += '.';
    out += number ? "*" : part;
    i = dot + 1;
  }
  return out;
}

/** One kind of ordering op to leave out: (kind, purpose) and, when split, one label pattern. */
struct Kind {
  OpKind kind;
  Purpose purpose;
  int pattern = -1;  ///< a place (explain_ordering's `places`); -1: every place
  auto key() const { return std::tuple{kind, purpose, pattern}; }
  bool operator<(const Kind& o) const { return key() < o.key(); }
};

bool host_sync(OpKind k) {
  return k == OpKind::kHostStreamSync || k == OpKind::kHostDeviceSync ||
         k == OpKind::kHostEventSync;
}

std::string phrase(OpKind kind, Purpose purpose, const std::string& where) {
  std::string what;
  if (host_sync(kind)) {
    switch (purpose) {
      case Purpose::kFixHostSync:
        what = "DeepSpeed's host sync after the secondary copy";
        break;
      case Purpose::kForwardCompute:
      case Purpose::kRecomputeForward:
        what = where.empty() ? "the training script's blocking copy of the batch to the GPU"
               : where == "*"
                   ? (purpose == Purpose::kForwardCompute
                          ? "the model's host reads and the script's batch copy"
                          : "the model's host reads (recompute)")
                   : fmt::format("a host read in the model's code ({})",
                                 purpose == Purpose::kForwardCompute ? "forward" : "recompute");
        break;
      case Purpose::kBackwardCompute:
        what = "the engine's wait for the gradient-reduce stream at the end of backward";
        break;
      case Purpose::kStepSync:
        what = "the host reading the loss (loss.item())";
        break;
      case Purpose::kHostThrottle:
        what = "DeepSpeed's wait for an old gather when too many are in flight";
        break;
      case Purpose::kGradNorm:
        what = "the host reading the gradient norm";
        break;
      case Purpose::kOptimizerStep:
        what = "the optimizer step's host sync";
        break;
      case Purpose::kCheckpointLoad:
        what = "the checkpoint load's host sync";
        break;
      case Purpose::kParamInit:
        what = "zero.Init's host syncs";
        break;
      default:
        what = fmt::format("a host sync ({})", to_string(purpose));
    }
  } else {
    switch (purpose) {
      case Purpose::kFetchWait:
        what = "the compute stream's wait for a gathered parameter";
        break;
      case Purpose::kNcclHandshake:
        what = "the event handshake between the issuing stream and NCCL's";
        break;
      case Purpose::kFixEventWait:
        what = "DeepSpeed's event wait before the hpZ gather";
        break;
      default:
        what = fmt::format("a stream's wait for an event ({})", to_string(purpose));
    }
  }
  if (!where.empty() && where != "*") what += " " + where;
  return what;
}

/** How many secondary-copy findings a check found with some ordering ops left out. */
struct Outcome {
  std::uint64_t races = 0;
  std::uint64_t stale = 0;
  std::uint64_t total() const { return races + stale; }
};

/** Which ops a check leaves out: (rank, op index, op) -> true to leave the op out. */
using LeaveOut = std::function<bool(Rank, std::uint32_t, const Op&)>;

/** Every ordering op of a schedule, counted by (kind, purpose) and by where it was issued. */
struct OrderingCensus {
  // Where each ordering op was issued: "at M" for an op a module's hook issued (its label), "after
  // M" for an unlabelled one (the model's own host reads, which the recorder cannot attribute)
  // that follows M's hook ops in the same pass, "" for one that follows none (the script's).
  std::vector<std::string> places;
  /// Per rank: (op index, place) of each ordering op, by index.
  std::vector<std::vector<std::pair<std::uint32_t, int>>> place_of;
  std::map<Kind, std::uint64_t> classes;  ///< ops per (kind, purpose)
  std::map<Kind, std::uint64_t> split;    ///< ops per (kind, purpose, place)

  /** The index of place `p` in `places`, adding it when new. */
  int place_id(const std::string& p) {
    const auto it = std::find(places.begin(), places.end(), p);
    if (it != places.end()) return static_cast<int>(it - places.begin());
    places.push_back(p);
    return static_cast<int>(places.size()) - 1;
  }

  /** The place of rank r's ordering op at `index`; -1 when that op is not an ordering op. */
  int place(Rank r, std::uint32_t index) const {
    const auto& v = place_of[static_cast<std::size_t>(r)];
    const auto it = std::lower_bound(v.begin(), v.end(), std::pair{index, -1});
    return it != v.end() && it->first == index ? it->second : -1;
  }
};

/** Whether `op` writes a kSecondary buffer of `rank`. */
bool writes_secondary(const Schedule& schedule, const RankSchedule& rank, const Op& op) {
  for (const Access& a : schedule.accesses_of(rank.rank, op)) {
    if (a.mode == AccessMode::kWrite &&
        rank.buffers[static_cast<std::size_t>(a.buffer)].role == BufferRole::kSecondary) {
      return true;
    }
  }
  return false;
}

/** Counts rank r's ordering ops into `census` and its secondary copies into `secondary_copies`. */
void census_of_rank(const Schedule& schedule, std::size_t r,
                    const std::vector<std::string>& label_patterns, OrderingCensus& census,
                    std::uint64_t& secondary_copies) {
  const RankSchedule& rank = schedule.ranks[r];
  std::optional<Op> last;  // the last op issued with a label
  for (std::uint32_t i = 0; i < rank.ops.size(); ++i) {
    const Op op = rank.ops[i];
    const bool labelled =
        op.label >= 0 && static_cast<std::size_t>(op.label) < label_patterns.size();
    if (is_ordering(op.kind)) {
      std::string where;
      if (labelled) {
        where = "at " + label_patterns[static_cast<std::size_t>(op.label)];
      } else if (last && last->step == op.step && last->micro_step == op.micro_step &&
                 last->phase == op.phase) {
        where = "after " + label_patterns[static_cast<std::size_t>(last->label)];
      }
      const int id = census.place_id(where);
      census.place_of[r].emplace_back(i, id);
      ++census.classes[Kind{op.kind, op.purpose}];
      ++census.split[Kind{op.kind, op.purpose, id}];
    } else if (writes_secondary(schedule, rank, op)) {
      ++secondary_copies;
    }
    if (labelled) last = op;
  }
}

/** The census of every rank's ordering ops; counts the secondary copies into `secondary_copies`. */
OrderingCensus census_of(const Schedule& schedule, std::uint64_t& secondary_copies) {
  std::vector<std::string> label_patterns;
  for (const std::string& l : schedule.labels) label_patterns.push_back(pattern_of(l));
  OrderingCensus census;
  census.place_of.resize(schedule.ranks.size());
  for (std::size_t r = 0; r < schedule.ranks.size(); ++r) {
    census_of_rank(schedule, r, label_patterns, census, secondary_copies);
  }
  return census;
}

/** Checks the schedule once per entry of `leave_outs`, in parallel, with those ops left out. */
std::vector<Outcome> outcomes_without(const Schedule& schedule, unsigned workers,
                                      const std::vector<LeaveOut>& leave_outs) {
  std::vector<Outcome> outcomes(leave_outs.size());
  parallel_for(leave_outs.size(), workers, [&](std::size_t i) {
    const CheckResult res = check_schedule(schedule, Ablation{leave_outs[i]});
    outcomes[i] = {secondary_findings(res, FindingKind::kRace),
                   secondary_findings(res, FindingKind::kStaleRead)};
  });
  return outcomes;
}

/** The tests leaving out each (kind, purpose) of `kinds` alone. */
std::vector<LeaveOut> tests_by_kind(const std::vector<Kind>& kinds) {
  std::vector<LeaveOut> tests;
  for (const Kind& k : kinds) {
    tests.push_back([kind = k](Rank, std::uint32_t, const Op& op) {
      return op.kind == kind.kind && op.purpose == kind.purpose;
    });
  }
  return tests;
}

/** Each kind that matters split by where it was issued, when it was issued at several places:
 *  the parts into `parts`, one test each into `part_tests`. */
void split_by_place(const OrderingCensus& census, const std::vector<Kind>& kinds,
                    const std::vector<Outcome>& by_kind, std::vector<Kind>& parts,
                    std::vector<LeaveOut>& part_tests) {
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (by_kind[i].total() == 0) continue;
    std::vector<Kind> here;
    for (const auto& [k, n] : census.split) {
      if (k.kind == kinds[i].kind && k.purpose == kinds[i].purpose) here.push_back(k);
    }
    if (here.size() < 2) continue;
    for (const Kind& k : here) {
      parts.push_back(k);
      part_tests.push_back([k, &census](Rank r, std::uint32_t index, const Op& op) {
        return op.kind == k.kind && op.purpose == k.purpose && census.place(r, index) == k.pattern;
      });
    }
  }
}

/** The guard for kind `k` (issued `ops` times) whose leaving out gave `o`. */
OrderingGuard guard_of(const OrderingCensus& census, const Kind& k, std::uint64_t ops,
                       const Outcome& o) {
  const std::string where =
      k.pattern < 0 ? std::string("*") : census.places[static_cast<std::size_t>(k.pattern)];
  return OrderingGuard{k.kind, k.purpose, where,   phrase(k.kind, k.purpose, where),
                       ops,    o.races,   o.stale, {}};
}

/** Orders guards by findings without them, most first. */
bool most_first(const OrderingGuard& a, const OrderingGuard& b) {
  return a.races + a.stale > b.races + b.stale;
}

/** The guards of the kinds that matter, most findings first, each with its places that matter. */
std::vector<OrderingGuard> guards_of(OrderingCensus& census, const std::vector<Kind>& kinds,
                                     const std::vector<Outcome>& by_kind,
                                     const std::vector<Kind>& parts,
                                     const std::vector<Outcome>& by_part) {
  std::vector<OrderingGuard> guards;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (by_kind[i].total() == 0) continue;
    Kind k = kinds[i];
    std::vector<OrderingGuard> places_here;
    std::size_t issued_at = 0;
    for (std::size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].kind != k.kind || parts[j].purpose != k.purpose) continue;
      ++issued_at;
      if (by_part[j].total() > 0)
        places_here.push_back(guard_of(census, parts[j], census.split[parts[j]], by_part[j]));
    }
    if (issued_at == 0) {  // issued at one place only: the kind is named by it
      for (const auto& [s, n] : census.split) {
        if (s.kind == k.kind && s.purpose == k.purpose) k.pattern = s.pattern;
      }
    }
    OrderingGuard g = guard_of(census, k, census.classes[kinds[i]], by_kind[i]);
    std::stable_sort(places_here.begin(), places_here.end(), most_first);
    g.places = std::move(places_here);
    guards.push_back(std::move(g));
  }
  std::stable_sort(guards.begin(), guards.end(), most_first);
  return guards;
}

}  // namespace

std::uint64_t secondary_findings(const CheckResult& result, FindingKind kind) {
  std::uint64_t n = 0;
  for (const FindingGroup& g : result.groups) {
    if (g.example.kind == kind && g.example.role == BufferRole::kSecondary) n += g.count;
  }
  return n;
}

OrderExplanation explain_ordering(const Schedule& schedule, unsigned workers) {
  OrderExplanation out;
  OrderingCensus census = census_of(schedule, out.secondary_copies);
  if (out.secondary_copies == 0) return out;

  // 1. Each (kind, purpose) left out alone.
  std::vector<Kind> kinds;
  for (const auto& [k, n] : census.classes) kinds.push_back(k);
  const std::vector<Outcome> by_kind = outcomes_without(schedule, workers, tests_by_kind(kinds));
  // 2. A kind that matters, split by where it was issued when it was issued at several places.
  std::vector<Kind> parts;
  std::vector<LeaveOut> part_tests;
  split_by_place(census, kinds, by_kind, parts, part_tests);
  const std::vector<Outcome> by_part = outcomes_without(schedule, workers, part_tests);
  out.kinds_tried = kinds.size() + parts.size();

  out.guards = guards_of(census, kinds, by_kind, parts, by_part);
  // 3. No single kind: the copies are ordered more than once; what do all host syncs, or all
  //    stream waits, do?
  if (out.guards.empty()) {
    const std::vector<Outcome> all = outcomes_without(
        schedule, workers,
        {[](Rank, std::uint32_t, const Op& op) { return host_sync(op.kind); },
         [](Rank, std::uint32_t, const Op& op) { return op.kind == OpKind::kStreamWaitEvent; }});
    out.without_host_syncs = static_cast<std::int64_t>(all[0].total());
    out.without_stream_waits = static_cast<std::int64_t>(all[1].total());
    out.kinds_tried += 2;
  }
  return out;
}

namespace {

std::string findings_phrase(std::uint64_t races, std::uint64_t stale) {
  std::vector<std::string> parts;
  if (races > 0) parts.push_back(fmt::format("{} race{}", races, races == 1 ? "" : "s"));
  if (stale > 0) parts.push_back(fmt::format("{} stale read{}", stale, stale == 1 ? "" : "s"));
  return parts.empty() ? "nothing" : fmt::format("{}", fmt::join(parts, " and "));
}

bool deepspeeds_fix(const OrderingGuard& g) {
  return g.purpose == Purpose::kFixHostSync || g.purpose == Purpose::kFixEventWait ||
         g.purpose == Purpose::kFixEventRecord;
}

bool from_the_model_or_script(const OrderingGuard& g) {
  return g.purpose == Purpose::kStepSync ||
         (host_sync(g.kind) &&
          (g.purpose == Purpose::kForwardCompute || g.purpose == Purpose::kRecomputeForward));
}

}  // namespace

std::string explain_text(const OrderExplanation& e) {
  if (e.secondary_copies == 0) {
    return "  why clean: no hpZ secondary shard is written (zero_hpz_partition_size 1), so no "
           "gather can read one early\n";
  }
  std::string out = fmt::format(
      "  why clean: {} secondary shard copies (every rank); checked again without each kind of "
      "sync ({} checks):\n",
      e.secondary_copies, e.kinds_tried);
  if (e.guards.empty()) {
    out += fmt::format(
        "    no one kind of sync is needed alone: the copies are ordered more than once (without "
        "every host sync: {}; without every stream wait: {})\n",
        e.without_host_syncs == 0 ? std::string("still clean")
                                  : fmt::format("{} secondary findings", e.without_host_syncs),
        e.without_stream_waits == 0 ? std::string("still clean")
                                    : fmt::format("{} secondary findings", e.without_stream_waits));
    return out;
  }
  for (const OrderingGuard& g : e.guards) {
    out += fmt::format("    {} ({} ops): without them {}\n", g.what, g.ops,
                       findings_phrase(g.races, g.stale));
    for (const OrderingGuard& p : g.places) {
      out += fmt::format("      of which alone, {} ({} ops): {}\n", p.where, p.ops,
                         findings_phrase(p.races, p.stale));
    }
  }
  const bool fixed = std::any_of(e.guards.begin(), e.guards.end(), deepspeeds_fix);
  const bool outside = std::any_of(e.guards.begin(), e.guards.end(), from_the_model_or_script);
  if (fixed) {
    out += "    DeepSpeed orders the copies itself (its own sync after the copy)\n";
  } else if (outside) {
    out +=
        "    fragile: nothing of DeepSpeed's orders the copies; the model's or the script's own "
        "host syncs do, and a model or script without them races\n";
  } else {
    out +=
        "    DeepSpeed orders the copies only through syncs it issues for other reasons, none "
        "meant for them\n";
  }
  return out;
}

nlohmann::json explain_json(const OrderExplanation& e) {
  nlohmann::json guards = nlohmann::json::array();
  const auto place_json = [](const OrderingGuard& p) {
    return nlohmann::json{{"where", p.where},
                          {"ops", p.ops},
                          {"races_without", p.races},
                          {"stale_reads_without", p.stale}};
  };
  for (const OrderingGuard& g : e.guards) {
    nlohmann::json places = nlohmann::json::array();
    for (const OrderingGuard& p : g.places) places.push_back(place_json(p));
    guards.push_back({{"op_kind", std::string(to_string(g.kind))},
                      {"purpose", std::string(to_string(g.purpose))},
                      {"where", g.where},
                      {"what", g.what},
                      {"ops", g.ops},
                      {"races_without", g.races},
                      {"stale_reads_without", g.stale},
                      {"deepspeed_fix", deepspeeds_fix(g)},
                      {"places_alone", places}});
  }
  nlohmann::json j = {
      {"secondary_copies", e.secondary_copies}, {"checks", e.kinds_tried}, {"guards", guards}};
  if (e.without_host_syncs >= 0) j["secondary_findings_without_host_syncs"] = e.without_host_syncs;
  if (e.without_stream_waits >= 0) {
    j["secondary_findings_without_stream_waits"] = e.without_stream_waits;
  }
  return j;
}

}  // namespace hpz::check
