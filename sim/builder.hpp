// The schedule builder's entry: a Scenario's per-rank operation sequence as DeepSpeed's
// ZeRO-3 + ZeRO++ runtime issues it for run.steps optimizer steps, for the scenario's release
// (zero.deepspeed_version) and variant. The builder itself is sim/deepspeed/
// (deepspeed_builder.hpp; docs/deepspeed-builder.md says what it models).
#pragma once

#include "sim/ir/schedule.hpp"
#include "sim/scenario.hpp"

namespace hpz {

/** Builds the schedule of every rank (build_deepspeed_schedule), after refusing one this
 *  machine's memory cannot hold; throws InputError if the scenario cannot be built. */
Schedule build_schedule(const Scenario& scenario);

}  // namespace hpz
