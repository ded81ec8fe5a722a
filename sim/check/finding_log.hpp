// Collects findings while the checker runs and folds repetitions into groups: the same bug on
// 80 layers and 1,024 ranks is one group with a count, built from one worked example.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/check/allocator.hpp"
#include "sim/check/finding.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::check {

/** The checker's sink for findings; names ops and buffers from the schedule. */
class FindingLog {
 public:
  explicit FindingLog(const Schedule& schedule) : schedule_(schedule) {}

  /** Rank r's op `op` accesses [lo, hi) of buffer b, unordered with `prior`'s access. */
  void race(Rank r, std::uint32_t prior, AccessMode prior_mode, std::uint32_t op, AccessMode mode,
            BufferId b, std::uint64_t lo, std::uint64_t hi);
  /** Rank r's op `op` accesses buffer `reuser`, whose memory the caching allocator took from a
   *  freed buffer while `use` of it may still run, unordered with `op`. */
  void use_after_free(Rank r, const PendingUse& use, std::uint32_t op, AccessMode mode,
                      BufferId reuser);
  /** Rank r's op reads [lo, hi) of buffer b, unwritten since `alloc` (kNoOp: never allocated). */
  void uninitialized(Rank r, std::uint32_t alloc, std::uint32_t op, BufferId b, std::uint64_t lo,
                     std::uint64_t hi);
  /** Rank r's op reads secondary b, copied (by `copy`) before `primary_write` changed its unit. */
  void stale(Rank r, std::uint32_t primary_write, std::uint32_t copy, std::uint32_t op, BufferId b);
  /** Group g's collective at `position`: rank a issued op_a (what most issued, or what was
   *  waiting), rank b issued op_b (kNoOp: never issued it); `what` says how they differ. */
  void mismatch(GroupId g, std::uint32_t position, Rank a, std::uint32_t op_a, Rank b,
                std::uint32_t op_b, const std::string& what);

  /** The groups, worst kind first, then most frequent. */
  std::vector<FindingGroup> take();

  /** The labels of one op, as reports print them. */
  OpLabel label(Rank r, std::uint32_t op) const;

 private:
  FindingGroup* slot(std::uint64_t key, Rank r, std::uint32_t first, std::uint32_t op, bool pair);

  const Schedule& schedule_;
  std::unordered_map<std::uint64_t, std::size_t> index_;
  std::vector<FindingGroup> groups_;
};

/** "rank 3 S0 #1234 secondary-partition-copy (step 0, layers.12.attn, forward)", with
 *  ", at LABEL" after the phase when the op has a label. */
std::string describe(const OpLabel& op);
/** "the secondary-partition-copy of layers.12.attn (step 0, forward)". */
std::string describe_short(const OpLabel& op);
/** "bytes [0, 4096) of layers.12.attn.secondary (secondary)". */
std::string describe_bytes(const Finding& f);

}  // namespace hpz::check
