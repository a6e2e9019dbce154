// SwiGLU: silu(g) * u with silu(g) = g / (1 + exp(-g)) in f32 (kernels/silu.cuh), as torch computes its bf16 silu
// (then rounds; here the product is formed in f32 too and rounded once). Gate and up arrive in bf16, as in transformers, where
// gate_proj and up_proj outputs are bf16 tensors: the same rounding, and half the bytes an f32 gate/up would cost.
// Element-wise, memory-bound: 6 bytes per element, so the loads and stores are 16 bytes wide and there is no
// 64-bit index arithmetic per element.
#include "swiglu.h"
#include "align.h"
#include "silu.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 256;
constexpr int VEC = 8;     // bf16 per 16-byte access
constexpr int UNROLL = 2;  // 16-byte vectors per thread and operand, all loads issued before any use

// Rows are taken by blockIdx.y (strided past 65535); a block covers THREADS * UNROLL * VEC columns of its row.
__global__ void __launch_bounds__(THREADS) swiglu_vec_kernel(const __nv_bfloat16* gu, __nv_bfloat16* out,
                                                             int64_t rows, int inter) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const __nv_bfloat16* g = gu + r * 2 * inter;
    const __nv_bfloat16* u = g + inter;
    __nv_bfloat16* o = out + r * inter;
    const int c0 = (int(blockIdx.x) * THREADS * UNROLL + int(threadIdx.x)) * VEC;
    uint4 gv[UNROLL] = {}, uv[UNROLL] = {};
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int c = c0 + k * THREADS * VEC;
      if (c < inter) {
        gv[k] = *reinterpret_cast<const uint4*>(g + c);
        uv[k] = *reinterpret_cast<const uint4*>(u + c);
      }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int c = c0 + k * THREADS * VEC;
      if (c >= inter) continue;
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]);
      const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv[k]);
      uint4 ov;
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
      for (int j = 0; j < VEC / 2; ++j) {
        const float2 gf = __bfloat1622float2(g2[j]), uf = __bfloat1622float2(u2[j]);
        o2[j] = __floats2bfloat162_rn(silu_mul(gf.x, uf.x), silu_mul(gf.y, uf.y));
      }
      *reinterpret_cast<uint4*>(o + c) = ov;
    }
  }
}

// Any width or alignment: one element per thread.
__global__ void __launch_bounds__(THREADS) swiglu_scalar_kernel(const __nv_bfloat16* gu, __nv_bfloat16* out,
                                                                int64_t rows, int inter) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const __nv_bfloat16* g = gu + r * 2 * inter;
    __nv_bfloat16* o = out + r * inter;
    for (int c = int(blockIdx.x) * THREADS + int(threadIdx.x); c < inter; c += int(gridDim.x) * THREADS)
      o[c] = __float2bfloat16(silu_mul(__bfloat162float(g[c]), __bfloat162float(g[inter + c])));
  }
}

}  // namespace

cudaError_t launch_swiglu(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int64_t rows, int inter,
                          cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return cudaSuccess;
  const unsigned gy = unsigned(rows < 65535 ? rows : 65535);
  // inter % 8 keeps every row start and the up half 16-byte aligned once the bases are.
  if (inter % VEC == 0 && aligned16(gate_up) && aligned16(out)) {
    const int per_block = THREADS * UNROLL * VEC;
    swiglu_vec_kernel<<<dim3(unsigned((inter + per_block - 1) / per_block), gy), THREADS, 0, stream>>>(gate_up, out,
                                                                                                         rows, inter);
  } else {
    swiglu_scalar_kernel<<<dim3(unsigned((inter + THREADS - 1) / THREADS), gy), THREADS, 0, stream>>>(gate_up, out,
                                                                                                      rows, inter);
  }
  return cudaGetLastError();
}

}  // namespace ds::kern
