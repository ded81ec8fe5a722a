// `hpzlab real` as a library: a serialized reference run, then --runs timed runs of the same
// plan on the chosen backend, each compared with the reference bit for bit, and the measured
// timelines turned into the same step metrics and race timing as `hpzlab sim`.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "real/executor.hpp"
#include "real/launch.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/scenario.hpp"
#include "sim/time/simulate.hpp"

namespace hpz::real {

/** How to run. */
struct RealOptions {
  int runs = 1;
  double timeout_s = 60.0;       ///< per host wait; a longer wait is reported as a hang
  std::string backend = "cuda";  ///< cuda | host | host-lazy (backend.hpp)
  /** spin: kernels hold their stream for the cost model's time; real: the model's real
   *  math (transformers' Llama) where the numeric replay holds the model and buffers are fp32
   * (plan.hpp, ModelOp; any backend), layer kernels as cuBLAS GEMMs of the layer's shapes otherwise
   * (gemm.hpp; cuda only). */
  std::string compute = "spin";
  /** Set: one process per rank, this process is `launch->rank` (cuda: NCCL on GPU
   *  `local_rank`; host: collectives through the store). Unset: every rank in this process. */
  std::optional<Launch> launch;
  /** Called after the reference and after each run with (done, all). */
  std::function<void(int, int)> progress;
};

/** One timed run and how it differed from the reference. */
struct RealRun {
  Corruption corruption;
  bool hung = false;
  std::string hang;
  std::vector<double> loss;  ///< model math: the loss per training step
};

/** Everything `hpzlab real` reports. */
struct RealResult {
  std::string backend;  ///< "cuda" | "host" | "host-lazy"
  std::string mode;     ///< e.g. "emulated: 16 ranks on one GPU"
  std::string device;   ///< GPU name, or "cpu"
  int ranks = 0;
  int processes = 1;         ///< processes that ran the ranks (one per rank, or this one)
  bool reports = true;       ///< this process writes the report (rank 0 of several)
  std::uint64_t probes = 0;  ///< gathered parameters checked per run
  bool reference_hung = false;
  std::string reference_hang;
  /** A hash of the reference run's final weights, every rank's in rank order: the same for
   *  the same scenario on the same backend kind, whatever the number of processes. */
  std::uint64_t reference_weights_hash = 0;
  std::vector<RealRun> runs;
  int corrupted_runs = 0;
  /** Kernels ran the model's real math (--compute real on a model the numeric replay
   *  holds): the loss per training step (mean over ranks and micro-steps) of the reference,
   *  and of the numeric replay on the CPU in a race-free order (replay::serialized_timeline). */
  bool model = false;
  std::vector<double> reference_loss, replay_loss;
  /** The measured runs in the shape of `hpzlab sim`'s result: step metrics per run, race
   *  timing, the first run's timeline (for --json and --trace). */
  time::SimResult timing;
};

/** Runs `schedule` (built from `scenario`). Throws InputError when the scenario cannot run on
 *  the device (not enough memory), std::runtime_error on CUDA failures. */
RealResult run_real(const Scenario& scenario, const Schedule& schedule, const RealOptions& options);

}  // namespace hpz::real
