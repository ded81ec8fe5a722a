// The model math's CUDA kernels against the CPU code they port (NumericDomain::grad_norm and
// replay::adam_step): the sum of squares and the Adam step. GPU tests skip without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "real/device.hpp"
#include "real/model_kernels.hpp"
#include "sim/replay/llama_model.hpp"
#include "tests/test_stream.hpp"

namespace hpz::real::model {
namespace {

/** n pseudo-random floats in [-1, 1) from a 64-bit LCG. */
std::vector<float> activations(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& f : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<double>(s >> 40) * 0x1.0p-23 - 1.0);
  }
  return v;
}

/** |gpu - cpu| <= 1e-4 max(1, |cpu|) element by element (NaN only against NaN); on failure, how
 *  many elements were wrong and the first of them. */
::testing::AssertionResult close_to(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size()) {
    return ::testing::AssertionFailure() << "sizes " << gpu.size() << " vs " << cpu.size();
  }
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const bool ok = std::isnan(cpu[i])
                        ? std::isnan(gpu[i])
                        : std::fabs(gpu[i] - cpu[i]) <= 1e-4f * std::max(1.0f, std::fabs(cpu[i]));
    if (!ok && wrong++ == 0) first = i;
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << cpu.size() << " elements wrong, first [" << first << "]: gpu "
         << gpu[first] << ", cpu " << cpu[first];
}

// ---- Without a device ----

TEST(ModelKernelsScratch, HoldsSumSquaresPartialsAndTotal) {
  // sum_squares' 256 block partials and its total, in doubles (model_kernels.hpp).
  EXPECT_GE(scratch_floats(), 2u * (256 + 1));
}

// ---- On the device ----

/** A device array of T, freed at scope exit. */
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) { write(v); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  void write(const std::vector<T>& v) {
    ASSERT_LE(v.size(), n_);
    EXPECT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  /** The first n elements (all by default), after the device is idle. */
  std::vector<T> read(std::size_t n = SIZE_MAX) const {
    std::vector<T> v(std::min(n, n_));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, v.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

using test::TestStream;

TEST(SumSquares, MatchesGradNorm) {
  const DeviceInfo info = probe_devices();  // real/device.hpp
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const std::vector<std::vector<float>> parts = {
      activations(1000, 5), {}, activations(7, 6), activations(300001, 7)};
  // NumericDomain::grad_norm (sim/replay/numeric_domain.cpp): squares summed in double, in order.
  double ss = 0;
  for (const auto& p : parts) {
    for (float g : p) ss += static_cast<double>(g) * g;
  }
  std::deque<DeviceArray<float>> devs;  // a deque never moves its elements
  std::vector<const float*> ptrs;
  std::vector<std::uint64_t> sizes;
  for (const auto& p : parts) {
    ptrs.push_back(devs.emplace_back(p).get());
    sizes.push_back(p.size());
  }
  DeviceArray<float> out(1);
  DeviceArray<double> scratch(scratch_floats() / 2);
  TestStream s;
  for (int count : {4, 0}) {
    EXPECT_EQ(sum_squares(ptrs.data(), sizes.data(), count, out.get(), scratch.get(), s.get()),
              cudaSuccess);
    const float want = count == 0 ? 0.0f : static_cast<float>(ss);
    EXPECT_TRUE(close_to(out.read(), {want})) << count << " parts";
  }
}

TEST(Adam, MatchesAdamStepOverSteps) {
  const DeviceInfo info = probe_devices();  // real/device.hpp
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  const std::size_t n = 1001;
  const float scale = 1.0f / 8;
  TestStream s;
  // norm_sq: none (no clipping), one that clips (total 12.5), a NaN (std::min leaves clip 1).
  for (const float norm_sq : {-1.0f, 1e4f, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(norm_sq);
    std::vector<float> p = activations(n, 8), m(n, 0.0f), v(n, 0.0f);
    DeviceArray<float> p_dev(p), m_dev(m), v_dev(v), grad_dev(n), nsq(std::vector<float>{norm_sq});
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> grad = activations(n, 10 + static_cast<std::uint64_t>(step));
      grad_dev.write(grad);
      replay::adam_step(p, grad, m, v, norm_sq < 0 ? 0.0f : norm_sq, scale, step);
      EXPECT_EQ(adam(p_dev.get(), p_dev.get(), grad_dev.get(), norm_sq < 0 ? nullptr : nsq.get(),
                     m_dev.get(), v_dev.get(), n, scale, step, s.get()),
                cudaSuccess);
      EXPECT_TRUE(close_to(p_dev.read(), p)) << "p, step " << step;
      EXPECT_TRUE(close_to(m_dev.read(), m)) << "m, step " << step;
      EXPECT_TRUE(close_to(v_dev.read(), v)) << "v, step " << step;
    }
  }
}

}  // namespace
}  // namespace hpz::real::model
