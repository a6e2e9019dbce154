// PolyNorm * up: one block per row. The row's three mean squares (of g, g^2, g^3) need the whole row before any
// output, so the gate row is read twice (the second time from L1/L2: 16 KB at I = 8192); both passes read 16-byte
// vectors when I allows. Fused with the up multiply, so the activation costs one pass over gate_up, as SwiGLU does.
#include "polynorm.h"
#include "align.h"

#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 256;

__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // red is reused by the next call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < THREADS / 32 ? red[lane] : 0.f;
  return warp_sum(t);
}

template <bool VEC>
__global__ void __launch_bounds__(THREADS) polynorm_kernel(const __nv_bfloat16* gu, const float* wb, float eps,
                                                           __nv_bfloat16* out, int64_t rows, int inter) {
  __shared__ float red[THREADS / 32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const __nv_bfloat16* g = gu + r * 2 * inter;
    const __nv_bfloat16* u = g + inter;
    __nv_bfloat16* o = out + r * inter;
    float s2 = 0.f, s4 = 0.f, s6 = 0.f;
    auto acc = [&](float x) {
      const float x2 = x * x;
      s2 += x2;
      s4 += x2 * x2;
      s6 += x2 * x2 * x2;
    };
    if constexpr (VEC) {
      for (int c = int(threadIdx.x) * 8; c < inter; c += THREADS * 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(g + c);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(h[k]);
          acc(f.x);
          acc(f.y);
        }
      }
    } else {
      for (int c = int(threadIdx.x); c < inter; c += THREADS) acc(__bfloat162float(g[c]));
    }
    s2 = block_sum(s2, red);
    s4 = block_sum(s4, red);
    s6 = block_sum(s6, red);
    const float inv = 1.f / float(inter);
    const float f1 = wb[2] * rsqrtf(s2 * inv + eps), f2 = wb[1] * rsqrtf(s4 * inv + eps),
                f3 = wb[0] * rsqrtf(s6 * inv + eps), b = wb[3];
    auto act = [&](float x, float up) { return (fmaf(fmaf(f3, x, f2), x, f1) * x + b) * up; };
    if constexpr (VEC) {
      for (int c = int(threadIdx.x) * 8; c < inter; c += THREADS * 8) {
        const uint4 gv = *reinterpret_cast<const uint4*>(g + c), uv = *reinterpret_cast<const uint4*>(u + c);
        const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
        const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
        uint4 ov;
        __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 gf = __bfloat1622float2(g2[k]), uf = __bfloat1622float2(u2[k]);
          o2[k] = __floats2bfloat162_rn(act(gf.x, uf.x), act(gf.y, uf.y));
        }
        *reinterpret_cast<uint4*>(o + c) = ov;
      }
    } else {
      for (int c = int(threadIdx.x); c < inter; c += THREADS)
        o[c] = __float2bfloat16(act(__bfloat162float(g[c]), __bfloat162float(u[c])));
    }
  }
}

}  // namespace

cudaError_t launch_polynorm_mul(const __nv_bfloat16* gate_up, const float* wb, float eps, __nv_bfloat16* out,
                                int64_t rows, int inter, cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  const unsigned blocks = unsigned(rows < 65535 ? rows : 65535);
  if (inter % 8 == 0 && aligned16(gate_up) && aligned16(out)) {
    polynorm_kernel<true><<<blocks, THREADS, 0, stream>>>(gate_up, wb, eps, out, rows, inter);
  } else {
    polynorm_kernel<false><<<blocks, THREADS, 0, stream>>>(gate_up, wb, eps, out, rows, inter);
  }
  return cudaGetLastError();
}

}  // namespace ds::kern
