// See cuda_bench_generate.h.
#include "app/bench/cuda_bench_generate.h"
#include "app/bench/bench_median.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "app/bench/cuda_bench_decode.h"
#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/sampling.h"

namespace ds {
namespace {

using cuda::CudaBackend;
using cuda::CudaEvent;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

}  // namespace

json bench_decode(CudaBackend& b, const std::vector<float>& lambda, const std::vector<int64_t>& prompts, int tokens,
                  int warm_ms) {
  const ModelConfig& c = b.config();
  const double bw = copy_bandwidth(b.stream());
  // Bytes a step must read: every weight but the embedding table (one row of it; when tied it is the lm_head and
  // read once), and K and V of every earlier position in every layer.
  const double weights = double(b.weight_bytes()) - (c.tie_embeddings ? 0.0 : double(c.vocab * c.hidden * 2));
  std::printf("\ndecode, batch 1 (copy bandwidth %.0f GB/s, weights read per token %.2f GB)\n", bw / 1e9, weights / 1e9);
  std::printf("%-10s %12s %12s %12s %12s %8s %10s %14s\n", "prompt", "ms/token", "tok/s", "gpu ms/step", "floor ms",
              "ratio", "replays", "logits->host");
  json rows = json::array();
  std::mt19937 rng(7);
  std::vector<float> host_logits(size_t(c.vocab));
  Sampler greedy;
  for (int64_t n : prompts) {
    if (n + tokens + 8 > b.max_tokens()) {
      std::printf("%-10lld skipped: too long for this device's memory\n", (long long)n);
      continue;
    }
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& t : ids) t = int32_t(rng() % uint32_t(c.vocab));
    b.run(ids.data(), 1, n, lambda, 0, true, true);
    b.sync();
    DS_CUDA_CHECK(cudaMemcpy(host_logits.data(), b.logits_dev(), host_logits.size() * 4, cudaMemcpyDeviceToHost));
    int32_t next = greedy.pick(host_logits.data(), c.vocab);
    // What Session::generate_step does per greedy token: the backend's decoding forward with the logits left on
    // the device and the greedy choice made there (8 bytes to the host).
    ForwardRequest req;
    req.ids = ids;
    req.lambda = lambda;
    req.logits_on_demand = true;
    ForwardResult res;
    auto step = [&] {
      req.append_from = int64_t(req.ids.size());
      req.ids.push_back(next);
      b.forward(req, res);
      next = res.argmax;
    };
    const auto tw = Clock::now();
    int warm = 0;
    while (warm < 4 || std::chrono::duration<double, std::milli>(Clock::now() - tw).count() < warm_ms / 4.0) {
      step();
      ++warm;
      if (warm > 256) break;
    }
    const int64_t replays0 = b.decode_graph_replays();
    std::vector<double> per;
    for (int i = 0; i < tokens; ++i) {
      const auto t0 = Clock::now();
      step();
      per.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    // The same with the whole row of logits to the host and the greedy choice there (sampling's path, and what a
    // greedy step cost before the choice moved to the device).
    std::vector<double> per_host;
    req.logits_on_demand = false;
    for (int i = 0; i < tokens / 2; ++i) {
      const auto t0 = Clock::now();
      req.append_from = int64_t(req.ids.size());
      req.ids.push_back(next);
      b.forward(req, res);
      next = greedy.pick(res.logits.data(), c.vocab);
      per_host.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    req.logits_on_demand = true;
    // The step alone on the device: graph replays back to back, timed with events (the host's share is the rest).
    CudaEvent e0, e1;
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), b.stream()));
    const int dev_steps = 16;
    for (int i = 0; i < dev_steps; ++i) b.decode_step(next, lambda);
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), b.stream()));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float dev_ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&dev_ms, e0.get(), e1.get()));
    const int64_t ctx = n + warm + tokens / 2;  // the median token's context (of the timed greedy steps)
    const double kv = double(c.map_layers().size()) * double(ctx) * 2.0 * double(c.kv_heads * c.head_dim) * 2.0;
    const double floor_ms = (weights + kv) / bw * 1e3;
    const double ms = median(per);
    json r{{"name", "diffscope_cuda_decode"}, {"prompt", n}, {"tokens", tokens}, {"ms_per_token", ms},
           {"tok_s", 1e3 / ms}, {"gpu_ms_per_step", dev_ms / dev_steps}, {"floor_ms", floor_ms},
           {"ratio_to_floor", ms / floor_ms}, {"kv_bytes", kv}, {"weight_bytes", weights}, {"copy_gbs", bw / 1e9},
           {"graph_replays", b.decode_graph_replays() - replays0},
           {"ms_per_token_logits_to_host", median(per_host)}};
    // One step with every launch timed (eager): where the step's time goes.
    b.set_decode_profile(true);
    b.decode_step(next, lambda);
    b.sync();
    b.build_profile(0, n, 0, 1, n);
    b.set_decode_profile(false);
    json kernels = json::array();
    for (const KernelTiming& k : b.profile().kernels)
      kernels.push_back({{"name", k.name}, {"count", k.count}, {"total_ms", k.total_ms}});
    r["step_kernels"] = kernels;
    std::printf("%-10lld %12.3f %12.1f %12.3f %12.3f %8.2f %10lld %14.3f\n", (long long)n, ms, 1e3 / ms,
                dev_ms / dev_steps, floor_ms, ms / floor_ms, (long long)(b.decode_graph_replays() - replays0),
                median(per_host));
    rows.push_back(r);
    std::printf("           eager step:");
    for (const json& k : kernels)
      std::printf(" %s %.3f,", k["name"].get<std::string>().c_str(), k["total_ms"].get<double>());
    std::printf("\n");
  }
  return rows;
}

}  // namespace ds
