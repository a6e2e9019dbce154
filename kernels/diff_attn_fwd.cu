// Fused differential attention, forward, causal: for each differential head one pass over the K/V tiles computes
// both online softmaxes (Q1 K1^T and Q2 K2^T) and both accumulations against the shared 2d-wide V tile, then
// writes  (1 - lambda_init) * RMSNorm_2d(O1/l1 - lambda * O2/l2)  in bf16. bf16 inputs, f32 accumulation and
// softmax statistics (FlashAttention-2 style: exp2 with the scale folded in, rescale on a new row maximum).
//
// Work split (why): a CTA owns BM = 64 query rows of one differential head and runs 8 warps. Warps 0-3 hold map 1,
// warps 4-7 map 2; each warp owns 16 rows of its map and all 2d output columns, so each accumulator is
// 16 x 2d f32 = 2d/8 * 4 registers per thread (128 for d = 128, FA2's budget for its d = 256 path). Splitting
// the two maps across warps (rather than giving one warp both) keeps the register file under 255 without
// recomputing any QK^T product; the price is that V is read from shared memory by both warp groups.
// Both groups share the V tile (loaded once per CTA) and the Q/K tiles of their own map.
// Tiles: BN = 64 keys per iteration, cp.async double buffering (tile t+1 is in flight while t is computed),
// every tile XOR-swizzled in 16-byte chunks so ldmatrix is conflict-free. Diagonal tile first (it needs the
// causal mask and guarantees a finite row maximum), q tiles launched heaviest first for the causal imbalance.
// Epilogue: map-2 warps park O2/l2 in shared memory (reusing the K/V stages) in fragment order; map-1 warps
// combine, reduce the sum of squares over 2d inside each quad, scale and store.
//
// Shared memory: d = 128: Q 32 KB + 2 stages x (K1, K2 16 KB each + V 32 KB) = 160 KB, one CTA per SM;
//                d = 64:  Q 16 KB + 2 x 32 KB = 80 KB, two CTAs per SM.
#include "diff_attn_fwd.h"

#include <cmath>

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
  static constexpr int VW = 2 * D;               // width of V and of the output of one differential head
  static constexpr int Q_ELEMS = 2 * BM * D;     // both maps
  static constexpr int K_ELEMS = BN * D;         // one map
  static constexpr int V_ELEMS = BN * VW;
  static constexpr int STAGE_ELEMS = 2 * K_ELEMS + V_ELEMS;
  static constexpr int SMEM_BYTES = (Q_ELEMS + 2 * STAGE_ELEMS) * 2;
  static constexpr int MIN_BLOCKS = D == 64 ? 2 : 1;
  static_assert(BM * VW * 4 <= 2 * STAGE_ELEMS * 2, "O2 staging must fit in the K/V stages");
};

template <int D>
__global__ void __launch_bounds__(THREADS, Tile<D>::MIN_BLOCKS) diff_attn_fwd_kernel(const AttnParams p) {
  using T = Tile<D>;
  constexpr int VW = T::VW;
  constexpr int CH = D / 8;     // 16-byte chunks in a Q/K row
  constexpr int VCH = VW / 8;   // in a V row
  constexpr int NT = VW / 8;    // n8 tiles of the output
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [2 maps][BM][D]
  bf16* sStage = sQ + T::Q_ELEMS;            // [2 stages][K1 | K2 | V]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const CtaTile ct = cta_tile(int(blockIdx.x), (p.n + BM - 1) / BM, hv * p.batch, p.tile_major);
  const int qt = ct.qt, j = ct.bh % hv, b = ct.bh / hv;  // heaviest (longest causal row) tiles first
  const int g = j / (p.heads / p.kv_heads);
  const bf16* base = p.qkv + int64_t(b) * p.batch_stride;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const int q0 = qt * BM;
#pragma unroll
  for (int id = tid; id < 2 * BM * CH; id += THREADS) {
    const int m = id / (BM * CH), r = (id / CH) % BM, c = id % CH;
    const int tok = q0 + r;
    const bool ok = tok < p.n;
    const bf16* src = base + int64_t(ok ? tok : 0) * p.row_stride + p.q_off + int64_t(m == 0 ? j : j + hv) * D + c * 8;
    cp_async_16(smem_addr(sQ + m * BM * D + swz<D>(r, c * 8)), src, ok ? 16 : 0);
  }
  auto load_kv = [&](int kt, int stage) {
    bf16* sK = sStage + stage * T::STAGE_ELEMS;
    bf16* sV = sK + 2 * T::K_ELEMS;
    const int k0 = kt * BN;
#pragma unroll
    for (int id = tid; id < 2 * BN * CH; id += THREADS) {
      const int m = id / (BN * CH), r = (id / CH) % BN, c = id % CH;
      const int tok = k0 + r;
      const bool ok = tok < p.n;
      const bf16* src =
          base + int64_t(ok ? tok : 0) * p.row_stride + p.k_off + int64_t(m == 0 ? g : half_kv + g) * D + c * 8;
      cp_async_16(smem_addr(sK + m * T::K_ELEMS + swz<D>(r, c * 8)), src, ok ? 16 : 0);
    }
#pragma unroll
    for (int id = tid; id < BN * VCH; id += THREADS) {
      const int r = id / VCH, c = id % VCH;
      const int tok = k0 + r;
      const bool ok = tok < p.n;
      const int vh = c < CH ? g : half_kv + g;
      const int cc = c < CH ? c : c - CH;
      const bf16* src = base + int64_t(ok ? tok : 0) * p.row_stride + p.v_off + int64_t(vh) * D + cc * 8;
      cp_async_16(smem_addr(sV + swz<VW>(r, c * 8)), src, ok ? 16 : 0);
    }
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
    if (it + 1 < n_kt) load_kv(kt - 1, stage ^ 1);
    cp_async_commit();
    const bf16* sK = sStage + stage * T::STAGE_ELEMS + map * T::K_ELEMS;
    const bf16* sV = sStage + stage * T::STAGE_ELEMS + 2 * T::K_ELEMS;

    // S = Q K^T for this warp's 16 rows x BN keys
    float s[BN / 8][4];
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
    if (it == 0) {  // diagonal tile: key column > query row is masked (kt * BN == q0 here)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + 2 * t4 + (e & 1);
          const int row = wrow + g4 + (e >> 1) * 8;
          if (col > row) s[nt][e] = -INFINITY;
        }
    }
    // online softmax: rows g4 (r = 0) and g4 + 8 (r = 1) of this warp's 16
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float alpha[2], rs[2] = {0.f, 0.f};
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
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      acc[i][0] *= alpha[0];
      acc[i][1] *= alpha[0];
      acc[i][2] *= alpha[1];
      acc[i][3] *= alpha[1];
    }
    // O += P V: the S accumulators of n-tiles 2kk, 2kk+1 are exactly the A fragment of key chunk kk
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                       pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                       pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nn = 0; nn < VW / 16; ++nn) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, smem_addr(sV + swz<VW>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, nn * 16 + (lane >> 4) * 8)));
        mma_16816(acc[2 * nn], a, bb[0], bb[1]);
        mma_16816(acc[2 * nn + 1], a, bb[2], bb[3]);
      }
    }
  }

  cp_async_wait<0>();
  __syncthreads();  // all warps are done with the stages: reuse them for O2
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
  float* sO2 = reinterpret_cast<float*>(sStage);  // [4 warps][NT][4][32 lanes]: each access is 32 consecutive words
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
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
}

template <int D>
cudaError_t launch(const AttnParams& p, cudaStream_t stream) {
  constexpr int smem = Tile<D>::SMEM_BYTES;
  cudaError_t e = cudaFuncSetAttribute(diff_attn_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  AttnParams q = p;
  q.tile_major = attn_tile_major(p);
  const unsigned ctas = unsigned((p.n + BM - 1) / BM) * unsigned((p.heads / 2) * p.batch);
  diff_attn_fwd_kernel<D><<<ctas, THREADS, smem, stream>>>(q);
  return cudaGetLastError();
}

}  // namespace

bool diff_attn_fwd_supported(int d) { return d == 64 || d == 128; }

cudaError_t launch_diff_attn_fwd(const AttnParams& p, cudaStream_t stream) {
  if (!p.diff || p.n <= 0 || p.heads % 2 || p.kv_heads % 2 || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.d == 64) return launch<64>(p, stream);
  if (p.d == 128) return launch<128>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
