// Attention maps for display, from the cached bf16 Q/K of one layer (never materialised during the forward).
// Pass 1 (logits): a block takes 8 query rows x 32 keys of one (head, map); q and k tiles go through shared
// memory in f32 (k rows padded by one word so the 32 lanes, one key each, hit 32 banks); tiles wholly right of
// the diagonal are skipped, and under a sliding window (attn_params.h) the grid starts at the key tile of the first
// row's first key and tiles wholly left of their rows' windows are skipped. Pass 2 (softmax): one warp per (row,
// head) finds the maxima and sums over the row's keys, writes the probabilities in place (zeros right of the
// diagonal and left of the window) and the row statistics of A1, A2 and D = A1 - lambda*A2 over the row's keys.
#include "attn_maps.h"

#include <cmath>

#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int MQ = 8, MK = 32;

// Map m (0, or 1 for differential heads) of view head h: its query head and the kv head of its K.
__device__ __forceinline__ void head_map(const AttnParams& p, int h, int m, int& qh, int& kh) {
  const ViewHeadMap hm = view_head_map(p.diff, h, p.heads, p.kv_heads);
  qh = hm.q[m];
  kh = hm.k[m];
}

__global__ void __launch_bounds__(MQ * MK) map_logits_kernel(const AttnParams p, int row0, int rows, float* maps,
                                                            int head0) {
  extern __shared__ float sm[];
  const int d = p.d, nmaps = p.diff ? 2 : 1;
  float* sq = sm;             // [MQ][d]
  float* sk = sm + MQ * d;    // [MK][d + 1]
  const int hi = int(blockIdx.z) / nmaps, m = int(blockIdx.z) % nmaps, h = head0 + hi;
  const int k0 = (int(blockIdx.x) + window_first_key(p.window, row0) / MK) * MK, r0 = row0 + int(blockIdx.y) * MQ;
  const int r_end = min(row0 + rows, p.n);
  if (k0 > r0 + MQ - 1) return;  // the whole tile is right of the diagonal (uniform over the block)
  if (k0 + MK <= window_first_key(p.window, r0)) return;  // ... or left of the window of its first (and every) row
  int qh, kh;
  head_map(p, h, m, qh, kh);
  for (int i = int(threadIdx.x); i < MQ * d; i += blockDim.x) {
    const int r = i / d, c = i % d, tok = r0 + r;
    sq[i] = tok < r_end ? __bfloat162float(p.qkv[int64_t(tok) * p.row_stride + p.q_off + int64_t(qh) * d + c]) : 0.f;
  }
  const bf16* kvb = kv_base(p);
  for (int i = int(threadIdx.x); i < MK * d; i += blockDim.x) {
    const int r = i / d, c = i % d, tok = k0 + r;
    sk[r * (d + 1) + c] =
        tok < p.n ? __bfloat162float(kvb[int64_t(tok) * p.row_stride + p.k_off + int64_t(kh) * d + c]) : 0.f;
  }
  __syncthreads();
  const int qi = int(threadIdx.x) / MK, kj = int(threadIdx.x) % MK;
  const int row = r0 + qi, key = k0 + kj;
  if (row < r_end && key <= row && key >= window_first_key(p.window, row)) {
    float dot = 0.f;
    for (int c = 0; c < d; ++c) dot = fmaf(sq[qi * d + c], sk[kj * (d + 1) + c], dot);
    maps[((int64_t(hi) * nmaps + m) * rows + (row - row0)) * p.n + key] =
        p.nko && knocked_out(p, row, key) ? -INFINITY : dot * p.scale;
  }
}

__global__ void __launch_bounds__(128) map_softmax_kernel(const AttnParams p, int row0, int rows, float* maps,
                                                          float* row_stats) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int ri = int(blockIdx.x) * 4 + warp, h = int(blockIdx.y);  // h: the head's index among those computed
  const int row = row0 + ri;
  if (ri >= rows || row >= p.n) return;  // warp-uniform; no block barrier below
  const int n = p.n, nmaps = p.diff ? 2 : 1, ncols = row + 1, c_lo = window_first_key(p.window, row);
  float* s1 = maps + ((int64_t(h) * nmaps + 0) * rows + ri) * n;
  float* s2 = p.diff ? maps + ((int64_t(h) * nmaps + 1) * rows + ri) * n : nullptr;
  float mx1 = -INFINITY, mx2 = -INFINITY, mn1 = INFINITY, mn2 = INFINITY;
  for (int c = c_lo + lane; c < ncols; c += 32) {  // -inf: a knocked-out key (not a logit)
    mx1 = fmaxf(mx1, s1[c]);
    if (s1[c] != -INFINITY) mn1 = fminf(mn1, s1[c]);
    if (s2) {
      mx2 = fmaxf(mx2, s2[c]);
      if (s2[c] != -INFINITY) mn2 = fminf(mn2, s2[c]);
    }
  }
  mx1 = warp_max(mx1);
  mx2 = warp_max(mx2);
  mn1 = warp_min(mn1);
  mn2 = warp_min(mn2);
  if (p.logit_bits > 0) {  // quantised logits (AttnParams::logit_bits), as the forward's, before the softmax
    const float a1 = fmaxf(fabsf(mx1 == -INFINITY ? 0.f : mx1), fabsf(mn1 == INFINITY ? 0.f : mn1));
    const float a2 = fmaxf(fabsf(mx2 == -INFINITY ? 0.f : mx2), fabsf(mn2 == INFINITY ? 0.f : mn2));
    for (int c = c_lo + lane; c < ncols; c += 32) {
      if (s1[c] != -INFINITY) s1[c] = quantize_logit(s1[c], a1, p.logit_bits);
      if (s2 && s2[c] != -INFINITY) s2[c] = quantize_logit(s2[c], a2, p.logit_bits);
    }
    __syncwarp();
    mx1 = mx1 == -INFINITY ? mx1 : quantize_logit(mx1, a1, p.logit_bits);
    mx2 = mx2 == -INFINITY ? mx2 : quantize_logit(mx2, a2, p.logit_bits);
  }
  // A row whose every key is knocked out attends to nothing (probabilities 0, entropy 0).
  const bool none1 = mx1 == -INFINITY, none2 = mx2 == -INFINITY;
  if (none1) mx1 = 0.f, mn1 = 0.f;
  if (none2) mx2 = 0.f, mn2 = 0.f;
  float l1 = 0.f, l2 = 0.f;
  for (int c = c_lo + lane; c < ncols; c += 32) {
    l1 += expf(s1[c] - mx1);
    if (s2) l2 += expf(s2[c] - mx2);
  }
  l1 = warp_sum(l1);
  l2 = s2 ? warp_sum(l2) : 1.f;
  const float inv1 = l1 > 0.f ? 1.f / l1 : 0.f, inv2 = l2 > 0.f ? 1.f / l2 : 0.f;
  const float lam = p.diff ? head_coef(p, h).y : 0.f;  // (the statistics are asked of heads 0.. only)
  // entropy(A) = log l - sum_k A_k (s_k - max);  entropy(|D|/S) = log S - sum_k |D_k| log |D_k| / S
  float pu1 = 0.f, pu2 = 0.f, absd = 0.f, dlogd = 0.f, neg = 0.f, dmin = INFINITY, dmax = -INFINITY;
  for (int c = lane; c < n; c += 32) {
    if (c < ncols && c >= c_lo) {
      const float u1 = s1[c] - mx1, a1 = expf(u1) * inv1;
      float a2 = 0.f;
      if (s2) {
        const float u2 = s2[c] - mx2;
        a2 = expf(u2) * inv2;
        if (a2 > 0.f) pu2 += a2 * u2;  // (a knocked-out key: 0, not 0 * -inf)
        s2[c] = a2;
      }
      if (a1 > 0.f) pu1 += a1 * u1;
      s1[c] = a1;
      const float dd = a1 - lam * a2, ad = fabsf(dd);
      absd += ad;
      if (ad > 0.f) dlogd += ad * logf(ad);
      neg += fmaxf(0.f, -dd);
      dmin = fminf(dmin, dd);
      dmax = fmaxf(dmax, dd);
    } else {
      s1[c] = 0.f;
      if (s2) s2[c] = 0.f;
    }
  }
  pu1 = warp_sum(pu1);
  pu2 = warp_sum(pu2);
  absd = warp_sum(absd);
  dlogd = warp_sum(dlogd);
  neg = warp_sum(neg);
  dmin = warp_min(dmin);
  dmax = warp_max(dmax);
  if (lane == 0) {
    float* st = row_stats + (int64_t(h) * rows + ri) * MAP_NSTAT;
    const float a10 = s1[0], a20 = s2 ? s2[0] : 0.f;
    st[MAP_ENTROPY1] = l1 > 0.f ? logf(l1) - pu1 : 0.f;
    st[MAP_ENTROPY2] = s2 && l2 > 0.f ? logf(l2) - pu2 : 0.f;
    st[MAP_ENTROPY_DIFF] = absd > 0.f ? logf(absd) - dlogd / absd : 0.f;
    st[MAP_FIRST1] = a10;
    st[MAP_FIRST2] = a20;
    st[MAP_FIRST_DIFF] = a10 - lam * a20;
    st[MAP_NEG_MASS] = neg;
    st[MAP_DIFF_MIN] = dmin;
    st[MAP_DIFF_MAX] = dmax;
    st[MAP_MAX_LOGIT1] = fmaxf(fabsf(mx1), fabsf(mn1));
    st[MAP_MAX_LOGIT2] = s2 ? fmaxf(fabsf(mx2), fabsf(mn2)) : 0.f;
  }
}

// One block per head: sums (f64), minima and maxima of the rows' statistics, reduced over the block in shared memory.
__global__ void __launch_bounds__(256) stats_reduce_kernel(const float* row_stats, int n, double* out) {
  __shared__ double red[256];
  const int h = int(blockIdx.x), t = int(threadIdx.x);
  const float* st = row_stats + int64_t(h) * n * MAP_NSTAT;
  for (int k = 0; k < MAP_NSTAT; ++k) {
    const bool is_min = k == MAP_DIFF_MIN, is_max = k == MAP_DIFF_MAX || k == MAP_MAX_LOGIT1 || k == MAP_MAX_LOGIT2;
    double acc = is_min ? INFINITY : is_max ? -INFINITY : 0.0;
    for (int r = t; r < n; r += 256) {
      const double v = st[int64_t(r) * MAP_NSTAT + k];
      acc = is_min ? fmin(acc, v) : is_max ? fmax(acc, v) : acc + v;
    }
    red[t] = acc;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
      if (t < s) red[t] = is_min ? fmin(red[t], red[t + s]) : is_max ? fmax(red[t], red[t + s]) : red[t] + red[t + s];
      __syncthreads();
    }
    if (t == 0) out[int64_t(h) * MAP_NSTAT + k] = red[0];
    __syncthreads();
  }
}

// One block per head: each thread sums its strided keys into 12 f64 partials, then the block reduces them.
__global__ void __launch_bounds__(256) row_mass_kernel(const float* maps, int nmaps, int n, int q, float lambda,
                                                       int a0, int a1, double* out) {
  __shared__ double red[12][256];
  const int h = int(blockIdx.x), t = int(threadIdx.x);
  const float* r1 = maps + int64_t(h) * nmaps * n;
  const float* r2 = nmaps == 2 ? r1 + n : nullptr;
  double acc[12] = {};
  for (int k = t; k <= q; k += 256) {
    const double x1 = r1[k], x2 = r2 ? r2[k] : 0.0, d = x1 - double(lambda) * x2;
    const int part = k >= a0 && k < a1 ? 0 : k == 0 ? 1 : 2;
    acc[part * 4 + 0] += x1;
    acc[part * 4 + 1] += x2;
    acc[part * 4 + 2] += d;
    acc[part * 4 + 3] += fabs(d);
  }
#pragma unroll
  for (int i = 0; i < 12; ++i) red[i][t] = acc[i];
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (t < s)
#pragma unroll
      for (int i = 0; i < 12; ++i) red[i][t] += red[i][t + s];
    __syncthreads();
  }
  if (t < 12) out[int64_t(h) * 12 + t] = red[t][0];
}

// One thread per (chunk row, grid column): reduces its row's cells of that column block and folds the result into
// the grid cell of the row's block.
__global__ void __launch_bounds__(256) map_pool_kernel(const float* maps, int nmaps, int rows, int n, int row0,
                                                       ViewPoolArgs v, float* a1, float* a2, float* dd) {
  const int t = int(blockIdx.x) * 256 + int(threadIdx.x);
  const int ri = t / v.cols, j = t % v.cols;
  if (ri >= rows) return;
  const int64_t q = int64_t(row0) + ri;
  if (q < v.q0 || q >= v.q1) return;
  const float* s1 = maps + int64_t(ri) * n;
  const float* s2 = nmaps == 2 ? maps + (int64_t(rows) + ri) * n : nullptr;
  const int64_t Ec = v.k1 - v.k0;
  const int64_t c0 = v.k0 + view_block_start(j, Ec, v.cols), c1 = v.k0 + view_block_start(j + 1, Ec, v.cols);
  float x1 = 0.f, x2 = 0.f, xd = 0.f;
  for (int64_t k = c0; k < c1; ++k) {
    const float p1 = s1[k], p2 = s2 ? s2[k] : 0.f, d = p1 - v.lambda * p2;  // 0 right of the diagonal
    x1 = pool_op(x1, p1, v.mean, false);
    x2 = pool_op(x2, p2, v.mean, false);
    xd = pool_op(xd, d, v.mean, true);
  }
  const int64_t cell = int64_t(view_block(q - v.q0, v.q1 - v.q0, v.rows)) * v.cols + j;
  pool_into(a1, s2 ? a2 : nullptr, dd, cell, x1, x2, xd, v.mean);
}

// The accumulators to values: mean sums divided by their cells' entry counts, signed max keys decoded.
__global__ void __launch_bounds__(256) view_finish_kernel(ViewPoolArgs v, float* a1, float* a2, float* dd) {
  const int64_t t = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (t >= int64_t(v.rows) * v.cols) return;
  if (!v.mean) {
    dd[t] = max_abs_value(reinterpret_cast<const unsigned*>(dd)[t]);
    return;
  }
  const int i = int(t / v.cols), j = int(t % v.cols);
  const int64_t Er = v.q1 - v.q0, Ec = v.k1 - v.k0;
  const float inv = 1.f / (float(view_block_start(i + 1, Er, v.rows) - view_block_start(i, Er, v.rows)) *
                           float(view_block_start(j + 1, Ec, v.cols) - view_block_start(j, Ec, v.cols)));
  a1[t] *= inv;
  if (a2) a2[t] *= inv;
  dd[t] *= inv;
}

}  // namespace

cudaError_t launch_attn_stats_reduce(const float* row_stats, int heads, int n, double* out, cudaStream_t stream) {
  if (heads <= 0 || n <= 0) return cudaErrorInvalidValue;
  stats_reduce_kernel<<<unsigned(heads), 256, 0, stream>>>(row_stats, n, out);
  return cudaGetLastError();
}

cudaError_t launch_attn_row_mass(const float* maps, int heads, int nmaps, int n, int q, float lambda, int a0, int a1,
                                 double* out, cudaStream_t stream) {
  if (heads <= 0 || (nmaps != 1 && nmaps != 2) || q < 0 || q >= n || a0 < 0 || a0 >= a1 || a1 > q + 1)
    return cudaErrorInvalidValue;
  row_mass_kernel<<<unsigned(heads), 256, 0, stream>>>(maps, nmaps, n, q, lambda, a0, a1, out);
  return cudaGetLastError();
}

cudaError_t launch_attn_map_pool(const float* maps, int nmaps, int rows, int n, int row0, const ViewPoolArgs& v,
                                 float* a1, float* a2, float* diff, cudaStream_t stream) {
  if (rows <= 0 || v.rows <= 0 || v.cols <= 0 || (nmaps == 2 && !a2)) return cudaErrorInvalidValue;
  const int64_t threads = int64_t(rows) * v.cols;
  map_pool_kernel<<<unsigned((threads + 255) / 256), 256, 0, stream>>>(maps, nmaps, rows, n, row0, v, a1, a2, diff);
  return cudaGetLastError();
}

cudaError_t launch_attn_view_finish(const ViewPoolArgs& v, float* a1, float* a2, float* diff, cudaStream_t stream) {
  if (v.rows <= 0 || v.cols <= 0) return cudaErrorInvalidValue;
  const int64_t cells = int64_t(v.rows) * v.cols;
  view_finish_kernel<<<unsigned((cells + 255) / 256), 256, 0, stream>>>(v, a1, a2, diff);
  return cudaGetLastError();
}

cudaError_t launch_attn_map_logits(const AttnParams& p, int row0, int rows, float* maps, cudaStream_t stream, int head0,
                                   int nheads) {
  if (nheads < 0) nheads = view_heads(p) - head0;
  if (p.d <= 0 || p.d > 256 || rows <= 0 || p.heads % p.kv_heads || head0 < 0 || nheads <= 0 ||
      head0 + nheads > view_heads(p))
    return cudaErrorInvalidValue;
  const int nmaps = p.diff ? 2 : 1;
  const size_t smem = size_t(MQ * p.d + MK * (p.d + 1)) * sizeof(float);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(map_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const int last_row = min(row0 + rows, p.n) - 1;
  const int kt0 = window_first_key(p.window, row0) / MK;  // key tiles left of the first row's window: none launched
  const dim3 grid(unsigned(last_row / MK + 1 - kt0), unsigned((rows + MQ - 1) / MQ), unsigned(nheads * nmaps));
  map_logits_kernel<<<grid, MQ * MK, smem, stream>>>(p, row0, rows, maps, head0);
  return cudaGetLastError();
}

cudaError_t launch_attn_map_softmax(const AttnParams& p, int row0, int rows, float* maps, float* row_stats,
                                    cudaStream_t stream, int nheads) {
  if (nheads < 0) nheads = view_heads(p);
  if (rows <= 0 || nheads <= 0) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((rows + 3) / 4), unsigned(nheads));
  map_softmax_kernel<<<grid, 128, 0, stream>>>(p, row0, rows, maps, row_stats);
  return cudaGetLastError();
}

}  // namespace ds::kern
