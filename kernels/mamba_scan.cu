// The selective scan runs time in parallel chunks for long runs and sequentially for short ones (below); the
// convolution is element-wise over (token, channel), K taps read from the previous rows (8 channels by 16 rows per
// thread where the layout allows).
#include "mamba_scan.h"

#include <cstdlib>

#include "align.h"
#include "mma_sm80.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 128;

constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

// The SFU's approximations with denormals flushed: one instruction each (__expf and __logf add a range fix-up of
// three or four more for denormal results or arguments, which none of the uses below can make use of).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// x / (1 + e^-x): for x below about -88, e^-x is inf and the result -0 (x times rcp(inf) = 0).
__device__ __forceinline__ float silu(float x) { return x * rcp_approx(1.f + ex2_approx(-x * LOG2E)); }
// log(1 + e^x) = max(x, 0) + log1p(e^-|x|) on the SFU: log1p(e) as log(1 + e), or as e itself below 1e-4 (where
// 1 + e loses e's digits; the error is under e^2 / 2). Above x = 20 this is x, as the published threshold makes it.
// e flushes to 0 past |x| = 87, where the result is max(x, 0) in f32 anyway.
__device__ __forceinline__ float softplus(float x) {
  const float e = ex2_approx(-fabsf(x) * LOG2E);
  return fmaxf(x, 0.f) + (e < 1e-4f ? e : lg2_approx(1.f + e) * LN2);
}

// Rows [t_begin, n), one thread per (row, channel). Taps before t = 0 read zeros; with t_begin >= K - 1 there are
// none (the rows before come from conv_silu_head_kernel).
__global__ void __launch_bounds__(256) conv_silu_kernel(const __nv_bfloat16* x, int64_t ld_x, const float* w,
                                                        const float* bias, int K, __nv_bfloat16* u, int64_t ld_u,
                                                        int64_t t_begin, int64_t n, int channels) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i >= (n - t_begin) * channels) return;
  const int64_t t = t_begin + i / channels;
  const int c = int(i % channels);
  float acc = bias ? bias[c] : 0.f;
  for (int k = 0; k < K; ++k) {
    const int64_t s = t - (K - 1) + k;
    if (s >= 0) acc = fmaf(w[int64_t(c) * K + k], __bfloat162float(x[s * ld_x + c]), acc);
  }
  u[t * ld_u + c] = __float2bfloat16(silu(acc));
}

// A bf16 pair as two floats, one integer instruction each (a bf16 is the top half of its float; cuda_bf16.h's
// conversion takes two for the upper one).
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// 8 bf16 (16 bytes) as floats.
__device__ __forceinline__ void unpack8(const uint4 q, float (&v)[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = unpack_bf16x2(w[j]);
    v[2 * j] = f.x, v[2 * j + 1] = f.y;
  }
}
// 8 bf16 at p (16-byte aligned) as floats.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  unpack8(*reinterpret_cast<const uint4*>(p), v);
}

// The same rows [t_begin, n), 8 channels per thread in 16-byte loads and stores (channels, ld_x, ld_u multiples of
// 8, x and u 16-byte aligned) and CONV_ROWS consecutive rows per thread, the K - 1 rows before each kept in
// registers: every x row is read about once, two rows ahead of its use (one 16-byte load in flight per thread left
// the kernel waiting on memory at about half the copy bandwidth). The products in the same order as
// conv_silu_kernel.
constexpr int CONV_ROWS = 16;
constexpr int CONV_THREADS = 128;
template <int K>
__global__ void __launch_bounds__(CONV_THREADS) conv_silu_vec8_kernel(const __nv_bfloat16* x, int64_t ld_x,
                                                                     const float* w, const float* bias,
                                                                     __nv_bfloat16* u, int64_t ld_u, int64_t t_begin,
                                                                     int64_t n, int channels) {
  const int c0 = (int(blockIdx.y) * CONV_THREADS + int(threadIdx.x)) * 8;  // x: rows, y: channels (grid.y <= 65535)
  if (c0 >= channels) return;
  const int64_t t0 = t_begin + int64_t(blockIdx.x) * CONV_ROWS;
  const int64_t t1 = t0 + CONV_ROWS < n ? t0 + CONV_ROWS : n;
  float wk[8][K], b[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    b[j] = bias ? bias[c0 + j] : 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) wk[j][k] = w[int64_t(c0 + j) * K + k];
  }
  float win[K][8];  // at row t: win[k] = x row t - (K - 1) + k (zeros before the sequence)
#pragma unroll
  for (int k = 1; k < K; ++k) {
    const int64_t s = t0 - K + k;
    if (s >= 0) {
      load8(x + s * ld_x + c0, win[k]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) win[k][j] = 0.f;
    }
  }
  const auto row = [&](int64_t t) {
    return t < t1 ? *reinterpret_cast<const uint4*>(x + t * ld_x + c0) : make_uint4(0u, 0u, 0u, 0u);
  };
  uint4 ahead[2] = {row(t0), row(t0 + 1)};  // rows t and t + 1
  for (int64_t t = t0; t < t1; ++t) {
#pragma unroll
    for (int k = 0; k < K - 1; ++k)
#pragma unroll
      for (int j = 0; j < 8; ++j) win[k][j] = win[k + 1][j];
    unpack8(ahead[0], win[K - 1]);
    ahead[0] = ahead[1];
    ahead[1] = row(t + 2);
    uint4 o;
    __nv_bfloat162* po = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float acc[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float a = b[2 * j + e];
#pragma unroll
        for (int k = 0; k < K; ++k) a = fmaf(wk[2 * j + e][k], win[k][2 * j + e], a);
        acc[e] = silu(a);
      }
      po[j] = __floats2bfloat162_rn(acc[0], acc[1]);
    }
    *reinterpret_cast<uint4*>(u + t * ld_u + c0) = o;
  }
}

// With the conv state: one thread per channel computes the rows t < min(n, K - 1), the only ones whose taps reach
// before t = 0 (there: state_in, or zeros), and then writes the channel's state_out. state_in[., c] is read by this
// thread alone, before it writes state_out[., c], so in place is safe. The same products in the same order as
// conv_silu_kernel.
__global__ void __launch_bounds__(256) conv_silu_head_kernel(const __nv_bfloat16* x, int64_t ld_x, const float* w,
                                                             const float* bias, int K, __nv_bfloat16* u, int64_t ld_u,
                                                             int64_t n, int channels, const __nv_bfloat16* state_in,
                                                             __nv_bfloat16* state_out) {
  const int c = int(blockIdx.x) * 256 + int(threadIdx.x);
  if (c >= channels) return;
  // Position j of the sequence (state rows, then x rows): j < K - 1 is state row j, else x row j - (K - 1).
  const auto input = [&](int64_t j) {
    if (j >= K - 1) return __bfloat162float(x[(j - (K - 1)) * ld_x + c]);
    return state_in ? __bfloat162float(state_in[j * channels + c]) : 0.f;
  };
  const int64_t head = n < K - 1 ? n : K - 1;
  for (int64_t t = 0; t < head; ++t) {
    float acc = bias ? bias[c] : 0.f;
    for (int k = 0; k < K; ++k) acc = fmaf(w[int64_t(c) * K + k], input(t + k), acc);
    u[t * ld_u + c] = __float2bfloat16(silu(acc));
  }
  // state_out row r = position n + r; in place, row r is written after rows >= r + 1 (> r, since n >= 1) were read.
  if (state_out)
    for (int r = 0; r < K - 1; ++r) state_out[int64_t(r) * channels + c] = __float2bfloat16(input(n + r));
}

// One thread per channel holds the channel's whole state h[S] in registers; time is cut into chunks of CHUNK steps
// that run in parallel, since h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t is linear in h:
//   pass 1 (chunk_state):  each chunk from h = 0: its end state and the sum of its deltas (the chunk's decay is
//                          exp(A sum delta));
//   pass 2 (chunk_carry):  per channel, the chunks' true start states (the first: state_in, or 0), sequentially
//                          over the chunks;
//   pass 3 (chunk_output): each chunk again from its start state, writing y; the last chunk's end state is state_out.
// A block takes THREADS consecutive channels (u, dt and z loads coalesce) over one chunk. B and C rows are the same
// for every channel: the block stages them in shared memory as f32 (zeros past p.state), kStage rows at a time, and
// every thread reads them as 16-byte broadcasts, so a step neither unpacks bf16 pairs nor moves B and C pointers.
// The per-channel rows are addressed from the chunk's first row with 32-bit byte strides, and the output pass is
// built per set of outputs: at d_state 16 a step is 94 instructions in the state pass (18 on the SFU) and 131 in the
// gated output pass (20 on the SFU), down from 108 and 199 with 64-bit pointer walks and run-time output checks
// (2.86 -> 2.58 ms per layer at 32K tokens on an H100). A step's SFU work (8 cycles per warp instruction: 144 and
// 160) now exceeds its issue slots, yet moving some exponentials to a polynomial on the FMA pipe made both passes
// slower (bench/EXPERIMENTS.md). u, dt and z come from device memory at long prompts: they are loaded kPrefetch*
// steps ahead (one step ahead left both passes waiting on them at 32K tokens). States past p.state compute zeros
// (A = 0, B = C = 0, h = 0).
constexpr int CHUNK = 256;
constexpr int kPrefetchState = 4, kPrefetchOutput = 2;

template <int SMAX>
constexpr int kStage = CHUNK * SMAX <= 4096 ? CHUNK : 4096 / SMAX;  // rows staged at a time: <= 16 KB per matrix

// Rows [t, t + rows) of B (and C where OUT) into sb (sc): [rows][SMAX] f32, every thread of the block taking 8
// values of a row at a time: one 16-byte load each where VEC (the state exactly SMAX wide, rows 16-byte aligned).
template <int SMAX, bool VEC, bool OUT>
__device__ __forceinline__ void stage_bc(const ScanParams& p, int64_t t, int rows, float* sb, float* sc) {
  constexpr unsigned G = SMAX / 8;  // groups of 8 per row
  for (unsigned i = threadIdx.x; i < unsigned(rows) * G; i += THREADS) {
    const unsigned r = i / G, s0 = (i % G) * 8;
    const int64_t off = (t + r) * p.ld_bc + s0;
    float v[8], w[8];
    if constexpr (VEC) {
      load8(p.B + off, v);
      if constexpr (OUT) load8(p.C + off, w);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const bool on = int(s0) + j < p.state;
        v[j] = on ? __bfloat162float(p.B[off + j]) : 0.f;
        w[j] = OUT && on ? __bfloat162float(p.C[off + j]) : 0.f;
      }
    }
    float4* db = reinterpret_cast<float4*>(sb + r * SMAX + s0);
    db[0] = make_float4(v[0], v[1], v[2], v[3]), db[1] = make_float4(v[4], v[5], v[6], v[7]);
    if constexpr (OUT) {
      float4* dc = reinterpret_cast<float4*>(sc + r * SMAX + s0);
      dc[0] = make_float4(w[0], w[1], w[2], w[3]), dc[1] = make_float4(w[4], w[5], w[6], w[7]);
    }
  }
}

struct StepIn {
  float u, dt, z;  // z only where the output is gated
};

// Outputs of the output pass (OUT): y, y silu(z), or both; 0 is the state pass.
constexpr int kOutY = 1, kOutGated = 2;

// The chunk's rows [t0, t0 + rows) for channel c (live: c < p.channels; the others only help stage). Every thread of
// the block calls this with the same t0 and rows (the staging synchronises the block). Row r's inputs are read at
// base + r * ld with 32-bit r and ld (one wide multiply-add per pointer, no 64-bit pointer walks), loaded PF steps
// ahead; past the chunk's last row the loads repeat it.
template <int SMAX, bool VEC, int OUT, int PF>
__device__ __forceinline__ void chunk_steps(const ScanParams& p, int c, bool live, int64_t t0, int rows,
                                            float (&h)[SMAX], const float (&a2)[SMAX], float bias, float dskip,
                                            float* dsum) {
  __shared__ __align__(16) float sb[kStage<SMAX> * SMAX];
  __shared__ __align__(16) float sc[OUT ? kStage<SMAX> * SMAX : 4];
  constexpr bool GATED = (OUT & kOutGated) != 0;
  float sum = 0.f;
  const __nv_bfloat16* u = p.u + t0 * p.ld_u + c;
  const __nv_bfloat16* dt = p.dt + t0 * p.ld_dt + c;
  const __nv_bfloat16* z = GATED ? p.z + t0 * p.ld_z + c : nullptr;
  __nv_bfloat16* y_out = (OUT & kOutY) ? p.y + t0 * p.ld_y + c : nullptr;
  __nv_bfloat16* g_out = GATED ? p.y_gated + t0 * p.ld_y + c : nullptr;
  // strides in bytes: an address is one wide multiply-add, base + r * stride
  const uint32_t su = uint32_t(2 * p.ld_u), sdt = uint32_t(2 * p.ld_dt), sz = uint32_t(2 * p.ld_z),
                 sy = uint32_t(2 * p.ld_y);
  const int last = rows - 1;
  const auto at = [](const __nv_bfloat16* b, int r, uint32_t stride) {
    return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(b) +
                                                                     uint64_t(uint32_t(r)) * stride));
  };
  const auto put = [](__nv_bfloat16* b, int r, uint32_t stride, float v) {
    *reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(b) + uint64_t(uint32_t(r)) * stride) = __float2bfloat16(v);
  };
  const auto load = [&](int r) {  // row r's per-channel inputs (the last row past the end)
    r = min(r, last);
    StepIn s;
    s.u = at(u, r, su);
    s.dt = at(dt, r, sdt);
    s.z = GATED ? at(z, r, sz) : 0.f;
    return s;
  };
  const auto step = [&](int r, const StepIn& cur, const float* bs, const float* cs) {
    const float delta = softplus(cur.dt + bias);
    sum += delta;
    const float du = delta * cur.u;
    float y = dskip * cur.u;
#pragma unroll
    for (int i = 0; i < SMAX / 4; ++i) {
      const float4 b = reinterpret_cast<const float4*>(bs)[i];
      const float bb[4] = {b.x, b.y, b.z, b.w};
      float cc[4] = {};
      if constexpr (OUT != 0) {
        const float4 c4 = reinterpret_cast<const float4*>(cs)[i];
        cc[0] = c4.x, cc[1] = c4.y, cc[2] = c4.z, cc[3] = c4.w;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int s = 4 * i + e;
        h[s] = fmaf(ex2_approx(delta * a2[s]), h[s], bb[e] * du);
        if constexpr (OUT != 0) y = fmaf(cc[e], h[s], y);
      }
    }
    if constexpr ((OUT & kOutY) != 0) put(y_out, r, sy, y);
    if constexpr (GATED) put(g_out, r, sy, y * silu(cur.z));
  };
  StepIn ring[PF];  // rows r .. r + PF - 1, loaded PF steps ahead
#pragma unroll
  for (int j = 0; j < PF; ++j) ring[j] = live ? load(j) : StepIn{};
  for (int r0 = 0; r0 < rows; r0 += kStage<SMAX>) {
    const int n_r = rows - r0 < kStage<SMAX> ? rows - r0 : kStage<SMAX>;
    __syncthreads();  // every thread is done with the previous rows
    stage_bc<SMAX, VEC, OUT != 0>(p, t0 + r0, n_r, sb, sc);
    __syncthreads();
    if (!live) continue;
    int r = 0;
    for (; r + PF <= n_r; r += PF) {
#pragma unroll
      for (int j = 0; j < PF; ++j) {
        const StepIn ahead = load(r0 + r + j + PF);
        step(r0 + r + j, ring[j], sb + (r + j) * SMAX, sc + (OUT ? (r + j) * SMAX : 0));
        ring[j] = ahead;
      }
    }
#pragma unroll
    for (int j = 0; j < PF; ++j)  // the last round's remainder (a whole round has kStage rows, a multiple of PF)
      if (r + j < n_r) step(r0 + r + j, ring[j], sb + (r + j) * SMAX, sc + (OUT ? (r + j) * SMAX : 0));
  }
  if (dsum) *dsum = sum;
}

template <int SMAX>
__device__ __forceinline__ void load_a2(const ScanParams& p, int c, float (&a2)[SMAX]) {
#pragma unroll
  for (int s = 0; s < SMAX; ++s) a2[s] = s < p.state ? p.A[int64_t(c) * p.state + s] * LOG2E : 0.f;
}

// hs: [chunks][channels][state] f32 (pass 1 writes end states, pass 2 turns them into start states); ds: [chunks]
// [channels] f32, the chunks' delta sums.
template <int SMAX, bool VEC, int PF>
__global__ void __launch_bounds__(THREADS) chunk_state_kernel(const ScanParams p, float* hs, float* ds) {
  const int c0 = int(blockIdx.x) * THREADS + int(threadIdx.x), k = int(blockIdx.y);
  const bool live = c0 < p.channels;
  const int c = live ? c0 : 0;
  float h[SMAX] = {}, a2[SMAX];
  load_a2<SMAX>(p, c, a2);
  const int64_t t0 = int64_t(k) * CHUNK;
  const int rows = int(p.n - t0 < CHUNK ? p.n - t0 : CHUNK);
  float sum;
  chunk_steps<SMAX, VEC, 0, PF>(p, c, live, t0, rows, h, a2, p.dt_bias[c], p.D[c], &sum);
  if (!live) return;
  float* out = hs + (int64_t(k) * p.channels + c) * p.state;
  for (int s = 0; s < p.state; ++s) out[s] = h[s];
  ds[int64_t(k) * p.channels + c] = sum;
}

// One thread per (channel, state): start(0) = state_in (or 0), start(k + 1) = exp(A sum_k) start(k) + end(k), in
// place.
__global__ void __launch_bounds__(256) chunk_carry_kernel(const ScanParams p, int chunks, float* hs, const float* ds) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i >= int64_t(p.channels) * p.state) return;
  const int c = int(i / p.state);
  const float a = p.A[i];
  float start = p.state_in ? p.state_in[i] : 0.f;
  for (int k = 0; k < chunks; ++k) {
    float* e = hs + int64_t(k) * p.channels * p.state + i;
    const float end = *e;
    *e = start;
    start = fmaf(__expf(a * ds[int64_t(k) * p.channels + c]), start, end);
  }
}

template <int SMAX, bool VEC, int OUT, int PF>
__global__ void __launch_bounds__(THREADS) chunk_output_kernel(const ScanParams p, const float* hs) {
  const int c0 = int(blockIdx.x) * THREADS + int(threadIdx.x), k = int(blockIdx.y);
  const bool live = c0 < p.channels;
  const int c = live ? c0 : 0;
  float h[SMAX], a2[SMAX];
  load_a2<SMAX>(p, c, a2);
  const float* start = hs + (int64_t(k) * p.channels + c) * p.state;
#pragma unroll
  for (int s = 0; s < SMAX; ++s) h[s] = s < p.state ? start[s] : 0.f;
  const int64_t t0 = int64_t(k) * CHUNK;
  const int rows = int(p.n - t0 < CHUNK ? p.n - t0 : CHUNK);
  chunk_steps<SMAX, VEC, OUT, PF>(p, c, live, t0, rows, h, a2, p.dt_bias[c], p.D[c], nullptr);
  // The last chunk ends at the last token. state_in was read by chunk_carry_kernel, which has finished.
  if (live && p.state_out && t0 + rows == p.n) {
    float* out = p.state_out + int64_t(c) * p.state;
#pragma unroll
    for (int s = 0; s < SMAX; ++s)
      if (s < p.state) out[s] = h[s];
  }
}

template <int SMAX, bool VEC>
cudaError_t run_scan(const ScanParams& p, float* hs, float* ds, cudaStream_t stream) {
  const int chunks = int((p.n + CHUNK - 1) / CHUNK);
  const dim3 grid(unsigned((p.channels + THREADS - 1) / THREADS), unsigned(chunks));
  chunk_state_kernel<SMAX, VEC, kPrefetchState><<<grid, THREADS, 0, stream>>>(p, hs, ds);
  const int64_t pairs = int64_t(p.channels) * p.state;
  chunk_carry_kernel<<<unsigned((pairs + 255) / 256), 256, 0, stream>>>(p, chunks, hs, ds);
  if (p.y && p.y_gated)
    chunk_output_kernel<SMAX, VEC, kOutY | kOutGated, kPrefetchOutput><<<grid, THREADS, 0, stream>>>(p, hs);
  else if (p.y_gated)
    chunk_output_kernel<SMAX, VEC, kOutGated, kPrefetchOutput><<<grid, THREADS, 0, stream>>>(p, hs);
  else
    chunk_output_kernel<SMAX, VEC, kOutY, kPrefetchOutput><<<grid, THREADS, 0, stream>>>(p, hs);
  return cudaGetLastError();
}

// B and C rows staged with 16-byte loads: the state exactly SMAX wide and every row 16-byte aligned.
template <int SMAX>
cudaError_t run_scan_any(const ScanParams& p, float* hs, float* ds, cudaStream_t stream) {
  if (p.state == SMAX && p.ld_bc % 8 == 0 && aligned16(p.B) && aligned16(p.C))
    return run_scan<SMAX, true>(p, hs, ds, stream);
  return run_scan<SMAX, false>(p, hs, ds, stream);
}

// Long runs, sequential over the tokens: every (channel, state) recurrence is independent, and d_inner x d_state of
// them (81,920 at Phi-4-mini-flash's shape) keep the GPU busy without cutting time into chunks, so each
// exponential is taken once instead of the chunked passes' twice. G = 4 lanes take one channel, lane g its SPL
// states g SPL .. g SPL + SPL - 1; a block takes cpb consecutive channels, sized so that the blocks fill the SMs
// once. The inputs arrive a tile of kTileT tokens at a time, two tiles ahead (16-byte cp.async where the layout
// allows), and between two tiles the block turns the next tile into what a step reads: {delta, delta u} per
// (token, channel), B and C as f32 rows, {D u, silu(z)} for the outputs. A step is then the states' recurrences
// and one store of the lane's share of y; the shares are summed, D u added and the gate applied for the whole tile
// at the next boundary, where the outputs leave for device memory in 16-byte rows. Two barriers per tile.
constexpr int kTileT = 64;
static int tile_g() {
  static const int g = std::getenv("DS_SCAN_G") ? std::atoi(std::getenv("DS_SCAN_G")) : 8;
  return g == 16 ? 16 : g == 8 ? 8 : 4;
}

// Shared memory of the tiled kernel, offsets in bytes.
struct TileSmem {
  int cpb, smax;
  __host__ __device__ uint32_t step_in() const { return 0; }  // [T][cpb] float2 {delta, delta u}
  __host__ __device__ uint32_t out_in(int i) const {           // [2][T][cpb] float2 {D u, silu(z)}, by tile parity
    return uint32_t(kTileT * cpb * 8 * (1 + i));
  }
  int G = 4;
  __host__ __device__ uint32_t bc() const { return uint32_t(kTileT * cpb * 24); }  // [T][2][smax] f32: B, C
  __host__ __device__ uint32_t part() const { return bc() + uint32_t(kTileT * 2 * smax * 4); }  // [T][cpb][G] f32
  __host__ __device__ uint32_t raw_bytes() const { return uint32_t(kTileT * (3 * cpb + 2 * smax) * 2); }
  __host__ __device__ uint32_t raw(int i) const {  // [2]: u, dt, z [T][cpb], B, C [T][smax] (bf16)
    return part() + uint32_t(kTileT * cpb * G * 4) + uint32_t(i) * raw_bytes();
  }
  __host__ __device__ uint32_t par() const { return raw(2); }  // dt_bias [cpb], D [cpb]
  __host__ __device__ uint32_t bytes() const { return par() + uint32_t(cpb * 8); }
};

// Items [rows][ncol] of a tile spread over the block: this thread's column tid % ncol, its rows from tid / ncol in
// steps of blockDim / ncol (ncol divides the block's threads, 4 cpb, in every use: cpb, cpb / 8, smax, smax / 8).
template <class F>
__device__ __forceinline__ void tile_items(int rows, int ncol, F&& f) {
  const int col = int(threadIdx.x) % ncol, step = int(blockDim.x) / ncol;
  for (int r = int(threadIdx.x) / ncol; r < rows; r += step) f(r, col);
}

// Tile k's rows (those before n) of the block's channels into raw buffer `buf`; rows of z only where gated. VEC:
// 16-byte cp.async (channels, strides and the state multiples of 8, every base 16-byte aligned); else element by
// element through registers.
template <bool VEC, bool GATED>
__device__ __forceinline__ void tile_load(const ScanParams& p, const TileSmem& L, unsigned char* sm, int buf,
                                          int c0, int64_t k) {
  const int64_t t0 = k * kTileT;
  const int rows = int(p.n - t0 < kTileT ? p.n - t0 : kTileT);
  if (rows <= 0) return;
  __nv_bfloat16* ru = reinterpret_cast<__nv_bfloat16*>(sm + L.raw(buf));
  __nv_bfloat16* rdt = ru + kTileT * L.cpb;
  __nv_bfloat16* rz = rdt + kTileT * L.cpb;
  __nv_bfloat16* rb = rz + kTileT * L.cpb;
  __nv_bfloat16* rc = rb + kTileT * L.smax;
  const int live = p.channels - c0 < L.cpb ? p.channels - c0 : L.cpb;  // the block's channels that exist
  const __nv_bfloat16* u = p.u + t0 * p.ld_u + c0;
  const __nv_bfloat16* dt = p.dt + t0 * p.ld_dt + c0;
  const __nv_bfloat16* z = GATED ? p.z + t0 * p.ld_z + c0 : nullptr;
  const __nv_bfloat16* B = p.B + t0 * p.ld_bc;
  const __nv_bfloat16* C = p.C + t0 * p.ld_bc;
  if constexpr (VEC) {
    tile_items(rows, L.cpb / 8, [&](int r, int j) {
      if (8 * j >= live) return;
      const int o = r * L.cpb + 8 * j;
      cp_async_16(smem_addr(ru + o), u + r * p.ld_u + 8 * j, 16);
      cp_async_16(smem_addr(rdt + o), dt + r * p.ld_dt + 8 * j, 16);
      if constexpr (GATED) cp_async_16(smem_addr(rz + o), z + r * p.ld_z + 8 * j, 16);
    });
    tile_items(rows, L.smax / 8, [&](int r, int j) {
      if (8 * j >= p.state) return;
      cp_async_16(smem_addr(rb + r * L.smax + 8 * j), B + r * p.ld_bc + 8 * j, 16);
      cp_async_16(smem_addr(rc + r * L.smax + 8 * j), C + r * p.ld_bc + 8 * j, 16);
    });
  } else {
    tile_items(rows, L.cpb, [&](int r, int j) {
      if (j >= live) return;
      const int o = r * L.cpb + j;
      ru[o] = u[r * p.ld_u + j];
      rdt[o] = dt[r * p.ld_dt + j];
      if constexpr (GATED) rz[o] = z[r * p.ld_z + j];
    });
    tile_items(rows, L.smax, [&](int r, int j) {
      if (j >= p.state) return;
      rb[r * L.smax + j] = B[r * p.ld_bc + j];
      rc[r * L.smax + j] = C[r * p.ld_bc + j];
    });
  }
}

template <int G, int SPL, bool VEC, int OUT>
__global__ void __launch_bounds__(1024) scan_tiled_kernel(const ScanParams p, int cpb) {
  constexpr int SMAX = G * SPL;
  constexpr bool GATED = (OUT & kOutGated) != 0;
  extern __shared__ __align__(16) unsigned char sm[];
  const TileSmem L{cpb, SMAX, G};
  float2* step_in = reinterpret_cast<float2*>(sm + L.step_in());
  float* bcf = reinterpret_cast<float*>(sm + L.bc());
  float* part = reinterpret_cast<float*>(sm + L.part());
  float* pbias = reinterpret_cast<float*>(sm + L.par());
  float* pD = pbias + cpb;
  const int c0 = int(blockIdx.x) * cpb, tid = int(threadIdx.x);
  const int cl = tid / G, g = tid % G, c = c0 + cl;
  const bool live = c < p.channels;
  const int nlive = p.channels - c0 < cpb ? p.channels - c0 : cpb;
  for (int i = tid; i < cpb; i += blockDim.x) {
    pbias[i] = i < nlive ? p.dt_bias[c0 + i] : 0.f;
    pD[i] = i < nlive ? p.D[c0 + i] : 0.f;
  }
  float h[SPL], a2[SPL];
#pragma unroll
  for (int j = 0; j < SPL; ++j) {
    const int s = g * SPL + j;
    const bool on = live && s < p.state;
    a2[j] = on ? p.A[int64_t(c) * p.state + s] * LOG2E : 0.f;
    h[j] = on && p.state_in ? p.state_in[int64_t(c) * p.state + s] : 0.f;
  }
  const int64_t tiles = (p.n + kTileT - 1) / kTileT;
  // Raw tile k (from buffer k % 2) into what the steps read; rows past n become steps that change nothing
  // (delta = 0: exp(0) h + 0 = h exactly) and whose outputs are not stored.
  const auto convert = [&](int64_t k) {
    const unsigned char* base = sm + L.raw(int(k & 1));
    const __nv_bfloat16* ru = reinterpret_cast<const __nv_bfloat16*>(base);
    const __nv_bfloat16* rdt = ru + kTileT * cpb;
    const __nv_bfloat16* rz = rdt + kTileT * cpb;
    const __nv_bfloat16* rb = rz + kTileT * cpb;
    const __nv_bfloat16* rc = rb + kTileT * SMAX;
    float2* oin = reinterpret_cast<float2*>(sm + L.out_in(int(k & 1)));
    const int rows = int(p.n - k * kTileT < kTileT ? p.n - k * kTileT : kTileT);
    tile_items(kTileT, cpb / 2, [&](int r, int j) {  // channels 2j and 2j + 1
      const int i = r * cpb + 2 * j;
      float4 s{0.f, 0.f, 0.f, 0.f}, o{0.f, 0.f, 0.f, 0.f};
      if (r < rows && 2 * j < nlive) {
        const float2 uu = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(ru + i));
        const float2 dd = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(rdt + i));
        const float2 bias = *reinterpret_cast<const float2*>(pbias + 2 * j), dsk = *reinterpret_cast<const float2*>(pD + 2 * j);
        const float d0 = softplus(dd.x + bias.x), d1 = softplus(dd.y + bias.y);
        s = make_float4(d0, d0 * uu.x, d1, d1 * uu.y);
        o.x = dsk.x * uu.x, o.z = dsk.y * uu.y;
        if constexpr (GATED) {
          const float2 zz = unpack_bf16x2(*reinterpret_cast<const uint32_t*>(rz + i));
          o.y = silu(zz.x), o.w = silu(zz.y);
        }
        if (2 * j + 1 >= nlive) s.z = s.w = o.z = o.w = 0.f;  // an odd last channel: its pair is not live
      }
      *reinterpret_cast<float4*>(step_in + i) = s;
      *reinterpret_cast<float4*>(oin + i) = o;
    });
    tile_items(kTileT, SMAX, [&](int r, int s) {
      const bool on = r < rows && s < p.state;
      bcf[r * 2 * SMAX + s] = on ? __bfloat162float(rb[r * SMAX + s]) : 0.f;
      bcf[r * 2 * SMAX + SMAX + s] = on ? __bfloat162float(rc[r * SMAX + s]) : 0.f;
    });
  };
  // Tile k's outputs: the lanes' shares of y summed, D u added, gated; stored for the rows before n. One channel per
  // thread, so that consecutive lanes read consecutive shares (16-byte loads without bank conflicts).
  const auto emit = [&](int64_t k) {
    const float2* oin = reinterpret_cast<const float2*>(sm + L.out_in(int(k & 1)));
    const int64_t t0 = k * kTileT;
    const int rows = int(p.n - t0 < kTileT ? p.n - t0 : kTileT);
    tile_items(rows, cpb, [&](int r, int cc) {
      if (cc >= nlive) return;
      const float4* q = reinterpret_cast<const float4*>(part + (r * cpb + cc) * G);
      float sum = 0.f;
#pragma unroll
      for (int v = 0; v < G / 4; ++v) {
        const float4 x = q[v];
        sum += (x.x + x.y) + (x.z + x.w);
      }
      const float2 o = oin[r * cpb + cc];
      const float y = sum + o.x;
      if constexpr ((OUT & kOutY) != 0) p.y[(t0 + r) * p.ld_y + c0 + cc] = __float2bfloat16(y);
      if constexpr (GATED) p.y_gated[(t0 + r) * p.ld_y + c0 + cc] = __float2bfloat16(y * o.y);
    });
  };
  tile_load<VEC, GATED>(p, L, sm, 0, c0, 0);
  cp_async_commit();
  tile_load<VEC, GATED>(p, L, sm, 1, c0, 1);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  convert(0);
  __syncthreads();
  for (int64_t k = 0; k < tiles; ++k) {
    // Tile k + 2 into the raw buffer tile k was converted from (before the last barrier).
    tile_load<VEC, GATED>(p, L, sm, int(k & 1), c0, k + 2);
    cp_async_commit();
    float* my_part = part + cl * G + g;
    // Step r + 1's inputs and exponentials are formed before step r's recurrences (the shared loads could not move
    // above the previous step's store of its share otherwise).
    struct StepVals {
      float e[SPL], bu[SPL], c[SPL];
    };
    const auto fetch = [&](int r) {
      const float2 si = step_in[r * cpb + cl];
      const float* brow = bcf + r * 2 * SMAX + g * SPL;
      float bb[SPL];
      StepVals v;
      if constexpr (SPL % 4 == 0) {
#pragma unroll
        for (int i = 0; i < SPL / 4; ++i) {
          const float4 b4 = reinterpret_cast<const float4*>(brow)[i], c4 = reinterpret_cast<const float4*>(brow + SMAX)[i];
          bb[4 * i] = b4.x, bb[4 * i + 1] = b4.y, bb[4 * i + 2] = b4.z, bb[4 * i + 3] = b4.w;
          v.c[4 * i] = c4.x, v.c[4 * i + 1] = c4.y, v.c[4 * i + 2] = c4.z, v.c[4 * i + 3] = c4.w;
        }
      } else if constexpr (SPL == 2) {
        const float2 b2 = *reinterpret_cast<const float2*>(brow), c2 = *reinterpret_cast<const float2*>(brow + SMAX);
        bb[0] = b2.x, bb[1] = b2.y, v.c[0] = c2.x, v.c[1] = c2.y;
      } else {
        static_assert(SPL == 1, "states per lane: 1, 2, 4 or 8");
        bb[0] = brow[0], v.c[0] = brow[SMAX];
      }
#pragma unroll
      for (int j = 0; j < SPL; ++j) {
        v.e[j] = ex2_approx(si.x * a2[j]);
        v.bu[j] = bb[j] * si.y;
      }
      return v;
    };
    StepVals cur = fetch(0);
#pragma unroll 4
    for (int r = 0; r < kTileT; ++r) {
      const StepVals next = fetch(r + 1 < kTileT ? r + 1 : r);
      float y = 0.f;
#pragma unroll
      for (int j = 0; j < SPL; ++j) {
        h[j] = fmaf(cur.e[j], h[j], cur.bu[j]);
        y = fmaf(cur.c[j], h[j], y);
      }
      my_part[r * cpb * G] = y;
      cur = next;
    }
    cp_async_wait<1>();  // this thread's copies of tile k + 1
    __syncthreads();     // every thread's copies landed, and the steps of tile k are done
    emit(k);
    if (k + 1 < tiles) convert(k + 1);
    __syncthreads();
  }
  cp_async_wait<0>();
  if (live && p.state_out) {
#pragma unroll
    for (int j = 0; j < SPL; ++j)
      if (g * SPL + j < p.state) p.state_out[int64_t(c) * p.state + g * SPL + j] = h[j];
  }
}

template <int G, int SPL, bool VEC, int OUT>
cudaError_t launch_tiled(const ScanParams& p, int cpb, cudaStream_t stream) {
  const TileSmem L{cpb, G * SPL, G};
  const auto kern = scan_tiled_kernel<G, SPL, VEC, OUT>;
  static uint32_t opted = 0;  // the shared memory this instantiation may use so far
  if (L.bytes() > opted) {
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L.bytes()));
    if (e != cudaSuccess) return e;
    opted = L.bytes();
  }
  kern<<<unsigned((p.channels + cpb - 1) / cpb), unsigned(cpb * G), L.bytes(), stream>>>(p, cpb);
  return cudaGetLastError();
}

template <int G, int SPL, bool VEC>
cudaError_t run_tiled_outputs(const ScanParams& p, int cpb, cudaStream_t stream) {
  if (p.y && p.y_gated) return launch_tiled<G, SPL, VEC, kOutY | kOutGated>(p, cpb, stream);
  if (p.y_gated) return launch_tiled<G, SPL, VEC, kOutGated>(p, cpb, stream);
  return launch_tiled<G, SPL, VEC, kOutY>(p, cpb, stream);
}

template <int G, int SPL>
cudaError_t run_tiled_vec(const ScanParams& p, int cpb, bool vec, cudaStream_t stream) {
  return vec ? run_tiled_outputs<G, SPL, true>(p, cpb, stream) : run_tiled_outputs<G, SPL, false>(p, cpb, stream);
}

// The block's channels: a multiple of 8, enough for one block per SM, at most 256 / G and what shared memory holds.
cudaError_t run_tiled(const ScanParams& p, cudaStream_t stream) {
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
  }
  const int G = tile_g(), smax = p.state <= 16 ? 16 : 32;
  int cpb = ((p.channels + sms - 1) / sms + 7) / 8 * 8;
  const int cmax = 1024 / G;
  cpb = cpb < 8 ? 8 : cpb > cmax ? cmax : cpb;
  while (cpb > 8 && TileSmem{cpb, smax, G}.bytes() > 200u * 1024u) cpb -= 8;
  bool vec = p.channels % 8 == 0 && p.state % 8 == 0 && p.ld_bc % 8 == 0 && p.ld_u % 8 == 0 && p.ld_dt % 8 == 0 &&
             p.ld_y % 8 == 0 && aligned16(p.u) && aligned16(p.dt) && aligned16(p.B) && aligned16(p.C) &&
             (!p.y || aligned16(p.y)) && (!p.y_gated || (aligned16(p.y_gated) && aligned16(p.z) && p.ld_z % 8 == 0));
  if (std::getenv("DS_SCAN_NOVEC")) vec = false;
  if (G == 16)
    return smax == 16 ? run_tiled_vec<16, 1>(p, cpb, vec, stream) : run_tiled_vec<16, 2>(p, cpb, vec, stream);
  if (G == 8)
    return smax == 16 ? run_tiled_vec<8, 2>(p, cpb, vec, stream) : run_tiled_vec<8, 4>(p, cpb, vec, stream);
  return smax == 16 ? run_tiled_vec<4, 4>(p, cpb, vec, stream) : run_tiled_vec<4, 8>(p, cpb, vec, stream);
}

// Short runs (n <= kScanSequentialMaxN, decoding's n = 1): one kernel, sequential over the tokens. A group of G
// consecutive lanes (a power of two >= state, within a warp) takes one channel, lane s its h[s]; y is the group's
// shuffle sum of C[t, s] h[s]. Every lane of a warp runs the same steps (lanes past the channels or the state only
// add 0), so the shuffles see full warps. Each lane reads and writes its own state element only: in place is safe.
// The next token's inputs are loaded before the current token's outputs are stored.
template <int G>
__global__ void __launch_bounds__(256) scan_sequential_kernel(const ScanParams p) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  const int64_t c64 = i / G;
  const int s = int(i % G);
  const bool live = c64 < p.channels, on = live && s < p.state;
  const int c = live ? int(c64) : 0;
  const float a = on ? p.A[int64_t(c) * p.state + s] : 0.f;
  float h = on && p.state_in ? p.state_in[int64_t(c) * p.state + s] : 0.f;
  const float bias = live ? p.dt_bias[c] : 0.f, dskip = live ? p.D[c] : 0.f;
  const bool gate = live && p.y_gated;
  struct Row {
    float u = 0.f, dt = 0.f, b = 0.f, cc = 0.f, z = 0.f;
  };
  const auto load = [&](int64_t t) {
    Row r;
    if (live) {
      r.u = __bfloat162float(p.u[t * p.ld_u + c]);
      r.dt = __bfloat162float(p.dt[t * p.ld_dt + c]);
      if (gate && s == 0) r.z = __bfloat162float(p.z[t * p.ld_z + c]);
    }
    if (on) {
      r.b = __bfloat162float(p.B[t * p.ld_bc + s]);
      r.cc = __bfloat162float(p.C[t * p.ld_bc + s]);
    }
    return r;
  };
  Row cur = load(0);
  for (int64_t t = 0; t < p.n; ++t) {
    const Row next = t + 1 < p.n ? load(t + 1) : Row{};
    const float delta = softplus(cur.dt + bias);
    h = fmaf(__expf(delta * a), h, delta * cur.b * cur.u);  // a = 0, b = 0 on idle lanes: h stays 0
    float y = cur.cc * h;
#pragma unroll
    for (int m = G / 2; m > 0; m /= 2) y += __shfl_xor_sync(0xffffffffu, y, m, G);
    if (live && s == 0) {
      y = fmaf(dskip, cur.u, y);
      if (p.y) p.y[t * p.ld_y + c] = __float2bfloat16(y);
      if (gate) p.y_gated[t * p.ld_y + c] = __float2bfloat16(y * silu(cur.z));
    }
    cur = next;
  }
  if (on && p.state_out) p.state_out[int64_t(c) * p.state + s] = h;
}

template <int G>
cudaError_t run_scan_sequential(const ScanParams& p, cudaStream_t stream) {
  const int64_t threads = int64_t(p.channels) * G;
  scan_sequential_kernel<G><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_causal_conv_silu(const __nv_bfloat16* x, int64_t ld_x, const float* w, const float* bias, int K,
                                    __nv_bfloat16* u, int64_t ld_u, int64_t n, int channels, cudaStream_t stream) {
  return launch_causal_conv_silu_state(x, ld_x, w, bias, K, u, ld_u, n, channels, nullptr, nullptr, stream);
}

cudaError_t launch_causal_conv_silu_state(const __nv_bfloat16* x, int64_t ld_x, const float* w, const float* bias,
                                          int K, __nv_bfloat16* u, int64_t ld_u, int64_t n, int channels,
                                          const __nv_bfloat16* state_in, __nv_bfloat16* state_out,
                                          cudaStream_t stream) {
  if (n <= 0 || channels <= 0 || K <= 0 || !x || !w || !u) return cudaErrorInvalidValue;
  // Without state (or with K = 1, where it has no rows) one kernel over all rows; with it, the head kernel takes the
  // first K - 1 rows and the state, the row kernel the rest (none for n <= K - 1: decoding is one launch).
  int64_t t_begin = 0;
  if ((state_in || state_out) && K > 1) {
    conv_silu_head_kernel<<<unsigned((channels + 255) / 256), 256, 0, stream>>>(x, ld_x, w, bias, K, u, ld_u, n,
                                                                                 channels, state_in, state_out);
    t_begin = K - 1;
  }
  if (n > t_begin && K <= 4 && channels % 8 == 0 && ld_x % 8 == 0 && ld_u % 8 == 0 && aligned16(x) && aligned16(u)) {
    const dim3 grid(unsigned((n - t_begin + CONV_ROWS - 1) / CONV_ROWS),
                    unsigned((channels / 8 + CONV_THREADS - 1) / CONV_THREADS));
    const auto go = [&](auto kern) {
      kern<<<grid, CONV_THREADS, 0, stream>>>(x, ld_x, w, bias, u, ld_u, t_begin, n, channels);
    };
    if (K == 4) go(conv_silu_vec8_kernel<4>);
    else if (K == 3) go(conv_silu_vec8_kernel<3>);
    else if (K == 2) go(conv_silu_vec8_kernel<2>);
    else go(conv_silu_vec8_kernel<1>);
    return cudaGetLastError();
  }
  if (n > t_begin) {
    const int64_t total = (n - t_begin) * channels;
    conv_silu_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(x, ld_x, w, bias, K, u, ld_u, t_begin, n,
                                                                        channels);
  }
  return cudaGetLastError();
}

size_t selective_scan_workspace(const ScanParams& p) {
  if (p.n <= kScanSequentialMaxN) return 0;
  const int64_t chunks = (p.n + CHUNK - 1) / CHUNK;
  return size_t(chunks) * size_t(p.channels) * size_t(p.state + 1) * sizeof(float);
}

cudaError_t launch_selective_scan(const ScanParams& p, void* workspace, cudaStream_t stream) {
  if (p.n <= 0 || p.channels <= 0 || p.state <= 0 || p.state > 32 || !p.u || !p.dt || !p.dt_bias || !p.A || !p.B ||
      !p.C || !p.D || (!p.y && !p.y_gated) || (p.y_gated && !p.z))
    return cudaErrorInvalidValue;
  if (p.n <= kScanSequentialMaxN)
    return p.state <= 8 ? run_scan_sequential<8>(p, stream)
                        : p.state <= 16 ? run_scan_sequential<16>(p, stream) : run_scan_sequential<32>(p, stream);
  static const bool chunked = std::getenv("DS_SCAN_CHUNKED") && std::getenv("DS_SCAN_CHUNKED")[0] == '1';
  if (!chunked) return run_tiled(p, stream);
  if (!workspace) return cudaErrorInvalidValue;
  // the chunked passes address rows with 32-bit byte strides
  for (int64_t ld : {p.ld_u, p.ld_dt, p.ld_z, p.ld_y})
    if (ld < 0 || 2 * ld > int64_t(UINT32_MAX)) return cudaErrorInvalidValue;
  const int64_t chunks = (p.n + CHUNK - 1) / CHUNK;
  float* hs = static_cast<float*>(workspace);
  float* ds = hs + chunks * p.channels * p.state;
  return p.state <= 16 ? run_scan_any<16>(p, hs, ds, stream) : run_scan_any<32>(p, hs, ds, stream);
}

}  // namespace ds::kern
