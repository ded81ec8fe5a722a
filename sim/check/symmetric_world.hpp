// Happens-before by symmetry (issue 33): a world whose ranks are alike walks one rank per class.
//
// A rank's number is read as digits of a chain of sizes 1 = l0 < l1 < ... < lK = N (each dividing
// the next): the world's groups are the world itself, blocks of l_i contiguous ranks (an hpZ
// group, a node) and columns of ranks l_j apart (the ranks of one local index on every node).
// When every rank issues one op list, each op on *its own* group of the same family (the block
// or column that holds it), renumbering the values of any digit, the same way on every rank,
// maps the schedule onto itself, and some such renumbering takes any rank to any other.
//
// Then an op of rank r happens before another op of r through other ranks only if it does
// within r. Such a chain leaves r at the start of a collective C of r's (on the stream s it
// reached), runs through a member m from an op of m's ordered after C, and comes back to r
// through the start of a collective E of m's that r takes part in (on r's stream t), before
// the later op. The renumbering that takes m to r takes m's part of the chain to a chain of r's
// from an op after C on s to E's start on t; C's start precedes the first on s and E's start
// the later op on t (each stream runs in issue order). The new chain leaves r fewer times; by
// induction, none. So in such a world a collective orders nothing but its own stream, and each
// class's representative walks alone, its collectives completing at once: the ticks its byte
// checks compare are those of the check rank by rank (tests/test_check_by_class.cpp holds the
// two equal on 300 random op lists and on DeepSpeed's schedules).
// Ranks may differ in ops that move no clock: a kernel, copy or (de)quantization on a device
// stream (Checker::run_work) ticks nothing and is ordered by the clock its stream has, which the
// stream's next op that orders anything would have had without it. Leaving such ops out of
// every rank changes no rank's happens-before among the ops left, and gives every one of them
// the clock it had; so the argument above needs only the ops left to be one list. That is
// DeepSpeed's schedule where ranks copy more or fewer slices (a parameter's secondary slice at
// some hpZ position, or a rank's primary slice, lying in the padding: llama2-70b.toml at 16,384
// GPUs, tiny.toml at 128 ranks or more).
// So may a host stream sync that orders nothing the list's own edges do not order
// (redundant_syncs in symmetric_world.cpp): rank 0's sync of S0 per parameter of a checkpoint
// load (run.load = "pretrained"), after which every stream that issues anything first waits for
// the event S0 records for the broadcast. Until the host learns S0's state anyway, each stream
// takes in the host's clock only when it already holds S0's state up to the sync, so every
// stream's clock, on every rank, is what it would be without the sync.
// Computed, never assumed: symmetric_world() says why a schedule is not such a world (a group of
// another shape, a rank issuing other ops or an op on another family's group), and the check
// then walks every rank as before (checker.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/check/class_findings.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::check {

/** A world whose ranks are alike up to a renumbering of each digit's values. */
struct SymmetricWorld {
  int digits = 0;               ///< K: digit positions, each of radix >= 2
  std::uint64_t instances = 0;  ///< collective instances of the whole world (CheckStats)
};

/** The symmetric world `schedule` is, or nothing with the reason in `why` ("group hpz3 is
 *  neither the world, a block of contiguous ranks nor a column"). */
std::optional<SymmetricWorld> symmetric_world(const Schedule& schedule, std::string* why);

/** Which runs to keep: (rank, first op, one past the last op). */
using RunFilter = std::function<bool(Rank, std::uint32_t, std::uint32_t)>;

/** The runs the check rank by rank (Checker::run: every rank from the start in rank order,
 *  each until an op waits for a collective its peers have not all reached, the members pushed
 *  back in the order they arrived once the last one does) walks in a world symmetric_world()
 *  accepts, in that order, those `keep` accepts: where each rank blocks is computed from the
 *  shared op list, with no clocks. Nothing when some collective would never complete (no
 *  world symmetric_world() accepts has one: the caller then checks rank by rank). */
std::optional<std::vector<RankRun>> walk_runs(const Schedule& schedule, const RunFilter& keep);

}  // namespace hpz::check
