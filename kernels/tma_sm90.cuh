// TMA (cp.async.bulk.tensor) for the attention kernels: the device side (sm_90 and newer; elsewhere these trap, and
// the launchers never pick a kernel that needs them) and the host side, the 3-D tensor maps over the packed QKV
// input and the output (defined in attn_fwd_sm90.cu).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "attn_params.h"

namespace ds::kern {

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#else
  __trap();
#endif
}
// Box (c0 column, c1 row) of a 2-D `map` into shared memory at dst; completes its bytes on mbarrier bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}
// Box (c0 column, c1 token, c2 sequence) of `map` into shared memory at dst; completes `bytes` on mbarrier bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}
// Makes mbarrier.init visible to the copy engine (the async proxy) before the first TMA names the barrier.
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// A [batch][n][row_stride] bf16 tensor (the QKV input, the separate K/V input of AttnParams::kv, or the output) as a
// 3-D TMA map (column, token, batch) with boxes of 64 columns x rows tokens, 128-byte swizzle: the box lands as
// [rows][64] with 16-byte chunk c of row r at chunk c ^ (r % 8), from a 1024-byte aligned address. Loads of tokens
// past n read zeros, stores there are dropped. False when the driver's encoder is not reachable or refuses.
bool make_attn_tma_map(CUtensorMap& m, const bf16* base, int64_t row_stride, int64_t batch_stride, const AttnParams& p,
                       int rows);
// A row-major [rows][row_stride] bf16 matrix (columns [0, cols)) as a 2-D map with boxes of 64 columns x box_rows
// rows, 128-byte swizzle as above; reads past cols or rows fill zeros. Base and row_stride * 2 must be multiples of
// 16 bytes.
bool make_tma_map_2d(CUtensorMap& m, const bf16* base, int64_t cols, int64_t rows, int64_t row_stride, int box_rows);

}  // namespace ds::kern
