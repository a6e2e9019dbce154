// SwiGLU's element: silu(g) * u = g / (1 + exp(-g)) * u in f32 (IEEE expf and division), as torch computes its bf16
// silu; the caller rounds once. One definition for every kernel that forms it (swiglu.cu, gemv.cu,
// gemm_swiglu_sm90.cu), so that the fused and unfused paths round alike.
#pragma once

namespace ds::kern {

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + expf(-g)) * u; }

}  // namespace ds::kern
