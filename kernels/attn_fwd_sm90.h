// Fused causal attention forward for Hopper (sm_90a: wgmma, TMA, warp specialisation), differential or plain
// (attn_fwd_sm90.cu). Reached through attn_dispatch.h, which checks what it needs first.
#pragma once
#include "attn_params.h"
#include "outlier_count.h"

namespace ds::kern {

// Whether this build's sm_90a code runs on the current device (a one-thread probe kernel; false elsewhere).
bool attn_fwd_sm90_code_runs();
// Whether the driver's tensor-map encoder (cuTensorMapEncodeTiled) is reachable through the runtime.
bool attn_tma_encoder_available();
// d = 64 or 128, H even (differential: Hkv even too); every pointer and stride 16-byte aligned (attn_shape's
// aligned16). block_n: keys per tile at d = 64 (64 or 128); d = 128 always uses 64 (128 would not fit the register
// file next to the 64 x 256 accumulator). Returns the launch error.
cudaError_t launch_attn_fwd_sm90(const AttnParams& p, int block_n, cudaStream_t stream);

// One pass of the outlier statistics (outlier_count.h) over a layer's attention logits |p.scale q . k|, every causal
// cell inside p.window of every view head's maps (plain heads: map 0), Q K^T on the tensor cores and each value
// counted where it is computed (nothing written but the counts and the collected values). width > 0: the digits
// (bits >> shift) & ((1 << width) - 1) of the values whose bits above the digit equal one of prefixes[0 .. nprefix)
// (nprefix 0: every value) added to counts [maps][max(1, nprefix)][1 << width] (u64); collect.at_least set: the
// values at or above at_least[map] collected as launch_outlier_count does (width 0: that alone). The values are
// those of this kernel, for every pass: the sums' order differs from the batched GEMM's (the same products).
struct LogitPass {
  int shift = 0, width = 0;
  const uint32_t* prefixes = nullptr;  // device
  int nprefix = 0;
  unsigned long long* counts = nullptr;
  OutlierCollect collect;
};
// Whether launch_logit_pass_sm90 takes these shapes (d = 64 or 128, H even, differential: Hkv even); the caller
// also needs attn_fwd_sm90_code_runs() and the tensor-map encoder.
bool logit_pass_sm90_supports(const AttnParams& p);
cudaError_t launch_logit_pass_sm90(const AttnParams& p, const LogitPass& c, cudaStream_t stream);

}  // namespace ds::kern
