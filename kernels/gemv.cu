// bf16 GEMV (gemv.h). Memory-bound: W is read once, so the kernel is built to keep as many 16-byte loads of W in
// flight as the memory system needs, and nothing else on the path.
//   - A warp owns one output row (swiglu: the gate row i and the up row i + out_f/2, so that the epilogue has both)
//     over a slice of in_f; lane l reads 8 bf16 at columns base + 256 u + 8 l, so each warp-wide load is 512
//     contiguous bytes. UNROLL = 8 such loads per row are issued (with the matching x vectors) before any arithmetic:
//     for in_f = 2048 one warp's whole row is in flight at once.
//   - Long rows (in_f >= 4096) are split into KSPLIT slices over the warps of one block (block = 4 warps = 4/KSPLIT
//     rows), summed in shared memory in a fixed order (deterministic), so that a warp never holds more than ~8 loads
//     per row and the grid still has many warps.
//   - W is loaded with ld.global.nc.L1::no_allocate (streamed once: it should not evict x from L1); x is read with
//     __ldg and stays in L1/L2 (a few KiB, read by every warp).
//   - One block per 4/KSPLIT rows, no grid-stride loop: even the smallest matrices of a decoder (2048 x 2048) give
//     512 blocks, several per SM, so the whole matrix is requested almost at once.
// f32 accumulation: per lane a sequential sum over its columns, then the butterfly warp_sum, then the slices.
// RMSNorm prologue (x_f32): every block re-enacts kernels/rmsnorm.cu's sum of squares for the row (same virtual
// threads, fmaf chains and reductions, so the same f32 bits), then writes the normed bf16 vector to shared memory
// and runs the same W loop with x read from there (the W loads are untouched).
#include "gemv.h"
#include "align.h"

#include "silu.cuh"
#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int VEC = 8;                 // bf16 per 16-byte load
constexpr int UNROLL = 8;              // 16-byte loads per lane and row in flight
constexpr int WARP_COLS = 32 * VEC;    // columns one warp-wide load covers

// W is streamed once: no L1 allocation (L2 prefetches the 256-byte sector pair anyway).
__device__ __forceinline__ uint4 load_stream(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float acc) {
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
  for (int j = 0; j < VEC / 2; ++j) {
    const float2 af = __bfloat1622float2(a2[j]), bf = __bfloat1622float2(b2[j]);
    acc = fmaf(af.x, bf.x, acc);
    acc = fmaf(af.y, bf.y, acc);
  }
  return acc;
}

// R rows per warp: 1, or 2 for swiglu (gate and up). The minimum of 4 blocks per SM lets ptxas spend the registers
// (94 / 116 on sm_90) to keep all UNROLL * R loads of a round in flight; without it, it interleaves them with the FMAs
// and keeps only 2-4 in flight. ksplit in {1, 2, 4} slices of `slice` columns (a multiple of 8).
// launch_rmsnorm's register kernel for one row of in_f = 4 nvec columns: VPT float4 per thread, blockDim
// ((nvec + VPT - 1) / VPT rounded up to 32) threads (norm_vt). Thread t of that block: ss = fmaf chain over its
// vectors t, t + nvt, ... (each vector w, z, y, x innermost first), warp_sum, then warp 0 warp_sums the per-warp
// partials (zeros beyond the last warp). Here the THREADS threads of a GEMV block play its nvt / 32 warps in turn
// (GEMV warp w plays its warps w, w + WARPS, ...; lane = lane), so every partial sum is the same f32 value.
template <int VPT>
__device__ __forceinline__ float norm_sum_squares(const float4* x4, int nvec, int nvt, float* red_norm) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int vw = warp; vw < nvt / 32; vw += WARPS) {
    const int t = vw * 32 + lane;
    float4 v[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int i = t + j * nvt;
      v[j] = i < nvec ? __ldg(x4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
      ss = fmaf(v[j].x, v[j].x, fmaf(v[j].y, v[j].y, fmaf(v[j].z, v[j].z, fmaf(v[j].w, v[j].w, ss))));
    ss = warp_sum(ss);
    if (lane == 0) red_norm[vw] = ss;
  }
  __syncthreads();
  if (warp == 0) {
    float v = lane < (nvt >> 5) ? red_norm[lane] : 0.f;
    v = warp_sum(v);
    if (lane == 0) red_norm[32] = v;
  }
  __syncthreads();
  return red_norm[32];
}

// The prologue: r, then xs[j] = bf16(norm_w[j] * (x_f32[j] * r)) exactly as rmsnorm.cu's scale_pack (block 0 also
// to x_normed_out). Ends with a __syncthreads: xs is ready for every warp.
__device__ __forceinline__ void norm_prologue(const GemvParams& p, int norm_vpt, int norm_vt, __nv_bfloat16* xs) {
  __shared__ float red_norm[33];
  const int nvec = p.in_f >> 2;
  const float4* x4 = reinterpret_cast<const float4*>(p.x_f32);
  float ss;
  if (norm_vpt == 1) ss = norm_sum_squares<1>(x4, nvec, norm_vt, red_norm);
  else if (norm_vpt == 2) ss = norm_sum_squares<2>(x4, nvec, norm_vt, red_norm);
  else if (norm_vpt == 4) ss = norm_sum_squares<4>(x4, nvec, norm_vt, red_norm);
  else ss = norm_sum_squares<8>(x4, nvec, norm_vt, red_norm);
  const float inv = rsqrtf(ss / float(p.in_f) + p.norm_eps);
  const float4* w4 = reinterpret_cast<const float4*>(p.norm_w);
  uint2* xs2 = reinterpret_cast<uint2*>(xs);
  __nv_bfloat16* out = blockIdx.x == 0 ? p.x_normed_out : nullptr;
  for (int i = int(threadIdx.x); i < nvec; i += THREADS) {
    const float4 v = __ldg(x4 + i), w = __ldg(w4 + i);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(w.x * (v.x * inv), w.y * (v.y * inv));
    const __nv_bfloat162 hi = __floats2bfloat162_rn(w.z * (v.z * inv), w.w * (v.w * inv));
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    xs2[i] = packed;
    if (out) {
      out[4 * i] = lo.x;
      out[4 * i + 1] = lo.y;
      out[4 * i + 2] = hi.x;
      out[4 * i + 3] = hi.y;
    }
  }
  __syncthreads();
}

// x as the W loop reads it: 8 bf16 from global (__ldg) or, with the prologue, from shared memory.
template <bool NORM>
__device__ __forceinline__ uint4 load_x(const __nv_bfloat16* x, int k) {
  if constexpr (NORM) return *reinterpret_cast<const uint4*>(x + k);
  else return __ldg(reinterpret_cast<const uint4*>(x + k));
}

template <int R, bool NORM>
__global__ void __launch_bounds__(THREADS, 4)
    gemv_kernel(GemvParams p, int groups, int ksplit, int slice, int norm_vpt, int norm_vt) {
  __shared__ float red[WARPS][R];
  extern __shared__ uint4 xs_raw[];  // NORM: the normed vector, in_f bf16
  const __nv_bfloat16* xp = p.x;
  if constexpr (NORM) {
    __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(xs_raw);
    norm_prologue(p, norm_vpt, norm_vt, xs);
    xp = xs;
  }
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int ks = warp % ksplit;
  const int64_t group = int64_t(blockIdx.x) * (WARPS / ksplit) + warp / ksplit;
  const bool active = group < groups;

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  if (active) {
    const __nv_bfloat16* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = p.w + (group + int64_t(r) * groups) * p.in_f;
    const int k0 = ks * slice, k1 = min(p.in_f, k0 + slice);
    int k = k0 + lane * VEC;
    // Full rounds: UNROLL loads per row, all issued before the first use.
    for (; k + (UNROLL - 1) * WARP_COLS < k1; k += UNROLL * WARP_COLS) {
      uint4 xv[UNROLL], wv[R][UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r][u] = load_stream(wr[r] + k + u * WARP_COLS);
        xv[u] = load_x<NORM>(xp, k + u * WARP_COLS);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = dot8(wv[r][u], xv[u], acc[r]);
    }
    // The rest of the slice (fewer than UNROLL warp-wide loads): one at a time.
    for (; k < k1; k += WARP_COLS) {
      const uint4 xv = load_x<NORM>(xp, k);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = dot8(load_stream(wr[r] + k), xv, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if (ksplit > 1) {
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) red[warp][r] = acc[r];
    __syncthreads();
    if (ks == 0 && lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float s = red[warp][r];
        for (int j = 1; j < ksplit; ++j) s += red[warp + j][r];
        acc[r] = s;
      }
  }
  if (!active || ks != 0 || lane != 0) return;

  if (R == 2) {  // swiglu: gate and up rounded to bf16 first, as a bf16 GEMM leaves them
    float g = acc[0], u = acc[R - 1];
    if (p.bias) {
      g += p.bias[group];
      u += p.bias[group + groups];
    }
    g = __bfloat162float(__float2bfloat16(g));
    u = __bfloat162float(__float2bfloat16(u));
    p.y_bf16[group] = __float2bfloat16(silu_mul(g, u));
    return;
  }
  float v = acc[0];
  if (p.bias) v += p.bias[group];
  if (p.y_f32) {
    if (p.c) v = p.c[group] + v;  // read before the write: c == y_f32 is fine
    p.y_f32[group] = v;
  } else {
    p.y_bf16[group] = __float2bfloat16(v);
  }
}

}  // namespace

cudaError_t launch_gemv(const GemvParams& p, cudaStream_t stream) {
  if (p.in_f <= 0 || p.in_f % VEC != 0 || p.out_f < 0) return cudaErrorInvalidValue;
  if (!p.w || !aligned16(p.w)) return cudaErrorInvalidValue;
  const bool norm = p.x_f32 != nullptr;
  if ((p.x != nullptr) == norm) return cudaErrorInvalidValue;  // exactly one of x, x_f32
  if (!norm && !aligned16(p.x)) return cudaErrorInvalidValue;
  if (norm && (!aligned16(p.x_f32) || !p.norm_w || !aligned16(p.norm_w) || p.in_f > kGemvNormMaxInF))
    return cudaErrorInvalidValue;
  if ((p.y_bf16 != nullptr) == (p.y_f32 != nullptr)) return cudaErrorInvalidValue;
  if (p.c && !p.y_f32) return cudaErrorInvalidValue;
  if (p.swiglu && (p.out_f % 2 != 0 || !p.y_bf16)) return cudaErrorInvalidValue;
  if (p.out_f == 0) return cudaSuccess;

  // Slices of at most ~2048 columns per warp (one UNROLL round) where the block allows it.
  const int ksplit = p.in_f >= 4 * UNROLL * WARP_COLS ? 4 : p.in_f >= 2 * UNROLL * WARP_COLS ? 2 : 1;
  const int slice = ((p.in_f + ksplit - 1) / ksplit + VEC - 1) / VEC * VEC;
  const int groups = p.swiglu ? p.out_f / 2 : p.out_f;
  const int per_block = WARPS / ksplit;
  const unsigned blocks = unsigned((int64_t(groups) + per_block - 1) / per_block);
  if (!norm) {
    if (p.swiglu) gemv_kernel<2, false><<<blocks, THREADS, 0, stream>>>(p, groups, ksplit, slice, 0, 0);
    else gemv_kernel<1, false><<<blocks, THREADS, 0, stream>>>(p, groups, ksplit, slice, 0, 0);
    return cudaGetLastError();
  }
  // launch_rmsnorm's choice for one row of in_f columns (its register kernel: nvec <= 8192 since in_f <= 16384).
  const int nvec = p.in_f / 4;
  const int vpt = nvec <= 128 ? 1 : nvec <= 256 ? 2 : nvec <= 512 ? 4 : 8;
  const int vt = ((nvec + vpt - 1) / vpt + 31) / 32 * 32;
  const size_t smem = size_t(p.in_f) * sizeof(__nv_bfloat16);
  if (p.swiglu) gemv_kernel<2, true><<<blocks, THREADS, smem, stream>>>(p, groups, ksplit, slice, vpt, vt);
  else gemv_kernel<1, true><<<blocks, THREADS, smem, stream>>>(p, groups, ksplit, slice, vpt, vt);
  return cudaGetLastError();
}

}  // namespace ds::kern
