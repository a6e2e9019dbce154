// bf16 GEMV for batch-1 decoding (one token): every weight matrix against a single row, memory-bound, so the kernel
// streams W once with 16-byte loads and fuses what would otherwise be separate passes over the output (bias, the
// residual add into an f32 stream, SwiGLU of a fused gate/up projection).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// y = W x (+ bias) for one row x: W [out_f, in_f] bf16 row-major (a torch Linear weight), x [in_f] bf16, f32
// accumulation. Exactly one output form:
//   y_bf16: y = bf16(W x + bias)
//   y_f32:  y = c + (W x + bias)   (c may be null: 0; c == y_f32 allowed: accumulate in place)
//   swiglu (with y_bf16): rows [0, out_f/2) are gate rows and [out_f/2, out_f) up rows; for i < out_f/2,
//           y_bf16[i] = bf16(silu(g) * u) with g = bf16(gate_i . x + bias_i), u = bf16(up_i . x + bias_{i+out_f/2})
//           rounded first (exactly what a bf16 GEMM followed by kernels/swiglu.cu computes); y_bf16 has out_f/2
//           entries.
struct GemvParams {
  const __nv_bfloat16* w = nullptr;
  const __nv_bfloat16* x = nullptr;
  int out_f = 0, in_f = 0;
  const float* bias = nullptr;  // [out_f] or null
  __nv_bfloat16* y_bf16 = nullptr;
  float* y_f32 = nullptr;
  const float* c = nullptr;
  bool swiglu = false;
  // RMSNorm prologue: when x_f32 is set (and x null), the vector is bf16(norm_w[j] * (x_f32[j] * r)),
  // r = rsqrt(mean_j x_f32[j]^2 + norm_eps), computed exactly as kernels/rmsnorm.cu computes it for one row of
  // in_f columns (the same f32 sum of squares: launch_rmsnorm's register kernel, its VPT and block width for
  // in_f / 4 float4 vectors, its per-thread fmaf chain and its block_sum reduction order, re-enacted by each GEMV
  // block; then rsqrtf(ss / float(in_f) + eps) and bf16(w * (x * r)) per element), so that the result equals
  // launch_rmsnorm (x_stride = y_stride = in_f, rows = 1) followed by launch_gemv on its output bit for bit. Every
  // block computes r itself (in_f f32 read from L2), builds the normed bf16 vector in shared memory (in_f * 2
  // bytes, dynamic) and runs the same W loop with x read from there. norm_w: [in_f] f32, 16-byte aligned.
  const float* x_f32 = nullptr;
  const float* norm_w = nullptr;
  float norm_eps = 0.f;
  // optional: the normed bf16 vector is also written here by block 0 (so later kernels can read it), or null
  __nv_bfloat16* x_normed_out = nullptr;
};

// cudaErrorInvalidValue (nothing launched) for: in_f not a positive multiple of 8, out_f < 0, w null or not 16-byte
// aligned, x and x_f32 both set or both null, x not 16-byte aligned, x_f32 or norm_w (with x_f32) null or not
// 16-byte aligned, x_f32 with in_f > kGemvNormMaxInF (the shared-memory vector), no or two outputs, c without
// y_f32, swiglu with odd out_f or without y_bf16. out_f == 0 launches nothing (x_normed_out is then not written
// either). Otherwise the launch's status (cudaGetLastError).
inline constexpr int kGemvNormMaxInF = 16384;  // 32 KiB of bf16 in shared memory (under the 48 KiB default)
cudaError_t launch_gemv(const GemvParams& p, cudaStream_t stream);

}  // namespace ds::kern
