// The DeepSpeed builder: the schedule DeepSpeed's ZeRO-3 runtime issues, derived by running its
// host logic (module hooks, the partitioned-parameter coordinator, partitioning, PyTorch's
// ProcessGroupNCCL streams) over the module tree that transformers builds. It is held equal to real
// DeepSpeed's recordings (traces/deepspeed/, made by `hpzlab record`) by
// tests/test_deepspeed_builder.cpp, through the projection of sim/projection.hpp.
// docs/deepspeed-builder.md says what is modelled, version by version, and where it still differs.
#pragma once

#include <string>
#include <vector>

#include "sim/deepspeed_releases.hpp"
#include "sim/ir/schedule.hpp"
#include "sim/scenario.hpp"

namespace hpz {

/** What of the scenario decides whether a conditional release rule applies to it
 *  (sim/deepspeed_releases.hpp). */
RunTraits run_traits(const Scenario& scenario);

/** The known DeepSpeed defects (known_defects) of the scenario's release on its run; none for a
 *  version that is no release. */
std::vector<const ReleaseRule*> scenario_defects(const Scenario& scenario);

/** Builds every rank's schedule as DeepSpeed release `version` issues it (its rules:
 *  sim/deepspeed_releases.hpp) for the scenario (Llama-shaped
 *  models with qwZ, qgZ, persistence and accumulation; variant stock, host-sync or event-wait on
 *  top of that version). Throws InputError for an unknown version or what it does not model
 *  (other model families, offload_param with qwZ) and where DeepSpeed itself
 *  would stop (qwZ on a shard that is not a multiple of 8 elements). build_schedule (builder.hpp)
 *  is the entry the engines use. */
Schedule build_deepspeed_schedule(const Scenario& scenario, const std::string& version);

}  // namespace hpz
