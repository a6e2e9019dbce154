// Element-wise kernels (elementwise.h): a 2-D grid, x over columns, y over rows (capped; rows loop).
#include "elementwise.h"

namespace ds::kern {
namespace {

constexpr int THREADS = 256;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }

template <class T>
__global__ void __launch_bounds__(THREADS) add_bias_kernel(T* y, int64_t ld, const float* bias, int64_t rows, int cols) {
  const int c = int(blockIdx.x) * THREADS + int(threadIdx.x);
  if (c >= cols) return;
  const float b = bias[c];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) store(y + r * ld + c, load(y + r * ld + c) + b);
}

__global__ void __launch_bounds__(THREADS) silu_mul_kernel(const __nv_bfloat16* a, int64_t lda,
                                                           const __nv_bfloat16* b, int64_t ldb, __nv_bfloat16* out,
                                                           int64_t ldo, int64_t rows, int cols) {
  const int c = int(blockIdx.x) * THREADS + int(threadIdx.x);
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float g = __bfloat162float(a[r * lda + c]);
    out[r * ldo + c] = __float2bfloat16(g / (1.f + __expf(-g)) * __bfloat162float(b[r * ldb + c]));
  }
}

dim3 grid_of(int64_t rows, int cols) {
  return dim3(unsigned((cols + THREADS - 1) / THREADS), unsigned(rows < 65535 ? rows : 65535));
}

template <class T>
cudaError_t add_bias(T* y, int64_t ld, const float* bias, int64_t rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  add_bias_kernel<T><<<grid_of(rows, cols), THREADS, 0, stream>>>(y, ld, bias, rows, cols);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_add_bias(__nv_bfloat16* y, int64_t ld, const float* bias, int64_t rows, int cols,
                            cudaStream_t stream) {
  return add_bias(y, ld, bias, rows, cols, stream);
}
cudaError_t launch_add_bias(float* y, int64_t ld, const float* bias, int64_t rows, int cols, cudaStream_t stream) {
  return add_bias(y, ld, bias, rows, cols, stream);
}

cudaError_t launch_silu_mul(const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                            __nv_bfloat16* out, int64_t ldo, int64_t rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  silu_mul_kernel<<<grid_of(rows, cols), THREADS, 0, stream>>>(a, lda, b, ldb, out, ldo, rows, cols);
  return cudaGetLastError();
}

}  // namespace ds::kern
