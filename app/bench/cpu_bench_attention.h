// diffscope-bench --backend cpu --only attention (cpu_bench_attention.cpp): the CPU backend's tiled attention
// (engine/cpu/detail/backend_cpu_attention.h) timed alone, one layer's causal differential attention over all view heads on the
// thread pool, as CpuBackend's attention_block runs it, at two DiffLlama head shapes (the bundled demo model's and
// kajuma/DiffLlama-0.3B-handcut's) and 1K / 3K / 8K tokens. Reported against two yardsticks measured in the same run:
// this machine's OpenBLAS sgemm rate (the CPU's practical f32 matrix peak) and PyTorch's CPU
// scaled_dot_product_attention on the same shapes (bench/peers/peer_cpu_attention.py, when --peer-python is given).
// Plain C++ (no CUDA): built in every build.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ds {

struct CpuAttnBenchOptions {
  std::vector<int64_t> tokens = {1024, 3072, 8192};  // --attn-tokens
  int repeat = 5;                                    // timed runs per row after one warm-up; the median is reported
  int threads = 0;                                   // the pool's and OpenBLAS's threads; 0: all cores
  std::string peer_python;                           // --peer-python: the Python that runs the peer; empty: no peer
};

// Prints the table on stdout (progress on stderr) and returns the section's JSON. A peer that cannot run or fails
// leaves {"error": ...} under "peer"; our rows are reported regardless.
nlohmann::json bench_cpu_attention(const CpuAttnBenchOptions& o);

// A field of /proc/self/status in kB ("VmRSS:", "VmHWM:"); -1 when it cannot be read.
long proc_status_kb(const char* field);

}  // namespace ds
