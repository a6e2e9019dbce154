// Fused differential-attention forward (causal), tensor cores via mma.sync: see diff_attn_fwd.cu.
#pragma once
#include "attn_params.h"

namespace ds::kern {

// head_dim values the fused kernel is built for (64 and 128) and whose shared memory fits the current device;
// others take attn_fwd_generic.
bool diff_attn_fwd_supported(int d);
// The schedule launch_diff_attn_fwd uses for head_dim d on the current device: 4 both maps per warp (d = 64),
// 3 V-split with mbarriers (d = 128), 2 V-split, 1 lockstep, 0 none (diff_attn_fwd.cu; DS_ATTN_MMA_VER asks for one).
int diff_attn_fwd_schedule(int d);
// p.diff must be true; returns the launch error (cudaSuccess when queued).
cudaError_t launch_diff_attn_fwd(const AttnParams& p, cudaStream_t stream);

}  // namespace ds::kern
