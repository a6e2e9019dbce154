// Fused differential attention, forward, causal, on mma.sync (sm_80 and newer; the portable kernel): for each
// differential head one pass over the K/V tiles computes both online softmaxes (Q1 K1^T and Q2 K2^T) and both
// accumulations against the shared 2d-wide V tile, then writes  (1 - lambda_init) * RMSNorm_2d(O1/l1 - lambda O2/l2)
// in bf16. bf16 inputs, f32 accumulation and softmax statistics (FlashAttention-2 style: exp2 with the scale
// folded in, rescale on a new row maximum).
//
// Work split (why): a CTA owns BM = 64 query rows of one differential head and runs 8 warps; a warp computes one
// map's S = Q K^T and softmax for 16 rows. A 16-row x 2d-wide f32 accumulator is 2d/8 * 4 registers per thread (128
// at d = 128, FA2's budget for its d = 256 path), so a warp cannot hold both maps' full accumulators. Every tile is
// XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free. The diagonal tile comes first (it needs the causal
// mask and guarantees a finite row maximum), query tiles are launched heaviest first. Copies: every thread copies
// fixed 16-byte column chunks (TileCopy) with cp.async; the diagonal tile goes out whole with bounds, every later
// tile is full and goes out two copies per k step of the S products. One CTA barrier per key tile. The O rescale
// is skipped when no row of the warp found a new maximum.
//
// Three schedules of the P V products (mma_schedule picks the fastest that the device's shared memory fits):
//  1 lockstep: warps 0-3 take map 1, 4-7 map 2; each accumulates its own map over all 2d columns of V (O1 or O2
//    whole); at the end map 2 parks O2/l2 in shared memory and map 1 combines, normalises and stores.
//  2 V-split: warps w and w + 4 own the same 16 rows (map 1 and map 2). After the softmax they swap P and the
//    rescale factors through shared memory, and each accumulates BOTH maps over half of V's columns (warp w columns
//    [0, d), warp w + 4 [d, 2d)): every V fragment read with ldmatrix feeds two mma.sync, so a warp reads 72
//    instead of 104 ldmatrix tiles per key tile at d = 128, for 2 x 2 KB of P exchanged and a second barrier.
//    The epilogue swaps l and the sums of squares; each warp stores its half of the 2d columns.
//  3 V-split with skew (d = 128): the pairs are warps 2i and 2i + 1, so that each scheduler holds a warp of the
//    first two pairs ("early") and one of the last two ("late"), and the late warps run half a tile behind: one
//    warp's ldmatrix-bound S products and softmax overlap the other's P V products (see the kernel).
// Measured on the H200 (bench/cuda_notes.md): the copy plans and the skipped rescale +23-28% (d = 128 200-233 ->
// 246-298 TFLOP/s); V-split a further +5-9% at d = 128 (264-316 TFLOP/s), +1-3% at d = 64; the skew +3-5% over
// V-split at d = 128 (269-331 TFLOP/s). At d = 64 two V-split CTAs share an SM and the skewed kernel (one CTA
// per SM, 114 KB) was 6-9% slower. Tried and not kept: an FA3-style ping-pong with strict turns (4-30% slower: one
// warp alone does not keep mma.sync's pipe busy); the late warps issuing their copies during P V (1% slower).
//
// Shared memory: Q 2 x 64 x d + 2 stages x (K1, K2, V) = 160 KB at d = 128, 80 KB at d = 64; V-split adds 18 KB;
// the skew needs a third V stage (210 KB at d = 128).
#include "diff_attn_fwd.h"

#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "mma_sm80.cuh"

namespace ds::kern {
namespace {

constexpr int BM = 64, BN = 64, THREADS = 256;

// exp2 on the special-function unit, flushing denormal results to zero (they are below bf16's P resolution);
// exp2f adds range fix-ups around the same instruction.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int D>
struct Tile {
  static constexpr int VW = 2 * D;            // width of V and of the output of one differential head
  static constexpr int Q_ELEMS = 2 * BM * D;  // both maps
  static constexpr int K_ELEMS = BN * D;      // one map
  static constexpr int V_ELEMS = BN * VW;
  // lockstep: [Q][2 stages][K1 | K2 | V]
  static constexpr int STAGE_ELEMS = 2 * K_ELEMS + V_ELEMS;
  static constexpr int SMEM_LOCKSTEP = (Q_ELEMS + 2 * STAGE_ELEMS) * 2;
  static constexpr int MIN_BLOCKS = D == 64 ? 2 : 1;
  static_assert(BM * VW * 4 <= 2 * STAGE_ELEMS * 2, "O2 staging must fit in the K/V stages");
  // V-split: the lockstep stages, then the exchange area [4 row groups][2 maps]: P fragments (4 x 32 lanes x 16 B)
  // and per-lane pairs of floats (alpha, later l and the sums of squares).
  static constexpr int XP_BYTES = 4 * 2 * (BN / 16) * 32 * 16, XF_BYTES = 4 * 2 * 32 * 8;
  static constexpr int SMEM_VSPLIT = SMEM_LOCKSTEP + XP_BYTES + XF_BYTES;
  static_assert(MIN_BLOCKS * SMEM_VSPLIT <= 227 * 1024, "shared memory");
  // V-split with skew (one CTA per SM): Q, 2 stages of K1 | K2, 3 stages of V, then the exchange area.
  static constexpr int SKEW_XP = (Q_ELEMS + 4 * K_ELEMS + 3 * V_ELEMS) * 2;
  static constexpr int SMEM_VSKEW = SKEW_XP + XP_BYTES + XF_BYTES;
};

// A thread's share of copying a ROWS x W bf16 tile into a swizzled shared tile with NTHR threads: one 16-byte
// column chunk c of rows r + i * (rows per pass). Source pointer, chunk and swizzle are fixed per thread, so a copy
// costs an address add and the cp.async (runtime-bounded loops spent ~36 instructions per copy, all between the
// barrier and the first mma: bench/cuda_notes.md, v4 -> v5 on the wgmma kernel and the same fix here).
template <int ROWS, int W, int NTHR>
struct TileCopy {
  static constexpr int CPR = W / 8, RPP = NTHR / CPR, PASSES = ROWS / RPP;
  static_assert(NTHR % CPR == 0 && ROWS % RPP == 0 && RPP % 8 == 0, "copy plan (rows r + i * RPP share r's swizzle)");
  int c, r, dst;  // dst: element offset of this thread's first chunk in the swizzled tile
  __device__ explicit TileCopy(int t) : c(t % CPR), r(t / CPR), dst(r * W + ((c ^ (r & 7)) << 3)) {}
  // src: this thread's first chunk, i.e. column c * 8 of the tile's row r (row stride rs elements); rows >=
  // rows_left are zero-filled.
  __device__ __forceinline__ void issue(bf16* tile, const bf16* src, int64_t rs, int rows_left, const bf16* any) const {
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const bool ok = r + i * RPP < rows_left;
      cp_async_16(smem_addr(tile + dst + i * RPP * W), ok ? src + i * RPP * rs : any, ok ? 16 : 0);
    }
  }
  // Pass i of a tile whose rows all exist.
  __device__ __forceinline__ void pass(bf16* tile, const bf16* src, int64_t rs, int i) const {
    cp_async_16(smem_addr(tile + dst + i * RPP * W), src + i * RPP * rs, 16);
  }
};

// S = Q K^T for this warp's 16 rows x BN keys. after_step(kk) runs once each k step's products are issued: the
// kernels issue two of the next tile's copies there, between dependent ldmatrix and mma, rather than as a block of
// their own after the products (which held 10% of the V-split kernel's stall samples in Nsight Compute; measured
// equal speed, bench/cuda_notes.md, and it drops the bounds checks of every tile after the first).
template <int D, class AfterStep>
__device__ __forceinline__ void warp_qk(float (&s)[BN / 8][4], const bf16* sQm, const bf16* sK, int wrow, int lane,
                                        AfterStep&& after_step) {
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, smem_addr(sQm + swz<D>(wrow + (lane & 15), kk * 16 + (lane >> 4) * 8)));
#pragma unroll
    for (int nn = 0; nn < BN / 16; ++nn) {
      uint32_t bb[4];
      ldmatrix_x4(bb, smem_addr(sK + swz<D>(nn * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8)));
      mma_16816(s[2 * nn], a, bb[0], bb[1]);
      mma_16816(s[2 * nn + 1], a, bb[2], bb[3]);
    }
    after_step(kk);
  }
}

// Diagonal tile (key tile == query tile): key column > query row is masked.
__device__ __forceinline__ void mask_diagonal(float (&s)[BN / 8][4], int wrow, int lane) {
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + 2 * (lane & 3) + (e & 1);
      const int row = wrow + (lane >> 2) + (e >> 1) * 8;
      if (col > row) s[nt][e] = -INFINITY;
    }
}

// Online softmax of one tile for rows lane/4 (r = 0) and lane/4 + 8 (r = 1): s becomes P (f32, unnormalised),
// m_run / l_run move on, alpha is the factor for the accumulator.
__device__ __forceinline__ void online_softmax(float (&s)[BN / 8][4], float (&m_run)[2], float (&l_run)[2],
                                               float (&alpha)[2], float sl2) {
  float mx[2] = {-INFINITY, -INFINITY}, rs[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt) {
    mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r] * sl2);  // finite: the diagonal tile comes first
    alpha[r] = ex2_approx(m_run[r] - m_new);
    m_run[r] = m_new;
  }
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = ex2_approx(fmaf(s[nt][e], sl2, -m_run[e >> 1]));
      rs[e >> 1] += s[nt][e];
    }
  l_run[0] = l_run[0] * alpha[0] + rs[0];
  l_run[1] = l_run[1] * alpha[1] + rs[1];
}

// O *= alpha, only when one of the warp's 16 rows found a new maximum (alpha = 1 otherwise): on long causal rows
// later tiles often move none, and the 4 * 2d/8 multiplies per thread (128 at d = 128) are as many instructions
// as the tile's P V products.
template <int NT>
__device__ __forceinline__ void rescale(float (&acc)[NT][4], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      acc[i][0] *= alpha[0];
      acc[i][1] *= alpha[0];
      acc[i][2] *= alpha[1];
      acc[i][3] *= alpha[1];
    }
  }
}

// The S accumulators of n-tiles 2kk, 2kk+1 are exactly the A fragment of key chunk kk of P V.
__device__ __forceinline__ void pack_p(const float (&s)[BN / 8][4], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// O += P V over this warp's 16 rows and all VW columns.
template <int VW>
__device__ __forceinline__ void warp_pv(float (&acc)[VW / 8][4], const uint32_t (&pa)[BN / 16][4], const bf16* sV,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int nn = 0; nn < VW / 16; ++nn) {
      uint32_t bb[4];
      ldmatrix_x4_trans(bb, smem_addr(sV + swz<VW>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, nn * 16 + (lane >> 4) * 8)));
      mma_16816(acc[2 * nn], pa[kk], bb[0], bb[1]);
      mma_16816(acc[2 * nn + 1], pa[kk], bb[2], bb[3]);
    }
}

// Stores a warp's 16 rows (from row0; rows past n are skipped) x NT n8 tiles (from column col0) of sequence b,
// scaled by the per-row factor f, in bf16.
template <int NT>
__device__ __forceinline__ void store_rows(const float (&acc)[NT][4], const float (&f)[2], const AttnParams& p,
                                           int row0, int b, int64_t col0, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + (lane >> 2) + 8 * r;
    if (row < p.n) {
      bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + col0 + 2 * (lane & 3);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        *reinterpret_cast<uint32_t*>(o + nt * 8) = pack_bf16x2(acc[nt][2 * r] * f[r], acc[nt][2 * r + 1] * f[r]);
    }
  }
}

// Epilogue, entered by all 256 threads once no warp reads the K/V stages any more (sO2 points into them): map 2
// parks O2/l2, map 1 combines, normalises and stores rows q0.. of differential head j, sequence b.
template <int VW>
__device__ __forceinline__ void combine_store(float (&acc)[VW / 8][4], float (&l_run)[2], float* sO2, int warp,
                                              int lane, const AttnParams& p, int q0, int b, int j) {
  constexpr int NT = VW / 8;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  quad_sum(l_run);
  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
  // [4 warps][NT][4][32 lanes]: each access is 32 consecutive words
  if (map == 1) {
    float* dst = sO2 + (warp - 4) * NT * 4 * 32;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[(nt * 4 + e) * 32 + lane] = acc[nt][e] * inv_l[e >> 1];
  }
  __syncthreads();
  if (map == 0) {
    const float* src = sO2 + warp * NT * 4 * 32;
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float o = acc[nt][e] * inv_l[e >> 1] - p.lambda * src[(nt * 4 + e) * 32 + lane];
        acc[nt][e] = o;
        ss[e >> 1] += o * o;
      }
    float f[2];
    quad_rms_factors<VW>(ss, p.eps, p.out_scale, f);
    store_rows(acc, f, p, q0 + wrow, b, int64_t(j) * VW, lane);
  }
}

// V-split P V: this warp's column half [map * D, map * D + D) of both maps, from its own P (pa) and its partner's
// (po): every V fragment read with ldmatrix feeds two mma.sync.
template <int D>
__device__ __forceinline__ void warp_pv_both(float (&acc_own)[D / 8][4], float (&acc_oth)[D / 8][4],
                                             const uint32_t (&pa)[BN / 16][4], const uint32_t (&po)[BN / 16][4],
                                             const bf16* sV, int map, int lane) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int nn = 0; nn < D / 16; ++nn) {
      uint32_t bb[4];
      ldmatrix_x4_trans(bb, smem_addr(sV + swz<2 * D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                      map * D + nn * 16 + (lane >> 4) * 8)));
      mma_16816(acc_own[2 * nn], pa[kk], bb[0], bb[1]);
      mma_16816(acc_own[2 * nn + 1], pa[kk], bb[2], bb[3]);
      mma_16816(acc_oth[2 * nn], po[kk], bb[0], bb[1]);
      mma_16816(acc_oth[2 * nn + 1], po[kk], bb[2], bb[3]);
    }
}

// The V-split exchange: this warp's P and rescale factors go to its slots, `sync` joins the partner, the partner's
// come back.
template <class Sync>
__device__ __forceinline__ void exchange_p(const uint32_t (&pa)[BN / 16][4], const float (&al)[2], uint32_t (&po)[BN / 16][4],
                                           float (&ao)[2], uint4* xp_own, const uint4* xp_oth, float2* xf_own,
                                           const float2* xf_oth, int lane, Sync&& sync) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) xp_own[kk * 32 + lane] = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
  xf_own[lane] = make_float2(al[0], al[1]);
  sync();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const uint4 x = xp_oth[kk * 32 + lane];
    po[kk][0] = x.x;
    po[kk][1] = x.y;
    po[kk][2] = x.z;
    po[kk][3] = x.w;
  }
  const float2 f = xf_oth[lane];
  ao[0] = f.x;
  ao[1] = f.y;
}

// V-split epilogue, once the partner no longer reads this warp's exchange slots: swap l, combine this warp's column
// half (O1/l1 - lambda O2/l2), swap the sums of squares, normalise, store rows row0.. of sequence b from column col0.
template <int D, class Sync>
__device__ __forceinline__ void pair_epilogue(float (&acc_own)[D / 8][4], const float (&acc_oth)[D / 8][4],
                                              float (&l_run)[2], float2* xf_own, const float2* xf_oth, int map,
                                              int lane, const AttnParams& p, int row0, int b, int64_t col0, Sync&& sync) {
  quad_sum(l_run);
  xf_own[lane] = make_float2(l_run[0], l_run[1]);
  sync();
  const float2 lo = xf_oth[lane];
  const float inv_own[2] = {1.f / l_run[0], 1.f / l_run[1]}, inv_oth[2] = {1.f / lo.x, 1.f / lo.y};
  const float c_own = map == 0 ? 1.f : -p.lambda, c_oth = map == 0 ? -p.lambda : 1.f;  // O1/l1 - lambda O2/l2
  float ss[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float o = c_own * acc_own[nt][e] * inv_own[e >> 1] + c_oth * acc_oth[nt][e] * inv_oth[e >> 1];
      acc_own[nt][e] = o;
      ss[e >> 1] += o * o;
    }
  quad_sum(ss);
  sync();  // both warps read l
  xf_own[lane] = make_float2(ss[0], ss[1]);
  sync();
  const float2 so = xf_oth[lane];
  const float f[2] = {rsqrtf((ss[0] + so.x) * (1.f / (2 * D)) + p.eps) * p.out_scale,
                      rsqrtf((ss[1] + so.y) * (1.f / (2 * D)) + p.eps) * p.out_scale};
  store_rows(acc_own, f, p, row0, b, col0, lane);
}

__device__ __forceinline__ void cta_sync() { asm volatile("bar.sync 0;\n" ::: "memory"); }
// Named barrier `id` (1..15) for the 64 threads of two warps.
__device__ __forceinline__ void pair_sync(int id) { asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory"); }

// Which (query tile, differential head, sequence) a CTA computes, and the matching kv head (DiffLlama mapping).
struct CtaWork {
  int qt, j, b, g;
};
__device__ __forceinline__ CtaWork cta_work(const AttnParams& p) {
  const int hv = p.heads / 2;
  const CtaTile ct = cta_tile(int(blockIdx.x), (p.n + BM - 1) / BM, hv * p.batch, p.tile_major);
  const int j = ct.bh % hv;
  return {ct.qt, j, ct.bh / hv, j / (p.heads / p.kv_heads)};
}

// A CTA's copies (all 256 threads): Q of both maps once, then K1 | K2 | V of key tile `it` (0 is the diagonal tile,
// then descending) into a [K1 | K2 | V] stage. Sources are this thread's first chunks (kv head g, DiffLlama mapping).
// Tile 0 goes out whole (issue_kv: rows past n are zero-filled); every later tile is full (its keys end at or before
// the query tile's first row), and goes out one copy at a time (KvSrc::copy, NCOPY per thread, two per k step of
// the S products) without bounds checks.
// NTHR: the threads that share the copies (the CTA, or one warp group of the skewed kernel at d = 64).
template <int D, int NTHR = THREADS>
struct CtaCopies {
  using QK = TileCopy<BN, D, NTHR>;
  using VC = TileCopy<BN, 2 * D, NTHR>;
  static constexpr int NCOPY = 2 * QK::PASSES + VC::PASSES, NCOPY_K = 2 * QK::PASSES;
  static_assert(NTHR != THREADS || NCOPY == 2 * (D / 16), "two copies per k step of the S products");
  static_assert(NTHR == THREADS || NCOPY_K == 2 * (D / 16), "a warp group's K copies: two per k step");
  const QK qk;
  const VC v;
  const bf16* base;
  const bf16 *k_src0, *k_src1, *v_src;
  int64_t rs;
  int n, qt;
  __device__ __forceinline__ CtaCopies(const AttnParams& p, const CtaWork& w, int tid)
      : qk(tid), v(tid), base(p.qkv + int64_t(w.b) * p.batch_stride), rs(p.row_stride), n(p.n), qt(w.qt) {
    const int half_kv = p.kv_heads / 2;
    k_src0 = base + qk.r * rs + p.k_off + int64_t(w.g) * D + qk.c * 8;
    k_src1 = base + qk.r * rs + p.k_off + int64_t(half_kv + w.g) * D + qk.c * 8;
    v_src = base + v.r * rs + p.v_off + int64_t(v.c < D / 8 ? w.g : half_kv + w.g) * D + (v.c % (D / 8)) * 8;
  }
  __device__ __forceinline__ void issue_q(bf16* sQ, const AttnParams& p, int j) const {
    const int q0 = qt * BM;
    const bf16* q_src = base + (q0 + qk.r) * rs + p.q_off + qk.c * 8;
    qk.issue(sQ, q_src + int64_t(j) * D, rs, n - q0, base);
    qk.issue(sQ + BM * D, q_src + int64_t(j + p.heads / 2) * D, rs, n - q0, base);
  }
  __device__ __forceinline__ void issue_kv(bf16* sK, bf16* sV, int it) const {
    const int k0 = (qt - it) * BN;
    qk.issue(sK, k_src0 + int64_t(k0) * rs, rs, n - k0, base);
    qk.issue(sK + BN * D, k_src1 + int64_t(k0) * rs, rs, n - k0, base);
    v.issue(sV, v_src + int64_t(k0) * rs, rs, n - k0, base);
  }
  // Key tile it >= 1 into [K1 | K2] at sK and V at sV.
  struct KvSrc {
    const CtaCopies& c;
    const bf16 *k0, *k1, *vv;
    bf16 *sK, *sV;
    __device__ __forceinline__ void copy(int i) const {
      if (i < QK::PASSES) c.qk.pass(sK, k0, c.rs, i);
      else if (i < 2 * QK::PASSES) c.qk.pass(sK + BN * D, k1, c.rs, i - QK::PASSES);
      else c.v.pass(sV, vv, c.rs, i - 2 * QK::PASSES);
    }
  };
  __device__ __forceinline__ KvSrc tile(int it, bf16* sK, bf16* sV) const {
    const int64_t off = int64_t(qt - it) * BN * rs;
    return {*this, k_src0 + off, k_src1 + off, v_src + off, sK, sV};
  }
};

template <int D>
__global__ void __launch_bounds__(THREADS, Tile<D>::MIN_BLOCKS) diff_attn_fwd_lockstep_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NT = VW / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sStage = sQ + T::Q_ELEMS;            // [2 stages][K1 | K2 | V]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  const CtaWork w = cta_work(p);
  const int qt = w.qt, j = w.j, b = w.b;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const CtaCopies<D> copies(p, w, tid);
  const int q0 = qt * BM;
  copies.issue_q(sQ, p, j);
  copies.issue_kv(sStage, sStage + 2 * T::K_ELEMS, 0);
  cp_async_commit();

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;  // softmax in base 2: exp(x*s) = exp2(x*s*log2 e)
  const bf16* sQm = sQ + map * BM * D;
  const int n_kt = qt + 1;

  for (int it = 0; it < n_kt; ++it) {
    const int stage = it & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed for everyone, and everyone finished tile it-1 (its stage is reused next)
    const bf16* sK = sStage + stage * T::STAGE_ELEMS + map * T::K_ELEMS;
    const bf16* sV = sStage + stage * T::STAGE_ELEMS + 2 * T::K_ELEMS;
    // The next tile's copies go out between this warp's S products (the other stage is free: every warp passed the
    // barrier after finishing tile it-1).
    const bool has_next = it + 1 < n_kt;
    bf16* next_stage = sStage + (stage ^ 1) * T::STAGE_ELEMS;
    const auto next = copies.tile(it + 1, next_stage, next_stage + 2 * T::K_ELEMS);
    float s[BN / 8][4];
    warp_qk<D>(s, sQm, sK, wrow, lane, [&](int kk) {
      if (has_next) {
        next.copy(2 * kk);
        next.copy(2 * kk + 1);
      }
    });
    cp_async_commit();
    if (it == 0) mask_diagonal(s, wrow, lane);
    float alpha[2];
    online_softmax(s, m_run, l_run, alpha, sl2);
    rescale(acc, alpha);
    uint32_t pa[BN / 16][4];
    pack_p(s, pa);
    warp_pv<VW>(acc, pa, sV, lane);
  }

  cp_async_wait<0>();
  __syncthreads();  // all warps are done with the stages: reuse them for O2
  combine_store<VW>(acc, l_run, reinterpret_cast<float*>(sStage), warp, lane, p, q0, b, j);
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
}

// V-split schedule (see the top of the file).
template <int D>
__global__ void __launch_bounds__(THREADS, Tile<D>::MIN_BLOCKS) diff_attn_fwd_vsplit_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NH = D / 8;  // n8 tiles per column half
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sStage = sQ + T::Q_ELEMS;            // [2 stages][K1 | K2 | V]
  uint4* xp = reinterpret_cast<uint4*>(smem + T::SMEM_LOCKSTEP);                  // [4][2 maps][BN/16][32]
  float2* xf = reinterpret_cast<float2*>(smem + T::SMEM_LOCKSTEP + T::XP_BYTES);  // [4][2 maps][32]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp >> 2, grp = warp & 3, wrow = grp * 16;
  const CtaWork w = cta_work(p);
  const int qt = w.qt, j = w.j, b = w.b;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const CtaCopies<D> copies(p, w, tid);
  const int q0 = qt * BM, n_kt = qt + 1;
  copies.issue_q(sQ, p, j);
  copies.issue_kv(sStage, sStage + 2 * T::K_ELEMS, 0);
  cp_async_commit();

  float acc_own[NH][4], acc_oth[NH][4];  // this warp's V columns [map * D, map * D + D) of its own and the other map
#pragma unroll
  for (int i = 0; i < NH; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_own[i][e] = acc_oth[i][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;
  const bf16* sQm = sQ + map * BM * D;
  uint4* xp_own = xp + (grp * 2 + map) * (BN / 16) * 32;
  const uint4* xp_oth = xp + (grp * 2 + (map ^ 1)) * (BN / 16) * 32;
  float2* xf_own = xf + (grp * 2 + map) * 32;
  const float2* xf_oth = xf + (grp * 2 + (map ^ 1)) * 32;

  for (int it = 0; it < n_kt; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; every warp finished iteration it-1 (its stage and the exchange are free)
    const bool has_next = it + 1 < n_kt;
    bf16* next_stage = sStage + ((it + 1) & 1) * T::STAGE_ELEMS;
    const auto next = copies.tile(it + 1, next_stage, next_stage + 2 * T::K_ELEMS);
    float s[BN / 8][4];
    warp_qk<D>(s, sQm, sStage + (it & 1) * T::STAGE_ELEMS + map * T::K_ELEMS, wrow, lane, [&](int kk) {
      if (has_next) {
        next.copy(2 * kk);
        next.copy(2 * kk + 1);
      }
    });
    cp_async_commit();
    if (it == 0) mask_diagonal(s, wrow, lane);
    float alpha[2], alpha_o[2];
    online_softmax(s, m_run, l_run, alpha, sl2);
    uint32_t pa[BN / 16][4], po[BN / 16][4];
    pack_p(s, pa);
    exchange_p(pa, alpha, po, alpha_o, xp_own, xp_oth, xf_own, xf_oth, lane, cta_sync);
    rescale(acc_own, alpha);
    rescale(acc_oth, alpha_o);
    warp_pv_both<D>(acc_own, acc_oth, pa, po, sStage + (it & 1) * T::STAGE_ELEMS + 2 * T::K_ELEMS, map, lane);
  }

  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the exchange area of the last tile
  pair_epilogue<D>(acc_own, acc_oth, l_run, xf_own, xf_oth, map, lane, p, q0 + wrow, b, int64_t(j) * VW + map * D,
                   cta_sync);
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
}

// V-split with the two row groups half a tile apart (schedule 3; see the top of the file). Warps 2i and 2i + 1 own
// rows 16i.. (map 1 and map 2) and exchange P through a named barrier of their own; warps 0-3 ("early") and 4-7
// ("late") meet at one CTA barrier per key tile, which sits between P V and the next S products for the early
// warps and between the S products and P V for the late ones. Each scheduler holds one early and one late warp, so
// one warp's ldmatrix-bound S products and softmax overlap the other's P V products. Between barriers t and t + 1
// the early warps run S(t) then P V(t), the late ones P V(t - 1) then S(t): two tiles of V are read at once and a
// third is loading, so V has three stages (K two). The next tile's copies go out between the S products, as in the
// other schedules; one half-tile of skew is lost at each end of a CTA.
// VST = 2 (d = 64, two CTAs per SM in V-split's 98 KB): V has two stages. V(t + 2) can only overwrite V(t) once the
// late warps are done with P V(t), so the late warps issue V(t + 2) right after it (behind a barrier of their own)
// and the early warps issue K(t + 2) between their S products; each group waits for its copies at the next CTA
// barrier, as before. Tiles 0 and 1 go out from all threads.
template <int D, int VST>
__global__ void __launch_bounds__(THREADS, VST == 3 ? 1 : Tile<D>::MIN_BLOCKS) diff_attn_fwd_vskew_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NH = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sK = sQ + T::Q_ELEMS;                // [2 stages][K1 | K2]
  bf16* sV = sK + 4 * T::K_ELEMS;            // [VST stages][V]
  constexpr int XP_AT = (T::Q_ELEMS + 4 * T::K_ELEMS + VST * T::V_ELEMS) * 2;
  uint4* xp = reinterpret_cast<uint4*>(smem + XP_AT);                  // [8 warps][BN/16][32]
  float2* xf = reinterpret_cast<float2*>(smem + XP_AT + T::XP_BYTES);  // [8 warps][32]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp & 1, pair = warp >> 1, wrow = pair * 16;
  const int late = __shfl_sync(0xffffffffu, warp, 0) >> 2;  // warps 4-7 (warp-uniform, and the compiler knows it)
  const CtaWork w = cta_work(p);
  const int qt = w.qt, j = w.j, b = w.b;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const CtaCopies<D> copies(p, w, tid);
  using GroupCopies = std::conditional_t<VST == 2, CtaCopies<D, THREADS / 2>, CtaCopies<D>>;
  const GroupCopies group_copies(p, w, tid & (THREADS / 2 - 1));  // VST = 2: tiles >= 2, one warp group each
  const int q0 = qt * BM, n_kt = qt + 1;
  copies.issue_q(sQ, p, j);
  copies.issue_kv(sK, sV, 0);
  cp_async_commit();

  float acc_own[NH][4], acc_oth[NH][4];
#pragma unroll
  for (int i = 0; i < NH; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_own[i][e] = acc_oth[i][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;
  const bf16* sQm = sQ + map * BM * D;
  uint4* xp_own = xp + warp * (BN / 16) * 32;
  const uint4* xp_oth = xp + (warp ^ 1) * (BN / 16) * 32;
  float2* xf_own = xf + warp * 32;
  const float2* xf_oth = xf + (warp ^ 1) * 32;
  const auto sync_pair = [pair] { pair_sync(1 + pair); };
  const auto wait_all = [] {
    cp_async_wait<0>();
    cta_sync();  // tile t landed for everyone; every warp is done with the stages the next copies overwrite
  };

  // P of tile t (own and partner's) and the rescale factors, from the S products to P V.
  uint32_t pa[BN / 16][4], po[BN / 16][4];
  float al[2], ao[2];
  int vs = VST - 1;  // at the top of iteration t: the V stage of tile t (t % VST)
  for (int t = -1; t < n_kt; ++t) {
    // Early warps: P V(t), barrier; late warps: barrier, P V(t). Written as two passes so that every warp meets the
    // barrier at the same instruction (bar.sync is .aligned: synccheck flagged the first version, which had one
    // barrier per group) and P V is one copy of the code.
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      if (h == 1) wait_all();
      if (t >= 0 && h == late) {
        rescale(acc_own, al);
        rescale(acc_oth, ao);
        warp_pv_both<D>(acc_own, acc_oth, pa, po, sV + vs * T::V_ELEMS, map, lane);
        if constexpr (VST == 2) {
          if (late && t + 2 < n_kt) {
            asm volatile("bar.sync 5, 128;\n" ::: "memory");  // every late warp is done with V(t)
            const auto v2 = group_copies.tile(t + 2, sK, sV + vs * T::V_ELEMS);
#pragma unroll
            for (int c = 0; c < GroupCopies::NCOPY - GroupCopies::NCOPY_K; ++c) v2.copy(GroupCopies::NCOPY_K + c);
          }
        }
      }
    }
    vs = vs == VST - 1 ? 0 : vs + 1;  // now tile t + 1's
    const int u = t + 1;
    if (u < n_kt) {
      const bool has_next = u + 1 < n_kt;
      bf16* next_k = sK + ((u + 1) & 1) * 2 * T::K_ELEMS;
      const auto next = copies.tile(u + 1, next_k, sV + (vs == VST - 1 ? 0 : vs + 1) * T::V_ELEMS);
      const auto next_k_only = group_copies.tile(u + 1, next_k, nullptr);
      float s[BN / 8][4];
      warp_qk<D>(s, sQm, sK + (u & 1) * 2 * T::K_ELEMS + map * T::K_ELEMS, wrow, lane, [&](int kk) {
        if (VST == 3 || u == 0) {  // tile u + 1 from all threads
          if (has_next) {
            next.copy(2 * kk);
            next.copy(2 * kk + 1);
          }
        } else if (has_next && !late) {  // VST = 2: K(u + 1) from the early warps (V from the late ones, above)
          next_k_only.copy(2 * kk);
          next_k_only.copy(2 * kk + 1);
        }
      });
      if (u == 0) mask_diagonal(s, wrow, lane);
      online_softmax(s, m_run, l_run, al, sl2);
      pack_p(s, pa);
      exchange_p(pa, al, po, ao, xp_own, xp_oth, xf_own, xf_oth, lane, sync_pair);
    }
    cp_async_commit();
  }

  // The partner read this warp's last P and alpha before the last CTA barrier (early) or before its P V (late).
  pair_epilogue<D>(acc_own, acc_oth, l_run, xf_own, xf_oth, map, lane, p, q0 + wrow, b, int64_t(j) * VW + map * D,
                   sync_pair);
  if (p.head_ns) {
    cta_sync();  // the CTA's time ends with its late warps
    if (tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
  }
}

// The schedule for head_dim D on the current device, the fastest that fits (bench/cuda_notes.md): 3 (V-split with
// skew, d = 128 only: 210 KB per CTA; at d = 64 two V-split CTAs per SM measured faster),
// 2 (V-split) where its shared memory fits MIN_BLOCKS CTAs per SM (H100/H200: 227 KB per block, 228 KB per SM), 1
// (lockstep: 160 KB at d = 128 fits an A100's 163 KB), or 0 (none fits: the caller takes the generic kernel).
// DS_ATTN_MMA_VER=1, 2 or 3 asks for one (tests, benchmarks); it is granted when it fits, else the best that does.
template <int D>
int mma_schedule() {
  using T = Tile<D>;
  static int cached[64] = {};  // per device: the best schedule that fits, + 1 once known
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 0;
  }
  if (cached[dev] == 0) {
    int schedule = 0, per_block = 0, per_sm = 0;
    constexpr int reserved = 1024;  // per CTA, by the driver
    if (cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
      cudaGetLastError();
    else if (D == 128 && T::SMEM_VSKEW <= per_block && T::SMEM_VSKEW + reserved <= per_sm)
      schedule = 3;
    else if (D == 64 && T::SMEM_VSPLIT <= per_block && T::MIN_BLOCKS * (T::SMEM_VSPLIT + reserved) <= per_sm)
      schedule = 3;  // two stages of V: V-split's footprint
    else if (T::SMEM_VSPLIT <= per_block && T::MIN_BLOCKS * (T::SMEM_VSPLIT + reserved) <= per_sm)
      schedule = 2;
    else if (T::SMEM_LOCKSTEP <= per_block)
      schedule = 1;
    cached[dev] = schedule + 1;
  }
  const int fits = cached[dev] - 1, best = D == 64 && fits == 3 ? 2 : fits;
  const char* e = std::getenv("DS_ATTN_MMA_VER");
  const int asked = e && e[0] >= '1' && e[0] <= '3' && e[1] == 0 ? e[0] - '0' : 0;
  return asked && asked <= fits ? asked : best;
}

template <int D>
cudaError_t launch(const AttnParams& p, cudaStream_t stream) {
  using T = Tile<D>;
  const int schedule = mma_schedule<D>();
  if (schedule == 0) return cudaErrorInvalidConfiguration;
  void (*kernel)(AttnParams) = diff_attn_fwd_lockstep_kernel<D>;
  int smem = T::SMEM_LOCKSTEP;
  if (schedule == 2) {
    kernel = diff_attn_fwd_vsplit_kernel<D>;
    smem = T::SMEM_VSPLIT;
  }
  if (schedule == 3) {
    kernel = diff_attn_fwd_vskew_kernel<D, D == 128 ? 3 : 2>;
    smem = D == 128 ? T::SMEM_VSKEW : T::SMEM_VSPLIT;
  }
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  AttnParams q = p;
  q.tile_major = attn_tile_major(p);
  const unsigned ctas = unsigned((p.n + BM - 1) / BM) * unsigned((p.heads / 2) * p.batch);
  kernel<<<ctas, THREADS, smem, stream>>>(q);
  return cudaGetLastError();
}

}  // namespace

int diff_attn_fwd_schedule(int d) { return d == 64 ? mma_schedule<64>() : d == 128 ? mma_schedule<128>() : 0; }

bool diff_attn_fwd_supported(int d) { return diff_attn_fwd_schedule(d) != 0; }

cudaError_t launch_diff_attn_fwd(const AttnParams& p, cudaStream_t stream) {
  if (!p.diff || p.n <= 0 || p.heads % 2 || p.kv_heads % 2 || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.d == 64) return launch<64>(p, stream);
  if (p.d == 128) return launch<128>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
