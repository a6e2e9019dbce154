// SwiGLU's element: silu(g) * u = g / (1 + e^-g) * u in f32 on the special-function unit (fast_math.cuh: ex2 and
// rcp approximations, a few f32 ulp, far below the bf16 rounding the caller applies once; within one bf16 step of
// float64 everywhere, CudaKernels.SwigluPolyNormAndEmbeddingMatchFloat64). One definition for every kernel that
// forms it (swiglu.cu, elementwise.cu, gemv.cu, gemm_swiglu_sm90.cu), so that the fused and unfused paths round alike.
#pragma once

#include "fast_math.cuh"

namespace ds::kern {

__device__ __forceinline__ float silu_mul(float g, float u) { return silu(g) * u; }

}  // namespace ds::kern
