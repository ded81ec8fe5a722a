// Data replay (issue 5): play a schedule's data movement and arithmetic in the order a Timeline
// gives, so that a race the checker proves possible shows what it does to training.
//
// Two levels, one engine (data_engine.hpp) over two value domains:
//  - numeric: real fp32 math on the CPU for a small model (numeric_domain.hpp): every rank's
//    shards, secondaries, gathers, backward, reductions and an Adam step, buffers freshly
//    allocated per run.fill. Gives a loss per step.
//  - taint: for any model size, what every buffer range holds (weights of some version, NaN,
//    uninitialized garbage, a stale version) as run-length tags (taint_domain.hpp).
//
// Replay semantics (docs/repro.md): an op reads its inputs when it starts and its writes land
// when it ends. A read that overlaps a write still in flight (writer start <= reader start <
// writer end) sees the first fraction f = (reader start - writer start) / (writer duration) of
// the writer's elements new and the rest old: a deterministic linear sweep.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/ir/schedule.hpp"
#include "sim/ir/timeline.hpp"
#include "sim/platform.hpp"

namespace hpz::replay {

/** Which value domain a replay runs in. */
enum class Mode { kNumeric, kTaint };

/** What a value (or a run of values) is, for the taint replay and for summaries. */
enum class Health : std::uint8_t {
  kGood,   ///< what a correct run would hold
  kWrong,  ///< finite but wrong: uninitialized garbage, zeros or a stale version
  kNan,    ///< NaN (or derived from one)
};

/** What one optimizer step looked like. */
struct StepRecord {
  double loss = 0;                     ///< numeric: mean over ranks; taint: 0
  Health loss_health = Health::kGood;  ///< taint: the loss's tag; numeric: kNan when not finite
  std::uint64_t weights_hash = 0;      ///< numeric: hash of every rank's primary shards after it
  std::uint64_t bad_elements = 0;      ///< taint: primary elements (all ranks) not good after it
  std::vector<Rank> bad_ranks;         ///< taint: ranks holding bad primary elements after it
  std::vector<std::string> bad_units;  ///< taint: units with bad primary elements after it
};

/** One replay of one schedule under one timeline. */
struct ReplayResult {
  Mode mode = Mode::kNumeric;
  std::vector<StepRecord> steps;
  std::uint64_t mixed_reads = 0;  ///< reads that overlapped a write in flight
  /** Not empty when the job hangs on this timeline (some ops never ran: a collective not every
   *  member of its group issues): what hangs. Such a run is not replayed (steps is empty). */
  std::string hang;
};

/** What hangs on `timeline` ("" when every op of `schedule` ran; an op that never ran has a
 *  NaN or negative end): the ops that never ran and
 *  the first of them, e.g. "HANG: 12 ops never ran (...); the first: rank 3 op 40 ...". */
std::string hang_of(const Schedule& schedule, const Timeline& timeline);

/** One step in words, as explore and repro --order print it: the loss and a hash of the
 *  weights after it (numeric), or how many weight elements are bad after it (taint). */
std::string describe_step(const StepRecord& step, Mode mode);

/** True when the numeric replay can hold every rank's buffers of this scenario in memory. */
bool numeric_fits(const ReplayInputs& in);

/** A race-free order of `schedule`, as a timeline in logical time units: each rank's ops one
 *  after another in issue order, every op ending before the next starts, and each collective
 *  starting on all its members together once every member has reached it (the k-th collective
 *  of a group on each member, NCCL's rule). What a fully serialized run does, with no clock in
 *  it: the replay along it gives the training a correct run computes. Ops after a collective
 *  some member never reaches keep NaN times (they never run). */
Timeline serialized_timeline(const Schedule& schedule);

/** Why the replay cannot follow `schedule` ("" when it can): an op that needs its parameter
 *  unit (a checkpoint load, or an optimizer step that writes) names no unit, or a reduction or
 *  all-to-all receives but sends nothing. The builder's schedules always pass; a schedule read
 *  from a file may not. */
std::string replay_unsupported(const Schedule& schedule);

/** Replays `schedule` (built from `scenario`) in the order `timeline` gives. A schedule with
 *  strided accesses is unfolded first (unfold_strided, a copy): callers that replay one schedule
 *  many times unfold it once themselves. */
ReplayResult replay(const ReplayInputs& in, const Schedule& schedule, const Timeline& timeline,
                    Mode mode);

}  // namespace hpz::replay
