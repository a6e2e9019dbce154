// Parameters shared by the attention kernels (fused, generic, maps). Q, K and V are read in place from the fused QKV
// projection output: each token is one row of `row_stride` bf16 elements holding
//   [ Q heads 0..H-1 (d each) | K heads 0..Hkv-1 (d each) | V heads 0..Hkv-1 (d each) ]
// at element offsets q_off / k_off / v_off; `batch_stride` separates sequences of the same length n. Which heads a
// view head reads, and where it writes: attn_heads.h.
// Two options every attention kernel honours (Phi-4-mini-flash):
//   window > 0: a sliding window, query row i sees keys max(0, i - window + 1) .. i (min(i + 1, window) keys, itself
//     included; flash-attn's window_size = (window - 1, window - 1) with causal = True). The kernels start their
//     loops over key tiles at the first tile that meets the window and mask the keys left of it on the boundary
//     tiles only; 0 is full causal attention.
//   kv != nullptr: K and V are read from `kv` (cross-layer KV reuse, YOCO) in the same layout (row_stride,
//     batch_stride, k_off, v_off); Q still from `qkv`.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attn_heads.h"

namespace ds::kern {

using bf16 = __nv_bfloat16;

struct AttnParams {
  const bf16* qkv = nullptr;  // [batch][n][row_stride]
  int64_t row_stride = 0, batch_stride = 0;
  int64_t q_off = 0, k_off = 0, v_off = 0;
  int n = 0, batch = 1;
  int heads = 0, kv_heads = 0, d = 0;  // query heads H, kv heads Hkv, head_dim d
  bool diff = true;                    // differential (two maps, V of 2d) or plain softmax attention
  float scale = 0;                     // 1/sqrt(d)
  float lambda = 0;                    // diff: O1/l1 - lambda * O2/l2
  float out_scale = 1;                 // diff: (1 - lambda_init) after the inner RMS norm
  float eps = 1e-6f;                   // diff: inner RMS norm epsilon (rms_norm_eps)
  bf16* out = nullptr;                 // [batch][n][out_row_stride]
  int64_t out_row_stride = 0, out_batch_stride = 0;
  unsigned long long* head_ns = nullptr;  // optional [view heads]: block time (%globaltimer ns) summed per head
  bool tile_major = false;                // CTA order of the fused kernels (launch_attn sets it from the choice)
  bool fixed_max = true;                  // the Hopper kernel's fixed-maximum first pass (launch_attn: the choice's)
  int window = 0;                         // sliding window in keys (row i sees max(0, i - window + 1) .. i); 0: none
  const bf16* kv = nullptr;               // K and V from here when set (same layout and offsets), else from qkv
  // > 0: the rows of kv are this many elements apart instead of row_stride (the decoding kernel only: the CUDA
  // backend's host caches keep a layer's K and V rows alone, [n][2 Hkv d], for a step; kv then points H d elements
  // before them, so that k_off and v_off still find K and V)
  int64_t kv_row_stride = 0;
  // diff: per view head (c1, c2) with O = c1 O1/l1 - c2 O2/l2 (device memory, [view heads]); null: (1, lambda) for
  // every head. A head's interventions (drop A1: c1 = 0; drop A2 or its own lambda: c2), forward.h AttnEdit.
  const float2* head_coef = nullptr;
  // Knockout (forward.h KeySpan): query rows [x, y) do not see keys [z, w) of ko[i], i < nko (a row left with no key
  // gives 0). Taken by the generic kernel, the decode kernels and the map queries' generic path; the CUDA backend
  // re-runs a layer's knocked rows with the generic kernel after the fused one (rows [row0, row1) of the launch).
  static constexpr int kMaxKnockouts = 8;
  int nko = 0;
  int4 ko[kMaxKnockouts] = {};
  int row0 = 0, row1 = 0;  // generic kernel: the query rows it computes (row1 0: to n)
  // > 0: the logits fake-quantised to this many bits before the softmax (forward.h AttnEdit::logit_bits): the Hopper
  // kernel and the generic kernel (each with a first pass for each row's largest |score|), the map kernels (select_attn
  // routes a quantised layer to them) and the decoding kernel (a row-maximum launch before its split kernel) take it.
  int logit_bits = 0;
  // The Hopper kernel under quantised logits: each row's largest |logit| from the row-maximum kernel (launch_attn: the
  // choice's), else from the attention kernel's own first pass.
  bool quant_row_kernel = true;
  // Set by the Hopper kernel's launch alone (attn_fwd_sm90.cu): each quantised row's largest |logit| was computed by
  // the row-maximum kernel before it and parked as a float in the row's own output columns, where the attention
  // kernel reads it before it writes the row.
  bool absmax_staged = false;
};

// The symmetric absmax fake-quantisation of one logit (cpu_attn::quantize_logit's formula).
__host__ __device__ __forceinline__ float quantize_logit(float x, float amax, int bits) {
  if (!(amax > 0.f)) return x;
  const float step = amax / float((1 << (bits - 1)) - 1);
  return rintf(x / step) * step;
}

// Whether query row `row` may not see key `key` (a knockout).
__device__ __forceinline__ bool knocked_out(const AttnParams& p, int row, int key) {
  bool out = false;
  for (int i = 0; i < p.nko; ++i)
    out |= row >= p.ko[i].x && row < p.ko[i].y && key >= p.ko[i].z && key < p.ko[i].w;
  return out;
}

// View head j's (c1, c2): O = c1 O1/l1 - c2 O2/l2.
__device__ __forceinline__ float2 head_coef(const AttnParams& p, int j) {
  return p.head_coef ? p.head_coef[j] : make_float2(1.f, p.lambda);
}

// Where K and V are read from.
__host__ __device__ inline const bf16* kv_base(const AttnParams& p) { return p.kv ? p.kv : p.qkv; }
// The first key that query row `row` sees: row - window + 1 under a sliding window (clamped at 0), else 0.
__host__ __device__ inline int window_first_key(int window, int row) {
  return window > 0 && row >= window ? row - window + 1 : 0;
}

inline int view_heads(const AttnParams& p) { return view_heads(p.diff, p.heads); }

// Order of the fused kernels' CTAs (1-D grid of n_qt query tiles x n_bh (batch, head) pairs), heaviest causal rows
// first either way: head-major keeps the CTAs running at one time on a few heads, so their K/V tiles stay in L2;
// tile-major (every head's heaviest tile, then every head's next) balances short grids. select_attn decides.
struct CtaTile {
  int qt, bh;
};
__host__ __device__ inline CtaTile cta_tile(int cta, int n_qt, int n_bh, bool tile_major) {
  return tile_major ? CtaTile{n_qt - 1 - cta / n_bh, cta % n_bh} : CtaTile{n_qt - 1 - cta % n_qt, cta / n_qt};
}
}  // namespace ds::kern
