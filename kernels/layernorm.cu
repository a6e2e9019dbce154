// LayerNorm (layernorm.h): one block per row; the mean, then the centred sum of squares, then the scaled row. Where
// the row is 16-byte vectors that fit the block's registers (layernorm_vec4_kernel) it is read once; otherwise
// (layernorm_kernel) three times, the second and third from L1/L2.
#include "layernorm.h"

#include "align.h"

#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 256;

__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < THREADS / 32; ++i) s += red[i];
  __syncthreads();  // red is reused by the next reduction
  return s;
}

__global__ void __launch_bounds__(THREADS) layernorm_kernel(const float* x, int64_t x_stride, const float* w,
                                                            const float* b, __nv_bfloat16* y, int64_t y_stride,
                                                            int cols, float eps) {
  __shared__ float red[THREADS / 32];
  const float* xr = x + int64_t(blockIdx.x) * x_stride;
  __nv_bfloat16* yr = y + int64_t(blockIdx.x) * y_stride;
  float s = 0.f;
  for (int i = int(threadIdx.x); i < cols; i += THREADS) s += xr[i];
  const float mean = block_sum(s, red) / float(cols);
  float ss = 0.f;
  for (int i = int(threadIdx.x); i < cols; i += THREADS) {
    const float c = xr[i] - mean;
    ss = fmaf(c, c, ss);
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(cols) + eps);
  for (int i = int(threadIdx.x); i < cols; i += THREADS) yr[i] = __float2bfloat16(fmaf((xr[i] - mean) * inv, w[i], b[i]));
}

// Up to V float4 of the row per thread, kept in registers between the two reductions and the output (cols a
// multiple of 4 and at most 4 V THREADS; x, w, b 16-byte aligned, y 8-byte aligned, strides multiples of 4). At
// Phi-4-mini-flash's 2560 columns the row is read once instead of three times: a 32K-token prefill's 65 norms took
// 13.8 ms and take 10.5, the copy rate (H100).
template <int V>
__global__ void __launch_bounds__(THREADS) layernorm_vec4_kernel(const float* x, int64_t x_stride, const float* w,
                                                                 const float* b, __nv_bfloat16* y, int64_t y_stride,
                                                                 int cols, float eps) {
  __shared__ float red[THREADS / 32];
  const int n4 = cols / 4;
  const float4* xr = reinterpret_cast<const float4*>(x + int64_t(blockIdx.x) * x_stride);
  float4 v[V];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = int(threadIdx.x) + k * THREADS;
    v[k] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
  }
  const float mean = block_sum(s, red) / float(cols);
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    if (int(threadIdx.x) + k * THREADS < n4) {
      const float cx = v[k].x - mean, cy = v[k].y - mean, cz = v[k].z - mean, cw = v[k].w - mean;
      ss = fmaf(cx, cx, ss), ss = fmaf(cy, cy, ss), ss = fmaf(cz, cz, ss), ss = fmaf(cw, cw, ss);
    }
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(cols) + eps);
  __nv_bfloat16* yr = y + int64_t(blockIdx.x) * y_stride;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = int(threadIdx.x) + k * THREADS;
    if (i < n4) {
      const float4 wv = reinterpret_cast<const float4*>(w)[i], bv = reinterpret_cast<const float4*>(b)[i];
      __nv_bfloat162 o[2] = {__floats2bfloat162_rn(fmaf((v[k].x - mean) * inv, wv.x, bv.x),
                                                   fmaf((v[k].y - mean) * inv, wv.y, bv.y)),
                             __floats2bfloat162_rn(fmaf((v[k].z - mean) * inv, wv.z, bv.z),
                                                   fmaf((v[k].w - mean) * inv, wv.w, bv.w))};
      *reinterpret_cast<uint2*>(yr + 4 * i) = *reinterpret_cast<const uint2*>(o);
    }
  }
}
constexpr int VEC4_MAX = 4;  // float4 per thread: rows up to 4096 columns

}  // namespace

cudaError_t launch_layernorm(const float* x, int64_t x_stride, const float* w, const float* b, __nv_bfloat16* y,
                             int64_t y_stride, int64_t rows, int cols, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cols <= 0 || rows > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
  const int n4 = cols / 4;
  if (cols % 4 == 0 && n4 <= VEC4_MAX * THREADS && x_stride % 4 == 0 && y_stride % 4 == 0 && aligned16(x) &&
      aligned16(w) && aligned16(b) && aligned8(y)) {
    const int v = (n4 + THREADS - 1) / THREADS;
    const auto go = [&](auto kern) {
      kern<<<unsigned(rows), THREADS, 0, stream>>>(x, x_stride, w, b, y, y_stride, cols, eps);
    };
    if (v <= 1) go(layernorm_vec4_kernel<1>);
    else if (v == 2) go(layernorm_vec4_kernel<2>);
    else if (v == 3) go(layernorm_vec4_kernel<3>);
    else go(layernorm_vec4_kernel<4>);
    return cudaGetLastError();
  }
  layernorm_kernel<<<unsigned(rows), THREADS, 0, stream>>>(x, x_stride, w, b, y, y_stride, cols, eps);
  return cudaGetLastError();
}

}  // namespace ds::kern
