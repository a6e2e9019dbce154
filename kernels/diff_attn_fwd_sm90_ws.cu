// Fused differential attention, forward, causal, Hopper, warp-specialised (v9): the arithmetic of the v5 kernel in
// diff_attn_fwd_sm90.cu (wgmma S = Q K^T from shared memory, O += P V with P from registers, both online softmaxes,
// the epilogue (1 - lambda_init) * RMSNorm_2d(O1/l1 - lambda O2/l2)), with the data movement and the scheduling of
// FlashAttention-3:
//   - a producer warpgroup: one thread issues TMA tile loads (cp.async.bulk.tensor, 128-byte swizzle, rows past n
//     zero-filled by the copy engine) into mbarrier-guarded stages, then gives its registers away (setmaxnreg);
//   - two consumer warpgroups, map 1 and map 2 of the same 64 query rows, 240 registers each. K stages (K1 and K2
//     of a tile) and V stages (one 2d-wide V tile, shared by both maps) are separate pipelines: a K stage is free
//     once both maps' S product is done, a V stage once both P V products are done, so nothing waits on a
//     CTA-wide barrier and the two warpgroups may drift apart;
//   - ping-pong: the two consumers take turns issuing their products (named barriers 2 and 3), so one warpgroup's
//     softmax runs while the other's wgmmas use the tensor cores.
// Why (v5 measurements, bench/cuda_notes.md): the tensor pipe was busy 39% of the time with every thread issuing
// cp.async and both warpgroups meeting at __syncthreads once per tile; a v8 ping-pong with a private K/V copy
// per warpgroup gained the ordering (+8-12%) but lost more to the second V copy. Here V is loaded once.
// Shared memory (1024-byte aligned, all tiles [64-column slabs][rows][64] with the SW128 XOR, which is what a TMA
// box of 64 columns x rows with CU_TENSOR_MAP_SWIZZLE_128B writes): Q of both maps, KS K stages, VS V stages,
// then the mbarriers. d = 128: 32 + 2 x 32 + 2 x 32 KB = 160 KB.
#include "diff_attn_fwd_sm90_ws.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#if defined(DS_ATTN_TRACE)
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>
#endif

#include "mma_sm80.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_SM90A_WS 1
#include "diff_attn_sm90_common.cuh"
#endif

namespace ds::kern {
namespace {

constexpr int BM = 64, THREADS = 384, KS = 2, VS = 2;

#if defined(DS_ATTN_TRACE)
// Diagnostic build only (-DDS_ATTN_TRACE): per-CTA timestamps (SM clock) of the phases of one launch, dumped by
// the launcher to $DS_ATTN_TRACE_OUT. Slots: 0 smid, 1 n_kt, 2 entry, 3 Q landed (map 1), 4 diagonal tile's
// softmax done (map 1), 5 map 1 loop done, 6 map 2 loop done, 7 map 1 stores done.
constexpr int TRACE_CTAS = 65536, TRACE_SLOTS = 8;
__device__ unsigned long long g_trace[TRACE_CTAS * TRACE_SLOTS];
__device__ __forceinline__ unsigned long long clk64() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
#define DS_TRACE_AT(idx, slot, value)                                                  \
  do {                                                                                 \
    const int i_ = (idx);                                                              \
    if (i_ < TRACE_CTAS) g_trace[i_ * TRACE_SLOTS + (slot)] = (value);                 \
  } while (0)
#define DS_TRACE(slot, value) DS_TRACE_AT(int(blockIdx.y * gridDim.x + blockIdx.x), slot, value)
#else
#define DS_TRACE_AT(idx, slot, value) \
  do {                                \
  } while (0)
#define DS_TRACE(slot, value) DS_TRACE_AT(0, slot, value)
#endif

template <int D, int BN>
struct TileWs {
  static constexpr int VW = 2 * D;
  static constexpr int Q_BYTES = 2 * BM * D * 2;
  static constexpr int K_STAGE_BYTES = 2 * BN * D * 2;  // K1 and K2
  static constexpr int V_STAGE_BYTES = BN * VW * 2;
  static constexpr int K_OFF = Q_BYTES, V_OFF = K_OFF + KS * K_STAGE_BYTES, BAR_OFF = V_OFF + VS * V_STAGE_BYTES;
  static constexpr int N_BARS = 1 + 2 * KS + 2 * VS;
  static constexpr int SMEM_BYTES = BAR_OFF + N_BARS * 8 + 1024;  // + alignment slack
  static_assert(BM * VW * 4 <= KS * K_STAGE_BYTES, "O2 staging must fit in the K stages");
  static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
};

#if defined(DS_SM90A_WS)
constexpr int BAR_CONSUMERS = 1, BAR_SCHED0 = 2, BAR_EPILOGUE = 4;  // named barriers (0 is __syncthreads)

using namespace sm90;

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier counts the phase before its first,
// parity 1, as completed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#endif

template <int D, int BN, bool TMA_STORE>
__global__ void __launch_bounds__(THREADS, 1)
    diff_attn_fwd_sm90_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                                 const __grid_constant__ CUtensorMap tm_out, const AttnParams p) {
#if defined(DS_SM90A_WS)
  using T = TileWs<D, BN>;
  constexpr int NS = BN / 2;  // S accumulators per thread
  constexpr int VW = T::VW, NACC = VW / 2, SLABS = D / 64;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t pad = (1024 - (raw & 1023)) & 1023;
  unsigned char* smem = smem_raw + pad;
  const uint32_t s_base = raw + pad;
  const uint32_t sQ = s_base, sK = s_base + T::K_OFF, sV = s_base + T::V_OFF;
  const uint32_t bar_q = s_base + T::BAR_OFF;
  auto bar_full_k = [&](int s) { return bar_q + 8u * uint32_t(1 + s); };
  auto bar_empty_k = [&](int s) { return bar_q + 8u * uint32_t(1 + KS + s); };
  auto bar_full_v = [&](int s) { return bar_q + 8u * uint32_t(1 + 2 * KS + s); };
  auto bar_empty_v = [&](int s) { return bar_q + 8u * uint32_t(1 + 2 * KS + VS + s); };

  const int tid = threadIdx.x, wg = tid >> 7;
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // heaviest (longest causal row) tiles first
  const int j = int(blockIdx.y) % hv, b = int(blockIdx.y) / hv;
  const int g = j / (p.heads / p.kv_heads);
  const int q0 = qt * BM;
  const int n_kt = (q0 + BM - 1) / BN + 1;  // kv tiles up to the one holding the diagonal

  if (tid == 0) {
    DS_TRACE(0, smid());
    DS_TRACE(1, (unsigned long long)n_kt);
    DS_TRACE(2, clk64());
    mbar_init(bar_q, 1);
    for (int s = 0; s < KS; ++s) {
      mbar_init(bar_full_k(s), 1);
      mbar_init(bar_empty_k(s), 256);
    }
    for (int s = 0; s < VS; ++s) {
      mbar_init(bar_full_v(s), 1);
      mbar_init(bar_empty_v(s), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer: one thread issues every copy, the rest of the warpgroup leaves at once
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_q)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_kv)) : "memory");
      // Tensor coordinates (column, token, batch); head h's D columns start at off + h * D, 64 per box.
      mbar_expect_tx(bar_q, T::Q_BYTES);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int sl = 0; sl < SLABS; ++sl)
          tma_load_3d(sQ + uint32_t((m * SLABS + sl) * BM * 128), &tm_q,
                      int(p.q_off) + (m == 0 ? j : j + hv) * D + sl * 64, q0, b, bar_q);
      for (int it = 0; it < n_kt; ++it) {
        const int k0 = (n_kt - 1 - it) * BN;
        const int ks = it % KS, vs = it % VS;
        // stage use u waits for the consumers' release of use u - 1 (phase u - 1); use 0 passes at once
        mbar_wait(bar_empty_k(ks), uint32_t(((it / KS) & 1) ^ 1));
        mbar_expect_tx(bar_full_k(ks), T::K_STAGE_BYTES);
        const uint32_t dk = sK + uint32_t(ks * T::K_STAGE_BYTES);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int sl = 0; sl < SLABS; ++sl)
            tma_load_3d(dk + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                        int(p.k_off) + (m == 0 ? g : half_kv + g) * D + sl * 64, k0, b, bar_full_k(ks));
        mbar_wait(bar_empty_v(vs), uint32_t(((it / VS) & 1) ^ 1));
        mbar_expect_tx(bar_full_v(vs), T::V_STAGE_BYTES);
        const uint32_t dv = sV + uint32_t(vs * T::V_STAGE_BYTES);
#pragma unroll
        for (int m = 0; m < 2; ++m)  // [V_g | V_{Hkv/2+g}]: 2 SLABS slabs of 64 columns
#pragma unroll
          for (int sl = 0; sl < SLABS; ++sl)
            tma_load_3d(dv + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                        int(p.v_off) + (m == 0 ? g : half_kv + g) * D + sl * 64, k0, b, bar_full_v(vs));
      }
    }
    return;
  }

  // Consumers: warpgroup 1 computes map 1, warpgroup 2 map 2.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int map = wg - 1, ctid = tid - 128 * wg, warp = ctid >> 5, lane = tid & 31;
  const int wrow = warp * 16, g4 = lane >> 2, t4 = lane & 3;
  unsigned long long t_start = 0;
  if (p.head_ns && ctid == 0 && map == 0) t_start = global_timer_ns();

  float acc[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_base = sQ + uint32_t(map * BM * D * 2);
  uint32_t pa[BN / 16][4];  // P of the previous tile, bf16: the A operand of the P V product in flight

  // Turn-taking: this warpgroup waits for its turn (barrier BAR_SCHED0 + map: its own 128 threads plus the
  // other warpgroup's 128 arrivals) before issuing a tile's products and hands the turn over after issuing.
  // Map 2 gives map 1 the first turn; both take n_kt + 1 turns, and map 2 skips its last hand-over so that
  // every barrier phase is complete when the CTA ends.
  auto turn_wait = [&]() { named_sync(BAR_SCHED0 + map, 256); };
  auto turn_pass = [&]() { named_arrive(BAR_SCHED0 + (map ^ 1), 256); };
  if (map == 1) named_arrive(BAR_SCHED0, 256);

  auto issue_s = [&](float (&s)[NS], int ks) { issue_qk<D, BN>(s, q_base, sK + uint32_t(ks * T::K_STAGE_BYTES + map * BN * D * 2)); };
  auto issue_pv = [&](int vs) { sm90::issue_pv<D, BN>(acc, pa, sV + uint32_t(vs * T::V_STAGE_BYTES)); };
  auto softmax = [&](float (&s)[NS], float (&alpha)[2]) { online_softmax<NS, true>(s, m_run, l_run, sl2, alpha); };
  auto rescale = [&](const float (&alpha)[2]) { rescale_o(acc, alpha); };
  auto pack = [&](float (&s)[NS]) { pack_p<BN>(s, pa); };
  auto pin_pv_operands = [&]() {
#pragma unroll
    for (int i = 0; i < NACC; ++i) pin(acc[i]);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
  };

  mbar_wait(bar_q, 0);
  if (ctid == 0 && map == 0) DS_TRACE(3, clk64());
  float alpha_prev[2] = {1.f, 1.f};
  {  // tile 0: the diagonal one, masked; peeled so that no wgmma is issued conditionally in the loop
    float s[NS];
    zero_pinned(s);
    mbar_wait(bar_full_k(0), 0);
    turn_wait();
    wgmma_fence();
    issue_s(s, 0);
    turn_pass();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < NS; ++i) pin(s[i]);
    mbar_arrive(bar_empty_k(0));
    mask_diagonal(s, (n_kt - 1) * BN, q0 + wrow + g4, t4);
    softmax(s, alpha_prev);  // O is zero: no rescale
    alpha_prev[0] = alpha_prev[1] = 1.f;
    pack(s);
    if (ctid == 0 && map == 0) DS_TRACE(4, clk64());
  }
  // Per iteration: wait K(it) | my turn | issue S(it) | rescale O (overlaps S) | wait V(it-1) | issue P(it-1) V(it-1)
  // | pass the turn | wait S, free K(it) | softmax(it) while P V runs | wait P V, free V(it-1) | pack P(it).
  for (int it = 1; it < n_kt; ++it) {
    const int ks = it % KS, vs = (it - 1) % VS;
    float s[NS];
    zero_pinned(s);
    mbar_wait(bar_full_k(ks), uint32_t((it / KS) & 1));
    turn_wait();
    wgmma_fence();
    issue_s(s, ks);
    rescale(alpha_prev);
    mbar_wait(bar_full_v(vs), uint32_t(((it - 1) / VS) & 1));
    wgmma_fence();
    issue_pv(vs);
    turn_pass();
    wgmma_wait<1>();  // S(it) done; P(it-1) V(it-1) may still run
#pragma unroll
    for (int i = 0; i < NS; ++i) pin(s[i]);
    mbar_arrive(bar_empty_k(ks));
    softmax(s, alpha_prev);
    wgmma_wait<0>();  // P(it-1) V(it-1) done: O and the A registers may be written
    pin_pv_operands();
    mbar_arrive(bar_empty_v(vs));
    pack(s);
  }
  {  // the last tile's P V
    const int vs = (n_kt - 1) % VS;
    mbar_wait(bar_full_v(vs), uint32_t(((n_kt - 1) / VS) & 1));
    turn_wait();
    rescale(alpha_prev);
    wgmma_fence();
    issue_pv(vs);
    if (map == 0) turn_pass();
    wgmma_wait<0>();
    pin_pv_operands();
    mbar_arrive(bar_empty_v(vs));
  }
  if (ctid == 0) DS_TRACE(5 + map, clk64());

  // Epilogue: map 2 stages O2 / l2 in the K stages (every S product of both maps is done: map 2 passed its last
  // turn, which map 1 handed over after its own last S had completed), map 1 combines, normalises and stores.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
  float* sO2 = reinterpret_cast<float*>(smem + T::K_OFF);  // [4 warps][NACC][32 lanes]
  if (map == 1) {
    float* dst = sO2 + warp * NACC * 32;
#pragma unroll
    for (int i = 0; i < NACC; ++i) dst[i * 32 + lane] = acc[i] * inv_l[(i >> 1) & 1];
  }
  named_sync(BAR_CONSUMERS, 256);
  if (map == 0 && TMA_STORE) {
    // The output tile goes through shared memory (Q's 32 KB: every S product of both maps is done) and leaves
    // with TMA stores, whole 128-byte lines; rows past n are clipped by the copy engine.
    combine_to_smem(acc, inv_l, sO2 + warp * NACC * 32, lane, p, sQ, wrow + g4, t4);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync(BAR_EPILOGUE, 128);
    if (ctid == 0) {
#pragma unroll
      for (int sl = 0; sl < VW / 64; ++sl)
        asm volatile(
            "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                reinterpret_cast<uint64_t>(&tm_out)),
            "r"(j * VW + sl * 64), "r"(q0), "r"(b), "r"(sQ + uint32_t(sl * BM * 128))
            : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // shared memory must outlive the reads
    }
    if (p.head_ns && ctid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
  } else if (map == 0) {
    combine_store(acc, inv_l, sO2 + warp * NACC * 32, lane, p, b, j, q0 + wrow + g4, t4);
    if (p.head_ns && ctid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
  }
#if defined(DS_ATTN_TRACE)
  if (map == 0) {
    named_sync(BAR_EPILOGUE + 1, 128);  // every warp of map 1 has stored
    if (ctid == 0) DS_TRACE(7, clk64());
  }
#endif
#else
  __trap();  // built without sm_90a: never launched (diff_attn_fwd_sm90_available() is false)
#endif
}

// ---- v11: v9 made persistent ----------------------------------------------------------------------------------
// One CTA per SM loops over (head, query tile) work items taken from a global counter, heaviest first within each
// head and heads in order (v9's launch order), so the tail is the lightest tiles. Why (per-CTA timestamps of v9,
// bench/cuda_notes.md): at 2048 x 8, d = 128 a CTA spent ~8k SM cycles outside its key-tile loop (launch gap, Q
// load latency, epilogue) against ~2.1k per key tile, 24% of the kernel. Here the producer loads the next tile's Q
// (double-buffered) and K/V (the stage rings run on across tiles) while the consumers still work on the current
// one, and the epilogue overlaps the next tile: map 1, which finishes first, hands O1/l1 to map 2 through a
// dedicated buffer X in two halves and starts the next tile; map 2 combines, normalises, writes the bf16 tile
// into X and stores it with TMA.
// Shared memory (d = 128): Q 2 x 32 KB, K 2 x 32 KB, V 2 x 32 KB, X 32 KB = 224 KB.
template <int D, int BN, int QB>
struct TileP {
  static constexpr int VW = 2 * D;
  static constexpr int Q_BYTES = 2 * BM * D * 2;  // one buffer: Q of both maps
  static constexpr int K_STAGE_BYTES = 2 * BN * D * 2;
  static constexpr int V_STAGE_BYTES = BN * VW * 2;
  static constexpr int X_BYTES = BM * VW * 2;  // half of O in f32, or the whole output tile in bf16
  static constexpr int K_OFF = QB * Q_BYTES, V_OFF = K_OFF + KS * K_STAGE_BYTES, X_OFF = V_OFF + VS * V_STAGE_BYTES;
  static constexpr int BAR_OFF = X_OFF + X_BYTES;
  static constexpr int N_BARS = 4 + 2 * KS + 2 * VS;  // Q full[2], Q empty[2], K full/empty, V full/empty
  static constexpr int SLOT_OFF = BAR_OFF + N_BARS * 8;  // tile index of each Q buffer
  static constexpr int SMEM_BYTES = SLOT_OFF + 8 + 1024;
  static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
};

#if defined(DS_SM90A_WS)
__device__ int g_tile_counter;  // work items handed out past the first gridDim.x; the last taker resets it to 0
// Named barriers of v11 (0 is __syncthreads; 2 and 3 are the turn barriers).
constexpr int BAR_X_FULL = 5, BAR_X_READ = 6, BAR_X_FREE = 7, BAR_MAP2 = 8;
#endif

template <int D, int BN, int QB>
__global__ void __launch_bounds__(THREADS, 1)
    diff_attn_fwd_sm90_p_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                                const __grid_constant__ CUtensorMap tm_out, const AttnParams p) {
#if defined(DS_SM90A_WS)
  using T = TileP<D, BN, QB>;
  constexpr int NS = BN / 2;
  constexpr int VW = T::VW, NACC = VW / 2, SLABS = D / 64;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t pad = (1024 - (raw & 1023)) & 1023;
  unsigned char* smem = smem_raw + pad;
  const uint32_t s_base = raw + pad;
  const uint32_t sK = s_base + T::K_OFF, sV = s_base + T::V_OFF, sX = s_base + T::X_OFF;
  const uint32_t bars = s_base + T::BAR_OFF;
  int* slot = reinterpret_cast<int*>(smem + T::SLOT_OFF);
  auto sQ = [&](int qb) { return s_base + uint32_t(qb * T::Q_BYTES); };
  auto bar_q_full = [&](int qb) { return bars + 8u * uint32_t(qb); };
  auto bar_q_empty = [&](int qb) { return bars + 8u * uint32_t(2 + qb); };
  auto bar_full_k = [&](int s) { return bars + 8u * uint32_t(4 + s); };
  auto bar_empty_k = [&](int s) { return bars + 8u * uint32_t(4 + KS + s); };
  auto bar_full_v = [&](int s) { return bars + 8u * uint32_t(4 + 2 * KS + s); };
  auto bar_empty_v = [&](int s) { return bars + 8u * uint32_t(4 + 2 * KS + VS + s); };

  const int tid = threadIdx.x, wg = tid >> 7;
  const int hv = p.heads / 2, half_kv = p.kv_heads / 2;
  const int nqt = (p.n + BM - 1) / BM, total = nqt * hv * p.batch;
  // Work item w: (batch, head) = w / nqt in v9's blockIdx.y order, query tile nqt - 1 - w % nqt (heaviest first).
  struct Item {
    int b, j, g, q0, n_kt;
  };
  auto item = [&](int w) {
    Item it;
    const int bh = w / nqt, qt = nqt - 1 - w % nqt;
    it.j = bh % hv;
    it.b = bh / hv;
    it.g = it.j / (p.heads / p.kv_heads);
    it.q0 = qt * BM;
    it.n_kt = (it.q0 + BM - 1) / BN + 1;
    return it;
  };

  if (tid == 0) {
    for (int i = 0; i < 2; ++i) {
      mbar_init(bar_q_full(i), 1);
      mbar_init(bar_q_empty(i), 256);
    }
    for (int s = 0; s < KS; ++s) {
      mbar_init(bar_full_k(s), 1);
      mbar_init(bar_empty_k(s), 256);
    }
    for (int s = 0; s < VS; ++s) {
      mbar_init(bar_full_v(s), 1);
      mbar_init(bar_empty_v(s), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_q)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_kv)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_out)) : "memory");
      int w = int(blockIdx.x), kv = 0;  // kv: K/V stage uses so far (the rings run on across tiles)
      for (int k = 0;; ++k) {
        const int qb = k % QB;
        mbar_wait(bar_q_empty(qb), uint32_t(((k / QB) & 1) ^ 1));  // tile k - QB's S products are done
        if (w >= total) {
          slot[k & 1] = -1;
          mbar_arrive(bar_q_full(qb));
          break;
        }
        slot[k & 1] = w;
        const Item t = item(w);
        mbar_expect_tx(bar_q_full(qb), T::Q_BYTES);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int sl = 0; sl < SLABS; ++sl)
            tma_load_3d(sQ(qb) + uint32_t((m * SLABS + sl) * BM * 128), &tm_q,
                        int(p.q_off) + (m == 0 ? t.j : t.j + hv) * D + sl * 64, t.q0, t.b, bar_q_full(qb));
        for (int it = 0; it < t.n_kt; ++it, ++kv) {
          const int k0 = (t.n_kt - 1 - it) * BN;
          const int ks = kv % KS, vs = kv % VS;
          mbar_wait(bar_empty_k(ks), uint32_t(((kv / KS) & 1) ^ 1));
          mbar_expect_tx(bar_full_k(ks), T::K_STAGE_BYTES);
          const uint32_t dk = sK + uint32_t(ks * T::K_STAGE_BYTES);
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
              tma_load_3d(dk + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                          int(p.k_off) + (m == 0 ? t.g : half_kv + t.g) * D + sl * 64, k0, t.b, bar_full_k(ks));
          mbar_wait(bar_empty_v(vs), uint32_t(((kv / VS) & 1) ^ 1));
          mbar_expect_tx(bar_full_v(vs), T::V_STAGE_BYTES);
          const uint32_t dv = sV + uint32_t(vs * T::V_STAGE_BYTES);
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
              tma_load_3d(dv + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                          int(p.v_off) + (m == 0 ? t.g : half_kv + t.g) * D + sl * 64, k0, t.b, bar_full_v(vs));
        }
        // Next work item; the taker of the last one (every CTA takes exactly one past the end) resets the counter
        // for the next launch.
        const int f = atomicAdd(&g_tile_counter, 1);
        if (f == total - 1) atomicExch(&g_tile_counter, 0);
        w = int(gridDim.x) + f;
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int map = wg - 1, ctid = tid - 128 * wg, warp = ctid >> 5, lane = tid & 31;
  const int wrow = warp * 16, g4 = lane >> 2, t4 = lane & 3;
  const float sl2 = p.scale * 1.4426950408889634f;
  float acc[NACC];
  uint32_t pa[BN / 16][4];
  auto turn_wait = [&]() { named_sync(BAR_SCHED0 + map, 256); };
  auto turn_pass = [&]() { named_arrive(BAR_SCHED0 + (map ^ 1), 256); };
  auto pin_pv_operands = [&]() {
#pragma unroll
    for (int i = 0; i < NACC; ++i) pin(acc[i]);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pin(pa[kk][e]);
  };
  // Map 2 gives map 1 the first turn and X once; every later turn and X are handed over as in the loop below, and
  // map 1 takes one more of each after the last tile, so every barrier phase is complete when the CTA ends.
  if (map == 1) {
    named_arrive(BAR_SCHED0, 256);
    named_arrive(BAR_X_FREE, 256);
  }
  int kv = 0;
  for (int k = 0;; ++k) {
    const int qb = k % QB;
    mbar_wait(bar_q_full(qb), uint32_t((k / QB) & 1));
    const int w = __shfl_sync(0xffffffffu, slot[k & 1], 0);  // warp-uniform for the compiler
    if (w < 0) break;
    const Item t = item(w);
    if (ctid == 0 && map == 0) {
      DS_TRACE_AT(w, 0, smid());
      DS_TRACE_AT(w, 1, (unsigned long long)t.n_kt);
      DS_TRACE_AT(w, 2, clk64());
      DS_TRACE_AT(w, 3, clk64());
    }
    unsigned long long t_start = 0;
    if (p.head_ns && ctid == 0 && map == 1) t_start = global_timer_ns();
    const uint32_t q_base = sQ(qb) + uint32_t(map * BM * D * 2);
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float alpha_prev[2] = {1.f, 1.f};
    auto issue_s = [&](float (&s)[NS], int ks) {
      issue_qk<D, BN>(s, q_base, sK + uint32_t(ks * T::K_STAGE_BYTES + map * BN * D * 2));
    };
    auto issue_pv = [&](int vs) { sm90::issue_pv<D, BN>(acc, pa, sV + uint32_t(vs * T::V_STAGE_BYTES)); };
    {  // the diagonal tile, masked
      const int ks = kv % KS;
      float s[NS];
      zero_pinned(s);
      mbar_wait(bar_full_k(ks), uint32_t((kv / KS) & 1));
      turn_wait();
      wgmma_fence();
      issue_s(s, ks);
      turn_pass();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      mbar_arrive(bar_empty_k(ks));
      mask_diagonal(s, (t.n_kt - 1) * BN, t.q0 + wrow + g4, t4);
      online_softmax<NS, true>(s, m_run, l_run, sl2, alpha_prev);
      alpha_prev[0] = alpha_prev[1] = 1.f;
      pack_p<BN>(s, pa);
      if (ctid == 0 && map == 0) DS_TRACE_AT(w, 4, clk64());
    }
    for (int it = 1; it < t.n_kt; ++it) {
      const int ks = (kv + it) % KS, vs = (kv + it - 1) % VS;
      float s[NS];
      zero_pinned(s);
      mbar_wait(bar_full_k(ks), uint32_t(((kv + it) / KS) & 1));
      turn_wait();
      wgmma_fence();
      issue_s(s, ks);
      rescale_o(acc, alpha_prev);
      mbar_wait(bar_full_v(vs), uint32_t(((kv + it - 1) / VS) & 1));
      wgmma_fence();
      issue_pv(vs);
      turn_pass();
      wgmma_wait<1>();
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      mbar_arrive(bar_empty_k(ks));
      online_softmax<NS, true>(s, m_run, l_run, sl2, alpha_prev);
      wgmma_wait<0>();
      pin_pv_operands();
      mbar_arrive(bar_empty_v(vs));
      pack_p<BN>(s, pa);
    }
    mbar_arrive(bar_q_empty(qb));  // this warpgroup's S products of the tile are all done: Q may be refilled
    {  // the last tile's P V
      const int vs = (kv + t.n_kt - 1) % VS;
      mbar_wait(bar_full_v(vs), uint32_t(((kv + t.n_kt - 1) / VS) & 1));
      turn_wait();
      rescale_o(acc, alpha_prev);
      wgmma_fence();
      issue_pv(vs);
      turn_pass();
      wgmma_wait<0>();
      pin_pv_operands();
      mbar_arrive(bar_empty_v(vs));
    }
    if (ctid == 0) DS_TRACE_AT(w, 5 + map, clk64());
    kv += t.n_kt;

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
    // X as f32 halves: [4 warps][NACC / 8 float4][32 lanes][4]; thread (warp, lane) of both maps holds the same
    // elements of O, so map 2 reads what its counterpart in map 1 wrote.
    float4* xh = reinterpret_cast<float4*>(smem + T::X_OFF) + warp * (NACC / 8) * 32 + lane;
    if (map == 0) {  // O1 / l1 to map 2 in two halves, then on to the next tile
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        named_sync(h == 0 ? BAR_X_FREE : BAR_X_READ, 256);
#pragma unroll
        for (int q = 0; q < NACC / 8; ++q) {
          const int i = h * (NACC / 2) + 4 * q;
          xh[q * 32] = make_float4(acc[i] * inv_l[0], acc[i + 1] * inv_l[0], acc[i + 2] * inv_l[1], acc[i + 3] * inv_l[1]);
        }
        named_arrive(BAR_X_FULL, 256);
      }
    } else {  // map 2: O = O1/l1 - lambda O2/l2, RMS norm over 2d, bf16 tile into X, TMA store
      float ss[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        named_sync(BAR_X_FULL, 256);
#pragma unroll
        for (int q = 0; q < NACC / 8; ++q) {
          const int i = h * (NACC / 2) + 4 * q;
          const float4 o1 = xh[q * 32];
          acc[i] = o1.x - p.lambda * acc[i] * inv_l[0];
          acc[i + 1] = o1.y - p.lambda * acc[i + 1] * inv_l[0];
          acc[i + 2] = o1.z - p.lambda * acc[i + 2] * inv_l[1];
          acc[i + 3] = o1.w - p.lambda * acc[i + 3] * inv_l[1];
          ss[0] += acc[i] * acc[i] + acc[i + 1] * acc[i + 1];
          ss[1] += acc[i + 2] * acc[i + 2] + acc[i + 3] * acc[i + 3];
        }
        if (h == 0) named_arrive(BAR_X_READ, 256);
      }
      named_sync(BAR_MAP2, 128);  // every map-2 thread has read the second half: X takes the output tile
      float f[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
        ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
        f[r] = rsqrtf(ss[r] * (1.f / VW) + p.eps) * p.out_scale;
      }
      stage_out_tile(acc, f, sX, wrow + g4, t4);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      named_sync(BAR_MAP2, 128);
      if (warp == 0) {
        if (lane == 0) {
#pragma unroll
          for (int sl = 0; sl < VW / 64; ++sl)
            asm volatile(
                "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                    reinterpret_cast<uint64_t>(&tm_out)),
                "r"(t.j * VW + sl * 64), "r"(t.q0), "r"(t.b), "r"(sX + uint32_t(sl * BM * 128))
                : "memory");
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
          asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
          if (p.head_ns) atomicAdd(p.head_ns + t.j, global_timer_ns() - t_start);
          DS_TRACE_AT(w, 7, clk64());
        }
      }
      named_sync(BAR_MAP2, 128);  // the TMA store has read X
      named_arrive(BAR_X_FREE, 256);  // X may take the next tile's O1
    }
  }
  if (map == 0) {  // the hand-overs map 2 made after its last tile
    named_sync(BAR_SCHED0, 256);
    named_sync(BAR_X_FREE, 256);
  }
#else
  __trap();
#endif
}

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    cudaGetLastError();
  });
  return fn;
}

// A [batch][n][row_stride] bf16 tensor (the QKV input or the output) as a 3-D TMA map (column, token, batch) with
// boxes of 64 columns x rows tokens, 128-byte swizzle; loads of tokens past n read zeros, stores there are dropped.
bool make_map(CUtensorMap& m, const bf16* base, int64_t row_stride, int64_t batch_stride, const AttnParams& p,
              int rows) {
  auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[3] = {cuuint64_t(row_stride), cuuint64_t(p.n), cuuint64_t(p.batch)};
  const cuuint64_t bstride = p.batch > 1 ? cuuint64_t(batch_stride) : cuuint64_t(p.n) * cuuint64_t(row_stride);
  const cuuint64_t strides[2] = {cuuint64_t(row_stride) * 2, bstride * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(rows), 1}, estride[3] = {1, 1, 1};
  return fn(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(base), dims, strides, box, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#if defined(DS_ATTN_TRACE)
// Dumps the trace of the 400th launch of each shape (warm, not the first) to $DS_ATTN_TRACE_OUT, one line per CTA.
void trace_dump(const AttnParams& p, unsigned ctas, cudaStream_t stream) {
  static std::map<std::tuple<int, int, int>, int> launches;
  const char* path = std::getenv("DS_ATTN_TRACE_OUT");
  if (!path || ++launches[{p.n, p.batch, p.d}] != 400 || ctas > unsigned(TRACE_CTAS)) return;
  std::vector<unsigned long long> h(size_t(ctas) * TRACE_SLOTS);
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpyFromSymbol(h.data(), g_trace, h.size() * sizeof(h[0])) != cudaSuccess)
    return;
  FILE* f = std::fopen(path, "a");
  if (!f) return;
  std::fprintf(f, "# n %d batch %d d %d heads %d ctas %u qtiles %d\n", p.n, p.batch, p.d, p.heads, ctas,
               (p.n + BM - 1) / BM);
  for (unsigned c = 0; c < ctas; ++c) {
    for (int k = 0; k < TRACE_SLOTS; ++k) std::fprintf(f, "%llu%c", h[size_t(c) * TRACE_SLOTS + k], k + 1 < TRACE_SLOTS ? ' ' : '\n');
  }
  std::fclose(f);
}
#endif

bool tma_store_on() {
  static const bool on = [] {
    const char* e = std::getenv("DS_ATTN_WS_TMA_STORE");
    return !(e && e[0] == '0');
  }();
  return on;
}

template <int D, int BN>
cudaError_t launch_t(const AttnParams& p, cudaStream_t stream) {
  CUtensorMap tq, tkv, tout;
  if (!make_map(tq, p.qkv, p.row_stride, p.batch_stride, p, BM) ||
      !make_map(tkv, p.qkv, p.row_stride, p.batch_stride, p, BN) ||
      !make_map(tout, p.out, p.out_row_stride, p.out_batch_stride, p, BM))
    return cudaErrorNotSupported;
  const char* xs = std::getenv("DS_WS_EXTRA_SMEM");
  const int smem = TileWs<D, BN>::SMEM_BYTES + (xs && xs[0] == '1' ? 64 * 1024 : 0);
  const auto kernel =
      tma_store_on() ? diff_attn_fwd_sm90_ws_kernel<D, BN, true> : diff_attn_fwd_sm90_ws_kernel<D, BN, false>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned((p.n + BM - 1) / BM), unsigned((p.heads / 2) * p.batch));
  kernel<<<grid, THREADS, smem, stream>>>(tq, tkv, tout, p);
#if defined(DS_ATTN_TRACE)
  trace_dump(p, grid.x * grid.y, stream);
#endif
  return cudaGetLastError();
}

int sm_count() {
  static int count[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (count[dev] == 0 && cudaDeviceGetAttribute(&count[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  return count[dev];
}

template <int D, int BN, int QB>
cudaError_t launch_p(const AttnParams& p, cudaStream_t stream) {
  CUtensorMap tq, tkv, tout;
  if (!make_map(tq, p.qkv, p.row_stride, p.batch_stride, p, BM) ||
      !make_map(tkv, p.qkv, p.row_stride, p.batch_stride, p, BN) ||
      !make_map(tout, p.out, p.out_row_stride, p.out_batch_stride, p, BM))
    return cudaErrorNotSupported;
  constexpr int smem = TileP<D, BN, QB>::SMEM_BYTES;
  cudaError_t e =
      cudaFuncSetAttribute(diff_attn_fwd_sm90_p_kernel<D, BN, QB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int total = (p.n + BM - 1) / BM * (p.heads / 2) * p.batch;
  const int grid = total < sm_count() ? total : sm_count();
  diff_attn_fwd_sm90_p_kernel<D, BN, QB><<<grid, THREADS, smem, stream>>>(tq, tkv, tout, p);
#if defined(DS_ATTN_TRACE)
  trace_dump(p, unsigned(total), stream);
#endif
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_diff_attn_fwd_sm90_persistent(const AttnParams& p, cudaStream_t stream, int block_n) {
  const char* e = std::getenv("DS_ATTN_P_QB");
  if (e && e[0] == '1') {
    if (p.d == 64) return block_n == 128 ? launch_p<64, 128, 1>(p, stream) : launch_p<64, 64, 1>(p, stream);
    if (p.d == 128) return launch_p<128, 64, 1>(p, stream);
  }
  if (p.d == 64) return block_n == 128 ? launch_p<64, 128, 2>(p, stream) : launch_p<64, 64, 2>(p, stream);
  if (p.d == 128) return launch_p<128, 64, 2>(p, stream);
  return cudaErrorInvalidValue;
}

bool diff_attn_fwd_sm90_ws_usable(const AttnParams& p) {
  const auto a = reinterpret_cast<uintptr_t>(p.qkv), o = reinterpret_cast<uintptr_t>(p.out);
  return encode_fn() != nullptr && a % 16 == 0 && (p.row_stride * 2) % 16 == 0 &&
         (p.batch <= 1 || (p.batch_stride * 2) % 16 == 0) && p.q_off % 8 == 0 && p.k_off % 8 == 0 &&
         p.v_off % 8 == 0 && p.batch_stride >= 0 && o % 16 == 0 && (p.out_row_stride * 2) % 16 == 0 &&
         (p.batch <= 1 || (p.out_batch_stride * 2) % 16 == 0) && p.out_batch_stride >= 0;
}

cudaError_t launch_diff_attn_fwd_sm90_ws(const AttnParams& p, cudaStream_t stream, int block_n) {
  if (p.d == 64) return block_n == 128 ? launch_t<64, 128>(p, stream) : launch_t<64, 64>(p, stream);
  if (p.d == 128) return launch_t<128, 64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
