// The network the timing engine runs on, built from [cluster]: per GPU an NVLink link (one per
// direction) to its node's switch, per node nics_per_node NICs (one link per direction) to the
// inter-node switch. GPU i of a node uses NIC i % nics_per_node (one rail per NIC).
//
// The link table and the routes are plain data, usable without SimGrid (reports read them);
// install() creates them in the running SimGrid engine.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/platform.hpp"

namespace simgrid::s4u {
class Host;
}

namespace hpz::time {

using LinkId = std::uint32_t;

/** One direction of one physical link. */
struct LinkSpec {
  std::string name;        ///< "gpu3.nvlink.up", "node1.nic0.down"
  double bytes_per_s = 0;  ///< nominal bandwidth
  double latency_s = 0;    ///< latency of this link
  bool internode = false;  ///< a NIC link (as opposed to NVLink)
};

/** The links of a cluster and the route between any two ranks. */
class Topology {
 public:
  /** Lays out the links of `cluster`; no SimGrid call. */
  explicit Topology(const ClusterConfig& cluster);

  /** Every link direction, indexed by LinkId. */
  const std::vector<LinkSpec>& links() const { return links_; }
  /** The link directions a transfer from rank a to rank b (a != b) crosses, in order. */
  std::vector<LinkId> route(Rank a, Rank b) const;
  /** Number of ranks. */
  int world_size() const { return world_; }
  /** The node rank r is on. */
  int node_of(Rank r) const { return r / gpus_per_node_; }

 private:
  LinkId nvlink(Rank r, bool up) const { return static_cast<LinkId>(2 * r + (up ? 0 : 1)); }
  LinkId nic(Rank r, bool up) const;

  int world_;
  int gpus_per_node_;
  int nics_per_node_;
  std::vector<LinkSpec> links_;
};

/** The ordered rank pairs the schedule's collectives can send between (ring neighbours, and
 *  every pair of an all-to-all group): only those get a SimGrid route. */
std::vector<std::pair<Rank, Rank>> used_pairs(const Schedule& schedule);

/** Creates hosts, links and routes in the SimGrid engine (which must exist and be empty);
 *  returns one host per rank. */
std::vector<simgrid::s4u::Host*> install(const Topology& topology,
                                         const std::vector<std::pair<Rank, Rank>>& pairs);

}  // namespace hpz::time
