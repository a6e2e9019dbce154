// Warp-wide reductions by butterfly shuffles (every lane of the full warp gets the result), and the key of the
// signed max-pool.
#pragma once
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

}  // namespace ds::kern
