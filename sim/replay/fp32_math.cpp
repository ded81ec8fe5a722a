#include "sim/replay/fp32_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hpz::replay::fp32 {

Vec matmul_t(CSpan x, CSpan w, int t, int in, int out) {
  Vec y(static_cast<std::size_t>(t) * out, 0.0f);
  for (int r = 0; r < t; ++r) {
    for (int o = 0; o < out; ++o) {
      float s = 0;
      for (int k = 0; k < in; ++k) s += x[r * in + k] * w[o * in + k];
      y[r * out + o] = s;
    }
  }
  return y;
}

void matmul_t_backward(CSpan x, CSpan w, CSpan dy, int t, int in, int out, Vec& dx,
                       std::span<float> dw) {
  for (int r = 0; r < t; ++r) {
    for (int o = 0; o < out; ++o) {
      const float g = dy[r * out + o];
      for (int k = 0; k < in; ++k) {
        dx[r * in + k] += g * w[o * in + k];
        dw[o * in + k] += g * x[r * in + k];
      }
    }
  }
}

float silu(float v) {
  return v / (1.0f + std::exp(-v));
}

float silu_grad(float v) {
  const float s = 1.0f / (1.0f + std::exp(-v));
  return s * (1.0f + v * (1.0f - s));
}

Vec rms_forward(CSpan g, CSpan x, int rows, int h, float eps) {
  Vec y(x.size());
  for (int r = 0; r < rows; ++r) {
    float ss = 0;
    for (int k = 0; k < h; ++k) ss += x[r * h + k] * x[r * h + k];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
    for (int k = 0; k < h; ++k) y[r * h + k] = x[r * h + k] * inv * g[k];
  }
  return y;
}

Vec rms_backward(CSpan g, CSpan x, CSpan dy, int rows, int h, float eps, std::span<float> dg) {
  Vec dx(x.size());
  for (int r = 0; r < rows; ++r) {
    float ss = 0, dot = 0;
    for (int k = 0; k < h; ++k) ss += x[r * h + k] * x[r * h + k];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
    for (int k = 0; k < h; ++k) {
      dg[k] += dy[r * h + k] * x[r * h + k] * inv;
      dot += dy[r * h + k] * g[k] * x[r * h + k];
    }
    for (int k = 0; k < h; ++k) {
      dx[r * h + k] =
          inv * (dy[r * h + k] * g[k] - x[r * h + k] * inv * inv * dot / static_cast<float>(h));
    }
  }
  return dx;
}

void int8_symmetric_round_trip(std::span<float> v, std::uint64_t groups) {
  if (groups == 0 || v.size() % groups != 0) return;
  const std::size_t n = v.size() / groups;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::span<float> x = v.subspan(g * n, n);
    float max = std::numeric_limits<float>::quiet_NaN();
    for (float e : x) {
      if (!std::isnan(e)) max = std::isnan(max) ? std::fabs(e) : std::max(max, std::fabs(e));
    }
    const float scale = max == 0.0f ? 1.0f : 256.0f / (2.0f * max);
    const float stored = 1.0f / scale;
    for (float& e : x) {
      const float scaled = e * scale;
      // cvt.rni.s32.f32: round to nearest even, saturate, NaN to 0.
      const float q =
          std::isnan(scaled) ? 0.0f : std::clamp(std::nearbyint(scaled), -128.0f, 127.0f);
      e = q * stored;
    }
  }
}

std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float uniform(std::uint64_t seed, std::uint64_t i) {
  return static_cast<float>(static_cast<double>(mix(seed ^ mix(i)) >> 11) * 0x1.0p-52 - 1.0);
}

}  // namespace hpz::replay::fp32
