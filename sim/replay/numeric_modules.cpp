// The numeric replay on recordings of real DeepSpeed (numeric_domain.hpp): which of autograd's
// kernels computes which parameter's module part, from the buffers they touch.
#include <fmt/format.h>

#include "sim/error.hpp"
#include "sim/replay/numeric_domain.hpp"

namespace hpz::replay {

NumericDomain::RecordedMicro& NumericDomain::recorded_micro(Rank r, const Op& op) {
  RecordedMicro& m = recorded_micro_[r];
  const std::pair<std::int32_t, std::int32_t> now{op.step, op.micro_step};
  if (m.at != now) {
    m = RecordedMicro{};
    m.at = now;
  }
  return m;
}

// The first kernel of the micro-step that reads a parameter's gathered weights is its module's
// forward (nn.Linear's matmul, LlamaRMSNorm's product with its weight, nn.Embedding's lookup):
// the other kernels of a module read activations only, which the compute stream orders.
std::vector<Write<NumericDomain::Chunk>> NumericDomain::recorded_forward(
    Rank r, const Op& op, const ReadFn<Chunk>& read) {
  const Access* w = access(r, op, AccessMode::kRead, BufferRole::kFull, 1);
  if (w == nullptr) return {};
  const UnitId u = s_.ranks[r].buffers[w->buffer].unit;
  bool& done = recorded_micro(r, op).forward_done[{op.purpose, u}];
  if (done) return {};
  done = true;
  pass(r, op).forward(param(u), part(read, *w), op.purpose == Purpose::kRecomputeForward);
  return {};
}

// Backward, as autograd runs a module: the kernel that reads the weights (the input's gradient:
// grad_output times W for a Linear, times g for an RMSNorm) and the one that writes the
// weights' gradient (grad_output' x for a Linear) are two; the gradient is computed with the
// weights the first saw and written by the second. nn.Embedding's backward reads no weights.
std::vector<Write<NumericDomain::Chunk>> NumericDomain::recorded_backward(
    Rank r, const Op& op, const ReadFn<Chunk>& read) {
  RecordedMicro& m = recorded_micro(r, op);
  if (!m.loss_taken) {  // the loss's gradient is the backward's first kernel
    m.loss_taken = true;
    loss(r, op);
  }
  if (const Access* w = access(r, op, AccessMode::kRead, BufferRole::kFull, 1)) {
    m.weights_seen.try_emplace(s_.ranks[r].buffers[w->buffer].unit, part(read, *w));
  }
  const Access* g = access(r, op, AccessMode::kWrite, BufferRole::kGradFull, 1);
  if (g == nullptr) return {};
  const UnitId u = s_.ranks[r].buffers[g->buffer].unit;
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
