// Warp-wide reductions by butterfly shuffles (every lane of the full warp gets the result), and the pooling of views
// that both view paths share (the signed max-pool's key, the fold of two entries, the fold into a grid cell).
#pragma once
#include <cstdint>
#include <cstring>

namespace ds::kern {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The signed max-pool keeps the entry of largest magnitude with its sign (on a tie, the positive one). As unsigned
// integers the keys (|v|'s bits << 1) | (v >= 0) order entries that way, so the pool is one atomicMax, a
// fire-and-forget reduction with no compare-and-swap loop; max_abs_value decodes a key (0, a zeroed cell, is 0).
__host__ __device__ __forceinline__ unsigned max_abs_key(float v) {
  unsigned b;
  memcpy(&b, &v, 4);
  return ((b & 0x7fffffffu) << 1) | ((b >> 31) ^ 1u);
}
__host__ __device__ __forceinline__ float max_abs_value(unsigned key) {
  const unsigned mag = key >> 1, b = mag == 0 ? 0u : mag | ((key & 1u) ? 0u : 0x80000000u);
  float v;
  memcpy(&v, &b, 4);
  return v;
}

// A view's pooling (kernels/attn_maps.h's accumulators): pool_op folds two entries of one map (a sum for mean
// pooling, else the maximum; the signed map keeps the entry of largest magnitude, the positive one on a tie);
// pool_into folds each map's pooled value into grid cell `cell` with fire-and-forget atomics (g2 null: one map).
__device__ __forceinline__ float pool_op(float a, float b, bool mean, bool signed_max) {
  if (mean) return a + b;
  if (!signed_max) return fmaxf(a, b);
  return fabsf(b) > fabsf(a) || (fabsf(b) == fabsf(a) && b > a) ? b : a;
}
__device__ __forceinline__ void pool_into(float* g1, float* g2, float* gd, int64_t cell, float x1, float x2, float xd,
                                          bool mean) {
  if (mean) {
    atomicAdd(g1 + cell, x1);
    if (g2) atomicAdd(g2 + cell, x2);
    atomicAdd(gd + cell, xd);
  } else {
    atomicMax(reinterpret_cast<int*>(g1 + cell), __float_as_int(x1));  // probabilities are >= 0
    if (g2) atomicMax(reinterpret_cast<int*>(g2 + cell), __float_as_int(x2));
    atomicMax(reinterpret_cast<unsigned*>(gd + cell), max_abs_key(xd));
  }
}

}  // namespace ds::kern
