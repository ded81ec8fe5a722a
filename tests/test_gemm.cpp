// `--compute real`'s GEMMs: which ops become GEMMs and of what shape (everywhere), and the cuBLAS
// runner (skips without a device, fails when a device is present but broken).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "real/device.hpp"
#include "real/gemm.hpp"
#include "real/plan.hpp"
#include "sim/builder.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz::real {
namespace {

using test::scenario_path;

bool is_layer_compute(const Op& op) {
  return op.kind == OpKind::kKernel &&
         (op.purpose == Purpose::kForwardCompute || op.purpose == Purpose::kRecomputeForward ||
          op.purpose == Purpose::kBackwardCompute);
}

TEST(GemmShape, FlopsAndElementWiseMax) {
  EXPECT_EQ((GemmShape{3, 5, 7}.flops()), 210.0);
  EXPECT_EQ(max_shape({{1, 9, 2}, {4, 1, 3}}), (GemmShape{4, 9, 3}));
  EXPECT_EQ(max_shape({}), GemmShape{});
}

// Every layer kernel with flops becomes a [tokens x hidden] x [hidden x n] GEMM whose flops are
// the op's up to n's rounding: |n - flops / 2mk| <= 1/2, so the flops differ by at most m k
// (unless n is raised to 1, which only a kernel under m k flops needs). Everything else stays a
// spin kernel.
TEST(GemmShape, LayerKernelsOfTheOneGpuScenarioAreTokensByHiddenGemmsWithTheirFlops) {
  const Scenario sc = load_scenario(scenario_path("race-1gpu-deepspeed"));
  const Schedule s = build_schedule(sc);
  const std::uint64_t m = 2048 * 4;  // seq_len x micro_batch
  const std::uint64_t k = 4096;      // Llama-2-7B's hidden size
  std::map<Purpose, int> gemms, spins;
  for (const RankSchedule& rs : s.ranks) {
    for (const Op& op : rs.ops) {
      const auto g = gemm_shape(sc, op);
      if (!is_layer_compute(op) || op.flops == 0 || op.spin_us != 0) {
        EXPECT_FALSE(g.has_value()) << "purpose " << static_cast<int>(op.purpose);
        if (op.kind == OpKind::kKernel) ++spins[op.purpose];
        continue;
      }
      ASSERT_TRUE(g.has_value());
      ++gemms[op.purpose];
      EXPECT_EQ(g->m, m);
      EXPECT_EQ(g->k, k);
      ASSERT_GE(g->n, 1U);
      if (op.flops >= static_cast<double>(m * k)) {
        EXPECT_LE(std::abs(g->flops() - op.flops), static_cast<double>(m * k));
      } else {
        EXPECT_EQ(g->n, 1U);
      }
    }
  }
  EXPECT_GT(gemms[Purpose::kForwardCompute], 0);
  EXPECT_GT(gemms[Purpose::kRecomputeForward], 0);
  EXPECT_GT(gemms[Purpose::kBackwardCompute], 0);
  // (DeepSpeed's gradient norm is an all-reduce, no kernel of its own.)
  for (Purpose p : {Purpose::kParamInit, Purpose::kLossGradient, Purpose::kOptimizerStep}) {
    EXPECT_GT(spins[p], 0) << "purpose " << static_cast<int>(p);
  }
  // The embedding's forward kernel has no flops (a lookup): it stays a spin kernel.
  EXPECT_GT(spins[Purpose::kForwardCompute], 0);
}

// The builder's layer flops are whole multiples of 2 m k (the test above); other flops round
// to the nearest column count, and a kernel under half a column still runs one.
TEST(GemmShape, ColumnsRoundToTheNearestAndAreAtLeastOne) {
  const Scenario sc = load_scenario(scenario_path("tiny"));  // m = 32, k = 64
  const double column = 2.0 * 32 * 64;
  Op op;
  op.kind = OpKind::kKernel;
  op.purpose = Purpose::kBackwardCompute;
  const std::vector<std::pair<double, std::uint64_t>> cases = {
      {2.4 * column, 2}, {2.6 * column, 3}, {0.3 * column, 1}, {1000 * column, 1000}};
  for (const auto& [flops, n] : cases) {
    op.flops = flops;
    const auto g = gemm_shape(sc, op);
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(*g, (GemmShape{32, n, 64})) << flops / column << " columns";
  }
}

TEST(GemmShape, TokensPerMicroStepSetM) {
  const Scenario sc = load_scenario(scenario_path("tiny"), {{"training.micro_batch", "3"}});
  const std::vector<GemmShape> shapes = gemm_shapes(make_plan(sc, build_schedule(sc)));
  ASSERT_FALSE(shapes.empty());
  for (const GemmShape& g : shapes) {
    EXPECT_EQ(g.m, 32U * 3);  // tiny.toml: seq_len 32
    EXPECT_EQ(g.k, 64U);      // hidden 64
  }
}

// Quantize kernels (qwZ, qgZ) and a reproduction's spin ahead of the secondary copy stay spin
// kernels; so would a layer kernel given a fixed spin time.
TEST(GemmShape, QuantizeKernelsAndReproSpinsStaySpins) {
  const Scenario sc =
      load_scenario(scenario_path("tiny"), {{"zero.zero_quantized_weights", "true"},
                                            {"zero.zero_quantized_gradients", "true"},
                                            {"run.spin_before_copy_us", "200"}});
  const Schedule s = build_schedule(sc);
  int quantize = 0, repro = 0;
  std::optional<Op> forward;  // a copy: the list gives ops by value
  for (const Op& op : s.ranks[0].ops) {
    if (op.kind == OpKind::kQuantize || op.kind == OpKind::kDequantize) {
      ++quantize;
      EXPECT_FALSE(gemm_shape(sc, op).has_value());
    }
    if (op.purpose == Purpose::kReproSpin) {
      ++repro;
      EXPECT_EQ(op.kind, OpKind::kKernel);
      EXPECT_GT(op.spin_us, 0.0F);
      EXPECT_FALSE(gemm_shape(sc, op).has_value());
    }
    if (!forward && op.purpose == Purpose::kForwardCompute && op.flops > 0) forward = op;
  }
  EXPECT_GT(quantize, 0);
  EXPECT_GT(repro, 0);
  ASSERT_TRUE(forward.has_value());
  Op spun = *forward;
  EXPECT_TRUE(gemm_shape(sc, spun).has_value());
  spun.spin_us = 50;
  EXPECT_FALSE(gemm_shape(sc, spun).has_value());
}

}  // namespace
}  // namespace hpz::real

// ---- The cuBLAS runner (needs a device) ----

#ifdef HPZLAB_WITH_CUDA
#include <cuda_runtime.h>

#include "real/gemm_runner.hpp"
#include "tests/test_stream.hpp"

namespace hpz::real {
namespace {

using test::TestStream;

TEST(GemmRunner, RunsEachRanksGemmsOnItsStreamToCompletion) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  for (int eb : {2, 4}) {
    GemmRunner runner(2, {512, 384, 256}, eb);
    TestStream s0, s1;
    runner.run(0, s0.get(), {512, 384, 256});
    runner.run(1, s1.get(), {256, 1, 128});
    runner.run(0, s0.get(), {8, 8, 8});
    EXPECT_EQ(cudaStreamSynchronize(s0.get()), cudaSuccess) << "element bytes " << eb;
    EXPECT_EQ(cudaStreamSynchronize(s1.get()), cudaSuccess) << "element bytes " << eb;
    EXPECT_THROW(runner.run(0, s0.get(), {1024, 1, 1}), std::invalid_argument);
    EXPECT_THROW(runner.run(0, s0.get(), {1, 0, 1}), std::invalid_argument);
  }
}

/** Milliseconds of 10 back-to-back GEMMs of shape `g` on `s`, the best of 5 tries. */
float best_ms(GemmRunner& runner, cudaStream_t s, const GemmShape& g) {
  cudaEvent_t start{}, stop{};
  EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
  float best = 1e30F;
  for (int trial = 0; trial < 5; ++trial) {
    EXPECT_EQ(cudaEventRecord(start, s), cudaSuccess);
    for (int i = 0; i < 10; ++i) runner.run(0, s, g);
    EXPECT_EQ(cudaEventRecord(stop, s), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
    best = std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// A GEMM's time grows with its flops: 4 times the columns takes about 4 times as long. The bound
// is loose (clocks, launch gaps), but a GEMM that does not run, or does not depend on n, fails it.
TEST(GemmRunner, FourTimesTheColumnsTakesLonger) {
  const DeviceInfo info = probe_devices();
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const GemmShape one{4096, 1024, 4096}, four{4096, 4096, 4096};
  GemmRunner runner(1, four, 2);
  runner.warm_up({one, four});
  TestStream s;
  const float t1 = best_ms(runner, s.get(), one);
  const float t4 = best_ms(runner, s.get(), four);
  EXPECT_GT(t1, 0.0F);
  EXPECT_GT(t4, 1.5F * t1) << "n = 1024: " << t1 << " ms, n = 4096: " << t4 << " ms";
}

}  // namespace
}  // namespace hpz::real
#endif
