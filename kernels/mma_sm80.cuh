// Device helpers for the tensor-core kernels: cp.async (16-byte, zero-filling), ldmatrix, mma.sync m16n8k16 bf16
// with f32 accumulation, and the 128-byte XOR swizzle used for every shared-memory tile. sm_80 and newer.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

namespace ds::kern {

// Per-row output factor of a differential head, (1 - lambda_init) / RMS over its WIDTH = 2d columns, for the
// thread's two rows of an mma/wgmma accumulator: `ss` holds this thread's partial sums of squares, and the quad of
// lanes sharing the rows adds its four.
template <int WIDTH>
__device__ __forceinline__ void quad_rms_factors(float (&ss)[2], float eps, float out_scale, float (&f)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 1);
    ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], 2);
    f[r] = rsqrtf(ss[r] * (1.f / WIDTH) + eps) * out_scale;
  }
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

// mbarriers (sm_80): a cp.async-tracked arrive (the barrier's phase completes when `count` threads' earlier
// cp.async copies have landed, `.noinc`: the init count includes these arrivals) and a spinning parity wait.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// Named barriers: bar.sync waits for `count` threads (arrivals included), bar.arrive only counts this warp in.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
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
