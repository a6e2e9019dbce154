// RMSNorm, transformers' LlamaRMSNorm in f32: variance = mean(x^2); y = weight * (x * rsqrt(variance + eps)).
// One block per row; the residual stream stays f32, the normalised row goes out in bf16 for the tensor cores.
// Memory-bound (6 bytes per element): rows of up to 32768 f32 whose width is a multiple of 4 are read once with
// 16-byte loads into registers, several per thread issued back to back, and kept there for the scaling pass; small
// blocks (128 threads for 2048 wide rows) keep many rows in flight per SM. Other rows take the two-pass kernel.
#include "rmsnorm.h"

#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 256;  // the two-pass kernel
constexpr int REG_TARGET_THREADS = 128;  // register kernel: fewest float4 per thread that fits a row in this many
constexpr int REG_MAX_VPT = 8;

// Sum over the block, returned to every thread. blockDim.x is a multiple of 32, at most 1024.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float red[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

__device__ __forceinline__ uint2 scale_pack(float4 v, float4 w, float inv) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(w.x * (v.x * inv), w.y * (v.y * inv));
  __nv_bfloat162 hi = __floats2bfloat162_rn(w.z * (v.z * inv), w.w * (v.w * inv));
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  return packed;
}

// Thread t holds float4 vectors t, t + blockDim.x, ... (VPT of them) of its row: coalesced, and x is read once.
template <int VPT>
__global__ void __launch_bounds__(1024) rmsnorm_reg_kernel(const float* x, int64_t x_stride, const float* w,
                                                           __nv_bfloat16* y, int64_t y_stride, int cols, float eps) {
  const int nvec = cols >> 2;
  const float4* xr = reinterpret_cast<const float4*>(x + int64_t(blockIdx.x) * x_stride);
  float4 v[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = int(threadIdx.x) + j * int(blockDim.x);
    v[j] = i < nvec ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) ss = fmaf(v[j].x, v[j].x, fmaf(v[j].y, v[j].y, fmaf(v[j].z, v[j].z, fmaf(v[j].w, v[j].w, ss))));
  const float inv = rsqrtf(block_sum(ss) / float(cols) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  uint2* yr = reinterpret_cast<uint2*>(y + int64_t(blockIdx.x) * y_stride);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = int(threadIdx.x) + j * int(blockDim.x);
    if (i < nvec) yr[i] = scale_pack(v[j], w4[i], inv);
  }
}

// Any width, stride or alignment: sum of squares, then a second read of the row for the scaling.
__global__ void __launch_bounds__(THREADS) rmsnorm_kernel(const float* x, int64_t x_stride, const float* w,
                                                          __nv_bfloat16* y, int64_t y_stride, int cols, float eps,
                                                          bool vec) {
  const float* xr = x + int64_t(blockIdx.x) * x_stride;
  __nv_bfloat16* yr = y + int64_t(blockIdx.x) * y_stride;
  float ss = 0.f;
  if (vec) {
    for (int i = int(threadIdx.x) * 4; i < cols; i += THREADS * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + i);
      ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
    }
  } else {
    for (int i = int(threadIdx.x); i < cols; i += THREADS) ss = fmaf(xr[i], xr[i], ss);
  }
  const float inv = rsqrtf(block_sum(ss) / float(cols) + eps);
  if (vec) {
    for (int i = int(threadIdx.x) * 4; i < cols; i += THREADS * 4)
      *reinterpret_cast<uint2*>(yr + i) =
          scale_pack(*reinterpret_cast<const float4*>(xr + i), *reinterpret_cast<const float4*>(w + i), inv);
  } else {
    for (int i = int(threadIdx.x); i < cols; i += THREADS) yr[i] = __float2bfloat16(w[i] * (xr[i] * inv));
  }
}

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; }

template <int VPT>
void launch_reg(int nvec, unsigned rows, const float* x, int64_t x_stride, const float* w, __nv_bfloat16* y,
                int64_t y_stride, int cols, float eps, cudaStream_t stream) {
  const int threads = ((nvec + VPT - 1) / VPT + 31) / 32 * 32;
  rmsnorm_reg_kernel<VPT><<<rows, threads, 0, stream>>>(x, x_stride, w, y, y_stride, cols, eps);
}

}  // namespace

cudaError_t launch_rmsnorm(const float* x, int64_t x_stride, const float* w, __nv_bfloat16* y, int64_t y_stride,
                           int64_t rows, int cols, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  // 16-byte loads of x and w and 8-byte stores of y need every row start aligned, not just the bases.
  const bool vec = cols % 4 == 0 && x_stride % 4 == 0 && y_stride % 4 == 0 && aligned(x, 16) && aligned(w, 16) &&
                   aligned(y, 8);
  const int nvec = cols / 4;
  const unsigned r = unsigned(rows);
  if (vec && nvec <= 1024 * REG_MAX_VPT) {
    if (nvec <= REG_TARGET_THREADS) launch_reg<1>(nvec, r, x, x_stride, w, y, y_stride, cols, eps, stream);
    else if (nvec <= 2 * REG_TARGET_THREADS) launch_reg<2>(nvec, r, x, x_stride, w, y, y_stride, cols, eps, stream);
    else if (nvec <= 4 * REG_TARGET_THREADS) launch_reg<4>(nvec, r, x, x_stride, w, y, y_stride, cols, eps, stream);
    else launch_reg<8>(nvec, r, x, x_stride, w, y, y_stride, cols, eps, stream);
  } else {
    rmsnorm_kernel<<<r, THREADS, 0, stream>>>(x, x_stride, w, y, y_stride, cols, eps, vec);
  }
  return cudaGetLastError();
}

}  // namespace ds::kern
