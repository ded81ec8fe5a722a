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
//
// Kinds of node. Past the end of a weight, ranks hold padding and copy less (llama2-70b's norm
// weights past 8,192 GPUs): node k then issues node 0's ops only for some k. In the coarse
// collective model it still folds, onto one node of each kind. There SimGrid carries only the
// hops between nodes, of collectives on groups that span nodes; each such collective starts
// once, when its last member arrives, and its hops inside a node are timers of a fixed length.
// So the flows in flight stay invariant under the one-node move whatever the nodes compute
// (induction over events, as above), and every member of such a collective ends when its
// node-0 counterpart ends. A node of kind q then sees what the first node of kind q sees: the
// same ops, its own groups' collectives timed alike, and the same ends of the shared ones. So
// the first node of each kind is simulated; its members of a shared collective arrive as they
// do, which the start waits for, and end when node 0's counterpart ends (no hops of their own:
// node 0's stand for them). The kinds must issue node 0's collectives (kind, bytes, step, the
// moved groups): the collectives' plans are one per instance, and node 0's link bytes stand for
// every node's. The fine model puts hops inside a node on NVLink, shared with hops between
// nodes, at times each kind sets: no fold (the full run, and why).
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

/** How the world folds onto node 0 (and one node of each other kind). */
struct NodeQuotient {
  int gpus_per_node = 0;  ///< G
  int nodes = 0;
  int world = 0;
  int nics_per_node = 1;
  bool exact = true;  ///< false: forced with jitter (node k draws node 0's noise)
  /** Kinds of node: node k is of kind q when its ranks issue the ops of kind q's first node
   *  (kind_reps[q]) moved k - kind_reps[q] nodes on. Kind 0 is node 0's; one kind is the plain
   *  node quotient. The kinds' first nodes are simulated, G ranks each (index q * G + j). */
  std::vector<int> kind_reps{0};
  std::vector<int> kind_nodes;          ///< how many nodes each kind has
  std::vector<std::int32_t> node_kind;  ///< per node; empty: every node is of kind 0
  /** Quotient routes: (sender, receiver) with receiver < G a node-0 rank, receiver >= G the
   *  mirror of rank receiver - G arriving from another node. */
  std::vector<std::pair<Rank, Rank>> pairs;
  /** Per quotient route, a full-world pair whose route folds onto it. */
  std::vector<std::pair<Rank, Rank>> full_pairs;

  int kinds() const { return static_cast<int>(kind_reps.size()); }
  /** Ranks simulated: G per kind. */
  int simulated() const { return kinds() * gpus_per_node; }
  /** The rank simulated at `index`. */
  Rank simulated_rank(int index) const {
    return kind_reps[static_cast<std::size_t>(index / gpus_per_node)] * gpus_per_node +
           index % gpus_per_node;
  }
  /** The simulated index that stands for rank `r`. */
  int index_of(Rank r) const {
    const int kind = node_kind.empty() ? 0 : node_kind[static_cast<std::size_t>(r / gpus_per_node)];
    return kind * gpus_per_node + r % gpus_per_node;
  }
  /** How many of the world's ranks the simulated rank at `index` stands for. */
  int stands_for(int index) const {
    return kind_nodes.empty() ? nodes : kind_nodes[static_cast<std::size_t>(index / gpus_per_node)];
  }

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
