#include "sim/time/by_class.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>
#include <tuple>
#include <unordered_map>

#include "sim/time/engine.hpp"

namespace hpz::time {
namespace {

/** Kinds of node the fold simulates at most: each costs G simulated ranks, and the search
 *  compares every node with each kind found so far. The padded worlds of the shipped scenarios
 *  have two (llama2-70b past 8,192 GPUs, tiny past 64). */
constexpr int kMaxKinds = 16;

/** A group's ranks moved `k` nodes on (modulo the world), ascending. */
std::vector<Rank> moved(const std::vector<Rank>& ranks, int k, int gpus, int world) {
  std::vector<Rank> out;
  out.reserve(ranks.size());
  for (Rank r : ranks) out.push_back((r + k * gpus) % world);
  std::sort(out.begin(), out.end());
  return out;
}

/** True when the copy op reads or writes host memory (the cost model's PCIe case). */
bool host_copy(const Schedule& schedule, Rank r, const Op& op) {
  const RankSchedule& rs = schedule.ranks[static_cast<std::size_t>(r)];
  const auto accesses = schedule.accesses_of(r, op);
  return std::any_of(accesses.begin(), accesses.end(),
                     [&rs](const Access& a) { return rs.buffers[a.buffer].on_host; });
}

/** The folding of the world onto node 0 as far as checked: the groups node 0 uses and how. */
class Folding {
 public:
  Folding(const Schedule& schedule, int gpus, int nodes)
      : schedule_(schedule), gpus_(gpus), nodes_(nodes), world_(gpus * nodes) {}

  /** Node 0's groups lie inside node 0 or are unchanged by a move of one node. */
  bool groups_fold(std::string& why) {
    for (Rank r = 0; r < gpus_; ++r) {
      for (const Op& op : schedule_.ranks[static_cast<std::size_t>(r)].ops) {
        if (!is_collective(op.kind)) continue;
        uses_.insert({op.group, op.kind == OpKind::kAllToAll});
      }
    }
    for (const auto& [g, all_to_all] : uses_) {
      const std::vector<Rank>& ranks = members(g);
      if (ranks.back() < gpus_) continue;  // inside node 0
      if (moved(ranks, 1, gpus_, world_) != ranks) {
        why = fmt::format("group {} spans some nodes but is not the same on every node",
                          schedule_.groups[static_cast<std::size_t>(g)].name);
        return false;
      }
    }
    return true;
  }

  /** Sorts the nodes into kinds (NodeQuotient::kind_reps): every node issues the ops of its
   *  kind's first node moved, and the kinds issue the same collectives. More than `max_kinds`
   *  kinds, or a kind whose collectives differ from node 0's: false, with why. */
  bool kinds_fold(int max_kinds, NodeQuotient& out, std::string& why) {
    out.kind_reps.assign(1, 0);
    out.kind_nodes.assign(1, 1);
    std::vector<std::int32_t> node_kind(static_cast<std::size_t>(nodes_), 0);
    std::vector<GroupId> moved_group(schedule_.groups.size(), kNoGroup);
    int last = 0;  // the kind the previous node was of: most nodes are of their neighbour's
    for (int k = 1; k < nodes_; ++k) {
      int kind = -1;
      for (int t = 0; t < out.kinds() && kind < 0; ++t) {
        const int q = t == 0 ? last : (t <= last ? t - 1 : t);
        if (node_folds(out.kind_reps[static_cast<std::size_t>(q)], k, moved_group)) kind = q;
      }
      if (kind < 0) {
        for (Rank j = 0; j < gpus_; ++j) {
          if (!collectives_alike(j, k * gpus_ + j, k)) {
            why = fmt::format("rank {} issues other collectives than rank {}", k * gpus_ + j, j);
            return false;
          }
        }
        if (out.kinds() == max_kinds) {
          why = fmt::format("more than {} kinds of node (rank {} issues other ops than rank {})",
                            max_kinds, k * gpus_, 0);
          return false;
        }
        kind = out.kinds();
        out.kind_reps.push_back(k);
        out.kind_nodes.push_back(0);
      }
      ++out.kind_nodes[static_cast<std::size_t>(kind)];
      node_kind[static_cast<std::size_t>(k)] = kind;
      last = kind;
    }
    if (out.kinds() > 1) out.node_kind = std::move(node_kind);
    return true;
  }

  /** The quotient routes; false when the reverse routes of the flows one quotient flow stands
   *  for differ (SimGrid loads a flow's reverse route with 5% cross-traffic where it exists). */
  bool routes(std::vector<std::pair<Rank, Rank>>& pairs, std::vector<std::pair<Rank, Rank>>& full,
              std::string& why) const {
    std::set<std::pair<Rank, Rank>> local, back;  // back: full pairs (remote, node-0 rank)
    std::map<std::pair<Rank, Rank>, std::vector<Rank>> out;  // (a, b mod G) -> remote b
    for (const auto& [g, all_to_all] : uses_) {
      const std::vector<Rank>& m = members(g);
      const auto n = static_cast<int>(m.size());
      for (int i = 0; i < n && n > 1 && m[static_cast<std::size_t>(i)] < gpus_; ++i) {
        const Rank a = m[static_cast<std::size_t>(i)];
        for (int s = 1; s < n; ++s) {
          const Rank other = m[static_cast<std::size_t>((i + s) % n)];
          if (all_to_all || s == 1) {  // a sends to it
            if (other < gpus_) {
              local.insert({a, other});
            } else {
              out[{a, other % gpus_}].push_back(other);
            }
          }
          if ((all_to_all || s == n - 1) && other >= gpus_) back.insert({other, a});
        }
      }
    }
    for (const auto& p : local) {
      pairs.push_back(p);
      full.push_back(p);
    }
    for (auto& [key, bs] : out) {
      const auto [a, j] = key;
      std::sort(bs.begin(), bs.end());
      bs.erase(std::unique(bs.begin(), bs.end()), bs.end());
      const auto loaded = std::count_if(bs.begin(), bs.end(), [&, a = a](Rank b) {
        return back.count({b, a}) != 0;
      });
      if (loaded != 0 && loaded != static_cast<std::ptrdiff_t>(bs.size())) {
        why = fmt::format("rank {}'s transfers to ranks {} mod {} meet different reverse routes", a,
                          j, gpus_);
        return false;
      }
      pairs.emplace_back(a, gpus_ + j);
      full.emplace_back(a, bs.front());
      if (loaded != 0) {
        pairs.emplace_back(gpus_ + j, a);
        full.emplace_back(bs.front(), a);
      }
    }
    return true;
  }

 private:
  const std::vector<Rank>& members(GroupId g) const {
    return schedule_.groups[static_cast<std::size_t>(g)].ranks;
  }

  /** Node k's ranks issue node `rep`'s ops moved k - rep nodes on. */
  bool node_folds(int rep, int k, std::vector<GroupId>& moved_group) {
    std::fill(moved_group.begin(), moved_group.end(), kNoGroup);
    for (Rank j = 0; j < gpus_; ++j) {
      if (!rank_folds(rep * gpus_ + j, k * gpus_ + j, k - rep, moved_group)) return false;
    }
    return true;
  }

  bool inside_one_node(GroupId g) const {
    return members(g).front() / gpus_ == members(g).back() / gpus_;
  }

  /** Group `to` is group `from` moved k nodes on: the same group when it spans nodes (the k-th
   *  collective on it is one instance), its members moved when it lies inside one node. */
  bool moves_to(GroupId from, GroupId to, int k) const {
    if (!inside_one_node(from) && to != from) return false;
    return moved(members(from), k, gpus_, world_) == members(to);
  }

  /** Group `to` is one group `from` always moves to. */
  bool maps(GroupId from, GroupId to, int k, std::vector<GroupId>& moved_group) const {
    GroupId& seen = moved_group[static_cast<std::size_t>(from)];
    if (seen == kNoGroup) {
      if (!moves_to(from, to, k)) return false;
      seen = to;
    }
    return seen == to;
  }

  /** The groups a shared op list's copy names, once per copy. */
  const std::vector<GroupId>& copy_groups(const OpList& ops) {
    auto [it, fresh] = copy_groups_.try_emplace(&ops.stored(0));
    if (fresh) {
      std::set<GroupId> groups;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        if (ops.stored(i).group != kNoGroup) groups.insert(ops.stored(i).group);
      }
      it->second.assign(groups.begin(), groups.end());
    }
    return it->second;
  }

  bool rank_folds(Rank j, Rank r, int k, std::vector<GroupId>& moved_group) {
    const RankSchedule& a = schedule_.ranks[static_cast<std::size_t>(j)];
    const RankSchedule& b = schedule_.ranks[static_cast<std::size_t>(r)];
    if (a.ops.size() != b.ops.size() || a.streams.size() != b.streams.size()) return false;
    const bool shared_ops = b.ops.shares_with(a.ops);
    const bool shared_buffers = b.buffers.shares_with(a.buffers);
    if (shared_ops && shared_buffers && !a.ops.empty()) {
      // One copy, each rank on its own groups: the ops are equal but for those, so it is enough
      // that each of the copy's groups moves as the rule says (what the loop below checks op by
      // op). At 16,384 GPUs the loop was half of `sim`'s time.
      for (GroupId g : copy_groups(a.ops)) {
        const GroupId x = a.ops.own_group(g), y = b.ops.own_group(g);
        if (x == kNoGroup || y == kNoGroup) {
          if (x != y) return false;
        } else if (!maps(x, y, k, moved_group)) {
          return false;
        }
      }
      return true;
    }
    for (std::size_t i = 0; i < a.ops.size(); ++i) {
      const Op x = a.ops[i];
      Op y = b.ops[i];
      if (x.kind == OpKind::kCopy && !shared_buffers &&
          host_copy(schedule_, j, x) != host_copy(schedule_, r, y)) {
        return false;
      }
      if (x.group == kNoGroup) {
        if (!shared_ops && !(x == y)) return false;
        continue;
      }
      if (!maps(x.group, y.group, k, moved_group)) return false;
      y.group = x.group;
      if (!shared_ops && !(x == y)) return false;
    }
    return true;
  }

  /** Rank r (node k) issues node-0 rank j's collectives, in its order, on the moved groups:
   *  what the instances' plans and node 0's link bytes are made of (kind, bytes, step). */
  bool collectives_alike(Rank j, Rank r, int k) const {
    const auto& a = schedule_.ranks[static_cast<std::size_t>(j)].ops;
    const auto& b = schedule_.ranks[static_cast<std::size_t>(r)].ops;
    std::vector<GroupId> moved_group(schedule_.groups.size(), kNoGroup);
    std::size_t x = 0, y = 0;
    while (true) {
      while (x < a.size() && !is_collective(a[x].kind)) ++x;
      while (y < b.size() && !is_collective(b[y].kind)) ++y;
      if (x == a.size() || y == b.size()) return x == a.size() && y == b.size();
      const Op& p = a[x++];
      const Op& q = b[y++];
      if (p.kind != q.kind || p.comm_bytes != q.comm_bytes || p.step != q.step) return false;
      if (!maps(p.group, q.group, k, moved_group)) return false;
    }
  }

  const Schedule& schedule_;
  int gpus_, nodes_, world_;
  std::set<std::pair<GroupId, bool>> uses_;  ///< (group, has an all-to-all) of node 0's ops
  std::unordered_map<const Op*, std::vector<GroupId>> copy_groups_;  ///< copy_groups()
};

}  // namespace

LinkId NodeQuotient::fold(LinkId id) const {
  const auto nvlinks = static_cast<LinkId>(2 * world);
  if (id < nvlinks) {
    const LinkId r = id / 2;
    return 2 * (r % static_cast<LinkId>(gpus_per_node)) + id % 2;
  }
  const LinkId slot = (id - nvlinks) / 2;  // node * nics_per_node + nic
  return nvlinks + 2 * (slot % static_cast<LinkId>(nics_per_node)) + id % 2;
}

bool node_quotient(const TimingInputs& in, const Schedule& schedule, bool force, NodeQuotient& out,
                   std::string& why) {
  const ClusterConfig& c = in.cluster;
  out = {};
  out.gpus_per_node = c.gpus_per_node;
  out.nodes = c.nodes;
  out.world = c.world_size();
  out.nics_per_node = c.nics_per_node;
  out.exact = in.sim.jitter <= 0;
  if (c.nodes < 2) {
    why = "one node";
    return false;
  }
  if (schedule.world_size != out.world ||
      schedule.ranks.size() != static_cast<std::size_t>(out.world)) {
    why = "the schedule's world is not the cluster's";
    return false;
  }
  if (!out.exact && !force) {
    why = fmt::format(
        "sim.jitter = {} draws noise per rank; --by-class folds it, every node drawing node 0's",
        in.sim.jitter);
    return false;
  }
  Folding folding(schedule, c.gpus_per_node, c.nodes);
  std::vector<std::pair<Rank, Rank>> full;
  if (!folding.groups_fold(why) || !folding.kinds_fold(kMaxKinds, out, why) ||
      !folding.routes(out.pairs, full, why)) {
    return false;
  }
  if (out.kinds() > 1 && collective_model_of(in) != CollectiveModel::kCoarse) {
    why = fmt::format(
        "nodes of {} kinds (rank {} issues other ops than rank 0): folded only in the coarse "
        "collective model, where no kind's hops inside a node share a link with another's "
        "(--set sim.collective_model=coarse)",
        out.kinds(), out.kind_reps[1] * c.gpus_per_node);
    return false;
  }
  out.full_pairs = std::move(full);
  return true;
}

std::vector<simgrid::s4u::Host*> install_quotient(const Topology& topology,
                                                  const NodeQuotient& quotient) {
  namespace s4u = simgrid::s4u;
  s4u::NetZone* zone = s4u::create_full_zone("node0");
  const int g = quotient.gpus_per_node;
  std::vector<s4u::Host*> hosts;
  for (int h = 0; h < 2 * g; ++h) {
    const std::string name = h < g ? fmt::format("gpu{}", h) : fmt::format("gpu{}.mirror", h - g);
    hosts.push_back(zone->create_host(name, 1e9)->set_core_count(64)->seal());
  }
  std::map<LinkId, s4u::Link*> links;
  const auto link = [&](LinkId id) {
    auto [it, fresh] = links.try_emplace(id, nullptr);
    if (fresh) {
      const LinkSpec& spec = topology.links()[id];
      it->second = zone->create_link(spec.name, spec.bytes_per_s)->set_latency(spec.latency_s);
      it->second->seal();
    }
    return it->second;
  };
  for (std::size_t p = 0; p < quotient.pairs.size(); ++p) {
    const auto [from, to] = quotient.pairs[p];
    const auto [a, b] = quotient.full_pairs[p];
    std::vector<s4u::LinkInRoute> route;
    for (LinkId id : topology.route(a, b)) route.emplace_back(link(quotient.fold(id)));
    zone->add_route(hosts[static_cast<std::size_t>(from)]->get_netpoint(),
                    hosts[static_cast<std::size_t>(to)]->get_netpoint(), nullptr, nullptr, route,
                    false);
  }
  zone->seal();
  return hosts;
}

void unfold_timeline(const NodeQuotient& quotient, Timeline& timeline) {
  std::vector<std::vector<OpTime>> simulated = std::move(timeline.ranks);
  auto& ranks = timeline.ranks;
  ranks.resize(static_cast<std::size_t>(quotient.world));
  for (Rank r = 0; r < quotient.world; ++r) {
    ranks[static_cast<std::size_t>(r)] = simulated[static_cast<std::size_t>(quotient.index_of(r))];
  }
}

void unfold_links(const NodeQuotient& quotient, const Topology& topology, EngineRun& run) {
  for (auto& per_link : run.link_bytes) {
    per_link.resize(topology.links().size(), 0.0);
    for (LinkId id = 0; id < per_link.size(); ++id) per_link[id] = per_link[quotient.fold(id)];
  }
}

std::string describe_quotient(const NodeQuotient& quotient) {
  const char* jitter =
      quotient.exact ? "" : " (jitter folded: every node draws node 0's noise, not exact)";
  if (quotient.kinds() == 1) {
    return fmt::format("{} ranks by symmetry class: node 0's {} ranks simulated for {} nodes{}",
                       quotient.world, quotient.gpus_per_node, quotient.nodes, jitter);
  }
  std::string kinds;
  for (int q = 0; q < quotient.kinds(); ++q) {
    kinds += fmt::format("{}node {} for {}", q == 0 ? "" : ", ",
                         quotient.kind_reps[static_cast<std::size_t>(q)],
                         quotient.kind_nodes[static_cast<std::size_t>(q)]);
  }
  return fmt::format(
      "{} ranks by symmetry class: {} kinds of node, the {} ranks of one node of each simulated "
      "({}){}",
      quotient.world, quotient.kinds(), quotient.simulated(), kinds, jitter);
}

}  // namespace hpz::time
