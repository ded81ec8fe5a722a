// The timing engine: plays a schedule forward in SimGrid's simulated time and fills a Timeline.
//
// Model (docs/timing.md has the full story):
//  - Each rank's host issues its ops in IR order, paying CostModel::launch_s() (jittered) per
//    stream op; host syncs block it until the stream (or every stream) has drained, or, for an
//    event sync, until the event's record has run.
//  - Streams run FIFO; an op starts when it has been issued, its stream predecessor has ended,
//    the event it waits on (if any) has been recorded, and, for a collective, every member of
//    its group has arrived at the matching collective.
//  - Kernels, quantize kernels and copies run for CostModel::op_s() x jitter; collectives run as
//    SimGrid transfers (CollectivePlan) over the Topology's links, sharing bandwidth per the
//    network model.
// SimGrid's engine is a process-wide singleton: run_engine() may be called once per process;
// run_isolated() runs it in a forked child.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"
#include "sim/platform.hpp"
#include "sim/time/collective.hpp"

namespace hpz::time {

struct NodeQuotient;  // by_class.hpp

/** What one run produced, besides the timeline. */
struct EngineStats {
  /** Collective sends: SimGrid comms, and the coarse model's hops inside a node (init's
   *  collectives are coarse in either model), which are timed without SimGrid (engine.cpp,
   *  send). */
  std::uint64_t transfers = 0;
  std::uint64_t simgrid_comms = 0;  ///< of the transfers, those SimGrid carried
  std::uint64_t execs = 0;          ///< timed delays: kernels, copies, waits for the host to issue
  std::uint64_t ops = 0;            ///< schedule ops timed
  std::uint64_t unfinished = 0;     ///< ops that never ran: the job hangs (collective mismatch)
  double wall_s = 0;                ///< host seconds the simulation took
  double peak_rss_bytes = 0;        ///< peak resident memory of the simulating process
};

/** One simulated run. */
struct EngineRun {
  Timeline timeline;
  /** Bytes sent over each link direction (Topology::links()), per step: [step + 1][link]
   *  (index 0 is init). */
  std::vector<std::vector<double>> link_bytes;
  EngineStats stats;
};

/** How far a run has come, readable from another process (ChildRun shares it). */
struct EngineProgress {
  std::atomic<std::uint64_t> ops_total{0};  ///< stream ops the run will time
  std::atomic<std::uint64_t> ops_done{0};   ///< of which finished (updated every few thousand)
};

/** Runs the schedule in this process's SimGrid engine (once per process); `progress`, when
 *  given, is kept up to date as ops finish. With `quotient`, only node 0's ranks are simulated
 *  (by_class.hpp): the run's timeline has node 0's ranks, its link bytes node 0's links
 *  (unfold_run() gives them to every rank and link). */
EngineRun run_engine(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed,
                     EngineProgress* progress = nullptr, const NodeQuotient* quotient = nullptr);

/** A run_engine() call in a forked child process; wait() collects its result (call it once).
 *  A child never waited for (the caller threw in between) is killed and reaped. */
class ChildRun {
 public:
  /** Forks and starts simulating in the child (with `quotient`: node 0 only, run_engine). */
  ChildRun(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed,
           const NodeQuotient* quotient = nullptr);
  ChildRun(ChildRun&& other) noexcept;
  ChildRun& operator=(ChildRun&&) = delete;
  ChildRun(const ChildRun&) = delete;
  ChildRun& operator=(const ChildRun&) = delete;
  ~ChildRun();
  /** Reads the child's result and reaps it; throws std::runtime_error if the child failed. */
  EngineRun wait();
  /** True when the child's result can be read without blocking, waiting at most `timeout_ms`. */
  bool ready(int timeout_ms) const;
  /** The share of the run's ops done so far, 0 to 1. */
  double fraction() const;

 private:
  int pid_ = -1;
  int fd_ = -1;
  EngineProgress* progress_ = nullptr;  ///< shared with the child (anonymous shared mapping)
};

/** Runs run_engine() in a forked child and returns its result. */
EngineRun run_isolated(const TimingInputs& in, const Schedule& schedule, std::uint64_t seed);

/** The collective model sim.collective_model asks for. */
CollectiveModel collective_model_of(const TimingInputs& in);

}  // namespace hpz::time
