// Collectives across ranks: each rank's arrival at the k-th collective of a group, the
// rendezvous that orders every member's later work after every member's start, and the
// mismatches and hangs when members disagree (checker.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "sim/check/checker_impl.hpp"

namespace hpz::check::detail {
namespace {

std::uint64_t instance_key(GroupId g, std::uint32_t seq) {
  return (static_cast<std::uint64_t>(g) << 32) | seq;
}

std::string mib(std::uint64_t bytes) {
  return fmt::format("{:.3g} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

std::string rank_list(const std::vector<Rank>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

void Checker::arrive(RankState& rs, std::uint32_t index, const Op& op) {
  const Rank r = rs.schedule->rank;
  if (op.group < 0 || op.group >= static_cast<GroupId>(schedule_.groups.size())) {
    malformed(rs, index, "collective names no group");
  }
  const Group& g = schedule_.groups[op.group];
  if (!std::binary_search(g.ranks.begin(), g.ranks.end(), r)) {
    malformed(rs, index, fmt::format("collective on group {}, which rank {} is not in", g.name, r));
  }
  if (world_ != nullptr) {
    meet_by_symmetry(rs, index, op);
    return;
  }
  const std::uint32_t seq = rs.group_seq[op.group]++;
  rs.group_last_op[op.group] = index;
  const std::uint64_t key = instance_key(op.group, seq);
  Clock& s = rs.streams[op.stream];
  Instance& inst = instances_[key];
  inst.arrivals.push_back(Arrival{r, index, op.stream, s});
  // The start is what peers learn; later ops on the stream are not part of it.
  ++s.own[thread_of(op.stream)];
  rs.pending[op.stream] = static_cast<std::int64_t>(key);
  if (inst.arrivals.size() == g.ranks.size()) complete(key, false);
}

void Checker::meet_by_symmetry(RankState& rs, std::uint32_t index, const Op& op) {
  rs.group_last_op[op.group] = index;
  ++rs.group_seq[op.group];
  // The start is what peers learn; later ops on the stream are not part of it. What they tell
  // back this rank knew already (symmetric_world.hpp).
  ++rs.streams[op.stream].own[thread_of(op.stream)];
}

void Checker::complete(std::uint64_t key, bool forced) {
  auto it = instances_.find(key);
  Instance inst = std::move(it->second);
  instances_.erase(it);
  const auto g = static_cast<GroupId>(key >> 32);
  const auto seq = static_cast<std::uint32_t>(key & 0xffffffffu);
  ++stats_.collectives;
  if (!forced) check_signatures(g, seq, inst);
  std::vector<const Clock*> clocks;
  std::vector<Rank> members;
  for (const Arrival& a : inst.arrivals) {
    clocks.push_back(&a.start);
    members.push_back(a.rank);
  }
  const Knowledge met = arena_.rendezvous(clocks, members);
  for (const Arrival& a : inst.arrivals) {
    RankState& m = ranks_[a.rank];
    Clock& s = m.streams[a.stream];
    merge_ticks(s.own, arena_.ticks_of(met, a.rank));
    arena_.join(s.remote, met);
    std::erase_if(s.remote.delta, [&](const RemoteTicks& e) { return e.rank == a.rank; });
    if (m.pending[a.stream] == static_cast<std::int64_t>(key)) m.pending[a.stream] = kNotPending;
    if (m.blocked) {
      m.blocked = false;
      ready_.push_back(a.rank);
    }
  }
}

void Checker::check_signatures(GroupId g, std::uint32_t seq, const Instance& inst) {
  if (group_reported_[g]) return;
  auto signature = [&](const Arrival& a) {
    const Op& op = schedule_.ranks[a.rank].ops[a.op];
    return std::pair{op.kind, op.comm_bytes};
  };
  // The signature most members issued is "right"; the first other one is reported.
  std::map<std::pair<OpKind, std::uint64_t>, std::vector<Rank>> by_sig;
  for (const Arrival& a : inst.arrivals) by_sig[signature(a)].push_back(a.rank);
  if (by_sig.size() == 1) return;
  group_reported_[g] = true;
  auto majority = std::max_element(by_sig.begin(), by_sig.end(), [](const auto& x, const auto& y) {
    return x.second.size() < y.second.size();
  });
  const Arrival* good = nullptr;
  const Arrival* odd = nullptr;
  for (const Arrival& a : inst.arrivals) {
    if (signature(a) == majority->first) {
      if (!good) good = &a;
    } else if (!odd) {
      odd = &a;
    }
  }
  const Op& gop = schedule_.ranks[good->rank].ops[good->op];
  const Op& oop = schedule_.ranks[odd->rank].ops[odd->op];
  std::vector<Rank> odd_ranks;
  for (const auto& [sig, ranks] : by_sig) {
    if (sig != majority->first) odd_ranks.insert(odd_ranks.end(), ranks.begin(), ranks.end());
  }
  std::sort(odd_ranks.begin(), odd_ranks.end());
  log_.mismatch(g, seq, good->rank, good->op, odd->rank, odd->op,
                fmt::format("ranks {} issue {} of {} but ranks {} issue {} of {}",
                            rank_list(majority->second), to_string(gop.kind), mib(gop.comm_bytes),
                            rank_list(odd_ranks), to_string(oop.kind), mib(oop.comm_bytes)));
}

void Checker::report_hang(GroupId g, std::uint32_t seq, const Instance& inst) {
  if (group_reported_[g]) return;
  group_reported_[g] = true;
  const Group& grp = schedule_.groups[g];
  std::vector<Rank> arrived;
  for (const Arrival& a : inst.arrivals) arrived.push_back(a.rank);
  std::sort(arrived.begin(), arrived.end());
  std::vector<Rank> missing;
  std::set_difference(grp.ranks.begin(), grp.ranks.end(), arrived.begin(), arrived.end(),
                      std::back_inserter(missing));
  const Rank m = missing.front();
  const RankState& ms = ranks_[m];
  // Where the missing rank is stuck: inside a collective of its own, or done.
  std::uint32_t at = ms.done ? ms.group_last_op[g] : ms.next;
  std::string doing =
      ms.done ? fmt::format("finished after issuing only {} collectives on it", ms.group_seq[g])
              : fmt::format("is stuck at op #{}", ms.next);
  for (const auto& [key, other] : instances_) {
    for (const Arrival& a : other.arrivals) {
      if (a.rank != m) continue;
      const auto og = static_cast<GroupId>(key >> 32);
      at = a.op;
      doing = fmt::format("is itself waiting in collective #{} on group {}",
                          static_cast<std::uint32_t>(key & 0xffffffffu), schedule_.groups[og].name);
    }
  }
  const Arrival& first = inst.arrivals.front();
  const Op& fop = schedule_.ranks[first.rank].ops[first.op];
  log_.mismatch(g, seq, first.rank, first.op, m, at,
                fmt::format("ranks {} issue {} of {} but ranks {} never issue it (rank {} {})",
                            rank_list(arrived), to_string(fop.kind), mib(fop.comm_bytes),
                            rank_list(missing), m, doing));
}

void Checker::force_all() {
  // Report every incomplete collective first, while all of them still show who waits where.
  std::vector<std::uint64_t> keys;
  for (const auto& [key, inst] : instances_) {
    keys.push_back(key);
    report_hang(static_cast<GroupId>(key >> 32), static_cast<std::uint32_t>(key & 0xffffffffu),
                inst);
  }
  for (std::uint64_t key : keys) complete(key, true);
}

}  // namespace hpz::check::detail
