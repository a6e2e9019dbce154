// The MLP's gate/up projection with SwiGLU in its epilogue, for Hopper (sm_90a):
//   out[t, i] = silu(g) * u,  g = bf16(x[t] . w[i]),  u = bf16(x[t] . w[I + i])
// x [M][ldx] bf16 (K columns), w [2I][K] bf16 (gate rows, then up rows: the layout of gate_up), out [M][I] bf16.
// g and u are rounded to bf16 before SwiGLU, and SwiGLU is formed as kernels/swiglu.cu forms it, so the result is
// the unfused path's (a bf16 gate_up GEMM, then launch_swiglu) up to the products' summation order. The [M][2I]
// gate/up tensor never reaches device memory.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// Whether launch_gemm_swiglu_sm90 takes these operands: sm_90a code in this build and a device that runs it, the
// driver's TMA encoder, I a multiple of 128, K and ldx multiples of 8, x and w 16-byte aligned.
bool gemm_swiglu_sm90_supported(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t M, int K,
                                int I);
// out must be 16-byte aligned too. cluster: 2 runs CTAs in pairs that share each weight tile (TMA multicast), 1
// single CTAs, 0 picks 2 where the device can place such pairs.
cudaError_t launch_gemm_swiglu_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                    __nv_bfloat16* out, int64_t M, int K, int I, cudaStream_t stream,
                                    int cluster = 0);

// The same kernel with a gate from memory (the gated memory unit's in_proj of Phi-4-mini-flash):
//   out[t, i] = silu(y) * gate[t, i],  y = bf16(x[t] . w[i]),  i < N
// w [N][K], gate [M][ld_gate] and out [M][N] bf16; silu_mul rounds as kernels/elementwise.cu's launch_silu_mul does
// after a bf16 GEMM, so the result is the unfused path's up to the products' summation order. Supported where
// gemm_swiglu_sm90_supported(x, ldx, w, M, K, N / 2) holds (N a multiple of 256), gate and out 16-byte aligned,
// ld_gate >= N a multiple of 8.
cudaError_t launch_gemm_silu_mul_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                      const __nv_bfloat16* gate, int64_t ld_gate, __nv_bfloat16* out, int64_t M,
                                      int K, int N, cudaStream_t stream, int cluster = 0);

}  // namespace ds::kern
