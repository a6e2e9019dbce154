// Fused causal attention forward for Hopper (sm_90a: wgmma, TMA, warp specialisation), differential or plain
// (attn_fwd_sm90.cu). Reached through attn_dispatch.h, which checks what it needs first.
#pragma once
#include "attn_params.h"

namespace ds::kern {

// Whether this build's sm_90a code runs on the current device (a one-thread probe kernel; false elsewhere).
bool attn_fwd_sm90_code_runs();
// Whether the driver's tensor-map encoder (cuTensorMapEncodeTiled) is reachable through the runtime.
bool attn_tma_encoder_available();
// d = 64 or 128, H even (differential: Hkv even too); every pointer and stride 16-byte aligned (attn_shape's
// aligned16). block_n: keys per tile at d = 64 (64 or 128); d = 128 always uses 64 (128 would not fit the register
// file next to the 64 x 256 accumulator). cluster: pairs of CTAs on adjacent query tiles share each K/V tile by
// TMA multicast where that applies (block_n 128 at d = 64, no sliding window, the device co-schedules the pair);
// elsewhere it is ignored. Returns the launch error.
cudaError_t launch_attn_fwd_sm90(const AttnParams& p, int block_n, bool cluster, cudaStream_t stream);

}  // namespace ds::kern
