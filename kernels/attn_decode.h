// Attention of the last few query rows of one sequence against all its keys (decoding), split over the key range
// (flash-decoding): the current length n is read from device memory, so that one launch, captured once in a CUDA
// graph, serves every decoding step while n grows.
//
// Layout and options as for the prefill kernels (attn_params.h): Q rows from p.qkv, K and V from kv_base(p) (p.kv for
// cross-layer KV reuse), both with p.row_stride (K and V with p.kv_row_stride when p.kv and it are set) and
// p.q_off / k_off / v_off; p.window a sliding window; p.diff a
// differential head (two softmaxes over K1 and K2, V of 2d, O1/l1 - lambda O2/l2, RMS norm over 2d with p.eps, times
// p.out_scale) or a plain one; GQA by attn_heads.h's view_head_map. p.batch, p.batch_stride, p.n, p.head_ns and
// p.tile_major are not read (batch 1; n comes from *len).
//
// Query row r (0 .. q_rows-1) is position n - q_rows + r and sees keys window_first_key(p.window, pos) .. pos. Its
// output goes to p.out + r * p.out_row_stride, view head j at columns j * view_width(p.diff, p.d) onwards. A row at
// a negative position (n < q_rows) is written as zeros. n is expected in [q_rows, max_len]; a larger n still gives
// the right result (the split count is fixed from max_len, the splits get longer).
//
// Supported: d a multiple of 8 up to 128 (plain heads also up to 256), q_rows 1..16, H % Hkv == 0 (differential: H
// even), qkv and kv 16-byte aligned with row_stride, q_off, k_off and v_off multiples of 8 elements (16-byte copies);
// p.out any bf16 pointer and stride. Anything else: cudaErrorInvalidValue, nothing launched.
//
// p.logit_bits > 0 (2..16): every logit fake-quantised (quantize_logit) against its row's largest |logit| over the
// keys the row sees, found by a third launch before the split kernel (the same split geometry, reading K alone, each
// split's row maxima to the workspace).
#pragma once
#include <cstddef>
#include <cstdint>

#include "attn_params.h"

namespace ds::kern {

// Bytes of device workspace launch_attn_decode needs for p's shape, q_rows and max_len (0 for an unsupported shape,
// for which the launch fails). The workspace holds each split's partial results; it needs no initialisation and
// keeps no state between launches, so one buffer serves every layer of a step in stream order.
size_t attn_decode_workspace(const AttnParams& p, int q_rows, int max_len);

// Two kernels (three under quantised logits) on `stream`: the split kernel (grid: splits x key/value groups x row chunks, fixed by p's shape,
// q_rows, max_len and the device's SM count, so independent of *len) and the combine kernel, on sm_90 and newer as
// programmatic dependent launches (each waits for the grid before it before reading memory; graph capture keeps
// them as programmatic edges). Returns the first error (cudaErrorInvalidValue for an unsupported shape or a null
// pointer).
cudaError_t launch_attn_decode(const AttnParams& p, const int32_t* len, int q_rows, int max_len, void* workspace,
                               cudaStream_t stream);

// What launch_attn_decode launches for p, q_rows and max_len on the current device (benchmarks and tests):
// splits: the split count; ctas: CTAs of the split kernel; keys_per_tile: the key tile of its pipeline.
struct AttnDecodePlan {
  int splits = 0, ctas = 0, keys_per_tile = 0;
};
// false for an unsupported shape.
bool attn_decode_plan(const AttnParams& p, int q_rows, int max_len, AttnDecodePlan* plan);

}  // namespace ds::kern
