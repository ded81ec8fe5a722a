// The race checker: proves or refutes, independent of timing, that a schedule is free of
// ordering bugs. `hpzlab check` runs it; CI runs it on every scheduling order.
//
// Happens-before (HB) is the smallest order that contains:
//  - FIFO: an op on stream s happens after every op issued earlier on s.
//  - Host issue order: a stream op happens after everything its host did before issuing it
//    (host ops, and whatever the host learned from syncs). The host never waits for a stream op
//    it merely issued.
//  - Events: kEventRecord on s captures everything issued on s so far; kStreamWaitEvent on t makes
//    every later op on t happen after that capture.
//  - Host syncs: kHostStreamSync(s) orders everything issued on s before everything the host
//    issues afterwards; kHostDeviceSync does the same for every stream of the rank;
//    kHostEventSync(e) does it for what the record of e captured.
//  - Collectives as a rendezvous: the k-th collective a rank issues on a group is matched with
//    the k-th of every other member; every member's collective completes after every member's
//    started. Its accesses (own send bytes read, own receive bytes written) happen between its
//    start and its completion, so they are checked against the *start*: an op known to precede
//    only the completion (through another rank) still races with them.
// HB is transitive across ranks: rank r's stream A may be ordered before its stream B only
// through a chain of collectives with other ranks; the checker follows such chains exactly.
//
// It is computed with vector clocks (see clock.hpp): one component per thread (the host and each
// stream) of every rank. Ranks are advanced together in host order; a rank stops when its next op
// needs the completion of a collective whose peers have not arrived. If no rank can advance while
// collectives are incomplete, the job would hang: a collective-mismatch finding, after which the
// incomplete collectives are completed with the ranks that arrived and the check goes on.
//
// Rules (all per rank: each rank's ops only list that rank's bytes):
//  - race: two accesses of overlapping bytes of one buffer lifetime, at least one a write, not
//    ordered by HB. Ranges are byte-exact: disjoint slices never conflict, an overlapping view
//    always does.
//  - use-after-free (Schedule::allocator only): the caching allocator (allocator.hpp) gives a
//    freed buffer's block to a later allocation on the block's stream; an access to that memory
//    not ordered by HB after a use of the freed buffer that was still pending at the free (not
//    on a stream named by kRecordStream, not known complete by the host, not a collective's own,
//    which ProcessGroupNCCL protects), one of the two a write.
//  - uninitialized-read: a read of bytes that no op issued since the buffer's kAlloc wrote
//    (whatever the allocator's fill). A buffer accessed without a kAlloc is taken as allocated
//    and unwritten at the start. kAlloc and kFree delimit lifetimes; they are not accesses.
//  - stale-read: every write to a kPrimary buffer of unit u bumps u's version on that rank
//    (init, optimizer step, checkpoint load), as does a kCheckpointLoad op writing the unit's
//    kFull from nothing of the unit (a pretrained model's weights). Any other write of a unit's
//    kFull, kSecondary or kQuantized buffer takes the oldest version among the unit's buffers the
//    op read (the current version when it read none). A read of a kSecondary buffer whose version
//    is older than its unit's current version is stale (DeepSpeed issues 4851 and 7606). Versions
//    follow host order; ordering problems are the race rule's business.
//  - collective-mismatch: the members of a group disagree on the (kind, comm_bytes) of their
//    k-th collective, or some never issue it (DeepSpeed issue 5030). Reported once per group, at
//    the first differing position.
//
// By class (check_schedule_by_class): the ranks of a symmetry class (sim/ir/symmetry.hpp) issue
// the same ops on the same buffers, their accesses in the same order of offsets. Only the
// class's representative keeps byte histories, versions and the allocator. Where every rank
// issues one op list, each op on its own group of one family (symmetric_world.hpp), only the
// representatives walk happens-before, their clocks kept per relation between ranks instead of
// per rank, and the order in which the check rank by rank would meet each rank's findings is
// computed from where the ranks block (walk_runs). Elsewhere every rank walks happens-before and
// each other rank hashes the clocks it would have checked its accesses with. Where every rank's
// hash equals its representative's, the representative's findings are the rank's own (at its
// own offsets), and they are logged in the order the ranks walked their ops: the report is the
// check rank by rank's, byte for byte. Otherwise that check runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sim/check/finding.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::check {

/** Sizes of the work done, for benchmarks and the report's footer. */
struct CheckStats {
  std::uint64_t ops = 0;          ///< ops visited, all ranks
  std::uint64_t accesses = 0;     ///< byte-range accesses checked
  std::uint64_t collectives = 0;  ///< collective instances (one per group and position)
  std::uint64_t clock_bases = 0;  ///< dense clock bases built
  /** Unordered pairs left out because every write in them rewrote a secondary with the data
   *  it already held (checker.cpp, rewrites_same_data). */
  std::uint64_t same_data_rewrites = 0;
};

/** The verdict on one schedule. */
struct CheckResult {
  std::string scenario;                       ///< Schedule::scenario
  std::string variant;                        ///< Schedule::variant
  std::map<std::string, std::string> source;  ///< Schedule::source: a recorded schedule's origin
  int world_size = 0;
  bool allocator = false;  ///< Schedule::allocator: the caching allocator's reuse was checked
  std::vector<FindingGroup> groups;  ///< worst kind first, then most frequent
  CheckStats stats;

  /** Findings of one kind (every repetition counted). */
  std::uint64_t count(FindingKind kind) const;
  /** Groups of one kind. */
  std::size_t group_count(FindingKind kind) const;
  /** True when nothing was found. */
  bool clean() const { return groups.empty(); }
};

/** Ops the checker takes as never issued: how `check --explain` finds what orders a clean
 *  schedule (explain.hpp). Only ordering ops can be left out (kHostStreamSync, kHostDeviceSync,
 *  kHostEventSync, kStreamWaitEvent): they access no bytes, so leaving one out removes edges
 *  and nothing else. */
struct Ablation {
  /** True for an ordering op (rank's op #index) to leave out; empty: leave out nothing. */
  std::function<bool(Rank rank, std::uint32_t index, const Op& op)> leave_out;
};

/** True for the op kinds an Ablation can leave out. */
bool is_ordering(OpKind kind);

/** Checks every rule on a schedule, rank by rank. Throws std::invalid_argument on a malformed
 *  schedule (an op naming a stream, buffer, group or event that does not exist, an access past
 *  its buffer). */
CheckResult check_schedule(const Schedule& schedule, const Ablation& ablation = {});

/** How check_schedule_by_class went. */
struct ClassCheck {
  std::size_t classes = 0;       ///< symmetry classes of the schedule's ranks
  std::string summary;           ///< "16 ranks in 8 symmetry classes" (sim/ir/symmetry.hpp)
  std::string per_rank_because;  ///< why it checked rank by rank instead; "" when by class
  /** Happens-before walked by the representatives alone: the ranks are alike up to a
   *  permutation of their groups (symmetric_world.hpp). */
  bool walked_by_class = false;
  std::string walked_every_rank_because;  ///< why not, when checked by class
  /** Set by the caller: called before any walk of every rank, with true where every rank also
   *  checks its bytes (rank by rank), false where it walks happens-before only; it may throw
   *  to refuse the walk (a world too large for this machine's memory). */
  std::function<void(bool bytes_too)> before_every_rank;
};

/** check_schedule's result (the same, byte for byte in every report), computed on one rank
 *  per symmetry class where the schedule's ranks fall into fewer classes than ranks; rank by
 *  rank otherwise, saying why in `how`. */
CheckResult check_schedule_by_class(const Schedule& schedule, ClassCheck* how = nullptr);

}  // namespace hpz::check
