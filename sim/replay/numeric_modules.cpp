// The numeric replay's module kernels (numeric_domain.hpp): which kernel computes which
// parameter's part of the Llama, found by the parameter buffers it touches, one rule for the
// DeepSpeed builder's schedules and for recordings of real DeepSpeed. The builder issues one
// kernel per module that reads its weights and, backward, writes their gradient; autograd's
// kernels in a recording read the weights in one kernel (the input's gradient) and write the
// weights' gradient in another, and name no parameter (Schedule::unit_of names it from the
// buffer).
#include <fmt/format.h>

#include "sim/error.hpp"
#include "sim/replay/numeric_domain.hpp"

namespace hpz::replay {

NumericDomain::Micro& NumericDomain::micro(Rank r, const Op& op) {
  Micro& m = micro_[r];
  const std::pair<std::int32_t, std::int32_t> now{op.step, op.micro_step};
  if (m.at != now) {
    m = Micro{};
    m.at = now;
  }
  return m;
}

// A parameter's module part runs forward at the first kernel of the micro-step (and pass:
// forward or recompute) that reads its gathered weights: nn.Linear's matmul, LlamaRMSNorm's
// product with its weight, nn.Embedding's lookup. Other kernels of a module read activations
// only, which the compute stream orders; a kernel with no parameter (the attention's core, the
// MLP's activation) is done by the parameter kernel that needs it (llama_model.hpp).
std::vector<Write<NumericDomain::Chunk>> NumericDomain::module_forward(Rank r, const Op& op,
                                                                       const ReadFn<Chunk>& read) {
  const Access* w = access(r, op, AccessMode::kRead, BufferRole::kFull);
  if (w == nullptr) return {};
  const UnitId u = s_.unit_of(r, op, *w);
  if (u == kNoUnit) return {};
  bool& done = micro(r, op).forward_done[{op.purpose, u}];
  if (done) return {};
  done = true;
  pass(r, op).forward(param(u), part(read, *w), op.purpose == Purpose::kRecomputeForward);
  return {};
}

// Backward, as autograd runs a module: the gradient is computed with the weights the first
// backward kernel that read them saw (grad_output times W for a Linear, times g for an RMSNorm),
// and written by the kernel that writes the weights' gradient; the builder's one kernel does
// both. nn.Embedding's backward reads no weights. The loss is what the forward computed when the
// micro-step's backward starts: at the loss's own kernel (the builder) or at autograd's first
// backward kernel, the loss's gradient (a recording).
std::vector<Write<NumericDomain::Chunk>> NumericDomain::module_backward(Rank r, const Op& op,
                                                                        const ReadFn<Chunk>& read) {
  Micro& m = micro(r, op);
  if (!m.loss_taken) {
    m.loss_taken = true;
    loss(r, op);
  }
  if (const Access* w = access(r, op, AccessMode::kRead, BufferRole::kFull)) {
    if (const UnitId u = s_.unit_of(r, op, *w); u != kNoUnit) {
      m.weights_seen.try_emplace(u, part(read, *w));
    }
  }
  const Access* g = access(r, op, AccessMode::kWrite, BufferRole::kGradFull);
  if (g == nullptr) return {};
  const UnitId u = s_.unit_of(r, op, *g);
  if (u == kNoUnit) return {};
  auto it = m.gradient.find(u);
  if (it == m.gradient.end()) {
    const LlamaParam p = param(u);
    const auto seen = m.weights_seen.find(u);
    if (seen == m.weights_seen.end() && p.part != LlamaPart::kEmbed) {
      throw InputError("", "ranks",
                       fmt::format("rank {}: the gradient of {} is written before any "
                                   "backward kernel read its weights",
                                   r, s_.units[u].name));
    }
    const Chunk none;
    it =
        m.gradient
            .emplace(u, pass(r, op).backward(p, seen == m.weights_seen.end() ? none : seen->second))
            .first;
  }
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  return {{g->buffer, g->offset / dt, slice(it->second, g->offset / dt, g->bytes / dt)}};
}

}  // namespace hpz::replay
