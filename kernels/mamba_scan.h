// Mamba-1 (S6) on the GPU, for the SambaY layers of Phi-4-mini-flash (issue 24; the math with its sources in
// docs/models/phi4flash.md): the causal depthwise convolution of the in_proj output, and the selective scan.
//   u[t, c]  = silu(b[c] + sum_k w[c, k] x[t - (K - 1) + k, c])                  (zero before t = 0)
//   delta    = softplus(dt[t, c] + dt_bias[c])                                   (fp32, as selective_scan)
//   h[c, s]  = exp(delta A[c, s]) h[c, s] + delta B[t, s] u[t, c],   h = 0 before t = 0
//   y[t, c]  = sum_s C[t, s] h[c, s] + D[c] u[t, c];   gated: y silu(z[t, c])
// bf16 activations in and out, fp32 state and arithmetic. Not yet called by the engine: the SambaY layers are not
// wired into the backends (issue 24's next step); tests/test_cuda_kernels.cpp checks both against float64.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// x [n, ld_x] bf16 (channels [0, channels)), w [channels, K] f32, bias [channels] f32 or null -> u [n, ld_u] bf16.
cudaError_t launch_causal_conv_silu(const __nv_bfloat16* x, int64_t ld_x, const float* w, const float* bias, int K,
                                    __nv_bfloat16* u, int64_t ld_u, int64_t n, int channels, cudaStream_t stream);

struct ScanParams {
  int64_t n = 0;     // tokens of one sequence
  int channels = 0;  // d_inner
  int state = 0;     // d_state, 1..32
  const __nv_bfloat16* u = nullptr;   // [n, ld_u]
  const __nv_bfloat16* dt = nullptr;  // [n, ld_dt], dt_proj's output before its bias
  const float* dt_bias = nullptr;     // [channels]
  const float* A = nullptr;           // [channels, state], = -exp(A_log)
  const __nv_bfloat16* B = nullptr;   // [n, ld_bc], state columns
  const __nv_bfloat16* C = nullptr;   // [n, ld_bc]
  const float* D = nullptr;           // [channels]
  const __nv_bfloat16* z = nullptr;   // [n, ld_z] gate, for y_gated
  __nv_bfloat16* y = nullptr;         // [n, ld_y] ungated output, or null
  __nv_bfloat16* y_gated = nullptr;   // [n, ld_y] y silu(z), or null
  int64_t ld_u = 0, ld_dt = 0, ld_bc = 0, ld_z = 0, ld_y = 0;
};
// workspace: device memory of selective_scan_workspace(p) bytes (the chunks' states; 2.7 MB per 4K tokens at
// Phi-4-mini-flash's shape).
size_t selective_scan_workspace(const ScanParams& p);
cudaError_t launch_selective_scan(const ScanParams& p, void* workspace, cudaStream_t stream);

}  // namespace ds::kern
