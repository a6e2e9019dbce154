// LayerNorm of f32 rows into bf16 (SambaY's block norms, nn.LayerNorm with weight and bias):
// y = (x - mean(x)) * rsqrt(var(x) + eps) * w + b, biased variance, f32 arithmetic.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// x [rows, cols] with row stride x_stride (f32), w, b [cols] f32, y [rows, cols] with row stride y_stride (bf16).
cudaError_t launch_layernorm(const float* x, int64_t x_stride, const float* w, const float* b, __nv_bfloat16* y,
                             int64_t y_stride, int64_t rows, int cols, float eps, cudaStream_t stream);

}  // namespace ds::kern
