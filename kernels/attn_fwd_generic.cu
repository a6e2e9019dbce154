// Generic causal attention forward, differential (two maps, V of 2d, inner RMS norm, x (1 - lambda_init)) or plain
// softmax. One warp per query row: lanes take 32 keys at a time for the dot products (each lane one key, q in
// shared memory), the online softmax runs on the warp, then the 32 probabilities are broadcast by shuffles while
// each lane accumulates its own output columns (lane + 32 i), so V rows are read coalesced. A sliding window starts
// the row's keys at its first key (attn_params.h) instead of 0; K and V come from p.kv when it is set.
// Correctness over speed: it is the Llama path and the fallback for head sizes without a fused kernel.
#include "attn_fwd_generic.h"

#include <cmath>

#include "mma_sm80.cuh"
#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int WARPS = 4;
constexpr int DMAX = 256;            // largest head_dim
constexpr int MAXV = 2 * DMAX / 32;  // output columns per lane per map (V of a differential head is 2d wide)


__global__ void __launch_bounds__(WARPS * 32) attn_fwd_generic_kernel(const AttnParams p) {
  __shared__ float sq[WARPS][2][DMAX];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = p.row0 + int(blockIdx.x) * WARPS + warp;
  const int h = int(blockIdx.y), b = int(blockIdx.z);
  const int d = p.d;
  const int nmaps = p.diff ? 2 : 1, VW = view_width(p.diff, d);
  const ViewHeadMap hm = view_head_map(p.diff, h, p.heads, p.kv_heads);
  const int* qh = hm.q;
  const int* kh = hm.k;
  unsigned long long t_start = 0;
  if (p.head_ns && threadIdx.x == 0) t_start = global_timer_ns();
  const bf16* base = p.qkv + int64_t(b) * p.batch_stride;
  const bf16* kvb = kv_base(p) + int64_t(b) * p.batch_stride;
  const float sl2 = p.scale * 1.4426950408889634f;

  if (row < (p.row1 > 0 ? p.row1 : p.n)) {  // warp-uniform
#pragma unroll
    for (int m = 0; m < 2; ++m)
      for (int i = lane; i < d && m < nmaps; i += 32)
        sq[warp][m][i] = __bfloat162float(base[int64_t(row) * p.row_stride + p.q_off + int64_t(qh[m]) * d + i]) * sl2;
    __syncwarp();
    // q . k of key `key` for map m (scaled to log2 units), as the loop below takes it.
    auto dot_of = [&](int key, int m) {
      float dot = 0.f;
      const bf16* kr = kvb + int64_t(key) * p.row_stride + p.k_off + int64_t(kh[m]) * d;
      for (int i = 0; i < d; i += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + i);
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 kf = __bfloat1622float2(k2[e]);
          dot = fmaf(sq[warp][m][i + 2 * e], kf.x, dot);
          dot = fmaf(sq[warp][m][i + 2 * e + 1], kf.y, dot);
        }
      }
      return dot;
    };
    // Quantised logits (AttnParams::logit_bits): the row's largest |score| over the keys it sees, first.
    float amax[2] = {0.f, 0.f};
    if (p.logit_bits > 0) {
      for (int c0 = window_first_key(p.window, row); c0 <= row; c0 += 32) {
        const int key = c0 + lane;
        if (key > row || (p.nko && knocked_out(p, row, key))) continue;
        for (int m = 0; m < nmaps; ++m) amax[m] = fmaxf(amax[m], fabsf(dot_of(key, m)));
      }
      amax[0] = warp_max(amax[0]);
      amax[1] = warp_max(amax[1]);
    }
    float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};
    float acc[2][MAXV];
#pragma unroll
    for (int i = 0; i < MAXV; ++i) acc[0][i] = acc[1][i] = 0.f;

    for (int c0 = window_first_key(p.window, row); c0 <= row; c0 += 32) {
      const int key = c0 + lane;
      const bool valid = key <= row && !(p.nko && knocked_out(p, row, key));
      float pr[2] = {0.f, 0.f};
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        if (m >= nmaps) break;
        float dot = valid ? dot_of(key, m) : 0.f;
        if (valid && p.logit_bits > 0) dot = quantize_logit(dot, amax[m], p.logit_bits);
        const float s = valid ? dot : -INFINITY;
        // finite once a key of the row was valid (key c0 <= row is, unless knocked out)
        const float m_new = fmaxf(m_run[m], warp_max(s));
        const float alpha = m_new == -INFINITY ? 1.f : exp2f(m_run[m] - m_new);
        m_run[m] = m_new;
        pr[m] = valid ? exp2f(s - m_new) : 0.f;
        l_part[m] = l_part[m] * alpha + pr[m];
#pragma unroll
        for (int i = 0; i < MAXV; ++i) acc[m][i] *= alpha;
      }
      const int cnt = min(32, row + 1 - c0);
      for (int kk = 0; kk < cnt; ++kk) {
        const bf16* vr = kvb + int64_t(c0 + kk) * p.row_stride + p.v_off;
        const float p0 = __shfl_sync(0xffffffffu, pr[0], kk);
        const float p1 = __shfl_sync(0xffffffffu, pr[1], kk);
#pragma unroll
        for (int i = 0; i < MAXV; ++i) {
          const int e = lane + 32 * i;
          if (e < VW) {
            const int vh = hm.v[e < d ? 0 : 1];
            const float v = __bfloat162float(vr[int64_t(vh) * d + (e < d ? e : e - d)]);
            acc[0][i] = fmaf(p0, v, acc[0][i]);
            acc[1][i] = fmaf(p1, v, acc[1][i]);
          }
        }
      }
    }
    const float l0 = warp_sum(l_part[0]), l1 = p.diff ? warp_sum(l_part[1]) : 0.f;
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;  // 0: every key knocked out
    float f = 1.f, ss = 0.f;
    if (p.diff) {
      const float2 c = head_coef(p, h);
#pragma unroll
      for (int i = 0; i < MAXV; ++i) {
        const float o = c.x * acc[0][i] * inv0 - c.y * acc[1][i] * inv1;
        acc[0][i] = o;
        if (lane + 32 * i < VW) ss += o * o;
      }
      ss = warp_sum(ss);
      f = rsqrtf(ss / float(VW) + p.eps) * p.out_scale;
    } else {
      f = inv0;
    }
    bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + int64_t(h) * VW;
#pragma unroll
    for (int i = 0; i < MAXV; ++i) {
      const int e = lane + 32 * i;
      if (e < VW) o[e] = __float2bfloat16(acc[0][i] * f);
    }
  }
  if (p.head_ns) {
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(p.head_ns + h, global_timer_ns() - t_start);
  }
}

}  // namespace

bool attn_fwd_generic_supported(int d) { return d > 0 && d % 8 == 0 && d <= DMAX; }

cudaError_t launch_attn_fwd_generic(const AttnParams& p, cudaStream_t stream) {
  if (!attn_fwd_generic_supported(p.d) || p.n <= 0 || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.diff && (p.heads % 2 || p.kv_heads % 2)) return cudaErrorInvalidValue;
  const int rows = (p.row1 > 0 ? p.row1 : p.n) - p.row0;
  if (p.row0 < 0 || rows <= 0 || p.row0 + rows > p.n || p.nko < 0 || p.nko > AttnParams::kMaxKnockouts)
    return cudaErrorInvalidValue;
  const dim3 grid(unsigned((rows + WARPS - 1) / WARPS), unsigned(view_heads(p)), unsigned(p.batch));
  attn_fwd_generic_kernel<<<grid, WARPS * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ds::kern
