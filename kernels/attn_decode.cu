// Decoding attention (attn_decode.h), flash-decoding style: the keys a step's query rows see are cut into `splits`
// equal ranges, each handled by its own CTAs, and a second kernel merges the ranges.
//
// Split kernel. CTAs are (key/value group, row chunk) x split. A group is the set of view heads that read the same
// kv heads: plain heads h with h / n_rep = g (kv head g), or differential heads j with j / n_rep = g (K1 = kv head g,
// K2 = kv head Hkv/2 + g, V = [v_g ; v_{Hkv/2+g}]). The CTA streams each key row of those kv heads once through a
// cp.async pipeline (tiles of 64 keys, 2-4 stages, 16-byte copies, swizzled rows; the query rows come with the
// first tile) for all the group's query rows: every (map, view head, query row) of the group is one row of the
// mma.sync M dimension, 16 rows per M tile (rows of both maps of a differential head share a tile: their logits take
// K1 or K2 by row, and both multiply the same 2d-wide V). The 4 warps split (M tile, keys): with 1 or 2 M tiles per
// CTA they take 16 or 32 keys of each tile apiece, with 4 each warp takes all 64 keys of its M tile. Logits in f32,
// online softmax in log2 units (the scale times log2 e folded in, exp2 on the SFU), P rounded to bf16 for P V, O
// accumulated in f32. At the end the warps' partial results are merged in shared memory and each row's (max, sum,
// unnormalised O) goes to the workspace. The split ranges are computed on the device from *len: the keys [lo, n)
// that the first query row's window starts at, cut into `splits` equal chunks (the last may be shorter); trailing
// splits that get no keys return at once.
//
// Combine kernel. One CTA per (view head, query row): each of 8 warps merges every 8th split of each map online
// (running maximum, sums of l and O rescaled by exp2 of the maximum's moves), the warps' results are merged, then
// for a differential head O1/l1 - lambda O2/l2, its RMS norm over the 2d columns, times out_scale; bf16 out.
//
// Both kernels are launched as programmatic dependents (PDL) where the code that runs is sm_90 code: the split
// kernel's CTAs start while the grid before it drains and wait (griddepcontrol.wait) before reading anything; the
// combine kernel's CTAs start once every split CTA has started and wait for the split kernel to complete, then let
// the grid after them start launching. Nothing in the workspace outlives a launch, so the pair of launches can be
// captured in a CUDA graph and replayed with any length; the grids depend only on the shape, q_rows, max_len and the
// device.
#include "attn_decode.h"
#include "align.h"

#include <algorithm>
#include <cmath>

#include "mma_sm80.cuh"
#include "pdl.cuh"
#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 128;  // split kernel: 4 warps
constexpr int TK = 64;        // keys per pipeline tile
constexpr int MAX_SPLITS = 1024;
constexpr int COMBINE_THREADS = 256;
constexpr int COMBINE_WARPS = COMBINE_THREADS / 32;
constexpr float LOG2E = 1.4426950408889634f;

struct DecodeArgs {
  AttnParams p;
  const int32_t* len;
  float2* ml;  // [groups][rows][splits]: (running max in log2 units, sum of exponentials)
  float* o;    // [groups][rows][splits][DV]: unnormalised output
  float* am;   // [groups][rows][splits]: quantised logits' first kernel, each split's largest |logit| (log2 units)
  int q_rows, splits, groups, gv, rows, views, mtc, stages;
};

// The keys [lo, n) that the query rows see, cut into chunks of `chunk` keys; `used` of the splits get keys.
struct Geometry {
  int lo, chunk, used;
};
__device__ __forceinline__ Geometry geometry(int n, int q_rows, int window, int splits) {
  Geometry g{0, TK, 0};
  if (n <= 0) return g;
  g.lo = window_first_key(window, max(n - q_rows, 0));
  // Equal chunks to the key, not rounded to whole tiles: rounding to 64 keys left splits without keys (at 32K keys
  // and 33 splits: 32 chunks of 1024 instead of 33 of 993), and the slowest CTA sets the launch's time.
  const int range = n - g.lo;
  g.chunk = (range + splits - 1) / splits;
  g.used = (range + g.chunk - 1) / g.chunk;
  return g;
}

// 16-byte cp.async with the L2 prefetch hint for the 256-byte block around the source (the CTAs of neighbouring
// groups read the neighbouring heads of the same rows at about the same time).
__device__ __forceinline__ void cp_async_16_l2(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_wait_stages(int stages) {  // wait until stages - 2 groups are pending
  if (stages >= 4) cp_async_wait<2>();
  else if (stages == 3) cp_async_wait<1>();
  else cp_async_wait<0>();
}

// DP: head dim padded to 64, 128 or 256 (columns past d are zero-filled in Q, K and V). MODE (quantised logits,
// AttnParams::logit_bits): kPlain the attention; kRowMax each row's largest |logit| over the keys of this split
// that it sees, into a.am, nothing else; kQuantised the attention with every logit fake-quantised against the row's
// largest |logit| over all splits (a.am, written by a kRowMax launch just before).
enum DecodeMode { kPlain = 0, kRowMax = 1, kQuantised = 2 };
template <int DP, bool DIFF, int MODE>
__global__ void __launch_bounds__(THREADS) attn_decode_split_kernel(const DecodeArgs a) {
  constexpr int NKV = DIFF ? 2 : 1;          // kv heads (slots) per group
  constexpr int DV = NKV * DP;               // width of the group's V
  constexpr int SEG = TK * DP;               // one [TK][DP] tile of K or V
  constexpr int STAGE = NKV * 2 * SEG;       // K and V of every slot: segment slot * 2 + (0: K, 1: V)
  constexpr int CH = DP / 8;                 // 16-byte chunks per row
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ float sm_m[4][16], sm_l[4][16];
  bf16* const kv_s = reinterpret_cast<bf16*>(smem_raw);
  const int stages = a.stages, mtc = a.mtc, rows_cta = 16 * mtc;
  bf16* const q_s = kv_s + stages * STAGE;

  const AttnParams& p = a.p;
  const int g = int(blockIdx.x) % a.groups, chunk = int(blockIdx.x) / a.groups, split = int(blockIdx.y);
  pdl_wait();  // before reading *len, Q, K or V, or writing the workspace the previous combine may still read
  pdl_launch_dependents();
  const int n = *a.len;
  const Geometry geo = geometry(n, a.q_rows, p.window, a.splits);
  if (split >= geo.used) return;  // the whole CTA: no keys here
  const int kb = geo.lo + split * geo.chunk, ke = min(n, kb + geo.chunk);
  const int ntiles = (ke - kb + TK - 1) / TK;

  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int R = a.q_rows, per_map = a.gv * R;
  const ViewHeadMap hm = view_head_map(DIFF, g * a.gv, p.heads, p.kv_heads);  // the group's kv heads
  const bf16* const kvb = kv_base(p);
  // Element offsets in a row of each segment (slot * 2 + (0: K, 1: V)); named, not indexed, so they stay in registers.
  const int64_t seg_off0 = p.k_off + int64_t(hm.k[0]) * p.d, seg_off1 = p.v_off + int64_t(hm.v[0]) * p.d;
  const int64_t seg_off2 = p.k_off + int64_t(hm.k[1]) * p.d, seg_off3 = p.v_off + int64_t(hm.v[1]) * p.d;

  // The CTA's query rows t = chunk * rows_cta + i: map t / per_map, view head g * gv + (t % per_map) / R, query
  // row t % R. Rows past the group's (or at a negative position) are zero. Copied with the first key tile.
  auto load_q = [&] {
    for (int idx = tid; idx < rows_cta * CH; idx += THREADS) {
      const int i = idx / CH, c8 = (idx % CH) * 8, t = chunk * rows_cta + i;
      const bf16* src = p.qkv;
      bool ok = false;
      if (t < a.rows && c8 < p.d) {
        const int m = t / per_map, u = t % per_map, j = g * a.gv + u / R, pos = n - R + u % R;
        if (j < a.views && pos >= 0) {
          const ViewHeadMap jm = view_head_map(DIFF, j, p.heads, p.kv_heads);
          src = p.qkv + int64_t(pos) * p.row_stride + p.q_off + int64_t(m ? jm.q[1] : jm.q[0]) * p.d + c8;
          ok = true;
        }
      }
      cp_async_16(smem_addr(q_s + swz<DP>(i, c8)), src, ok ? 16 : 0);
    }
  };

  // Keys [key0, key0 + TK) of K and V into stage st; keys at or past ke and columns past d are zero-filled. Thread
  // tid copies 16-byte column chunk tid % CH of rows tid / CH + RS j of every segment, so its source and destination
  // offsets are fixed but for the row.
  constexpr int RS = THREADS / CH;  // rows per pass of the CTA over a segment
  const int lc = tid % CH, lr = tid / CH;
  const bool col_ok = lc * 8 < p.d;
  const int64_t kv_stride = p.kv && p.kv_row_stride > 0 ? p.kv_row_stride : p.row_stride;
  const bf16* const src0 = kvb + seg_off0 + lc * 8;
  const bf16* const src1 = kvb + seg_off1 + lc * 8;
  const bf16* const src2 = kvb + seg_off2 + lc * 8;
  const bf16* const src3 = kvb + seg_off3 + lc * 8;
  auto load_tile = [&](int it, int st) {
    const uint32_t dst = smem_addr(kv_s + st * STAGE);
    const int key0 = kb + it * TK;
#pragma unroll
    for (int seg = 0; seg < NKV * 2; ++seg) {
      if (MODE == kRowMax && (seg & 1)) continue;  // the row-maximum launch reads K alone
      const bf16* const base = seg == 0 ? src0 : seg == 1 ? src1 : seg == 2 ? src2 : src3;
#pragma unroll
      for (int j = 0; j < TK / RS; ++j) {
        const int key = lr + j * RS, k = key0 + key;
        const bool ok = col_ok && k < ke;
        cp_async_16_l2(dst + 2u * uint32_t(seg * SEG + swz<DP>(key, lc * 8)), ok ? base + int64_t(k) * kv_stride : kvb,
                       ok ? 16 : 0);
      }
    }
  };

  // This warp's M tile and key slice; its two accumulator rows (lane / 4 and lane / 4 + 8 of the tile): which map
  // (K slot) each takes, and the keys [klo, khi] of this split it sees (empty for padding rows).
  const int mt = warp % mtc, slice = warp / mtc, kw = TK * mtc / 4;
  int rmap[2], klo[2], khi[2], rpos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = chunk * rows_cta + mt * 16 + (lane >> 2) + 8 * h;
    rmap[h] = 0, klo[h] = 1, khi[h] = 0, rpos[h] = -1;
    if (t < a.rows) {
      const int m = t / per_map, u = t % per_map, j = g * a.gv + u / R, pos = n - R + u % R;
      if (j < a.views && pos >= 0) {
        rmap[h] = m;
        rpos[h] = pos;
        klo[h] = max(window_first_key(p.window, pos), kb);
        khi[h] = min(pos, ke - 1);
      }
    }
  }
  // kQuantised: each accumulator row's largest |logit| over every split that has keys (0 for padding rows).
  float amax[2] = {0.f, 0.f};
  if constexpr (MODE == kQuantised) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = chunk * rows_cta + mt * 16 + (lane >> 2) + 8 * h;
      if (t < a.rows)
        for (int sp = 0; sp < geo.used; ++sp)
          amax[h] = fmaxf(amax[h], a.am[(size_t(g) * size_t(a.rows) + size_t(t)) * size_t(a.splits) + size_t(sp)]);
    }
  }
  float amx[2] = {0.f, 0.f};  // kRowMax: this thread's largest |logit| of each of its rows
  const bool need0 = __any_sync(0xffffffffu, (klo[0] <= khi[0] && rmap[0] == 0) || (klo[1] <= khi[1] && rmap[1] == 0));
  const bool need1 = DIFF && __any_sync(0xffffffffu, (klo[0] <= khi[0] && rmap[0] == 1) ||
                                                         (klo[1] <= khi[1] && rmap[1] == 1));

  float o[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * LOG2E;

  load_q();
  for (int st = 0; st < stages - 1; ++st) {
    if (st < ntiles) load_tile(st, st);
    cp_async_commit();
  }
  // The warp's Q fragments, loaded from shared memory once the first tile (which brought Q) has landed; at DP = 256
  // they are read from shared memory at each use instead (registers).
  constexpr int QREG = DP <= 128 ? DP / 16 : 1;
  uint32_t qf[QREG][4];
  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait_stages(stages);
    __syncthreads();  // tile it has landed for every thread; the stage refilled below was consumed by all warps
    if constexpr (DP <= 128) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < QREG; ++kk)
          ldmatrix_x4(qf[kk], smem_addr(q_s + swz<DP>(mt * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8)));
      }
    }
    {
      const int nx = it + stages - 1;
      if (nx < ntiles) load_tile(nx, nx % stages);
      cp_async_commit();
    }
    const bf16* const ks = kv_s + (it % stages) * STAGE;
    const int key0 = kb + it * TK;
    for (int sub = 0; sub < mtc; ++sub) {
      const int kofs = slice * kw + sub * 16;
      if (key0 + kofs >= ke) break;  // warp-uniform: past the split's end
      float sa[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      float sb[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk) {
        uint32_t qa[4], kf[4];
        if constexpr (DP <= 128) {
          qa[0] = qf[kk][0], qa[1] = qf[kk][1], qa[2] = qf[kk][2], qa[3] = qf[kk][3];
        } else {
          ldmatrix_x4(qa, smem_addr(q_s + swz<DP>(mt * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8)));
        }
        const int krow = kofs + (lane & 7) + ((lane >> 4) << 3), kcol = kk * 16 + ((lane >> 3) & 1) * 8;
        if (need0) {
          ldmatrix_x4(kf, smem_addr(ks + swz<DP>(krow, kcol)));
          mma_16816(sa[0], qa, kf[0], kf[1]);
          mma_16816(sa[1], qa, kf[2], kf[3]);
        }
        if constexpr (DIFF) {
          if (need1) {
            ldmatrix_x4(kf, smem_addr(ks + 2 * SEG + swz<DP>(krow, kcol)));
            mma_16816(sb[0], qa, kf[0], kf[1]);
            mma_16816(sb[1], qa, kf[2], kf[3]);
          }
        }
      }
      // Logits of the row's map in log2 units; keys outside the row's range -inf.
      float x[2][4];
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e >> 1, key = key0 + kofs + nb * 8 + 2 * (lane & 3) + (e & 1);
          float s = sa[nb][e];
          if constexpr (DIFF) s = rmap[h] ? sb[nb][e] : s;
          const bool seen = key >= klo[h] && key <= khi[h] && !(p.nko && knocked_out(p, rpos[h], key));
          if constexpr (MODE == kRowMax) {
            if (seen) amx[h] = fmaxf(amx[h], fabsf(s * sl2));
          } else if constexpr (MODE == kQuantised) {
            x[nb][e] = seen ? quantize_logit(s * sl2, amax[h], p.logit_bits) : -INFINITY;
          } else {
            x[nb][e] = seen ? s * sl2 : -INFINITY;
          }
        }
      if constexpr (MODE != kRowMax) {  // (the row-maximum launch: no softmax, no P V)
        float alpha[2], m_use[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = fmaxf(fmaxf(x[0][2 * h], x[0][2 * h + 1]), fmaxf(x[1][2 * h], x[1][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = lazy_max(m_run[h], mx);
          m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exponentials of -inf are 0
          alpha[h] = ex2_ftz(m_run[h] - m_use[h]);
          m_run[h] = m_new;
        }
        float pr[2][4];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) pr[nb][e] = ex2_ftz(x[nb][e] - m_use[e >> 1]);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          l_run[h] = l_run[h] * alpha[h] + ((pr[0][2 * h] + pr[0][2 * h + 1]) + (pr[1][2 * h] + pr[1][2 * h + 1]));
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
          for (int i = 0; i < DV / 8; ++i) {
            o[i][0] *= alpha[0], o[i][1] *= alpha[0];
            o[i][2] *= alpha[1], o[i][3] *= alpha[1];
          }
        }
        const uint32_t pa[4] = {pack_bf16x2(pr[0][0], pr[0][1]), pack_bf16x2(pr[0][2], pr[0][3]),
                                pack_bf16x2(pr[1][0], pr[1][1]), pack_bf16x2(pr[1][2], pr[1][3])};
#pragma unroll
        for (int nbp = 0; nbp < DV / 16; ++nbp) {
          const int slot = nbp * 16 / DP, col = nbp * 16 % DP;
          uint32_t vf[4];
          ldmatrix_x4_trans(vf, smem_addr(ks + (2 * slot + 1) * SEG +
                                          swz<DP>(kofs + (lane & 7) + ((lane >> 3) & 1) * 8, col + (lane >> 4) * 8)));
          mma_16816(o[2 * nbp], pa, vf[0], vf[1]);
          mma_16816(o[2 * nbp + 1], pa, vf[2], vf[3]);
        }
      }
    }
  }

  // Merge the warps that took slices of the same M tile (through the stage buffers, now idle), write the partials.
  cp_async_wait<0>();
  __syncthreads();
  if constexpr (MODE == kRowMax) {  // the rows' largest |logit| over the warps' slices, to a.am
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      amx[h] = fmaxf(amx[h], __shfl_xor_sync(0xffffffffu, amx[h], 1));
      amx[h] = fmaxf(amx[h], __shfl_xor_sync(0xffffffffu, amx[h], 2));
    }
    if ((lane & 3) == 0) sm_m[warp][lane >> 2] = amx[0], sm_m[warp][(lane >> 2) + 8] = amx[1];
    __syncthreads();
    const int ns = 4 / mtc, rows_here = min(rows_cta, a.rows - chunk * rows_cta);
    for (int i = tid; i < rows_here; i += THREADS) {
      float mx = 0.f;
      for (int sl = 0; sl < ns; ++sl) mx = fmaxf(mx, sm_m[(i >> 4) + sl * mtc][i & 15]);
      a.am[(size_t(g) * size_t(a.rows) + size_t(chunk * rows_cta + i)) * size_t(a.splits) + size_t(split)] = mx;
    }
    return;
  }
  quad_sum(l_run);
  constexpr int PITCH = DV + 8;
  float* const so = reinterpret_cast<float*>(smem_raw);  // [4 warps][16 rows][PITCH]: 256 (DV + 8) <= 2 stages
  {
    const int r0 = lane >> 2;
#pragma unroll
    for (int i = 0; i < DV / 8; ++i) {
      const int col = i * 8 + 2 * (lane & 3);
      *reinterpret_cast<float2*>(so + (warp * 16 + r0) * PITCH + col) = make_float2(o[i][0], o[i][1]);
      *reinterpret_cast<float2*>(so + (warp * 16 + r0 + 8) * PITCH + col) = make_float2(o[i][2], o[i][3]);
    }
    if ((lane & 3) == 0) {
      sm_m[warp][r0] = m_run[0], sm_m[warp][r0 + 8] = m_run[1];
      sm_l[warp][r0] = l_run[0], sm_l[warp][r0 + 8] = l_run[1];
    }
  }
  __syncthreads();
  const int nslices = 4 / mtc, rows_here = min(rows_cta, a.rows - chunk * rows_cta);
  for (int idx = tid; idx < rows_here * (DV / 4); idx += THREADS) {
    const int i = idx / (DV / 4), c4 = (idx % (DV / 4)) * 4, tm = i >> 4, ri = i & 15;
    float mx = -INFINITY;
    for (int s = 0; s < nslices; ++s) mx = fmaxf(mx, sm_m[tm + s * mtc][ri]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float l = 0.f;
    if (mx != -INFINITY) {
      for (int s = 0; s < nslices; ++s) {
        const int w = tm + s * mtc;
        const float f = ex2_ftz(sm_m[w][ri] - mx);
        const float4 v = *reinterpret_cast<const float4*>(so + (w * 16 + ri) * PITCH + c4);
        l += f * sm_l[w][ri];
        acc.x += f * v.x, acc.y += f * v.y, acc.z += f * v.z, acc.w += f * v.w;
      }
    }
    const size_t cell = (size_t(g) * size_t(a.rows) + size_t(chunk * rows_cta + i)) * size_t(a.splits) + size_t(split);
    *reinterpret_cast<float4*>(a.o + cell * DV + c4) = acc;
    if (c4 == 0) a.ml[cell] = make_float2(mx, l);
  }
}

// DV: the padded V width of the split kernel (2 DP for differential heads, DP for plain ones). Each warp merges the
// splits w, w + 8, ... of both maps online (8 splits of each map in flight at a time), then the warps' results are
// merged.
template <int DV>
__global__ void __launch_bounds__(COMBINE_THREADS) attn_decode_combine_kernel(const DecodeArgs a) {
  constexpr int F = DV / 32;  // columns per lane
  constexpr int U = 8;        // splits per warp, map and step
  __shared__ __align__(16) float red_o[2][COMBINE_WARPS][DV];
  __shared__ float red_m[2][COMBINE_WARPS], red_l[2][COMBINE_WARPS], red_x[COMBINE_WARPS];
  const AttnParams& p = a.p;
  const int j = int(blockIdx.x), r = int(blockIdx.y), R = a.q_rows;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int d = p.d, vw = view_width(p.diff, d), nm = p.diff ? 2 : 1, dp = DV / nm;
  bf16* const out = p.out + int64_t(r) * p.out_row_stride + int64_t(j) * vw;
  // *len before the wait: the split kernel does not write it, and this grid starts only once every split CTA has
  // passed its own wait, so whatever wrote it before the split kernel has completed.
  const int n = *a.len, pos = n - R + r;
  const Geometry geo = geometry(n, R, p.window, a.splits);
  pdl_wait();  // the split kernel's partials are complete and visible
  // The next grid may start launching now: its CTAs take the SMs the split kernel has left while this one merges
  // (triggering before the wait brought them in during the split kernel, which was slower at 128K keys).
  pdl_launch_dependents();
  if (pos < 0) {
    for (int e = tid; e < vw; e += COMBINE_THREADS) out[e] = __float2bfloat16(0.f);
    return;
  }
  const int g = j / a.gv, vh = j % a.gv;
  size_t cell0[2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
    cell0[m] = (size_t(g) * size_t(a.rows) + size_t(min(m, nm - 1) * a.gv * R + vh * R + r)) * size_t(a.splits);
  float mw[2] = {-INFINITY, -INFINITY}, lw[2] = {0.f, 0.f}, acc[2][F];
#pragma unroll
  for (int i = 0; i < F; ++i) acc[0][i] = acc[1][i] = 0.f;
  for (int s0 = warp; s0 < geo.used; s0 += U * COMBINE_WARPS) {
    float2 ml[2][U];
    float v[2][U][F];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int s = s0 + u * COMBINE_WARPS;
        ml[m][u] = make_float2(-INFINITY, 0.f);
#pragma unroll
        for (int i = 0; i < F; ++i) v[m][u][i] = 0.f;
        if (s < geo.used && m < nm) {
          ml[m][u] = a.ml[cell0[m] + s];
          const float* src = a.o + (cell0[m] + s) * DV + lane * F;
#pragma unroll
          for (int i = 0; i < F; i += 2) {
            const float2 x = *reinterpret_cast<const float2*>(src + i);
            v[m][u][i] = x.x, v[m][u][i + 1] = x.y;
          }
        }
      }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      float mx = mw[m];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, ml[m][u].x);
      if (mx == -INFINITY) continue;  // no keys for this row in these splits (a window)
      const float sc = exp2f(mw[m] - mx);
      lw[m] *= sc;
#pragma unroll
      for (int i = 0; i < F; ++i) acc[m][i] *= sc;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float f = exp2f(ml[m][u].x - mx);
        lw[m] += f * ml[m][u].y;
#pragma unroll
        for (int i = 0; i < F; ++i) acc[m][i] += f * v[m][u][i];
      }
      mw[m] = mx;
    }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int i = 0; i < F; ++i) red_o[m][warp][lane * F + i] = acc[m][i];
    if (lane == 0) red_m[m][warp] = mw[m], red_l[m][warp] = lw[m];
  }
  __syncthreads();
  float x = 0.f;
  const int e = tid;
  if (e < vw) {
    const int ep = e < d ? e : dp + (e - d);  // padded column (the second half of a differential head's V)
    float val[2] = {0.f, 0.f};
    for (int m = 0; m < nm; ++m) {
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < COMBINE_WARPS; ++w) mx = fmaxf(mx, red_m[m][w]);
      float o = 0.f, l = 0.f;
#pragma unroll
      for (int w = 0; w < COMBINE_WARPS; ++w) {
        const float f = red_m[m][w] == -INFINITY ? 0.f : exp2f(red_m[m][w] - mx);
        o += f * red_o[m][w][ep], l += f * red_l[m][w];
      }
      val[m] = l > 0.f ? o / l : 0.f;
    }
    const float2 c = p.diff ? head_coef(p, j) : make_float2(1.f, 0.f);  // O = c1 O1/l1 - c2 O2/l2
    x = p.diff ? c.x * val[0] - c.y * val[1] : val[0];
  }
  if (p.diff) {
    const float ss = warp_sum(x * x);
    if (lane == 0) red_x[warp] = ss;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < COMBINE_WARPS; ++w) tot += red_x[w];
    x *= p.out_scale * rsqrtf(tot / float(vw) + p.eps);
  }
  if (e < vw) out[e] = __float2bfloat16(x);
}

using SplitKernel = void (*)(DecodeArgs);
template <int MODE>
SplitKernel split_kernel(int dp, bool diff) {
  if (diff) {
    if (dp == 64) return attn_decode_split_kernel<64, true, MODE>;
    if (dp == 128) return attn_decode_split_kernel<128, true, MODE>;
    return nullptr;
  }
  if (dp == 64) return attn_decode_split_kernel<64, false, MODE>;
  if (dp == 128) return attn_decode_split_kernel<128, false, MODE>;
  if (dp == 256) return attn_decode_split_kernel<256, false, MODE>;
  return nullptr;
}
SplitKernel combine_kernel(int dv) {
  if (dv == 64) return attn_decode_combine_kernel<64>;
  if (dv == 128) return attn_decode_combine_kernel<128>;
  if (dv == 256) return attn_decode_combine_kernel<256>;
  return nullptr;
}

struct Plan {
  int dp = 0, dv = 0, views = 0, gv = 0, groups = 0, rows = 0, mtc = 1, mchunks = 1, stages = 2, splits = 1;
  int smem = 0;
  bool pdl = false;  // launch both kernels as programmatic dependents of the grid before them
  size_t ml_bytes = 0, o_bytes = 0, bytes = 0;
  SplitKernel split = nullptr, combine = nullptr, rowmax = nullptr;  // rowmax: quantised logits only
};

// The launch for p, q_rows and max_len on the current device; cudaErrorInvalidValue for a shape the kernels do not
// take, or the error of a device query.
cudaError_t make_plan(const AttnParams& p, int q_rows, int max_len, Plan& pl) {
  if (p.qkv == nullptr || p.out == nullptr || q_rows < 1 || q_rows > 16 || max_len < 1 || p.heads < 1 ||
      p.kv_heads < 1 || p.heads % p.kv_heads != 0 || (p.diff && p.heads % 2 != 0) || p.d < 8 || p.d % 8 != 0 ||
      p.window < 0 || p.logit_bits < 0 || p.logit_bits == 1 || p.logit_bits > 16)
    return cudaErrorInvalidValue;
  if (!aligned16(p.qkv) || (p.kv && !aligned16(p.kv)) || p.row_stride % 8 != 0 || p.q_off % 8 != 0 ||
      p.k_off % 8 != 0 || p.v_off % 8 != 0 || p.row_stride <= 0 || p.kv_row_stride < 0 || p.kv_row_stride % 8 != 0)
    return cudaErrorInvalidValue;
  pl.dp = p.d <= 64 ? 64 : p.d <= 128 ? 128 : p.d <= 256 && !p.diff ? 256 : 0;
  if (pl.dp == 0) return cudaErrorInvalidValue;
  const int nm = p.diff ? 2 : 1;
  pl.dv = nm * pl.dp;
  pl.views = view_heads(p.diff, p.heads);
  pl.gv = p.heads / p.kv_heads;
  pl.groups = (pl.views + pl.gv - 1) / pl.gv;
  pl.rows = nm * pl.gv * q_rows;
  const int mtiles = (pl.rows + 15) / 16;
  pl.mtc = mtiles >= 3 ? 4 : mtiles;
  pl.mchunks = (mtiles + pl.mtc - 1) / pl.mtc;
  // quantised logits: the row-maximum launch, then the split kernel quantising against it
  pl.split = p.logit_bits > 0 ? split_kernel<kQuantised>(pl.dp, p.diff) : split_kernel<kPlain>(pl.dp, p.diff);
  pl.rowmax = p.logit_bits > 0 ? split_kernel<kRowMax>(pl.dp, p.diff) : nullptr;
  pl.combine = combine_kernel(pl.dv);
  if (!pl.split || !pl.combine || (p.logit_bits > 0 && !pl.rowmax)) return cudaErrorInvalidValue;

  int dev = 0, sms = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  const int stage = 256 * pl.dv, q_bytes = 16 * pl.mtc * pl.dp * 2, static_bytes = 2 * 4 * 16 * 4;
  pl.stages = stage <= 16384 ? 4 : 3;
  while (pl.stages > 2 && pl.stages * stage + q_bytes + static_bytes > optin) --pl.stages;
  pl.smem = pl.stages * stage + q_bytes;
  if (pl.smem + static_bytes > optin) return cudaErrorInvalidValue;
  e = cudaFuncSetAttribute(pl.split, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem);
  if (e == cudaSuccess && pl.rowmax)
    e = cudaFuncSetAttribute(pl.rowmax, cudaFuncAttributeMaxDynamicSharedMemorySize, pl.smem);
  if (e != cudaSuccess) return e;
  // Programmatic dependent launch where the code that runs was built for sm_90 or newer (it then holds the
  // griddepcontrol instructions; code JIT-compiled from the compute_80 PTX does not).
  cudaFuncAttributes fs{}, fc{};
  e = cudaFuncGetAttributes(&fs, pl.split);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fc, pl.combine);
  if (e != cudaSuccess) return e;
  pl.pdl = fs.ptxVersion >= 90 && fc.ptxVersion >= 90 && fs.binaryVersion >= 90 && fc.binaryVersion >= 90;
  const int64_t ctas = int64_t(pl.groups) * pl.mchunks;
  // One wave of one split CTA per SM (longer key ranges per CTA, fewer partials to combine): faster than filling
  // the occupancy at every length measured (bench/EXPERIMENTS.md).
  const int64_t want = (int64_t(sms) + ctas - 1) / ctas;
  const int64_t cap = std::min<int64_t>(MAX_SPLITS, (int64_t(max_len) + TK - 1) / TK);
  pl.splits = int(std::max<int64_t>(1, std::min(want, cap)));
  const size_t cells = size_t(pl.groups) * size_t(pl.rows) * size_t(pl.splits);
  pl.ml_bytes = (cells * sizeof(float2) + 255) / 256 * 256;
  pl.o_bytes = cells * size_t(pl.dv) * sizeof(float);
  pl.bytes = pl.ml_bytes + pl.o_bytes + cells * sizeof(float);  // (the last: a.am, read only under quantisation)
  return cudaSuccess;
}

}  // namespace

bool attn_decode_plan(const AttnParams& p, int q_rows, int max_len, AttnDecodePlan* plan) {
  Plan pl;
  if (make_plan(p, q_rows, max_len, pl) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (plan) *plan = {pl.splits, pl.groups * pl.mchunks * pl.splits, TK};
  return true;
}

size_t attn_decode_workspace(const AttnParams& p, int q_rows, int max_len) {
  Plan pl;
  if (make_plan(p, q_rows, max_len, pl) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return pl.bytes;
}

cudaError_t launch_attn_decode(const AttnParams& p, const int32_t* len, int q_rows, int max_len, void* workspace,
                               cudaStream_t stream) {
  if (len == nullptr || workspace == nullptr || !aligned16(workspace)) return cudaErrorInvalidValue;
  Plan pl;
  const cudaError_t e = make_plan(p, q_rows, max_len, pl);
  if (e != cudaSuccess) return e;
  DecodeArgs a;
  a.p = p;
  a.len = len;
  a.ml = static_cast<float2*>(workspace);
  a.o = reinterpret_cast<float*>(static_cast<char*>(workspace) + pl.ml_bytes);
  a.am = reinterpret_cast<float*>(static_cast<char*>(workspace) + pl.ml_bytes + pl.o_bytes);
  a.q_rows = q_rows;
  a.splits = pl.splits;
  a.groups = pl.groups;
  a.gv = pl.gv;
  a.rows = pl.rows;
  a.views = pl.views;
  a.mtc = pl.mtc;
  a.stages = pl.stages;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.attrs = pl.pdl ? attr : nullptr;
  cfg.numAttrs = pl.pdl ? 1 : 0;
  cfg.stream = stream;
  cfg.gridDim = dim3(unsigned(pl.groups * pl.mchunks), unsigned(pl.splits));
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = size_t(pl.smem);
  cudaError_t le = cudaSuccess;
  if (pl.rowmax) {  // quantised logits: each row's largest |logit| first (the split kernel reads it after PDL's wait)
    le = cudaLaunchKernelEx(&cfg, pl.rowmax, a);
    if (le == cudaSuccess) le = cudaGetLastError();
    if (le != cudaSuccess) return le;
  }
  le = cudaLaunchKernelEx(&cfg, pl.split, a);
  if (le == cudaSuccess) le = cudaGetLastError();
  if (le != cudaSuccess) return le;
  cfg.gridDim = dim3(unsigned(pl.views), unsigned(q_rows));
  cfg.blockDim = dim3(COMBINE_THREADS);
  cfg.dynamicSmemBytes = 0;
  le = cudaLaunchKernelEx(&cfg, pl.combine, a);
  return le == cudaSuccess ? cudaGetLastError() : le;
}

}  // namespace ds::kern
