// The implicit attention of one Mamba channel, pooled on the device (mamba_implicit.h).
#include "mamba_implicit.h"

#include "attn_heads.h"
#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int STEPS_THREADS = 1024, VIEW_THREADS = 256, MAX_STATE = 16;

// log(1 + e^x), x itself above 20 (the published threshold, as F.softplus and the scan).
__device__ __forceinline__ float softplus_exact(float x) { return x <= 20.f ? log1pf(expf(x)) : x; }

// Thread i takes tokens [i * per, (i + 1) * per): its sum, an exclusive scan of the sums across the block, then its
// prefix sums written.
__global__ void __launch_bounds__(STEPS_THREADS) channel_steps_kernel(const __nv_bfloat16* dt, int64_t ld_dt,
                                                                      int channel, const float* dt_bias, int64_t n,
                                                                      float* delta, double* cum) {
  __shared__ double warp_sums[STEPS_THREADS / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t per = (n + STEPS_THREADS - 1) / STEPS_THREADS, t0 = tid * per, t1 = t0 + per < n ? t0 + per : n;
  const float bias = dt_bias[channel];
  double sum = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const float d = softplus_exact(__bfloat162float(dt[t * ld_dt + channel]) + bias);
    delta[t] = d;
    sum += d;
  }
  double incl = sum;  // inclusive scan within the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    double w = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  double run = incl - sum + (warp > 0 ? warp_sums[warp - 1] : 0.0);  // exclusive prefix of this thread's tokens
  for (int64_t t = t0; t < t1; ++t) {
    run += double(delta[t]);
    cum[t] = run;
  }
}

// One warp per grid cell: the lanes take the block's entries in turn (keys fastest) and fold them; lane 0 writes.
__global__ void __launch_bounds__(VIEW_THREADS) implicit_view_kernel(const float* delta, const double* cum,
                                                                     const __nv_bfloat16* B, const __nv_bfloat16* C,
                                                                     int64_t ld_bc, const float* A, int S,
                                                                     ViewPoolArgs v, float* grid) {
  const int64_t cell = (int64_t(blockIdx.x) * VIEW_THREADS + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (cell >= int64_t(v.rows) * v.cols) return;
  const int bi = int(cell / v.cols), bj = int(cell % v.cols);
  const int64_t Er = v.q1 - v.q0, Ec = v.k1 - v.k0;
  const int64_t r0 = v.q0 + view_block_start(bi, Er, v.rows), r1 = v.q0 + view_block_start(bi + 1, Er, v.rows);
  const int64_t c0 = v.k0 + view_block_start(bj, Ec, v.cols), c1 = v.k0 + view_block_start(bj + 1, Ec, v.cols);
  const int64_t w = c1 - c0, count = (r1 - r0) * w;  // w >= 1: the grid is capped at the rectangle's extent
  float a[MAX_STATE];
#pragma unroll
  for (int s = 0; s < MAX_STATE; ++s) a[s] = s < S ? A[s] * 1.4426950408889634f : 0.f;  // exp(x) = exp2(x log2 e)
  float acc = 0.f;  // 0 is where both pools start: masked cells count as 0
  // Entry e of the block is (r0 + e / w, c0 + e % w); lane l takes e = l, l + 32, ...
  int64_t q = r0 + lane / w, k = c0 + lane % w;
  for (int64_t e = lane; e < count; e += 32) {
    float x = 0.f;  // masked cells (k > q) are 0
    if (k <= q) {
      const float dc = float(cum[q] - cum[k]);
      const __nv_bfloat16 *cq = C + q * ld_bc, *bk = B + k * ld_bc;
      float m = 0.f;
#pragma unroll
      for (int s = 0; s < MAX_STATE; ++s)
        if (s < S) m = fmaf(__bfloat162float(cq[s]) * exp2f(a[s] * dc), __bfloat162float(bk[s]), m);
      x = delta[k] * m;
    }
    acc = pool_op(acc, x, v.mean, true);
    for (k += 32; k >= c1; k -= w) ++q;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, acc, o);
    acc = pool_op(acc, y, v.mean, true);  // lanes without entries hold 0, which neither pool changes
  }
  if (lane == 0) grid[cell] = v.mean ? float(double(acc) / double(count)) : acc;
}

}  // namespace

cudaError_t launch_mamba_channel_steps(const __nv_bfloat16* dt, int64_t ld_dt, int channel, const float* dt_bias,
                                       int64_t n, float* delta, double* cum, cudaStream_t stream) {
  if (n <= 0 || channel < 0) return cudaErrorInvalidValue;
  channel_steps_kernel<<<1, STEPS_THREADS, 0, stream>>>(dt, ld_dt, channel, dt_bias, n, delta, cum);
  return cudaGetLastError();
}

cudaError_t launch_mamba_implicit_view(const float* delta, const double* cum, const __nv_bfloat16* B,
                                       const __nv_bfloat16* C, int64_t ld_bc, const float* A, int S,
                                       const ViewPoolArgs& v, float* grid, cudaStream_t stream) {
  if (S <= 0 || S > MAX_STATE || v.rows <= 0 || v.cols <= 0) return cudaErrorInvalidValue;
  const int64_t cells = int64_t(v.rows) * v.cols, blocks = (cells * 32 + VIEW_THREADS - 1) / VIEW_THREADS;
  implicit_view_kernel<<<unsigned(blocks), VIEW_THREADS, 0, stream>>>(delta, cum, B, C, ld_bc, A, S, v, grid);
  return cudaGetLastError();
}

}  // namespace ds::kern
