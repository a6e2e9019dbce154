// Parameters shared by the attention kernels (fused differential, generic fallback, maps). Q, K and V are read in
// place from the fused QKV projection output: each token is one row of `row_stride` bf16 elements holding
//   [ Q heads 0..H-1 (d each) | K heads 0..Hkv-1 (d each) | V heads 0..Hkv-1 (d each) ]
// at element offsets q_off / k_off / v_off; `batch_stride` separates sequences of the same length n.
//
// DiffLlama head mapping (REFERENCE 2a): differential head j in [0, H/2) takes map 1 from query head j and map 2
// from query head j + H/2; with n_rep = H/Hkv and g = j / n_rep, K1 = kv head g, K2 = kv head Hkv/2 + g, and both
// maps multiply the 2d-wide V = [v_g ; v_{Hkv/2+g}]. Output of head j: columns [j*2d, (j+1)*2d) of the out row.
// Plain (Llama) head h: K, V = kv head h / n_rep; output columns [h*d, (h+1)*d).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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
  bool tile_major = false;                // CTA order (set by the fused kernels' launchers, see CtaTile)
};

inline int view_heads(const AttnParams& p) { return p.diff ? p.heads / 2 : p.heads; }

// Order of the fused kernels' CTAs (1-D grid of n_qt query tiles x n_bh (batch, head) pairs), heaviest causal rows
// first either way. Head-major keeps the CTAs running at one time on a few heads, so their K/V tiles stay in L2
// (measured faster at 2048 x 8 than spreading them, bench/cuda_notes.md v6); tile-major (every head's heaviest
// tile, then every head's next) balances short grids: a 1 x 1024 prompt with 12 differential heads is 192 CTAs of
// 1..16 key tiles on 132 SMs, and its simulated makespan is a third shorter. Tile-major is used when the K and V
// of the whole launch fit in half of L2, so that spreading costs no L2 misses. DS_ATTN_ORDER=head or =tile forces one
// (tests, benchmarks).
struct CtaTile {
  int qt, bh;
};
__host__ __device__ inline CtaTile cta_tile(int cta, int n_qt, int n_bh, bool tile_major) {
  return tile_major ? CtaTile{n_qt - 1 - cta / n_bh, cta % n_bh} : CtaTile{n_qt - 1 - cta % n_qt, cta / n_qt};
}
inline bool attn_tile_major(const AttnParams& p) {
  if (const char* e = std::getenv("DS_ATTN_ORDER")) {
    if (std::strcmp(e, "head") == 0) return false;
    if (std::strcmp(e, "tile") == 0) return true;
  }
  static int l2[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return false;
  }
  if (l2[dev] == 0 && cudaDeviceGetAttribute(&l2[dev], cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
    cudaGetLastError();
    l2[dev] = -1;
  }
  const double kv_bytes = double(p.batch) * p.n * p.kv_heads * p.d * 2 /* K and V */ * sizeof(bf16);
  return l2[dev] > 0 && kv_bytes <= 0.5 * l2[dev];
}

}  // namespace ds::kern
