// Small element-wise kernels of the hybrid families' layers (SambaY): projection biases added in place, and the
// gated memory unit's silu(a) * b.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// y[r, c] += bias[c] for rows r < rows, columns c < cols; y's rows ld apart. bf16 y rounds once after the add.
cudaError_t launch_add_bias(__nv_bfloat16* y, int64_t ld, const float* bias, int64_t rows, int cols,
                            cudaStream_t stream);
cudaError_t launch_add_bias(float* y, int64_t ld, const float* bias, int64_t rows, int cols, cudaStream_t stream);
// out[r, c] = silu(a[r, c]) * b[r, c] in f32, bf16 in and out, each operand with its own row stride.
cudaError_t launch_silu_mul(const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                            __nv_bfloat16* out, int64_t ldo, int64_t rows, int cols, cudaStream_t stream);

}  // namespace ds::kern
