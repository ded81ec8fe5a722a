// The numeric replay's module kernels (numeric_domain.hpp): each kernel computes the part of
// transformers' Llama that module_roles.hpp says it stands for, one rule for the DeepSpeed
// builder's schedules, recordings of real DeepSpeed and the real executor's plan.
#include <fmt/format.h>

#include "sim/error.hpp"
#include "sim/replay/numeric_domain.hpp"

namespace hpz::replay {

KernelRoles NumericDomain::module_roles(Rank r, const Op& op) {
  const KernelRoles k = roles_.kernel(r, op);
  if (k.new_micro) micro_[r] = Micro{};
  return k;
}

// Forward: the parameter's module part at the first kernel of the micro-step (and pass) that
// reads its gathered weights (module_roles.hpp). A kernel with no parameter (the attention's
// core, the MLP's activation) is done by the parameter kernel that needs it (llama_model.hpp).
std::vector<Write<NumericDomain::Chunk>> NumericDomain::module_forward(Rank r, const Op& op,
                                                                       const KernelRoles& k,
                                                                       const ReadFn<Chunk>& read) {
  if (k.forward == kNoUnit) return {};
  pass(r, op).forward(param(k.forward), part(read, *k.forward_weights),
                      op.purpose == Purpose::kRecomputeForward);
  return {};
}

// Backward, as autograd runs a module: the gradient is computed with the weights the first
// backward kernel that read them saw (grad_output times W for a Linear, times g for an RMSNorm),
// at the first kernel that writes the weights' gradient, and each writer writes its slice of it;
// the builder's one kernel does both. nn.Embedding's backward reads no weights. The loss is what
// the forward computed when the micro-step's backward starts.
std::vector<Write<NumericDomain::Chunk>> NumericDomain::module_backward(Rank r, const Op& op,
                                                                        const KernelRoles& k,
                                                                        const ReadFn<Chunk>& read) {
  Micro& m = micro_[r];
  if (k.loss) loss(r, op);
  if (k.weights != kNoUnit) m.weights_seen.emplace(k.weights, part(read, *k.weights_access));
  if (k.gradient == kNoUnit) return {};
  const UnitId u = k.gradient;
  if (k.gradient_first) {
    const LlamaParam p = param(u);
    if (!k.weights_seen && p.part != LlamaPart::kEmbed) {
      throw InputError("", "ranks",
                       fmt::format("rank {}: the gradient of {} is written before any "
                                   "backward kernel read its weights",
                                   r, s_.units[u].name));
    }
    const auto seen = m.weights_seen.find(u);
    m.gradient[u] = pass(r, op).backward(p, seen == m.weights_seen.end() ? Chunk{} : seen->second);
  }
  const Access& g = *k.gradient_access;
  const std::uint64_t dt = static_cast<std::uint64_t>(s_.dtype_bytes);
  return {{g.buffer, g.offset / dt, slice(m.gradient.at(u), g.offset / dt, g.bytes / dt)}};
}

}  // namespace hpz::replay
