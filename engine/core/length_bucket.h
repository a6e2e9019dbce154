// The prompt lengths that share a timed GEMM choice (the CUDA backend's autotuner, backend_cuda_gemm.cpp) and that a
// scan over several devices therefore schedules together (session_scan_queue.h).
#pragma once
#include <cstdint>

namespace ds {

// The tokens rounded up to an eighth of their power of two (exact up to 64): the GEMMs of prompts whose lengths fall in
// one bucket are timed once. (A corpus of prompts of many lengths paid the timing, which synchronises, up to ~0.1 s a
// shape, at every prompt: half of a mixed-length scan's time on the H200, bench/EXPERIMENTS.md.)
inline int64_t gemm_length_bucket(int64_t n) {
  if (n <= 64) return n;
  int64_t step = 1;
  while ((step << 4) <= n) step <<= 1;  // 8 <= n / step < 16
  return (n + step - 1) / step * step;
}

}  // namespace ds
