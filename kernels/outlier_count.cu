// See outlier_count.h.
#include "outlier_count.h"

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "attn_params.h"

namespace ds::kern {

namespace {

constexpr int kThreads = 256;

// f(map, value) for every counted cell, over this block's share: a dense array flat (no index arithmetic); logit rows
// a row at a time (the causal cells only, each row's map and key range worked out once).
template <class F>
__device__ __forceinline__ void for_each_cell(const OutlierCells& c, F&& f) {
  if (!c.causal && c.groups * c.rows == 1) {
    const int64_t total = c.n;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
      f(0, c.x[i]);
    return;
  }
  const int64_t R = c.groups * c.rows;
  for (int64_t gr = blockIdx.x; gr < R; gr += gridDim.x) {
    const int64_t r = gr % c.rows, g = gr / c.rows;
    const int map = int(g % c.nmaps);
    int64_t k0 = 0, k1 = c.n;
    if (c.causal) {
      const int row = c.row0 + int(r);
      k0 = window_first_key(c.window, row);
      k1 = std::min<int64_t>(c.n, int64_t(row) + 1);
    }
    const float* x = c.x + gr * c.n;
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) f(map, x[k]);
  }
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Pass 0 (no prefixes, 12-bit digits) counts into one shared-memory histogram per map, added to the global counts
// once per block. (Tried and measured slower on the H200, bench/EXPERIMENTS.md: adding each digit once per warp with
// __match_any_sync, and two to four histogram copies per map picked by lane, whose 64 KB cut the blocks per SM.)
constexpr int kSmemBins = 4096;  // pass 0's digits (12 bits)

__device__ __forceinline__ void collect_one(const OutlierCollect& k, int map, uint32_t b) {
  const float a = __uint_as_float(b);
  if (!(a >= k.at_least[map])) return;
  const unsigned slot = atomicAdd(k.found + map, 1u);
  if (int(slot) < k.cap) k.out[size_t(map) * k.cap + slot] = a;
}

__global__ void __launch_bounds__(kThreads) count_kernel(const OutlierCells c, int shift, int width,
                                                         const uint32_t* prefixes, int nprefix,
                                                         unsigned long long* counts, const OutlierCollect k) {
  __shared__ unsigned sh[2][kSmemBins];
  const bool priv = nprefix == 0 && (1 << width) <= kSmemBins && c.nmaps <= 2;
  const uint32_t mask = (1u << width) - 1, hi = uint32_t(shift + width);
  const int bins = 1 << width, H = nprefix > 0 ? nprefix : 1;
  if (priv)
    for (int i = threadIdx.x; i < 2 * kSmemBins; i += kThreads) (&sh[0][0])[i] = 0;
  __syncthreads();
  for_each_cell(c, [&](int map, float v) {
    const uint32_t b = abs_bits(v), digit = (b >> shift) & mask;
    if (k.at_least) collect_one(k, map, b);
    if (priv) {
      atomicAdd(&sh[map][digit], 1u);
    } else if (nprefix == 0) {
      atomicAdd(counts + size_t(map) * bins + digit, 1ull);
    } else {
      const uint32_t top = hi >= 32 ? 0u : b >> hi;  // (the top bits of |x| above this pass's digit)
      for (int p = 0; p < nprefix; ++p)
        if (top == prefixes[p]) atomicAdd(counts + (size_t(map) * H + p) * bins + digit, 1ull);
    }
  });
  if (!priv) return;
  __syncthreads();
  for (int m = 0; m < c.nmaps; ++m)
    for (int d = threadIdx.x; d < bins; d += kThreads)
      if (sh[m][d]) atomicAdd(counts + size_t(m) * bins + d, (unsigned long long)sh[m][d]);
}

__global__ void __launch_bounds__(kThreads) collect_kernel(const OutlierCells c, const OutlierCollect k) {
  for_each_cell(c, [&](int map, float v) { collect_one(k, map, abs_bits(v)); });
}

// The batched pass over dense arrays: blockIdx.y is the source, blockIdx.x a slice of it read as float4. The
// histograms of the source's prefixes sit in shared memory when they fit (SMEM; added to the global counts once per
// block, nonzero bins only), else every count goes to the global counts. A value matches at most one prefix (the
// prefixes of a pass are distinct).
constexpr int kMaxSmemPrefixes = 64;
constexpr int kDenseSmemBytes = 96 * 1024;

template <bool SMEM>
__global__ void __launch_bounds__(kThreads) count_dense_kernel(const DenseSource* sources, int shift, int width,
                                                               const uint32_t* prefixes, unsigned* counts,
                                                               float* out, unsigned* found, int hcap) {
  extern __shared__ unsigned hist[];
  __shared__ uint32_t pre[kMaxSmemPrefixes];
  const DenseSource s = sources[blockIdx.y];
  if (width == 0 && s.collect_at < 0) return;  // a collection pass: this source collects nothing
  const int bins = 1 << width, H = s.nprefix > 0 ? s.nprefix : 1, HS = min(H, hcap);  // HS: histograms in shared
  const uint32_t mask = uint32_t(bins) - 1, hi = uint32_t(shift + width);
  const uint32_t* gpre = prefixes + s.prefix_at;
  // Up to kRegPrefixes prefixes (the usual pass: the set's middle and the model's) sit in registers, compared with
  // no memory access at all (a shared-memory lookup per value made the prefixed passes issue-bound: 46 % of the
  // memory's rate against 80 % for the first pass); more are compared from shared (or global) memory in a loop.
  constexpr int kRegPrefixes = 4;
  const bool regs = s.nprefix > 0 && s.nprefix <= kRegPrefixes && hi < 32;
  const bool spre = s.nprefix <= kMaxSmemPrefixes;
  if (SMEM)
    for (int i = threadIdx.x; i < HS * bins; i += kThreads) hist[i] = 0;
  if (spre)
    for (int i = threadIdx.x; i < s.nprefix; i += kThreads) pre[i] = gpre[i];
  __syncthreads();
  unsigned* cnt = counts + s.counts_at;
  uint32_t pfx[kRegPrefixes];
#pragma unroll
  for (int p = 0; p < kRegPrefixes; ++p) pfx[p] = regs && p < s.nprefix ? gpre[p] : 0xffffffffu;  // (no top is ~0)
  const auto one = [&](float v) {
    const uint32_t b = abs_bits(v), digit = (b >> shift) & mask;
    int h = 0;
    if (regs) {
      const uint32_t top = b >> hi;
      h = -1;
#pragma unroll
      for (int p = 0; p < kRegPrefixes; ++p)
        if (top == pfx[p]) h = p;
    } else if (s.nprefix > 0) {
      const uint32_t top = hi >= 32 ? 0u : b >> hi;
      h = -1;
      for (int p = 0; p < s.nprefix; ++p)
        if (top == (spre ? pre[p] : gpre[p])) {
          h = p;
          break;
        }
    }
    if (h >= 0 && width > 0) {
      if (SMEM && h < HS) atomicAdd(&hist[h * bins + int(digit)], 1u);
      else atomicAdd(cnt + size_t(h) * size_t(bins) + digit, 1u);
    }
    if (s.collect_at >= 0) {
      const float a = __uint_as_float(b);
      if (a >= s.at_least) {
        const unsigned slot = atomicAdd(found + blockIdx.y, 1u);
        if (int(slot) < s.cap) out[s.collect_at + slot] = a;
      }
    }
  };
  const int64_t stride = int64_t(gridDim.x) * kThreads, first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(s.x) & 15) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(s.x);
    const int64_t n4 = s.count / 4;
    int64_t i = first;
    for (; i + stride < n4; i += 2 * stride) {  // two loads in flight before either is counted
      const float4 v = __ldg(x4 + i), w = __ldg(x4 + i + stride);
      one(v.x), one(v.y), one(v.z), one(v.w);
      one(w.x), one(w.y), one(w.z), one(w.w);
    }
    if (i < n4) {
      const float4 v = __ldg(x4 + i);
      one(v.x), one(v.y), one(v.z), one(v.w);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + first; i < s.count; i += stride) one(s.x[i]);
  if (!SMEM || width == 0) return;
  __syncthreads();
  for (int i = threadIdx.x; i < HS * bins; i += kThreads)
    if (hist[i]) atomicAdd(cnt + i, hist[i]);
}

int sm_count() {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Blocks per source of a pass over dense sources (blockIdx.y the source): each thread reads at least 8 float4, and
// about `per_sm` blocks per multiprocessor over all sources.
int blocks_per_source(int64_t max_count, int nsources, int per_sm) {
  const int64_t per_block = int64_t(kThreads) * 32;
  const int64_t want = (max_count + per_block - 1) / per_block;
  return int(std::max<int64_t>(1, std::min<int64_t>(want, std::max(1, sm_count() * std::max(1, per_sm) / nsources))));
}

unsigned grid_for(int64_t total) {
  return unsigned(std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16));
}

}  // namespace

cudaError_t launch_outlier_count(const OutlierCells& c, int shift, int width, const uint32_t* prefixes, int nprefix,
                                 unsigned long long* counts, cudaStream_t stream, const OutlierCollect& collect) {
  const int64_t total = c.groups * c.rows * c.n;
  if (!c.x || total <= 0 || width < 1 || width > 16 || c.nmaps < 1 || c.nmaps > 2 || nprefix < 0 ||
      (nprefix > 0 && !prefixes) || (collect.at_least && (!collect.out || !collect.found || collect.cap < 1)))
    return cudaErrorInvalidValue;
  count_kernel<<<grid_for(total), kThreads, 0, stream>>>(c, shift, width, prefixes, nprefix, counts, collect);
  return cudaGetLastError();
}

cudaError_t launch_outlier_collect(const OutlierCells& c, const float* at_least, float* out, int cap, unsigned* found,
                                   cudaStream_t stream) {
  const int64_t total = c.groups * c.rows * c.n;
  if (!c.x || total <= 0 || cap < 1 || c.nmaps < 1 || c.nmaps > 2 || !at_least || !out || !found)
    return cudaErrorInvalidValue;
  collect_kernel<<<grid_for(total), kThreads, 0, stream>>>(c, OutlierCollect{at_least, out, cap, found});
  return cudaGetLastError();
}

cudaError_t launch_outlier_count_dense(const DenseSource* sources, int nsources, int64_t max_count, int max_nprefix,
                                       int shift, int width, const uint32_t* prefixes, unsigned* counts,
                                       float* out, unsigned* found, cudaStream_t stream) {
  if (!sources || nsources < 1 || nsources > 65535 || max_count < 1 || max_count > int64_t(UINT32_MAX) || max_nprefix < 0 || width < 0 || width > 16 ||
      shift < 0 || shift + width > 32 || (max_nprefix > 0 && !prefixes) || !counts)
    return cudaErrorInvalidValue;
  const int blocks = blocks_per_source(max_count, nsources, 8);
  const size_t smem = size_t(std::max(1, max_nprefix)) * (size_t(1) << width) * 4;
  const dim3 grid{unsigned(blocks), unsigned(nsources)};
  if (smem <= size_t(kDenseSmemBytes)) {
    // (per device: set at every launch, a host call, as a layer split runs this on several devices)
    const cudaError_t attr =
        cudaFuncSetAttribute(count_dense_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDenseSmemBytes);
    if (attr != cudaSuccess) return attr;
    count_dense_kernel<true>
        <<<grid, kThreads, smem, stream>>>(sources, shift, width, prefixes, counts, out, found, std::max(1, max_nprefix));
  } else {
    count_dense_kernel<false><<<grid, kThreads, 0, stream>>>(sources, shift, width, prefixes, counts, out, found, 0);
  }
  return cudaGetLastError();
}

// --- the selection on the device -----------------------------------------------------------------------------
namespace {

constexpr int kSelectThreads = 1024;  // (a model rank's block sums every source's histogram: 4 bins a thread)

// Block-wide exclusive scan of one u64 per thread; total gets the sum.
__device__ unsigned long long exclusive_scan(unsigned long long v, unsigned long long& total) {
  __shared__ unsigned long long warp_sums[kSelectThreads / 32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  unsigned long long x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  unsigned long long before = 0;
  total = 0;
  for (int w = 0; w < kSelectThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    total += warp_sums[w];
  }
  return before + x - v;
}

// One rank per block: its histogram (its source's, or the sum of every source's for the model's), the digit that
// holds it, its new prefix and floor, and the fold of a source's top rank.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(const SelectPlan p, int shift, int width, bool first,
                                                                bool last) {
  __shared__ long long base_of[kMaxSelectSources];  // where the histogram of the rank's prefix is, per source read
  const int i = int(blockIdx.x);
  RankState r = p.ranks[i];
  if (r.state != 0) return;
  const bool model = i >= 3 * p.nsources;
  const int s0 = model ? 0 : i / 3, s1 = model ? p.nsources : i / 3 + 1;
  for (int s = s0 + int(threadIdx.x); s < s1; s += kSelectThreads) {
    const DenseSource& d = p.table[s];
    int h = 0;
    if (!first) {
      h = -1;
      for (int k = 0; k < d.nprefix; ++k)
        if (p.prefixes[d.prefix_at + k] == r.prefix) h = k;
    }
    base_of[s - s0] = h < 0 ? -1 : d.counts_at + int64_t(h) * (int64_t(1) << width);
  }
  __syncthreads();
  // The rank's histogram into shared memory, read across the threads (coalesced), summed over the sources read
  __shared__ unsigned long long hist[4096];
  const int bins = 1 << width, per = (bins + kSelectThreads - 1) / kSelectThreads;
  for (int d = int(threadIdx.x); d < bins; d += kSelectThreads) {
    unsigned long long c = 0;
    int s = s0;
    for (; s + 8 <= s1; s += 8) {  // eight loads in flight (one at a time, the model's ranks took 36-62 us a pass)
      unsigned v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const long long b = base_of[s - s0 + k];
        v[k] = b >= 0 ? p.counts[b + d] : 0u;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) c += v[k];
    }
    for (; s < s1; ++s)
      if (base_of[s - s0] >= 0) c += p.counts[base_of[s - s0] + d];
    hist[d] = c;
  }
  __syncthreads();
  const int d0 = int(threadIdx.x) * per, d1 = min(bins, d0 + per);
  unsigned long long mine = 0;
  for (int d = d0; d < d1; ++d) mine += hist[d];
  unsigned long long total = 0;
  unsigned long long below = exclusive_scan(mine, total);
  if (threadIdx.x == 0 && r.rank >= total) *p.error = 1;
  if (!(below <= r.rank && r.rank < below + mine)) return;
  int d = d0;
  for (; below + hist[d] <= r.rank; ++d) below += hist[d];
  r.rank -= below;
  r.prefix = (r.prefix << width) | uint32_t(d);
  r.floor = __uint_as_float(r.prefix << shift);
  if (!model && i % 3 == 0) {  // the source's top rank: values at or above its floor, exactly
    const DenseSource& d = p.table[i / 3];
    const unsigned long long above = static_cast<unsigned long long>(d.whole ? d.whole : d.count) - (r.rank0 - r.rank);
    if (above <= static_cast<unsigned long long>(p.cap) || last) r.state = 1;
  }
  p.ranks[i] = r;
}

// One thread per source: the next pass's table row.
__global__ void plan_kernel(const SelectPlan p) {
  const int s = int(blockIdx.x) * blockDim.x + int(threadIdx.x);
  if (s >= p.nsources) return;
  DenseSource d = p.table[s];
  d.collect_at = -1;  // a source collects in one pass only
  RankState& top = p.ranks[3 * s];
  if (top.state == 1) {
    d.collect_at = int64_t(s) * p.cap, d.cap = p.cap, d.at_least = top.floor;
    top.state = 2;
  }
  uint32_t* list = p.prefixes + int64_t(s) * kSelectPrefixes;
  int n = 0;
  auto add = [&](const RankState& r) {
    if (r.state != 0) return;
    for (int k = 0; k < n; ++k)
      if (list[k] == r.prefix) return;
    if (n == kSelectPrefixes) {
      *p.error = 1;
      return;
    }
    list[n++] = r.prefix;
  };
  for (int k = 0; k < 3; ++k) add(p.ranks[3 * s + k]);
  add(p.ranks[3 * p.nsources]), add(p.ranks[3 * p.nsources + 1]);
  d.prefix_at = s * kSelectPrefixes, d.nprefix = n;
  p.table[s] = d;
}

// The compaction after the first pass (SelectPlan::compact): source blockIdx.y's values whose bits above the first
// digit (b >> hi, 31 - hi <= 12 bits) are marked in a table of its prefixes (and of every prefix from its top rank's
// on, while that rank is unplaced), staged per warp in shared memory and appended to the source's copy with one global
// atomic a flush (no block-wide barrier after the table: a version staging per block, with two barriers a round, took
// 221 us over 16 x 4096 x 2048 values against 172 us for the first pass); a top rank folded at the first pass collects
// here (as a counting pass would). A warp reads 64 consecutive float4 a round, the next round's loads in flight.
constexpr int kWarpStage = 512;  // staged values a warp (16 KB a block); a round adds at most 32 * 8
__global__ void __launch_bounds__(kThreads) compact_kernel(const SelectPlan p, int hi, float* out, unsigned* found) {
  __shared__ float stage_all[kThreads / 32][kWarpStage];
  __shared__ uint8_t keep[4096];  // one per value of b >> hi
  const int s = int(blockIdx.y), tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const DenseSource d = p.table[s];
  const RankState top = p.ranks[3 * s];
  const int nbits = 1 << (31 - hi);
  for (int t = tid; t < 4096; t += kThreads) {
    bool on = top.state == 0 && uint32_t(t) >= top.prefix;
    for (int q = 0; q < d.nprefix; ++q) on |= p.prefixes[d.prefix_at + q] == uint32_t(t);
    keep[t] = on && t < nbits;
  }
  __syncthreads();
  float* const stage = stage_all[warp];
  float* const dst = p.compact + int64_t(s) * p.compact_cap;
  unsigned staged = 0;  // (the same in every lane)
  auto flush = [&] {
    __syncwarp();
    unsigned at = 0;
    if (lane == 0) at = atomicAdd(p.compact_n + s, staged);
    at = __shfl_sync(0xffffffffu, at, 0);
    for (unsigned i = unsigned(lane); i < staged; i += 32)
      if (int64_t(at) + i < p.compact_cap) dst[at + i] = stage[i];
    __syncwarp();
    staged = 0;
  };
  const bool collect = d.collect_at >= 0;
  // One round: this lane's up to 8 values (valid: the first `nv`; FULL: all 8) staged where kept, collected where
  // asked.
  auto round = [&](auto full_tag, const float (&v)[8], const int nv) {
    constexpr bool FULL = decltype(full_tag)::value;
    uint32_t b[8];
    unsigned mask = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      b[k] = abs_bits(v[k]);
      if ((FULL || k < nv) && keep[b[k] >> hi]) mask |= 1u << k;
    }
    if (collect) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if ((FULL || k < nv) && __uint_as_float(b[k]) >= d.at_least) {
          const unsigned slot = atomicAdd(found + s, 1u);
          if (int(slot) < d.cap) out[d.collect_at + slot] = __uint_as_float(b[k]);
        }
    }
    const unsigned m = unsigned(__popc(mask));
    unsigned incl = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    unsigned at = staged + incl - m;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if ((mask >> k) & 1u) stage[at++] = __uint_as_float(b[k]);
    staged += __shfl_sync(0xffffffffu, incl, 31);
    if (staged > unsigned(kWarpStage - 32 * 8)) flush();
  };
  const bool aligned = (reinterpret_cast<uintptr_t>(d.x) & 15) == 0;
  const int64_t n4 = aligned ? d.count / 4 : 0;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32), step = warps * 64;
  const float4* x4 = reinterpret_cast<const float4*>(d.x);
  auto load = [&](const int64_t i) { return i < n4 ? __ldg(x4 + i) : float4{0, 0, 0, 0}; };
  int64_t r0 = (int64_t(blockIdx.x) * (kThreads / 32) + warp) * 64;
  float4 a = load(r0 + lane), c = load(r0 + 32 + lane);  // the next round's loads issued before this one's work
  for (; r0 < n4; r0 += step) {
    const float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
    a = load(r0 + step + lane), c = load(r0 + step + 32 + lane);
    if (r0 + 64 <= n4)  // (warp-uniform)
      round(std::true_type{}, v, 8);
    else
      round(std::false_type{}, v, r0 + lane < n4 ? (r0 + 32 + lane < n4 ? 8 : 4) : 0);
  }
  // The values after the last float4 (or every value of a source not 16-byte aligned), 8 a lane a round.
  const int64_t rest = d.count - n4 * 4;
  for (int64_t r1 = (int64_t(blockIdx.x) * (kThreads / 32) + warp) * 256; r1 < rest; r1 += warps * 256) {
    float v[8];
    int nv = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {  // (a lane's index grows with k: its valid values are the first nv)
      const int64_t i = r1 + int64_t(k) * 32 + lane;
      v[k] = i < rest ? d.x[n4 * 4 + i] : 0.f;
      nv += i < rest;
    }
    round(std::false_type{}, v, nv);
  }
  if (staged) flush();
}

// After the compaction: each source's later passes read its copy where it held every value kept (the count the
// ranks are over kept in `whole`), else the whole source again; the first pass's collection is done.
__global__ void adopt_kernel(const SelectPlan p) {
  const int s = int(blockIdx.x) * blockDim.x + int(threadIdx.x);
  if (s >= p.nsources) return;
  DenseSource d = p.table[s];
  if (d.whole == 0) d.whole = d.count;
  d.collect_at = -1;
  const unsigned n = p.compact_n[s];
  if (int64_t(n) <= p.compact_cap) d.x = p.compact + int64_t(s) * p.compact_cap, d.count = n;
  p.table[s] = d;
}

// One block a source: its collected values (at most 1024) sorted largest first by a bitonic network in shared memory
// (the host's nth_element and sort over 16 such sets took 20-200 us after the wait), the first k written.
constexpr int kSortThreads = 1024;
__global__ void __launch_bounds__(kSortThreads) sort_top_kernel(const float* vals, int cap, const unsigned* found,
                                                                float* top, int k) {
  __shared__ float v[kSortThreads];
  const int s = int(blockIdx.x), i = int(threadIdx.x);
  const unsigned n = found[s];
  if (n > unsigned(cap)) return;
  v[i] = unsigned(i) < n ? vals[int64_t(s) * cap + i] : -1.f;  // (the values are |x| >= 0: padding sorts last)
  __syncthreads();
  for (int size = 2; size <= kSortThreads; size <<= 1)
    for (int j = size >> 1; j > 0; j >>= 1) {
      const int o = i ^ j;
      if (o > i) {
        const bool desc = (i & size) == 0;
        const float a = v[i], b = v[o];
        if (desc ? a < b : a > b) v[i] = b, v[o] = a;
      }
      __syncthreads();
    }
  if (i < k && unsigned(i) < n) top[int64_t(s) * k + i] = v[i];
}

}  // namespace

cudaError_t launch_outlier_sort_top(const SelectPlan& plan, const float* out, const unsigned* found, float* top, int k,
                                    cudaStream_t stream) {
  if (plan.nsources < 1 || plan.cap < 1 || plan.cap > kSortThreads || !out || !found || !top || k < 1 ||
      k > plan.cap)
    return cudaErrorInvalidValue;
  sort_top_kernel<<<plan.nsources, kSortThreads, 0, stream>>>(out, plan.cap, found, top, k);
  return cudaGetLastError();
}

cudaError_t launch_outlier_select(const SelectPlan& plan, int shift, int width, bool first, bool last,
                                  cudaStream_t stream) {
  if (plan.nsources < 1 || plan.nsources > kMaxSelectSources || !plan.table || !plan.prefixes || !plan.counts ||
      !plan.ranks || plan.cap < 1 || !plan.error || width < 1 || width > 12 || shift < 0 || shift + width > 31)
    return cudaErrorInvalidValue;
  select_kernel<<<3 * plan.nsources + 2, kSelectThreads, 0, stream>>>(plan, shift, width, first, last);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  plan_kernel<<<(plan.nsources + 127) / 128, 128, 0, stream>>>(plan);
  return cudaGetLastError();
}

namespace {
cudaError_t launch_compact(const SelectPlan& plan, int hi, int64_t max_count, float* out, unsigned* found,
                           cudaStream_t stream) {
  if (hi < 19 || hi > 30 || plan.compact_cap < 1 || !plan.compact_n)  // (31 - hi <= 12 bits: the table's 4096)
    return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(plan.compact_n, 0, size_t(plan.nsources) * 4, stream);
  if (e != cudaSuccess) return e;
  // one wave: as many blocks as stay resident (its registers allow fewer than the counting passes' eight an SM)
  static std::atomic<int> resident_on[64];  // per device (a host call each time cost a few us); 0: not yet asked
  int dev = 0;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
  int resident = dev < 64 ? resident_on[dev].load(std::memory_order_relaxed) : 0;
  if (resident == 0 &&
      (e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, compact_kernel, kThreads, 0)) != cudaSuccess)
    return e;
  if (dev < 64) resident_on[dev].store(resident, std::memory_order_relaxed);
  const int blocks = blocks_per_source(max_count, plan.nsources, resident);
  compact_kernel<<<dim3{unsigned(blocks), unsigned(plan.nsources)}, kThreads, 0, stream>>>(plan, hi, out, found);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  adopt_kernel<<<(plan.nsources + 127) / 128, 128, 0, stream>>>(plan);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_outlier_select_passes(const SelectPlan& plan, int passes, const int* shift, const int* width,
                                         int64_t max_count, float* out, unsigned* found, cudaStream_t stream) {
  if (passes < 1 || !shift || !width || !out || !found || (plan.compact && shift[0] + width[0] != 31))
    return cudaErrorInvalidValue;
  for (int pass = 0; pass < passes; ++pass) {
    if (width[pass] > 12) return cudaErrorInvalidValue;  // (the counts hold 4096 bins a prefix)
    cudaError_t e = cudaMemsetAsync(plan.counts, 0, size_t(plan.nsources) * kSelectPrefixes * 4096 * 4, stream);
    // (shared histograms: one on the first pass; two after, a set's middles and the model's, usually)
    if (e == cudaSuccess)
      e = launch_outlier_count_dense(plan.table, plan.nsources, max_count, pass == 0 ? 0 : 2, shift[pass], width[pass],
                                     plan.prefixes, plan.counts, out, found, stream);
    if (e == cudaSuccess) e = launch_outlier_select(plan, shift[pass], width[pass], pass == 0, pass == passes - 1, stream);
    if (e == cudaSuccess && pass == 0 && passes > 1 && plan.compact)
      e = launch_compact(plan, shift[0], max_count, out, found, stream);
    if (e != cudaSuccess) return e;
  }
  return launch_outlier_count_dense(plan.table, plan.nsources, max_count, 0, 0, 0, plan.prefixes, plan.counts, out,
                                    found, stream);
}

}  // namespace ds::kern
