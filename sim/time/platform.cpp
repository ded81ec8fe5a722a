#include "sim/time/platform.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>

namespace hpz::time {

Topology::Topology(const ClusterConfig& cluster)
    : world_(cluster.world_size()),
      gpus_per_node_(cluster.gpus_per_node),
      nics_per_node_(cluster.nics_per_node) {
  const double nvlink_bw = cluster.nvlink_gbytes_per_s * 1e9;
  const double nvlink_lat = cluster.nvlink_latency_us * 1e-6 / 2;  // two links make one hop
  for (Rank r = 0; r < world_; ++r) {
    links_.push_back({fmt::format("gpu{}.nvlink.up", r), nvlink_bw, nvlink_lat, false});
    links_.push_back({fmt::format("gpu{}.nvlink.down", r), nvlink_bw, nvlink_lat, false});
  }
  const double nic_bw = cluster.nic_gbps * 1e9 / 8;
  const double nic_lat = cluster.internode_latency_us * 1e-6 / 2;  // sender's + receiver's NIC
  for (int n = 0; n < cluster.nodes; ++n) {
    for (int k = 0; k < nics_per_node_; ++k) {
      links_.push_back({fmt::format("node{}.nic{}.up", n, k), nic_bw, nic_lat, true});
      links_.push_back({fmt::format("node{}.nic{}.down", n, k), nic_bw, nic_lat, true});
    }
  }
}

LinkId Topology::nic(Rank r, bool up) const {
  const int node = r / gpus_per_node_;
  const int k = (r % gpus_per_node_) % nics_per_node_;
  return static_cast<LinkId>(2 * world_ + 2 * (node * nics_per_node_ + k) + (up ? 0 : 1));
}

std::vector<LinkId> Topology::route(Rank a, Rank b) const {
  if (a / gpus_per_node_ == b / gpus_per_node_) return {nvlink(a, true), nvlink(b, false)};
  return {nvlink(a, true), nic(a, true), nic(b, false), nvlink(b, false)};
}

std::vector<std::pair<Rank, Rank>> used_pairs(const Schedule& schedule) {
  std::set<std::pair<GroupId, bool>> uses;  // (group, has an all-to-all)
  for (const RankSchedule& rs : schedule.ranks) {
    for (const Op& op : rs.ops) {
      if (is_collective(op.kind)) uses.insert({op.group, op.kind == OpKind::kAllToAll});
    }
  }
  std::set<std::pair<Rank, Rank>> pairs;
  for (const auto& [g, all_to_all] : uses) {
    const std::vector<Rank>& members = schedule.groups[static_cast<std::size_t>(g)].ranks;
    const std::size_t n = members.size();
    for (std::size_t i = 0; i < n && n > 1; ++i) {
      pairs.insert({members[i], members[(i + 1) % n]});
      for (std::size_t j = 0; all_to_all && j < n; ++j) {
        if (j != i) pairs.insert({members[i], members[j]});
      }
    }
  }
  return {pairs.begin(), pairs.end()};
}

std::vector<simgrid::s4u::Host*> install(const Topology& topology,
                                         const std::vector<std::pair<Rank, Rank>>& pairs) {
  namespace s4u = simgrid::s4u;
  s4u::NetZone* zone = s4u::create_full_zone("cluster");
  std::vector<s4u::Host*> hosts;
  for (Rank r = 0; r < topology.world_size(); ++r) {
    // Speed 1e9 "flops" per second per core: an op of d seconds is an Exec of d * 1e9 flops.
    // Enough cores that every stream of the rank runs at full speed at once.
    hosts.push_back(zone->create_host(fmt::format("gpu{}", r), 1e9)->set_core_count(64)->seal());
  }
  std::vector<s4u::Link*> links;
  for (const LinkSpec& spec : topology.links()) {
    links.push_back(zone->create_link(spec.name, spec.bytes_per_s)->set_latency(spec.latency_s));
    links.back()->seal();
  }
  for (const auto& [a, b] : pairs) {
    std::vector<s4u::LinkInRoute> route;
    for (LinkId id : topology.route(a, b)) route.emplace_back(links[id]);
    zone->add_route(hosts[static_cast<std::size_t>(a)]->get_netpoint(),
                    hosts[static_cast<std::size_t>(b)]->get_netpoint(), nullptr, nullptr, route,
                    false);
  }
  zone->seal();
  return hosts;
}

}  // namespace hpz::time
