// What the executor asks of a device: streams, markers (events), buffers, data actions, spin
// kernels, syncs. Two implementations: the CUDA backend (emulated ranks on one GPU, each with its
// own streams and buffers) and the host backends on the CPU, which run anywhere: eager (every
// call at once: a serialized reference) and lazy (stream work deferred, compute stream last: an
// adversarial but clock-free order).
//
// Every call for rank r comes from rank r's host thread, in that rank's issue order, except
// `mark`'s result, which other ranks' threads pass to `wait_mark` after a host-side rendezvous.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "real/plan.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"
#include "sim/scenario.hpp"

namespace hpz::real {

/** A marker recorded on a stream: an index into the backend's per-rank marker pool. */
struct Mark {
  Rank rank = 0;
  std::uint32_t index = 0;
};

/** What a gather probe saw: a position-weighted checksum of the bits and the NaN count. */
struct ProbeValue {
  std::uint64_t hash = 0;
  std::uint64_t nans = 0;
  bool operator==(const ProbeValue&) const = default;
};

/** Thrown when a host wait passes its deadline: the schedule would hang. */
struct HangError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Backend {
 public:
  virtual ~Backend() = default;
  /** "cuda" or "host", for reports. */
  virtual std::string name() const = 0;
  /** Device streams the backend creates for itself, besides one per IR stream of every rank
   *  (the CUDA backend's shared fill stream); they take hardware queues too. */
  virtual int own_streams() const { return 0; }

  /** True when the backend carries out collectives itself, as one process per rank does (NCCL,
   *  or the host backend over the store): the executor then calls `collective` instead of
   *  meeting the other members in its own rendezvous. */
  virtual bool native_collectives() const { return false; }
  /** Carries out rank r's part of collective `op` (over IR group `group`) on stream s, as
   *  `op.native` and `op.actions` describe it (native_collectives() backends only). */
  virtual void collective(Rank r, StreamId s, GroupId group, const PlanOp& op) {
    (void)r, (void)s, (void)group, (void)op;
  }

  /** Called first on each rank's host thread (the CUDA backend makes its GPU current there). */
  virtual void bind_thread(Rank r) { (void)r; }

  /** Prepares one run of `plan`: streams, marker and timing pools, probe slots. Buffers of an
   *  earlier run may be kept (a caching allocator's blocks), but no run sees another's data
   *  except through `Fill::kStale`. */
  virtual void begin_run(const Schedule& schedule, const Plan& plan) = 0;

  virtual void alloc(Rank r, StreamId s, SlotId slot, Fill fill) = 0;
  virtual void free(Rank r, StreamId s, SlotId slot) = 0;
  virtual void spin(Rank r, StreamId s, double seconds) = 0;
  /** Runs a GEMM of shape `g` on stream s (--compute real; the CUDA backend only). */
  virtual void gemm(Rank r, StreamId s, const GemmShape& g) {
    (void)r, (void)s, (void)g;
    throw std::runtime_error("only the cuda backend runs GEMMs (--compute real)");
  }
  virtual void run_actions(Rank r, StreamId s, const std::vector<Action>& actions) = 0;
  /** Runs a kernel of the model's real math on stream s (Plan::model). */
  virtual void model(Rank r, StreamId s, const ModelOp& m) = 0;
  /** Records IR event `e` of rank r on stream s; `wait_event` makes stream s wait for it. */
  virtual void record_event(Rank r, StreamId s, EventId e) = 0;
  virtual void wait_event(Rank r, StreamId s, EventId e) = 0;
  /** Records a marker on stream s and returns it; another rank's stream can wait for it. */
  virtual Mark mark(Rank r, StreamId s) = 0;
  virtual void wait_mark(Rank r, StreamId s, Mark m) = 0;
  /** Blocks rank r's host until stream s (kHostStream: every stream of r) has drained; throws
   *  HangError after `timeout_s`. */
  virtual void host_sync(Rank r, StreamId s, double timeout_s) = 0;
  /** Blocks rank r's host until what the latest record of IR event `e` captured has run (an
   *  event never recorded: at once); throws HangError after `timeout_s`. */
  virtual void host_event_sync(Rank r, EventId e, double timeout_s) = 0;
  /** Timing markers around op `op` of rank r on stream s. */
  virtual void op_begin(Rank r, StreamId s, std::uint32_t op) = 0;
  virtual void op_end(Rank r, StreamId s, std::uint32_t op) = 0;
  /** Stores what the `index`-th probe of the run sees at `at` (n elements), in stream order. */
  virtual void probe(Rank r, StreamId s, std::uint64_t index, Loc at, std::uint64_t n) = 0;

  /** After every rank's thread is done: waits for the device (HangError after `timeout_s`) and
   *  fills the start/end times of `timeline` (issue times come from the executor, in seconds
   *  since the same origin as `origin_s`), the probes and the raw bytes of the weights. */
  virtual void end_run(double timeout_s, double origin_s, Timeline& timeline,
                       std::vector<ProbeValue>& probes,
                       std::vector<std::vector<std::vector<std::uint8_t>>>& weights) = 0;
  /** After end_run: rank r's loss values under the model math (RankPlan::losses, as many as
   *  RankPlan::loss_steps); empty for a rank another process runs. */
  virtual std::vector<float> losses(Rank r) = 0;
};

/** The CPU backends (host_backend.cpp). Eager: every call takes effect at once, in host order,
 *  the race-free reference. Lazy: stream work runs only when the host waits for it, S0 last, so
 *  every ordering the schedule leaves open is taken the bad way. */
std::unique_ptr<Backend> make_host_backend(bool lazy = false);

class Store;

/** The eager host backend for one rank of a run with one process per rank: collectives go
 *  through `store` (each member publishes its send span; every member then runs the plan's
 *  actions on its copies), so the result is the single-process reference's, bit for bit. */
std::unique_ptr<Backend> make_host_rank_backend(Rank rank, Store& store);

/** The CUDA backend on device 0 (emulated ranks). Throws std::runtime_error when CUDA fails and
 *  when hpzlab was built without CUDA. */
std::unique_ptr<Backend> make_cuda_backend(bool real_compute = false);

/** The CUDA backend for one rank of a run with one process per rank: GPU `device`, collectives
 *  as NCCL calls on one communicator per IR group, set up through `store` (rank 0's unique id,
 *  then ncclCommSplit of the world). Throws std::runtime_error when CUDA or NCCL fails and when
 *  hpzlab was built without CUDA. */
std::unique_ptr<Backend> make_nccl_backend(const Schedule& schedule, Rank rank, int device,
                                           Store& store, bool real_compute = false);

}  // namespace hpz::real
