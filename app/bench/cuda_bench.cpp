// The CUDA benchmark suite of diffscope-bench (cuda_bench.h): fused attention at the peers' shapes, whole-model
// prefill on random weights generated on the GPU, lambda-change latency, and the paper's Table 7 (a 3B DIFF model
// against its Transformer twin). Device time is measured with CUDA events around the work (as the PyTorch peers in
// bench/peers/ do), medians over `repeat` runs after warm-up; inputs are random (never zeros), and the attention
// inputs rotate over two buffers so repeated runs do not time the L2 cache. The attention kernels are reached only
// through the dispatcher (kernels/attn_dispatch.h), so the rows name and time exactly what select_attn grants, and
// the default row is what users get.
#include "app/bench/cuda_bench.h"
#include "app/bench/bench_median.h"
#include "app/bench/cuda_bench_decode.h"
#include "app/bench/cuda_bench_generate.h"
#include "app/bench/cuda_bench_scan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <sys/resource.h>
#include <random>
#include <stdexcept>

#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/model.h"
#include "kernels/attn_dispatch.h"
#include "kernels/attn_heads.h"
#include "kernels/fill.h"
#include "kernels/mamba_scan.h"

namespace ds {
namespace {

using cuda::bf16;
using cuda::CudaBackend;
using cuda::CudaEvent;
using cuda::DeviceBuffer;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Median device time (CUDA events) of f over `reps` runs, after at least `warm` runs and at least warm_ms of them
// (CudaBenchOptions::warmup_ms says why). f(i) gets the run's index.
template <class F>
double time_events(cudaStream_t s, int warm, int warm_ms, int reps, F&& f) {
  const auto t0 = Clock::now();
  for (int i = 0; i < warm || Clock::now() - t0 < std::chrono::milliseconds(warm_ms); ++i) {
    f(i);
    if (i % 8 == 7) DS_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
  CudaEvent e0, e1;
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), s));
    f(i);
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), s));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
    t.push_back(ms);
  }
  return median(t);
}

// kajuma/DiffLlama-0.3B-handcut (its config.json: https://huggingface.co/kajuma/DiffLlama-0.3B-handcut)
ModelConfig kajuma_shape() {
  ModelConfig c;
  c.arch = Arch::DiffLlama;
  c.model_type = "diffllama";
  c.hidden = 2048;
  c.layers = 16;
  c.heads = 32;
  c.kv_heads = 8;
  c.head_dim = 64;
  c.intermediate = 8192;
  c.vocab = 128256;
  c.max_positions = 131072;
  c.norm_eps = 1e-5;
  c.tie_embeddings = true;
  c.rope.type = RopeConfig::Llama3;
  c.rope.theta = 500000.0;
  c.rope.factor = 32;
  c.rope.low_freq_factor = 1;
  c.rope.high_freq_factor = 4;
  c.rope.original_max_position_embeddings = 8192;
  return c;
}

// Motif-Technologies/Motif-2.6b-v1.1-LC (docs/models/motif.md): 8 differential heads of d = 128 (MHA), PolyNorm MLP,
// 16K context with RoPE base 500000.
ModelConfig motif_shape() {
  ModelConfig c;
  c.arch = Arch::Motif;
  c.model_type = "motif";
  c.hidden = 2048;
  c.layers = 32;
  c.heads = 16;
  c.kv_heads = 16;
  c.head_dim = 128;
  c.intermediate = 8192;
  c.vocab = 219520;
  c.max_positions = 16384;
  c.norm_eps = 1e-5;
  c.subln_eps = 1e-5;
  c.tie_embeddings = true;
  c.rope.theta = 500000.0;
  return c;
}

// microsoft/Phi-4-mini-flash-reasoning (docs/models/phi4flash.md section 1): its published config.json, parsed
// as a checkpoint's would be, so that the schedule (Mamba, sliding window 512, YOCO cross layers) is the model's.
ModelConfig phi4flash_shape() {
  return parse_config_json(R"({"architectures": ["Phi4FlashForCausalLM"], "model_type": "phi4flash",
    "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 262144, "mb_per_layer": 2, "num_attention_heads": 40, "num_hidden_layers": 32,
    "num_key_value_heads": 20, "sliding_window": 512, "tie_word_embeddings": true, "vocab_size": 200064,
    "torch_dtype": "bfloat16"})",
                           "Phi-4-mini-flash-reasoning config.json");
}

std::vector<float> default_lambda(const ModelConfig& c) {
  std::vector<float> l(size_t(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) l[size_t(i)] = float(c.lambda_init(i) + 0.05);
  return l;
}

// The implementations the attention section compares with the default choice: every fused kernel. Generic (f32 on
// CUDA cores, the tests' reference) runs only when the dispatcher picks it by default or --attn-kernel names it.
constexpr kern::AttnImpl kFusedImpls[] = {kern::AttnImpl::Sm90, kern::AttnImpl::MmaBoth, kern::AttnImpl::MmaVsplit,
                                          kern::AttnImpl::MmaLockstep};

kern::AttnImpl parse_impl_option(const std::string& name) {
  kern::AttnImpl impl = kern::AttnImpl::Auto;
  if (!kern::parse_attn_impl(name, &impl) || impl == kern::AttnImpl::None) {
    std::string names;
    for (kern::AttnImpl i : kFusedImpls) names += std::string(kern::attn_impl_name(i)) + ", ";
    throw std::invalid_argument("--attn-kernel: unknown kernel '" + name + "' (use auto, " + names + "or " +
                                kern::attn_impl_name(kern::AttnImpl::Generic) + ")");
  }
  return impl;
}

// Causal differential attention at the peers' shapes (bench/peers/peer_baseline.py: independent K1, K2 per
// differential head, so Hkv = H; V of 2d). Returns the timed rows (with the keys tools/run_cuda_suite.sh reads);
// `skipped` gets each implementation the dispatcher refused for a shape, with its reason.
json bench_attention(CudaBackend& cb, const CudaBenchOptions& o, json& skipped) {
  json rows = json::array();
  skipped = json::array();
  cudaStream_t s = cb.stream();
  const kern::AttnDevice dev = kern::query_attn_device(cb.device());
  const bool only_one = !o.attn_kernel.empty();
  const kern::AttnImpl only = only_one ? parse_impl_option(o.attn_kernel) : kern::AttnImpl::Auto;
  std::printf("\n%-24s %4s %5s %6s %5s %10s %12s %8s\n", "attention (causal, bf16)", "d", "heads", "n", "batch", "ms",
              "tokens/s", "TFLOP/s");
  struct Cfg {
    int diff_heads, d;
  };
  for (Cfg c : {Cfg{12, 128}, Cfg{16, 64}}) {
    if (o.attn_d && c.d != o.attn_d) continue;
    for (auto [n, B] : {std::pair{2048, 8}, std::pair{4096, 4}, std::pair{8192, 2}, std::pair{16384, 1}}) {
      const int H = 2 * c.diff_heads, Hkv = H;
      const int64_t T = int64_t(n) * B, W = int64_t(H + 2 * Hkv) * c.d;
      DeviceBuffer in[2] = {DeviceBuffer(size_t(T * W) * 2, "benchmark inputs"),
                            DeviceBuffer(size_t(T * W) * 2, "benchmark inputs")};
      DeviceBuffer out(size_t(T) * H * c.d * 2, "benchmark outputs");
      for (int k = 0; k < 2; ++k)
        DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(in[k].as<bf16>(), T * W, 100 + k, std::sqrt(3.f), s));
      kern::AttnParams p;
      p.qkv = in[0].as<bf16>();
      p.row_stride = W;
      p.batch_stride = int64_t(n) * W;
      p.q_off = 0;
      p.k_off = int64_t(H) * c.d;
      p.v_off = int64_t(H + Hkv) * c.d;
      p.n = n;
      p.batch = B;
      p.heads = H;
      p.kv_heads = Hkv;
      p.d = c.d;
      p.diff = true;
      p.scale = float(1.0 / std::sqrt(double(c.d)));
      p.lambda = 0.8f;
      p.out_scale = 0.2f;
      p.eps = 1e-5f;
      p.out = out.as<bf16>();
      p.out_row_stride = int64_t(H) * c.d;
      p.out_batch_stride = int64_t(n) * H * c.d;
      const kern::AttnShape shape = kern::attn_shape(p);
      // What to time: the default choice first, then each other fused implementation the dispatcher grants.
      std::vector<std::pair<kern::AttnChoice, bool /* default */>> runs;
      auto consider = [&](kern::AttnImpl impl) {
        kern::AttnOptions opt;
        opt.impl = impl;
        opt.fixed_max = cuda::attn_options_from_env().fixed_max;  // DS_ATTN_FIXMAX=0: A/B of the row maxima
        const kern::AttnChoice ch = kern::select_attn(dev, shape, opt);
        if (ch.impl == kern::AttnImpl::None) {
          skipped.push_back({{"impl", kern::attn_impl_name(impl)}, {"d", c.d}, {"diff_heads", c.diff_heads},
                             {"n", n}, {"batch", B}, {"why", ch.why}});
          if (only_one || n == 2048)  // printed for the first length of each head dim; the JSON has every shape
            std::printf("  %s d=%d %dx%d not granted: %s\n", kern::attn_impl_name(impl), c.d, n, B, ch.why.c_str());
          return;
        }
        for (const auto& r : runs)
          if (r.first.impl == ch.impl) return;  // the default choice already times it
        runs.push_back({ch, impl == kern::AttnImpl::Auto});
      };
      if (only_one) {
        consider(only);
      } else {
        consider(kern::AttnImpl::Auto);
        for (kern::AttnImpl impl : kFusedImpls) consider(impl);
      }
      for (const auto& [choice, is_default] : runs) {
        const double ms = time_events(s, 3, o.warmup_ms, o.repeat, [&](int i) {
          p.qkv = in[i & 1].as<bf16>();
          DS_CUDA_CHECK(kern::launch_attn(choice, p, s));
        });
        const double flops = kern::attn_flops(true, c.diff_heads, c.d, n, B);
        const double tflops = flops / ms / 1e9, toks = double(T) / ms * 1e3;
        const std::string impl = kern::attn_impl_name(choice.impl);
        const std::string label = impl + (is_default ? " (default)" : "");
        rows.push_back({{"name", "diffscope_diff_attn_fwd[" + label + "]"}, {"kernel", label}, {"impl", impl},
                        {"default", is_default}, {"why", choice.why}, {"block_n", choice.block_n},
                        {"tile_major", choice.tile_major}, {"diff_heads", c.diff_heads}, {"d", c.d}, {"n", n},
                        {"batch", B}, {"ms", ms}, {"tok_s", toks}, {"tflops", tflops}});
        std::printf("%-24s %4d %5d %6d %5d %10.3f %12.0f %8.1f\n", label.c_str(), c.d, c.diff_heads, n, B, ms, toks,
                    tflops);
        if (is_default) std::printf("  why: %s\n", choice.why.c_str());
      }
    }
  }
  return rows;
}

json bench_model_prefill(CudaBackend& b, int repeat, int warm_ms, const std::string& label) {
  json rows = json::array();
  const ModelConfig& c = b.config();
  const std::vector<float> lam = default_lambda(c);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(c.vocab - 1));
  std::printf("\n%-34s %6s %5s %10s %10s %12s\n", "model prefill (next-token logits)", "n", "batch", "ms (events)",
              "ms (wall)", "tokens/s");
  for (auto [n, B] : {std::pair{1024, 1}, std::pair{2048, 1}, std::pair{2048, 8}}) {
    if (int64_t(n) * B > b.max_tokens()) continue;
    std::vector<int32_t> ids(size_t(n) * B);
    for (auto& x : ids) x = tok(rng);
    b.set_profiling(false);
    const double ms =
        time_events(b.stream(), 2, warm_ms, repeat, [&](int) { b.run(ids.data(), B, n, lam, 0, true, true); });
    // The same forward with the paper's Table 5 reader at every layer's output (forward.h's hook point: one
    // reduction kernel per layer, and the last layer's MLP on every row), timed after the plain one.
    auto reader = std::make_shared<fwd::Hooks>();
    reader->add(fwd::max_abs_hidden_hook());
    b.set_hooks(reader);
    const double ms_reader =
        time_events(b.stream(), 2, warm_ms, repeat, [&](int) { b.run(ids.data(), B, n, lam, 0, true, true); });
    b.set_hooks(nullptr);
    // What the reader needs beyond its kernels: the last layer on every row (o_proj and the MLP), timed alone.
    const double ms_all_rows =
        time_events(b.stream(), 2, warm_ms, repeat, [&](int) { b.run(ids.data(), B, n, lam, 0, true, false); });
    std::vector<double> wall;
    for (int i = 0; i < std::max(3, repeat / 2); ++i) {
      const auto t0 = Clock::now();
      b.run(ids.data(), B, n, lam, 0, true, true);
      b.sync();
      wall.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    // one profiled run for the per-kernel breakdown
    b.set_profiling(true);
    ForwardRequest req;
    json kernels = json::array();
    if (B == 1) {
      req.ids = ids;
      req.lambda = lam;
      ForwardResult res;
      b.forward(req, res);
    } else {
      const auto t0 = Clock::now();
      b.run(ids.data(), B, n, lam, 0, true, true);
      b.sync();
      b.build_profile(std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), int64_t(n) * B, 0, B, n);
    }
    for (const KernelTiming& k : b.profile().kernels)
      kernels.push_back({{"name", k.name}, {"count", k.count}, {"total_ms", k.total_ms}});
    const double toks = double(n) * B / ms * 1e3;
    std::printf("%-34s %6d %5d %10.3f %10.3f %12.0f   last layer on every row %.3f ms (%+.2f%%), with the "
                "max|hidden| reader %.3f ms (%+.2f%% over every row)\n",
                label.c_str(), n, B, ms, median(wall), toks, ms_all_rows, 100.0 * (ms_all_rows / ms - 1.0), ms_reader,
                100.0 * (ms_reader / ms_all_rows - 1.0));
    rows.push_back({{"name", label}, {"n", n}, {"batch", B}, {"ms", ms}, {"wall_ms", median(wall)},
                    {"tok_s", toks}, {"ms_all_rows", ms_all_rows}, {"ms_max_abs_reader", ms_reader},
                    {"kernels", kernels}});
  }
  return rows;
}

// A family's prefill (next-token logits, batch 1) against the GEMM-only floor of the same shapes in the same run.
// run_gemms_only issues exactly the forward's GEMMs (the projections): forward / that is what everything else costs
// on top. The attention's own matrix products (causal: 12 n^2 d / 2 per differential head) at the cuBLASLt peak
// measured in the same run complete the matmul floor: forward / (projections + attention products) is what the
// softmaxes, norms, RoPE and the MLP activation cost beyond the arithmetic a GEMM library could do.
json bench_family_prefill(CudaBackend& b, int repeat, int warm_ms, const std::string& label,
                          const std::vector<int>& lengths = {4096, 16384}) {
  json rows = json::array();
  const ModelConfig& c = b.config();
  const std::vector<float> lam = default_lambda(c);
  std::mt19937 rng(6);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(c.vocab - 1));
  const double peak = b.gemm_peak_tflops();
  std::printf("\n%-30s %6s %11s %10s %12s %11s %8s %8s\n", "prefill vs GEMM floor", "n", "forward ms", "GEMMs ms",
              "attn prod ms", "tokens/s", "/GEMMs", "/matmul");
  for (int n : lengths) {
    if (n > b.max_tokens() || n > c.max_positions) continue;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (auto& x : ids) x = tok(rng);
    b.set_profiling(false);
    const double ms = time_events(b.stream(), 2, warm_ms, repeat, [&](int) { b.run(ids.data(), 1, n, lam, 0, true, true); });
    const double floor_ms = time_events(b.stream(), 2, warm_ms, repeat, [&](int) { b.run_gemms_only(1, n, true); });
    b.set_profiling(true);
    ForwardRequest req;
    req.ids = ids;
    req.lambda = lam;
    ForwardResult res;
    b.forward(req, res);
    json kernels = json::array();
    double profiled_ms = 0, scan_ms = 0;  // the profiled forward's kernels; the Mamba scan and conv among them
    for (const KernelTiming& k : b.profile().kernels) {
      kernels.push_back({{"name", k.name}, {"count", k.count}, {"total_ms", k.total_ms}});
      profiled_ms += k.total_ms;
      if (k.name == "mamba_scan" || k.name == "mamba_conv") scan_ms += k.total_ms;
    }
    const double toks = double(n) / ms * 1e3;
    double attn_flops = 0;  // the attention layers' products, sliding windows counted as the band they are
    for (int64_t l : c.map_layers())
      attn_flops += kern::attn_flops(c.is_diff(), c.view_heads(), c.head_dim, n, 1, c.layer_window(l));
    const double attn_ms = attn_flops / (peak * 1e12) * 1e3;
    std::printf("%-30s %6d %11.3f %10.3f %12.3f %11.0f %8.3f %8.3f\n", label.c_str(), n, ms, floor_ms, attn_ms, toks,
                ms / floor_ms, ms / (floor_ms + attn_ms));
    json row{{"name", label}, {"n", n}, {"batch", 1}, {"ms", ms}, {"gemm_floor_ms", floor_ms}, {"tok_s", toks},
             {"attn_products_at_peak_ms", attn_ms}, {"gemm_peak_tflops", peak},
             {"ratio_to_gemm_floor", ms / floor_ms}, {"ratio_to_matmul_floor", ms / (floor_ms + attn_ms)},
             {"kernels", kernels}};
    // The attention by layer kind (sliding-window layers apart from the full and cross ones): the profiler's
    // per-head shares summed per layer, with the FLOPs the profiler counts (windows as their band).
    std::map<std::string, std::pair<double, double>> attn_kind;  // kind -> (ms, flops)
    for (const HeadTiming& h : b.profile().heads) {
      auto& [kms, kfl] = attn_kind[c.layer_window(h.layer) > 0 ? "window" : "full"];
      kms += h.ms;
      kfl += h.flops;
    }
    json by_kind = json::object();
    for (const auto& [kind, v] : attn_kind) {
      by_kind[kind] = {{"ms", v.first}, {"tflops", v.first > 0 ? v.second / v.first * 1e-9 : 0.0}};
      std::printf("%-30s %6d   attention, %s layers: %.3f ms, %.0f TFLOP/s\n", "", n, kind.c_str(), v.first,
                  v.first > 0 ? v.second / v.first * 1e-9 : 0.0);
    }
    row["attn_by_kind"] = by_kind;
    if (c.d_inner > 0) {  // SambaY: the selective scan's (and its convolution's) share of the profiled forward
      row["scan_ms"] = scan_ms;
      row["scan_share"] = profiled_ms > 0 ? scan_ms / profiled_ms : 0.0;
      std::printf("%-30s %6d   scan + conv %.3f ms = %.1f%% of the profiled kernels\n", "", n, scan_ms,
                  profiled_ms > 0 ? 100 * scan_ms / profiled_ms : 0.0);
      // What the head view waits for on a Mamba layer: the memory layer's channel 0, the whole map in the view's
      // largest grid (1024 x 1024, max pooling), host to host (the layer's scan inputs recomputed each time).
      ViewRequest vq;
      vq.layer = int(c.layers / 2);
      vq.rows = vq.cols = 1024;
      MapView mv;
      b.mamba_view(vq, mv);  // first: the GEMM plans of the shapes, if new
      std::vector<double> t;
      for (int i = 0; i < 3; ++i) {
        vq.head = 1 + i;
        const auto t0 = Clock::now();
        b.mamba_view(vq, mv);
        t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      row["implicit_view_ms"] = median(t);
      std::printf("%-30s %6d   implicit attention view (layer %d, 1024 x 1024): %.2f ms\n", "", n, vq.layer, median(t));
      // The row view's exact last row: one mamba_row call, against the 1-row views of at most 8192 keys that the
      // GUI asked for before mamba_row existed (each recomputing the layer's scan inputs).
      std::vector<double> t_row, t_views;
      std::vector<float> rowv;
      for (int i = 0; i < 3; ++i) {
        auto t0 = Clock::now();
        b.mamba_row(vq.layer, 1 + i, n - 1, rowv);
        t_row.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        t0 = Clock::now();
        for (int64_t k0 = 0; k0 < n; k0 += 8192) {
          ViewRequest rq;
          rq.layer = vq.layer, rq.head = 1 + i, rq.q0 = n - 1, rq.q1 = n, rq.k0 = k0;
          rq.k1 = std::min<int64_t>(n, k0 + 8192), rq.rows = 1, rq.cols = int(rq.k1 - k0);
          b.mamba_view(rq, mv);
        }
        t_views.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      row["implicit_row_ms"] = median(t_row);
      row["implicit_row_by_views_ms"] = median(t_views);
      std::printf("%-30s %6d   implicit attention row %d: %.2f ms (as 1-row views of <= 8192 keys: %.2f ms)\n", "",
                  n, n - 1, median(t_row), median(t_views));
    }
    rows.push_back(row);
  }
  return rows;
}

// Mamba-1's convolution and selective scan (kernels/mamba_scan.h) at Phi-4-mini-flash's shape (d_inner 5120,
// d_state 16, K = 4) on random inputs: one layer's worth at each length, for the scan's share of a SambaY prefill.
json bench_mamba(CudaBackend& b, int repeat, int warm_ms) {
  json rows = json::array();
  const int ch = 5120, S = 16, K = 4;
  std::printf("\n%-30s %6s %12s %12s\n", "Mamba-1 layer kernels", "n", "conv ms", "scan ms");
  for (int64_t n : {int64_t(4096), int64_t(32768)}) {
    DeviceBuffer x(size_t(n) * ch * 2, "bench"), u(size_t(n) * ch * 2, "bench"), dt(size_t(n) * ch * 2, "bench"),
        bc(size_t(n) * 2 * S * 2, "bench"), z(size_t(n) * ch * 2, "bench"), y(size_t(n) * ch * 2, "bench"),
        yg(size_t(n) * ch * 2, "bench"), w(size_t(ch) * K * 4, "bench"), f(size_t(ch) * (S + 3) * 4, "bench");
    uint64_t seed = 77;
    for (DeviceBuffer* d : {&x, &dt, &bc, &z})
      DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(d->as<bf16>(), int64_t(d->bytes() / 2), seed++, 1.f, b.stream()));
    DS_CUDA_CHECK(kern::launch_fill_f32(w.as<float>(), ch * K, 0.25f, b.stream()));
    DS_CUDA_CHECK(kern::launch_fill_f32(f.as<float>(), int64_t(ch) * (S + 3), -0.5f, b.stream()));  // A < 0, bias, D
    const double conv_ms = time_events(b.stream(), 2, warm_ms, repeat, [&](int) {
      DS_CUDA_CHECK(kern::launch_causal_conv_silu(x.as<bf16>(), ch, w.as<float>(), f.as<float>(), K, u.as<bf16>(), ch, n,
                                                  ch, b.stream()));
    });
    kern::ScanParams p;
    p.n = n, p.channels = ch, p.state = S, p.u = u.as<bf16>(), p.ld_u = ch, p.dt = dt.as<bf16>(), p.ld_dt = ch;
    p.A = f.as<float>(), p.dt_bias = f.as<float>() + ch * S, p.D = f.as<float>() + ch * (S + 1);
    p.B = bc.as<bf16>(), p.C = bc.as<bf16>() + S, p.ld_bc = 2 * S, p.z = z.as<bf16>(), p.ld_z = ch;
    p.y = y.as<bf16>(), p.y_gated = yg.as<bf16>(), p.ld_y = ch;
    DeviceBuffer ws(kern::selective_scan_workspace(p), "bench");
    const double scan_ms = time_events(b.stream(), 2, warm_ms, repeat, [&](int) {
      DS_CUDA_CHECK(kern::launch_selective_scan(p, ws.get(), b.stream()));
    });
    std::printf("%-30s %6lld %12.3f %12.3f\n", "mamba[phi4flash shape]", (long long)n, conv_ms, scan_ms);
    rows.push_back({{"n", n}, {"channels", ch}, {"state", S}, {"conv_ms", conv_ms}, {"scan_ms", scan_ms}});
  }
  return rows;
}

// Long prompts through the map queries (engine/core/map_query.h): for each length, the forward, a 1024 x 1024 max-pooled
// view of one head of the middle layer (three maps), every layer's statistics, and a lambda change of the middle
// layer followed by next-token probabilities, the view and that layer's statistics; the process's peak RSS after
// each length (nothing n x n reaches the host, so it must not grow like n^2). Up to 32K, the view is also timed on
// the chunked path (head_view_chunked_ms) that GPUs without the fused kernel take.
json bench_views(CudaBackend& b, int repeat) {
  const ModelConfig& c = b.config();
  const int L = int(c.layers), mid = L / 2;
  json rows = json::array();
  std::printf("\n%-8s %12s %14s %16s %18s %14s\n", "n", "forward ms", "head view ms", "stats all ms",
              "lambda change ms", "peak RSS MB");
  double stats_ms_per_n2 = 0;
  for (int64_t n : {int64_t(1024), int64_t(4096), int64_t(8192), int64_t(32768), int64_t(131072)}) {
    json row = {{"n", n}};
    if (n > b.max_tokens()) {
      std::printf("%-8lld does not fit in GPU memory (room for %lld tokens)\n", (long long)n, (long long)b.max_tokens());
      row["skipped"] = "does not fit in GPU memory";
      rows.push_back(row);
      continue;
    }
    const int reps = n <= 8192 ? std::max(3, repeat / 4) : 2;
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::uniform_int_distribution<int32_t> tok(3, int32_t(c.vocab - 1));
    ForwardRequest req;
    req.ids.resize(size_t(n));
    for (auto& x : req.ids) x = tok(rng);
    req.lambda = default_lambda(c);
    ForwardResult res;
    auto ms_of = [](auto&& f, int k) {
      std::vector<double> t;
      for (int i = 0; i < k; ++i) {
        const auto t0 = Clock::now();
        f();
        t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      return median(t);
    };
    b.forward(req, res);  // warm-up (allocations)
    row["forward_ms"] = ms_of([&] { b.forward(req, res); }, reps);
    ViewRequest vq;
    vq.layer = mid, vq.head = 0, vq.rows = 1024, vq.cols = 1024, vq.pool = Pool::Max;
    MapView view;
    b.map_view(vq, view);  // warm-up
    row["head_view_ms"] = ms_of([&] { b.map_view(vq, view); }, reps);
    if (n <= 32768) {  // the other path: probability rows from the map kernels in chunks, pooled
      b.set_fused_views(false);
      b.map_view(vq, view);
      row["head_view_chunked_ms"] = ms_of([&] { b.map_view(vq, view); }, reps);
      b.set_fused_views(true);
    }
    // Statistics of every layer: skipped where the previous length predicts more than a minute.
    const double predicted = stats_ms_per_n2 * double(n) * double(n);
    if (predicted < 60e3) {
      const double t = ms_of([&] {
        for (int l = 0; l < L; ++l) b.head_stats(l);
      }, n <= 8192 ? reps : 1);
      row["stats_all_layers_ms"] = t;
      stats_ms_per_n2 = t / (double(n) * double(n));
      row["lambda_change_ms"] = ms_of([&] {
        req.from_layer = mid;
        req.lambda[size_t(mid)] += 0.01f;
        b.forward(req, res);  // next-token logits (softmax on the host: 128K values)
        b.map_view(vq, view);
        b.head_stats(mid);
      }, reps);
      req.from_layer = 0;
    } else {
      row["stats_all_layers_ms"] = nullptr;
      row["stats_skipped"] = "predicted from the previous length: " + std::to_string(int64_t(predicted / 1e3)) + " s";
    }
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    row["peak_rss_mb"] = double(ru.ru_maxrss) / 1024.0;
    std::printf("%-8lld %12.2f %14.2f %16s %18s %14.0f\n", (long long)n, row["forward_ms"].get<double>(),
                row["head_view_ms"].get<double>(),
                row["stats_all_layers_ms"].is_null() ? "skipped" : std::to_string(row["stats_all_layers_ms"].get<double>()).c_str(),
                row.contains("lambda_change_ms") ? std::to_string(row["lambda_change_ms"].get<double>()).c_str() : "-",
                row["peak_rss_mb"].get<double>());
    rows.push_back(row);
  }
  return rows;
}

json bench_lambda(CudaBackend& b, int repeat) {
  const ModelConfig& c = b.config();
  const int L = int(c.layers), mid = L / 2;
  const int64_t n = std::min<int64_t>(1024, b.max_tokens());
  std::mt19937 rng(9);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(c.vocab - 1));
  ForwardRequest req;
  req.ids.resize(size_t(n));
  for (auto& x : req.ids) x = tok(rng);
  req.lambda = default_lambda(c);
  ForwardResult res;
  b.set_profiling(true);
  b.forward(req, res);  // the prompt's full forward
  auto next_token_probs = [&](const std::vector<float>& logits) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    std::vector<float> p(logits.size());
    double s = 0;
    for (size_t i = 0; i < p.size(); ++i) s += (p[i] = std::exp(logits[i] - mx));
    for (auto& x : p) x = float(x / s);
    return p;
  };
  std::vector<double> stats_ms, maps_ms, fwd_ms;
  LayerMaps maps;
  for (int i = 0; i < repeat + 2; ++i) {
    req.lambda[size_t(mid)] = 0.1f * float(i % 7 + 1);
    req.from_layer = mid;
    auto t0 = Clock::now();
    b.forward(req, res);
    const double f = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::vector<HeadStats> st = b.head_stats(mid);
    auto probs = next_token_probs(res.logits);
    const double t_stats = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    req.lambda[size_t(mid)] += 0.05f;
    t0 = Clock::now();
    b.forward(req, res);
    b.layer_maps(mid, maps);
    probs = next_token_probs(res.logits);
    const double t_maps = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i >= 2) {  // warm-up: first allocation of the map buffers and host vectors
      stats_ms.push_back(t_stats);
      maps_ms.push_back(t_maps);
      fwd_ms.push_back(f);
    }
  }
  std::printf("\nlambda change at n=%lld, layers %d..%d recomputed: forward %.3f ms; + GPU map stats + probs %.3f ms;"
              " + all maps of the layer to host instead %.3f ms\n",
              (long long)n, mid, L - 1, median(fwd_ms), median(stats_ms), median(maps_ms));
  return {{"n", n}, {"from_layer", mid}, {"layers", L}, {"forward_ms", median(fwd_ms)},
          {"forward_stats_probs_ms", median(stats_ms)}, {"forward_maps_to_host_probs_ms", median(maps_ms)},
          {"maps_bytes_to_host", double(maps.a1.size() + maps.a2.size()) * 4}};
}

// --- Table 7 of the Differential Transformer paper (Ye et al. 2024, https://arxiv.org/abs/2410.05258, appendix A,
// p. 15) compares the forward throughput of a 3B DIFF Transformer with 12 heads against a Transformer with 24 heads,
// both of head dim 128, on an H100-80GB with their own FlashAttention-2-based kernels. The text gives neither depth,
// MLP width, vocabulary nor batch; kTable7Assumed says what this section assumes (the shape of the project's first
// transformers measurement of the table, 2026-11-23).

constexpr const char* kTable7Source =
    "Differential Transformer (Ye et al. 2024, https://arxiv.org/abs/2410.05258), appendix A, Table 7, p. 15: "
    "3B models, DIFF 12 heads vs Transformer 24 heads, head dim 128, forward tokens/s on an H100-80GB";
constexpr const char* kTable7Assumed =
    "not stated with Table 7, so assumed: 28 layers, MLP 8192, vocab 100288, untied lm_head, kv heads = heads "
    "(MHA), batch 8 x 2K and 4 x 4K tokens; rope theta 10000, rms eps 1e-5";

struct Table7Row {
  int n, batch;
  double paper_diff_tok_s, paper_transformer_tok_s;
};
constexpr Table7Row kTable7Rows[] = {{2048, 8, 46811, 51228}, {4096, 4, 44521, 48762}};

// DIFF: a DiffLlama with 24 query heads of 128 (12 differential heads, each two maps of d = 128 and V of 256);
// Transformer: the Llama twin with 24 heads of 128. Same parameter count.
ModelConfig table7_shape(bool diff) {
  ModelConfig c;
  c.arch = diff ? Arch::DiffLlama : Arch::Llama;
  c.model_type = diff ? "diffllama" : "llama";
  c.hidden = 3072;
  c.layers = 28;
  c.heads = 24;
  c.kv_heads = 24;
  c.head_dim = 128;
  c.intermediate = 8192;
  c.vocab = 100288;
  c.max_positions = 4096;
  c.norm_eps = 1e-5;
  c.tie_embeddings = false;
  c.rope.type = RopeConfig::Default;
  c.rope.theta = 10000.0;
  return c;
}

// Forward of each model (random bf16 weights on the GPU, one model in memory at a time) with next-token logits
// (the last row of each sequence goes through the last layer's o_proj and MLP and the lm_head), as prefill is
// served; ms are CUDA-event medians after the warm-up.
json bench_table7(CudaBackend& b, const CudaBenchOptions& o, int repeat) {
  struct Timed {
    double ms = 0, tok_s = 0;
    bool ran = false;
  };
  Timed t[2][std::size(kTable7Rows)];  // [diff][row]
  int64_t params[2] = {0, 0};
  b.set_profiling(false);
  for (int diff = 1; diff >= 0; --diff) {
    const ModelConfig c = table7_shape(diff == 1);
    b.load_random(c, 7);
    params[diff] = c.params();
    const std::vector<float> lam = default_lambda(c);
    std::mt19937 rng(13);
    std::uniform_int_distribution<int32_t> tok(3, int32_t(c.vocab - 1));
    for (size_t r = 0; r < std::size(kTable7Rows); ++r) {
      const int n = kTable7Rows[r].n, B = kTable7Rows[r].batch;
      if (int64_t(n) * B > b.max_tokens()) {
        std::printf("table7: %s at %d x %d does not fit in GPU memory (room for %lld tokens): skipped\n",
                    diff ? "DIFF" : "Transformer", n, B, (long long)b.max_tokens());
        continue;
      }
      std::vector<int32_t> ids(size_t(n) * B);
      for (auto& x : ids) x = tok(rng);
      t[diff][r].ms = time_events(b.stream(), 2, o.warmup_ms, repeat, [&](int) {
        b.run(ids.data(), B, n, lam, 0, /*want_logits=*/true, /*last_rows_only=*/true);
      });
      t[diff][r].tok_s = double(n) * B / t[diff][r].ms * 1e3;
      t[diff][r].ran = true;
    }
  }
  b.set_profiling(true);
  const ModelConfig cd = table7_shape(true);
  json rows = json::array();
  std::printf("\nTable 7 of the Differential Transformer paper (p. 15): 3B DIFF (12 heads) vs Transformer (24 heads),"
              " d = 128, forward with next-token logits, random bf16 weights\n  %s\n", kTable7Assumed);
  std::printf("%-18s %7s %6s %5s %10s %10s %15s\n", "forward, 3B", "params", "n", "batch", "ms", "tokens/s",
              "paper tokens/s");
  for (size_t r = 0; r < std::size(kTable7Rows); ++r) {
    const Table7Row& p = kTable7Rows[r];
    const Timed &d = t[1][r], &x = t[0][r];
    for (int diff = 0; diff <= 1; ++diff) {
      const Timed& m = t[diff][r];
      if (m.ran)
        std::printf("%-18s %6.2fB %6d %5d %10.2f %10.0f %15.0f\n", diff ? "DIFF" : "Transformer",
                    double(params[diff]) / 1e9, p.n, p.batch, m.ms, m.tok_s,
                    diff ? p.paper_diff_tok_s : p.paper_transformer_tok_s);
    }
    json row = {{"n", p.n},
                {"batch", p.batch},
                {"paper_diff_tok_s", p.paper_diff_tok_s},
                {"paper_transformer_tok_s", p.paper_transformer_tok_s},
                {"paper_ratio", p.paper_diff_tok_s / p.paper_transformer_tok_s}};
    if (d.ran) {
      row["diff_ms"] = d.ms;
      row["diff_tok_s"] = d.tok_s;
    }
    if (x.ran) {
      row["transformer_ms"] = x.ms;
      row["transformer_tok_s"] = x.tok_s;
    }
    if (d.ran && x.ran) {
      row["ratio"] = d.tok_s / x.tok_s;
      std::printf("%-18s %7s %6d %5d %10s %10.3f %15.3f\n", "DIFF/Transformer", "", p.n, p.batch, "",
                  d.tok_s / x.tok_s, p.paper_diff_tok_s / p.paper_transformer_tok_s);
    }
    rows.push_back(row);
  }
  return {{"source", kTable7Source},
          {"assumed", kTable7Assumed},
          {"config", {{"hidden", cd.hidden}, {"layers", cd.layers}, {"heads", cd.heads}, {"kv_heads", cd.kv_heads},
                      {"head_dim", cd.head_dim}, {"diff_heads", cd.heads / 2}, {"intermediate", cd.intermediate},
                      {"vocab", cd.vocab}, {"tie_embeddings", cd.tie_embeddings}}},
          {"diff_params", params[1]},
          {"transformer_params", params[0]},
          {"weights", "random bf16 on the GPU (CudaBackend::load_random)"},
          {"logits", "next-token only (run(..., want_logits=true, last_rows_only=true))"},
          {"repeat", repeat},
          {"rows", rows}};
}

}  // namespace

void check_cuda_bench_options(const CudaBenchOptions& o) {
  for (const std::string& k : o.only)
    if (!cuda_bench_sections().count(k)) {
      std::string names;
      for (const std::string& n : cuda_bench_sections()) names += (names.empty() ? "" : ", ") + n;
      throw std::invalid_argument("--only: unknown section '" + k + "' (use " + names + ")");
    }
  if (!o.attn_kernel.empty()) parse_impl_option(o.attn_kernel);
  if (o.attn_d != 0 && o.attn_d != 64 && o.attn_d != 128) throw std::invalid_argument("--attn-d must be 64 or 128");
  if (o.repeat < 1) throw std::invalid_argument("--repeat must be positive");
  if (o.warmup_ms < 0) throw std::invalid_argument("--warmup-ms must be 0 or more");
}

json run_cuda_benchmarks(const CudaBenchOptions& o) {
  check_cuda_bench_options(o);
  auto want = [&](const char* k) { return o.only.empty() || o.only.count(k); };
  const int model_repeat = std::max(3, o.repeat / 2);
  auto backend = make_cuda_backend();
  CudaBackend& b = cuda::as_cuda(*backend);
  json r;
  r["device"] = b.device_name();
  r["repeat"] = o.repeat;
  r["warmup_ms"] = o.warmup_ms;
  std::printf("device: %s\n", b.device_name().c_str());
  // Attention first: the GEMM peak measurement (autotuning 8192^3 GEMMs at full power) slows what follows it.
  if (want("attention")) {
    json skipped;
    r["attention"] = bench_attention(b, o, skipped);
    r["attention_skipped"] = skipped;
  }
  const double peak = b.gemm_peak_tflops();
  r["gemm_bf16_tflops"] = peak;
  std::printf("\ncuBLASLt bf16 GEMM 8192^3 (autotuned): %.1f TFLOP/s\n", peak);
  if (r.contains("attention")) {
    std::printf("attention, fraction of that peak:");
    for (json& row : r["attention"]) {
      row["frac_of_gemm_peak"] = peak > 0 ? row["tflops"].get<double>() / peak : 0.0;
      std::printf(" %.0f%%", 100 * row["frac_of_gemm_peak"].get<double>());
    }
    std::printf("\n");
  }
  if (want("model") || want("lambda")) {
    b.load_random(kajuma_shape(), 1);
    r["model_shape"] = "kajuma/DiffLlama-0.3B-handcut (random bf16 weights on the GPU)";
    if (want("model")) r["model"] = bench_model_prefill(b, model_repeat, o.warmup_ms, "diffscope_cuda_prefill[kajuma]");
    if (want("lambda")) r["lambda"] = bench_lambda(b, o.repeat);
  }
  if (want("decode")) {
    b.load_random(kajuma_shape(), 1);
    r["decode_shape"] = "kajuma/DiffLlama-0.3B-handcut (random bf16 weights on the GPU)";
    r["decode"] = bench_decode(b, default_lambda(b.config()), {1024, 8192, 32768}, 64, o.warmup_ms);
  }
  if (want("scan")) {
    b.load_random(kajuma_shape(), 1);
    r["scan_shape"] = "kajuma/DiffLlama-0.3B-handcut (random bf16 weights on the GPU)";
    r["scan"] = bench_scan(b, default_lambda(b.config()), {4096, 16384, 32768}, 6, o.warmup_ms);
  }
  if (want("table7")) r["table7"] = bench_table7(b, o, model_repeat);
  if (want("mamba")) r["mamba"] = bench_mamba(b, model_repeat, o.warmup_ms);
  if (want("decode_attn")) r["decode_attn"] = bench_decode_attn(o.repeat, o.warmup_ms);
  if (want("motif")) {
    b.load_random(motif_shape(), 1);
    r["motif_shape"] = "Motif-Technologies/Motif-2.6b-v1.1-LC (random bf16 weights on the GPU)";
    r["motif"] = bench_family_prefill(b, model_repeat, o.warmup_ms, "diffscope_cuda_prefill[motif]");
  }
  if (want("phi4flash")) {
    b.load_random(phi4flash_shape(), 1);
    r["phi4flash_shape"] = "microsoft/Phi-4-mini-flash-reasoning (random bf16 weights on the GPU)";
    r["phi4flash"] =
        bench_family_prefill(b, model_repeat, o.warmup_ms, "diffscope_cuda_prefill[phi4flash]", {4096, 32768});
  }
  if (o.only.count("views")) {  // minutes at 128K tokens: only when asked for
    b.load_random(kajuma_shape(), 1);
    r["views_shape"] = "kajuma/DiffLlama-0.3B-handcut (random bf16 weights on the GPU)";
    r["views"] = bench_views(b, o.repeat);
  }
  if (!o.model_dir.empty()) {
    auto m = load_model(o.model_dir);
    b.load(*m, nullptr);
    m.reset();
    r["given_model"] = o.model_dir;
    r["given_model_prefill"] = bench_model_prefill(b, model_repeat, o.warmup_ms, "diffscope_cuda_prefill[given]");
  }
  return r;
}

}  // namespace ds
