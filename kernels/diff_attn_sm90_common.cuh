// Pieces shared by the Hopper fused differential-attention kernels (diff_attn_fwd_sm90.cu: v4/v5, all threads load;
// diff_attn_fwd_sm90_ws.cu: v9, warp-specialised): wgmma descriptors and ordering, the online softmax on the wgmma
// accumulator layout, the O rescale, packing P into the register A operand, and the epilogue of map 1.
// Accumulator layout (m64nNk16, per thread): element i belongs to row g4 + 8 * ((i >> 1) & 1) of the warp's 16 rows
// and to column 8 * (i >> 2) + 2 * t4 + (i & 1). Only valid inside code compiled for sm_90a (DS_SM90A guards).
#pragma once
#include <cmath>
#include <cstdint>

#include "attn_params.h"
#include "mma_sm80.cuh"
#include "wgmma_sm90.cuh"

namespace ds::kern::sm90 {

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t desc128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins a register at this point of the program (wgmma reads and writes registers asynchronously: uses must not
// move across the fence/wait instructions).
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// S = Q K^T for the warpgroup's 64 query rows x BN keys: Q (64 rows) and K (BN rows) K-major SW128 tiles in
// [D/64 slabs][rows][64] layout; one commit group.
template <int D, int BN>
__device__ __forceinline__ void issue_qk(float (&s)[BN / 2], uint32_t q_base, uint32_t k_base) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t qo = uint32_t((kk >> 2) * 64 * 128 + (kk & 3) * 32), ko = uint32_t((kk >> 2) * BN * 128 + (kk & 3) * 32);
    if constexpr (BN == 64) wgmma_m64n64k16_ss(s, desc128(q_base + qo, 16, 1024), desc128(k_base + ko, 16, 1024), kk > 0);
    else wgmma_m64n128k16_ss(s, desc128(q_base + qo, 16, 1024), desc128(k_base + ko, 16, 1024), kk > 0);
  }
  wgmma_commit();
}
// O += P V: P from registers, V an MN-major SW128 tile [2d/64 slabs][BN keys][64] (LBO = next slab, SBO = 8 keys);
// one commit group.
template <int D, int BN>
__device__ __forceinline__ void issue_pv(float (&acc)[D], const uint32_t (&pa)[BN / 16][4], uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const uint64_t dv = desc128(v_base + uint32_t(kk * 2048), BN * 128, 1024);
    if constexpr (D == 128) wgmma_m64n256k16_rs_tb(acc, pa[kk], dv, 1);
    else wgmma_m64n128k16_rs_tb(acc, pa[kk], dv, 1);
  }
  wgmma_commit();
}

// Fresh S accumulators (the first wgmma of a tile overwrites them; the zeros keep the registers defined), pinned.
template <int NS>
__device__ __forceinline__ void zero_pinned(float (&s)[NS]) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    s[i] = 0.f;
    pin(s[i]);
  }
}
// Causal mask of the diagonal tile: key column > query row gets -inf. col0: the tile's first key; row0: the
// thread's first query row (q0 + warp row + g4).
template <int NS>
__device__ __forceinline__ void mask_diagonal(float (&s)[NS], int col0, int row0, int t4) {
#pragma unroll
  for (int nt = 0; nt < NS / 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + nt * 8 + 2 * t4 + (e & 1);
      const int row = row0 + (e >> 1) * 8;
      if (col > row) s[nt * 4 + e] = -INFINITY;
    }
}

// Online softmax of one tile in place (s becomes exp2(s * sl2 - m)); updates the running max and sum of the
// thread's two rows and returns the O rescale factors. FAST: ex2.approx.ftz, else exp2f (v4).
template <int NS, bool FAST>
__device__ __forceinline__ void online_softmax(float (&s)[NS], float (&m_run)[2], float (&l_run)[2], float sl2,
                                               float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < NS / 4; ++nt) {
    mx[0] = fmaxf(mx[0], fmaxf(s[nt * 4 + 0], s[nt * 4 + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[nt * 4 + 2], s[nt * 4 + 3]));
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r] * sl2);  // finite: the diagonal tile comes first
    alpha[r] = FAST ? ex2_ftz(m_run[r] - m_new) : exp2f(m_run[r] - m_new);
    m_run[r] = m_new;
  }
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    s[i] = FAST ? ex2_ftz(fmaf(s[i], sl2, -m_run[(i >> 1) & 1])) : exp2f(fmaf(s[i], sl2, -m_run[(i >> 1) & 1]));
    rs[(i >> 1) & 1] += s[i];
  }
  l_run[0] = l_run[0] * alpha[0] + rs[0];
  l_run[1] = l_run[1] * alpha[1] + rs[1];
}

// O *= alpha per row; skipped when no row of the warp moved its maximum (late tiles rarely do).
template <int NACC>
__device__ __forceinline__ void rescale_o(float (&acc)[NACC], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] *= alpha[(i >> 1) & 1];
  }
#pragma unroll
  for (int i = 0; i < NACC; ++i) pin(acc[i]);
}

// P (the softmaxed S accumulators) as bf16 A-operand registers of the P V product: the accumulator layout of S and
// the register-A layout of wgmma coincide per warp.
template <int BN>
__device__ __forceinline__ void pack_p(const float (&s)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
#pragma unroll
    for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
  }
}

// Map 1's epilogue: O = O1/l1 - lambda * O2/l2 (O2/l2 from `o2`, this warp's [NACC][32 lanes] block), RMS norm over
// the 2d columns, times (1 - lambda_init), bf16 stores of rows row0 and row0 + 8 (those below n).
template <int NACC>
__device__ __forceinline__ void combine_store(float (&acc)[NACC], const float (&inv_l)[2], const float* o2, int lane,
                                              const AttnParams& p, int b, int j, int row0, int t4) {
  constexpr int VW = 2 * NACC;
  float ss[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < NACC; ++i) {
    const float o = acc[i] * inv_l[(i >> 1) & 1] - p.lambda * o2[i * 32 + lane];
    acc[i] = o;
    ss[(i >> 1) & 1] += o * o;
  }
  float f[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
    f[r] = rsqrtf(ss[r] * (1.f / VW) + p.eps) * p.out_scale;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row < p.n) {
      bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + int64_t(j) * VW + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < VW / 8; ++nt)
        *reinterpret_cast<uint32_t*>(o + nt * 8) = pack_bf16x2(acc[nt * 4 + 2 * r] * f[r], acc[nt * 4 + 2 * r + 1] * f[r]);
    }
  }
}

// Rows row0 and row0 + 8 of a 64-row output tile, O * f per row in bf16, into `dst`: [2d/64 slabs][64 rows][64
// columns] with the SW128 XOR (one 64 x 64 box of a TMA store per slab). Per store instruction the warp's 8 rows
// hit 8 different 16-byte chunks: no bank conflicts.
template <int NACC>
__device__ __forceinline__ void stage_out_tile(const float (&o)[NACC], const float (&f)[2], uint32_t dst, int row0, int t4) {
  constexpr int VW = 2 * NACC;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
#pragma unroll
    for (int nt = 0; nt < VW / 8; ++nt) {
      const uint32_t a = dst + uint32_t((nt >> 3) * 64 * 128 + row * 128 + (((nt & 7) ^ (row & 7)) << 4) + 4 * t4);
      const uint32_t v = pack_bf16x2(o[nt * 4 + 2 * r] * f[r], o[nt * 4 + 2 * r + 1] * f[r]);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
    }
  }
}

// The same epilogue into shared memory for a TMA store: the bf16 output rows `row0` and `row0 + 8` of the CTA's
// tile go to `dst`, [2d/64 slabs][64 rows][64 columns] with the SW128 XOR (a 64 x 64 box of the output map per
// slab). Per store instruction the warp's 8 rows hit 8 different 16-byte chunks: no bank conflicts.
template <int NACC>
__device__ __forceinline__ void combine_to_smem(float (&acc)[NACC], const float (&inv_l)[2], const float* o2, int lane,
                                                const AttnParams& p, uint32_t dst, int row0, int t4) {
  constexpr int VW = 2 * NACC;
  float ss[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < NACC; ++i) {
    const float o = acc[i] * inv_l[(i >> 1) & 1] - p.lambda * o2[i * 32 + lane];
    acc[i] = o;
    ss[(i >> 1) & 1] += o * o;
  }
  float f[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
    f[r] = rsqrtf(ss[r] * (1.f / VW) + p.eps) * p.out_scale;
  }
  stage_out_tile(acc, f, dst, row0, t4);
}
}  // namespace ds::kern::sm90
