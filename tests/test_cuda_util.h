// What the CUDA test suites share: whether a device is there, and skipping cleanly (with the reason) when not.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/cuda/detail/backend_cuda_memory.h"

inline bool device_present(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = cudaGetErrorString(e);
    return false;
  }
  if (count == 0) *why = "cudaGetDeviceCount returned 0";
  return count > 0;
}

#define SKIP_WITHOUT_DEVICE()                                              \
  do {                                                                     \
    std::string why_;                                                      \
    if (!device_present(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

// Under compute-sanitizer (slow) the suites run a reduced set of sizes.
inline bool small_run() { return std::getenv("DS_CUDA_TEST_SMALL") != nullptr; }

// Host vectors to and from device buffers (an empty vector still gets a small buffer, so pointers stay valid).
template <class T>
ds::cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  ds::cuda::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16), "test input");
  if (!v.empty()) DS_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}
template <class T>
std::vector<T> to_host(const ds::cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  DS_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
