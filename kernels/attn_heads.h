// The attention conventions every backend shares, stated once: which query, key and value heads a view head reads
// (the DiffLlama head mapping), lambda_init, how many view heads a layer has, and the FLOP convention. Plain C++
// that compiles on the host without CUDA (the CPU backend uses it) and as __host__ __device__ code in kernels.
//
// DiffLlama (transformers' modeling_diffllama.py, eager path): with H query heads and Hkv kv heads there are H/2
// differential heads. Differential head j takes map 1 from query head j and map 2 from query head j + H/2; with
// n_rep = H/Hkv and g = j / n_rep, map 1 reads kv head g and map 2 kv head Hkv/2 + g, and both maps multiply the
// same 2d-wide V = [v_g ; v_{Hkv/2+g}]. Head j writes columns [j*2d, (j+1)*2d) of the attention output row.
// Plain (Llama) head h reads kv head h / n_rep (K and V) and writes columns [h*d, (h+1)*d).
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DS_HD __host__ __device__ __forceinline__
#else
#define DS_HD inline
#endif

namespace ds::kern {

// The heads one view head reads. Plain attention: q[1] == q[0], k[1] == k[0], v[0] == v[1] == k[0].
struct ViewHeadMap {
  int q[2];  // query head of map 1 and map 2
  int k[2];  // kv head whose K each map reads
  int v[2];  // kv heads of V's two d-wide halves (differential); plain: v[0] alone
};

DS_HD ViewHeadMap view_head_map(bool diff, int view_head, int heads, int kv_heads) {
  const int n_rep = heads / kv_heads;
  ViewHeadMap m{};
  if (diff) {
    const int g = view_head / n_rep;
    m.q[0] = view_head, m.q[1] = view_head + heads / 2;
    m.k[0] = m.v[0] = g;
    m.k[1] = m.v[1] = kv_heads / 2 + g;
  } else {
    m.q[0] = m.q[1] = view_head;
    m.k[0] = m.k[1] = m.v[0] = m.v[1] = view_head / n_rep;
  }
  return m;
}

// Heads the tool shows per layer: the differential heads (H/2) or, for plain attention, every query head.
DS_HD int view_heads(bool diff, int heads) { return diff ? heads / 2 : heads; }
// Width of one view head's output (and of its V): 2d for a differential head, d for a plain one.
DS_HD int view_width(bool diff, int d) { return diff ? 2 * d : d; }

// lambda_init(l) = 0.8 - 0.6 exp(-0.3 l) for the 0-based layer index l (Differential Transformer, Ye et al. 2024,
// arXiv 2410.05258, section 2.1; the same formula in transformers' DiffLlama).
inline double lambda_init(int64_t layer) { return 0.8 - 0.6 * std::exp(-0.3 * double(layer)); }

// Forward FLOPs of causal attention over n tokens per sequence: a differential head is 2 maps x 2 n^2 d (Q K^T) plus
// 2 x 2 n^2 (2d) (P V against the 2d-wide V) = 12 n^2 d; a plain head 4 n^2 d; halved for the causal mask.
// A sliding window of w < n keys removes the causal triangle's part left of the band: n^2/2 - (n - w)^2/2 pairs.
inline double attn_flops(bool diff, int64_t view_heads_count, int64_t d, int64_t n, int64_t batch = 1,
                         int64_t window = 0) {
  double pairs = double(n) * double(n) / 2.0;
  if (window > 0 && window < n) pairs -= double(n - window) * double(n - window) / 2.0;
  const double per_head = (diff ? 12.0 : 4.0) * pairs * double(d);
  return per_head * double(view_heads_count) * double(batch);
}

// Pooled views (engine/core/map_query.h): an extent of E cells pooled into B blocks; block b covers offsets
// floor(b E / B) .. floor((b + 1) E / B) - 1, and offset r falls in block floor(((r + 1) B - 1) / E).
DS_HD int view_block(int64_t r, int64_t E, int B) { return int(((r + 1) * int64_t(B) - 1) / E); }
DS_HD int64_t view_block_start(int b, int64_t E, int B) { return int64_t(b) * E / B; }

}  // namespace ds::kern
