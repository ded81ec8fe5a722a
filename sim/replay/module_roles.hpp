// Which part of a model's training a kernel stands for, by the one rule the numeric replay, the
// taint replay and the real executor's plan share, for the DeepSpeed builder's schedules and for
// recordings of real DeepSpeed alike. The builder issues one kernel per module, which reads its
// weights and, backward, writes their gradient; autograd's kernels in a recording read the
// weights in one kernel (the input's gradient) and write the weights' gradient in a later one,
// and name no parameter (Schedule::unit_of names it from the buffer). So, per rank and
// micro-step:
//  - a parameter's module part runs forward at the first kernel of the micro-step (and pass:
//    forward or recompute) that reads its gathered weights (nn.Linear's matmul, LlamaRMSNorm's
//    product with its weight, nn.Embedding's lookup); other kernels read activations only;
//  - the loss is what the forward computed when the micro-step's backward starts: at the loss's
//    own kernel (the builder) or autograd's first backward kernel, the loss's gradient;
//  - backward, the gradient is computed with the weights the first backward kernel that read
//    them saw, at the first kernel that writes the gradient tensor (grad_full).
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "sim/ir/schedule.hpp"

namespace hpz::replay {

/** What one kernel stands for (ModuleRoles::kernel). Accesses point into the schedule. */
struct KernelRoles {
  bool new_micro = false;  ///< the rank's first forward or backward kernel of a (step, micro-step)
  /** Forward or recompute: the parameter whose module part runs here, with these weights. */
  UnitId forward = kNoUnit;
  const Access* forward_weights = nullptr;
  bool loss = false;  ///< the micro-step's backward starts here: the loss is taken first
  /** Backward: the first kernel of the micro-step to read this parameter's gathered weights. */
  UnitId weights = kNoUnit;
  const Access* weights_access = nullptr;
  /** Backward: writes this parameter's gradient (the op's first grad_full write). */
  UnitId gradient = kNoUnit;
  const Access* gradient_access = nullptr;
  bool gradient_first = false;  ///< the micro-step's first write of it: computed here
  bool weights_seen = false;    ///< gradient: a backward kernel of the micro-step read its weights
};

/** The rule above, kept per rank: call kernel() for each kernel of a rank in the order it runs
 *  (issue order, or a timeline's: a rank's forward and backward kernels share its compute
 *  stream). */
class ModuleRoles {
 public:
  explicit ModuleRoles(const Schedule& s) : s_(s), micro_(s.ranks.size()) {}

  KernelRoles kernel(Rank r, const Op& op) {
    KernelRoles k;
    const bool forward =
        op.purpose == Purpose::kForwardCompute || op.purpose == Purpose::kRecomputeForward;
    const bool backward =
        op.purpose == Purpose::kLossGradient || op.purpose == Purpose::kBackwardCompute;
    if (op.kind != OpKind::kKernel || (!forward && !backward)) return k;
    Micro& m = micro_[r];
    if (m.at != std::pair{op.step, op.micro_step}) {
      m = Micro{};
      m.at = {op.step, op.micro_step};
      k.new_micro = true;
    }
    const Access* w = first(r, op, AccessMode::kRead, BufferRole::kFull);
    const UnitId wu = w == nullptr ? kNoUnit : s_.unit_of(r, op, *w);
    if (forward) {
      if (wu != kNoUnit && m.forward_done.insert({op.purpose, wu}).second) {
        k.forward = wu;
        k.forward_weights = w;
      }
      return k;
    }
    k.loss = !m.loss_taken;
    m.loss_taken = true;
    if (wu != kNoUnit && m.weights_seen.insert(wu).second) {
      k.weights = wu;
      k.weights_access = w;
    }
    const Access* g = first(r, op, AccessMode::kWrite, BufferRole::kGradFull);
    const UnitId gu = g == nullptr ? kNoUnit : s_.unit_of(r, op, *g);
    if (gu != kNoUnit) {
      k.gradient = gu;
      k.gradient_access = g;
      k.gradient_first = m.gradient_done.insert(gu).second;
      k.weights_seen = m.weights_seen.count(gu) > 0;
    }
    return k;
  }

 private:
  struct Micro {
    std::pair<std::int32_t, std::int32_t> at{-2, 0};  ///< (step, micro-step)
    bool loss_taken = false;
    std::set<std::pair<Purpose, UnitId>> forward_done;
    std::set<UnitId> weights_seen;
    std::set<UnitId> gradient_done;
  };
  /** The op's first access of `mode` on a buffer of role `want`, or nullptr. */
  const Access* first(Rank r, const Op& op, AccessMode mode, BufferRole want) const {
    for (const Access& a : s_.accesses_of(r, op)) {
      if (a.mode == mode && s_.ranks[r].buffers[a.buffer].role == want) return &a;
    }
    return nullptr;
  }

  const Schedule& s_;
  std::vector<Micro> micro_;  ///< [rank]
};

}  // namespace hpz::replay
