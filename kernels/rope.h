// Rotary position embedding (NeoX / rotate_half style), in place on the bf16 QKV projection output.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// cos_sin [positions, half] (x = cos, y = sin) for positions 0..positions-1 from inv_freq [half] (f32, computed on
// the host exactly as transformers does): angle = f32(pos) * inv_freq in f32, as transformers' f32 matmul gives.
cudaError_t launch_rope_table(const float* inv_freq, int positions, int half, float2* cos_sin, cudaStream_t stream);

// qkv [tokens, (H + 2 Hkv) d] bf16 (the QKV GEMM output): Q and K heads rotated in place, V left alone. Token t
// has position t % seq_len (sequences of equal length back to back). d must be even.
cudaError_t launch_rope_qk_inplace(__nv_bfloat16* qkv, const float2* cos_sin, int64_t tokens, int seq_len, int heads,
                                  int kv_heads, int d, cudaStream_t stream);

// Decoding: one [(H + 2 Hkv) d] row rotated as launch_rope_qk_inplace rotates it at position *pos (device memory;
// cos_sin null: copied unrotated), written to dst + *pos * dst_stride (elements); `row` itself is not changed. On
// sm_90 it lets a programmatic dependent (the decoding attention) start launching at once (kernels/pdl.cuh): such a
// successor must wait for it before reading what it writes.
cudaError_t launch_rope_row_store(const __nv_bfloat16* row, const float2* cos_sin, const int32_t* pos, int heads,
                                  int kv_heads, int d, __nv_bfloat16* dst, int64_t dst_stride, cudaStream_t stream);

}  // namespace ds::kern
