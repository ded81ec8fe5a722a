// The timing engine on one node per symmetry class (issue 33): where every node of the world
// issues what node 0 issues, each rank on its own node's groups, and the network is the same on
// every node, the full simulation is invariant under moving every rank one node on (rank r to
// r + gpus_per_node, modulo the world). Then every rank's times are its node-0 counterpart's, and
// every link's bytes its node-0 counterpart's; max-min sharing (SimGrid's CM02 and LV08) gives
// flows that the move maps onto each other equal rates, because its solution is unique.
//
// So only node 0's ranks are simulated. A transfer from a node-0 rank a to rank b on node k
// leaves through a's NVLink and NIC as in the full run; in the full run it arrives through node
// k's NIC and b's NVLink, which by symmetry carry exactly what node 0's NIC of the same index and
// rank b mod G's NVLink carry, so here it arrives through those (at a "mirror" host of b mod G).
// Its end counts as a's send and as the receive that rank b - k*G (node 0) gets, in the full
// run, from the translate of a on node -k: that flow is the same flow moved k nodes back.
// Each link then carries one flow per orbit of the full run's flows, with the same weights
// (SimGrid's 5% cross-traffic on the reverse route included), so the max-min system is the full
// one's quotient and its rates are the full one's.
//
// Exact (up to floating-point summation order) when: jitter is 0 (draws are per rank: node k's
// ranks draw other noise than node 0's; with --by-class forced every node draws node 0's noise,
// which is a different model and is said so); every rank issues its node-0 counterpart's ops,
// its collectives on the moved groups; every group a node-0 rank uses lies inside one node or
// is unchanged by the move (the world, qgZ's inter-node groups), so the k-th collective on it is
// one instance whose remote members are node 0's members moved; the reverse routes SimGrid
// loads are alike for every flow one quotient flow stands for. Anything else: the full run.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"
#include "sim/platform.hpp"
#include "sim/time/platform.hpp"

namespace simgrid::s4u {
class Host;
}

namespace hpz::time {

struct EngineRun;

/** How the world folds onto node 0. */
struct NodeQuotient {
  int gpus_per_node = 0;  ///< G: ranks simulated (node 0's)
  int nodes = 0;
  int world = 0;
  int nics_per_node = 1;
  bool exact = true;  ///< false: forced with jitter (node k draws node 0's noise)
  /** Quotient routes: (sender, receiver) with receiver < G a node-0 rank, receiver >= G the
   *  mirror of rank receiver - G arriving from another node. */
  std::vector<std::pair<Rank, Rank>> pairs;
  /** Per quotient route, a full-world pair whose route folds onto it. */
  std::vector<std::pair<Rank, Rank>> full_pairs;

  /** The node-0 link that stands for link `id` of the full topology. */
  LinkId fold(LinkId id) const;
  /** The host index (into install_quotient's hosts) a transfer to full rank `b` arrives at. */
  int receiver(Rank b) const { return b < gpus_per_node ? b : gpus_per_node + b % gpus_per_node; }
};

/** Whether `schedule` may be simulated on node 0 alone; when not, `why` says why (one phrase).
 *  `force` allows jitter (not exact: every node draws node 0's noise). */
bool node_quotient(const TimingInputs& in, const Schedule& schedule, bool force, NodeQuotient& out,
                   std::string& why);

/** Creates node 0's hosts and their mirrors, node 0's links and the quotient routes in the
 *  SimGrid engine; returns 2G hosts (0..G-1 the ranks, G..2G-1 the mirrors). */
std::vector<simgrid::s4u::Host*> install_quotient(const Topology& topology,
                                                  const NodeQuotient& quotient);

/** Gives every link its node-0 counterpart's bytes (run.link_bytes indexed as a full run's). */
void unfold_links(const NodeQuotient& quotient, const Topology& topology, EngineRun& run);

/** Gives every rank its node-0 counterpart's times: node 0's timeline becomes the world's,
 *  indexed as a full run's (memory grows with the world: only for reports that need it). */
void unfold_timeline(const NodeQuotient& quotient, Timeline& timeline);

/** One line on how a run was simulated by class ("16 ranks by symmetry class: node 0's 8 ranks
 *  simulated for 2 nodes"). */
std::string describe_quotient(const NodeQuotient& quotient);

}  // namespace hpz::time
