// Element-wise kernels (elementwise.h): a 2-D grid, x over columns, y over rows (capped; rows loop).
#include "elementwise.h"
#include "align.h"
#include "silu.cuh"

#include <algorithm>
#include <cstdint>

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
    out[r * ldo + c] = __float2bfloat16(silu_mul(g, __bfloat162float(b[r * ldb + c])));
  }
}

// 8 columns per thread in 16-byte loads and stores (every pointer and stride a multiple of 8 elements), flat over
// rows x cols / 8.
__global__ void __launch_bounds__(THREADS) silu_mul_vec8_kernel(const uint4* a, int64_t lda8, const uint4* b,
                                                                int64_t ldb8, uint4* out, int64_t ldo8, int64_t rows,
                                                                int cols8) {
  const int64_t total = rows * cols8;
  for (int64_t i = int64_t(blockIdx.x) * THREADS + threadIdx.x; i < total; i += int64_t(gridDim.x) * THREADS) {
    const int64_t r = i / cols8;
    const int c = int(i - r * cols8);
    const uint4 va = a[r * lda8 + c], vb = b[r * ldb8 + c];
    const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&va);
    const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&vb);
    uint4 vo;
    __nv_bfloat162* po = reinterpret_cast<__nv_bfloat162*>(&vo);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 g = __bfloat1622float2(pa[k]), m = __bfloat1622float2(pb[k]);
      po[k] = __floats2bfloat162_rn(silu_mul(g.x, m.x), silu_mul(g.y, m.y));
    }
    out[r * ldo8 + c] = vo;
  }
}

__global__ void __launch_bounds__(THREADS) copy_row_kernel(const uint32_t* src, int64_t src_stride,
                                                           const int32_t* src_row, uint32_t* dst, int64_t dst_stride,
                                                           const int32_t* dst_row, int64_t words) {
  const int64_t i = int64_t(blockIdx.x) * THREADS + threadIdx.x;
  if (i >= words) return;
  const int64_t rs = src_row ? *src_row : 0, rd = dst_row ? *dst_row : 0;
  dst[rd * dst_stride + i] = src[rs * src_stride + i];
}

__global__ void __launch_bounds__(THREADS) copy_rows_kernel(const uint32_t* src, int64_t src_stride, uint32_t* dst,
                                                            int64_t dst_stride, const int32_t* row, int64_t words) {
  const int64_t i = int64_t(blockIdx.x) * THREADS + threadIdx.x;
  if (i >= words) return;
  const int64_t b = blockIdx.y;
  dst[b * dst_stride + int64_t(*row) * words + i] = src[b * src_stride + i];
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
  if (cols % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && ldo % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(out)) {
    const int64_t total = rows * (cols / 8);
    const int64_t blocks = std::min<int64_t>((total + THREADS - 1) / THREADS, int64_t(1) << 20);
    silu_mul_vec8_kernel<<<unsigned(blocks), THREADS, 0, stream>>>(
        reinterpret_cast<const uint4*>(a), lda / 8, reinterpret_cast<const uint4*>(b), ldb / 8,
        reinterpret_cast<uint4*>(out), ldo / 8, rows, cols / 8);
    return cudaGetLastError();
  }
  silu_mul_kernel<<<grid_of(rows, cols), THREADS, 0, stream>>>(a, lda, b, ldb, out, ldo, rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_copy_row(const void* src, int64_t src_stride, const int32_t* src_row, void* dst, int64_t dst_stride,
                            const int32_t* dst_row, int64_t row_bytes, cudaStream_t stream) {
  if (row_bytes <= 0) return cudaSuccess;
  if (row_bytes % 4 || src_stride % 4 || dst_stride % 4 || reinterpret_cast<uintptr_t>(src) % 4 ||
      reinterpret_cast<uintptr_t>(dst) % 4)
    return cudaErrorInvalidValue;
  const int64_t words = row_bytes / 4;
  copy_row_kernel<<<unsigned((words + THREADS - 1) / THREADS), THREADS, 0, stream>>>(
      static_cast<const uint32_t*>(src), src_stride / 4, src_row, static_cast<uint32_t*>(dst), dst_stride / 4, dst_row,
      words);
  return cudaGetLastError();
}

cudaError_t launch_copy_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, const int32_t* row,
                             int64_t row_bytes, int count, cudaStream_t stream) {
  if (row_bytes <= 0 || count <= 0) return cudaSuccess;
  if (row_bytes % 4 || src_stride % 4 || dst_stride % 4 || reinterpret_cast<uintptr_t>(src) % 4 ||
      reinterpret_cast<uintptr_t>(dst) % 4 || count > 65535)
    return cudaErrorInvalidValue;
  const int64_t words = row_bytes / 4;
  copy_rows_kernel<<<dim3(unsigned((words + THREADS - 1) / THREADS), unsigned(count)), THREADS, 0, stream>>>(
      static_cast<const uint32_t*>(src), src_stride / 4, static_cast<uint32_t*>(dst), dst_stride / 4, row, words);
  return cudaGetLastError();
}

namespace {
// max that keeps a NaN (fmaxf drops it)
__device__ __forceinline__ float max_nan(float a, float b) { return a != a ? a : b != b ? b : fmaxf(a, b); }

// A grid of a few blocks per SM striding over rows x cols (float4 where every row allows), one atomic per block.
template <int V>
__global__ void __launch_bounds__(THREADS) max_abs_kernel(const float* x, int64_t layer_stride, int64_t ld,
                                                          int64_t rows, int cols, unsigned int* slot) {
  x += int64_t(blockIdx.y) * layer_stride;
  slot += blockIdx.y;
  const int64_t per_row = cols / V, total = rows * per_row;
  float m = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * THREADS + threadIdx.x; i < total; i += int64_t(gridDim.x) * THREADS) {
    const int64_t r = i / per_row, c = (i - r * per_row) * V;
    if constexpr (V == 4) {
      const float4 v = *reinterpret_cast<const float4*>(x + r * ld + c);
      m = max_nan(max_nan(m, fabsf(v.x)), max_nan(fabsf(v.y), max_nan(fabsf(v.z), fabsf(v.w))));
    } else {
      m = max_nan(m, fabsf(x[r * ld + c]));
    }
  }
  for (int o = 16; o > 0; o >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[THREADS / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < THREADS / 32; ++w) m = max_nan(m, warp_max[w]);
    atomicMax(slot, __float_as_uint(fabsf(m)));
  }
}
}  // namespace

cudaError_t launch_max_abs_many(const float* x, int64_t layer_stride, int count, int64_t ld, int64_t rows, int cols,
                                float* slot, cudaStream_t stream) {
  if (rows < 0 || cols < 0 || ld < cols || count < 0 || count > 65535 || !slot || (rows > 0 && cols > 0 && !x))
    return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0 || count == 0) return cudaSuccess;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return cudaGetLastError();
  const bool vec = cols % 4 == 0 && ld % 4 == 0 && layer_stride % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t items = rows * (vec ? cols / 4 : cols);
  const int64_t per_tensor = std::max<int64_t>(1, (4 * int64_t(sms) + count - 1) / count);
  const dim3 grid(unsigned(std::max<int64_t>(1, std::min<int64_t>((items + THREADS - 1) / THREADS, per_tensor))),
                  unsigned(count));
  auto* s = reinterpret_cast<unsigned int*>(slot);
  if (vec) max_abs_kernel<4><<<grid, THREADS, 0, stream>>>(x, layer_stride, ld, rows, cols, s);
  else max_abs_kernel<1><<<grid, THREADS, 0, stream>>>(x, layer_stride, ld, rows, cols, s);
  return cudaGetLastError();
}

namespace {
__global__ void scale_columns_kernel(__nv_bfloat16* x, int64_t ld, int64_t rows, int c0, int width, float f) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  __nv_bfloat16* p = x + (i / width) * ld + c0 + i % width;
  *p = __float2bfloat16(__bfloat162float(*p) * f);
}
}  // namespace

cudaError_t launch_scale_columns(__nv_bfloat16* x, int64_t ld, int64_t rows, int c0, int c1, float f,
                                 cudaStream_t stream) {
  if (rows < 0 || c0 < 0 || c1 < c0 || ld < c1 || (rows > 0 && c1 > c0 && !x)) return cudaErrorInvalidValue;
  const int64_t items = rows * (c1 - c0);
  if (items == 0) return cudaSuccess;
  scale_columns_kernel<<<unsigned((items + THREADS - 1) / THREADS), THREADS, 0, stream>>>(x, ld, rows, c0, c1 - c0, f);
  return cudaGetLastError();
}

namespace {
// One block per column: the sum over the rows, then the mean.
__global__ void column_mean_kernel(const __nv_bfloat16* x, int64_t ld, int64_t rows, int c0, float* mean) {
  __shared__ float part[THREADS];
  const int c = int(blockIdx.x);
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += THREADS) s += __bfloat162float(x[r * ld + c0 + c]);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = THREADS / 2; k > 0; k >>= 1) {
    if (int(threadIdx.x) < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) mean[c] = part[0] / float(rows);
}
__global__ void fill_columns_kernel(__nv_bfloat16* x, int64_t ld, int64_t rows, int c0, int width, const float* v) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  x[(i / width) * ld + c0 + i % width] = __float2bfloat16(v[i % width]);
}
}  // namespace

cudaError_t launch_mean_columns(__nv_bfloat16* x, int64_t ld, int64_t rows, int c0, int c1, float* mean, bool compute,
                                cudaStream_t stream) {
  if (rows < 0 || c0 < 0 || c1 < c0 || ld < c1 || !mean || (rows > 0 && c1 > c0 && !x)) return cudaErrorInvalidValue;
  const int width = c1 - c0;
  if (rows == 0 || width == 0) return cudaSuccess;
  if (compute) column_mean_kernel<<<unsigned(width), THREADS, 0, stream>>>(x, ld, rows, c0, mean);
  const int64_t items = rows * width;
  fill_columns_kernel<<<unsigned((items + THREADS - 1) / THREADS), THREADS, 0, stream>>>(x, ld, rows, c0, width, mean);
  return cudaGetLastError();
}

cudaError_t launch_max_abs(const float* x, int64_t ld, int64_t rows, int cols, float* slot, cudaStream_t stream) {
  return launch_max_abs_many(x, 0, 1, ld, rows, cols, slot, stream);
}

}  // namespace ds::kern
