// Fused differential attention, forward, causal, for Hopper: the algorithm of diff_attn_fwd.cu (both online
// softmaxes in one pass over the K/V tiles, both accumulations against the shared 2d-wide V tile, epilogue
// (1 - lambda_init) * RMSNorm_2d(O1/l1 - lambda O2/l2)) with the products on wgmma instead of mma.sync.
//
// A CTA owns 64 query rows of one differential head: warpgroup 0 computes map 1, warpgroup 1 map 2.
//   S = Q K^T:  wgmma m64n{BN}k16, A (Q) and B (K) from shared memory, both K-major, 128-byte swizzle
//   O += P V:   wgmma m64n{2d}k16, A (P, bf16) from registers -- the S accumulators converted in place, since
//               the wgmma accumulator and register-A layouts match per warp -- and B (V) from shared memory,
//               MN-major ("transposed"), 128-byte swizzle. O stays in registers: 64 x 2d f32 per warpgroup.
// Why (vs mma.sync): each warpgroup-wide instruction reads its B tile from shared memory once for 64 rows instead
// of once per 16-row warp (a quarter of the shared-memory traffic), runs at Hopper's full tensor rate, and is
// asynchronous, so one warpgroup's softmax overlaps the other's products.
// Pipeline (FlashAttention-3's intra-warpgroup overlap): iteration t issues S(t) and P(t-1) V(t-1) together and
// runs the softmax of tile t while the tensor cores finish P V; K and V have separate double buffers (K of tile
// t+1 and V of tile t are prefetched with cp.async while tile t computes), each thread fencing its writes into
// the async proxy (fence.proxy.async) before the per-tile barrier.
// Shared-memory tiles are [64-column slabs][rows][64 columns] with the 16-byte chunk index XORed with row % 8
// (the canonical SW128 atom: 8 rows x 128 bytes), 1024-byte aligned. Descriptors: K-major tiles advance 32 bytes
// per k16 step inside a slab (SBO 1024 = 8 rows); the MN-major V tile has LBO = BN * 128 (next 64-column slab) and
// SBO 1024 (next 8 keys), advancing 2048 bytes per 16 keys.
// Tiles: 64 query rows x BN keys; BN = 64 for d = 128 (238 registers with the 64 x 256 accumulator), BN = 128 for
// d = 64 by default (8% faster than 64 on the H200, 2026-11-21).
// Correctness notes learnt the hard way: a wgmma issued under a run-time condition inside the loop made ptxas
// reuse the in-flight A-operand (P) registers for temporaries, so the first tile is peeled and the new P is
// packed only after wait_group 0; a conditional wait_group made ptxas serialise every wgmma (warning C7514).
#include "diff_attn_fwd_sm90.h"

#include <cmath>
#include <cstdlib>

#include "mma_sm80.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_SM90A 1
#include "wgmma_sm90.cuh"
#endif

namespace ds::kern {
namespace {

constexpr int BM = 64, THREADS = 256;

// BN keys per K/V tile: 64 for d = 128 (register budget), 64 or 128 for d = 64.
template <int D, int BN>
struct Tile90 {
  static constexpr int VW = 2 * D;
  static constexpr int Q_ELEMS = 2 * BM * D;
  static constexpr int K_ELEMS = BN * D;
  static constexpr int V_ELEMS = BN * VW;
  static constexpr int STAGE_ELEMS = 2 * K_ELEMS + V_ELEMS;
  static constexpr int SMEM_BYTES = (Q_ELEMS + 2 * STAGE_ELEMS) * 2 + 1024;  // + alignment slack
  static_assert(BM * VW * 4 <= 2 * STAGE_ELEMS * 2, "O2 staging must fit in the K/V stages");
  // v8: each warpgroup has its own double buffer of [K_map | V] (V loaded twice per CTA).
  static constexpr int PP_STAGE_ELEMS = K_ELEMS + V_ELEMS;
  static constexpr int PP_SMEM_BYTES = (Q_ELEMS + 4 * PP_STAGE_ELEMS) * 2 + 1024;
  static_assert(PP_SMEM_BYTES <= 227 * 1024, "v8 shared memory");
  static_assert(BM * VW * 4 <= 4 * PP_STAGE_ELEMS * 2, "v8 O2 staging must fit in the K/V stages");
};

#if defined(DS_SM90A)
// Element offset of (row, col) in a [col/64][ROWS][64] tile with the SW128 XOR.
template <int ROWS>
__device__ __forceinline__ int sw128(int row, int col) {
  return (col >> 6) * (ROWS * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

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
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins a register at this point of the program (wgmma reads and writes registers asynchronously: uses must not
// move across the fence/wait instructions).
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void pin(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
// Named barriers (v8): bar.sync waits for `cnt` threads; bar.arrive counts this warp without waiting.
__device__ __forceinline__ void named_sync(int id, int cnt) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(cnt) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int cnt) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(cnt) : "memory"); }
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// v5 tile load: two ROWS x D matrices (rows row0.. of src0 and src1, row stride `rs` elements) into
// [m][D/64 slabs][ROWS][64] SW128 tiles at sdst. Compile-time trip counts: thread tid always copies chunk
// tid % CH of rows tid / CH + i * RP, so the swizzle is per-thread constant and every shared-memory offset is
// an immediate (v4's runtime-bounded loops cost ~36 instructions per 16-byte copy, all before the tile's wgmma).
// M = 1 loads src0 only; NT threads take part (v8: one warpgroup, 128).
template <int ROWS, int D, int M = 2, int NT = THREADS>
__device__ __forceinline__ void load_pair(uint32_t sdst, const bf16* src0, const bf16* src1, int64_t rs, int row0,
                                          int n, int tid) {
  constexpr int CH = D / 8, RP = NT / CH, P = ROWS / RP;
  static_assert(NT % CH == 0 && ROWS % RP == 0 && RP % 8 == 0, "load_pair mapping");
  const int c = tid % CH, r0 = tid / CH;
  const uint32_t sbase = sdst + uint32_t(((c >> 3) * (ROWS * 64) + r0 * 64 + (((c & 7) ^ (r0 & 7)) << 3)) * 2);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const bf16* src = (m ? src1 : src0) + c * 8;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int row = row0 + r0 + i * RP;
      const bool ok = row < n;
      cp_async_16(sbase + uint32_t((m * ROWS * D + i * RP * 64) * 2), src + int64_t(ok ? row : 0) * rs, ok ? 16 : 0);
    }
  }
}
#endif

// V5 (2026-11-21, see bench/cuda_notes.md): unrolled tile loads issued after the tile's wgmmas (they overlap
// S instead of delaying it), the O rescale moved between the S and the P V issue (it overlaps S), ex2.approx.ftz.
// Tried on top of v5 and dropped (bench/cuda_notes.md, v6/v7): CTAs ordered in blocks of 4 query tiles over all
// heads (shorter causal tail, but K/V re-read from DRAM: slower) and K(1), V(0) prefetched in the prologue (no
// measurable change).
// VER = 5 is the default; VER = 4 is the v4 kernel, kept as the fallback (DS_ATTN_SM90_VER=4 or DS_ATTN_SM90_V4=1).
template <int D, int BN, int VER>
__global__ void __launch_bounds__(THREADS, 1) diff_attn_fwd_sm90_kernel(const AttnParams p) {
#if defined(DS_SM90A)
  constexpr bool V5 = VER >= 5;
  constexpr bool PP = VER == 8;  // v8: per-warpgroup loads and barriers, ping-pong of the wgmma issue
  using T = Tile90<D, BN>;
  constexpr int NS = BN / 2;  // S accumulators per thread
  constexpr int VW = T::VW, CH = D / 8, VCH = VW / 8, NACC = VW / 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw + ((1024 - (raw & 1023)) & 1023));
  bf16* sStage = sQ + T::Q_ELEMS;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wtid = tid & 127;
  const int map = warp >> 2, wrow = (warp & 3) * 16;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
  const int j = int(blockIdx.y) % hv, b = int(blockIdx.y) / hv;
  const int g = j / (p.heads / p.kv_heads);
  const bf16* base = p.qkv + int64_t(b) * p.batch_stride;
  unsigned long long t_start = 0;
  if (p.head_ns && tid == 0) t_start = global_timer_ns();

  const int q0 = qt * BM;
  if constexpr (PP) {
    const int qh = map ? j + hv : j;
    load_pair<BM, D, 1, 128>(smem_addr(sQ + map * BM * D), base + p.q_off + int64_t(qh) * D, nullptr, p.row_stride, q0,
                             p.n, wtid);
  } else if constexpr (V5) {
    load_pair<BM, D>(smem_addr(sQ), base + p.q_off + int64_t(j) * D, base + p.q_off + int64_t(j + hv) * D,
                     p.row_stride, q0, p.n, tid);
  } else {
#pragma unroll
  for (int id = tid; id < 2 * BM * CH; id += THREADS) {
    const int m = id / (BM * CH), r = (id / CH) % BM, c = id % CH;
    const int tok = q0 + r;
    const bool ok = tok < p.n;
    const bf16* src = base + int64_t(ok ? tok : 0) * p.row_stride + p.q_off + int64_t(m == 0 ? j : j + hv) * D + c * 8;
    cp_async_16(smem_addr(sQ + m * BM * D + sw128<BM>(r, c * 8)), src, ok ? 16 : 0);
  }
  }
  // K tiles and V tiles have their own double buffers: iteration `it` reads K of tile it (for S) and V of tile
  // it-1 (for the P V product still to be done), and prefetches K of tile it+1 and V of tile it.
  auto load_k = [&](int kt, int stage) {
    bf16* sK = sStage + stage * T::STAGE_ELEMS;
    const int k0 = kt * BN;
    if constexpr (PP) {
      load_pair<BN, D, 1, 128>(smem_addr(sStage + (map * 2 + stage) * T::PP_STAGE_ELEMS),
                               base + p.k_off + int64_t(map ? half_kv + g : g) * D, nullptr, p.row_stride, k0, p.n, wtid);
    } else if constexpr (V5) {
      load_pair<BN, D>(smem_addr(sK), base + p.k_off + int64_t(g) * D, base + p.k_off + int64_t(half_kv + g) * D,
                       p.row_stride, k0, p.n, tid);
    } else {
#pragma unroll
    for (int id = tid; id < 2 * BN * CH; id += THREADS) {
      const int m = id / (BN * CH), r = (id / CH) % BN, c = id % CH;
      const int tok = k0 + r;
      const bool ok = tok < p.n;
      const bf16* src =
          base + int64_t(ok ? tok : 0) * p.row_stride + p.k_off + int64_t(m == 0 ? g : half_kv + g) * D + c * 8;
      cp_async_16(smem_addr(sK + m * T::K_ELEMS + sw128<BN>(r, c * 8)), src, ok ? 16 : 0);
    }
    }
  };
  auto load_v = [&](int kt, int stage) {
    bf16* sV = sStage + stage * T::STAGE_ELEMS + 2 * T::K_ELEMS;
    const int k0 = kt * BN;
    if constexpr (PP) {
      load_pair<BN, D, 2, 128>(smem_addr(sStage + (map * 2 + stage) * T::PP_STAGE_ELEMS + T::K_ELEMS),
                               base + p.v_off + int64_t(g) * D, base + p.v_off + int64_t(half_kv + g) * D, p.row_stride,
                               k0, p.n, wtid);
    } else if constexpr (V5) {  // [V_g | V_{Hkv/2+g}]: the second half's slabs start BN * D elements in, as a K pair's
      load_pair<BN, D>(smem_addr(sV), base + p.v_off + int64_t(g) * D, base + p.v_off + int64_t(half_kv + g) * D,
                       p.row_stride, k0, p.n, tid);
    } else {
#pragma unroll
    for (int id = tid; id < BN * VCH; id += THREADS) {
      const int r = id / VCH, c = id % VCH;
      const int tok = k0 + r;
      const bool ok = tok < p.n;
      const int vh = c < CH ? g : half_kv + g;
      const int cc = c < CH ? c : c - CH;
      const bf16* src = base + int64_t(ok ? tok : 0) * p.row_stride + p.v_off + int64_t(vh) * D + cc * 8;
      cp_async_16(smem_addr(sV + sw128<BN>(r, c * 8)), src, ok ? 16 : 0);
    }
    }
  };
  auto k_addr = [&](int stage) {
    if constexpr (PP) return smem_addr(sStage + (map * 2 + stage) * T::PP_STAGE_ELEMS);
    else return smem_addr(sStage + stage * T::STAGE_ELEMS + map * T::K_ELEMS);
  };
  auto v_addr = [&](int stage) {
    if constexpr (PP) return smem_addr(sStage + (map * 2 + stage) * T::PP_STAGE_ELEMS + T::K_ELEMS);
    else return smem_addr(sStage + stage * T::STAGE_ELEMS + 2 * T::K_ELEMS);
  };
  // v8 ping-pong (FlashAttention-3): warpgroup m issues its wgmmas only after the other one has issued its own for
  // the previous step (named barriers 3 + m, 256 threads: one side waits, the other arrives), so the tensor cores
  // run map 1's products while map 2 does its softmax and vice versa. Warpgroup 1 opens with an arrive for
  // warpgroup 0 and skips the arrive after its last issue, so every barrier's arrivals and waits balance.
  auto pp_enter = [&]() {
    if constexpr (PP) named_sync(3 + map, 256);
  };
  auto pp_leave = [&](bool last) {
    if constexpr (PP) {
      if (!(last && map == 1)) named_arrive(3 + (map ^ 1), 256);
    }
  };
  if constexpr (PP) {
    if (map == 1) named_arrive(3, 256);
  }

  load_k((q0 + BM - 1) / BN, 0);
  cp_async_commit();

  float acc[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_base = smem_addr(sQ + map * BM * D);
  const int n_kt = (q0 + BM - 1) / BN + 1;  // kv tiles up to the one holding the diagonal
  uint32_t pa[BN / 16][4];  // P of the previous tile, bf16: the A operand of the P V product in flight

  // Software pipeline (FlashAttention-3's intra-warpgroup overlap): in iteration it the warpgroup issues
  // S(it) = Q K(it)^T and O += P(it-1) V(it-1) back to back, waits for S only, and runs the softmax of tile it
  // (in place on the S registers) while the tensor cores are still on P V; the rescale of O and the packing of
  // the new P into the A-operand registers wait for that product to finish. The first tile is peeled off so
  // that no wgmma is issued conditionally inside the loop: with a conditional issue ptxas lost track of the
  // in-flight A registers and reused them for temporaries (seen in SASS, wrong results at >= 2 tiles).
  auto tile_top = [&](int it) {  // K(it) and V(it-1) landed; prefetch K(it+1) and V(it)
    const int kt = n_kt - 1 - it, stage = it & 1;
    cp_async_wait<0>();
    fence_proxy_async();  // this thread's cp.async writes -> visible to the tensor cores' (async) proxy
    __syncthreads();
    if (it + 1 < n_kt) load_k(kt - 1, stage ^ 1);
    load_v(kt, stage);
    cp_async_commit();
  };
  auto issue_s = [&](float (&s)[NS], int stage) {
    const uint32_t k_base = k_addr(stage);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t qo = uint32_t((kk >> 2) * BM * 128 + (kk & 3) * 32), ko = uint32_t((kk >> 2) * BN * 128 + (kk & 3) * 32);
      if constexpr (BN == 64) sm90::wgmma_m64n64k16_ss(s, desc128(q_base + qo, 16, 1024), desc128(k_base + ko, 16, 1024), kk > 0);
      else sm90::wgmma_m64n128k16_ss(s, desc128(q_base + qo, 16, 1024), desc128(k_base + ko, 16, 1024), kk > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int stage) {
    const uint32_t v_base = v_addr(stage);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t dv = desc128(v_base + uint32_t(kk * 2048), BN * 128, 1024);
      if constexpr (D == 128) sm90::wgmma_m64n256k16_rs_tb(acc, pa[kk], dv, 1);
      else sm90::wgmma_m64n128k16_rs_tb(acc, pa[kk], dv, 1);
    }
    wgmma_commit();
  };
  // Online softmax of one tile in place (s becomes exp2(s*scale - m)); returns the O rescale factors.
  auto softmax = [&](float (&s)[NS], float (&alpha)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt * 4 + 0], s[nt * 4 + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt * 4 + 2], s[nt * 4 + 3]));
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r] * sl2);  // finite: the diagonal tile comes first
      alpha[r] = V5 ? ex2_ftz(m_run[r] - m_new) : exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
    }
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      s[i] = V5 ? ex2_ftz(fmaf(s[i], sl2, -m_run[(i >> 1) & 1])) : exp2f(fmaf(s[i], sl2, -m_run[(i >> 1) & 1]));
      rs[(i >> 1) & 1] += s[i];
    }
    l_run[0] = l_run[0] * alpha[0] + rs[0];
    l_run[1] = l_run[1] * alpha[1] + rs[1];
  };
  auto rescale_and_pack = [&](float (&s)[NS], const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // late tiles rarely move a row max
#pragma unroll
      for (int i = 0; i < NACC; ++i) acc[i] *= alpha[(i >> 1) & 1];
    }
#pragma unroll
    for (int i = 0; i < NACC; ++i) pin(acc[i]);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
#pragma unroll
      for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
    }
  };

  if constexpr (V5) {
    // Per iteration: barrier (K(it), V(it-1) landed) | issue S(it) | rescale O by alpha(it-1) while S runs |
    // issue P(it-1) V(it-1) | prefetch K(it+1), V(it) (cp.async, overlapping both products) | wait S | softmax(it)
    // while P V runs | wait P V | pack P(it). The rescale writes O only while no product that touches O is in
    // flight; the wgmma.fence before the P V issue orders those writes before the tensor cores read O.
    auto tile_wait = [&]() {
      cp_async_wait<0>();
      fence_proxy_async();
      if constexpr (PP) named_sync(1 + map, 128);  // v8: this warpgroup's own loads only
      else __syncthreads();
    };
    auto prefetch = [&](int it) {
      const int kt = n_kt - 1 - it, stage = it & 1;
      if (it + 1 < n_kt) load_k(kt - 1, stage ^ 1);
      load_v(kt, stage);
      cp_async_commit();
    };
    auto rescale = [&](const float (&alpha)[2]) {
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[i] *= alpha[(i >> 1) & 1];
      }
#pragma unroll
      for (int i = 0; i < NACC; ++i) pin(acc[i]);
    };
    auto pack = [&](float (&s)[NS]) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
#pragma unroll
        for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
      }
    };
    float alpha_prev[2] = {1.f, 1.f};
    {  // tile 0: the diagonal one, masked
      tile_wait();
      float s[NS];
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        s[i] = 0.f;
        pin(s[i]);
      }
      pp_enter();
      wgmma_fence();
      issue_s(s, 0);
      pp_leave(false);
      prefetch(0);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      const int kt = n_kt - 1;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = kt * BN + nt * 8 + 2 * t4 + (e & 1);
          const int row = q0 + wrow + g4 + (e >> 1) * 8;
          if (col > row) s[nt * 4 + e] = -INFINITY;
        }
      float alpha[2];
      softmax(s, alpha);  // O is zero: no rescale
      pack(s);
    }
    for (int it = 1; it < n_kt; ++it) {
      tile_wait();
      if constexpr (PP) rescale(alpha_prev);  // v8: before the turn, so the other warpgroup's turn comes sooner
      float s[NS];
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        s[i] = 0.f;
        pin(s[i]);
      }
      pp_enter();
      wgmma_fence();
      issue_s(s, it & 1);
      if constexpr (!PP) {
        rescale(alpha_prev);
        wgmma_fence();
      }
      issue_pv((it - 1) & 1);
      pp_leave(false);
      prefetch(it);
      wgmma_wait<1>();  // S(it) done; P(it-1) V(it-1) may still run
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      softmax(s, alpha_prev);
      wgmma_wait<0>();  // P(it-1) V(it-1) done: O and the A registers may be written
#pragma unroll
      for (int i = 0; i < NACC; ++i) pin(acc[i]);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
      pack(s);
    }
    tile_wait();
    rescale(alpha_prev);
  } else {
  {  // tile 0: the diagonal one, masked; nothing to overlap with yet
    tile_top(0);
    float s[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      s[i] = 0.f;
      pin(s[i]);
    }
    wgmma_fence();
    issue_s(s, 0);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < NS; ++i) pin(s[i]);
    const int kt = n_kt - 1;  // earlier tiles end at or before q0: only this one needs the mask
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kt * BN + nt * 8 + 2 * t4 + (e & 1);
        const int row = q0 + wrow + g4 + (e >> 1) * 8;
        if (col > row) s[nt * 4 + e] = -INFINITY;
      }
    float alpha[2];
    softmax(s, alpha);
    rescale_and_pack(s, alpha);
  }
  for (int it = 1; it < n_kt; ++it) {
    tile_top(it);
    float s[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      s[i] = 0.f;
      pin(s[i]);
    }
    wgmma_fence();
    issue_s(s, it & 1);
    issue_pv((it - 1) & 1);
    wgmma_wait<1>();  // S(it) done; P(it-1) V(it-1) may still run
#pragma unroll
    for (int i = 0; i < NS; ++i) pin(s[i]);
    float alpha[2];
    softmax(s, alpha);
    wgmma_wait<0>();  // P(it-1) V(it-1) done: O and the A registers may be written
#pragma unroll
    for (int i = 0; i < NACC; ++i) pin(acc[i]);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
    rescale_and_pack(s, alpha);
  }
  // the last tile's P V
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  }
  pp_enter();
  wgmma_fence();
  issue_pv((n_kt - 1) & 1);
  pp_leave(true);
  wgmma_wait<0>();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
#pragma unroll
  for (int i = 0; i < NACC; ++i) pin(acc[i]);

  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
  float* sO2 = reinterpret_cast<float*>(sStage);  // [4 warps][NACC][32 lanes]
  if (map == 1) {
    float* dst = sO2 + (warp - 4) * NACC * 32;
#pragma unroll
    for (int i = 0; i < NACC; ++i) dst[i * 32 + lane] = acc[i] * inv_l[(i >> 1) & 1];
  }
  __syncthreads();
  if (map == 0) {
    const float* src = sO2 + warp * NACC * 32;
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NACC; ++i) {
      const float o = acc[i] * inv_l[(i >> 1) & 1] - p.lambda * src[i * 32 + lane];
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
      const int row = q0 + wrow + g4 + 8 * r;
      if (row < p.n) {
        bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + int64_t(j) * VW + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < VW / 8; ++nt)
          *reinterpret_cast<uint32_t*>(o + nt * 8) =
              pack_bf16x2(acc[nt * 4 + 2 * r] * f[r], acc[nt * 4 + 2 * r + 1] * f[r]);
      }
    }
  }
  if (p.head_ns && tid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
#else
  __trap();  // built without sm_90a: diff_attn_fwd_sm90_available() is false, so this is never launched
#endif
}

__global__ void sm90a_probe_kernel(int* out) {
#if defined(DS_SM90A)
  *out = 1;
#else
  *out = 0;
#endif
}

template <int D, int BN, int VER>
cudaError_t launch_t(const AttnParams& p, cudaStream_t stream) {
  constexpr int smem = VER == 8 ? Tile90<D, BN>::PP_SMEM_BYTES : Tile90<D, BN>::SMEM_BYTES;
  cudaError_t e =
      cudaFuncSetAttribute(diff_attn_fwd_sm90_kernel<D, BN, VER>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned((p.n + BM - 1) / BM), unsigned((p.heads / 2) * p.batch));
  diff_attn_fwd_sm90_kernel<D, BN, VER><<<grid, THREADS, smem, stream>>>(p);
  return cudaGetLastError();
}
// Kernel version: DS_ATTN_SM90_VER=4 or DS_ATTN_SM90_V4=1 selects v4 (the fallback); default v5. Read at every
// launch (the tests switch it). v5 was measured faster than v4 at every shape (bench/cuda_notes.md).
int sm90_version() {
  const char* v4 = std::getenv("DS_ATTN_SM90_V4");
  if (v4 && *v4 && *v4 != '0') return 4;
  const char* e = std::getenv("DS_ATTN_SM90_VER");
  if (e && std::atoi(e) == 4) return 4;
  if (e && std::atoi(e) == 8) return 8;
  return 5;
}
template <int D, int BN>
cudaError_t launch(const AttnParams& p, cudaStream_t stream) {
  const int v = sm90_version();
  return v == 4 ? launch_t<D, BN, 4>(p, stream) : v == 8 ? launch_t<D, BN, 8>(p, stream) : launch_t<D, BN, 5>(p, stream);
}

}  // namespace

bool diff_attn_fwd_sm90_available() {
  static int cached = -1;
  if (cached >= 0) return cached == 1;
  cached = 0;
  const char* force = std::getenv("DS_ATTN_MMA");
  if (force && *force && *force != '0') return false;
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (prop.major != 9 || prop.minor != 0) return false;
  int* d = nullptr;
  int h = 0;
  if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
    sm90a_probe_kernel<<<1, 1>>>(d);
    if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) h = 0;
    cudaFree(d);
  }
  cudaGetLastError();
  cached = h == 1 ? 1 : 0;
  return cached == 1;
}

cudaError_t launch_diff_attn_fwd_sm90(const AttnParams& p, cudaStream_t stream, int block_n) {
  if (!p.diff || p.n <= 0 || p.heads % 2 || p.kv_heads % 2 || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  if (p.d == 64) return block_n == 128 ? launch<64, 128>(p, stream) : launch<64, 64>(p, stream);
  if (p.d == 128) return launch<128, 64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
