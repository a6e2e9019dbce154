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

// Copies row_bytes (a multiple of 4, both addresses 4-byte aligned) from src + src_row * src_stride to
// dst + dst_row * dst_stride, bytes and strides in bytes; the rows are read from device memory (null: row 0), so
// that a CUDA graph of a decoding step writes each new position's row into the caches at the position it reads.
cudaError_t launch_copy_row(const void* src, int64_t src_stride, const int32_t* src_row, void* dst, int64_t dst_stride,
                            const int32_t* dst_row, int64_t row_bytes, cudaStream_t stream);

// `count` rows at once into caches laid out [count][..][row_bytes]: src + i * src_stride goes to
// dst + i * dst_stride + *row * row_bytes (bytes; the same 4-byte rules as launch_copy_row).
cudaError_t launch_copy_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, const int32_t* row,
                             int64_t row_bytes, int count, cudaStream_t stream);

// Columns [c0, c1) of `rows` rows of x (row stride ld) times f, in place (a writer hook's head ablation).
cudaError_t launch_scale_columns(__nv_bfloat16* x, int64_t ld, int64_t rows, int c0, int c1, float f,
                                 cudaStream_t stream);
// The mean ablation (forward.h mean_head_hook): compute true: mean[c - c0] = the mean over the rows of column c
// (f32, summed in f32 per block of rows then across them); then every row's columns [c0, c1) = mean (bf16).
cudaError_t launch_mean_columns(__nv_bfloat16* x, int64_t ld, int64_t rows, int c0, int c1, float* mean, bool compute,
                                cudaStream_t stream);
// *slot = max(*slot, max |x[r, c]|) over rows r < rows, columns c < cols (x's rows ld apart), by an atomic max on
// the float's bits (non-negative floats order as their bits; a NaN in x wins over every number). *slot must start
// non-negative (0). One launch per reader site: the Table 5 reader (forward.h max_abs_hidden_hook).
cudaError_t launch_max_abs(const float* x, int64_t ld, int64_t rows, int cols, float* slot, cudaStream_t stream);
// The same for `count` tensors of one shape layer_stride elements apart, tensor i into slot[i], in one launch (the
// reader's sites of a whole forward: every layer's output in the stream [L + 1][cap][E]).
cudaError_t launch_max_abs_many(const float* x, int64_t layer_stride, int count, int64_t ld, int64_t rows, int cols,
                                float* slot, cudaStream_t stream);

}  // namespace ds::kern
