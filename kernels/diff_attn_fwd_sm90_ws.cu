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
#include <mutex>
#include <type_traits>

#ifndef DS_WS_SPLIT_EPI
#define DS_WS_SPLIT_EPI 0
#endif

#include "mma_sm80.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_SM90A_WS 1
#include "diff_attn_sm90_common.cuh"
#endif

namespace ds::kern {
namespace {

constexpr int BM = 64, THREADS = 384, KS = 2, VS = 2;

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
constexpr int BAR_CONSUMERS = 1, BAR_SCHED0 = 2;  // named barriers (0 is __syncthreads)

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

template <int D, int BN>
__global__ void __launch_bounds__(THREADS, 1)
    diff_attn_fwd_sm90_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                                 const AttnParams p) {
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
  float alpha_prev[2] = {1.f, 1.f};
  {  // tile 0: the diagonal one, masked; peeled so that no wgmma is issued conditionally in the loop
    float s[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      s[i] = 0.f;
      pin(s[i]);
    }
    mbar_wait(bar_full_k(0), 0);
    turn_wait();
    wgmma_fence();
    issue_s(s, 0);
    turn_pass();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < NS; ++i) pin(s[i]);
    mbar_arrive(bar_empty_k(0));
    const int kt = n_kt - 1;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kt * BN + nt * 8 + 2 * t4 + (e & 1);
        const int row = q0 + wrow + g4 + (e >> 1) * 8;
        if (col > row) s[nt * 4 + e] = -INFINITY;
      }
    softmax(s, alpha_prev);  // O is zero: no rescale
    alpha_prev[0] = alpha_prev[1] = 1.f;
    pack(s);
  }
  // Per iteration: wait K(it) | my turn | issue S(it) | rescale O (overlaps S) | wait V(it-1) | issue P(it-1) V(it-1)
  // | pass the turn | wait S, free K(it) | softmax(it) while P V runs | wait P V, free V(it-1) | pack P(it).
  for (int it = 1; it < n_kt; ++it) {
    const int ks = it % KS, vs = (it - 1) % VS;
    float s[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      s[i] = 0.f;
      pin(s[i]);
    }
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

  // Epilogue: map 2 stages O2 / l2 in the K stages (every S product of both maps is done: map 2 passed its last
  // turn, which map 1 handed over after its own last S had completed), map 1 combines, normalises and stores.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
#if DS_WS_SPLIT_EPI
  // Both warpgroups finish: map 1 the output columns [0, d), map 2 [d, 2d). Each stages the other's half of its
  // O/l (32 KB each, in the K stages), then the per-row partial sums of squares (in the Q tile).
  constexpr int H = NACC / 2;
  named_sync(BAR_CONSUMERS, 256);  // every product of both maps is done: K stages and Q are free
  float* stage = reinterpret_cast<float*>(smem + T::K_OFF);
  float* part = reinterpret_cast<float*>(smem);
  auto finish = [&](auto keep_c) {
    constexpr int KEEP = decltype(keep_c)::value, SEND = H - KEEP;
    float* to_other = stage + (map == 0 ? 0 : 4 * H * 32) + warp * H * 32;
#pragma unroll
    for (int i = 0; i < H; ++i) to_other[i * 32 + lane] = acc[SEND + i] * inv_l[(i >> 1) & 1];
    named_sync(BAR_CONSUMERS, 256);
    const float* from_other = stage + (map == 0 ? 4 * H * 32 : 0) + warp * H * 32;
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float mine = acc[KEEP + i] * inv_l[(i >> 1) & 1], other = from_other[i * 32 + lane];
      const float o = KEEP == 0 ? mine - p.lambda * other : other - p.lambda * mine;
      acc[KEEP + i] = o;
      ss[(i >> 1) & 1] += o * o;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
      ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
      part[(map * 4 + warp) * 64 + r * 32 + lane] = ss[r];
    }
    named_sync(BAR_CONSUMERS, 256);
    float f[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      f[r] = rsqrtf((ss[r] + part[((map ^ 1) * 4 + warp) * 64 + r * 32 + lane]) * (1.f / VW) + p.eps) * p.out_scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + wrow + g4 + 8 * r;
      if (row < p.n) {
        bf16* o = p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride + int64_t(j) * VW + 2 * t4;
#pragma unroll
        for (int nt = KEEP / 4; nt < (KEEP + H) / 4; ++nt)
          *reinterpret_cast<uint32_t*>(o + nt * 8) =
              pack_bf16x2(acc[nt * 4 + 2 * r] * f[r], acc[nt * 4 + 2 * r + 1] * f[r]);
      }
    }
  };
  if (map == 0) finish(std::integral_constant<int, 0>{});
  else finish(std::integral_constant<int, H>{});
  if (map == 0 && p.head_ns && ctid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
#else
  float* sO2 = reinterpret_cast<float*>(smem + T::K_OFF);  // [4 warps][NACC][32 lanes]
  if (map == 1) {
    float* dst = sO2 + warp * NACC * 32;
#pragma unroll
    for (int i = 0; i < NACC; ++i) dst[i * 32 + lane] = acc[i] * inv_l[(i >> 1) & 1];
  }
  named_sync(BAR_CONSUMERS, 256);
  if (map == 0) {
    combine_store(acc, inv_l, sO2 + warp * NACC * 32, lane, p, b, j, q0 + wrow + g4, t4);
    if (p.head_ns && ctid == 0) atomicAdd(p.head_ns + j, global_timer_ns() - t_start);
  }
#endif
#else
  __trap();  // built without sm_90a: never launched (diff_attn_fwd_sm90_available() is false)
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

// The [batch][n][row_stride] bf16 tensor as a 3-D TMA map (column, token, batch) with boxes of 64 columns x rows
// tokens, 128-byte swizzle; tokens past n read as zeros.
bool make_map(CUtensorMap& m, const AttnParams& p, int rows) {
  auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[3] = {cuuint64_t(p.row_stride), cuuint64_t(p.n), cuuint64_t(p.batch)};
  const cuuint64_t bstride = p.batch > 1 ? cuuint64_t(p.batch_stride) : cuuint64_t(p.n) * cuuint64_t(p.row_stride);
  const cuuint64_t strides[2] = {cuuint64_t(p.row_stride) * 2, bstride * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(rows), 1}, estride[3] = {1, 1, 1};
  return fn(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(p.qkv), dims, strides, box, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int D, int BN>
cudaError_t launch_t(const AttnParams& p, cudaStream_t stream) {
  CUtensorMap tq, tkv;
  if (!make_map(tq, p, BM) || !make_map(tkv, p, BN)) return cudaErrorNotSupported;
  constexpr int smem = TileWs<D, BN>::SMEM_BYTES;
  cudaError_t e =
      cudaFuncSetAttribute(diff_attn_fwd_sm90_ws_kernel<D, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned((p.n + BM - 1) / BM), unsigned((p.heads / 2) * p.batch));
  diff_attn_fwd_sm90_ws_kernel<D, BN><<<grid, THREADS, smem, stream>>>(tq, tkv, p);
  return cudaGetLastError();
}

}  // namespace

bool diff_attn_fwd_sm90_ws_usable(const AttnParams& p) {
  const auto a = reinterpret_cast<uintptr_t>(p.qkv);
  return encode_fn() != nullptr && a % 16 == 0 && (p.row_stride * 2) % 16 == 0 &&
         (p.batch <= 1 || (p.batch_stride * 2) % 16 == 0) && p.q_off % 8 == 0 && p.k_off % 8 == 0 &&
         p.v_off % 8 == 0 && p.batch_stride >= 0;
}

cudaError_t launch_diff_attn_fwd_sm90_ws(const AttnParams& p, cudaStream_t stream, int block_n) {
  if (p.d == 64) return block_n == 128 ? launch_t<64, 128>(p, stream) : launch_t<64, 64>(p, stream);
  if (p.d == 128) return launch_t<128, 64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ds::kern
