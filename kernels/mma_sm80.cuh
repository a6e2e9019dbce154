// Device helpers for the tensor-core kernels: cp.async (16-byte, zero-filling), named barriers and mbarriers,
// ldmatrix, mma.sync m16n8k16 bf16 with f32 accumulation, the 128-byte XOR swizzle used for every shared-memory
// tile, and the online softmax over accumulator rows shared by the mma.sync and wgmma attention kernels. sm_80 and
// newer.
#pragma once
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

namespace ds::kern {

// Sums a value over the quad of lanes that share an mma accumulator row, for the thread's two rows.
__device__ __forceinline__ void quad_sum(float (&v)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    v[r] += __shfl_xor_sync(0xffffffffu, v[r], 1);
    v[r] += __shfl_xor_sync(0xffffffffu, v[r], 2);
  }
}

// Reduces with `op` the N values a thread holds of its two rows in the mma.sync / wgmma accumulator layout (value i
// belongs to row (i >> 1) & 1) as a pairwise tree: log2(N) - 1 dependent steps per row instead of a chain of N / 2
// (the online softmax's row maxima and sums: +1-3% on the mma.sync V-split kernel at d = 64 and +1-4% on the wgmma
// kernels at n <= 8192 on the H200, bench/cuda_notes.md).
template <int N, class Op>
__device__ __forceinline__ void rows_tree(const float (&v)[N], float (&out)[2], Op op) {
  static_assert(N >= 4 && (N & (N - 1)) == 0, "a power of two");
  float t[2][N / 4];
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    t[0][i] = op(v[4 * i], v[4 * i + 1]);
    t[1][i] = op(v[4 * i + 2], v[4 * i + 3]);
  }
  constexpr int LEVELS = __builtin_ctz(N / 4);  // fixed trip counts, so that t stays in registers
#pragma unroll
  for (int l = 0; l < LEVELS; ++l)
#pragma unroll
    for (int i = 0; i < N / 8; ++i)
      if (i < (N / 8 >> l)) {
        t[0][i] = op(t[0][i], t[0][i + (N / 8 >> l)]);
        t[1][i] = op(t[1][i], t[1][i + (N / 8 >> l)]);
      }
  out[0] = t[0][0];
  out[1] = t[1][0];
}
__device__ __forceinline__ float max_op(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float add_op(float a, float b) { return a + b; }

// The running row maximum that a tile's exponentials are taken against (log2 units, scale folded in). It moves only
// when the tile's maximum exceeds it by more than 8, so P <= 2^8 (bf16 keeps its relative precision there; the f32
// sums are far from overflow) and the O rescale, skipped while no row's maximum moves, runs on few tiles. The
// result is the same up to rounding: O and l share the reference. Measured on the H200 (bench/cuda_notes.md): +5-8%
// on the wgmma kernel at d = 128, +2-4% at d = 64, 0-2% on the mma.sync kernels.
__device__ __forceinline__ float lazy_max(float m_run, float m_tile) { return m_tile > m_run + 8.f ? m_tile : m_run; }

// exp2 on the special-function unit, flushing denormal results to zero (they are below bf16's P resolution);
// exp2f adds range fix-ups around the same instruction.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax of one tile in place, in the mma.sync / wgmma accumulator layout (value i belongs to the thread's
// row (i >> 1) & 1; the quad of lanes sharing a row holds its columns): s becomes P = exp2(s * sl2 - m) (f32,
// unnormalised), m_run and l_run (this thread's partial row sum) move on, alpha is the factor for O. FAST:
// ex2.approx.ftz, else exp2f (wgmma v4). TREE: row maxima and sums as pairwise trees (rows_tree), else one
// dependent chain per row (the d = 128 mma.sync kernel, whose other warps cover the softmax's latency: trees
// measured 1% slower when it was skewed, equal since it uses mbarriers).
template <int N, bool FAST = true, bool TREE = true>
__device__ __forceinline__ void online_softmax(float (&s)[N], float (&m_run)[2], float (&l_run)[2], float sl2,
                                               float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY}, rs[2] = {0.f, 0.f};
  if constexpr (TREE) {
    rows_tree(s, mx, max_op);
  } else {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      mx[0] = fmaxf(mx[0], fmaxf(s[4 * i], s[4 * i + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = lazy_max(m_run[r], mx[r] * sl2);  // finite: the diagonal tile comes first
    alpha[r] = FAST ? ex2_ftz(m_run[r] - m_new) : exp2f(m_run[r] - m_new);
    m_run[r] = m_new;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s[i] = FAST ? ex2_ftz(fmaf(s[i], sl2, -m_run[(i >> 1) & 1])) : exp2f(fmaf(s[i], sl2, -m_run[(i >> 1) & 1]));
    if constexpr (!TREE) rs[(i >> 1) & 1] += s[i];
  }
  if constexpr (TREE) rows_tree(s, rs, add_op);
  l_run[0] = l_run[0] * alpha[0] + rs[0];
  l_run[1] = l_run[1] * alpha[1] + rs[1];
}

// A tile's softmax with the row maxima held where an earlier tile left them (attn_fwd_sm90.cu's first pass over
// the key tiles): P = 2^(s * sl2 - m), l_run += its row sums; no maximum, no shuffles, nothing to rescale. P may
// exceed 1 or overflow; the caller checks l and O afterwards.
template <int N>
__device__ __forceinline__ void softmax_fixed_max(float (&s)[N], const float (&m_run)[2], float (&l_run)[2],
                                                  float sl2) {
  float rs[2];
#pragma unroll
  for (int i = 0; i < N; ++i) s[i] = ex2_ftz(fmaf(s[i], sl2, -m_run[(i >> 1) & 1]));
  rows_tree(s, rs, add_op);
  l_run[0] += rs[0];
  l_run[1] += rs[1];
}

// Per-row output factor of a differential head, (1 - lambda_init) / RMS over its WIDTH = 2d columns, for the
// thread's two rows of an mma/wgmma accumulator: `ss` holds this thread's partial sums of squares, and the quad of
// lanes sharing the rows adds its four.
template <int WIDTH>
__device__ __forceinline__ void quad_rms_factors(float (&ss)[2], float eps, float out_scale, float (&f)[2]) {
  quad_sum(ss);
#pragma unroll
  for (int r = 0; r < 2; ++r) f[r] = rsqrtf(ss[r] * (1.f / WIDTH) + eps) * out_scale;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros (rows past the end of a sequence).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Named barriers: `count` threads (a multiple of 32) of the CTA meet at barrier `id`; bar.arrive marks this warp's
// arrival without waiting (a producer's half of a producer/consumer pair).
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// mbarriers in shared memory (sm_80 and newer).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives once every cp.async this thread issued before has landed (noinc: the barrier's count includes it).
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier counts the phase before its first,
// parity 1, as completed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
#else
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
#endif
  } while (!done);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for one m16n8k16 tile (A row-major 16x16, B "col" 16x8, C 16x8 in f32).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Element offset of (row, col) in a bf16 tile whose rows are `width` elements (width*2 a multiple of 128 bytes):
// the 16-byte chunk index is XORed with row % 8, so the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int WIDTH>
__device__ __forceinline__ int swz(int row, int col) {
  static_assert(WIDTH % 64 == 0, "swizzled rows must be a multiple of 128 bytes");
  return row * WIDTH + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

}  // namespace ds::kern
