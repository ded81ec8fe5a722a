// The schedule builder: turns a Scenario into the per-rank operation sequence that DeepSpeed's
// ZeRO-3 + ZeRO++ runtime issues for run.steps optimizer steps, for the scenario's variant.
//
// What it models (docs/the README's "Schedule model" section has the full story):
//  - Init: every rank writes its primary shard and, with hpZ, creates its secondary shard
//    (DeepSpeed partitions secondaries at construction time).
//  - Forward, per parameter unit in module order: the fetch (alloc + AllGather over the world on
//    S_ag through S_nccl, with qwZ quantize/dequantize), prefetch of the next units in the
//    recorded order within stage3_prefetch_bucket_size and stage3_max_live_parameters (from the
//    second step on: the first step records the trace), the forward kernel on S0 after S0 waits
//    for the gather, then the post-forward release: when no secondary exists, empty() +
//    SecondaryPartitionCopy on S0 (plus fix A's host sync or fix B's event record), and the full
//    parameter is freed. Units reused within stage3_max_reuse_distance stay gathered.
//  - Backward in reverse order: the fetch gathers over the hpZ group from the secondary (fix B
//    makes S_ag wait for the copy's event first), recompute (gradient checkpointing) and backward
//    kernels on S0, release, and gradient reduction on S_rs (ReduceScatter over the world, or qgZ:
//    quantize, intra-node all-to-all, dequantize-reduce-quantize, inter-node all-to-all,
//    dequantize-reduce).
//  - Optimizer: S0 waits for S_rs, a gradient-norm AllReduce, one optimizer kernel per unit
//    writing the primary shard, secondaries invalidated (freed), loss.item() host sync.
//  - overlap_comm = false puts gathers and reductions on S0; offload_param keeps primary and
//    secondary shards in host memory and every copy to or from them blocks the host.
#pragma once

#include "sim/scenario.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz {

/** Builds the schedule of every rank; throws InputError if the scenario cannot be built. */
Schedule build_schedule(const Scenario& scenario);

}  // namespace hpz
