// Fused causal attention forward for Hopper (sm_90a), differential or plain, warp-specialised in the manner of
// FlashAttention-3: wgmma S = Q K^T from shared memory, online softmax in registers, O += P V with P from registers.
//   - a producer warpgroup: one thread issues TMA tile loads (cp.async.bulk.tensor, 128-byte swizzle, rows past n
//     zero-filled by the copy engine) into mbarrier-guarded stages, then gives its registers away (setmaxnreg);
//   - two consumer warpgroups on the same 64 query rows, 240 registers each. DIFF: map 1 and map 2 of differential
//     head j, both against the one 2d-wide V tile [V_g | V_{Hkv/2+g}]. Plain: query heads 2j and 2j+1, each against
//     its own d-wide half of the V stage [V of head 2j | V of head 2j+1] (so a plain head is the same pipeline with
//     one map and half the P V work, and the Transformer twin of a DIFF model is timed on the same kernel);
//   - K stages (both maps' K of a tile) and V stages are separate pipelines: a K stage is free once both S products
//     are done, a V stage once both P V products are done; nothing waits on a CTA-wide barrier;
//   - ping-pong: the two consumers take turns issuing their products (named barriers 2 and 3), so one warpgroup's
//     softmax runs while the other's wgmmas use the tensor cores;
//   - epilogue, DIFF: map 1 hands O1/l1 to map 2 through shared memory while map 2's last product runs; map 2 forms
//     (1 - lambda_init) RMSNorm_2d(O1/l1 - lambda O2/l2), stages the bf16 tile and one thread stores it with TMA.
//     Plain: each warpgroup stages O/l of its head in its own Q area and stores it with TMA.
// Why: with every thread issuing cp.async and both warpgroups meeting at __syncthreads once per tile the tensor pipe
// was busy 39% of the time; a ping-pong with a private K/V copy per warpgroup gained the ordering (+8-12%) but lost
// more to the second V copy, so V is loaded once (bench/cuda_notes.md; bench/EXPERIMENTS.md lists what was tried).
// Row maxima (FIXMAX, the default): the first pass keeps each row's maximum where the diagonal tile (always the
// first, and holding the row's own key) leaves it, so the later tiles take no maximum, no shuffles and no O
// rescale: their exponentials may exceed 1, which f32 and bf16 carry with the same relative precision up to 2^128.
// After the pass both warpgroups check l and O; if any element is not finite (a score more than ~128 in log2 units
// above the diagonal tile's maximum, or inf/NaN in the inputs) the CTA runs the exact pass of online_softmax (the
// producer reloads the tiles after the verdict barrier). Measured at 32K tokens (Phi-4-mini-flash's full layers,
// H100): 611-627 against 540-543 TFLOP/s (bench/results/RESULTS.md, session 27). AttnParams::fixed_max = false
// (DS_ATTN_FIXMAX=0): the exact pass alone.
// Sliding window (AttnParams::window): the producer's and the consumers' descent over the key tiles ends at the tile
// of the CTA's first row's first key; the diagonal tile's mask also takes the window's lower edge, and the (at most
// two) tiles below it that cross that edge take it alone; every other tile runs as without a window. K and V: TMA
// boxes from a tensor map over AttnParams::kv when it is set (kv_base), Q from qkv.
// Shared memory (1024-byte aligned, all tiles [64-column slabs][rows][64] with the SW128 XOR, which is what a TMA
// box of 64 columns x rows with CU_TENSOR_MAP_SWIZZLE_128B writes): Q of both maps, KS K stages, VS V stages,
// then the mbarriers. d = 128: 32 + 2 x 32 + 2 x 32 KB = 160 KB.
#include "attn_fwd_sm90.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "mma_sm80.cuh"
#include "tma_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_SM90A_WS 1
#include "attn_sm90_common.cuh"
#endif

namespace ds::kern {
namespace {

constexpr int BM = 64, THREADS = 384, KS = 2, VS = 2;

// Shared-memory plan, the same for both modes (plain: the two maps are two heads, and V's halves their Vs).
template <int D, int BN>
struct TileWs {
  static constexpr int VW = 2 * D;
  static constexpr int Q_BYTES = 2 * BM * D * 2;
  static constexpr int K_STAGE_BYTES = 2 * BN * D * 2;  // K1 and K2
  static constexpr int V_STAGE_BYTES = BN * VW * 2;
  static constexpr int K_OFF = Q_BYTES, V_OFF = K_OFF + KS * K_STAGE_BYTES, BAR_OFF = V_OFF + VS * V_STAGE_BYTES;
  static constexpr int N_BARS = 2 + 2 * KS + 2 * VS;  // Q, K full/empty, V full/empty, the fixed-maximum verdict
  static constexpr int FLAG_OFF = BAR_OFF + N_BARS * 8;  // the verdict: 1 when the CTA runs its tiles again
  static constexpr int SMEM_BYTES = FLAG_OFF + 8 + 1024;  // + alignment slack
  static_assert(BM * VW * 4 <= KS * K_STAGE_BYTES, "O1/l1 (DIFF) must fit in the K stages");
  static_assert(BM * VW * 2 <= Q_BYTES, "the bf16 output tile must fit in Q's space");
  static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
};

#if defined(DS_SM90A_WS)
// Named barriers (0 is __syncthreads): both consumers; the turn of map 1 and map 2; a consumer's own 128 threads.
constexpr int BAR_CONSUMERS = 1, BAR_SCHED0 = 2, BAR_EPILOGUE0 = 4;

using namespace sm90;
#endif

#if defined(DS_SM90A_WS)
// The quantised rows' largest |logit|, staged by attn_row_absmax_kernel in the row's own output columns: view head
// j's map m at column j * 2d + m * d of the output row (the columns the attention kernel's CTA of j writes last, as a
// float; launch_t checks the alignment). Rows past n: 0 (their output is never stored).
__device__ __forceinline__ float* absmax_slot(const AttnParams& p, int b, int row, int j, int m) {
  return reinterpret_cast<float*>(p.out + int64_t(b) * p.out_batch_stride + int64_t(row) * p.out_row_stride +
                                  int64_t(j) * 2 * p.d + int64_t(m) * p.d);
}
__device__ __forceinline__ float staged_absmax(const AttnParams& p, int b, int row, int j, int m) {
  return row < p.n ? *absmax_slot(p, b, row, j, m) : 0.f;
}
#endif

// WINDOW: built for a sliding window (p.window > 0). The build without is the kernel as it was before windows
// existed: with the window's loop bound and masks at run time, ptxas scheduled the loop differently and the
// differential kernel measured 2-3% slower at window 0 (H100, n = 8192). FIXMAX: the fixed-maximum first pass (above).
// QUANT: quantised logits (AttnParams::logit_bits, the paper's Figure 8 what-if): a first pass over the key tiles
// (K alone, S = Q K^T, no softmax) finds each row's largest |logit| and largest logit; the softmax pass then rounds
// every logit to the row's step (quantize_logit) and starts from the row's exact (quantised) maximum, so that no O
// rescale is needed on any tile and the fixed-maximum pass never overflows. Built without WINDOW (a windowed layer
// takes the generic kernel when quantised) and with FIXMAX.
template <int D, int BN, bool DIFF, bool WINDOW, bool FIXMAX, bool QUANT = false>
__global__ void __launch_bounds__(THREADS, 1)
    attn_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                                 const __grid_constant__ CUtensorMap tm_out, const AttnParams p) {
#if defined(DS_SM90A_WS)
  using T = TileWs<D, BN>;
  constexpr int NS = BN / 2;  // S accumulators per thread
  constexpr int VW = T::VW, SLABS = D / 64;
  constexpr int NACC = DIFF ? VW / 2 : D / 2;  // O accumulators per thread: 64 rows x 2d (DIFF) or x d (plain)
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
  const uint32_t bar_verdict = bar_q + 8u * uint32_t(1 + 2 * KS + 2 * VS);
  volatile uint32_t* const redo_flag = reinterpret_cast<volatile uint32_t*>(smem + T::FLAG_OFF);
  // The quantised kernel's first pass (K alone) keeps four key tiles in flight: its tile it goes to slot it % 4, the
  // two K stages (slots 0, 1) and the two V stages (slots 2, 3: no V is loaded before the softmax pass, and a V stage
  // holds a K stage's bytes). With the two K stages alone that pass waited on its loads (a quantised 32K-token
  // forward took 2.17x the plain one on the H200, against 1.65x now). Each pipeline's use count goes on from the first
  // pass's uses (pre_k, pre_v).
  struct PreSlot {
    uint32_t smem, full, empty, phase;
  };
  auto pre_slot = [&](int it) {
    const int sl = it % 4, st = sl & 1;  // st: the stage in its pipeline; that pipeline's use (it / 4) * 2 + st
    const bool v = sl >= 2;
    return PreSlot{v ? sV + uint32_t(st * T::V_STAGE_BYTES) : sK + uint32_t(st * T::K_STAGE_BYTES),
                   v ? bar_full_v(st) : bar_full_k(st), v ? bar_empty_v(st) : bar_empty_k(st), uint32_t((it / 4) & 1)};
  };

  const int tid = threadIdx.x, wg = tid >> 7;
  const int hv = p.heads / 2;  // CTAs per query tile and sequence: differential heads, or pairs of plain heads
  const CtaTile ct = cta_tile(int(blockIdx.x), (p.n + BM - 1) / BM, hv * p.batch, p.tile_major);
  const int qt = ct.qt, j = ct.bh % hv, b = ct.bh / hv;
  // Map m's query head and kv head (K, and V's half m): attn_heads.h's mapping of differential head j, or plain
  // head 2j + m.
  int qh[2], kvh[2];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const ViewHeadMap hm = view_head_map(DIFF, DIFF ? j : 2 * j + m, p.heads, p.kv_heads);
    qh[m] = DIFF ? hm.q[m] : hm.q[0];
    kvh[m] = DIFF ? hm.k[m] : hm.k[0];
  }
  const int q0 = qt * BM;
  const int kt_top = (q0 + BM - 1) / BN;  // the key tile holding the diagonal
  // from it down to the tile of the first row's first key
  const int n_kt = WINDOW ? kt_top - window_first_key(p.window, q0) / BN + 1 : kt_top + 1;
  // QUANT: the rows' largest |logit| from the row-maximum kernel (p.absmax_staged), else from the first pass here
  const bool pre_pass = QUANT && !p.absmax_staged;
  // K and V stage uses of the quantised kernel's first pass (pre_slot)
  const int pre_k = pre_pass ? (n_kt / 4) * 2 + min(n_kt % 4, 2) : 0;
  const int pre_v = pre_pass ? (n_kt / 4) * 2 + max(n_kt % 4 - 2, 0) : 0;

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
    mbar_init(bar_verdict, 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // producer: one thread issues every copy, the rest of the warpgroup leaves at once
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (tid == 0) {
      prefetch_tensormap(&tm_q);
      prefetch_tensormap(&tm_kv);
      prefetch_tensormap(&tm_out);
      // Tensor coordinates (column, token, batch); head h's D columns start at off + h * D, 64 per box.
      mbar_expect_tx(bar_q, T::Q_BYTES);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int sl = 0; sl < SLABS; ++sl)
          tma_load_3d(sQ + uint32_t((m * SLABS + sl) * BM * 128), &tm_q,
                      int(p.q_off) + qh[m] * D + sl * 64, q0, b, bar_q);
      // One pass over the key tiles; a pass's loads continue the stages' use counts uk (K) and uv (V), and so their
      // phases. with_v false: K alone (the quantised kernel's first pass).
      auto produce = [&](const int uk0, const int uv0, const bool with_v) {
        for (int it = 0; it < n_kt; ++it) {
          const int k0 = (kt_top - it) * BN, uk = uk0 + it, u = uv0 + it;
          const int ks = uk % KS, vs = u % VS;
          // stage use u waits for the consumers' release of use u - 1 (phase u - 1); use 0 passes at once
          mbar_wait(bar_empty_k(ks), uint32_t(((uk / KS) & 1) ^ 1));
          mbar_expect_tx(bar_full_k(ks), T::K_STAGE_BYTES);
          const uint32_t dk = sK + uint32_t(ks * T::K_STAGE_BYTES);
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
              tma_load_3d(dk + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                          int(p.k_off) + kvh[m] * D + sl * 64, k0, b, bar_full_k(ks));
          if (!with_v) continue;
          mbar_wait(bar_empty_v(vs), uint32_t(((u / VS) & 1) ^ 1));
          mbar_expect_tx(bar_full_v(vs), T::V_STAGE_BYTES);
          const uint32_t dv = sV + uint32_t(vs * T::V_STAGE_BYTES);
#pragma unroll
          for (int m = 0; m < 2; ++m)  // [V of map 1 | V of map 2]: 2 SLABS slabs of 64 columns
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
              tma_load_3d(dv + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                          int(p.v_off) + kvh[m] * D + sl * 64, k0, b, bar_full_v(vs));
        }
      };
      if (pre_pass)  // the first pass: K alone, four tiles in flight (pre_slot)
        for (int it = 0; it < n_kt; ++it) {
          const PreSlot ps = pre_slot(it);
          mbar_wait(ps.empty, ps.phase ^ 1u);
          mbar_expect_tx(ps.full, T::K_STAGE_BYTES);
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
              tma_load_3d(ps.smem + uint32_t((m * SLABS + sl) * BN * 128), &tm_kv,
                          int(p.k_off) + kvh[m] * D + sl * 64, (kt_top - it) * BN, b, ps.full);
        }
      produce(pre_k, pre_v, true);
      if constexpr (FIXMAX) {  // the consumers' verdict on the fixed maxima: the same tiles again, or done
        mbar_wait(bar_verdict, 0);
        if (*redo_flag) produce(pre_k + n_kt, pre_v + n_kt, true);
      }
    }
    return;
  }

  // Consumers: warpgroup 1 computes map 1 (plain: head 2j), warpgroup 2 map 2 (plain: head 2j + 1).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int map = wg - 1, ctid = tid - 128 * wg, warp = ctid >> 5, lane = tid & 31;
  const int wrow = warp * 16, g4 = lane >> 2, t4 = lane & 3;
  unsigned long long t_start = 0;
  if (p.head_ns && ctid == 0 && (map == 1 || !DIFF)) t_start = global_timer_ns();

  float acc[NACC];
  float m_run[2], l_run[2];
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_base = sQ + uint32_t(map * BM * D * 2);
  uint32_t pa[BN / 16][4];  // P of the previous tile, bf16: the A operand of the P V product in flight

  // Turn-taking: this warpgroup waits for its turn (barrier BAR_SCHED0 + map: its own 128 threads plus the
  // other warpgroup's 128 arrivals) before issuing a tile's products and hands the turn over after issuing.
  // Map 2 gives map 1 the first turn; both take n_kt + 1 turns per pass, and map 2 skips its last hand-over so
  // that every barrier phase is complete when a pass ends.
  auto turn_wait = [&]() { named_sync(BAR_SCHED0 + map, 256); };
  auto turn_pass = [&]() { named_arrive(BAR_SCHED0 + (map ^ 1), 256); };

  auto issue_s = [&](float (&s)[NS], int ks) { issue_qk<D, BN>(s, q_base, sK + uint32_t(ks * T::K_STAGE_BYTES + map * BN * D * 2)); };
  // DIFF: both maps against the whole 2d-wide V stage; plain: this head's d-wide half of it.
  const uint32_t v_half = DIFF ? 0u : uint32_t(map * SLABS * BN * 128);
  auto issue_pv = [&](int vs) { sm90::issue_pv<NACC, BN>(acc, pa, sV + uint32_t(vs * T::V_STAGE_BYTES) + v_half); };
  auto softmax = [&](float (&s)[NS], float (&alpha)[2]) { online_softmax<NS, true>(s, m_run, l_run, sl2, alpha); };
  auto rescale = [&](const float (&alpha)[2]) { rescale_o(acc, alpha); };
  auto pack = [&](float (&s)[NS]) { pack_p<BN>(s, pa); };

  // Sliding window: tiles from iteration edge_it on hold keys left of some row's window (first key k0 < q0 + BM -
  // window, the first key of the CTA's last row) and take the window's mask.
  const int wlo = window_lo_offset(p.window), last_first = q0 + BM - p.window;
  const int edge_it = p.window > 0 && last_first > 0 ? kt_top - (last_first - 1) / BN : n_kt;
  const int row0 = q0 + wrow + g4;

  mbar_wait(bar_q, 0);
  // QUANT: the first pass (S alone) for each row's largest |logit| (the quantisation step), over the tiles of
  // pre_slot. Both warpgroups issue their products without turns. (A second S register set, to issue the next tile's
  // product before reading this one's, made ptxas serialise every wgmma of the kernel for want of registers.) The
  // softmax pass then holds each row's maximum at its quantised |logit| maximum, which no quantised logit exceeds
  // (the rounding is monotone): one max a logit here instead of two (the row's signed maximum as well; 8-bit logits
  // at 32K, kajuma shape: 375 -> 354 ms a forward). A row whose largest logit lies so far below its largest |logit| (a large negative outlier) that its
  // exponentials would underflow fails the verdict below (l < 2^-60) and takes the exact pass.
  float q_step[2] = {0.f, 0.f}, q_inv[2] = {0.f, 0.f}, q_max[2] = {-INFINITY, -INFINITY}, q_sl2[2] = {0.f, 0.f};
  // A logit of row half r to its step, in units of the step: x / step rounded half to even. x times 1 / step plus
  // 1.5 * 2^23 in one FMA (the exact product rounded once, to an integer: |x / step| is at most 2^15 - 1), minus it
  // again, on the FMA pipe (rintf is a conversion-class instruction, which shares its unit with the softmax's exp2 and
  // made the quantised pass that unit's bottleneck). The multiply by 1 / step may round the other way than
  // quantize_logit's division within an ulp of a midpoint.
  auto steps = [&](const float x, const int r) {
    constexpr float kRound = 12582912.f;  // 1.5 * 2^23
    return __fadd_rn(__fmaf_rn(x, q_inv[r], kRound), -kRound);
  };
  auto quantized = [&](const float x, const int r) { return __fmul_rn(steps(x, r), q_step[r]); };
  if constexpr (QUANT) {
    // Four partial maxima a row (of every fourth pair of columns): chains of NS / 8 dependent max instructions
    // instead of NS / 2 (two warps a scheduler hide little latency). Only the diagonal tile holds -inf (masked keys),
    // so only it tests for them; the other tiles' |x| is an operand modifier of the max.
    float amax4[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int q = 0; q < 4; ++q) amax4[r][q] = 0.f;
    for (int it = 0; it < (pre_pass ? n_kt : 0); ++it) {
      const PreSlot ps = pre_slot(it);
      float s[NS];
      zero_pinned(s);
      mbar_wait(ps.full, ps.phase);
      wgmma_fence();
      issue_qk<D, BN>(s, q_base, ps.smem + uint32_t(map * BN * D * 2));
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      mbar_arrive(ps.empty);
      if (it == 0) {
        mask_diagonal<false>(s, kt_top * BN, row0, t4, 0);  // -inf: no |logit|
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          const int r = (i >> 1) & 1, q = (i >> 2) & 3;
          amax4[r][q] = fmaxf(amax4[r][q], s[i] == -INFINITY ? 0.f : fabsf(s[i]));
        }
      } else {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          const int r = (i >> 1) & 1, q = (i >> 2) & 3;
          amax4[r][q] = fmaxf(amax4[r][q], fabsf(s[i]));
        }
      }
    }
    const float levels = float((1 << (p.logit_bits - 1)) - 1);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float amax = fmaxf(fmaxf(amax4[r][0], amax4[r][1]), fmaxf(amax4[r][2], amax4[r][3]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      if (!pre_pass) amax = staged_absmax(p, b, row0 + 8 * r, j, map);
      // quantize_logit's step (a row whose logits are all 0 keeps step and 1 / step at 0: its logits stay 0); the
      // softmax's fixed maximum is the quantised |logit| maximum in the later tiles' units (steps times q_sl2)
      if (amax > 0.f) q_step[r] = amax / levels, q_inv[r] = 1.f / q_step[r];
      q_sl2[r] = q_step[r] * sl2;
      q_max[r] = steps(amax, r) * q_sl2[r];
    }
  }
  // Every logit of a tile to its row's step (quantized). MASKED: the tile holds -inf (masked keys), which must stay
  // -inf in a row of step 0. The quantised maximum (q_max) comes from the same formula: its rounding is monotone.
  auto quantize = [&](float (&s)[NS], const bool masked) {
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const float x = quantized(s[i], (i >> 1) & 1);
      if (!masked || s[i] != -INFINITY) s[i] = x;
    }
  };
  // The fixed-maximum pass's later tiles: each logit in steps, and the softmax's scale per row (q_sl2) takes the
  // multiply by the step (one instruction a logit less); P = 2^(steps * step * sl2 - q_max), q_max in the same units.
  auto softmax_steps = [&](float (&s)[NS]) {
    float rs[2];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int r = (i >> 1) & 1;
      s[i] = ex2_ftz(fmaf(steps(s[i], r), q_sl2[r], -q_max[r]));
    }
    rows_tree(s, rs, add_op);
    l_run[0] += rs[0];
    l_run[1] += rs[1];
  };
  // One pass over the CTA's key tiles, the diagonal one first. Stage uses u = u0 + it (V) and uk0 + it (K, after the
  // quantised kernel's first pass) set the stages and phases (a second pass continues the first's counts). FIXED: the
  // row maxima stay at the diagonal tile's (no maximum, no shuffles and no O rescale on later tiles); the exponentials
  // of later scores above them exceed 1, and if they overflow, the verdict after the pass sends the CTA through the
  // exact pass. Else the running maximum of online_softmax.
  auto run_pass = [&](auto fixed_tag, const int u0, const int uk0) {
    constexpr bool FIXED = decltype(fixed_tag)::value;
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    // -inf, or the quantised kernel's row maxima (its fixed pass; the exact pass starts from -inf: a maximum above
    // the row's largest logit would underflow there as well)
    m_run[0] = FIXED ? q_max[0] : -INFINITY, m_run[1] = FIXED ? q_max[1] : -INFINITY;
    l_run[0] = l_run[1] = 0.f;
    if (map == 1) named_arrive(BAR_SCHED0, 256);
    float alpha_prev[2] = {1.f, 1.f};
    {  // tile 0: the diagonal one, masked; peeled so that no wgmma is issued conditionally in the loop
      const int ks = uk0 % KS;
      float s[NS];
      zero_pinned(s);
      mbar_wait(bar_full_k(ks), uint32_t((uk0 / KS) & 1));
      turn_wait();
      wgmma_fence();
      issue_s(s, ks);
      turn_pass();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      mbar_arrive(bar_empty_k(ks));
      mask_diagonal<WINDOW>(s, kt_top * BN, row0, t4, wlo);
      if constexpr (QUANT) quantize(s, true);
      softmax(s, alpha_prev);  // O is zero: no rescale
      alpha_prev[0] = alpha_prev[1] = 1.f;
      pack(s);
    }
    // Per iteration: wait K(it) | my turn | issue S(it) | rescale O (overlaps S) | wait V(it-1) | issue P(it-1)
    // V(it-1) | pass the turn | wait S, free K(it) | softmax(it) while P V runs | wait P V, free V(it-1) | pack P(it).
    for (int it = 1; it < n_kt; ++it) {
      const int u = u0 + it, uk = uk0 + it, ks = uk % KS, vs = (u - 1) % VS;
      float s[NS];
      zero_pinned(s);
      mbar_wait(bar_full_k(ks), uint32_t((uk / KS) & 1));
      turn_wait();
      wgmma_fence();
      issue_s(s, ks);
      if constexpr (!FIXED) rescale(alpha_prev);
      mbar_wait(bar_full_v(vs), uint32_t(((u - 1) / VS) & 1));
      wgmma_fence();
      issue_pv(vs);
      turn_pass();
      wgmma_wait<1>();  // S(it) done; P(it-1) V(it-1) may still run
#pragma unroll
      for (int i = 0; i < NS; ++i) pin(s[i]);
      mbar_arrive(bar_empty_k(ks));
      if constexpr (WINDOW)
        if (it >= edge_it) mask_window(s, (kt_top - it) * BN, row0, t4, wlo);
      if constexpr (QUANT && FIXED) {
        softmax_steps(s);
      } else {
        if constexpr (QUANT) quantize(s, false);
        if constexpr (FIXED) softmax_fixed_max<NS>(s, m_run, l_run, sl2);
        else softmax(s, alpha_prev);
      }
      wgmma_wait<0>();  // P(it-1) V(it-1) done: O and the A registers may be written
      pin_pv_operands(acc, pa);
      mbar_arrive(bar_empty_v(vs));
      pack(s);
    }
    {  // the last tile's P V
      const int u = u0 + n_kt - 1, vs = u % VS;
      mbar_wait(bar_full_v(vs), uint32_t((u / VS) & 1));
      turn_wait();
      if constexpr (!FIXED) rescale(alpha_prev);
      wgmma_fence();
      issue_pv(vs);
      if (map == 0) turn_pass();
      wgmma_wait<0>();
      pin_pv_operands(acc, pa);
      mbar_arrive(bar_empty_v(vs));
    }
    quad_sum(l_run);
  };
  int u_end = pre_k + n_kt;  // K stage uses so far
  if constexpr (FIXMAX) {
    run_pass(std::true_type{}, pre_v, pre_k);
    // The verdict: every l and O element of both warpgroups finite, or the exact pass. One bar.red over the 256
    // consumer threads; one thread tells the producer (its flag, then the verdict barrier's release).
    bool bad = !(isfinite(l_run[0]) && isfinite(l_run[1]));
    // QUANT: a row sum under 2^-60 (its largest exponential under 2^-77 at 128K keys) has lost terms to underflow
    if constexpr (QUANT) bad |= !(l_run[0] >= 0x1p-60f && l_run[1] >= 0x1p-60f);
#pragma unroll
    for (int i = 0; i < NACC; ++i) bad |= !isfinite(acc[i]);
    uint32_t any;
    asm volatile(
        "{\n .reg .pred pb, pa;\n setp.ne.u32 pb, %1, 0;\n bar.red.or.pred pa, %2, 256, pb;\n"
        " selp.u32 %0, 1, 0, pa;\n}\n"
        : "=r"(any)
        : "r"(uint32_t(bad)), "n"(BAR_CONSUMERS)
        : "memory");
    if (map == 0 && ctid == 0) {
      *redo_flag = any;
      mbar_arrive(bar_verdict);
    }
    if (any) {
      run_pass(std::false_type{}, pre_v + n_kt, pre_k + n_kt);
      u_end = pre_k + 2 * n_kt;
    }
  } else {
    run_pass(std::false_type{}, 0, 0);
  }

  const float inv_l[2] = {1.f / l_run[0], 1.f / l_run[1]};
  // The output tile goes out with TMA by one thread: whole 128-byte lines instead of 16-byte pieces of 8 rows per
  // store instruction; rows past n are clipped by the copy engine. `slabs` 64-column slabs staged at `src` go to
  // columns col0.. of rows q0.. of sequence b.
  auto store_tile = [&](uint32_t src, int col0, int slabs, int view_head) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    named_sync(BAR_EPILOGUE0 + map, 128);
    if (ctid == 0) {
      for (int sl = 0; sl < slabs; ++sl)
        asm volatile(
            "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                reinterpret_cast<uint64_t>(&tm_out)),
            "r"(col0 + sl * 64), "r"(q0), "r"(b), "r"(src + uint32_t(sl * BM * 128))
            : "memory");
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // shared memory must outlive the reads
      if (p.head_ns) atomicAdd(p.head_ns + view_head, global_timer_ns() - t_start);
    }
  };
  if constexpr (!DIFF) {
    // Plain: O/l of head 2j + map, staged in this warpgroup's own Q area (its S products are all done).
    stage_out_tile(acc, inv_l, q_base, wrow + g4, t4);
    store_tile(q_base, j * VW + map * D, SLABS, 2 * j + map);
    return;
  }
  // DIFF. Map 1 finishes first (it issues every tile's products first): it parks O1/l1 in the K stages as soon as
  // map 2's last S product is done (the last K stage's release completes), while map 2's last P V still runs. Map 2
  // then forms O = O1/l1 - lambda O2/l2, normalises over the 2d columns, writes the bf16 tile into Q's space (every
  // S product is done) and stores it. Per-CTA timestamps (bench/cuda_notes.md): 6.0k SM cycles from the end of the
  // loop to the stored tile with map 1 storing from registers.
  // [4 warps][NACC / 4][32 lanes] float4: thread (warp, lane) of both maps holds the same elements of O.
  float4* x = reinterpret_cast<float4*>(smem + T::K_OFF) + warp * (NACC / 4) * 32 + lane;
  const float2 c = head_coef(p, j);  // O = c1 O1/l1 - c2 O2/l2 (1 and lambda unless the head is edited)
  if (map == 0) {
    mbar_wait(bar_empty_k((u_end - 1) % KS), uint32_t(((u_end - 1) / KS) & 1));
    const float i0 = c.x * inv_l[0], i1 = c.x * inv_l[1];
#pragma unroll
    for (int q = 0; q < NACC / 4; ++q)
      x[q * 32] = make_float4(acc[4 * q] * i0, acc[4 * q + 1] * i0, acc[4 * q + 2] * i1, acc[4 * q + 3] * i1);
  }
  named_sync(BAR_CONSUMERS, 256);
  if (map == 1) {
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int q = 0; q < NACC / 4; ++q) {
      const float4 o1 = x[q * 32];
      float* o = acc + 4 * q;
      o[0] = o1.x - c.y * o[0] * inv_l[0];
      o[1] = o1.y - c.y * o[1] * inv_l[0];
      o[2] = o1.z - c.y * o[2] * inv_l[1];
      o[3] = o1.w - c.y * o[3] * inv_l[1];
      ss[0] += o[0] * o[0] + o[1] * o[1];
      ss[1] += o[2] * o[2] + o[3] * o[3];
    }
    float f[2];
    quad_rms_factors<VW>(ss, p.eps, p.out_scale, f);
    stage_out_tile(acc, f, sQ, wrow + g4, t4);
    store_tile(sQ, j * VW, VW / 64, j);
  }
#else
  __trap();  // built without sm_90a: never launched (select_attn checks attn_fwd_sm90_code_runs)
#endif
}


constexpr int AB_ROWS = 256, AB_THREADS = 4 * 128 + 32, AB_STAGES = 4;
// The row kernels' shared memory before a kernel's own data (Q, the K stages, the barriers; the launches add 1024 for
// the alignment), and their grid (RowTiles).
template <int D, int BN>
constexpr int row_tiles_bytes() {
  return AB_ROWS * D * 2 + AB_STAGES * BN * D * 2 + (1 + 2 * AB_STAGES) * 8;
}
inline unsigned row_tiles_ctas(const AttnParams& p) {
  return unsigned((p.n + AB_ROWS - 1) / AB_ROWS) * unsigned(p.heads * p.batch);
}

#if defined(DS_SM90A_WS)
// The pipeline of the row kernels (attn_row_absmax_kernel, attn_logit_pass_kernel): a CTA takes 256 rows of one
// query head's map (grid: query blocks, heaviest first, x (view head j, map m) x batch); thread 512 (the producer
// warp's first) loads the four 64-row Q boxes once and the K tiles of keys [kt0 BN, min(q0 + 256, n)) into
// AB_STAGES mbarrier-guarded stages; consumer warpgroup cw (threads 128 cw ..) takes rows q0 + 64 cw .. + 63 and for
// each tile up to its rows' last key gets S = Q K^T (the wgmma layout: this thread's rows row0 and row0 + 8, column
// kt BN + 8 (i >> 2) + 2 t4 + (i & 1) of s[i]). Shared memory from the 1024-aligned base: Q, the K stages, the
// barriers (row_tiles_bytes); a kernel's own data after them.
template <int D, int BN>
struct RowTiles {
  static constexpr int NS = BN / 2, SLABS = D / 64, Q_BYTES = AB_ROWS * D * 2, K_BYTES = BN * D * 2;
  uint32_t sQ, sK, bar_q;
  int j, m, b, qh, kvh, q0, kt0, n_kt;

  __device__ RowTiles(uint32_t base, const AttnParams& p, bool window) {
    sQ = base, sK = base + Q_BYTES, bar_q = sK + AB_STAGES * K_BYTES;
    const int hv = p.heads / 2, n_qb = (p.n + AB_ROWS - 1) / AB_ROWS, per_qb = 2 * hv * p.batch;
    const int qb = n_qb - 1 - int(blockIdx.x) / per_qb, rest = int(blockIdx.x) % per_qb;
    const int jm = rest % (2 * hv);
    j = jm >> 1, m = jm & 1, b = rest / (2 * hv);
    const ViewHeadMap hm = view_head_map(p.diff, p.diff ? j : 2 * j + m, p.heads, p.kv_heads);
    qh = p.diff && m ? hm.q[1] : hm.q[0], kvh = p.diff && m ? hm.k[1] : hm.k[0];  // (no indexed local array)
    q0 = qb * AB_ROWS;
    kt0 = window ? window_first_key(p.window, q0) / BN : 0;  // the tile of the CTA's first row's first key
    n_kt = min(q0 + AB_ROWS, p.n) / BN + (min(q0 + AB_ROWS, p.n) % BN != 0);  // tiles of keys < min(q0 + 256, n)
  }
  __device__ uint32_t bar_full(int st) const { return bar_q + 8u * uint32_t(1 + st); }
  __device__ uint32_t bar_empty(int st) const { return bar_q + 8u * uint32_t(1 + AB_STAGES + st); }
  // Thread 0, before the CTA's first barrier.
  __device__ void init() const {
    mbar_init(bar_q, 1);
    for (int st = 0; st < AB_STAGES; ++st) {
      mbar_init(bar_full(st), 1);
      mbar_init(bar_empty(st), 512);
    }
    fence_mbarrier_init();
  }
  // Thread 512: every copy.
  __device__ void produce(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, const AttnParams& p) const {
    prefetch_tensormap(tm_q);
    prefetch_tensormap(tm_kv);
    mbar_expect_tx(bar_q, Q_BYTES);
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int sl = 0; sl < SLABS; ++sl)
        tma_load_3d(sQ + uint32_t(c * 64 * D * 2 + sl * 64 * 128), tm_q, int(p.q_off) + qh * D + sl * 64, q0 + 64 * c,
                    b, bar_q);
    for (int kt = kt0; kt < n_kt; ++kt) {
      const int i = kt - kt0, st = i % AB_STAGES;
      mbar_wait(bar_empty(st), uint32_t(((i / AB_STAGES) & 1) ^ 1));
      mbar_expect_tx(bar_full(st), K_BYTES);
#pragma unroll
      for (int sl = 0; sl < SLABS; ++sl)
        tma_load_3d(sK + uint32_t(st * K_BYTES + sl * BN * 128), tm_kv, int(p.k_off) + kvh * D + sl * 64, kt * BN, b,
                    bar_full(st));
    }
  }
  // Consumer warpgroup cw: f(s, kt) for each tile up to its rows' last key (later tiles released unread).
  template <class F>
  __device__ void consume(int cw, const AttnParams& p, F&& f) const {
    const int c_row = q0 + 64 * cw;
    const int last_kt = c_row < p.n ? (min(c_row + 63, p.n - 1)) / BN : -1;  // the tile of its last valid row's key
    const uint32_t q_base = sQ + uint32_t(cw * 64 * D * 2);
    mbar_wait(bar_q, 0);
    for (int kt = kt0; kt < n_kt; ++kt) {
      const int i = kt - kt0, st = i % AB_STAGES;
      mbar_wait(bar_full(st), uint32_t((i / AB_STAGES) & 1));
      if (kt > last_kt) {  // past this warpgroup's rows: release the stage, nothing to compute
        mbar_arrive(bar_empty(st));
        continue;
      }
      float s[NS];
      zero_pinned(s);
      wgmma_fence();
      issue_qk<D, BN>(s, q_base, sK + uint32_t(st * K_BYTES));
      wgmma_wait<0>();
#pragma unroll
      for (int k = 0; k < NS; ++k) pin(s[k]);
      mbar_arrive(bar_empty(st));
      f(s, kt);
    }
  }
};
#endif

// The quantised kernel's row maxima as a kernel of their own: each row's largest |q . k| over its causal keys, for
// every map of every view head. The attention kernel's own first pass reads each K tile for its 64 rows only (32
// FMA a byte read from L2, for a pass of Q K^T products alone). Here RowTiles' CTA of 256 rows (four consumer
// warpgroups against each K tile) lets each K byte feed four times the products: a 32K-token forward of the kajuma
// shape with 8-bit logits took 1.32x the full-precision one with the first pass, 1.28x with this kernel (H200;
// bench/EXPERIMENTS.md). It runs at about 69 % of the tensor cores' peak, its max instructions near the ALU pipe's
// limit. The result goes to absmax_slot. Only the tiles that cross a consumer's diagonal take the causal mask.
template <int D, int BN>
__global__ void __launch_bounds__(AB_THREADS, 1)
    attn_row_absmax_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                           const AttnParams p) {
#if defined(DS_SM90A_WS)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const RowTiles<D, BN> rt(raw + ((1024 - (raw & 1023)) & 1023), p, false);
  const int tid = threadIdx.x;
  if (tid == 0) rt.init();
  __syncthreads();
  if (tid >= 512) {  // the producer warp: one thread issues every copy
    if (tid == 512) rt.produce(&tm_q, &tm_kv, p);
    return;
  }
  const int cw = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const int c_row = rt.q0 + 64 * cw, row0 = c_row + warp * 16 + g4;
  float amax4[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int q = 0; q < 4; ++q) amax4[r][q] = 0.f;
  rt.consume(cw, p, [&](const float (&s)[RowTiles<D, BN>::NS], int kt) {
    constexpr int NS = RowTiles<D, BN>::NS;
    if (kt * BN + BN - 1 > c_row) {  // the tile crosses the diagonal of some row: keys past the row count 0
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        const int col = kt * BN + 8 * (i >> 2) + 2 * t4 + (i & 1), row = row0 + 8 * ((i >> 1) & 1);
        const int r = (i >> 1) & 1, q = (i >> 2) & 3;
        amax4[r][q] = fmaxf(amax4[r][q], col > row ? 0.f : fabsf(s[i]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        const int r = (i >> 1) & 1, q = (i >> 2) & 3;
        amax4[r][q] = fmaxf(amax4[r][q], fabsf(s[i]));
      }
    }
  });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float amax = fmaxf(fmaxf(amax4[r][0], amax4[r][1]), fmaxf(amax4[r][2], amax4[r][3]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const int row = row0 + 8 * r;
    if (t4 == 0 && row < p.n) *absmax_slot(p, rt.b, row, rt.j, rt.m) = amax;
  }
#else
  __trap();  // built without sm_90a: never launched
#endif
}

// The outlier statistics' pass over a layer's attention logits (launch_logit_pass_sm90): RowTiles' pipeline (the
// row-maximum kernel's), each causal cell inside the window visited once as |scale q . k| in registers and counted
// where it is:
// MODE 1 (the first pass, no prefixes): every cell's digit into one shared-memory histogram; MODE 2: the digits of
// the cells with one of the pass's prefixes, into a histogram per prefix (the first sh_pre in shared memory, the rest
// in the global counts); MODE 0: the collection alone. Any mode also collects the cells at or above the map's
// threshold. The batched-GEMM path it replaces wrote every logit to memory and read it back: the kajuma shape's
// logit statistics took 4.9x a forward at 4K tokens and 16x at 32K, with this kernel 1.0x and 2.1x (H200).
template <int D, int BN, int MODE>
__global__ void __launch_bounds__(AB_THREADS, 1)
    attn_logit_pass_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                           const AttnParams p, const LogitPass c, int sh_pre, int tshift) {
#if defined(DS_SM90A_WS)
  using RT = RowTiles<D, BN>;
  constexpr int NS = RT::NS;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t pad = (1024 - (raw & 1023)) & 1023;
  const RT rt(raw + pad, p, true);
  // After the barriers: MODE 1: the histogram (bins u32). MODE 0 and 2: [sh_pre histograms (bins u32) | the prefixes
  // (nprefix u32) | a table over the leading bits of |x| (bits >> tshift; 1 << (31 - tshift) bytes), nonzero where a
  // value may have work: 1 + the index of the one prefix with those leading bits, 255 for several (or an index past
  // 253), 254 at or above the leading bits of the collection's threshold (and no prefix)]
  const int bins = MODE == 0 ? 0 : 1 << c.width, npre = MODE == 2 ? c.nprefix : 0;
  unsigned* hist = reinterpret_cast<unsigned*>(smem_raw + pad + row_tiles_bytes<D, BN>());
  uint32_t* pre_s = hist + (MODE == 2 ? sh_pre * bins : 0);
  unsigned char* table = reinterpret_cast<unsigned char*>(pre_s + npre);

  const int map = p.diff ? rt.m : 0;  // the counts' and collections' map
  const int tid = threadIdx.x;
  if (tid == 0) rt.init();
  const uint32_t hi = uint32_t(c.shift + c.width);
  const int tsize = 1 << (31 - tshift);
  const bool collect = c.collect.at_least != nullptr;
  const float thr = collect ? c.collect.at_least[map] : 0.f;
  if (MODE == 1)
    for (int i = tid; i < bins; i += AB_THREADS) hist[i] = 0;
  if (MODE != 1) {
    for (int i = tid; i < sh_pre * bins; i += AB_THREADS) hist[i] = 0;
    for (int i = tid; i < npre; i += AB_THREADS) pre_s[i] = c.prefixes[i];
    const int t_thr = !collect ? tsize : thr > 0.f ? int(min(__float_as_uint(thr) >> tshift, uint32_t(tsize))) : 0;
    for (int i = tid; i < tsize; i += AB_THREADS) table[i] = i >= t_thr ? 254 : 0;
    __syncthreads();
    if (tid == 0)
      for (int i = 0; i < npre; ++i) {  // (tshift >= hi: a prefix has one entry)
        unsigned char& e = table[c.prefixes[i] >> (tshift - int(hi))];
        e = (e == 0 || e == 254) && i < 253 ? static_cast<unsigned char>(i + 1) : 255;
      }
  }
  __syncthreads();

  if (tid >= 512) {  // the producer warp
    if (tid == 512) rt.produce(&tm_q, &tm_kv, p);
    return;
  }

  const int cw = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
  const int c_row = rt.q0 + 64 * cw, row0 = c_row + warp * 16 + g4;
  const uint32_t mask = (1u << c.width) - 1;
  const int H = npre > 0 ? npre : 1;
  unsigned long long* gcounts = c.counts + size_t(map) * size_t(H) * size_t(bins > 0 ? bins : 1);
  auto collect_cell = [&](float a) {
    if (collect && a >= thr) {
      const unsigned slot = atomicAdd(c.collect.found + map, 1u);
      if (int(slot) < c.collect.cap) c.collect.out[size_t(map) * c.collect.cap + slot] = a;
    }
  };
  auto count = [&](int q, uint32_t bits) {
    const uint32_t digit = (bits >> c.shift) & mask;
    if (q < sh_pre) atomicAdd(&hist[q * bins + digit], 1u);
    else atomicAdd(gcounts + size_t(q) * bins + digit, 1ull);
  };
  // MODE 0 and 2: a cell whose leading bits the table marks (about one in twenty at the second pass: the middle's
  // prefix; far fewer at the third and in a collection) joins a per-thread list, handled after the tile in a loop of
  // its own. The pass is bound by the instructions issued per cell (Q K^T's share is a third): this keeps them to a
  // load and a compare. (Measured on the H200, bench/EXPERIMENTS.md: the prefixes' loop inlined at each cell, a
  // branch on a table of prefix indices, and counting every cell into its prefix's histogram or a sink took 2-4x
  // the first pass.)
  float rare[NS];
  int nrare = 0;
  auto visit = [&](float dot, bool valid) {
    const float a = fabsf(dot * p.scale);
    if (!valid) return;
    const uint32_t bits = __float_as_uint(a);
    if (MODE == 1) {
      collect_cell(a);
      atomicAdd(&hist[(bits >> c.shift) & mask], 1u);
      return;
    }
    if (table[bits >> tshift]) rare[nrare++] = a;
  };
  auto rare_cell = [&](float a) {
    collect_cell(a);
    if (MODE != 2) return;
    const uint32_t bits = __float_as_uint(a), top = bits >> hi;
    const int e = table[bits >> tshift];
    if (e == 254) return;
    if (e < 254) {  // the one prefix these leading bits can have
      if (top == pre_s[e - 1]) count(e - 1, bits);
      return;
    }
    for (int q = 0; q < npre; ++q)
      if (top == pre_s[q]) {
        count(q, bits);
        return;  // (the prefixes of a pass are distinct)
      }
  };
  const bool rows_in = row0 + 8 < p.n;
  rt.consume(cw, p, [&](const float (&s)[NS], int kt) {
    // Every cell of the tile counts when the tile lies left of the warpgroup's first row's diagonal, both of this
    // thread's rows exist and no window edge crosses it; otherwise each cell is tested.
    const bool whole = kt * BN + BN - 1 <= c_row && rows_in && window_first_key(p.window, c_row + 63) <= kt * BN;
    if (whole) {
#pragma unroll
      for (int i2 = 0; i2 < NS; ++i2) visit(s[i2], true);
    } else {
#pragma unroll
      for (int i2 = 0; i2 < NS; ++i2) {
        const int col = kt * BN + 8 * (i2 >> 2) + 2 * t4 + (i2 & 1), row = row0 + 8 * ((i2 >> 1) & 1);
        visit(s[i2], row < p.n && col <= row && col >= window_first_key(p.window, row));
      }
    }
    if (MODE != 1) {
#pragma unroll 1
      for (int k = 0; k < nrare; ++k) rare_cell(rare[k]);
      nrare = 0;
    }
  });
  if (MODE == 0) return;
  named_sync(1, 512);  // the consumers' counts are in; the producer warp has left
  for (int i = tid; i < sh_pre * bins; i += 512)
    if (const unsigned v = hist[i]) atomicAdd(gcounts + i, (unsigned long long)v);
#else
  __trap();  // built without sm_90a: never launched
#endif
}

template <int D, int BN, bool DIFF>
cudaError_t launch_t(const AttnParams& p, cudaStream_t stream) {
  CUtensorMap tq, tkv, tout;
  if (!make_attn_tma_map(tq, p.qkv, p.row_stride, p.batch_stride, p, BM) ||
      !make_attn_tma_map(tkv, kv_base(p), p.row_stride, p.batch_stride, p, BN) ||
      !make_attn_tma_map(tout, p.out, p.out_row_stride, p.out_batch_stride, p, BM))
    return cudaErrorNotSupported;
  constexpr int smem = TileWs<D, BN>::SMEM_BYTES;
  const bool fixmax = p.fixed_max;
  if (p.logit_bits > 0 && p.window > 0) return cudaErrorNotSupported;  // (select_attn sends such a layer to generic)
  const auto kernel =
      p.logit_bits > 0 ? attn_fwd_sm90_kernel<D, BN, DIFF, false, true, true>
      : p.window > 0   ? (fixmax ? attn_fwd_sm90_kernel<D, BN, DIFF, true, true> : attn_fwd_sm90_kernel<D, BN, DIFF, true, false>)
                       : (fixmax ? attn_fwd_sm90_kernel<D, BN, DIFF, false, true> : attn_fwd_sm90_kernel<D, BN, DIFF, false, false>);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  AttnParams pa = p;
  // Quantised: the rows' largest |logit| from attn_row_absmax_kernel, parked in the output rows (4-byte aligned
  // floats there), else from the attention kernel's own first pass.
  pa.absmax_staged = p.logit_bits > 0 && p.quant_row_kernel && reinterpret_cast<uintptr_t>(p.out) % 4 == 0 &&
                     p.out_row_stride % 2 == 0 && (p.batch == 1 || p.out_batch_stride % 2 == 0);
  if (pa.absmax_staged) {
    CUtensorMap tq4;  // Q boxes of 64 rows as above; K boxes of BN rows (tkv)
    if (!make_attn_tma_map(tq4, p.qkv, p.row_stride, p.batch_stride, p, 64)) return cudaErrorNotSupported;
    constexpr int ab_smem = row_tiles_bytes<D, BN>() + 1024;
    e = cudaFuncSetAttribute(attn_row_absmax_kernel<D, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, ab_smem);
    if (e != cudaSuccess) return e;
    attn_row_absmax_kernel<D, BN><<<row_tiles_ctas(p), AB_THREADS, ab_smem, stream>>>(tq4, tkv, pa);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  const unsigned ctas = unsigned((p.n + BM - 1) / BM) * unsigned((p.heads / 2) * p.batch);
  kernel<<<ctas, THREADS, smem, stream>>>(tq, tkv, tout, pa);
  return cudaGetLastError();
}

template <bool DIFF>
cudaError_t launch_mode(const AttnParams& p, int block_n, cudaStream_t stream) {
  if (p.d == 64) return block_n == 128 ? launch_t<64, 128, DIFF>(p, stream) : launch_t<64, 64, DIFF>(p, stream);
  if (p.d == 128) return launch_t<128, 64, DIFF>(p, stream);
  return cudaErrorInvalidValue;
}

__global__ void sm90a_probe_kernel(int* out) {
#if defined(DS_SM90A_WS)
  *out = 1;
#else
  *out = 0;
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

}  // namespace

bool attn_fwd_sm90_code_runs() {
  int* d = nullptr;
  int h = 0;
  if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
    sm90a_probe_kernel<<<1, 1>>>(d);
    if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) h = 0;
    cudaFree(d);
  }
  cudaGetLastError();  // a device without sm_90 code fails the launch: that is the answer, not an error
  return h == 1;
}

bool attn_tma_encoder_available() { return encode_fn() != nullptr; }

bool make_attn_tma_map(CUtensorMap& m, const bf16* base, int64_t row_stride, int64_t batch_stride, const AttnParams& p,
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

bool make_tma_map_2d(CUtensorMap& m, const bf16* base, int64_t cols, int64_t rows, int64_t row_stride, int box_rows) {
  auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_stride) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, estride[2] = {1, 1};
  return fn(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides, box, estride,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

cudaError_t launch_attn_fwd_sm90(const AttnParams& p, int block_n, cudaStream_t stream) {
  if (p.n <= 0 || p.heads % 2 || (p.diff && p.kv_heads % 2) || p.heads % p.kv_heads) return cudaErrorInvalidValue;
  return p.diff ? launch_mode<true>(p, block_n, stream) : launch_mode<false>(p, block_n, stream);
}

namespace {
template <int D, int BN, int MODE>
cudaError_t launch_logit_pass_t(const AttnParams& p, const LogitPass& c, cudaStream_t stream) {
  CUtensorMap tq4, tkv;
  if (!make_attn_tma_map(tq4, p.qkv, p.row_stride, p.batch_stride, p, 64) ||
      !make_attn_tma_map(tkv, kv_base(p), p.row_stride, p.batch_stride, p, BN))
    return cudaErrorNotSupported;
  int dev = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  const int base = 1024 + row_tiles_bytes<D, BN>();
  const int npre = MODE == 2 ? c.nprefix : 0, bins = MODE == 0 ? 0 : 1 << c.width;
  int sh_pre = 0;  // the histograms held in shared memory (MODE 2: as many as fit; MODE 1: its one)
  int smem = base, tshift = 31;
  if (MODE == 1) sh_pre = 1, smem += bins * 4;
  // The table over 12 leading bits, or 16 for longer prefixes (a later pass's: fewer cells listed), or the
  // prefixes' own where they are shorter; fewer where memory is short.
  if (MODE != 1) {
    const int hi = c.shift + c.width;
    for (tshift = std::max(hi, hi < 19 && npre > 0 ? 15 : 19); tshift < 31 && base + npre * 4 + (1 << (31 - tshift)) > optin; ++tshift) {
    }
    const int fixed = base + npre * 4 + (1 << (31 - tshift));
    sh_pre = std::max(0, std::min(npre, (optin - fixed) / (std::max(1, bins) * 4)));
    smem = fixed + sh_pre * bins * 4;
  }
  if (smem > optin) return cudaErrorNotSupported;
  const auto kernel = attn_logit_pass_kernel<D, BN, MODE>;
  if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != cudaSuccess) return e;
  kernel<<<row_tiles_ctas(p), AB_THREADS, smem, stream>>>(tq4, tkv, p, c, sh_pre, tshift);
  return cudaGetLastError();
}
template <int MODE>
cudaError_t launch_logit_pass_mode(const AttnParams& p, const LogitPass& c, cudaStream_t stream) {
  if (p.d == 64) return launch_logit_pass_t<64, 128, MODE>(p, c, stream);
  return launch_logit_pass_t<128, 64, MODE>(p, c, stream);
}
}  // namespace

bool logit_pass_sm90_supports(const AttnParams& p) {
  return (p.d == 64 || p.d == 128) && p.n > 0 && p.heads % 2 == 0 && (!p.diff || p.kv_heads % 2 == 0) &&
         p.kv_heads > 0 && p.heads % p.kv_heads == 0;
}

cudaError_t launch_logit_pass_sm90(const AttnParams& p, const LogitPass& c, cudaStream_t stream) {
  if (!logit_pass_sm90_supports(p) || c.width < 0 || c.width > 12 || c.shift < 0 || c.shift + c.width > 31 ||
      (c.width > 0 && !c.counts) || (c.width == 0 && !c.collect.at_least) || c.nprefix < 0 ||
      (c.nprefix > 0 && !c.prefixes) || (c.collect.at_least && (!c.collect.out || !c.collect.found || c.collect.cap < 0)))
    return cudaErrorInvalidValue;
  if (c.width == 0) return launch_logit_pass_mode<0>(p, c, stream);
  return c.nprefix == 0 ? launch_logit_pass_mode<1>(p, c, stream) : launch_logit_pass_mode<2>(p, c, stream);
}

}  // namespace ds::kern
