// The CUDA benchmark suite that diffscope-bench --backend cuda runs (cuda_bench.cpp, compiled only in builds with
// CUDA; this header is plain C++ so that diffscope_bench.cpp parses the options in every build). Sections:
//   attention  fused differential attention, causal bf16, 12 heads d=128 and 16 heads d=64 at n = 2K x 8, 4K x 4,
//              8K x 2, 16K x 1: for each shape the kernel the dispatcher picks by default (kernels/attn_dispatch.h)
//              and every other fused kernel it grants for the shape; ms, tokens/s, TFLOP/s (12 n^2 d per head,
//              halved for causal), fraction of the cuBLAS bf16 GEMM peak measured in the same process
//   model      whole-model prefill (next-token logits only) on random bf16 weights generated on the GPU, shaped
//              like kajuma/DiffLlama-0.3B-handcut (huggingface.co), 1 x 1024, 1 x 2048 and 8 x 2048 tokens
//   lambda     lambda change at a 1024-token prompt: recompute from the middle layer, that layer's map statistics
//              on the GPU, next-token probabilities (and the same with all maps of the layer copied to the host)
//   table7     Table 7 of the Differential Transformer paper (p. 15): forward throughput with next-token logits
//              of a 3B DIFF model (DiffLlama, 12 differential heads of d = 128) against its Transformer twin (Llama,
//              24 heads of 128), random bf16 weights, 2K x 8 and 4K x 4 tokens; ms, tokens/s, DIFF/Transformer
//              ratio beside the paper's (depth, MLP width and vocabulary are assumptions the JSON states)
//   decode_attn  decoding attention alone (cuda_bench_decode.h): kajuma shape, n 1K-128K, K+V GB/s vs copy bandwidth
//   decode     batch-1 greedy decoding of the kajuma-shaped model after 1K, 8K and 32K-token prompts
//              (cuda_bench_generate.h): ms per token as Session::generate_step gives it, against the bandwidth floor
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace ds {

struct CudaBenchOptions {
  std::set<std::string> only;  // --only: the sections to run (cuda_bench_sections()); empty: all
  int repeat = 20;             // --repeat: timed runs per row, the median is reported
  // --warmup-ms: before timing a row, its work runs for at least this long (and at least a few times): on an H200
  // the speed of a ~1 ms kernel right after start-up depends on what ran before (clocks and power state settle over
  // hundreds of ms: 23.4 vs 26.3 M tokens/s for the same attention launch after 3 warm-up runs, 2026-11-21), so
  // every row is timed in the steady state of running itself. The PyTorch peers are warmed the same way.
  int warmup_ms = 1000;
  // --attn-kernel: time only this implementation (a name kern::parse_attn_impl takes; "auto": only the default
  // choice). Empty: the default choice and every other fused implementation select_attn grants for the shape.
  std::string attn_kernel;
  int attn_d = 0;         // --attn-d: only this head dim, 64 or 128 (0: both)
  std::string model_dir;  // --model: the model benchmark also runs on this checkpoint
};

// The names --only takes.
inline const std::set<std::string>& cuda_bench_sections() {
  static const std::set<std::string> s = {"attention", "model",     "lambda", "table7",     "motif",
                                          "mamba",     "phi4flash", "energy", "views",  "decode_attn", "decode",
                                          "scan"};
  return s;
}

// Throws std::invalid_argument naming the option when one names nothing this build has (a section, a kernel, a
// head dim).
void check_cuda_bench_options(const CudaBenchOptions& o);

nlohmann::json run_cuda_benchmarks(const CudaBenchOptions& o);

}  // namespace ds
