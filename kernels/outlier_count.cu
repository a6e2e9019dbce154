// See outlier_count.h.
#include "outlier_count.h"

#include <algorithm>

#include "attn_params.h"

namespace ds::kern {

namespace {

constexpr int kThreads = 256;

// Flat cell index -> whether it counts, its map and value.
__device__ __forceinline__ bool cell(const OutlierCells& c, int64_t i, int& map, float& v) {
  if (!c.causal && c.nmaps == 1) {  // a dense array (the hidden states): no index arithmetic
    map = 0;
    v = c.x[i];
    return true;
  }
  const int64_t k = i % c.n, gr = i / c.n, r = gr % c.rows, g = gr / c.rows;
  if (c.causal) {
    const int row = c.row0 + int(r);
    if (k > row || k < window_first_key(c.window, row)) return false;
  }
  map = int(g % c.nmaps);
  v = c.x[i];
  return true;
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Pass 0 (no prefixes, 12-bit digits) counts into one shared-memory histogram per map, added to the global counts
// once per block. (Tried and measured slower on the H200, bench/EXPERIMENTS.md: adding each digit once per warp with
// __match_any_sync, and two to four histogram copies per map picked by lane, whose 64 KB cut the blocks per SM.)
constexpr int kSmemBins = 4096;  // pass 0's digits (12 bits)

__global__ void __launch_bounds__(kThreads) count_kernel(const OutlierCells c, int shift, int width,
                                                         const uint32_t* prefixes, int nprefix,
                                                         unsigned long long* counts) {
  __shared__ unsigned sh[2][kSmemBins];
  const bool priv = nprefix == 0 && (1 << width) <= kSmemBins && c.nmaps <= 2;
  const uint32_t mask = (1u << width) - 1, hi = uint32_t(shift + width);
  const int bins = 1 << width, H = nprefix > 0 ? nprefix : 1;
  if (priv)
    for (int i = threadIdx.x; i < 2 * kSmemBins; i += kThreads) (&sh[0][0])[i] = 0;
  __syncthreads();
  const int64_t total = c.groups * c.rows * c.n;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    int map;
    float v;
    if (!cell(c, i, map, v)) continue;
    const uint32_t b = abs_bits(v), digit = (b >> shift) & mask;
    if (priv) {
      atomicAdd(&sh[map][digit], 1u);
    } else if (nprefix == 0) {
      atomicAdd(counts + size_t(map) * bins + digit, 1ull);
    } else {
      const uint32_t top = hi >= 32 ? 0u : b >> hi;  // (the top bits of |x| above this pass's digit)
      for (int p = 0; p < nprefix; ++p)
        if (top == prefixes[p]) atomicAdd(counts + (size_t(map) * H + p) * bins + digit, 1ull);
    }
  }
  if (!priv) return;
  __syncthreads();
  for (int m = 0; m < c.nmaps; ++m)
    for (int d = threadIdx.x; d < bins; d += kThreads)
      if (sh[m][d]) atomicAdd(counts + size_t(m) * bins + d, (unsigned long long)sh[m][d]);
}

__global__ void __launch_bounds__(kThreads) collect_kernel(const OutlierCells c, const float* at_least, float* out,
                                                           int cap, unsigned* found) {
  const int64_t total = c.groups * c.rows * c.n;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    int map;
    float v;
    if (!cell(c, i, map, v)) continue;
    const float a = __uint_as_float(abs_bits(v));
    if (!(a >= at_least[map])) continue;
    const unsigned slot = atomicAdd(found + map, 1u);
    if (int(slot) < cap) out[size_t(map) * cap + slot] = a;
  }
}

unsigned grid_for(int64_t total) {
  return unsigned(std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16));
}

}  // namespace

cudaError_t launch_outlier_count(const OutlierCells& c, int shift, int width, const uint32_t* prefixes, int nprefix,
                                 unsigned long long* counts, cudaStream_t stream) {
  const int64_t total = c.groups * c.rows * c.n;
  if (!c.x || total <= 0 || width < 1 || width > 16 || c.nmaps < 1 || c.nmaps > 2 || nprefix < 0 ||
      (nprefix > 0 && !prefixes))
    return cudaErrorInvalidValue;
  count_kernel<<<grid_for(total), kThreads, 0, stream>>>(c, shift, width, prefixes, nprefix, counts);
  return cudaGetLastError();
}

cudaError_t launch_outlier_collect(const OutlierCells& c, const float* at_least, float* out, int cap, unsigned* found,
                                   cudaStream_t stream) {
  const int64_t total = c.groups * c.rows * c.n;
  if (!c.x || total <= 0 || cap < 1 || c.nmaps < 1 || c.nmaps > 2) return cudaErrorInvalidValue;
  collect_kernel<<<grid_for(total), kThreads, 0, stream>>>(c, at_least, out, cap, found);
  return cudaGetLastError();
}

}  // namespace ds::kern
