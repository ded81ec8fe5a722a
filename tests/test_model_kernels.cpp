// The tiny model's CUDA kernels against the CPU model they port (sim/replay/tiny_model.cpp, and
// NumericDomain::grad_norm / replay::adam_step): every unit forward and backward, the loss, the
// sum of squares and the Adam step, on two shapes, plus aliasing and run-to-run determinism.
// GPU tests skip without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "real/device.hpp"
#include "real/model_kernels.hpp"
#include "sim/replay/tiny_model.hpp"
#include "tests/test_stream.hpp"

namespace hpz::real::model {
namespace {

using replay::UnitFn;

constexpr std::uint64_t kSeed = 42;
const Dims kTiny{32, 64, 128, 256};  // scenarios/tiny.toml
const Dims kOdd{5, 12, 20, 33};

replay::TinyDims tiny_dims(const Dims& d) {
  return {d.seq, d.hidden, d.ffn, d.vocab};
}

std::size_t area(int a, int b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
}

/** Parameters of a unit, the layout of tiny_model.hpp. */
std::uint64_t unit_numel(int fn, const Dims& d) {
  const std::uint64_t h = static_cast<std::uint64_t>(d.hidden);
  switch (static_cast<UnitFn>(fn)) {
    case UnitFn::kEmbed:
    case UnitFn::kHead:
      return static_cast<std::uint64_t>(d.vocab) * h;
    case UnitFn::kNorm:
      return h;
    case UnitFn::kAttn:
      return 4 * h * h;
    case UnitFn::kMlp:
      return 3 * h * static_cast<std::uint64_t>(d.ffn);
  }
  return 0;
}

/** Elements of a unit's output: [seq x hidden], the head's [seq x vocab]. */
std::size_t out_size(int fn, const Dims& d) {
  return area(d.seq, static_cast<UnitFn>(fn) == UnitFn::kHead ? d.vocab : d.hidden);
}

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

/** A unit's initial weights; the norms' all-ones gains are perturbed so that their gradients
 *  depend on the gain. */
std::vector<float> weights(int fn, const Dims& d) {
  std::vector<float> w =
      replay::initial_weights(static_cast<UnitFn>(fn), tiny_dims(d), unit_numel(fn, d), kSeed, fn);
  if (static_cast<UnitFn>(fn) == UnitFn::kNorm) {
    const std::vector<float> noise = activations(w.size(), 99);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] += 0.5f * noise[i];
  }
  return w;
}

std::vector<int> tokens_of(const Dims& d) {
  return replay::synthetic_tokens(tiny_dims(d), kSeed, 0, 0, 0);
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

::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "results differ in their bits";
}

// ---- Without a device ----

TEST(ModelKernelsScratch, CoversEveryShapeAndGrowsWithIt) {
  const std::size_t tiny = scratch_floats(kTiny);
  // The attention backward alone keeps ten [seq x hidden] intermediates.
  EXPECT_GE(tiny, 10 * area(kTiny.seq, kTiny.hidden));
  EXPECT_GE(tiny, 6 * area(kTiny.seq, kTiny.ffn));
  EXPECT_GE(tiny, area(kTiny.seq, kTiny.vocab));
  EXPECT_GT(scratch_floats({64, 64, 128, 256}), tiny);
  EXPECT_GT(scratch_floats({32, 64, 512, 256}), tiny);
  EXPECT_GT(scratch_floats({32, 64, 128, 4096}), tiny);
}

TEST(ModelKernelsArguments, UnknownUnitOrShortGradientIsInvalid) {
  float dummy = 0;
  EXPECT_EQ(unit_forward(5, kTiny, &dummy, &dummy, nullptr, &dummy, &dummy, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      unit_backward(-1, kTiny, 1, &dummy, &dummy, nullptr, &dummy, &dummy, &dummy, &dummy, nullptr),
      cudaErrorInvalidValue);
  const int attn = static_cast<int>(UnitFn::kAttn);
  EXPECT_EQ(unit_backward(attn, kTiny, unit_numel(attn, kTiny) - 1, &dummy, &dummy, nullptr, &dummy,
                          &dummy, &dummy, &dummy, nullptr),
            cudaErrorInvalidValue);
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

/** One unit's inputs on the host and the device. dx, dy and x hold the larger of an input and an
 *  output, so that aliased calls fit. */
struct UnitCase {
  int fn;
  Dims d;
  std::uint64_t numel;  // the unit's parameters and a tail that the backward must zero
  std::vector<float> w, x, dy;
  std::vector<int> tokens;
  DeviceArray<float> w_dev, x_dev, dy_dev, scratch;
  DeviceArray<int> tokens_dev;

  UnitCase(int unit_fn, const Dims& dims)
      : fn(unit_fn),
        d(dims),
        numel(unit_numel(unit_fn, dims) + 3),
        w(weights(unit_fn, dims)),
        x(activations(area(dims.seq, dims.hidden), 1)),
        dy(activations(out_size(unit_fn, dims), 2)),
        tokens(tokens_of(dims)),
        w_dev(w),
        x_dev(std::max(x.size(), out_size(unit_fn, dims))),
        dy_dev(std::max(dy.size(), x.size())),
        scratch(scratch_floats(dims)),
        tokens_dev(tokens) {
    x_dev.write(x);
    dy_dev.write(dy);
  }

  std::vector<float> cpu_forward() const {
    return replay::unit_forward(static_cast<UnitFn>(fn), tiny_dims(d), w, x, tokens);
  }
  std::vector<float> cpu_backward(std::vector<float>& dw) const {
    dw.assign(numel, 0.0f);
    return replay::unit_backward(static_cast<UnitFn>(fn), tiny_dims(d), w, x, tokens, dy, dw);
  }
  /** The GPU forward into y (x_dev itself when aliased). */
  std::vector<float> gpu_forward(cudaStream_t s, bool aliased) {
    DeviceArray<float> y(std::vector<float>(out_size(fn, d), 7.0f));
    float* out = aliased ? x_dev.get() : y.get();
    EXPECT_EQ(
        unit_forward(fn, d, w_dev.get(), x_dev.get(), tokens_dev.get(), out, scratch.get(), s),
        cudaSuccess);
    std::vector<float> result = (aliased ? x_dev : y).read(out_size(fn, d));
    x_dev.write(x);
    return result;
  }
  /** The GPU backward: dx (dy_dev itself when aliased) and dw. */
  std::vector<float> gpu_backward(cudaStream_t s, bool aliased, std::vector<float>& dw) {
    DeviceArray<float> dx(std::vector<float>(x.size(), 7.0f));
    DeviceArray<float> dw_dev(std::vector<float>(numel, 7.0f));
    float* out = aliased ? dy_dev.get() : dx.get();
    EXPECT_EQ(unit_backward(fn, d, numel, w_dev.get(), x_dev.get(), tokens_dev.get(), dy_dev.get(),
                            out, dw_dev.get(), scratch.get(), s),
              cudaSuccess);
    dw = dw_dev.read();
    std::vector<float> result = (aliased ? dy_dev : dx).read(x.size());
    dy_dev.write(dy);
    return result;
  }
};

std::string dims_name(const Dims& d) {
  return std::to_string(d.seq) + "x" + std::to_string(d.hidden) + "x" + std::to_string(d.ffn) +
         "x" + std::to_string(d.vocab);
}

class UnitKernels : public ::testing::TestWithParam<std::tuple<Dims, int>> {
 protected:
  void SetUp() override {
    const DeviceInfo info = probe_devices();  // real/device.hpp
    if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  }
  int fn() const { return std::get<1>(GetParam()); }
  const Dims& dims() const { return std::get<0>(GetParam()); }
};

TEST_P(UnitKernels, ForwardMatchesCpu) {
  UnitCase c(fn(), dims());
  TestStream s;
  EXPECT_TRUE(close_to(c.gpu_forward(s.get(), false), c.cpu_forward()));
}

TEST_P(UnitKernels, BackwardMatchesCpu) {
  UnitCase c(fn(), dims());
  TestStream s;
  std::vector<float> gpu_dw, cpu_dw;
  const std::vector<float> gpu_dx = c.gpu_backward(s.get(), false, gpu_dw);
  EXPECT_TRUE(close_to(gpu_dx, c.cpu_backward(cpu_dw))) << "dx";
  EXPECT_TRUE(close_to(gpu_dw, cpu_dw)) << "dw (with a tail to zero)";
}

TEST_P(UnitKernels, AliasedOutputsEqualSeparateOnes) {
  UnitCase c(fn(), dims());
  TestStream s;
  EXPECT_TRUE(same_bits(c.gpu_forward(s.get(), true), c.gpu_forward(s.get(), false))) << "y = x";
  std::vector<float> dw_aliased, dw;
  EXPECT_TRUE(
      same_bits(c.gpu_backward(s.get(), true, dw_aliased), c.gpu_backward(s.get(), false, dw)))
      << "dx = dy";
  EXPECT_TRUE(same_bits(dw_aliased, dw));
}

TEST_P(UnitKernels, TwoCallsGiveTheSameBits) {
  UnitCase c(fn(), dims());
  TestStream s;
  EXPECT_TRUE(same_bits(c.gpu_forward(s.get(), false), c.gpu_forward(s.get(), false)));
  std::vector<float> dw1, dw2;
  EXPECT_TRUE(same_bits(c.gpu_backward(s.get(), false, dw1), c.gpu_backward(s.get(), false, dw2)));
  EXPECT_TRUE(same_bits(dw1, dw2));
}

std::string unit_case_name(const ::testing::TestParamInfo<UnitKernels::ParamType>& p) {
  static const char* const kNames[] = {"embed", "norm", "attn", "mlp", "head"};
  return dims_name(std::get<0>(p.param)) + "_" + kNames[std::get<1>(p.param)];
}

INSTANTIATE_TEST_SUITE_P(TwoShapes, UnitKernels,
                         ::testing::Combine(::testing::Values(kTiny, kOdd), ::testing::Range(0, 5)),
                         unit_case_name);

/** The GPU loss of logits (written into `dlogits`, aliased when asked) and its dlogits. */
float gpu_loss(const Dims& d, const std::vector<float>& logits, bool aliased,
               std::vector<float>& dlogits) {
  TestStream s;
  DeviceArray<float> logits_dev(logits), out(logits.size()), loss(1), scratch(scratch_floats(d));
  DeviceArray<int> tokens(tokens_of(d));
  float* dl = aliased ? logits_dev.get() : out.get();
  EXPECT_EQ(
      next_token_loss(d, logits_dev.get(), tokens.get(), dl, loss.get(), scratch.get(), s.get()),
      cudaSuccess);
  dlogits = (aliased ? logits_dev : out).read();
  return loss.read()[0];
}

TEST(NextTokenLoss, MatchesCpuAliasedOrNot) {
  const DeviceInfo info = probe_devices();  // real/device.hpp
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  for (const Dims& d : {kTiny, kOdd}) {
    SCOPED_TRACE(dims_name(d));
    std::vector<float> logits = activations(area(d.seq, d.vocab), 3);
    for (float& v : logits) v *= 4.0f;
    std::vector<float> cpu_dl, gpu_dl, aliased_dl;
    const float cpu = replay::next_token_loss(tiny_dims(d), logits, tokens_of(d), cpu_dl);
    const float gpu = gpu_loss(d, logits, false, gpu_dl);
    EXPECT_TRUE(close_to({gpu}, {cpu})) << "loss";
    EXPECT_TRUE(close_to(gpu_dl, cpu_dl)) << "dlogits";
    EXPECT_EQ(gpu_loss(d, logits, true, aliased_dl), gpu);
    EXPECT_TRUE(same_bits(aliased_dl, gpu_dl));
    std::vector<float> again;
    EXPECT_TRUE(same_bits({gpu_loss(d, logits, false, again)}, {gpu}));
    EXPECT_TRUE(same_bits(again, gpu_dl));
  }
}

TEST(NextTokenLoss, NanInTheLastRowMakesTheLossNan) {
  const DeviceInfo info = probe_devices();  // real/device.hpp
  if (info.count == 0) GTEST_SKIP() << "no CUDA device: " << info.problem;
  std::vector<float> logits = activations(area(kTiny.seq, kTiny.vocab), 4);
  logits.back() = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> cpu_dl, gpu_dl;
  ASSERT_TRUE(
      std::isnan(replay::next_token_loss(tiny_dims(kTiny), logits, tokens_of(kTiny), cpu_dl)));
  EXPECT_TRUE(std::isnan(gpu_loss(kTiny, logits, false, gpu_dl)));
  EXPECT_TRUE(close_to(gpu_dl, cpu_dl));
}

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
  DeviceArray<double> scratch(scratch_floats(kTiny) / 2);
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
