// The one CHECK macro family for CUDA runtime and cuBLAS calls: a failure throws ds::Error naming the failing
// statement, file and line. Out-of-memory gets its own message with a hint, since users cause it (long prompts,
// big models, other programs on the GPU).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "engine/core/error.h"

namespace ds::cuda {

[[noreturn]] inline void fail_cuda(cudaError_t e, const char* stmt, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the context stays usable
  if (e == cudaErrorMemoryAllocation)
    throw Error(std::string("CUDA: out of GPU memory in ") + stmt + " (" + file + ":" + std::to_string(line) +
                "); HINT: use a shorter prompt, close other programs using the GPU, or run with --backend cpu");
  throw Error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + stmt +
              " at " + file + ":" + std::to_string(line));
}

inline void check_cuda(cudaError_t e, const char* stmt, const char* file, int line) {
  if (e != cudaSuccess) fail_cuda(e, stmt, file, line);
}

inline void check_cublas(cublasStatus_t s, const char* stmt, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  if (s == CUBLAS_STATUS_ALLOC_FAILED) fail_cuda(cudaErrorMemoryAllocation, stmt, file, line);
  throw Error(std::string("cuBLAS error ") + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ") in " + stmt +
              " at " + file + ":" + std::to_string(line));
}

}  // namespace ds::cuda

#define DS_CUDA_CHECK(stmt) ::ds::cuda::check_cuda((stmt), #stmt, __FILE__, __LINE__)
#define DS_CUBLAS_CHECK(stmt) ::ds::cuda::check_cublas((stmt), #stmt, __FILE__, __LINE__)
