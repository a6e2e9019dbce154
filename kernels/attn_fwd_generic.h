// Attention forward for any head_dim (multiple of 8, up to 256), differential or plain softmax: the path for
// Llama checkpoints and for head sizes the fused kernel is not built for. f32 arithmetic, one warp per query row.
#pragma once
#include "attn_params.h"

namespace ds::kern {

bool attn_fwd_generic_supported(int d);
// Honours p.window (each row's keys start at its window) and p.kv, as every attention kernel does.
cudaError_t launch_attn_fwd_generic(const AttnParams& p, cudaStream_t stream);

}  // namespace ds::kern
