// Fused differential attention, forward, causal, on mma.sync (sm_80 and newer; the portable kernel): for each
// differential head one pass over the K/V tiles computes both online softmaxes (Q1 K1^T and Q2 K2^T) and both
// accumulations against the shared 2d-wide V tile, then writes  (1 - lambda_init) * RMSNorm_2d(O1/l1 - lambda O2/l2)
// in bf16. bf16 inputs, f32 accumulation and softmax statistics (FlashAttention-2 style: exp2 with the scale
// folded in, rescale on a new row maximum).
//
// Work split (why): a CTA owns BM = 64 query rows of one differential head and runs 8 warps. Warps 0-3 hold map 1,
// warps 4-7 map 2; each warp owns 16 rows of its map and all 2d output columns, so each accumulator is
// 16 x 2d f32 = 2d/8 * 4 registers per thread (128 for d = 128, FA2's budget for its d = 256 path). Splitting
// the two maps across warps (rather than giving one warp both) keeps the register file under 255 without
// recomputing any QK^T product; the price is that V is read from shared memory by both warp groups.
// Every tile is XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free. The diagonal tile comes first (it
// needs the causal mask and guarantees a finite row maximum), query tiles are launched heaviest first.
//
// Two schedules of the same arithmetic (the skewed one where its shared memory fits, see mma_schedule):
//  1 lockstep: K1/K2/V double-buffered with cp.async, one __syncthreads per key tile; all eight warps compute S,
//    then their softmax, then P V at the same time, so the tensor pipes idle through every softmax.
//  2 skewed: map 2 runs half a tile behind map 1 inside the same per-tile barrier. In iteration t map 1 computes
//    S(t), its softmax, then P(t) V(t); map 2 computes P(t-1) V(t-1), then S(t) and its softmax. On each SM
//    sub-partition one warp of each map shares the scheduler, so one warp's softmax now runs while the other
//    issues mma.sync. V needs a third stage (map 2 still reads V(t-1) while V(t+1) loads). Measured on the H200:
//    +4-5% at d = 128 over lockstep, equal at d = 64 (two CTAs per SM already overlap there). A ping-pong with
//    strict turns (FA3 style, named barriers, mbarrier-tracked cp.async) was 4-30% slower than lockstep: one warp
//    alone cannot keep the tensor pipe busy with mma.sync, two interleaved warps can (bench/cuda_notes.md).
// Epilogue (both): map-2 warps park O2/l2 in shared memory (reusing the K/V stages) in fragment order; map-1 warps
// combine, reduce the sum of squares over 2d inside each quad, scale and store.
//
// Shared memory: lockstep: Q 2 x 64 x d + 2 stages x (K1, K2, V) = 160 KB at d = 128, 80 KB at d = 64;
//                skewed: Q + 2 x (K1, K2) + 3 x V = 192 KB at d = 128 (one CTA per SM), 96 KB at d = 64 (two).
#include "diff_attn_fwd.h"

#include <cmath>
#include <cstdlib>

#include "mma_sm80.cuh"

namespace ds::kern {
namespace {

constexpr int BM = 64, BN = 64, THREADS = 256;
constexpr int SK_VS = 3;  // skewed: V stages (map 2 reads V(t-1) while V(t+1) loads)

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
  // skewed: [Q][2 stages][K1 | K2][SK_VS stages][V]
  static constexpr int SK_K_OFF = Q_ELEMS, SK_V_OFF = SK_K_OFF + 2 * 2 * K_ELEMS;
  static constexpr int SMEM_SKEWED = (SK_V_OFF + SK_VS * V_ELEMS) * 2;
  static constexpr int MIN_BLOCKS = D == 64 ? 2 : 1;
  static_assert(BM * VW * 4 <= 2 * STAGE_ELEMS * 2, "O2 staging must fit in the K/V stages");
  static_assert(MIN_BLOCKS * SMEM_SKEWED <= 227 * 1024, "shared memory");
  // V-split: the lockstep stages, then the exchange area [4 row groups][2 maps]: P fragments (4 x 32 lanes x 16 B)
  // and per-lane pairs of floats (alpha, later l and the sums of squares).
  static constexpr int XP_BYTES = 4 * 2 * (BN / 16) * 32 * 16, XF_BYTES = 4 * 2 * 32 * 8;
  static constexpr int SMEM_VSPLIT = SMEM_LOCKSTEP + XP_BYTES + XF_BYTES;
};

// A thread's share of copying a ROWS x W bf16 tile into a swizzled shared tile with NTHR threads: one 16-byte
// column chunk c of rows r + i * (rows per pass). Source pointer, chunk and swizzle are fixed per thread, so a copy
// costs an address add and the cp.async (runtime-bounded loops spent ~36 instructions per copy, all between the
// barrier and the first mma: bench/cuda_notes.md, v4 -> v5 on the wgmma kernel and the same fix here).
template <int ROWS, int W, int NTHR>
struct TileCopy {
  static constexpr int CPR = W / 8, RPP = NTHR / CPR, PASSES = ROWS / RPP;
  static_assert(NTHR % CPR == 0 && ROWS % RPP == 0, "copy plan");
  int c, r;
  __device__ explicit TileCopy(int t) : c(t % CPR), r(t / CPR) {}
  // src: this thread's first chunk, i.e. column c * 8 of the tile's row r (row stride rs elements); rows >=
  // rows_left are zero-filled.
  __device__ __forceinline__ void issue(bf16* dst, const bf16* src, int64_t rs, int rows_left, const bf16* any) const {
    dst += r * W + ((c ^ (r & 7)) << 3);
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const bool ok = r + i * RPP < rows_left;
      const int d = i * RPP * W + (RPP % 8 == 0 ? 0 : (((c ^ ((r + i * RPP) & 7)) - (c ^ (r & 7))) * 8));
      cp_async_16(smem_addr(dst + d), ok ? src + i * RPP * rs : any, ok ? 16 : 0);
    }
  }
};

// S = Q K^T for this warp's 16 rows x BN keys.
template <int D>
__device__ __forceinline__ void warp_qk(float (&s)[BN / 8][4], const bf16* sQm, const bf16* sK, int wrow, int lane) {
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
// most tiles move no maximum, and the 2d/2 multiplies per row cost as many issue slots as a third of the P V
// products.
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

// Epilogue, entered by all 256 threads once no warp reads the K/V stages any more (sO2 points into them): map 2
// parks O2/l2, map 1 combines, normalises and stores rows q0.. of differential head j, sequence b.
template <int VW>
__device__ __forceinline__ void combine_store(float (&acc)[VW / 8][4], float (&l_run)[2], float* sO2, int warp,
                                              int lane, const AttnParams& p, int q0, int b, int j) {
  constexpr int NT = VW / 8;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
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
    const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + wrow + g4 + 8 * r;
      if (row < p.n) {
        bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + int64_t(j) * VW + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          *reinterpret_cast<uint32_t*>(o + nt * 8) = pack_bf16x2(acc[nt][2 * r] * f[r], acc[nt][2 * r + 1] * f[r]);
      }
    }
  }
}

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

template <int D>
__global__ void __launch_bounds__(THREADS, Tile<D>::MIN_BLOCKS) diff_attn_fwd_lockstep_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NT = VW / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sStage = sQ + T::Q_ELEMS;            // [2 stages][K1 | K2 | V]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const CtaWork w = cta_work(p);
  const int qt = w.qt, j = w.j, b = w.b, g = w.g;
  const bf16* base = p.qkv + int64_t(b) * p.batch_stride;
  const int64_t rs = p.row_stride;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const TileCopy<BN, D, THREADS> qk_copy(tid);
  const TileCopy<BN, VW, THREADS> v_copy(tid);
  const bf16* k_src0 = base + qk_copy.r * rs + p.k_off + int64_t(g) * D + qk_copy.c * 8;
  const bf16* k_src1 = base + qk_copy.r * rs + p.k_off + int64_t(half_kv + g) * D + qk_copy.c * 8;
  const bf16* v_src =
      base + v_copy.r * rs + p.v_off + int64_t(v_copy.c < D / 8 ? g : half_kv + g) * D + (v_copy.c % (D / 8)) * 8;

  const int q0 = qt * BM;
  const bf16* q_src = base + (q0 + qk_copy.r) * rs + p.q_off + qk_copy.c * 8;
  qk_copy.issue(sQ, q_src + int64_t(j) * D, rs, p.n - q0, base);
  qk_copy.issue(sQ + BM * D, q_src + int64_t(j + hv) * D, rs, p.n - q0, base);
  auto load_kv = [&](int kt, int stage) {
    bf16* sK = sStage + stage * T::STAGE_ELEMS;
    const int k0 = kt * BN;
    qk_copy.issue(sK, k_src0 + int64_t(k0) * rs, rs, p.n - k0, base);
    qk_copy.issue(sK + T::K_ELEMS, k_src1 + int64_t(k0) * rs, rs, p.n - k0, base);
    v_copy.issue(sK + 2 * T::K_ELEMS, v_src + int64_t(k0) * rs, rs, p.n - k0, base);
  };

  load_kv(qt, 0);
  cp_async_commit();

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;  // softmax in base 2: exp(x*s) = exp2(x*s*log2 e)
  const bf16* sQm = sQ + map * BM * D;
  const int n_kt = qt + 1;

  for (int it = 0; it < n_kt; ++it) {
    const int kt = qt - it, stage = it & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed for everyone, and everyone finished tile it-1 (its stage is reused next)
    const bf16* sK = sStage + stage * T::STAGE_ELEMS + map * T::K_ELEMS;
    const bf16* sV = sStage + stage * T::STAGE_ELEMS + 2 * T::K_ELEMS;
    float s[BN / 8][4];
    warp_qk<D>(s, sQm, sK, wrow, lane);
    // The next tile's loads go out once this warp's S products are issued, so the tensor pipes are busy while the
    // copies are issued (the other stage is free: every warp passed the barrier after finishing tile it-1).
    if (it + 1 < n_kt) load_kv(kt - 1, stage ^ 1);
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

template <int D>
__global__ void __launch_bounds__(THREADS, Tile<D>::MIN_BLOCKS) diff_attn_fwd_skewed_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW, NT = VW / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sK = sQ + T::SK_K_OFF;               // [2 stages][K1 | K2]
  bf16* sV = sQ + T::SK_V_OFF;               // [SK_VS stages][BN][VW]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const CtaWork w = cta_work(p);
  const int qt = w.qt, j = w.j, b = w.b, g = w.g;
  const bf16* base = p.qkv + int64_t(b) * p.batch_stride;
  const int64_t rs = p.row_stride;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const TileCopy<BN, D, THREADS> qk_copy(tid);
  const TileCopy<BN, VW, THREADS> v_copy(tid);
  const bf16* k_src0 = base + qk_copy.r * rs + p.k_off + int64_t(g) * D + qk_copy.c * 8;
  const bf16* k_src1 = base + qk_copy.r * rs + p.k_off + int64_t(half_kv + g) * D + qk_copy.c * 8;
  const bf16* v_src =
      base + v_copy.r * rs + p.v_off + int64_t(v_copy.c < D / 8 ? g : half_kv + g) * D + (v_copy.c % (D / 8)) * 8;
  const int q0 = qt * BM, n_kt = qt + 1;
  const bf16* q_src = base + (q0 + qk_copy.r) * rs + p.q_off + qk_copy.c * 8;
  qk_copy.issue(sQ, q_src + int64_t(j) * D, rs, p.n - q0, base);
  qk_copy.issue(sQ + BM * D, q_src + int64_t(j + hv) * D, rs, p.n - q0, base);
  auto load_kv = [&](int it) {  // K(it) into K stage it % 2, V(it) into V stage it % SK_VS
    const int k0 = (qt - it) * BN;
    bf16* k = sK + (it & 1) * 2 * T::K_ELEMS;
    qk_copy.issue(k, k_src0 + int64_t(k0) * rs, rs, p.n - k0, base);
    qk_copy.issue(k + T::K_ELEMS, k_src1 + int64_t(k0) * rs, rs, p.n - k0, base);
    v_copy.issue(sV + (it % SK_VS) * T::V_ELEMS, v_src + int64_t(k0) * rs, rs, p.n - k0, base);
  };
  load_kv(0);
  cp_async_commit();

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;  // softmax in base 2: exp(x*s) = exp2(x*s*log2 e)
  const bf16* sQm = sQ + map * BM * D;
  uint32_t pa[BN / 16][4];

  for (int it = 0; it < n_kt; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; every warp finished iteration it-1 (K(it-1), V(it-2) stages are free)
    if (map == 1 && it > 0) warp_pv<VW>(acc, pa, sV + ((it - 1) % SK_VS) * T::V_ELEMS, lane);  // map 2, one behind
    float s[BN / 8][4];
    warp_qk<D>(s, sQm, sK + ((it & 1) * 2 + map) * T::K_ELEMS, wrow, lane);
    if (it + 1 < n_kt) load_kv(it + 1);
    cp_async_commit();
    if (it == 0) mask_diagonal(s, wrow, lane);
    float alpha[2];
    online_softmax(s, m_run, l_run, alpha, sl2);
    pack_p(s, pa);
    rescale(acc, alpha);  // map 2: after P(it-1) V(it-1) above
    if (map == 0) warp_pv<VW>(acc, pa, sV + (it % SK_VS) * T::V_ELEMS, lane);
  }
  if (map == 1) warp_pv<VW>(acc, pa, sV + ((n_kt - 1) % SK_VS) * T::V_ELEMS, lane);

  cp_async_wait<0>();
  __syncthreads();  // all warps are done with the stages: reuse them for O2
  combine_store<VW>(acc, l_run, reinterpret_cast<float*>(sK), warp, lane, p, q0, b, j);
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
}

// V-split (experiment): warps w (map 1) and w + 4 (map 2) own the same 16 rows. Each computes its own map's S and
// softmax as before, then they swap P (and alpha) through shared memory, and each accumulates BOTH maps' P V over
// half of V's 2d columns: every V fragment read with ldmatrix feeds two mma.sync, so V's shared-memory reads per
// tile halve (104 -> 72 ldmatrix per warp at d = 128; the kernel is near shared-memory bandwidth).
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
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const CtaWork w = cta_work(p);
  const int qt = w.qt, j = w.j, b = w.b, g = w.g;
  const bf16* base = p.qkv + int64_t(b) * p.batch_stride;
  const int64_t rs = p.row_stride;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const TileCopy<BN, D, THREADS> qk_copy(tid);
  const TileCopy<BN, VW, THREADS> v_copy(tid);
  const bf16* k_src0 = base + qk_copy.r * rs + p.k_off + int64_t(g) * D + qk_copy.c * 8;
  const bf16* k_src1 = base + qk_copy.r * rs + p.k_off + int64_t(half_kv + g) * D + qk_copy.c * 8;
  const bf16* v_src =
      base + v_copy.r * rs + p.v_off + int64_t(v_copy.c < D / 8 ? g : half_kv + g) * D + (v_copy.c % (D / 8)) * 8;
  const int q0 = qt * BM, n_kt = qt + 1;
  const bf16* q_src = base + (q0 + qk_copy.r) * rs + p.q_off + qk_copy.c * 8;
  qk_copy.issue(sQ, q_src + int64_t(j) * D, rs, p.n - q0, base);
  qk_copy.issue(sQ + BM * D, q_src + int64_t(j + hv) * D, rs, p.n - q0, base);
  auto load_kv = [&](int it) {
    const int k0 = (qt - it) * BN;
    bf16* k = sStage + (it & 1) * T::STAGE_ELEMS;
    qk_copy.issue(k, k_src0 + int64_t(k0) * rs, rs, p.n - k0, base);
    qk_copy.issue(k + T::K_ELEMS, k_src1 + int64_t(k0) * rs, rs, p.n - k0, base);
    v_copy.issue(k + 2 * T::K_ELEMS, v_src + int64_t(k0) * rs, rs, p.n - k0, base);
  };
  load_kv(0);
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
    float s[BN / 8][4];
    warp_qk<D>(s, sQm, sStage + (it & 1) * T::STAGE_ELEMS + map * T::K_ELEMS, wrow, lane);
    if (it + 1 < n_kt) load_kv(it + 1);
    cp_async_commit();
    if (it == 0) mask_diagonal(s, wrow, lane);
    float alpha[2];
    online_softmax(s, m_run, l_run, alpha, sl2);
    uint32_t pa[BN / 16][4];
    pack_p(s, pa);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) xp_own[kk * 32 + lane] = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
    xf_own[lane] = make_float2(alpha[0], alpha[1]);
    __syncthreads();  // both maps' P and alpha of this tile are in shared memory
    const float2 ao = xf_oth[lane];
    const float alpha_o[2] = {ao.x, ao.y};
    rescale(acc_own, alpha);
    rescale(acc_oth, alpha_o);
    const bf16* sV = sStage + (it & 1) * T::STAGE_ELEMS + 2 * T::K_ELEMS;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint4 x = xp_oth[kk * 32 + lane];
      const uint32_t po[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, smem_addr(sV + swz<VW>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                     map * D + nn * 16 + (lane >> 4) * 8)));
        mma_16816(acc_own[2 * nn], pa[kk], bb[0], bb[1]);
        mma_16816(acc_own[2 * nn + 1], pa[kk], bb[2], bb[3]);
        mma_16816(acc_oth[2 * nn], po, bb[0], bb[1]);
        mma_16816(acc_oth[2 * nn + 1], po, bb[2], bb[3]);
      }
    }
  }

  // Epilogue: swap l, combine this warp's column half, swap the sums of squares, normalise, store.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the exchange area of the last tile
  xf_own[lane] = make_float2(l_run[0], l_run[1]);
  __syncthreads();
  const float2 lo = xf_oth[lane];
  const float inv_own[2] = {1.f / l_run[0], 1.f / l_run[1]}, inv_oth[2] = {1.f / lo.x, 1.f / lo.y};
  const float c_own = map == 0 ? 1.f : -p.lambda, c_oth = map == 0 ? -p.lambda : 1.f;  // O1/l1 - lambda O2/l2
  float ss[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < NH; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float o = c_own * acc_own[nt][e] * inv_own[e >> 1] + c_oth * acc_oth[nt][e] * inv_oth[e >> 1];
      acc_own[nt][e] = o;
      ss[e >> 1] += o * o;
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
  }
  __syncthreads();  // both warps read l
  xf_own[lane] = make_float2(ss[0], ss[1]);
  __syncthreads();
  const float2 so = xf_oth[lane];
  const float f[2] = {rsqrtf((ss[0] + so.x) * (1.f / VW) + p.eps) * p.out_scale,
                      rsqrtf((ss[1] + so.y) * (1.f / VW) + p.eps) * p.out_scale};
  const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + wrow + g4 + 8 * r;
    if (row < p.n) {
      bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + int64_t(j) * VW +
                map * D + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < NH; ++nt)
        *reinterpret_cast<uint32_t*>(o + nt * 8) = pack_bf16x2(acc_own[nt][2 * r] * f[r], acc_own[nt][2 * r + 1] * f[r]);
    }
  }
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
}

// The schedule for head_dim D on the current device: 2 (skewed) where its shared memory fits MIN_BLOCKS CTAs per
// SM (H100/H200: 227 KB per block, 228 KB per SM), else 1 (lockstep: 160 KB at d = 128 fits an A100's 163 KB), else
// 0 (neither fits: the caller takes the generic kernel). DS_ATTN_MMA_VER=1 or =2 forces one (tests, benchmarks).
template <int D>
int mma_schedule() {
  using T = Tile<D>;
  if (const char* e = std::getenv("DS_ATTN_MMA_VER"); e && e[0] >= '1' && e[0] <= '3') return e[0] - '0';
  static int cached[64] = {};  // per device: schedule + 1 once known
  int dev = 0, per_block = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 0;
  }
  if (cached[dev] == 0) {
    int schedule = 0;
    constexpr int reserved = 1024;  // per CTA, by the driver
    if (cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess)
      cudaGetLastError();
    else if (T::SMEM_SKEWED <= per_block && T::MIN_BLOCKS * (T::SMEM_SKEWED + reserved) <= per_sm)
      schedule = 2;
    else if (T::SMEM_LOCKSTEP <= per_block)
      schedule = 1;
    cached[dev] = schedule + 1;
  }
  return cached[dev] - 1;
}

template <int D>
cudaError_t launch(const AttnParams& p, cudaStream_t stream) {
  const int schedule = mma_schedule<D>();
  if (schedule == 0) return cudaErrorInvalidConfiguration;
  const auto kernel = schedule == 3   ? diff_attn_fwd_vsplit_kernel<D>
                      : schedule == 2 ? diff_attn_fwd_skewed_kernel<D>
                                      : diff_attn_fwd_lockstep_kernel<D>;
  const int smem = schedule == 3   ? Tile<D>::SMEM_VSPLIT
                   : schedule == 2 ? Tile<D>::SMEM_SKEWED
                                   : Tile<D>::SMEM_LOCKSTEP;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  AttnParams q = p;
  q.tile_major = attn_tile_major(p);
  const unsigned ctas = unsigned((p.n + BM - 1) / BM) * unsigned((p.heads / 2) * p.batch);
  kernel<<<ctas, THREADS, smem, stream>>>(q);
  return cudaGetLastError();
}

}  // namespace

bool diff_attn_fwd_supported(int d) {
  return (d == 64 && mma_schedule<64>() != 0) || (d == 128 && mma_schedule<128>() != 0);
}

cudaError_t launch_diff_attn_fwd(const AttnParams& p, cudaStream_t stream) {
  if (!p.diff || p.n <= 0 || p.heads % 2 || p.kv_heads % 2 || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.d == 64) return launch<64>(p, stream);
  if (p.d == 128) return launch<128>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
