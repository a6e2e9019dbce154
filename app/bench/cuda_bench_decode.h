// diffscope-bench --only decode_attn (cuda_bench.h): the decoding attention kernel (kernels/attn_decode.h) alone,
// one query row of a batch-1 sequence at the kajuma/DiffLlama-0.3B-handcut attention shape, against the
// device-to-device copy bandwidth measured in the same run.
#pragma once
#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

namespace ds {
nlohmann::json bench_decode_attn(int repeat, int warmup_ms);
// Bytes read plus bytes written per second by a device-to-device cudaMemcpyAsync of 1 GiB on `s`, median of 10
// after 3: the bandwidth the decoding benchmarks compare against.
double copy_bandwidth(cudaStream_t s);
}  // namespace ds
