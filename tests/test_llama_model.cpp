// The numeric replay's per-module Llama (llama_model.hpp): each parameter's gradient from
// LlamaPass::backward against a central finite difference of the loss, on a model with grouped
// key/value heads, two sequences a micro-batch and two layers; a checkpointing rerun gives the
// same gradients; names parse as the DeepSpeed builder and the recorder write them.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/replay/fp32_math.hpp"
#include "sim/replay/llama_model.hpp"

namespace hpz::replay {
namespace {

constexpr LlamaDims kDims{.seq = 5,
                          .batch = 2,
                          .hidden = 8,
                          .ffn = 12,
                          .heads = 4,
                          .kv_heads = 2,
                          .vocab = 11,
                          .layers = 2};

/** Every parameter in forward order, as modules run. */
std::vector<LlamaParam> forward_order(const LlamaDims& d) {
  std::vector<LlamaParam> out = {{LlamaPart::kEmbed, -1}};
  for (int l = 0; l < d.layers; ++l) {
    for (LlamaPart p :
         {LlamaPart::kInputNorm, LlamaPart::kQ, LlamaPart::kK, LlamaPart::kV, LlamaPart::kO,
          LlamaPart::kPostNorm, LlamaPart::kGate, LlamaPart::kUp, LlamaPart::kDown}) {
      out.push_back({p, l});
    }
  }
  out.push_back({LlamaPart::kFinalNorm, -1});
  out.push_back({LlamaPart::kHead, -1});
  return out;
}

/** Weights large enough that every path carries gradient (norm gains away from 1 too). */
std::vector<std::vector<float>> weights(const LlamaDims& d) {
  std::vector<std::vector<float>> w;
  std::uint64_t k = 0;
  for (const LlamaParam& p : forward_order(d)) {
    std::vector<float> v(llama_numel(d, p.part));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.6f * fp32::uniform(1234 + k, i);
    if (p.part == LlamaPart::kInputNorm || p.part == LlamaPart::kPostNorm ||
        p.part == LlamaPart::kFinalNorm) {
      for (float& x : v) x += 1.0f;
    }
    w.push_back(std::move(v));
    ++k;
  }
  return w;
}

std::vector<int> tokens(const LlamaDims& d) {
  std::vector<int> t(static_cast<std::size_t>(d.tokens()));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int>((7 * i + 3) % d.vocab);
  return t;
}

float loss_of(const LlamaDims& d, const std::vector<std::vector<float>>& w) {
  LlamaPass pass(d);
  pass.begin(tokens(d));
  const std::vector<LlamaParam> order = forward_order(d);
  for (std::size_t i = 0; i < order.size(); ++i) pass.forward(order[i], w[i], false);
  return pass.loss();
}

/** Gradients from backward, in forward order; `recompute`: each layer rerun before its
 *  backward, as gradient checkpointing does. */
std::vector<std::vector<float>> gradients(const LlamaDims& d,
                                          const std::vector<std::vector<float>>& w,
                                          bool recompute) {
  LlamaPass pass(d);
  pass.begin(tokens(d));
  const std::vector<LlamaParam> order = forward_order(d);
  for (std::size_t i = 0; i < order.size(); ++i) pass.forward(order[i], w[i], false);
  pass.loss();
  std::vector<std::vector<float>> g(order.size());
  int rerun = d.layers;  // layers above this one have been rerun
  for (std::size_t i = order.size(); i-- > 0;) {
    const int layer = order[i].layer;
    if (recompute && layer >= 0 && layer < rerun) {
      for (std::size_t j = 0; j < order.size(); ++j) {
        if (order[j].layer == layer) pass.forward(order[j], w[j], true);
      }
      rerun = layer;
    }
    g[i] = pass.backward(order[i], w[i]);
  }
  return g;
}

TEST(LlamaModel, GradientsMatchFiniteDifferences) {
  std::vector<std::vector<float>> w = weights(kDims);
  const std::vector<std::vector<float>> g = gradients(kDims, w, false);
  const std::vector<LlamaParam> order = forward_order(kDims);
  int checked = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    ASSERT_EQ(g[i].size(), w[i].size());
    // A few elements of each parameter, spread over it.
    for (std::size_t e = 0; e < w[i].size(); e += 1 + w[i].size() / 5) {
      const float keep = w[i][e], h = 1e-2f;
      w[i][e] = keep + h;
      const double up = loss_of(kDims, w);
      w[i][e] = keep - h;
      const double down = loss_of(kDims, w);
      w[i][e] = keep;
      const double numeric = (up - down) / (2.0 * h);
      EXPECT_NEAR(g[i][e], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << "parameter " << i << " (layer " << order[i].layer << ") element " << e;
      ++checked;
    }
  }
  EXPECT_GE(checked, 100);
}

TEST(LlamaModel, CheckpointingRerunGivesTheSameGradients) {
  const std::vector<std::vector<float>> w = weights(kDims);
  EXPECT_EQ(gradients(kDims, w, false), gradients(kDims, w, true));
}

TEST(LlamaModel, NanWeightsGiveANanLoss) {
  std::vector<std::vector<float>> w = weights(kDims);
  w[3][0] = std::nanf("");  // layer 0's k_proj
  EXPECT_TRUE(std::isnan(loss_of(kDims, w)));
}

TEST(LlamaModel, KernelBeforeItsInputThrows) {
  LlamaPass pass(kDims);
  pass.begin(tokens(kDims));
  const std::vector<float> w(llama_numel(kDims, LlamaPart::kQ), 0.1f);
  EXPECT_THROW(pass.forward({LlamaPart::kQ, 0}, w, false), std::logic_error);
}

TEST(LlamaModel, ParameterNames) {
  const auto p = llama_param("model.layers.12.mlp.up_proj.weight");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->part, LlamaPart::kUp);
  EXPECT_EQ(p->layer, 12);
  EXPECT_EQ(llama_param("lm_head.weight")->part, LlamaPart::kHead);
  EXPECT_EQ(llama_param("model.norm.weight")->part, LlamaPart::kFinalNorm);
  EXPECT_FALSE(llama_param("model.layers.0.self_attn.q_proj.bias").has_value());
  EXPECT_FALSE(llama_param("model.layers.x.mlp.up_proj.weight").has_value());
  EXPECT_FALSE(llama_param("model.layers..mlp.up_proj.weight").has_value());
  EXPECT_EQ(llama_numel(kDims, LlamaPart::kK), 2u * 2u * 8u);  // kv_heads x head_dim x hidden
}

TEST(QwzQuantizer, RoundsAsDeepSpeedsKernel) {
  // Two groups of four: max 1 (scale 128) and max 0.5 (scale 256).
  std::vector<float> v = {1.0f, 0.3f, -0.5f, 0.00390625f, 0.5f, -0.25f, 0.001f, 0.0f};
  fp32::int8_symmetric_round_trip(v, 2);
  // 1 * 128 = 128 saturates to 127; 0.3 * 128 = 38.4 -> 38; 0.00390625 * 128 = 0.5 -> 0 (even).
  EXPECT_EQ(v[0], 127.0f / 128.0f);
  EXPECT_EQ(v[1], 38.0f / 128.0f);
  EXPECT_EQ(v[2], -0.5f);
  EXPECT_EQ(v[3], 0.0f);
  EXPECT_EQ(v[4], 127.0f / 256.0f);
  EXPECT_EQ(v[5], -0.25f);
  EXPECT_EQ(v[6], 0.0f);  // 0.256 -> 0
  EXPECT_EQ(v[7], 0.0f);
}

TEST(QwzQuantizer, NanBecomesZeroUnlessTheGroupIsAllNan) {
  const float nan = std::nanf("");
  std::vector<float> v = {nan, 0.5f, nan, nan};
  fp32::int8_symmetric_round_trip(v, 2);
  EXPECT_EQ(v[0], 0.0f);
  EXPECT_EQ(v[1], 127.0f / 256.0f);
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_TRUE(std::isnan(v[3]));
  std::vector<float> zeros(4, 0.0f), uneven = {0.3f, 0.3f, 0.3f};
  fp32::int8_symmetric_round_trip(zeros, 1);
  EXPECT_EQ(zeros, std::vector<float>(4, 0.0f));
  fp32::int8_symmetric_round_trip(uneven, 2);  // 2 groups do not divide 3: untouched
  EXPECT_EQ(uneven[0], 0.3f);
}

}  // namespace
}  // namespace hpz::replay
