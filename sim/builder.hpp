// The schedule builder's entry: a Scenario's per-rank operation sequence as DeepSpeed's
// ZeRO-3 + ZeRO++ runtime issues it for run.steps optimizer steps, for the scenario's release
// (zero.deepspeed_version) and variant. The builder itself is sim/deepspeed/
// (deepspeed_builder.hpp; docs/deepspeed-builder.md says what it models).
#pragma once

#include <string>

#include "sim/deepspeed_builder.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/scenario.hpp"

namespace hpz {

/** What will read the schedule: engines that keep state for every rank and op (the default:
 *  the estimate before building leaves them room), or engines that work one rank per symmetry
 *  class (`check`, `sim`) and call guard_engine_memory before any walk of every rank. */
enum class Engines { kEveryRank, kByClass };

/** Builds the schedule of every rank (build_deepspeed_schedule), after refusing one this
 *  machine's memory cannot hold; throws InputError if the scenario cannot be built. */
Schedule build_schedule(const Scenario& scenario, Engines engines = Engines::kEveryRank);
/** The same with `memory` bytes for the schedule in place of half this machine's physical
 *  memory (0: no limit). The guard refuses a schedule whose floor (from the scenario's sizes)
 *  exceeds it before building, stops a build whose bytes projected from the ranks built so far
 *  exceed twice it, and one whose built ranks hold more than it (resident bytes estimated from
 *  schedule_bytes, deepspeed_builder.hpp): an InputError naming what it measured. */
Schedule build_schedule(const Scenario& scenario, double memory,
                        Engines engines = Engines::kEveryRank);

/** Half of this machine's physical memory: what a schedule, or an engine's walk of it, may
 *  take (the engines that read a schedule take more than the schedule itself, and the
 *  sanitizer build about 1.5 times a release build's); 0 where it cannot be read. */
double schedule_budget();

/** Refuses (InputError on `file`) an engine's walk that would take `bytes`, more than
 *  `memory` (0: no limit); `what` names the walk and why it is needed, `how` how the bytes were
 *  estimated. */
void guard_engine_memory(const std::string& file, double bytes, double memory,
                         const std::string& what, const std::string& how);

/** build_schedule's guard after each rank: throws the InputError that stops a build of
 *  `scenario` given `memory` bytes, or returns. */
void guard_build(const Scenario& scenario, double memory, const BuildProgress& progress);

}  // namespace hpz
