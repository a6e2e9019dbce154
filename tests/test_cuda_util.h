// What the CUDA test suites share: whether a device is there, and skipping cleanly (with the reason) when not.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>

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
