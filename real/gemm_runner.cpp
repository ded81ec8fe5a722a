#include "real/gemm_runner.hpp"

#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "real/elements.hpp"

namespace hpz::real {
namespace {

void check(cudaError_t err, const char* what, int line) {
  if (err != cudaSuccess) {
    throw std::runtime_error(fmt::format("{} (gemm_runner.cpp:{}): {} ({})", what, line,
                                         cudaGetErrorString(err), static_cast<int>(err)));
  }
}
void check(cublasStatus_t status, const char* what, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(fmt::format("{} (gemm_runner.cpp:{}): {} ({})", what, line,
                                         cublasGetStatusString(status), static_cast<int>(status)));
  }
}
#define HPZ_CHECK(call) check((call), #call, __LINE__)

// Owners that release best effort: they run in destructors and during stack unwinding.
struct DeviceFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
struct HandleDestroy {
  void operator()(cublasHandle_t h) const noexcept { cublasDestroy(h); }
};
struct StreamDestroy {
  void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;
using HandleOwner = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, HandleDestroy>;
using StreamOwner = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;

DeviceBuffer device_alloc(std::uint64_t bytes) {
  void* p = nullptr;
  HPZ_CHECK(cudaMalloc(&p, bytes));
  return DeviceBuffer(p);
}

// Multiples of 1/1024 in [-0.5, 0.5): exact in fp16, and a dot product of k of them stays within
// k / 4, far inside fp16's range for any hidden size. Not zeros: a GEMM on zeros draws less
// power and can run faster than one on real data.
float scratch_value(std::uint64_t i) {
  const auto bits = static_cast<int>((i * 0x9E3779B97F4A7C15ULL) >> 54);
  return static_cast<float>(bits - 512) / 1024.0F;
}

// Fills n elements: one chunk from the host, then device copies that double the filled prefix.
void fill_scratch(void* dst, std::uint64_t n, int eb) {
  const std::uint64_t chunk = std::min<std::uint64_t>(n, 1ULL << 20);
  const auto width = static_cast<std::uint64_t>(eb);
  std::vector<std::uint8_t> host(chunk * width);
  for (std::uint64_t i = 0; i < chunk; ++i) store(host.data(), i, eb, scratch_value(i));
  HPZ_CHECK(cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice));
  auto* d = static_cast<std::uint8_t*>(dst);
  for (std::uint64_t done = chunk; done < n;) {
    const std::uint64_t len = std::min(done, n - done);
    HPZ_CHECK(cudaMemcpy(d + done * width, d, len * width, cudaMemcpyDeviceToDevice));
    done += len;
  }
}

bool fits(const GemmShape& g, const GemmShape& max) {
  return g.m >= 1 && g.n >= 1 && g.k >= 1 && g.m <= max.m && g.n <= max.n && g.k <= max.k;
}

}  // namespace

struct GemmRunner::State {
  struct RankGemm {
    DeviceBuffer workspace;  // declared before the handle, so freed after it
    HandleOwner handle;
    cudaStream_t stream = nullptr;  // the stream the handle is bound to
    bool bound = false;
  };
  GemmShape max;
  cudaDataType_t type = CUDA_R_16F;
  DeviceBuffer a, b, c;
  std::vector<RankGemm> ranks;
  StreamOwner warm;  // warm_up()'s stream

  // cublasSetStream puts the handle back on cuBLAS's default workspace, so the rank's own is
  // set again after it; both only when the stream changes.
  void bind(RankGemm& rg, cudaStream_t stream) const {
    if (rg.bound && rg.stream == stream) return;
    HPZ_CHECK(cublasSetStream(rg.handle.get(), stream));
    HPZ_CHECK(cublasSetWorkspace(rg.handle.get(), rg.workspace.get(), kGemmWorkspaceBytes));
    rg.stream = stream;
    rg.bound = true;
  }
};

GemmRunner::GemmRunner(int ranks, GemmShape max, int element_bytes)
    : state_(std::make_unique<State>()) {
  if (ranks < 1) throw std::invalid_argument("GemmRunner: ranks must be at least 1");
  if (element_bytes != 2 && element_bytes != 4) {
    throw std::invalid_argument(
        fmt::format("GemmRunner: element_bytes {} (allowed: 2, 4)", element_bytes));
  }
  constexpr auto kIntMax = static_cast<std::uint64_t>(INT_MAX);
  if (!fits(max, {kIntMax, kIntMax, kIntMax})) {
    throw std::invalid_argument(fmt::format("GemmRunner: shape {} x {} x {} (each from 1 to {})",
                                            max.m, max.n, max.k, INT_MAX));
  }
  State& s = *state_;
  s.max = max;
  s.type = element_bytes == 2 ? CUDA_R_16F : CUDA_R_32F;
  const auto width = static_cast<std::uint64_t>(element_bytes);
  s.a = device_alloc(max.m * max.k * width);
  fill_scratch(s.a.get(), max.m * max.k, element_bytes);
  s.b = device_alloc(max.k * max.n * width);
  fill_scratch(s.b.get(), max.k * max.n, element_bytes);
  s.c = device_alloc(max.m * max.n * width);
  HPZ_CHECK(cudaMemset(s.c.get(), 0, max.m * max.n * width));
  s.ranks.resize(static_cast<std::size_t>(ranks));
  for (State::RankGemm& rg : s.ranks) {
    rg.workspace = device_alloc(kGemmWorkspaceBytes);
    cublasHandle_t h = nullptr;
    HPZ_CHECK(cublasCreate(&h));
    rg.handle.reset(h);
  }
  cudaStream_t warm = nullptr;
  HPZ_CHECK(cudaStreamCreateWithFlags(&warm, cudaStreamNonBlocking));
  s.warm.reset(warm);
  // The fill ran on the legacy default stream, which the ranks' non-blocking streams do not
  // wait for.
  HPZ_CHECK(cudaDeviceSynchronize());
}

GemmRunner::~GemmRunner() {
  // Best effort: GEMMs may still be reading the scratch that is about to be freed.
  if (state_ != nullptr) cudaDeviceSynchronize();
}

void GemmRunner::warm_up(const std::vector<GemmShape>& shapes) {
  State& s = *state_;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    for (const GemmShape& g : shapes) run(static_cast<int>(r), s.warm.get(), g);
  }
  HPZ_CHECK(cudaStreamSynchronize(s.warm.get()));
}

void GemmRunner::run(int rank, cudaStream_t stream, const GemmShape& g) {
  State& s = *state_;
  if (!fits(g, s.max)) {
    throw std::invalid_argument(fmt::format("GemmRunner: GEMM {} x {} x {} exceeds {} x {} x {}",
                                            g.m, g.n, g.k, s.max.m, s.max.n, s.max.k));
  }
  State::RankGemm& rg = s.ranks.at(static_cast<std::size_t>(rank));
  s.bind(rg, stream);
  const auto m = static_cast<int>(g.m);
  const auto n = static_cast<int>(g.n);
  const auto k = static_cast<int>(g.k);
  const float alpha = 1.0F;
  const float beta = 0.0F;
  // Column-major C[m x n] = A[m x k] B[k x n], each packed (leading dimensions m, k, m).
  HPZ_CHECK(cublasGemmEx(rg.handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, s.a.get(),
                         s.type, m, s.b.get(), s.type, k, &beta, s.c.get(), s.type, m,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace hpz::real
