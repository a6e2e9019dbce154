// diffscope-bench --only scan (cuda_bench.h): corpus-scan throughput on the loaded model against forward-only
// throughput in the same run. A scanned prompt is what ds::scan::Run::scan asks of the backend for a prompt
// without a target (engine/session/session_scan.h): the forward (next-token logits to the host) and, for every attention
// layer, the last row's answer / sink / context masses reduced on the device (Backend::row_mass). Also: whether
// batching prompts would pay (forward throughput at batch 4 against batch 1).
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

namespace ds::cuda {
class CudaBackend;
}

namespace ds {
nlohmann::json bench_scan(cuda::CudaBackend& b, const std::vector<float>& lambda, const std::vector<int64_t>& lengths,
                          int prompts, int warm_ms);
}  // namespace ds
