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
};

// cudaErrorInvalidValue (nothing launched) for: in_f not a positive multiple of 8, out_f < 0, w/x null or not
// 16-byte aligned, no or two outputs, c without y_f32, swiglu with odd out_f or without y_bf16. out_f == 0 launches
// nothing. Otherwise the launch's status (cudaGetLastError).
cudaError_t launch_gemv(const GemvParams& p, cudaStream_t stream);

}  // namespace ds::kern
