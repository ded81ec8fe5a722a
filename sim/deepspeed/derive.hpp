// Ranks the DeepSpeed builder reads alike, and how the schedule of such a rank follows from two
// built ones without running DeepSpeed's host logic again (issue 33: at 1,024 GPUs building
// every rank was 10 of the check's 14 seconds).
//
// RankBuilder reads its rank number in few places: its hpZ position (rank % hpZ: the secondary
// slice, the place in the hpZ gathers), whether it is rank 0 (load.cpp: the pretrained weights
// read in full) or [bugs] secondary_mismatch_rank (partition.cpp), its groups, and its primary
// slice [r*S, (r+1)*S) of each parameter, clamped to the parameter's elements (ShardLayout::
// valid; gather.cpp, partition.cpp, load.cpp, optimizer.cpp) and its slot r*S of a world
// gather's buffer (gather.cpp). Ranks equal in the first three, in their index within the node
// (read only through the qgZ groups, but kept alike where hpZ is smaller than a node, so that a
// kind's ranks do not alternate in it) and in how many real elements each parameter's primary
// slice holds (full, none, or the one partial slice) take every branch alike, issue the same ops on
// their own groups, and their accesses differ only in offsets that are affine in r (a slice's
// start, a clamped start minus the slice's start, a slot).
//
// So the first two ranks of such a kind are built; each later one is derived: the first's op
// list on its own groups (paired in the order the world index lists them), the same buffers, and
// each access that differs between the two moved along the line through them. Where the two do
// not fit this (other ops, other buffers, a change that is not a whole multiple of the ranks
// between them) the kind is built rank by rank. The last rank of each kind is built as well and
// compared with its derivation, and any difference rebuilds the whole world rank by rank
// (build_deepspeed_schedule); tests/test_build_schedule.cpp holds derived worlds equal to built
// ones, byte for byte in JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sim/deepspeed/rank_builder.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::deepspeed {

/** The ranks the builder reads alike (the file's comment), each kind's ascending. */
struct RankKinds {
  std::vector<std::int32_t> kind_of;       ///< per rank
  std::vector<std::int32_t> place;         ///< per rank: its index among its kind's ranks
  std::vector<std::vector<Rank>> members;  ///< per kind, ascending
};

/** The kinds of `s`'s ranks (its world, hpZ size and units) on nodes of `gpus_per_node`,
 *  `mismatch_rank` being [bugs] secondary_mismatch_rank (-1: none). */
RankKinds rank_kinds(const Schedule& s, int gpus_per_node, Rank mismatch_rank);

/** How the ranks of one kind follow from its first two, built. */
class Derivation {
 public:
  /** The derivation through ranks `first` < `second` of one kind, both built into s.ranks;
   *  nothing where the two do not fit it (the file's comment). */
  static std::optional<Derivation> make(const Schedule& s, const WorldIndex& index, Rank first,
                                        Rank second);
  /** Rank r's schedule, derived; nothing where its groups do not pair with the first's. */
  std::optional<RankSchedule> derive(const Schedule& s, const WorldIndex& index, Rank r) const;

 private:
  /** An op's block of accesses that differs from the shared base in either built rank. */
  struct Block {
    std::uint32_t begin = 0, count = 0;
    std::uint32_t at = 0;  ///< its first access in first_ (and slope_ where it moves)
    bool moves = false;    ///< differs between the two built ranks
  };
  /** Per rank, the change of each field of an access. */
  struct Slope {
    std::int64_t offset = 0, bytes = 0, stride = 0, count = 0;
  };
  /** The group rank r runs for each of the first rank's, or nothing. */
  std::optional<std::vector<GroupPair>> groups_for(const Schedule& s, const WorldIndex& index,
                                                   Rank r) const;

  Rank first_ = 0;
  std::vector<GroupId> copy_groups_;  ///< the groups the shared op copy names, each once
  std::vector<Block> blocks_;
  std::vector<Access> first_accesses_;  ///< the first rank's accesses of every block
  std::vector<Slope> slopes_;           ///< per access of first_accesses_ (zero where it stays)
};

/** True when the two read alike: the same streams, ops (groups included), accesses and
 *  buffers. */
bool same_rank_schedule(const RankSchedule& a, const RankSchedule& b);

}  // namespace hpz::deepspeed
