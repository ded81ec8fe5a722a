// The executor: one host thread per rank issues that rank's ops to a Backend in IR order, host
// syncs block only that thread, and collectives meet in a host-side rendezvous whose markers
// the members' streams wait for (NCCL's rule that no member's collective completes before every
// member's has started). A serialized run (every op waited for before the next is issued) is the
// race-free reference each timed run is compared with, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "real/backend.hpp"
#include "real/plan.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"

namespace hpz::real {

/** Seconds on the executor's clock (steady, arbitrary origin). */
double now_s();

/** How to execute. */
struct ExecOptions {
  bool serialize = false;   ///< wait for every op before issuing the next (the reference)
  double timeout_s = 60.0;  ///< longest host wait before the run is declared hung
  /** Runs only this rank's ops (one process per rank); -1: every rank, one thread each. */
  int only_rank = -1;
  /** Layer kernels run as cuBLAS GEMMs of their shape (PlanOp::gemm) instead of spinning. */
  bool real_compute = false;
  /** Called after the backend is ready and before the clock starts (a barrier across the
   *  processes, so that every rank's times share an origin). */
  std::function<void()> before_start;
};

/** What one run produced. */
struct RunOutput {
  Timeline timeline;               ///< issue/start/end per op, seconds since the run began
  std::vector<ProbeValue> probes;  ///< per gather probe, in plan order
  std::vector<std::vector<std::vector<std::uint8_t>>> weights;  ///< [rank][unit] raw bytes
  std::vector<std::vector<float>> losses;  ///< model math: [rank][k], RankPlan::loss_steps order
  bool hung = false;
  std::string hang;  ///< what timed out
};

/** Runs the schedule once. Never throws HangError: a hang is reported in the output. */
RunOutput execute(const Schedule& schedule, const Plan& plan, Backend& backend,
                  const ExecOptions& options);

/** How a run differs from the reference. */
struct Corruption {
  std::uint64_t corrupted_elements = 0;  ///< weight elements whose bits differ
  std::uint64_t nan_elements = 0;        ///< weight elements that are NaN
  std::uint64_t bad_probes = 0;          ///< gathered parameters that differ
  std::uint64_t probe_nans = 0;          ///< NaN elements over all gathered parameters
  bool has_first = false;                ///< the earliest gather (by start time) that differed
  Rank first_rank = 0;
  std::uint32_t first_op = 0;
  double first_start_s = 0;
  bool corrupted() const { return corrupted_elements > 0 || bad_probes > 0; }
};

/** Compares `run` with `reference` (both of `plan`). */
Corruption compare_runs(const Plan& plan, const RunOutput& reference, const RunOutput& run);

}  // namespace hpz::real
