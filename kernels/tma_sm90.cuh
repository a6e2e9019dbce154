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
// The same box into the same shared-memory offset of every CTA of the cluster in `mask`; each CTA's mbarrier at
// offset `bar` completes the bytes that land there.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                      uint32_t bar, uint16_t mask) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
#else
  __trap();
#endif
}
// Thread block clusters: this CTA's rank, an arrival on the mbarrier at the same offset in CTA `rank`, and the
// cluster-wide barrier split in its two halves (no thread of the cluster may exit between its arrive and the
// others' waits while they still name its shared memory).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
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

}  // namespace ds::kern
