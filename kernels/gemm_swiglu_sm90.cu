// Gate/up GEMM with SwiGLU in the epilogue (gemm_swiglu_sm90.h), warp-specialised and persistent:
//   - one CTA per SM walks the output tiles (BM = 128 rows x BN = 128 of the I outputs) in groups of GROUP_M row
//     tiles, so that the tiles running at once share their x rows and weight rows in L2; CTAs in pairs (clusters of
//     two) take adjacent row tiles and load each weight tile once for both (TMA multicast);
//   - warp 0 of the first warpgroup (one thread) issues the TMA loads of each K step (x: 128 x 64; w: the 128 gate
//     rows and the 128 up rows of the tile's outputs, stacked as one 256-row operand) into STAGES stages;
//   - two consumer warpgroups, 64 rows each: wgmma m64n256k16 from shared memory (both operands K-major, 128-byte
//     swizzle), so a thread holds the gate and the up accumulator of the same outputs (columns c and 128 + c);
//     after a tile's last K step they only hand g and u, rounded to bf16, to a staging area and go on with their
//     next tile;
//   - the epilogue runs beside the next tile's products: warps 1-3 of the first warpgroup form silu(g) * u in the
//     staging area, as kernels/swiglu.cu forms it, and store it by TMA. The tensor cores never wait on SwiGLU.
// The GATED instance (launch_gemm_silu_mul_sm90, the gated memory unit's in_proj) runs the same pipeline over a
// plain GEMM's outputs c and N/2 + c and multiplies silu of both by a gate tensor read from device memory.
#include <array>
#include <map>
#include <mutex>
#include "gemm_swiglu_sm90.h"

#include <cuda.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "align.h"
#include "attn_fwd_sm90.h"
#include "mma_sm80.cuh"
#include "silu.cuh"
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
constexpr int kBarEpi = 1;       // named barrier of the epilogue warps
// Named barrier where both consumer warpgroups, having staged a tile's g and u, meet the epilogue warps (waiting
// there, their last tile long done). A full barrier, not bar.arrive: racecheck follows its ordering of the staged
// stores. It is barrier.sync without .aligned (bar.sync's form), as the consumer warps come to it from a per-thread
// wait loop.
constexpr int kBarFull = 2, kFullThreads = 256 + kEpiThreads;
__device__ __forceinline__ void barrier_sync(int id, int count) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// silu(g) * u of two bf16 pairs (low halves, high halves), as kernels/swiglu.cu forms it.
__device__ __forceinline__ uint32_t swiglu_bf16x2(uint32_t g2, uint32_t u2) {
  const float glo = __uint_as_float(g2 << 16), ghi = __uint_as_float(g2 & 0xffff0000u);
  const float ulo = __uint_as_float(u2 << 16), uhi = __uint_as_float(u2 & 0xffff0000u);
  return pack_bf16x2(silu_mul(glo, ulo), silu_mul(ghi, uhi));
}
#endif

// Shared memory: STAGES stages of x and w; per consumer half a g and a u area of 64 x 128 bf16 (two 64-column
// slabs each, the 128-byte swizzled layout of a TMA box; the outputs are written over g); then the mbarriers.
constexpr int STAGES = 3;
constexpr int EPI_OFF = STAGES * STAGE_BYTES, HALF_BYTES = 2 * 64 * BN * 2, BAR_OFF = EPI_OFF + 2 * HALF_BYTES;
constexpr int SMEM_BYTES = BAR_OFF + (2 * STAGES + 2) * 8 + 1024;
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");

// CLUSTER = 2: the two CTAs of a cluster take adjacent row tiles of the same columns; each loads its own x rows and
// one half of the weight rows (rank 0 the gate rows, rank 1 the up rows) into both CTAs' stages (TMA multicast), so
// the weight rows cross L2 once per pair. A stage is free when both CTAs' consumers are done with it.
// GATED (launch_gemm_silu_mul_sm90): the 256 weight rows of a tile are outputs c and I + c of a GEMM with 2I
// outputs, and the epilogue forms silu(y) * gate for both halves, gate [M][2I] read from device memory (ldg).
template <int CLUSTER, bool GATED>
__global__ void __launch_bounds__(THREADS, 1)
    gemm_swiglu_sm90_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                            const __grid_constant__ CUtensorMap tm_out, int64_t M, int K, int I,
                            const __nv_bfloat16* gate, int64_t ld_gate) {
#if defined(DS_SM90A_GEMM)
  using namespace sm90;
  constexpr int ST = STAGES;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t bars = base + BAR_OFF;
  auto bar_full = [&](int s) { return bars + 8u * uint32_t(s); };
  auto bar_empty = [&](int s) { return bars + 8u * uint32_t(ST + s); };
  // The staging area of consumer half h is empty again when the 96 epilogue threads are done with it (and its TMA
  // store has read it).
  auto bar_hempty = [&](int h) { return bars + 8u * uint32_t(2 * ST + h); };
  const int tiles_m = int((M + BM - 1) / BM);
  const TileGrid<CLUSTER> grid{(tiles_m + CLUSTER - 1) / CLUSTER, I / BN};
  const int items = grid.items_m * grid.tiles_n, ksteps = (K + BK - 1) / BK;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int rank = CLUSTER > 1 ? int(cluster_rank()) : 0;
  const int item0 = int(blockIdx.x) / CLUSTER, item_step = int(gridDim.x) / CLUSTER;
  // The TMA store of one half's 64 x 128 outputs from a staging area (two 64-column slabs) to columns col0...
  const auto store_half = [&](uint32_t area, int mt, int col0, int half) {
#pragma unroll
    for (int sl = 0; sl < 2; ++sl)
      asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                       reinterpret_cast<uint64_t>(&tm_out)),
                   "r"(col0 + sl * 64), "r"(mt * BM + half * 64), "r"(area + uint32_t(sl * 64 * 128))
                   : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  };

  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 8 * CLUSTER);  // one arrival per consumer warp of every CTA in the cluster
    }
    for (int h = 0; h < 2; ++h) mbar_init(bar_hempty(h), kEpiThreads);
    fence_mbarrier_init();
  }
  if constexpr (CLUSTER > 1) cluster_sync();
  else __syncthreads();

  if (wg == 0) {  // producer (thread 0) and the epilogue warps 1-3
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
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
    } else if (tid >= 32) {
      // Epilogue: per tile, wait until both consumer halves have staged g and u; per half, write silu(g) * u over g
      // in place, store it by TMA, and once the store has read the area give it back.
      const int etid = tid - 32;
      int k = 0;  // this CTA's tiles so far
      for (int t = item0; t < items; t += item_step, ++k) {
        int mi, nt;
        grid.at(t, mi, nt);
        const int mt = mi * CLUSTER + rank;
        barrier_sync(kBarFull, kFullThreads);  // both halves staged
#pragma unroll 1
        for (int half = 0; half < 2; ++half) {
          const uint32_t ga = base + uint32_t(EPI_OFF + half * HALF_BYTES), ua = ga + 64 * BN * 2;
          if constexpr (GATED) {
            // Both areas in place: y of outputs nt * BN + c (ga) and I + nt * BN + c (ua), times the gate's same
            // elements. Chunk c of an area: slab c / 512, row (c / 8) % 64, 16-byte column c % 8 under the XOR.
            constexpr int kChunks = 2 * 64 * BN * 2 / 16;
            const auto gate_chunk = [&](int c) {
              const int area = c >> 10, ci = c & 1023, row = (ci >> 3) & 63;
              const int col = area * I + nt * BN + (ci >> 9) * 64 + (((ci & 7) ^ (row & 7)) << 3);
              const int64_t grow = int64_t(mt) * BM + half * 64 + row;
              return grow < M ? __ldg(reinterpret_cast<const uint4*>(gate + grow * ld_gate + col)) : make_uint4(0, 0, 0, 0);
            };
            // Four chunks per thread at a time: their gate loads in flight together, then formed one by one.
            constexpr int kAhead = 4;
#pragma unroll 1
            for (int c0 = etid; c0 < kChunks; c0 += kAhead * kEpiThreads) {
              uint4 m[kAhead];
#pragma unroll
              for (int j = 0; j < kAhead; ++j)
                m[j] = c0 + j * kEpiThreads < kChunks ? gate_chunk(c0 + j * kEpiThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
              for (int j = 0; j < kAhead; ++j) {
                const int c = c0 + j * kEpiThreads;
                if (c >= kChunks) break;
                const uint32_t at = ((c >> 10) ? ua : ga) + uint32_t(16 * (c & 1023));
                uint32_t y0, y1, y2, y3;
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(y0), "=r"(y1), "=r"(y2), "=r"(y3)
                             : "r"(at));
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(swiglu_bf16x2(y0, m[j].x)),
                             "r"(swiglu_bf16x2(y1, m[j].y)), "r"(swiglu_bf16x2(y2, m[j].z)),
                             "r"(swiglu_bf16x2(y3, m[j].w))
                             : "memory");
              }
            }
          } else {
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
          }
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          __syncwarp();
          named_sync(kBarEpi, kEpiThreads);
          if (etid == 0) {
            store_half(ga, mt, nt * BN, half);
            if constexpr (GATED) store_half(ua, mt, I + nt * BN, half);
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
          }
          __syncwarp();
          named_sync(kBarEpi, kEpiThreads);
          mbar_arrive(bar_hempty(half));
        }
      }
      if (etid == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
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
    const uint32_t area = base + uint32_t(EPI_OFF + half * HALF_BYTES);
    const float one[2] = {1.f, 1.f};
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    int it = 0, k = 0;
    for (int t = item0; t < items; t += item_step, ++k) {  // the producer's and the epilogue's tiles, in step
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
      // The epilogue warps are done with this half's previous tile (a fresh barrier's phase "-1" counts as done).
      mbar_wait(bar_hempty(half), uint32_t((k & 1) ^ 1));
      stage_out_tile<64>(g, one, area, warp * 16 + g4, t4);
      stage_out_tile<64>(u, one, area + 64 * BN * 2, warp * 16 + g4, t4);
      barrier_sync(kBarFull, kFullThreads);
    }
  }
  // No CTA of a cluster leaves while the other may still multicast into its stages or arrive on its barriers.
  if constexpr (CLUSTER > 1) cluster_sync();
#else
  __trap();  // built without sm_90a: never launched (gemm_swiglu_sm90_supported checks)
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

namespace {

// Both entry points: out has `out_cols` columns (I, or 2I when GATED).
template <bool GATED>
cudaError_t launch_impl(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, __nv_bfloat16* out,
                        int64_t out_cols, int64_t M, int K, int I, const __nv_bfloat16* gate, int64_t ld_gate,
                        cudaStream_t stream, int cluster) {
  CUtensorMap tx, tw, tout;
  if (!make_tma_map_2d(tx, x, K, M, ldx, BM) || !make_tma_map_2d(tw, w, K, 2 * int64_t(I), K, BN) ||
      !make_tma_map_2d(tout, out, out_cols, M, out_cols, 64))
    return cudaErrorNotSupported;
  // CTAs that run at once (the persistent grid) for clusters of one and of two; 0 where the device cannot place
  // clusters of two (a partitioned GPU, say): the automatic choice then takes single CTAs.
  // Per device (a kernel's shared-memory attribute and the occupancy are a device's: a scan with one replica per GPU
  // launches on several), under a lock (their threads launch at once).
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  static std::mutex ctas_mu;
  static std::map<int, std::array<int, 3>> ctas_of;
  std::array<int, 3> ctas;
  {
    std::lock_guard<std::mutex> lk(ctas_mu);
    ctas = ctas_of.emplace(dev, std::array<int, 3>{-1, -1, -1}).first->second;
  }
  for (int c = 1; c <= 2; ++c) {
    if (ctas[c] >= 0) continue;
    const auto kernel = c == 2 ? gemm_swiglu_sm90_kernel<2, GATED> : gemm_swiglu_sm90_kernel<1, GATED>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    int sms = 0, clusters = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaLaunchConfig_t q{};
    cudaLaunchAttribute qa[1];
    qa[0].id = cudaLaunchAttributeClusterDimension;
    qa[0].val.clusterDim = {unsigned(c), 1, 1};
    q.gridDim = dim3(unsigned(sms));
    q.blockDim = dim3(THREADS);
    q.dynamicSmemBytes = SMEM_BYTES;
    q.attrs = qa;
    q.numAttrs = 1;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &q);
    if (e != cudaSuccess) {
      if (c == 1) return e;
      cudaGetLastError();  // clusters of two cannot be placed: not an error of this launch
      clusters = 0;
    }
    ctas[c] = clusters * c;
  }
  {
    std::lock_guard<std::mutex> lk(ctas_mu);
    ctas_of[dev] = ctas;
  }
  if (cluster == 0) cluster = ctas[2] > 0 ? 2 : 1;
  if (ctas[cluster] <= 0) return cudaErrorNotSupported;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim = {unsigned(cluster), 1, 1};
  const int64_t items = ((M + BM - 1) / BM + cluster - 1) / cluster * (I / BN) * cluster;
  cfg.gridDim = dim3(unsigned(items < ctas[cluster] ? items : ctas[cluster]));
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = SMEM_BYTES;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cluster == 2 ? cudaLaunchKernelEx(&cfg, gemm_swiglu_sm90_kernel<2, GATED>, tx, tw, tout, M, K, I, gate, ld_gate)
                      : cudaLaunchKernelEx(&cfg, gemm_swiglu_sm90_kernel<1, GATED>, tx, tw, tout, M, K, I, gate, ld_gate);
}

}  // namespace

cudaError_t launch_gemm_swiglu_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                    __nv_bfloat16* out, int64_t M, int K, int I, cudaStream_t stream, int cluster) {
  if (!gemm_swiglu_sm90_supported(x, ldx, w, M, K, I) || !out || !aligned16(out) || cluster < 0 || cluster > 2)
    return cudaErrorInvalidValue;
  return launch_impl<false>(x, ldx, w, out, I, M, K, I, nullptr, 0, stream, cluster);
}

cudaError_t launch_gemm_silu_mul_sm90(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                      const __nv_bfloat16* gate, int64_t ld_gate, __nv_bfloat16* out, int64_t M,
                                      int K, int N, cudaStream_t stream, int cluster) {
  if (N % 2 || !gemm_swiglu_sm90_supported(x, ldx, w, M, K, N / 2) || !out || !aligned16(out) || !gate ||
      !aligned16(gate) || ld_gate % 8 || ld_gate < N || cluster < 0 || cluster > 2)
    return cudaErrorInvalidValue;
  return launch_impl<true>(x, ldx, w, out, N, M, K, N / 2, gate, ld_gate, stream, cluster);
}

}  // namespace ds::kern
