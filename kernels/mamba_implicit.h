// The implicit attention of one channel of a Mamba-1 scan (engine/core/map_query.h, "implicit attention", has the math),
// pooled into a view's grid on the device: one channel's step sizes and their prefix sums, then every cell of the
// grid from its block of entries, so nothing n x n exists anywhere.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attn_maps.h"

namespace ds::kern {

// delta[t] = softplus(dt[t * ld_dt + channel] + dt_bias[channel]) and cum[t] = delta[0] + .. + delta[t] (double:
// at long prompts float prefix sums lose the digits that cum[q] - cum[k] needs) for t < n. One block.
cudaError_t launch_mamba_channel_steps(const __nv_bfloat16* dt, int64_t ld_dt, int channel, const float* dt_bias,
                                       int64_t n, float* delta, double* cum, cudaStream_t stream);

// The view's grid [rows x cols] of M[q, k] = delta[k] sum_s C[q, s] exp(A[s] (cum[q] - cum[k])) B[k, s] (k <= q, else
// 0): max pooling keeps the entry of largest magnitude with its sign, mean the block's sum over its cell count.
// B and C: rows of S <= 16 bf16 values, row t at B + t * ld_bc (C likewise); A: the channel's S values (f32). Every
// cell is written (no accumulation). lambda of `v` is ignored.
cudaError_t launch_mamba_implicit_view(const float* delta, const double* cum, const __nv_bfloat16* B,
                                       const __nv_bfloat16* C, int64_t ld_bc, const float* A, int S,
                                       const ViewPoolArgs& v, float* grid, cudaStream_t stream);

}  // namespace ds::kern
