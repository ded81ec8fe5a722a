// A stand-in timeline for when the timing engine (sim/time/) is not available: NOT a timing
// model, only host issue order made concrete so that the replay has something to follow.
//  - The host pays kLaunchS per stream op; host syncs block it until the stream(s) drain.
//  - Streams run FIFO; an op starts when issued, its stream is free and, for waits, the event
//    has been recorded; a collective starts when every member's stream reached it.
//  - The compute stream S0 is backlogged: each of its ops starts no earlier than kBacklogS
//    after the host issued it (a busy GPU, as a real reproduction forces with a spin kernel).
//  - Durations: kernels and copies from the timing engine's CostModel (sim/time/cost_model.hpp),
//    collectives bytes x (n - 1) over NVLink (inside a node) or the node's NICs, at least
//    kMinOpS each, times a seeded factor in [0.8, 1.2].
// docs/repro.md says when `hpzlab repro` falls back to it.
#pragma once

#include <cstdint>

#include "sim/scenario.hpp"
#include "sim/schedule.hpp"
#include "sim/timeline.hpp"

namespace hpz::replay {

inline constexpr double kLaunchS = 5e-6;   ///< host cost of issuing one stream op
inline constexpr double kBacklogS = 2e-3;  ///< how far the compute stream lags its issue
inline constexpr double kMinOpS = 2e-6;    ///< shortest kernel, copy or collective

/** Times `schedule` per the model above; ops that never run (a hang) get infinite times. */
Timeline standin_timeline(const Scenario& scenario, const Schedule& schedule, std::uint64_t seed);

}  // namespace hpz::replay
