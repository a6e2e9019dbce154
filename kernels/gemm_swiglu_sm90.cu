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

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 4, THREADS = 384;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = 2 * BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
// EPI 1: each consumer warpgroup stages its 64 x 128 bf16 outputs here and one thread stores them with TMA.
constexpr int EPI_OFF = STAGES * STAGE_BYTES, EPI_BYTES = 2 * 64 * BN * 2;
constexpr int BAR_OFF = EPI_OFF + EPI_BYTES, SMEM_BYTES = BAR_OFF + 2 * STAGES * 8 + 1024;
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");

constexpr int GROUP_M = 16;  // row tiles per group of the tile order (default)
#if defined(DS_SM90A_GEMM)

// Work items: CLUSTER consecutive row tiles x one column tile (the CTAs of a cluster take one row tile each and share
// the weight rows), ordered in groups of GROUP_M row tiles.
template <int CLUSTER>
struct TileGrid {
  int items_m, tiles_n;
  int group = GROUP_M / CLUSTER;  // rows (n_major false) or columns (true) of tiles per group
  bool n_major = false;           // groups of column tiles, the row tiles of a group's column fastest
  __device__ void at(int t, int& m_item, int& n_tile) const {
    if (n_major) {
      const int per_group = group * items_m, g = t / per_group, first = g * group;
      const int gn = tiles_n - first < group ? tiles_n - first : group, r = t - g * per_group;
      n_tile = first + r % gn;
      m_item = r / gn;
      return;
    }
    const int GM = group;
    const int per_group = GM * tiles_n, g = t / per_group, first = g * GM;
    const int gm = items_m - first < GM ? items_m - first : GM, r = t - g * per_group;
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
#endif

// CLUSTER = 2: the two CTAs of a cluster take adjacent row tiles of the same columns; each loads its own x rows and
// one half of the weight rows (rank 0 the gate rows, rank 1 the up rows) into both CTAs' stages (TMA multicast), so
// the weight rows cross L2 once per pair. A stage is free when both CTAs' consumers are done with it.
template <int CLUSTER, int EPI>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_swiglu_sm90_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                            const __grid_constant__ CUtensorMap tm_out, __nv_bfloat16* __restrict__ out, int64_t M,
                            int K, int I, int group, int n_major) {
#if defined(DS_SM90A_GEMM)
  using namespace sm90;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t bars = base + BAR_OFF;
  auto bar_full = [&](int s) { return bars + 8u * uint32_t(s); };
  auto bar_empty = [&](int s) { return bars + 8u * uint32_t(STAGES + s); };
  const int tiles_m = int((M + BM - 1) / BM);
  const TileGrid<CLUSTER> grid{(tiles_m + CLUSTER - 1) / CLUSTER, I / BN, group, n_major != 0};
  const int items = grid.items_m * grid.tiles_n, ksteps = (K + BK - 1) / BK;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int rank = CLUSTER > 1 ? int(cluster_rank()) : 0;
  const int item0 = int(blockIdx.x) / CLUSTER, item_step = int(gridDim.x) / CLUSTER;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 8 * CLUSTER);  // one arrival per consumer warp of every CTA in the cluster
    }
    fence_mbarrier_init();
  }
  if constexpr (CLUSTER > 1) cluster_sync();
  else __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid == 0) {
      prefetch_tensormap(&tm_x);
      prefetch_tensormap(&tm_w);
      int it = 0;
      for (int t = item0; t < items; t += item_step) {
        int mi, nt;
        grid.at(t, mi, nt);
        const int mt = mi * CLUSTER + rank;
        for (int kb = 0; kb < ksteps; ++kb, ++it) {
          const int s = it % STAGES;
          mbar_wait(bar_empty(s), uint32_t(((it / STAGES) & 1) ^ 1));
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
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
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
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    int it = 0;
    for (int t = item0; t < items; t += item_step) {
      int mi, nt;
      grid.at(t, mi, nt);
      const int mt = mi * CLUSTER + rank;
      for (int kb = 0; kb < ksteps; ++kb, ++it) {
        const int s = it % STAGES;
        mbar_wait(bar_full(s), uint32_t((it / STAGES) & 1));
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
          release((it - 1) % STAGES);
        }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) pin(acc[i]);
      release((it - 1) % STAGES);
      if constexpr (EPI == 2) continue;  // (measurement only: no epilogue at all)
      if constexpr (EPI == 1) {
        // SwiGLU on the SFU, the warpgroup's 64 x 128 bf16 outputs staged in the 128-byte swizzled layout of a TMA
        // box (two slabs of 64 columns) and stored by one thread; the previous tile's store must have read the
        // staging area first.
        const uint32_t stage = base + uint32_t(EPI_OFF + half * 64 * BN * 2);
        if (ctid == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        named_sync(1 + half, 128);
        float h[64];
#pragma unroll
        for (int j = 0; j < 64; ++j) h[j] = silu_mul_fast(round_bf16(acc[j]), round_bf16(acc[64 + j]));
        const float one[2] = {1.f, 1.f};
        stage_out_tile<64>(h, one, stage, warp * 16 + g4, t4);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_sync(1 + half, 128);
        if (ctid == 0) {
#pragma unroll
          for (int sl = 0; sl < 2; ++sl)
            asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                             reinterpret_cast<uint64_t>(&tm_out)),
                         "r"(nt * BN + sl * 64), "r"(mt * BM + half * 64), "r"(stage + uint32_t(sl * 64 * 128))
                         : "memory");
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
        continue;
      }
      // acc[i], i < 64: gate column 8 (i >> 2) + 2 t4 + (i & 1) of row g4 + 8 ((i >> 1) & 1); acc[64 + i]: its up.
      const int64_t row0 = int64_t(mt) * BM + half * 64 + warp * 16 + g4;
      __nv_bfloat16* o = out + int64_t(nt) * BN + 2 * t4;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t row = row0 + 8 * r;
        if (row >= M) continue;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
          const int i = c * 4 + 2 * r;
          const uint32_t v = pack_bf16x2(silu_mul(round_bf16(acc[i]), round_bf16(acc[64 + i])),
                                         silu_mul(round_bf16(acc[i + 1]), round_bf16(acc[64 + i + 1])));
          *reinterpret_cast<uint32_t*>(o + row * I + c * 8) = v;
        }
      }
    }
  }
  if (EPI == 1 && wg > 0 && (tid & 127) == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  // No CTA of a cluster leaves while the other may still multicast into its stages or arrive on its barriers.
  if constexpr (CLUSTER > 1) cluster_sync();
#else
  __trap();  // built without sm_90a: never launched (gemm_swiglu_sm90_supported checks)
#endif
}

// Ping-pong: each consumer warpgroup owns whole tiles of PM = 64 rows x BN outputs, the CTA's tiles taken in turn
// (warpgroup w the CTA's tiles i with i % 2 == w). The producer loads the tiles' K steps in that order, so one
// warpgroup's products run while the other forms and stores its outputs.
constexpr int PM = 64, PSTAGES = 5;
constexpr int PA_BYTES = PM * BK * 2, PSTAGE_BYTES = PA_BYTES + B_BYTES;
constexpr int PBAR_OFF = PSTAGES * PSTAGE_BYTES, PSMEM_BYTES = PBAR_OFF + 2 * PSTAGES * 8 + 1024;
static_assert(PSMEM_BYTES <= 227 * 1024, "shared memory");

__global__ void __launch_bounds__(THREADS, 1)
    gemm_swiglu_pp_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                          __nv_bfloat16* __restrict__ out, int64_t M, int K, int I) {
#if defined(DS_SM90A_GEMM)
  using namespace sm90;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t bars = base + PBAR_OFF;
  auto bar_full = [&](int s) { return bars + 8u * uint32_t(s); };
  auto bar_empty = [&](int s) { return bars + 8u * uint32_t(PSTAGES + s); };
  const TileGrid<1> grid{int((M + PM - 1) / PM), I / BN};
  const int tiles = grid.items_m * grid.tiles_n, ksteps = (K + BK - 1) / BK;
  const int tid = threadIdx.x, wg = tid >> 7;

  if (tid == 0) {
    for (int s = 0; s < PSTAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4);  // one arrival per warp of the consuming warpgroup
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid == 0) {
      prefetch_tensormap(&tm_x);
      prefetch_tensormap(&tm_w);
      int it = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int mt, nt;
        grid.at(t, mt, nt);
        for (int kb = 0; kb < ksteps; ++kb, ++it) {
          const int s = it % PSTAGES;
          mbar_wait(bar_empty(s), uint32_t(((it / PSTAGES) & 1) ^ 1));
          mbar_expect_tx(bar_full(s), PSTAGE_BYTES);
          const uint32_t dst = base + uint32_t(s * PSTAGE_BYTES);
          tma_load_2d(dst, &tm_x, kb * BK, mt * PM, bar_full(s));
          tma_load_2d(dst + PA_BYTES, &tm_w, kb * BK, nt * BN, bar_full(s));
          tma_load_2d(dst + PA_BYTES + BN * BK * 2, &tm_w, kb * BK, I + nt * BN, bar_full(s));
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int w = wg - 1, ctid = tid - 128 * wg, warp = ctid >> 5, lane = tid & 31;
  const int g4 = lane >> 2, t4 = lane & 3;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  int i = w;  // the CTA's i-th tile
  for (int t = int(blockIdx.x) + w * int(gridDim.x); t < tiles; t += 2 * int(gridDim.x), i += 2) {
    int mt, nt;
    grid.at(t, mt, nt);
    // Mainloops in the CTA's tile order: a barrier phase waited on is never more than one ahead (parity waits).
    if (i > 0) named_sync(1 + w, 256);
    int it = i * ksteps;
    for (int kb = 0; kb < ksteps; ++kb, ++it) {
      const int s = it % PSTAGES;
      mbar_wait(bar_full(s), uint32_t((it / PSTAGES) & 1));
      const uint32_t a = base + uint32_t(s * PSTAGE_BYTES), b = a + PA_BYTES;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma_m64n256k16_ss(acc, desc128(a + uint32_t(kk * 32), 16, 1024), desc128(b + uint32_t(kk * 32), 16, 1024),
                            kb > 0 || kk > 0);
      wgmma_commit();
      if (kb > 0) {
        wgmma_wait<1>();
        if (lane == 0) mbar_arrive(bar_empty((it - 1) % PSTAGES));
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 128; ++j) pin(acc[j]);
    if (lane == 0) mbar_arrive(bar_empty((it - 1) % PSTAGES));
    if (t + int(gridDim.x) < tiles) named_arrive(1 + (w ^ 1), 256);  // the next tile's owner may start
    const int64_t row0 = int64_t(mt) * PM + warp * 16 + g4;
    __nv_bfloat16* o = out + int64_t(nt) * BN + 2 * t4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = row0 + 8 * r;
      if (row >= M) continue;
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const int j = c * 4 + 2 * r;
        const uint32_t v = pack_bf16x2(silu_mul(round_bf16(acc[j]), round_bf16(acc[64 + j])),
                                       silu_mul(round_bf16(acc[j + 1]), round_bf16(acc[64 + j + 1])));
        *reinterpret_cast<uint32_t*>(o + row * I + c * 8) = v;
      }
    }
  }
#else
  __trap();
#endif
}

}  // namespace

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

cudaError_t launch_gemm_swiglu_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                    __nv_bfloat16* out, int64_t M, int K, int I, cudaStream_t stream) {
  if (!gemm_swiglu_sm90_supported(x, ldx, w, M, K, I) || !out) return cudaErrorInvalidValue;
  CUtensorMap tx, tw;
  if (!make_tma_map_2d(tx, x, K, M, ldx, BM) || !make_tma_map_2d(tw, w, K, 2 * int64_t(I), K, BN))
    return cudaErrorNotSupported;
  static const bool pp = std::getenv("DS_GEMM_PP") && std::getenv("DS_GEMM_PP")[0] == '1';
  if (pp) {
    CUtensorMap tx64;
    if (!make_tma_map_2d(tx64, x, K, M, ldx, PM)) return cudaErrorNotSupported;
    static int sms_pp = 0;
    if (sms_pp == 0) {
      int dev = 0;
      cudaError_t e = cudaGetDevice(&dev);
      if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms_pp, cudaDevAttrMultiProcessorCount, dev);
      if (e == cudaSuccess) e = cudaFuncSetAttribute(gemm_swiglu_pp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, PSMEM_BYTES);
      if (e != cudaSuccess) return e;
    }
    const int64_t tiles = ((M + PM - 1) / PM) * (I / BN);
    gemm_swiglu_pp_kernel<<<unsigned(tiles < sms_pp ? tiles : sms_pp), THREADS, PSMEM_BYTES, stream>>>(tx64, tw, out, M, K, I);
    return cudaGetLastError();
  }
  static const int cluster = std::getenv("DS_GEMM_CLUSTER") ? std::atoi(std::getenv("DS_GEMM_CLUSTER")) : 2;
  static const int epi = std::getenv("DS_GEMM_EPI") ? std::atoi(std::getenv("DS_GEMM_EPI")) : 1;
  const auto kernel = cluster == 2 ? (epi == 1 ? gemm_swiglu_sm90_kernel<2, 1>
                                      : epi == 2 ? gemm_swiglu_sm90_kernel<2, 2> : gemm_swiglu_sm90_kernel<2, 0>)
                                   : (epi == 1 ? gemm_swiglu_sm90_kernel<1, 1>
                                      : epi == 2 ? gemm_swiglu_sm90_kernel<1, 2> : gemm_swiglu_sm90_kernel<1, 0>);
  CUtensorMap tout;
  if (!make_tma_map_2d(tout, out, I, M, I, 64)) return cudaErrorNotSupported;
  static int ctas_max[3] = {0, 0, 0};
  int& cmax = ctas_max[cluster == 2 ? 2 : 1];
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster == 2 ? 2 : 1);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = SMEM_BYTES;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cmax == 0) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e != cudaSuccess) return e;
    int dev = 0, sms = 0;
    e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    int clusters = 0;
    cfg.gridDim = dim3(unsigned(sms));
    e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e != cudaSuccess) return e;
    cmax = clusters * int(attr[0].val.clusterDim.x);  // CTAs that run at once: the persistent grid
    if (const char* g = std::getenv("DS_GEMM_GRID")) cmax = std::atoi(g);
    if (std::getenv("DS_GEMM_DEBUG")) std::fprintf(stderr, "gemm_swiglu: cluster %d, %d clusters, grid %d, sms %d\n", cluster, clusters, cmax, sms);
    if (cmax <= 0) return cudaErrorNotSupported;
  }
  const int cl = int(attr[0].val.clusterDim.x);
  const int64_t items = ((M + BM - 1) / BM + cl - 1) / cl * (I / BN) * cl;
  cfg.gridDim = dim3(unsigned(items < cmax ? items : cmax));
  static const int group = std::getenv("DS_GEMM_GROUP") ? std::atoi(std::getenv("DS_GEMM_GROUP")) : GROUP_M / cl;
  static const int n_major = std::getenv("DS_GEMM_NMAJOR") ? std::atoi(std::getenv("DS_GEMM_NMAJOR")) : 0;
  return cudaLaunchKernelEx(&cfg, kernel, tx, tw, tout, out, M, K, I, group, n_major);
}

}  // namespace ds::kern
