#include "real/gemm.hpp"

#include <algorithm>
#include <cmath>

namespace hpz::real {

namespace {

bool is_layer_compute(Purpose p) {
  return p == Purpose::kForwardCompute || p == Purpose::kRecomputeForward ||
         p == Purpose::kBackwardCompute;
}

}  // namespace

std::optional<GemmShape> gemm_shape(const Scenario& sc, const Op& op) {
  if (op.kind != OpKind::kKernel || !is_layer_compute(op.purpose)) return std::nullopt;
  if (!(op.flops > 0) || op.spin_us != 0) return std::nullopt;
  GemmShape g;
  g.m = static_cast<std::uint64_t>(sc.training.seq_len) *
        static_cast<std::uint64_t>(sc.training.micro_batch);
  g.k = static_cast<std::uint64_t>(sc.model.hidden);
  if (g.m == 0 || g.k == 0) return std::nullopt;
  const double columns = op.flops / (2.0 * static_cast<double>(g.m) * static_cast<double>(g.k));
  g.n = static_cast<std::uint64_t>(std::max(1LL, std::llround(columns)));
  return g;
}

GemmShape max_shape(const std::vector<GemmShape>& shapes) {
  GemmShape out;
  for (const GemmShape& g : shapes) {
    out.m = std::max(out.m, g.m);
    out.n = std::max(out.n, g.n);
    out.k = std::max(out.k, g.k);
  }
  return out;
}

std::uint64_t gemm_scratch_bytes(const GemmShape& max, int element_bytes, int ranks) {
  const std::uint64_t elements = max.m * max.k + max.k * max.n + max.m * max.n;
  return elements * static_cast<std::uint64_t>(element_bytes) +
         static_cast<std::uint64_t>(ranks) * kGemmWorkspaceBytes;
}

}  // namespace hpz::real
