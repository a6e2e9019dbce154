// Device pieces of the Hopper attention kernel (attn_fwd_sm90.cu): wgmma descriptors and ordering, the Q K^T and
// P V products, the causal and sliding-window masks and the O rescale on the wgmma accumulator layout, packing P into
// the register A operand, and staging the output tile for the TMA store.
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
// O += P V: P from registers, V an MN-major SW128 tile [NACC/32 slabs][BN keys][64] at v_base (LBO = next slab,
// SBO = 8 keys), NACC accumulators per thread (64 x 2 NACC outputs per warpgroup); one commit group.
template <int NACC, int BN>
__device__ __forceinline__ void issue_pv(float (&acc)[NACC], const uint32_t (&pa)[BN / 16][4], uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const uint64_t dv = desc128(v_base + uint32_t(kk * 2048), BN * 128, 1024);
    if constexpr (NACC == 128) wgmma_m64n256k16_rs_tb(acc, pa[kk], dv, 1);
    else if constexpr (NACC == 64) wgmma_m64n128k16_rs_tb(acc, pa[kk], dv, 1);
    else wgmma_m64n64k16_rs_tb(acc, pa[kk], dv, 1);
  }
  wgmma_commit();
}

// Pins O and the P registers of the P V product once it is complete (wait_group), before they are written again.
template <int NACC, int KK>
__device__ __forceinline__ void pin_pv_operands(float (&acc)[NACC], uint32_t (&pa)[KK][4]) {
#pragma unroll
  for (int i = 0; i < NACC; ++i) pin(acc[i]);
#pragma unroll
  for (int kk = 0; kk < KK; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
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
// The row's keys as offsets from it: a query row sees keys row - wlo .. row, wlo = window - 1 under a sliding window
// (AttnParams::window), else far more than any row.
__host__ __device__ __forceinline__ int window_lo_offset(int window) { return window > 0 ? window - 1 : 1 << 30; }

// Mask of the diagonal tile: key column > query row gets -inf (causal), and with WINDOW so does key column < query
// row - wlo (left of the sliding window; wlo from window_lo_offset). col0: the tile's first key; row0: the thread's
// first query row (q0 + warp row + g4).
template <bool WINDOW, int NS>
__device__ __forceinline__ void mask_diagonal(float (&s)[NS], int col0, int row0, int t4, int wlo) {
#pragma unroll
  for (int nt = 0; nt < NS / 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + nt * 8 + 2 * t4 + (e & 1);
      const int row = row0 + (e >> 1) * 8;
      if (col > row || (WINDOW && col < row - wlo)) s[nt * 4 + e] = -INFINITY;
    }
}
// The sliding window's lower edge alone, on the tiles below the diagonal that cross it: key column < query row - wlo
// gets -inf.
template <int NS>
__device__ __forceinline__ void mask_window(float (&s)[NS], int col0, int row0, int t4, int wlo) {
#pragma unroll
  for (int nt = 0; nt < NS / 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + nt * 8 + 2 * t4 + (e & 1);
      const int row = row0 + (e >> 1) * 8;
      if (col < row - wlo) s[nt * 4 + e] = -INFINITY;
    }
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

}  // namespace ds::kern::sm90
