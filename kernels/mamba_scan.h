// Mamba-1 (S6) on the GPU, for the SambaY layers of Phi-4-mini-flash (issue 24; the math with its sources in
// docs/models/phi4flash.md): the causal depthwise convolution of the in_proj output, and the selective scan.
//   u[t, c]  = silu(b[c] + sum_k w[c, k] x[t - (K - 1) + k, c])                  (x before t = 0: the conv state)
//   delta    = softplus(dt[t, c] + dt_bias[c])                                   (fp32, as selective_scan)
//   h[c, s]  = exp(delta A[c, s]) h[c, s] + delta B[t, s] u[t, c],   h before t = 0: the scan state
//   y[t, c]  = sum_s C[t, s] h[c, s] + D[c] u[t, c];   gated: y silu(z[t, c])
// bf16 activations in and out, fp32 state and arithmetic. Both carry their recurrent state across calls when asked
// (token-by-token decoding, or a prompt in pieces): the convolution's last K - 1 input rows and the scan's h; without
// it both start from zeros, as for a whole prompt. tests/test_cuda_kernels.cpp checks both against float64, whole and
// in pieces.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// x [n, ld_x] bf16 (channels [0, channels)), w [channels, K] f32, bias [channels] f32 or null -> u [n, ld_u] bf16.
// Zeros before t = 0.
cudaError_t launch_causal_conv_silu(const __nv_bfloat16* x, int64_t ld_x, const float* w, const float* bias, int K,
                                    __nv_bfloat16* u, int64_t ld_u, int64_t n, int channels, cudaStream_t stream);

// The same with the convolution's state: state_in and state_out are [K - 1][channels] bf16 (rows of `channels`
// elements, no padding), row r = the input row at position r - (K - 1) relative to this call's first row (the K - 1
// rows before the chunk, oldest first).
//   state_in:  the inputs before t = 0 (null: zeros, as launch_causal_conv_silu);
//   state_out: afterwards the last K - 1 rows of (state_in's rows, then x's n rows), so also for n < K - 1 (null: not
//              written).
// state_in == state_out (in place) is allowed: each channel's state is read and then written by one thread, after it
// has used the state for its outputs. The state buffers must not overlap x or u otherwise. Both null: exactly
// launch_causal_conv_silu. For K = 1 the state has no rows and neither is touched.
cudaError_t launch_causal_conv_silu_state(const __nv_bfloat16* x, int64_t ld_x, const float* w, const float* bias,
                                          int K, __nv_bfloat16* u, int64_t ld_u, int64_t n, int channels,
                                          const __nv_bfloat16* state_in, __nv_bfloat16* state_out,
                                          cudaStream_t stream);

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
  // The recurrent state h, [channels][state] f32 (dense): state_in = h before t = 0 (null: zeros), state_out = h after
  // the last token (null: not written). state_in == state_out (in place) is allowed; they must not overlap anything
  // else.
  const float* state_in = nullptr;
  float* state_out = nullptr;
};
// n <= kScanSequentialMaxN runs one kernel sequential over the tokens, a group of threads per channel (decoding's
// n = 1 costs one launch); longer runs use time-parallel chunks of 256 tokens in three passes. On an H100 at
// Phi-4-mini-flash's shape the sequential kernel takes about 0.67 us per token, the chunked passes 0.33 ms at 4096
// tokens and 2.58 ms at 32768 (bench/results/RESULTS.md).
constexpr int64_t kScanSequentialMaxN = 512;
// workspace: device memory of selective_scan_workspace(p) bytes (the chunks' states; 2.7 MB per 4K tokens at
// Phi-4-mini-flash's shape). 0 for n <= kScanSequentialMaxN, where workspace may be null.
size_t selective_scan_workspace(const ScanParams& p);
cudaError_t launch_selective_scan(const ScanParams& p, void* workspace, cudaStream_t stream);

}  // namespace ds::kern
