// SwiGLU of the fused gate/up projection: out = silu(gate) * up, bf16 in (the GEMM rounds gate and up to bf16, as
// transformers' gate_proj / up_proj outputs are bf16 in a bf16 model), f32 arithmetic, bf16 out (the down
// projection's input).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// gate_up [rows, 2 I] bf16 (gate in columns [0, I), up in [I, 2I)); out [rows, I] bf16.
cudaError_t launch_swiglu(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int64_t rows, int inter,
                          cudaStream_t stream);

}  // namespace ds::kern
