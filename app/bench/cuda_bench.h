// The CUDA benchmark suite that diffscope-bench --backend cuda runs (only in builds with DS_HAVE_CUDA):
//   attention  fused differential attention, causal bf16, 12 heads d=128 and 16 heads d=64 at n = 2K x 8, 4K x 4,
//              8K x 2, 16K x 1: ms, tokens/s, TFLOP/s (12 n^2 d per head, halved for causal), fraction of the
//              cuBLAS bf16 GEMM peak measured in the same process
//   model      whole-model prefill (next-token logits only) on random bf16 weights generated on the GPU, shaped
//              like kajuma/DiffLlama-0.3B-handcut (REFERENCE 2a), 1 x 1024, 1 x 2048 and 8 x 2048 tokens
//   lambda     lambda change at a 1024-token prompt: recompute from the middle layer, that layer's map statistics
//              on the GPU, next-token probabilities (and the same with all maps of the layer copied to the host)
// args: extra words of the command line: --only attention|model|lambda (repeatable), --repeat N (default 20).
// model_dir: when given, the model and lambda benchmarks also run on that checkpoint.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ds {

nlohmann::json run_cuda_benchmarks(const std::vector<std::string>& args, const std::string& model_dir);

}  // namespace ds
