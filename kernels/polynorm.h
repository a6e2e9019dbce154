// PolyNorm-gated MLP activation (Motif; engine/core/arch.h, MlpAct::PolyNorm) of the fused gate/up projection:
// out = (w0 N(g^3) + w1 N(g^2) + w2 N(g) + b) * up, N(z) = z / sqrt(mean(z^2) + eps) over the row's I gate values.
// bf16 in (the GEMM's rounding of gate and up, as in a bf16 transformers model), f32 arithmetic, bf16 out.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ds::kern {

// gate_up [rows, 2 I] bf16 (gate in columns [0, I), up in [I, 2I)); wb: device f32 {w0, w1, w2, b}; out [rows, I].
cudaError_t launch_polynorm_mul(const __nv_bfloat16* gate_up, const float* wb, float eps, __nv_bfloat16* out,
                                int64_t rows, int inter, cudaStream_t stream);

}  // namespace ds::kern
