// Move-only RAII owners for the CUDA backend's resources: device buffers, pinned host buffers, events, streams,
// cuBLAS and cuBLASLt handles, and the current device.
// Allocation failures become ds::Error saying what was being allocated, how much, and how much was free.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "engine/cuda/detail/backend_cuda_check.h"

namespace ds::cuda {

inline std::string gib(size_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", double(bytes) / double(1ull << 30));
  return b;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      p_ = nullptr;
      throw Error("CUDA: out of GPU memory allocating " + gib(bytes) + " for " + what + " (" + gib(free_b) +
                  " free of " + gib(total_b) + "); HINT: use a shorter prompt, close other programs using the GPU, "
                  "or run with --backend cpu");
    }
    check_cuda(e, "cudaMalloc", __FILE__, __LINE__);
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) DS_CUDA_CHECK(cudaMallocHost(&p_, bytes));
  }
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFreeHost(p_);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host memory of the host caches (backend_cuda_host_caches.cpp; tens of GB): mapped with transparent huge
// pages, its pages faulted in by several threads, then registered with CUDA as portable (every GPU's copies run at
// full speed). cudaMallocHost pins such sizes on one thread. DS_HOST_CACHES_REGISTER=0: cudaMallocHost (A/B).
class HostCacheBuffer {
 public:
  HostCacheBuffer() = default;
  explicit HostCacheBuffer(size_t bytes);  // throws ds::Error
  ~HostCacheBuffer() { release(); }
  HostCacheBuffer(HostCacheBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), mapped_(o.mapped_) {}
  HostCacheBuffer& operator=(HostCacheBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      mapped_ = o.mapped_;
    }
    return *this;
  }
  HostCacheBuffer(const HostCacheBuffer&) = delete;
  HostCacheBuffer& operator=(const HostCacheBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;  // mmap + cudaHostRegister (else cudaMallocHost)
};

class CudaEvent {
 public:
  CudaEvent() { DS_CUDA_CHECK(cudaEventCreate(&e_)); }
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    if (this != &o) {
      if (e_) cudaEventDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Owners of the C handles: one deleter each, so that nothing leaks when a constructor throws half-way.
struct StreamDeleter {
  void operator()(cudaStream_t s) const {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;
struct CublasDeleter {
  void operator()(cublasHandle_t h) const { cublasDestroy(h); }
};
using CublasPtr = std::unique_ptr<cublasContext, CublasDeleter>;
struct CublasLtDeleter {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};
using CublasLtPtr = std::unique_ptr<cublasLtContext, CublasLtDeleter>;
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using PreferencePtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;
inline PreferencePtr make_preference() {
  cublasLtMatmulPreference_t p = nullptr;
  DS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p));
  return PreferencePtr(p);
}

// Makes `device` current for a scope and restores the previous one: every entry point of a backend that owns a
// device other than 0 runs on its device, whichever thread calls it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    DS_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) DS_CUDA_CHECK(cudaSetDevice(device));
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace ds::cuda
