// See cuda_bench_scan.h.
#include "app/bench/cuda_bench_scan.h"
#include "app/bench/bench_median.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "engine/cuda/detail/backend_cuda_impl.h"

namespace ds {
namespace {

using cuda::CudaBackend;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

json bench_scan(CudaBackend& b, const std::vector<float>& lambda, const std::vector<int64_t>& lengths, int prompts,
                int warm_ms) {
  const ModelConfig& c = b.config();
  std::vector<int> layers;
  for (int l = 0; l < int(c.layers); ++l)
    if (c.has_maps(l)) layers.push_back(l);
  std::printf("\ncorpus scan, batch 1 (%zu attention layers x %lld view heads; per prompt: forward + row masses)\n",
              layers.size(), static_cast<long long>(c.view_heads()));
  std::printf("%-8s %12s %12s %12s %14s %14s %8s\n", "tokens", "forward ms", "scan ms", "masses ms", "fwd prompts/s",
              "scan prompts/s", "ratio");
  json rows = json::array();
  std::mt19937 rng(11);
  for (int64_t n : lengths) {
    if (n > b.max_tokens()) {
      std::printf("%-8lld skipped: too long for this device's memory\n", static_cast<long long>(n));
      continue;
    }
    // Fresh random prompts; the answer span sits at a random depth.
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(prompts));
    for (auto& v : ids) {
      v.resize(size_t(n));
      for (auto& t : v) t = int32_t(rng() % uint32_t(c.vocab));
    }
    ForwardRequest req;
    req.lambda = lambda;
    ForwardResult res;
    double sink = 0;  // keeps the masses used
    auto forward = [&](size_t i) {
      req.ids = ids[i];
      b.forward(req, res);
    };
    auto masses = [&] {  // of the last forward, for a span at a random depth
      const int64_t a0 = int64_t(rng() % uint64_t(n - 16)), a1 = a0 + 8;
      for (int l : layers)
        for (const RowMass& m : b.row_mass(l, n - 1, a0, a1)) sink += m.answer[MASS_D];
    };
    const auto tw = Clock::now();
    for (int w = 0; w < 2 || ms_since(tw) < warm_ms; ++w) {
      forward(size_t(w) % ids.size());
      masses();
      if (w > 64) break;
    }
    // Interleaved: forward-only and scan of each prompt in turn, so that clocks and heat treat both alike.
    std::vector<double> fwd, scan, mass;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto t0 = Clock::now();
      forward(i);
      fwd.push_back(ms_since(t0));
      t0 = Clock::now();
      forward(i);
      const auto t1 = Clock::now();
      masses();
      mass.push_back(ms_since(t1));
      scan.push_back(ms_since(t0));
    }
    const double f = median(fwd), s = median(scan), m = median(mass);
    std::printf("%-8lld %12.2f %12.2f %12.3f %14.2f %14.2f %8.3f\n", static_cast<long long>(n), f, s, m, 1000 / f,
                1000 / s, f / s);
    rows.push_back({{"tokens", n},
                    {"prompts", prompts},
                    {"forward_ms", f},
                    {"scan_ms", s},
                    {"row_mass_ms", m},
                    {"forward_prompts_per_s", 1000 / f},
                    {"scan_prompts_per_s", 1000 / s},
                    {"ratio", f / s},
                    {"checksum", sink}});
  }
  // Batching: forward throughput of 4 prompts in one run against one at a time, at the shortest length.
  json batch;
  const int64_t n = lengths.empty() ? 0 : lengths.front();
  const int B = 4;
  if (n > 0 && n * B <= b.max_tokens()) {
    std::vector<int32_t> ids(size_t(n) * B);
    for (auto& t : ids) t = int32_t(rng() % uint32_t(c.vocab));
    std::vector<double> one, four;
    for (int r = 0; r < 5; ++r) {
      auto t0 = Clock::now();
      for (int i = 0; i < B; ++i) {
        b.run(ids.data() + size_t(i) * size_t(n), 1, n, lambda, 0, true, true);
        b.sync();
      }
      one.push_back(ms_since(t0) / B);
      t0 = Clock::now();
      b.run(ids.data(), B, n, lambda, 0, true, true);
      b.sync();
      four.push_back(ms_since(t0) / B);
    }
    const double o1 = median(one), o4 = median(four);
    std::printf("batching at %lld tokens: %.2f ms a prompt one at a time, %.2f ms in batches of %d (gain %.1f%%)\n",
                static_cast<long long>(n), o1, o4, B, 100 * (o1 / o4 - 1));
    batch = {{"tokens", n}, {"batch", B}, {"ms_per_prompt_batch1", o1}, {"ms_per_prompt_batched", o4},
             {"gain", o1 / o4 - 1}};
  }
  return {{"rows", rows}, {"batching", batch}};
}

}  // namespace ds
