// A CUDA stream for GPU tests (tests built with CUDA only).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace hpz::test {

/** A non-blocking stream, destroyed at scope exit. */
class TestStream {
 public:
  TestStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~TestStream() { cudaStreamDestroy(s_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace hpz::test
