// Warp-specialised Hopper variant (v9) of the fused differential-attention forward: TMA producer, two consumer
// warpgroups taking turns. Internal to diff_attn_fwd_sm90.cu's dispatch (launch_diff_attn_fwd_sm90 picks it).
#pragma once
#include "attn_params.h"

namespace ds::kern {

// True when the TMA descriptor encoder is reachable and the tensor meets TMA's alignment rules (16-byte base and
// strides); otherwise the dispatcher uses the v5 kernel.
bool diff_attn_fwd_sm90_ws_usable(const AttnParams& p);
// Same contract as launch_diff_attn_fwd_sm90 (d = 64 or 128; block_n 64 or 128 for d = 64).
cudaError_t launch_diff_attn_fwd_sm90_ws(const AttnParams& p, cudaStream_t stream, int block_n);
// v11: the same kernel made persistent (one CTA per SM, work items from a global counter). Same contract; one
// launch at a time per device (the counter is a device global).
cudaError_t launch_diff_attn_fwd_sm90_persistent(const AttnParams& p, cudaStream_t stream, int block_n);

}  // namespace ds::kern
