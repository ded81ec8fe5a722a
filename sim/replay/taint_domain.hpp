// The taint value domain, for any model size: every buffer as runs of tags. A tag is a Health
// and, for good weights, the version of the unit's weights they are (bumped by each optimizer
// step and by a checkpoint load). A kernel's output is as bad as its worst input; weights of
// an older version than the rank's primary shard count as wrong (stale). The gradient norm
// spreads NaN to every update; a finite wrong norm is not followed (docs/repro.md).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "sim/replay/data_engine.hpp"
#include "sim/replay/module_roles.hpp"
#include "sim/replay/replay.hpp"

namespace hpz::replay {

/** Health in the top two bits, version below. */
using Tag = std::uint32_t;

/** A run of equal tags. */
struct TagRun {
  std::uint64_t len = 0;
  Tag tag = 0;
  bool operator==(const TagRun&) const = default;
};

class TaintDomain {
 public:
  using Chunk = std::vector<TagRun>;

  TaintDomain(const ReplayInputs& in, const Schedule& s);

  static std::uint64_t size(const Chunk& c);
  static Chunk slice(const Chunk& c, std::uint64_t off, std::uint64_t n);
  static void splice(Chunk& dst, std::uint64_t off, const Chunk& src);
  static void accumulate(Chunk& acc, const Chunk& x);
  /** Each element k times (a widening dtype cast's bytes: data_engine.hpp gather_into). */
  static Chunk widen(const Chunk& c, std::uint64_t k);
  /** qwZ's int8 round trip on tags: in each of `groups` equal groups that holds something other
   *  than NaN, NaN elements become wrong (the quantizer turns them into 0); a group of NaNs
   *  stays NaN (fp32::int8_symmetric_round_trip). Good values stay good: the rounding is the
   *  same in every order. */
  static void quantize_int8(Chunk& c, std::uint64_t groups);

  Chunk read(Rank r, BufferId b, std::uint64_t begin, std::uint64_t n) const;
  void write(Rank r, BufferId b, std::uint64_t begin, const Chunk& c);
  void alloc(Rank r, BufferId b, BufferId previous, Fill fill, std::uint64_t elements);
  Chunk checkpoint(Rank r, UnitId u, std::uint64_t first, std::uint64_t n);
  std::vector<Write<Chunk>> kernel(Rank r, const Op& op, const ReadFn<Chunk>& read);
  /** A recording's optimizer step as it lands in unit op.unit's primary shard (data_engine.hpp):
   *  each element as bad as its old value and the unit's reduced gradient. The gradient norm
   *  is not followed there: the recorded norm is kernels on scratch tensors. */
  std::vector<Write<Chunk>> update_primary(Rank r, const Op& op, const Access& primary,
                                           const ReadFn<Chunk>& read);

  /** Per step: the loss's tag and how far bad weights have spread after the step. */
  std::vector<StepRecord> steps() const;

 private:
  Health worst_input(Rank r, const Op& op, const ReadFn<Chunk>& read) const;
  std::vector<Write<Chunk>> optimizer(Rank r, const Op& op, const ReadFn<Chunk>& read);

  /** The storage of slot b of rank r, created on first use. */
  Chunk& slot(Rank r, BufferId b);

  /** The DeepSpeed builder's kernels read their module's parameter and write its gradient,
   *  and touch no activations: every forward
   *  kernel of a micro-step also reads what the kernels before it in that micro-step computed,
   *  the loss reads the whole forward, and every backward kernel what the backward computed so
   *  far, as the activations and gradients they stand for do. act_[rank]: that health so far,
   *  reset where roles_ starts a micro-step. */
  Health flow(Rank r, const Op& op, Health own);

  /** The tags a primary shard gets from its old tags and its gradient's: version bumped, bad
   *  elements counted for the step. */
  Chunk updated(Rank r, const Op& op, const Chunk& p, Health norm);

  ReplayInputs in_;
  const Schedule& s_;
  std::vector<Health> act_;
  ModuleRoles roles_;                     ///< where each micro-step starts and its loss is taken
  std::vector<std::vector<Chunk>> bufs_;  // [rank][buffer]
  std::vector<std::vector<std::uint32_t>> version_;  // [rank][unit]
  std::map<int, Health> loss_;                       // step -> worst loss tag of any rank
  /** step -> (rank, unit) -> bad primary elements after that step's update */
  std::map<int, std::map<std::pair<Rank, UnitId>, std::uint64_t>> bad_;
};

}  // namespace hpz::replay
