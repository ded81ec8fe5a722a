// The numeric value domain: every rank's buffers as fp32 arrays, kernels as real math: DeepSpeed's
// schedules (the DeepSpeed builder's and recordings) with transformers' Llama, one parameter's
// module at a time (llama_model.hpp), its activations kept per rank by a LlamaPass since those
// schedules carry no activation buffers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/replay/data_engine.hpp"
#include "sim/replay/llama_model.hpp"
#include "sim/replay/module_roles.hpp"
#include "sim/replay/replay.hpp"

namespace hpz::replay {

/** The Llama the numeric replay computes for a scenario's model (its seq_len and micro_batch). */
LlamaDims llama_dims(const ReplayInputs& in);

/** Why the numeric replay cannot compute DeepSpeed's schedule `s` of the scenario's model ("" when
 *  it can): the model is no plain Llama, or a parameter of `s` is none of that Llama's, or has
 *  another size. */
std::string llama_unsupported(const ReplayInputs& in, const Schedule& s);

class NumericDomain {
 public:
  using Chunk = std::vector<float>;

  NumericDomain(const ReplayInputs& in, const Schedule& s);

  static std::uint64_t size(const Chunk& c) { return c.size(); }
  static Chunk slice(const Chunk& c, std::uint64_t off, std::uint64_t n);
  static void splice(Chunk& dst, std::uint64_t off, const Chunk& src);
  static void accumulate(Chunk& acc, const Chunk& x);
  /** Each element k times (a widening dtype cast's bytes: data_engine.hpp gather_into). */
  static Chunk widen(const Chunk& c, std::uint64_t k);
  /** qwZ's int8 round trip (fp32::int8_symmetric_round_trip). */
  static void quantize_int8(Chunk& c, std::uint64_t groups);

  Chunk read(Rank r, BufferId b, std::uint64_t begin, std::uint64_t n) const;
  void write(Rank r, BufferId b, std::uint64_t begin, const Chunk& c);
  void alloc(Rank r, BufferId b, BufferId previous, Fill fill, std::uint64_t elements);
  Chunk checkpoint(Rank r, UnitId u, std::uint64_t first, std::uint64_t n) const;
  std::vector<Write<Chunk>> kernel(Rank r, const Op& op, const ReadFn<Chunk>& read);
  /** A recording's optimizer step as it lands in unit op.unit's primary shard (`primary`, an
   *  access of the copy that writes every primary back from the fp32 partition): Adam on the
   *  shard with the unit's reduced gradient (read(kReducedGrad, ...)), as adam() does. */
  std::vector<Write<Chunk>> update_primary(Rank r, const Op& op, const Access& primary,
                                           const ReadFn<Chunk>& read);

  /** Per step: loss (mean over ranks and micro-steps) and primary-weights hash. */
  std::vector<StepRecord> steps() const;

 private:
  /** Adam moments of one rank's primary shard of one unit. */
  struct AdamState {
    std::vector<float> m, v;
  };

  /** The op's first access of mode m to a buffer of `role`; null when none. */
  const Access* access(Rank r, const Op& op, AccessMode m, BufferRole role) const;
  std::vector<Write<Chunk>> init_kernel(Rank r, const Op& op);
  std::vector<Write<Chunk>> loss(Rank r, const Op& op);
  std::vector<Write<Chunk>> grad_norm(Rank r, const Op& op, const ReadFn<Chunk>& read);
  std::vector<Write<Chunk>> adam(Rank r, const Op& op, const ReadFn<Chunk>& read);
  Chunk part(const ReadFn<Chunk>& read, const Access& a) const;
  /** The rank's Llama pass, begun anew when op starts another micro-step. */
  LlamaPass& pass(Rank r, const Op& op);
  LlamaParam param(UnitId u) const;
  std::vector<float> unit_weights(UnitId u, std::uint64_t seed) const;
  /** Adam on one unit's primary shard of rank r (adam_step); folds it into the step's hash. */
  Chunk step_unit(Rank r, const Op& op, Chunk p, const Chunk& grad, float norm_sq,
                  float max_grad_norm);

  /** The storage of slot b of rank r, created on first use. */
  Chunk& slot(Rank r, BufferId b);

  // The module kernels (numeric_modules.cpp), by the rule module_roles.hpp gives: forward at
  // the first kernel of the micro-step that reads a parameter's gathered weights; backward with
  // the weights the first backward kernel that read them saw, computed at the kernel that writes
  // the parameter's gradient tensor (grad_full); the loss when the micro-step's backward starts.
  /** The rank's micro-step's values, cleared where roles_ starts a micro-step. */
  struct Micro {
    std::map<UnitId, Chunk> weights_seen;  ///< backward: the weights its first reader saw
    std::map<UnitId, Chunk> gradient;      ///< backward: computed once, written by each writer
  };
  KernelRoles module_roles(Rank r, const Op& op);
  std::vector<Write<Chunk>> module_forward(Rank r, const Op& op, const KernelRoles& k,
                                           const ReadFn<Chunk>& read);
  std::vector<Write<Chunk>> module_backward(Rank r, const Op& op, const KernelRoles& k,
                                            const ReadFn<Chunk>& read);

  ReplayInputs in_;
  const Schedule& s_;
  LlamaDims llama_;
  ModuleRoles roles_;
  std::vector<Micro> micro_;                                    ///< [rank]
  std::vector<LlamaPass> passes_;                               ///< [rank]
  std::vector<std::pair<std::int32_t, std::int32_t>> pass_at_;  ///< [rank]: (step, micro)
  std::vector<std::vector<Chunk>> bufs_;                        // [rank][buffer]: stored
  /** What an allocation left past the stored elements: its fill, up to its length. */
  struct Filled {
    float fill = 0.0f;
    std::uint64_t length = 0;
  };
  std::vector<std::vector<Filled>> filled_;  // [rank][buffer]
  std::map<std::pair<Rank, UnitId>, AdamState> adam_;
  std::map<int, std::pair<double, int>> loss_;  // step -> (sum, count)
  std::map<int, std::uint64_t> hash_;           // step -> xor of per-shard hashes
};

}  // namespace hpz::replay
