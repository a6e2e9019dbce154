// Warp-wide reductions by butterfly shuffles (every lane of the full warp gets the result), and the atomic of the
// signed max-pool.
#pragma once

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

// *at = v when |v| > |*at| (on a tie the larger value wins): the max-pool of a signed map keeps the entry of
// largest magnitude with its sign.
__device__ __forceinline__ void atomic_max_abs(float* at, float v) {
  unsigned* a = reinterpret_cast<unsigned*>(at);
  unsigned old = *a;
  while (true) {
    const float cur = __uint_as_float(old);
    if (!(fabsf(v) > fabsf(cur) || (fabsf(v) == fabsf(cur) && v > cur))) return;
    const unsigned seen = atomicCAS(a, old, __float_as_uint(v));
    if (seen == old) return;
    old = seen;
  }
}

}  // namespace ds::kern
