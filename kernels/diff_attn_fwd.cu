// Fused attention, forward, causal, on mma.sync (sm_80 and newer; the portable fused kernel): for each differential
// head one pass over the K/V tiles computes both online softmaxes (Q1 K1^T and Q2 K2^T) and both accumulations
// against the shared 2d-wide V tile, then writes  (1 - lambda_init) * RMSNorm_2d(O1/l1 - lambda O2/l2) in bf16.
// Plain heads go in pairs through the same pipeline (schedules 1 and 4): map m is head 2j + m, with its own K and
// its d-wide half of the V tile, and writes O/l. bf16 inputs, f32 accumulation and softmax statistics (FlashAttention-2 style: exp2 with the scale folded
// in; the running maximum moves, and O is rescaled, only when a tile exceeds it by more than 2^8).
//
// Work split: a CTA owns BM = 64 query rows of one differential head. A 16-row x 2d-wide f32 accumulator is
// 2d/8 * 4 registers per thread (128 at d = 128), so at d = 128 a warp cannot hold both maps' accumulators; at d = 64
// it can (schedule 4). Every tile is XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free. The diagonal tile
// comes first (it needs the causal mask and guarantees a finite row maximum); query tiles are launched heaviest
// first. A sliding window (AttnParams::window) ends a CTA's descent at the key tile of its first row's first key and
// masks the keys left of the rows' windows on the (at most two) tiles that cross the window's lower edge
// (KeyTiles); K and V come from AttnParams::kv when it is set. Every thread copies fixed 16-byte column chunks
// (TileCopy) with cp.async; later tiles go out a few copies after each k step of the S products. One CTA barrier
// per key tile. The O rescale is skipped when no row of the warp found a new maximum.
//
// Schedules of the P V products (attn_dispatch.cu picks the fastest that the device's shared memory fits):
//  1 lockstep (8 warps): warps 0-3 take map 1, 4-7 map 2, each accumulates its own map over all 2d columns of V;
//    at the end map 2 parks O2/l2 in shared memory and map 1 combines, normalises and stores. 160 KB at d = 128:
//    fits an A100.
//  2 V-split (8 warps): warps w and w + 4 own the same 16 rows (map 1 and map 2); after the softmax they swap P and
//    the rescale factors through shared memory and each accumulates BOTH maps over half of V's columns, so every V
//    fragment read with ldmatrix feeds two mma.sync (72 instead of 104 ldmatrix per warp and key tile at d = 128).
//    +5-9% over lockstep at d = 128; 178 KB.
//  4 both maps per warp (d = 64, 4 warps): each warp owns 16 rows of both maps, nothing is exchanged; two 80 KB
//    CTAs per SM at 255 registers. 8-10% faster than V-split at d = 64.
// Why the details (H200, bench/cuda_notes.md): the fixed copy plans and the skipped rescale +23-28%; ldmatrix at
// lane-constant offsets (LaneChunks) +2-3%. What was tried and not kept: bench/EXPERIMENTS.md.
#include "diff_attn_fwd.h"

#include <climits>
#include <cmath>

#include "attn_heads.h"
#include "attn_maps.h"
#include "mma_sm80.cuh"
#include "warp_reduce.cuh"

namespace ds::kern {
namespace {

constexpr int BM = 64, BN = 64, THREADS = 256;

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
  // Pass i of a tile whose rows all exist (bytes = 0: zero-fill, read nothing).
  __device__ __forceinline__ void pass(bf16* tile, const bf16* src, int64_t rs, int i, int bytes = 16) const {
    cp_async_16(smem_addr(tile + dst + i * RPP * W), src + i * RPP * rs, bytes);
  }
};

template <int N>
__device__ __forceinline__ void zero(float (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0.f;
}

// Where a swizzled row-major tile of ROWS x WIDTH bf16 puts its rows and its 64-column groups (8 chunks of 16
// bytes), in bytes: a row is WIDTH * 2 bytes, the groups lie side by side in it.
template <int WIDTH>
struct SwzLayout {
  static constexpr int ROW = WIDTH * 2, GROUP = 128;
};

// One lane's ldmatrix addresses in a swizzled tile of WIDTH-element rows, without arithmetic per read. The swizzle
// XORs a 16-byte chunk index with row % 8, which touches only the chunk's low three bits, and the rows a lane reads
// all share row % 8 (they step by 8), so chunk c0 + 8 h + 2 i (c0 % 8 < 2, i < 4) of row r0 + 8 k lies at
// at(i) + h * L::GROUP + 8 k * L::ROW bytes: a lane-constant offset plus an immediate, where at(i) = at(0) ^ 32 i
// (rows and groups are multiples of 128 bytes, so bits 5-6 hold only the chunk's). Computing the swizzle per read
// cost 4-5 dependent integer instructions in front of each group of ldmatrix, 10% of the S and P V loop's
// instructions (+2-3% on the H200, bench/cuda_notes.md). HOLD keeps all four at(i) in registers (schedule 4: 1%
// faster) instead of one and an XOR per use (schedules 1 and 2 have no registers to spare: with four, the lockstep
// kernel spilled).
template <class L, bool HOLD>
struct LaneChunks {
  uint32_t off[HOLD ? 4 : 1];
  __device__ __forceinline__ LaneChunks(int r0, int c0) {
#pragma unroll
    for (int i = 0; i < (HOLD ? 4 : 1); ++i)
      off[i] = uint32_t(r0 * L::ROW + (c0 >> 3) * L::GROUP + ((((c0 & 7) + 2 * i) ^ (r0 & 7)) << 4));
  }
  __device__ __forceinline__ uint32_t at(int i) const { return HOLD ? off[i] : off[0] ^ uint32_t(i << 5); }
};

// S = Q K^T for this warp's 16 rows x BN keys of M maps (map m: K at sK + m * BN * D; the maps' products
// interleave). q_frag(m, kk, a) puts map m's A fragment of k step kk in a: read from shared memory with ldmatrix
// (warp_qk_maps) or taken from registers (warp_qk_reg). after_step(kk) runs once each k step's products are
// issued: the kernels issue the next tile's copies there, between dependent ldmatrix and mma, rather than as a
// block of their own after the products (which held 10% of the V-split kernel's stall samples in Nsight Compute;
// measured equal speed, bench/cuda_notes.md, and it drops the bounds checks of every tile after the first).
template <int D, int M, bool HOLD, class QFrag, class AfterStep>
__device__ __forceinline__ void warp_qk_core(float (&s)[M][BN / 8][4], QFrag&& q_frag, const bf16* sK, int lane,
                                             AfterStep&& after_step) {
#pragma unroll
  for (int m = 0; m < M; ++m) zero(s[m]);
  // this lane reads rows nn * 16 + lane % 8 + 8 (lane / 16), chunks 2 kk + lane / 8 % 2
  using L = SwzLayout<D>;
  const uint32_t k_base = smem_addr(sK);
  const LaneChunks<L, HOLD> kc((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[M][4];
#pragma unroll
    for (int m = 0; m < M; ++m) q_frag(m, kk, a[m]);
#pragma unroll
    for (int nn = 0; nn < BN / 16; ++nn)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        uint32_t bb[4];
        ldmatrix_x4(bb, k_base + m * BN * D * 2 + nn * 16 * L::ROW + (kk >> 2) * L::GROUP + kc.at(kk & 3));
        mma_16816(s[m][2 * nn], a[m], bb[0], bb[1]);
        mma_16816(s[m][2 * nn + 1], a[m], bb[2], bb[3]);
      }
    after_step(kk);
  }
}
// Map m's Q rows wrow.. at sQ + m * BM * D: the A fragment of k step kk.
template <int D>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], const bf16* sQ, int m, int kk, int wrow, int lane) {
  ldmatrix_x4(a, smem_addr(sQ + m * BM * D + swz<D>(wrow + (lane & 15), kk * 16 + (lane >> 4) * 8)));
}
template <int D, int M, bool HOLD, class AfterStep>
__device__ __forceinline__ void warp_qk_maps(float (&s)[M][BN / 8][4], const bf16* sQ, const bf16* sK, int wrow,
                                             int lane, AfterStep&& after_step) {
  warp_qk_core<D, M, HOLD>(
      s, [&](int m, int kk, uint32_t(&a)[4]) { load_q_frag<D>(a, sQ, m, kk, wrow, lane); }, sK, lane, after_step);
}
template <int D, class AfterStep>
__device__ __forceinline__ void warp_qk(float (&s)[BN / 8][4], const bf16* sQm, const bf16* sK, int wrow, int lane,
                                        AfterStep&& after_step) {
  warp_qk_maps<D, 1, false>(reinterpret_cast<float(&)[1][BN / 8][4]>(s), sQm, sK, wrow, lane, after_step);
}

// The keys a tile's rows see, as the tile-local key column minus the query row (both from 0 in their tiles):
// col - row in [lo, hi]. hi = q0 - k0 (0 on the diagonal tile: key <= row); lo = hi + 1 - window (key >= row -
// window + 1), or far below when there is no window. `edge`: the tile needs the mask at all (the diagonal tile, or
// one that crosses the window's lower edge); every other tile is wholly inside every row's band.
struct Band {
  bool edge;
  int lo, hi;
  __device__ __forceinline__ bool in(int col, int row) const { return !edge || (col - row >= lo && col - row <= hi); }
};
constexpr int kNoWindowLo = -(1 << 30);

// The key tiles a CTA of query tile qt visits, from the diagonal tile down (iteration it: key tile qt - it): n_kt of
// them, the last one holding the first key of the CTA's first row (window_first_key). From iteration edge_it on,
// the tiles hold keys left of some of the rows' windows (their first keys k0 < q0 + BM - window, the first key of
// the CTA's last row) and take the band mask, like the diagonal tile. WINDOW = false (the forward kernels' build for
// window 0): every tile down to 0, only the diagonal one masked, all of it known at compile time, so that the
// kernels without a window run the tile loop they ran before windows existed (as attn_fwd_sm90.cu, where the
// runtime window cost 2-3% at window 0).
template <bool WINDOW>
struct KeyTiles {
  int n_kt, edge_it, window;
  __device__ __forceinline__ KeyTiles(int win, int qt) : window(win) {
    if constexpr (WINDOW) {
      const int q0 = qt * BM, last_first = q0 + BM - win;
      n_kt = qt - window_first_key(win, q0) / BN + 1;
      edge_it = win > 0 && last_first > 0 ? qt - (last_first - 1) / BN : INT_MAX;
    } else {
      n_kt = qt + 1;
      edge_it = INT_MAX;
    }
  }
  __device__ __forceinline__ Band band(int it) const {
    if constexpr (WINDOW)
      return {it == 0 || it >= edge_it, window > 0 ? it * BN + 1 - window : kNoWindowLo, it * BN};  // BM == BN
    else
      return {it == 0, kNoWindowLo, 0};
  }
};

// Keys outside the band (col - row in [b.lo, b.hi]) get -inf, on edge tiles only (WINDOW = false: only the causal
// bound, as the band's lower one is never reached).
template <bool WINDOW>
__device__ __forceinline__ void mask_band(float (&s)[BN / 8][4], int wrow, int lane, const Band& b) {
  if (!b.edge) return;
#pragma unroll
  for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + 2 * (lane & 3) + (e & 1);
      const int row = wrow + (lane >> 2) + (e >> 1) * 8;
      if (col - row > b.hi || (WINDOW && col - row < b.lo)) s[nt][e] = -INFINITY;
    }
}

// The online softmax (mma_sm80.cuh) over a warp's S tile: value 4 nt + e belongs to row (lane / 4) + 8 (e >> 1).
template <bool TREE>
__device__ __forceinline__ void warp_softmax(float (&s)[BN / 8][4], float (&m_run)[2], float (&l_run)[2],
                                               float (&alpha)[2], float sl2) {
  online_softmax<BN / 2, true, TREE>(reinterpret_cast<float(&)[BN / 2]>(s), m_run, l_run, sl2, alpha);
}

// O *= alpha for the thread's two rows.
template <int NT>
__device__ __forceinline__ void scale_rows(float (&acc)[NT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    acc[i][0] *= alpha[0];
    acc[i][1] *= alpha[0];
    acc[i][2] *= alpha[1];
    acc[i][3] *= alpha[1];
  }
}
__device__ __forceinline__ bool moved(const float (&alpha)[2]) { return alpha[0] != 1.f || alpha[1] != 1.f; }

// O *= alpha, only when one of the warp's 16 rows found a new maximum (alpha = 1 otherwise): on long causal rows
// later tiles often move none, and the 4 * 2d/8 multiplies per thread (128 at d = 128) are as many instructions
// as the tile's P V products.
template <int NT>
__device__ __forceinline__ void rescale(float (&acc)[NT][4], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, moved(alpha))) scale_rows(acc, alpha);
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
  // this lane reads rows kk * 16 + lane % 8 + 8 (lane / 8 % 2), chunks 2 nn + lane / 16
  const uint32_t v_base = smem_addr(sV);
  const LaneChunks<SwzLayout<VW>, false> vc((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int nn = 0; nn < VW / 16; ++nn) {
      uint32_t bb[4];
      ldmatrix_x4_trans(bb, v_base + kk * 16 * VW * 2 + (nn >> 2) * 128 + vc.at(nn & 3));
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
    const float2 c = head_coef(p, j);
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float o = c.x * acc[nt][e] * inv_l[e >> 1] - c.y * src[(nt * 4 + e) * 32 + lane];
        acc[nt][e] = o;
        ss[e >> 1] += o * o;
      }
    float f[2];
    quad_rms_factors<VW>(ss, p.eps, p.out_scale, f);
    store_rows(acc, f, p, q0 + wrow, b, int64_t(j) * VW, lane);
  }
}

// P V over the column half [half * D, half * D + D) of the 2d-wide V tile. V-split (BOTH): both maps, from this
// warp's own P (pa) and its partner's (po), so every V fragment read with ldmatrix feeds two mma.sync. Plain heads
// (!BOTH): one head against its d-wide V half (acc_oth and po unused).
template <int D, bool HOLD, bool BOTH>
__device__ __forceinline__ void warp_pv_cols(float (&acc_own)[D / 8][4], float (&acc_oth)[D / 8][4],
                                             const uint32_t (&pa)[BN / 16][4], const uint32_t (&po)[BN / 16][4],
                                             const bf16* sV, int half, int lane) {
  // this lane reads rows kk * 16 + lane % 8 + 8 (lane / 8 % 2), chunks half * D / 8 + 2 nn + lane / 16
  using L = SwzLayout<2 * D>;
  const uint32_t v_base = smem_addr(sV);
  const LaneChunks<L, HOLD> vc((lane & 7) + ((lane >> 3) & 1) * 8, half * D / 8 + (lane >> 4));
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int nn = 0; nn < D / 16; ++nn) {
      uint32_t bb[4];
      ldmatrix_x4_trans(bb, v_base + kk * 16 * L::ROW + (nn >> 2) * L::GROUP + vc.at(nn & 3));
      mma_16816(acc_own[2 * nn], pa[kk], bb[0], bb[1]);
      mma_16816(acc_own[2 * nn + 1], pa[kk], bb[2], bb[3]);
      if constexpr (BOTH) {
        mma_16816(acc_oth[2 * nn], po[kk], bb[0], bb[1]);
        mma_16816(acc_oth[2 * nn + 1], po[kk], bb[2], bb[3]);
      }
    }
}
template <int D, bool HOLD>
__device__ __forceinline__ void warp_pv_both(float (&acc_own)[D / 8][4], float (&acc_oth)[D / 8][4],
                                             const uint32_t (&pa)[BN / 16][4], const uint32_t (&po)[BN / 16][4],
                                             const bf16* sV, int half, int lane) {
  warp_pv_cols<D, HOLD, true>(acc_own, acc_oth, pa, po, sV, half, lane);
}
template <int D>
__device__ __forceinline__ void warp_pv_half(float (&acc)[D / 8][4], const uint32_t (&pa)[BN / 16][4], const bf16* sV,
                                             int half, int lane) {
  warp_pv_cols<D, false, false>(acc, acc, pa, pa, sV, half, lane);
}

// Plain heads' epilogue: O/l of this warp's 16 rows of one head, stored from column col0.
template <int NT>
__device__ __forceinline__ void plain_store(const float (&acc)[NT][4], float (&l_run)[2], const AttnParams& p, int row0,
                                            int b, int64_t col0, int lane) {
  quad_sum(l_run);
  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
  store_rows(acc, inv_l, p, row0, b, col0, lane);
}

// The CTA's block time, to the view heads it computed (a plain CTA's two heads each get all of it: the backend
// shares a layer's measured time out in proportion).
template <bool DIFF>
__device__ __forceinline__ void add_head_time(const AttnParams& p, int j, unsigned long long t_start) {
  const unsigned long long t = global_timer_ns() - t_start;
  if (DIFF) {
    atomicAdd(p.head_ns + j, t);
  } else {
    atomicAdd(p.head_ns + 2 * j, t);
    atomicAdd(p.head_ns + 2 * j + 1, t);
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
                                              int lane, const AttnParams& p, int j, int row0, int b, int64_t col0,
                                              Sync&& sync) {
  quad_sum(l_run);
  xf_own[lane] = make_float2(l_run[0], l_run[1]);
  sync();
  const float2 lo = xf_oth[lane];
  const float inv_own[2] = {1.f / l_run[0], 1.f / l_run[1]}, inv_oth[2] = {1.f / lo.x, 1.f / lo.y};
  const float2 c = head_coef(p, j);  // O = c1 O1/l1 - c2 O2/l2
  const float c_own = map == 0 ? c.x : -c.y, c_oth = map == 0 ? -c.y : c.x;
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

// Which (query tile, head pair j, sequence) a CTA computes, and the heads its two maps read (attn_heads.h): map 1
// and map 2 of differential head j, or plain heads 2j and 2j + 1 (each with its own K and its d-wide V, the two Vs
// side by side in the 2d-wide V tile, so the copies are the same in both modes).
struct CtaWork {
  int qt, j, b;
  ViewHeadMap heads;
};
template <bool DIFF>
__device__ __forceinline__ CtaWork cta_work(const AttnParams& p) {
  const int hv = p.heads / 2;
  const CtaTile ct = cta_tile(int(blockIdx.x), (p.n + BM - 1) / BM, hv * p.batch, p.tile_major);
  const int j = ct.bh % hv;
  CtaWork w{ct.qt, j, ct.bh / hv, view_head_map(true, j, p.heads, p.kv_heads)};
  if constexpr (!DIFF) {
    const ViewHeadMap a = view_head_map(false, 2 * j, p.heads, p.kv_heads);
    const ViewHeadMap b = view_head_map(false, 2 * j + 1, p.heads, p.kv_heads);
    w.heads = ViewHeadMap{{a.q[0], b.q[0]}, {a.k[0], b.k[0]}, {a.v[0], b.v[0]}};
  }
  return w;
}

// A CTA's copies (all NTHR threads): Q of both maps once, then K1 | K2 | V of key tile `it` (0 is the diagonal tile,
// then descending; KeyTiles says how far) into a [K1 | K2 | V] stage. Sources are this thread's first chunks (kv head
// g, DiffLlama mapping; K and V from kv_base).
// Tile 0 goes out whole (issue_kv: rows past n are zero-filled); every later tile is full (its keys end at or before
// the query tile's first row), and goes out one copy at a time (KvSrc::copy, NCOPY per thread, PER_STEP after each
// k step of the S products) without bounds checks.
template <int D, int NTHR = THREADS>
struct CtaCopies {
  using QK = TileCopy<BN, D, NTHR>;
  using VC = TileCopy<BN, 2 * D, NTHR>;
  static constexpr int NCOPY = 2 * QK::PASSES + VC::PASSES, PER_STEP = NCOPY / (D / 16);
  static_assert(NCOPY % (D / 16) == 0, "the same number of copies per k step of the S products");
  const QK qk;
  const VC v;
  const bf16* base;  // sequence b of qkv (Q; also the never-read source of zero-filled copies)
  const bf16 *k_src0, *k_src1, *v_src;
  int64_t rs;
  int n, qt;
  __device__ __forceinline__ CtaCopies(const AttnParams& p, const CtaWork& w, int tid)
      : qk(tid), v(tid), base(p.qkv + int64_t(w.b) * p.batch_stride), rs(p.row_stride), n(p.n), qt(w.qt) {
    const bf16* kvb = kv_base(p) + int64_t(w.b) * p.batch_stride;
    k_src0 = kvb + qk.r * rs + p.k_off + int64_t(w.heads.k[0]) * D + qk.c * 8;
    k_src1 = kvb + qk.r * rs + p.k_off + int64_t(w.heads.k[1]) * D + qk.c * 8;
    v_src = kvb + v.r * rs + p.v_off + int64_t(w.heads.v[v.c < D / 8 ? 0 : 1]) * D + (v.c % (D / 8)) * 8;
    q1 = w.heads.q[0], q2 = w.heads.q[1];
  }
  int q1, q2;  // query heads of map 1 and map 2
  __device__ __forceinline__ void issue_q(bf16* sQ, const AttnParams& p, int) const {
    const int q0 = qt * BM;
    const bf16* q_src = base + (q0 + qk.r) * rs + p.q_off + qk.c * 8;
    qk.issue(sQ, q_src + int64_t(q1) * D, rs, n - q0, base);
    qk.issue(sQ + BM * D, q_src + int64_t(q2) * D, rs, n - q0, base);
  }
  // Q and the diagonal key tile, as the first cp.async group.
  __device__ __forceinline__ void issue_first(bf16* sQ, bf16* sK, bf16* sV, const AttnParams& p, int j) const {
    issue_q(sQ, p, j);
    issue_kv(sK, sV, 0);
    cp_async_commit();
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
    int bytes = 16;  // 0: the copies read nothing and zero-fill (schedule 4 after the last tile)
    __device__ __forceinline__ void copy(int i) const {
      if (i < QK::PASSES) c.qk.pass(sK, k0, c.rs, i, bytes);
      else if (i < 2 * QK::PASSES) c.qk.pass(sK + BN * D, k1, c.rs, i - QK::PASSES, bytes);
      else c.v.pass(sV, vv, c.rs, i - 2 * QK::PASSES, bytes);
    }
    // The copies that go out after k step kk of the S products (written out: the loop form changed the register
    // allocation of the 256-thread kernels).
    __device__ __forceinline__ void step(int kk) const {
      static_assert(PER_STEP == 2 || PER_STEP == 4, "copies per k step");
      copy(PER_STEP * kk);
      copy(PER_STEP * kk + 1);
      if constexpr (PER_STEP == 4) {
        copy(PER_STEP * kk + 2);
        copy(PER_STEP * kk + 3);
      }
    }
  };
  __device__ __forceinline__ KvSrc tile(int it, bf16* sK, bf16* sV) const {
    const int64_t off = int64_t(qt - it) * BN * rs;
    return {*this, k_src0 + off, k_src1 + off, v_src + off, sK, sV};
  }
};

template <int D, bool DIFF, bool WINDOW>
__global__ void __launch_bounds__(THREADS, Tile<D>::MIN_BLOCKS) diff_attn_fwd_lockstep_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NT = DIFF ? VW / 8 : D / 8;  // plain: each warp's head has a d-wide V
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sStage = sQ + T::Q_ELEMS;            // [2 stages][K1 | K2 | V]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  const CtaWork w = cta_work<DIFF>(p);
  const int qt = w.qt, j = w.j, b = w.b;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const CtaCopies<D> copies(p, w, tid);
  const int q0 = qt * BM;
  copies.issue_first(sQ, sStage, sStage + 2 * T::K_ELEMS, p, j);

  float acc[NT][4];
  zero(acc);
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;  // softmax in base 2: exp(x*s) = exp2(x*s*log2 e)
  const bf16* sQm = sQ + map * BM * D;
  const KeyTiles<WINDOW> tiles(p.window, qt);
  const int n_kt = tiles.n_kt;

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
      if (has_next) next.step(kk);
    });
    cp_async_commit();
    mask_band<WINDOW>(s, wrow, lane, tiles.band(it));
    float alpha[2];
    warp_softmax<true>(s, m_run, l_run, alpha, sl2);
    rescale(acc, alpha);
    uint32_t pa[BN / 16][4];
    pack_p(s, pa);
    if constexpr (DIFF) warp_pv<VW>(acc, pa, sV, lane);
    else warp_pv_half<D>(acc, pa, sV, map, lane);
  }

  cp_async_wait<0>();
  if constexpr (DIFF) {
    __syncthreads();  // all warps are done with the stages: reuse them for O2
    combine_store<VW>(acc, l_run, reinterpret_cast<float*>(sStage), warp, lane, p, q0, b, j);
  } else {
    plain_store(acc, l_run, p, q0 + wrow, b, int64_t(2 * j + map) * D, lane);
  }
  if (p.head_ns) {
    __syncthreads();  // the CTA's time ends with its last warp
    if (tid == 0) add_head_time<DIFF>(p, j, t_start);
  }
}

// V-split schedule (see the top of the file).
template <int D, bool WINDOW>
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
  const CtaWork w = cta_work<true>(p);
  const int qt = w.qt, j = w.j, b = w.b;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const CtaCopies<D> copies(p, w, tid);
  const KeyTiles<WINDOW> tiles(p.window, qt);
  const int q0 = qt * BM, n_kt = tiles.n_kt;
  copies.issue_first(sQ, sStage, sStage + 2 * T::K_ELEMS, p, j);

  float acc_own[NH][4], acc_oth[NH][4];  // this warp's V columns [map * D, map * D + D) of its own and the other map
  zero(acc_own);
  zero(acc_oth);
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
      if (has_next) next.step(kk);
    });
    cp_async_commit();
    mask_band<WINDOW>(s, wrow, lane, tiles.band(it));
    float alpha[2], alpha_o[2];
    warp_softmax<true>(s, m_run, l_run, alpha, sl2);
    uint32_t pa[BN / 16][4], po[BN / 16][4];
    pack_p(s, pa);
    exchange_p(pa, alpha, po, alpha_o, xp_own, xp_oth, xf_own, xf_oth, lane, cta_sync);
    rescale(acc_own, alpha);
    rescale(acc_oth, alpha_o);
    warp_pv_both<D, false>(acc_own, acc_oth, pa, po, sStage + (it & 1) * T::STAGE_ELEMS + 2 * T::K_ELEMS, map,
                                  lane);
  }

  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the exchange area of the last tile
  pair_epilogue<D>(acc_own, acc_oth, l_run, xf_own, xf_oth, map, lane, p, j, q0 + wrow, b, int64_t(j) * VW + map * D,
                   cta_sync);
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
}

// Schedule 4 (d = 64): each warp owns 16 rows of BOTH maps, so nothing is exchanged. A CTA is 4 warps (BM = 64 rows)
// and two CTAs share an SM at 255 registers per thread: the 2 x 2d-wide accumulators take 128, both S tiles 64. The
// S products of the two maps interleave, every V fragment feeds both maps' P V, and the epilogue needs no partner.
// Shared memory: the lockstep layout, Q and 2 stages of K1 | K2 | V (Tile<D>::SMEM_LOCKSTEP, 80 KB at d = 64).
constexpr int THREADS_W = 128;

// One key tile of schedule 4: S of both maps (the next tile's copies go out between the products), the softmaxes,
// the rescale, P V. The diagonal tile and the window's edge tiles (band.edge) need the mask. The copies go out on
// every tile, the last one included (then they zero-fill the free stage): without a branch among the S products,
// and with one rescale branch for both maps, ptxas schedules the tile without spills, +3-4% (bench/cuda_notes.md).
// (A loop body without the mask, the diagonal tile peeled off, measured 4% slower: twice the code.)
template <int D, bool DIFF, bool WINDOW, class Next>
__device__ __forceinline__ void warp2_tile(float (&acc)[2][(DIFF ? 2 : 1) * D / 8][4], float (&m_run)[2][2], float (&l_run)[2][2],
                                           const bf16* sQ, const bf16* stage, const Next& next, float sl2, int wrow,
                                           int lane, const Band& band) {
  constexpr int NH = D / 8;
  float s[2][BN / 8][4];
  warp_qk_maps<D, 2, true>(s, sQ, stage, wrow, lane, [&](int kk) { next.step(kk); });
  cp_async_commit();
  uint32_t pa[2][BN / 16][4];
  float alpha[2][2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    mask_band<WINDOW>(s[m], wrow, lane, band);
    warp_softmax<true>(s[m], m_run[m], l_run[m], alpha[m], sl2);
    pack_p(s[m], pa[m]);
  }
  if (__any_sync(0xffffffffu, moved(alpha[0]) || moved(alpha[1]))) {
    scale_rows(acc[0], alpha[0]);
    scale_rows(acc[1], alpha[1]);
  }
  if constexpr (DIFF) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      warp_pv_both<D, true>(reinterpret_cast<float(&)[NH][4]>(acc[0][h * NH]),
                            reinterpret_cast<float(&)[NH][4]>(acc[1][h * NH]), pa[0], pa[1], stage + 2 * BN * D, h,
                            lane);
  } else {
#pragma unroll
    for (int m = 0; m < 2; ++m) warp_pv_half<D>(acc[m], pa[m], stage + 2 * BN * D, m, lane);
  }
}

template <int D, bool DIFF, bool WINDOW>
__global__ void __launch_bounds__(THREADS_W, 2) diff_attn_fwd_warp2_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NT = DIFF ? VW / 8 : D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sStage = sQ + T::Q_ELEMS;            // [2 stages][K1 | K2 | V]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wrow = warp * 16;
  const CtaWork w = cta_work<DIFF>(p);
  const int qt = w.qt, j = w.j, b = w.b;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const CtaCopies<D, THREADS_W> copies(p, w, tid);
  const KeyTiles<WINDOW> tiles(p.window, qt);
  const int q0 = qt * BM, n_kt = tiles.n_kt;
  copies.issue_first(sQ, sStage, sStage + 2 * T::K_ELEMS, p, j);

  float acc[2][NT][4];  // [map][V column n8 tile]
  zero(acc[0]);
  zero(acc[1]);
  float m_run[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l_run[2][2] = {};
  const float sl2 = p.scale * 1.4426950408889634f;
  for (int it = 0; it < n_kt; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; every warp finished tile it-1 (whose stage the next copies overwrite)
    bf16* next_stage = sStage + ((it + 1) & 1) * T::STAGE_ELEMS;
    const bool has_next = it + 1 < n_kt;
    auto next = copies.tile(has_next ? it + 1 : it, next_stage, next_stage + 2 * T::K_ELEMS);
    if (!has_next) next.bytes = 0;  // (the current tile may end past n: read none of it)
    warp2_tile<D, DIFF, WINDOW>(acc, m_run, l_run, sQ, sStage + (it & 1) * T::STAGE_ELEMS, next, sl2, wrow, lane,
                        tiles.band(it));
  }
  cp_async_wait<0>();  // the last tile's zero-fill of the free stage

  if constexpr (!DIFF) {
    for (int m = 0; m < 2; ++m) plain_store(acc[m], l_run[m], p, q0 + wrow, b, int64_t(2 * j + m) * D, lane);
  } else {
  // O1/l1 - lambda O2/l2, RMS-normalised over the 2d columns of each row, all in this warp's registers.
  quad_sum(l_run[0]);
  quad_sum(l_run[1]);
  const float2 c = head_coef(p, j);  // O = c1 O1/l1 - c2 O2/l2
  const float inv1[2] = {c.x / l_run[0][0], c.x / l_run[0][1]};
  const float inv2[2] = {c.y / l_run[1][0], c.y / l_run[1][1]};
  float ss[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float o = acc[0][nt][e] * inv1[e >> 1] - acc[1][nt][e] * inv2[e >> 1];
      acc[0][nt][e] = o;
      ss[e >> 1] += o * o;
    }
  float f[2];
  quad_rms_factors<VW>(ss, p.eps, p.out_scale, f);
  store_rows(acc[0], f, p, q0 + wrow, b, int64_t(j) * VW, lane);
  }
  if (p.head_ns) {
    __syncthreads();  // the CTA's time ends with its last warp
    if (tid == 0) add_head_time<DIFF>(p, j, t_start);
  }
}

// Two passes over a CTA's key tiles with the S products on the tensor cores, for the map queries (row statistics and
// pooled views) without materialising a map. Pass 1 finds each row's (lazy) maximum and sum as the forward's online
// softmax does; pass 2 recomputes S for the key tiles from min(diagonal, kt_hi) down to kt_lo and hands each, with
// the rows' maxima and 1/sum and the tile's band (the keys its rows see), to `tile`. Under a sliding window both
// passes stop at the tile of the CTA's first row's first key (KeyTiles); a CTA whose pass 2 has no tile returns at
// once. A CTA (4 warps, 16 rows each) takes 64 query rows of the two maps of a
// differential head, or of a pair of plain heads; K1 | K2 of the next tile load (cp.async, double-buffered) while
// the current one is used. No V.
constexpr int THREADS_S = 128;
template <int D>
struct StatsTile {
  static constexpr int Q_ELEMS = 2 * BM * D, K_STAGE = 2 * BN * D;
  static constexpr int SMEM = (Q_ELEMS + 2 * K_STAGE) * 2;  // 48 KB at d = 64, 96 KB at d = 128
};

// What pass 2 hands over per tile: S of both maps (masked: -inf), and per map and row the maximum (log2 units, as
// online_softmax keeps it) and 1/sum, so that a = ex2(s * sl2 - m) / sum.
struct RowNorm {
  float m[2][2], inv_l[2][2], l[2][2];
};

template <int D, class Tile>
__device__ __forceinline__ void two_pass_rows(const AttnParams& p, const CtaWork& w, int kt_lo, int kt_hi,
                                              unsigned char* smem, float (&mabs)[2][2], Tile&& tile) {
  using T = StatsTile<D>;
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sK = sQ + T::Q_ELEMS;                // [2 stages][2 maps][BN][D]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wrow = warp * 16;
  const int qt = w.qt, q0 = qt * BM, n = p.n;
  const KeyTiles<true> tiles(p.window, qt);
  const int top2 = min(qt, kt_hi);                                        // pass 2's first tile
  const int n1 = tiles.n_kt, n2 = max(0, top2 - max(kt_lo, qt - n1 + 1) + 1);  // tiles of pass 1 (all) and pass 2
  if (n2 == 0) return;  // (uniform over the CTA, before any copy or barrier)
  const bf16* base = p.qkv;  // sequence 0
  const bf16* kvb = kv_base(p);
  const int64_t rs = p.row_stride;
  const TileCopy<BM, D, THREADS_S> qc(tid);
  const TileCopy<BN, D, THREADS_S> kc(tid);
#pragma unroll
  for (int m = 0; m < 2; ++m)
    qc.issue(sQ + m * BM * D, base + (q0 + qc.r) * rs + p.q_off + int64_t(w.heads.q[m]) * D + qc.c * 8, rs, n - q0, base);
  auto key_tile = [&](int u) { return u < n1 ? qt - u : top2 - (u - n1); };
  auto load_k = [&](int u, int stage) {
    const int k0 = key_tile(u) * BN;
#pragma unroll
    for (int m = 0; m < 2; ++m)
      kc.issue(sK + (stage * 2 + m) * BN * D, kvb + (k0 + kc.r) * rs + p.k_off + int64_t(w.heads.k[m]) * D + kc.c * 8,
               rs, n - k0, base);
  };
  load_k(0, 0);
  cp_async_commit();
  const float sl2 = p.scale * 1.4426950408889634f;
  RowNorm rn;
  float l_run[2][2] = {};
#pragma unroll
  for (int m = 0; m < 2; ++m) rn.m[m][0] = rn.m[m][1] = -INFINITY, mabs[m][0] = mabs[m][1] = 0.f;
  for (int u = 0; u < n1 + n2; ++u) {
    const int pass = u < n1 ? 0 : 1, kt = key_tile(u);
    cp_async_wait<0>();
    __syncthreads();  // tile u landed; every warp is done with tile u - 1, whose stage the next copy overwrites
    if (u + 1 < n1 + n2) load_k(u + 1, (u + 1) & 1);
    cp_async_commit();
    float s[2][BN / 8][4];
    warp_qk_maps<D, 2, false>(s, sQ, sK + (u & 1) * T::K_STAGE, wrow, lane, [](int) {});
    const Band band = tiles.band(qt - kt);
    mask_band<true>(s[0], wrow, lane, band);
    mask_band<true>(s[1], wrow, lane, band);
    if (pass == 0) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (s[m][nt][e] != -INFINITY) mabs[m][e >> 1] = fmaxf(mabs[m][e >> 1], fabsf(s[m][nt][e]));
        float alpha[2];
        warp_softmax<true>(s[m], rn.m[m], l_run[m], alpha, sl2);
      }
      if (u == n1 - 1) {  // pass 1 done: the rows' sums are final
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          quad_sum(l_run[m]);
#pragma unroll
          for (int r = 0; r < 2; ++r) rn.l[m][r] = l_run[m][r], rn.inv_l[m][r] = 1.f / l_run[m][r];
        }
      }
      continue;
    }
    tile(s, rn, kt * BN, band);
  }
  cp_async_wait<0>();
}

// The value v of the thread's row r over the quad of lanes sharing it: op 0 sum, 1 min, 2 max.
__device__ __forceinline__ float quad_reduce(float v, int op) {
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    const float x = __shfl_xor_sync(0xffffffffu, v, o);
    v = op == 0 ? v + x : op == 1 ? fminf(v, x) : fmaxf(v, x);
  }
  return v;
}

// Row statistics (attn_maps.h's MAP_* per query row).
template <int D, bool DIFF>
__global__ void __launch_bounds__(THREADS_S) attn_row_stats_kernel(const AttnParams p, float* row_stats) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wrow = (threadIdx.x >> 5) * 16, g4 = lane >> 2, t4 = lane & 3;
  const CtaWork w = cta_work<DIFF>(p);
  const int j = w.j, q0 = w.qt * BM, n = p.n;
  const float sl2 = p.scale * 1.4426950408889634f, lam = DIFF ? head_coef(p, j).y : 0.f;
  float mabs[2][2], ent[2][2] = {}, first[2][2] = {};
  float amin[2][2] = {{INFINITY, INFINITY}, {INFINITY, INFINITY}}, amax[2][2] = {};
  float absd[2] = {}, dlogd[2] = {}, neg[2] = {};
  float dmin[2] = {INFINITY, INFINITY}, dmax[2] = {-INFINITY, -INFINITY};
  RowNorm last;
  two_pass_rows<D>(p, w, 0, INT_MAX, smem, mabs, [&](const float (&s)[2][BN / 8][4], const RowNorm& rn, int k0,
                                                     const Band& band) {
    last = rn;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, col = nt * 8 + 2 * t4 + (e & 1);
        const bool causal = band.in(col, wrow + g4 + 8 * r);  // a key the row sees
        float a[2];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const float x = fmaf(s[m][nt][e], sl2, -rn.m[m][r]);  // log2 units; -inf where masked
          a[m] = causal ? ex2_ftz(x) * rn.inv_l[m][r] : 0.f;
          if (a[m] > 0.f) ent[m][r] += a[m] * x;
          if (causal) {
            amin[m][r] = fminf(amin[m][r], a[m]);
            amax[m][r] = fmaxf(amax[m][r], a[m]);
          }
          if (k0 + col == 0) first[m][r] = a[m];
        }
        if constexpr (DIFF) {
          const float d = a[0] - lam * a[1], ad = fabsf(d);
          absd[r] += ad;
          if (ad > 0.f) dlogd[r] += ad * __logf(ad);
          neg[r] += fmaxf(0.f, -d);
          if (causal) {
            dmin[r] = fminf(dmin[r], d);
            dmax[r] = fmaxf(dmax[r], d);
          }
        }
      }
  });
  constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float H[2], F[2], MA[2], AMIN[2], AMAX[2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      H[m] = __logf(last.l[m][r]) - LN2 * quad_reduce(ent[m][r], 0);  // -sum a ln a = ln l - ln2 sum a x
      F[m] = quad_reduce(first[m][r], 0);
      MA[m] = quad_reduce(mabs[m][r], 2) * p.scale;
      AMIN[m] = quad_reduce(amin[m][r], 1);
      AMAX[m] = quad_reduce(amax[m][r], 2);
    }
    const float AD = quad_reduce(absd[r], 0), DL = quad_reduce(dlogd[r], 0), NG = quad_reduce(neg[r], 0);
    const float DMIN = quad_reduce(dmin[r], 1), DMAX = quad_reduce(dmax[r], 2);
    const int row = q0 + wrow + g4 + 8 * r;
    if (t4 != 0 || row >= n) continue;
    if constexpr (DIFF) {
      float* st = row_stats + (int64_t(j) * n + row) * MAP_NSTAT;
      st[MAP_ENTROPY1] = H[0];
      st[MAP_ENTROPY2] = H[1];
      st[MAP_ENTROPY_DIFF] = AD > 0.f ? __logf(AD) - DL / AD : 0.f;
      st[MAP_FIRST1] = F[0];
      st[MAP_FIRST2] = F[1];
      st[MAP_FIRST_DIFF] = F[0] - lam * F[1];
      st[MAP_NEG_MASS] = NG;
      st[MAP_DIFF_MIN] = DMIN;
      st[MAP_DIFF_MAX] = DMAX;
      st[MAP_MAX_LOGIT1] = MA[0];
      st[MAP_MAX_LOGIT2] = MA[1];
    } else {
#pragma unroll
      for (int m = 0; m < 2; ++m) {  // plain head 2j + m: D = A, and |A| renormalised is A
        float* st = row_stats + (int64_t(2 * j + m) * n + row) * MAP_NSTAT;
        st[MAP_ENTROPY1] = H[m];
        st[MAP_ENTROPY2] = 0.f;
        st[MAP_ENTROPY_DIFF] = H[m];
        st[MAP_FIRST1] = F[m];
        st[MAP_FIRST2] = 0.f;
        st[MAP_FIRST_DIFF] = F[m];
        st[MAP_NEG_MASS] = 0.f;
        st[MAP_DIFF_MIN] = AMIN[m];
        st[MAP_DIFF_MAX] = AMAX[m];
        st[MAP_MAX_LOGIT1] = MA[m];
        st[MAP_MAX_LOGIT2] = 0.f;
      }
    }
  }
}

// The grid row of the 8 query rows [rb, rb + 8) when they all lie in the rectangle and in one grid row, else -1.
__device__ __forceinline__ int block_of_8(int64_t rb, int64_t lo, int64_t hi, int blocks) {
  if (rb < lo || rb + 7 >= hi) return -1;
  const int b = view_block(rb - lo, hi - lo, blocks);
  return b == view_block(rb + 7 - lo, hi - lo, blocks) ? b : -1;
}

// A pooled view (engine/core/map_query.h) of view head `head`: the CTAs take the query tiles of the rectangle; pass 2
// visits the key tiles that meet its columns. A warp pools its 16 x 64 part of a tile by runs: while its 8 or 16
// rows lie in one grid row and successive 8-column blocks in one grid column, each lane folds its entries in
// registers, and a run ends with one warp reduction and one atomic per map (a 32 x 32 cell of a 32K-token view:
// 2 per tile instead of 64 x 16). Entries of blocks that straddle cells or the rectangle's edge fold one by one.
template <int D, bool DIFF>
__global__ void __launch_bounds__(THREADS_S) attn_map_view_kernel(const AttnParams p, ViewPoolArgs v, int head,
                                                                  float* g1, float* g2, float* gd) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wrow = (threadIdx.x >> 5) * 16, g4 = lane >> 2, t4 = lane & 3;
  // blockIdx.x: the rectangle's query tiles, the last (heaviest) first
  const int qt = int((v.q1 - 1) / BM) - int(blockIdx.x);
  const int pair = DIFF ? head : head / 2, mine = DIFF ? 0 : head % 2;  // plain: the head's map of its pair
  CtaWork w{qt, pair, 0, view_head_map(true, pair, p.heads, p.kv_heads)};
  if (!DIFF) {
    const ViewHeadMap a = view_head_map(false, 2 * pair, p.heads, p.kv_heads);
    const ViewHeadMap b = view_head_map(false, 2 * pair + 1, p.heads, p.kv_heads);
    w.heads = ViewHeadMap{{a.q[0], b.q[0]}, {a.k[0], b.k[0]}, {a.v[0], b.v[0]}};
  }
  const int kt_lo = int(v.k0 / BN), kt_hi = int((v.k1 - 1) / BN);
  const float sl2 = p.scale * 1.4426950408889634f, lam = DIFF ? v.lambda : 0.f;
  const int64_t Er = v.q1 - v.q0, Ec = v.k1 - v.k0;
  const int64_t rowb = int64_t(qt) * BM + wrow;  // the warp's first row
  const int rc[2] = {block_of_8(rowb, v.q0, v.q1, v.rows), block_of_8(rowb + 8, v.q0, v.q1, v.rows)};
  const bool merged = rc[0] >= 0 && rc[0] == rc[1];  // all 16 rows in one grid row
  float* const g2m = DIFF ? g2 : nullptr;
  float mabs[2][2];
  two_pass_rows<D>(p, w, kt_lo, kt_hi, smem, mabs,
                   [&](const float (&s)[2][BN / 8][4], const RowNorm& rn, int k0, const Band& band) {
    // entry e (= 2 r + c) of n-tile nt of this lane: A1, A2 (0 for plain heads) and D
    auto probs = [&](int nt, int e, float& x1, float& x2, float& xd) {
      const int r = e >> 1, col = nt * 8 + 2 * t4 + (e & 1);
      const bool causal = band.in(col, wrow + g4 + 8 * r);  // a key the row sees
      float a[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) a[m] = causal ? ex2_ftz(fmaf(s[m][nt][e], sl2, -rn.m[m][r])) * rn.inv_l[m][r] : 0.f;
      x1 = DIFF ? a[0] : a[mine];
      x2 = DIFF ? a[1] : 0.f;
      xd = x1 - lam * x2;
    };
#pragma unroll
    for (int g = 0; g < 2; ++g) {  // row groups: both 8-row halves at once when merged, else each half
      if (merged && g == 1) break;
      const int grow = merged ? rc[0] : rc[g];
      float x1 = 0.f, x2 = 0.f, xd = 0.f;
      int run = -1;  // the grid column being folded (warp-uniform)
      auto flush = [&] {
        if (run < 0) return;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          x1 = pool_op(x1, __shfl_xor_sync(0xffffffffu, x1, o), v.mean, false);
          x2 = pool_op(x2, __shfl_xor_sync(0xffffffffu, x2, o), v.mean, false);
          xd = pool_op(xd, __shfl_xor_sync(0xffffffffu, xd, o), v.mean, true);
        }
        if (lane == 0) pool_into(g1, g2m, gd, int64_t(grow) * v.cols + run, x1, x2, xd, v.mean);
        x1 = x2 = xd = 0.f;
        run = -1;
      };
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        const int64_t colb = int64_t(k0) + nt * 8;
        const int gcol = grow >= 0 ? block_of_8(colb, v.k0, v.k1, v.cols) : -1;
        if (gcol >= 0) {
          if (gcol != run) {
            flush();
            run = gcol;
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!merged && (e >> 1) != g) continue;
            float y1, y2, yd;
            probs(nt, e, y1, y2, yd);
            x1 = pool_op(x1, y1, v.mean, false);
            x2 = pool_op(x2, y2, v.mean, false);
            xd = pool_op(xd, yd, v.mean, true);
          }
          continue;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // one entry at a time
          if (!merged && (e >> 1) != g) continue;
          const int64_t row = rowb + g4 + 8 * (e >> 1), col = colb + 2 * t4 + (e & 1);
          if (row < v.q0 || row >= v.q1 || row >= p.n || col < v.k0 || col >= v.k1) continue;
          float y1, y2, yd;
          probs(nt, e, y1, y2, yd);
          pool_into(g1, g2m, gd, int64_t(view_block(row - v.q0, Er, v.rows)) * v.cols + view_block(col - v.k0, Ec, v.cols),
                    y1, y2, yd, v.mean);
        }
      }
      flush();
    }
  });
}

template <int D, bool DIFF>
cudaError_t launch_stats(const AttnParams& p, float* row_stats, cudaStream_t stream) {
  constexpr int smem = StatsTile<D>::SMEM;
  const auto kernel = attn_row_stats_kernel<D, DIFF>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  AttnParams q = p;
  q.tile_major = false;
  const unsigned ctas = unsigned((p.n + BM - 1) / BM) * unsigned(p.heads / 2);
  kernel<<<ctas, THREADS_S, smem, stream>>>(q, row_stats);
  return cudaGetLastError();
}

// WINDOW: the kernels built for a sliding window (p.window > 0), else those without (KeyTiles).
template <int D, bool DIFF, bool WINDOW>
cudaError_t launch_w(const AttnParams& p, int schedule, cudaStream_t stream) {
  using T = Tile<D>;
  const unsigned ctas = unsigned((p.n + BM - 1) / BM) * unsigned((p.heads / 2) * p.batch);
  void (*kernel)(AttnParams) = diff_attn_fwd_lockstep_kernel<D, DIFF, WINDOW>;
  int smem = T::SMEM_LOCKSTEP;
  unsigned threads = THREADS;
  if (schedule == MMA_VSPLIT) {
    if constexpr (!DIFF) return cudaErrorInvalidValue;  // it shares V between the maps: plain heads have two Vs
    kernel = diff_attn_fwd_vsplit_kernel<D, WINDOW>;
    smem = T::SMEM_VSPLIT;
  } else if (schedule == MMA_BOTH) {
    if constexpr (D != 64) return cudaErrorInvalidValue;  // 2 x 2d-wide accumulators per warp fit only at d = 64
    kernel = diff_attn_fwd_warp2_kernel<64, DIFF, WINDOW>;
    threads = THREADS_W;
  } else if (schedule != MMA_LOCKSTEP) {
    return cudaErrorInvalidValue;
  }
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<ctas, threads, smem, stream>>>(p);
  return cudaGetLastError();
}
template <int D, bool DIFF>
cudaError_t launch(const AttnParams& p, int schedule, cudaStream_t stream) {
  return p.window > 0 ? launch_w<D, DIFF, true>(p, schedule, stream) : launch_w<D, DIFF, false>(p, schedule, stream);
}

template <int D, bool DIFF>
cudaError_t launch_view(const AttnParams& p, const ViewPoolArgs& v, int head, float* g1, float* g2, float* gd,
                        cudaStream_t stream) {
  constexpr int smem = StatsTile<D>::SMEM;
  const auto kernel = attn_map_view_kernel<D, DIFF>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const unsigned ctas = unsigned((v.q1 - 1) / BM - v.q0 / BM + 1);
  kernel<<<ctas, THREADS_S, smem, stream>>>(p, v, head, g1, g2, gd);
  return cudaGetLastError();
}

}  // namespace

MmaFootprint diff_attn_mma_footprint(int schedule, int d) {
  const auto pick = [&](auto t) -> MmaFootprint {
    using T = decltype(t);
    if (schedule == MMA_LOCKSTEP) return {T::SMEM_LOCKSTEP, 1};
    if (schedule == MMA_VSPLIT) return {T::SMEM_VSPLIT, T::MIN_BLOCKS};
    if (schedule == MMA_BOTH && d == 64) return {T::SMEM_LOCKSTEP, 2};
    return {};
  };
  if (d == 64) return pick(Tile<64>{});
  if (d == 128) return pick(Tile<128>{});
  return {};
}

cudaError_t launch_attn_map_view(const AttnParams& p, const ViewPoolArgs& v, int head, float* a1, float* a2, float* diff,
                                 cudaStream_t stream) {
  if (p.n <= 0 || p.heads % 2 || (p.diff && p.kv_heads % 2) || p.heads % p.kv_heads || head < 0 ||
      head >= view_heads(p) || v.q0 < 0 || v.q0 >= v.q1 || v.q1 > p.n || v.k0 < 0 || v.k0 >= v.k1 || v.k1 > p.n ||
      (p.diff && !a2))
    return cudaErrorInvalidValue;
  if (p.d == 64) return p.diff ? launch_view<64, true>(p, v, head, a1, a2, diff, stream)
                               : launch_view<64, false>(p, v, head, a1, a2, diff, stream);
  if (p.d == 128) return p.diff ? launch_view<128, true>(p, v, head, a1, a2, diff, stream)
                                : launch_view<128, false>(p, v, head, a1, a2, diff, stream);
  return cudaErrorInvalidValue;
}

int attn_row_stats_smem(int d) { return d == 64 ? StatsTile<64>::SMEM : d == 128 ? StatsTile<128>::SMEM : 0; }

cudaError_t launch_attn_row_stats(const AttnParams& p, float* row_stats, cudaStream_t stream) {
  if (p.n <= 0 || p.heads % 2 || (p.diff && p.kv_heads % 2) || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.d == 64) return p.diff ? launch_stats<64, true>(p, row_stats, stream) : launch_stats<64, false>(p, row_stats, stream);
  if (p.d == 128)
    return p.diff ? launch_stats<128, true>(p, row_stats, stream) : launch_stats<128, false>(p, row_stats, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_attn_mma(const AttnParams& p, int schedule, cudaStream_t stream) {
  if (p.n <= 0 || p.heads % 2 || (p.diff && p.kv_heads % 2) || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.d == 64) return p.diff ? launch<64, true>(p, schedule, stream) : launch<64, false>(p, schedule, stream);
  if (p.d == 128) return p.diff ? launch<128, true>(p, schedule, stream) : launch<128, false>(p, schedule, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
