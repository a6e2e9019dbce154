// The selective scan runs time in parallel chunks for long runs and sequentially for short ones (below); the
// convolution is element-wise over (token, channel), K taps read from the previous rows (8 channels by 16 rows per
// thread where the layout allows).
#include "mamba_scan.h"
#include "align.h"
#include "fast_math.cuh"

namespace ds::kern {
namespace {

constexpr int THREADS = 128;

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
