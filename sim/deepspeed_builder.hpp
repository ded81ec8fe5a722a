// The DeepSpeed builder: the schedule DeepSpeed's ZeRO-3 runtime issues, derived by running its
// host logic (module hooks, the partitioned-parameter coordinator, partitioning, PyTorch's
// ProcessGroupNCCL streams) over the module tree that transformers builds. It is held equal to real
// DeepSpeed's recordings (traces/deepspeed/, made by `hpzlab record`) by
// tests/test_deepspeed_builder.cpp, through the projection of sim/projection.hpp.
// docs/deepspeed-builder.md says what is modelled, version by version, and where it still differs.
#pragma once

#include <cstddef>
#include <functional>
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

/** Told after each rank is built or derived: the ranks so far and the bytes the schedule holds
 *  so far (schedule_bytes), of which `lead_bytes` are the first hpZ group's. A rank follows the
 *  first of its kind (sim/deepspeed/derive.hpp), or else the rank one group before it (the
 *  first group's follow rank 0), sharing what it issues alike (its op list, access list and
 *  buffer table) and keeping the rest of its own. It may throw to stop the build
 *  (build_schedule's memory guard). */
struct BuildProgress {
  int ranks_built = 0;
  int lead_ranks = 0;          ///< the first hpZ group's ranks (all of them in a small world)
  std::size_t lead_bytes = 0;  ///< their bytes, as far as built
  std::size_t held = 0;        ///< every built rank's, the first group's included
  /** Of ranks_built, those derived from two built ones (sim/deepspeed/derive.hpp), not built. */
  int derived = 0;
};
using OnRankBuilt = std::function<void(const BuildProgress&)>;

/** The bytes `rank` holds of its own beside what it shares with `base` (share_alike): its op
 *  list, access list and buffer table where it does not share them, else the accesses it keeps
 *  of its own; with `base` null, all of them. The counts of the vectors' elements and of the
 *  buffers' names, not the allocator's overhead. */
std::size_t schedule_bytes(const RankSchedule& rank, const RankSchedule* base);

/** How the builder makes the ranks it reads alike (sim/deepspeed/derive.hpp). */
enum class RankBuild {
  kDeriveAlike,  ///< builds the first two and last of each kind, derives the others
  kEach,         ///< builds every rank (what the derivation is tested against)
};

/** Builds every rank's schedule as DeepSpeed release `version` issues it (its rules:
 *  sim/deepspeed_releases.hpp) for the scenario (Llama-shaped
 *  models with qwZ, qgZ, persistence and accumulation; variant stock, host-sync or event-wait on
 *  top of that version). Throws InputError for an unknown version or what it does not model
 *  (other model families, offload_param with qwZ) and where DeepSpeed itself
 *  would stop (qwZ on a shard that is not a multiple of 8 elements), and what `on_rank_built`
 *  throws. build_schedule (builder.hpp) is the entry the engines use. */
Schedule build_deepspeed_schedule(const Scenario& scenario, const std::string& version,
                                  const OnRankBuilt& on_rank_built = {},
                                  RankBuild how = RankBuild::kDeriveAlike);

}  // namespace hpz
