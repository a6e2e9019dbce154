// diffscope-bench --only decode (cuda_bench.h): batch-1 greedy decoding on the loaded model after prompts of the
// given lengths, per token as a user gets it (the step, the greedy choice on the device, 8 bytes back), against
// the memory-bandwidth floor: weight bytes plus the KV cache bytes a token reads, over the device-to-device copy
// bandwidth measured in the same run.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

namespace ds::cuda {
class CudaBackend;
}

namespace ds {
nlohmann::json bench_decode(cuda::CudaBackend& b, const std::vector<float>& lambda, const std::vector<int64_t>& prompts,
                            int tokens, int warm_ms);
}  // namespace ds
