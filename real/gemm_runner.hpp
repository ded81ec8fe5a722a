// Runs the GEMMs of `--compute real` (real/gemm.hpp) with cuBLAS on the emulated ranks' streams.
//
// One cuBLAS handle per rank, each with its own workspace: every rank's host thread issues only
// its own rank's GEMMs, so no handle is used by two threads at once. A and B (filled once with
// small finite values) and C are scratch shared by every rank: what a GEMM computes is thrown
// away, so concurrent GEMMs of several ranks may write C at the same time.
//
// run() neither allocates nor synchronizes: it is called while the race is timed, and a
// cudaMalloc or a device sync would drain every stream and hide the race. Everything that could
// (scratch, handles, cuBLAS's lazily loaded kernels) happens in the constructor and warm_up().
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "real/gemm.hpp"

namespace hpz::real {

class GemmRunner {
 public:
  /** Handles for `ranks` ranks and scratch for every shape up to `max` (element-wise), of fp16
   *  (`element_bytes` 2) or fp32 (4) elements, on the current device; waits for the scratch's
   *  fill. Throws std::runtime_error when a CUDA or cuBLAS call fails. */
  GemmRunner(int ranks, GemmShape max, int element_bytes);
  /** Frees everything, best effort; never throws. */
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  /** Runs every shape once on every rank's handle and waits for them, so that no later run()
   *  loads a kernel or initializes cuBLAS state. Call it before timing; not concurrently with
   *  run(). */
  void warm_up(const std::vector<GemmShape>& shapes);

  /** Enqueues C = A B of shape `g` on `stream` with rank `rank`'s handle, inputs and output of
   *  the element type, accumulation in fp32. Call only from `rank`'s thread; one rank's GEMMs
   *  share its workspace, so they must not overlap (issue them on one stream, the IR's compute
   *  stream). Throws std::invalid_argument when `g` exceeds the constructor's `max`. */
  void run(int rank, cudaStream_t stream, const GemmShape& g);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace hpz::real
