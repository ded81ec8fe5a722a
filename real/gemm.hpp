// The GEMM a compute kernel becomes under `hpzlab real --compute real`: one cuBLAS GEMM of the
// layer's shape with about the op's flops, instead of a spin kernel of the cost model's time.
//
// The rule: m = tokens one rank processes per micro-step (seq_len x micro_batch), k = hidden,
// n = op.flops / (2 m k) rounded to the nearest integer (at least 1). The activation
// [tokens x hidden] is the left operand of the layer's projections (all but the MLP's down
// projection), so the GEMM has their m and k, and about their tiling and arithmetic intensity;
// n takes the rest of the flops. One GEMM thus stands in for the layer's several (projections,
// attention scores, MLP): a backward kernel, with twice the forward flops, gets twice the columns.
//
// Only forward, recompute and backward kernels with flops and no fixed spin time become GEMMs;
// init, loss, gradient-norm, optimizer and quantize kernels and a reproduction's spin stay spin
// kernels. (A layer norm that is partitioned, as in tiny.toml, is a layer kernel: n = 2.)
// The GEMM's data is scratch: the executor's data effects stay the plan's synthetic ones.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sim/scenario.hpp"
#include "sim/ir/schedule.hpp"

namespace hpz::real {

/** The shape of C[m x n] = A[m x k] B[k x n]. */
struct GemmShape {
  std::uint64_t m = 0, n = 0, k = 0;
  /** Floating-point operations of one GEMM of this shape (a multiply-add counts 2). */
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }
  bool operator==(const GemmShape&) const = default;
};

/** The GEMM that `op` of a schedule built from `sc` runs as, or nullopt for a spin kernel. */
std::optional<GemmShape> gemm_shape(const Scenario& sc, const Op& op);

/** The element-wise maximum of `shapes` ({0, 0, 0} when empty): what scratch is sized for. */
GemmShape max_shape(const std::vector<GemmShape>& shapes);

/** The cuBLAS workspace GemmRunner gives each rank's handle (32 MiB: cuBLAS's advice for
 *  Hopper; 4 MiB is enough before it). */
inline constexpr std::uint64_t kGemmWorkspaceBytes = 32ULL << 20;

/** Device memory of a GemmRunner for `ranks` ranks sized for `max`: scratch A, B and C shared by
 *  all ranks plus one workspace per rank (cuBLAS's own handle state not counted). */
std::uint64_t gemm_scratch_bytes(const GemmShape& max, int element_bytes, int ranks);

}  // namespace hpz::real
