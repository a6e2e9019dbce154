// The CUDA backend (library diffscope_cuda): how to make one, and what it offers beyond the Backend interface
// (backend.h): the profiling switch. In a build without CUDA the
// session layer's cuda_unavailable.cpp stands in: make_cuda_backend() throws and cuda_backend_available() says why.
// `b` below must come from make_cuda_backend() (ds::Error otherwise).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/backend.h"

namespace ds {

// The CUDA backend on GPU `device` (0 = the first); every entry point of it runs on that device, whichever thread
// calls it. Throws ds::Error saying why when CUDA is not compiled in or no usable device is present.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
bool cuda_backend_available(std::string* why_not, int device = 0);

// Profiling (CUDA events per kernel, %globaltimer per attention block) is on by default; it costs a few
// microseconds of launch time per kernel. Off: profile() reports only forward_ms.
void cuda_set_profiling(Backend& b, bool on);

// How many GEMM shapes this process has timed (the autotuner, DS_GEMM_AUTOTUNE: the first of each length bucket on
// each kind of GPU); 0 in a build without CUDA.
int64_t cuda_gemm_timings();
// How many outlier passes over attention logits this process ran on the fused Hopper kernel
// (kern::launch_logit_pass_sm90) rather than the batched GEMM's rows; 0 in a build without CUDA.
int64_t cuda_logit_pass_launches();

// Usable CUDA devices (compute capability 8.0 or newer); 0 in a build without CUDA or without a driver.
int cuda_device_count();
// Free memory on GPU `device` in bytes (0 when it cannot be asked).
int64_t cuda_free_memory(int device);
// Lets GPUs a and b copy to each other directly (NVLink or PCIe peer to peer) where they can; false where they cannot
// (the copies are then staged by the driver).
bool cuda_enable_peer(int a, int b);

// Float memory on GPU `device` that a caller owns (the Python module's device arrays, handed out through DLPack):
// freed when the last holder drops it, whatever became of the backend. Throws ds::Error when it cannot be had.
struct DeviceFloats {
  float* data = nullptr;
  size_t count = 0;
  int device = 0;
  DeviceFloats() = default;
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats();
};
std::shared_ptr<DeviceFloats> cuda_device_floats(size_t count, int device);

}  // namespace ds
