// Experiment (tag exp/gemm-swiglu-handoff): the fused SwiGLU GEMM's hand-off between the consumer warpgroups and
// the epilogue warps, chosen by macros (GS_FULL_NAMED, GS_EMPTY_NAMED: bar.arrive/bar.sync instead of mbarriers;
// GS_SLEEP: the epilogue's wait sleeps between tests; GS_REG_PROD / GS_REG_CONS: setmaxnreg), each variant
// compiled on its own with -DGS_CFG_NAME=launch_gs_vN and timed by bench/gemm_swiglu_probe.cu against cuBLASLt.
// Not built by CMake. Measured in bench/results/latest/s26_gemm_swiglu_probe_h100_2026-11-24.md.
// Gate/up GEMM with SwiGLU in the epilogue (gemm_swiglu_sm90.h), warp-specialised and persistent:
//   - one CTA per SM walks the output tiles (BM = 128 rows x BN = 128 of the I outputs) in groups of GROUP_M row
//     tiles, so that the tiles running at once share their x rows and weight rows in L2;
//   - a producer warpgroup: one thread issues the TMA loads of each K step (x: 128 x 64; w: the 128 gate rows and
//     the 128 up rows of the tile's outputs, stacked as one 256-row operand) into STAGES mbarrier-guarded stages,
//     running ahead into the next tile while the consumers finish the last one;
//   - two consumer warpgroups, 64 rows each: wgmma m64n256k16 from shared memory (both operands K-major, 128-byte
//     swizzle), so a thread holds the gate and the up accumulator of the same outputs (columns c and 128 + c);
//   - epilogue in registers: g and u rounded to bf16, silu(g) * u as kernels/swiglu.cu forms it, bf16 stores.
#include "gemm_swiglu_sm90.h"

#include <cuda.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "align.h"
#include "attn_fwd_sm90.h"
#include "mma_sm80.cuh"
#include "tma_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_SM90A_GEMM 1
#include "attn_sm90_common.cuh"
#endif

namespace ds::kern {
namespace {

constexpr int BM = 128, BN = 128, BK = 64, THREADS = 384;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = 2 * BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;

#if defined(DS_SM90A_GEMM)
constexpr int GROUP_M = 16;  // row tiles per group of the tile order

// Work items: CLUSTER consecutive row tiles x one column tile (the CTAs of a cluster take one row tile each and share
// the weight rows), in groups of GROUP_M row tiles, the rows of a group fastest: the items running at once share
// their x rows and weight rows in L2.
template <int CLUSTER>
struct TileGrid {
  int items_m, tiles_n;
  static constexpr int kGroup = GROUP_M / CLUSTER;
  __device__ void at(int t, int& m_item, int& n_tile) const {
    const int per_group = kGroup * tiles_n, g = t / per_group, first = g * kGroup;
    const int gm = items_m - first < kGroup ? items_m - first : kGroup, r = t - g * per_group;
    m_item = first + r % gm;
    n_tile = r / gm;
  }
};

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + expf(-g)) * u; }
// The same on the SFU's approximations (ex2.approx.ftz, rcp.approx.ftz).
__device__ __forceinline__ float silu_mul_fast(float g, float u) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(-g * 1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return g * r * u;
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Arrive on the mbarrier at the same shared-memory offset in cluster CTA `rank`.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// A 2-D box into the same offset of every CTA in `mask`, each CTA's barrier at `bar` completing its bytes.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
constexpr int kEpiThreads = 96;  // warps 1-3 of the producer warpgroup
constexpr int kBarEpi = 3;       // named barrier of the epilogue warps; 1-2: the consumers' own (non-OV) epilogue
#ifndef GS_FULL_NAMED
#define GS_FULL_NAMED 0
#define GS_EMPTY_NAMED 0
#define GS_SLEEP 1
#define GS_REG_PROD 56
#define GS_REG_CONS 224
#endif
constexpr int kBarFull = 4, kBarEmpty = 6, kHandoff = 128 + kEpiThreads;
#define GS_STR2(x) #x
#define GS_STR(x) GS_STR2(x)
// Waits for a phase of a hand-off barrier that is usually far off (a tile's products): test, then sleep between
// tests, so that the waiting warps take no issue slots from the consumers.
__device__ __forceinline__ void mbar_wait_idle(uint32_t bar, uint32_t parity) {
  for (;;) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    if (done) return;
    __nanosleep(500);
  }
}
// silu(g) * u of two bf16 pairs (low halves, high halves), as kernels/swiglu.cu forms it.
__device__ __forceinline__ uint32_t swiglu_bf16x2(uint32_t g2, uint32_t u2) {
  const float glo = __uint_as_float(g2 << 16), ghi = __uint_as_float(g2 & 0xffff0000u);
  const float ulo = __uint_as_float(u2 << 16), uhi = __uint_as_float(u2 & 0xffff0000u);
  return pack_bf16x2(silu_mul(glo, ulo), silu_mul(ghi, uhi));
}
#endif

// CLUSTER = 2: the two CTAs of a cluster take adjacent row tiles of the same columns; each loads its own x rows and
// one half of the weight rows (rank 0 the gate rows, rank 1 the up rows) into both CTAs' stages (TMA multicast), so
// the weight rows cross L2 once per pair. A stage is free when both CTAs' consumers are done with it.
// OV (overlapped epilogue): the consumers only hand each tile's g and u, rounded to bf16, to a staging area and go
// on with the next tile; warps 1-3 of the producer warpgroup form SwiGLU there and store the outputs by TMA, so the
// tensor cores do not wait on the epilogue. Without OV the consumers form SwiGLU and store themselves.
template <bool OV>
struct Layout {
  static constexpr int STAGES = OV ? 3 : 4;
  static constexpr int EPI_OFF = STAGES * STAGE_BYTES;
  // OV: per consumer half, a g area and a u area of 64 x 128 bf16 (two 64-column slabs each, the 128-byte swizzled
  // layout of a TMA box); otherwise per half one output area of the same shape.
  static constexpr int HALF_BYTES = (OV ? 2 : 1) * 64 * BN * 2;
  static constexpr int BAR_OFF = EPI_OFF + 2 * HALF_BYTES;
  // mbarriers: STAGES full, STAGES empty, then (OV) per half the hand-off's full and empty
  static constexpr int SMEM = BAR_OFF + (2 * STAGES + 4) * 8 + 1024;
  static_assert(SMEM <= 227 * 1024, "shared memory");
};


template <int CLUSTER, bool OV>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_swiglu_sm90_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                            const __grid_constant__ CUtensorMap tm_out, int64_t M, int K, int I) {
#if defined(DS_SM90A_GEMM)
  using namespace sm90;
  using L = Layout<OV>;
  constexpr int ST = L::STAGES;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t bars = base + L::BAR_OFF;
  auto bar_full = [&](int s) { return bars + 8u * uint32_t(s); };
  auto bar_empty = [&](int s) { return bars + 8u * uint32_t(ST + s); };
  // OV hand-off of half h: full when its 128 consumer threads have staged g and u, empty when the 96 epilogue
  // threads are done with the area (and its TMA store has read it).
  auto bar_hfull = [&](int h) { return bars + 8u * uint32_t(2 * ST + h); };
  auto bar_hempty = [&](int h) { return bars + 8u * uint32_t(2 * ST + 2 + h); };
  const int tiles_m = int((M + BM - 1) / BM);
  const TileGrid<CLUSTER> grid{(tiles_m + CLUSTER - 1) / CLUSTER, I / BN};
  const int items = grid.items_m * grid.tiles_n, ksteps = (K + BK - 1) / BK;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int rank = CLUSTER > 1 ? int(cluster_rank()) : 0;
  const int item0 = int(blockIdx.x) / CLUSTER, item_step = int(gridDim.x) / CLUSTER;
  // The TMA store of one half's 64 x 128 outputs from its staging area (two 64-column slabs).
  const auto store_half = [&](uint32_t area, int mt, int nt, int half) {
#pragma unroll
    for (int sl = 0; sl < 2; ++sl)
      asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                       reinterpret_cast<uint64_t>(&tm_out)),
                   "r"(nt * BN + sl * 64), "r"(mt * BM + half * 64), "r"(area + uint32_t(sl * 64 * 128))
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  };

  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 8 * CLUSTER);  // one arrival per consumer warp of every CTA in the cluster
    }
    if constexpr (OV) {
      for (int h = 0; h < 2; ++h) {
        mbar_init(bar_hfull(h), 128);
        mbar_init(bar_hempty(h), kEpiThreads);
      }
    }
    fence_mbarrier_init();
  }
  if constexpr (CLUSTER > 1) cluster_sync();
  else __syncthreads();

  if (wg == 0) {  // producer (thread 0) and, with OV, the epilogue warps 1-3
    if constexpr (OV) asm volatile("setmaxnreg.dec.sync.aligned.u32 " GS_STR(GS_REG_PROD) ";\n");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid == 0) {
      prefetch_tensormap(&tm_x);
      prefetch_tensormap(&tm_w);
      int it = 0;
      for (int t = item0; t < items; t += item_step) {
        int mi, nt;
        grid.at(t, mi, nt);
        const int mt = mi * CLUSTER + rank;
        for (int kb = 0; kb < ksteps; ++kb, ++it) {
          const int s = it % ST;
          mbar_wait(bar_empty(s), uint32_t(((it / ST) & 1) ^ 1));
          mbar_expect_tx(bar_full(s), STAGE_BYTES);
          const uint32_t dst = base + uint32_t(s * STAGE_BYTES);
          tma_load_2d(dst, &tm_x, kb * BK, mt * BM, bar_full(s));
          if constexpr (CLUSTER > 1) {
            tma_load_2d_multicast(dst + A_BYTES + uint32_t(rank * BN * BK * 2), &tm_w, kb * BK, rank * I + nt * BN,
                                  bar_full(s), uint16_t((1u << CLUSTER) - 1));
          } else {
            tma_load_2d(dst + A_BYTES, &tm_w, kb * BK, nt * BN, bar_full(s));
            tma_load_2d(dst + A_BYTES + BN * BK * 2, &tm_w, kb * BK, I + nt * BN, bar_full(s));
          }
        }
      }
    } else if (OV && tid >= 32) {
      // Epilogue: per tile and half, wait for the consumers' g and u, write silu(g) * u over g in place, store it
      // by TMA, and once the store has read the area give it back.
      const int etid = tid - 32;
#if GS_EMPTY_NAMED
      named_arrive(kBarEmpty + 0, kHandoff);
      named_arrive(kBarEmpty + 1, kHandoff);
#endif
      int k = 0;  // this CTA's tiles so far
      for (int t = item0; t < items; t += item_step, ++k) {
        int mi, nt;
        grid.at(t, mi, nt);
        const int mt = mi * CLUSTER + rank;
#pragma unroll 1
        for (int half = 0; half < 2; ++half) {
          const uint32_t ga = base + uint32_t(L::EPI_OFF + half * L::HALF_BYTES), ua = ga + 64 * BN * 2;
#if GS_FULL_NAMED
          named_sync(kBarFull + half, kHandoff);
#elif GS_SLEEP
          mbar_wait_idle(bar_hfull(half), uint32_t(k & 1));
#else
          mbar_wait(bar_hfull(half), uint32_t(k & 1));
#endif
#pragma unroll 2
          for (int c = etid; c < 64 * BN * 2 / 16; c += kEpiThreads) {
            uint32_t g0, g1, g2, g3, u0, u1, u2, u3;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(g0), "=r"(g1), "=r"(g2), "=r"(g3)
                         : "r"(ga + uint32_t(16 * c)));
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(u0), "=r"(u1), "=r"(u2), "=r"(u3)
                         : "r"(ua + uint32_t(16 * c)));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(ga + uint32_t(16 * c)),
                         "r"(swiglu_bf16x2(g0, u0)), "r"(swiglu_bf16x2(g1, u1)), "r"(swiglu_bf16x2(g2, u2)),
                         "r"(swiglu_bf16x2(g3, u3))
                         : "memory");
          }
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          named_sync(kBarEpi, kEpiThreads);
          if (etid == 0) {
            store_half(ga, mt, nt, half);
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
          }
          named_sync(kBarEpi, kEpiThreads);
#if GS_EMPTY_NAMED
          if (t + item_step < items) named_arrive(kBarEmpty + half, kHandoff);
#else
          mbar_arrive(bar_hempty(half));
#endif
        }
      }
      if (etid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
  } else {
    if constexpr (OV) asm volatile("setmaxnreg.inc.sync.aligned.u32 " GS_STR(GS_REG_CONS) ";\n");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    const int half = wg - 1, ctid = tid - 128 * wg, warp = ctid >> 5, lane = tid & 31;
    const int g4 = lane >> 2, t4 = lane & 3;
    // A stage goes back once this warp's products from it are done: one arrival per warp on every cluster CTA.
    const auto release = [&](int s) {
      if (lane == 0) {
        if constexpr (CLUSTER > 1) {
#pragma unroll
          for (int c = 0; c < CLUSTER; ++c) mbar_arrive_cluster(bar_empty(s), uint32_t(c));
        } else {
          mbar_arrive(bar_empty(s));
        }
      }
    };
    const uint32_t area = base + uint32_t(L::EPI_OFF + half * L::HALF_BYTES);
    const float one[2] = {1.f, 1.f};
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    int it = 0, k = 0;
    for (int t = item0; t < items; t += item_step, ++k) {
      int mi, nt;
      grid.at(t, mi, nt);
      const int mt = mi * CLUSTER + rank;
      for (int kb = 0; kb < ksteps; ++kb, ++it) {
        const int s = it % ST;
        mbar_wait(bar_full(s), uint32_t((it / ST) & 1));
        const uint32_t a = base + uint32_t(s * STAGE_BYTES + half * 64 * 128);
        const uint32_t b = base + uint32_t(s * STAGE_BYTES + A_BYTES);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
          wgmma_m64n256k16_ss(acc, desc128(a + uint32_t(kk * 32), 16, 1024), desc128(b + uint32_t(kk * 32), 16, 1024),
                              kb > 0 || kk > 0);
        wgmma_commit();
        if (kb > 0) {  // the previous step's products are done: its stage goes back to the producer(s)
          wgmma_wait<1>();
          release((it - 1) % ST);
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) pin(acc[i]);
      release((it - 1) % ST);
      // acc[i], i < 64: gate column 8 (i >> 2) + 2 t4 + (i & 1) of row g4 + 8 ((i >> 1) & 1); acc[64 + i]: its up.
      float g[64], u[64];
#pragma unroll
      for (int j = 0; j < 64; ++j) g[j] = acc[j], u[j] = acc[64 + j];
      if constexpr (OV) {
        // The epilogue warps are done with this half's previous tile (a fresh barrier's phase "-1" counts as done).
#if GS_EMPTY_NAMED
        named_sync(kBarEmpty + half, kHandoff);
#else
        mbar_wait(bar_hempty(half), uint32_t((k & 1) ^ 1));
#endif
        stage_out_tile<64>(g, one, area, warp * 16 + g4, t4);
        stage_out_tile<64>(u, one, area + 64 * BN * 2, warp * 16 + g4, t4);
#if GS_FULL_NAMED
        named_arrive(kBarFull + half, kHandoff);
#else
        mbar_arrive(bar_hfull(half));
#endif
      } else {
        // SwiGLU on the SFU, staged in the 128-byte swizzled layout of a TMA box and stored by one thread; the
        // previous tile's store must have read the staging area first.
        if (ctid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        named_sync(1 + half, 128);
        float h[64];
#pragma unroll
        for (int j = 0; j < 64; ++j) h[j] = silu_mul_fast(round_bf16(g[j]), round_bf16(u[j]));
        stage_out_tile<64>(h, one, area, warp * 16 + g4, t4);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_sync(1 + half, 128);
        if (ctid == 0) store_half(area, mt, nt, half);
      }
    }
    if (!OV && ctid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
  // No CTA of a cluster leaves while the other may still multicast into its stages or arrive on its barriers.
  if constexpr (CLUSTER > 1) cluster_sync();
#else
  __trap();  // built without sm_90a: never launched (gemm_swiglu_sm90_supported checks)
#endif
}

}  // namespace

#ifndef GS_CFG_NAME
bool gemm_swiglu_sm90_supported(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t M, int K,
                                int I) {
  static const bool runs = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) {
      cudaGetLastError();
      return false;
    }
    return major == 9 && minor == 0 && attn_fwd_sm90_code_runs() && attn_tma_encoder_available();
  }();
  return runs && M > 0 && K > 0 && I > 0 && I % BN == 0 && K % 8 == 0 && ldx % 8 == 0 && ldx >= K && aligned16(x) &&
         aligned16(w);
}

#define GS_CFG_NAME launch_gemm_swiglu_sm90_cfg
#define GS_CFG_MAIN 1
#endif
cudaError_t GS_CFG_NAME(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                        __nv_bfloat16* out, int64_t M, int K, int I, int cluster, bool overlap,
                                        cudaStream_t stream) {
  if (!gemm_swiglu_sm90_supported(x, ldx, w, M, K, I) || !out || (cluster != 1 && cluster != 2))
    return cudaErrorInvalidValue;
  CUtensorMap tx, tw, tout;
  if (!make_tma_map_2d(tx, x, K, M, ldx, BM) || !make_tma_map_2d(tw, w, K, 2 * int64_t(I), K, BN) ||
      !make_tma_map_2d(tout, out, I, M, I, 64))
    return cudaErrorNotSupported;
  const auto kernel = cluster == 2 ? (overlap ? gemm_swiglu_sm90_kernel<2, true> : gemm_swiglu_sm90_kernel<2, false>)
                                   : (overlap ? gemm_swiglu_sm90_kernel<1, true> : gemm_swiglu_sm90_kernel<1, false>);
  const int smem = overlap ? Layout<true>::SMEM : Layout<false>::SMEM;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  static int ctas_max[2][2] = {};  // CTAs that run at once (the persistent grid), per cluster size and mode
  int& cmax = ctas_max[cluster - 1][overlap ? 1 : 0];
  if (cmax == 0) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int dev = 0, sms = 0, clusters = 0;
    if (e == cudaSuccess) e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cfg.gridDim = dim3(unsigned(sms));
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e != cudaSuccess) return e;
    if (clusters <= 0) return cudaErrorNotSupported;
    cmax = clusters * cluster;
  }
  const int64_t items = ((M + BM - 1) / BM + cluster - 1) / cluster * (I / BN) * cluster;
  cfg.gridDim = dim3(unsigned(items < cmax ? items : cmax));
  return cudaLaunchKernelEx(&cfg, kernel, tx, tw, tout, M, K, I);
}

#if GS_CFG_MAIN
cudaError_t launch_gemm_swiglu_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                    __nv_bfloat16* out, int64_t M, int K, int I, cudaStream_t stream) {
  static const bool ov = !(std::getenv("DS_GEMM_OVERLAP") && std::getenv("DS_GEMM_OVERLAP")[0] == '0');
  static const int cl = std::getenv("DS_GEMM_CLUSTER") ? std::atoi(std::getenv("DS_GEMM_CLUSTER")) : 2;
  return launch_gemm_swiglu_sm90_cfg(x, ldx, w, out, M, K, I, cl, ov, stream);
}
#endif

}  // namespace ds::kern
