// diffscope-bench: benchmarks with a table on stdout and JSON out. Every option is parsed here (kUsage lists them);
// exit status 0 ok, 2 bad arguments, 3 a benchmark failed.
//   --backend cpu   sections prefill (CPU prefill tokens/s of a model: the given --model, else a synthetic
//                   ~5M-parameter DiffLlama) and attention (the CPU attention kernels alone against the machine's
//                   sgemm rate and a PyTorch peer: cpu_bench_attention.h)
//   --backend cuda  the CUDA suite (cuda_bench.h: attention kernels at the peers' shapes, whole-model prefill,
//                   lambda-change latency, the paper's Table 7)
//   --tokenizer F   tokenizer encode speed on ~1 MB of mixed text
//   --only api      (either backend) the session calls bench/python_api_bench.py times through the Python module
//                   (api_bench.h)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "app/bench/api_bench.h"
#include "app/bench/bench_median.h"
#include "app/bench/cpu_bench_attention.h"
#include "app/bench/cuda_bench.h"
#include "app/bench/synthetic_model.h"
#include "engine/core/error.h"
#include "engine/core/safe_write.h"
#include "engine/session/session.h"
#if __has_include("app/bench/tokenizer_bench.h")
#include "app/bench/tokenizer_bench.h"
#define DS_HAVE_TOKENIZER_BENCH 1
#endif

namespace {

using Clock = std::chrono::steady_clock;
using ds::median;

const char* kUsage =
    "usage: diffscope-bench [--backend cpu|cuda] [--model DIR] [--tokens N] [--repeat R] [--threads T]\n"
    "                       [--tokenizer FILE] [--soak RUNS] [--json OUT.json] [--only SECTION]...\n"
    "                       [--attn-tokens LIST] [--peer-python PY]\n"
    "                       [--attn-kernel NAME] [--attn-d 64|128] [--warmup-ms N]\n"
    "  --backend cpu        CPU sections: prefill and attention (default)\n"
    "  --backend cuda       CUDA suite: fused attention, whole-model prefill, lambda-change latency, Table 7\n"
    "  --model DIR          model to time (cpu prefill default: a synthetic ~5M-parameter DiffLlama written to a\n"
    "                       temp folder; cuda: the prefill benchmark also runs on DIR; api: the model it times)\n"
    "  --tokens N           prompt length for cpu prefill and --soak (default 256) and for api (default 1024)\n"
    "  --repeat R           timed runs; the median is reported (default 10 for cpu prefill, 5 for cpu attention,\n"
    "                       30 for api, 20 on cuda)\n"
    "  --threads T          CPU threads (default: all cores)\n"
    "  --tokenizer F        also time tokenizer encoding of ~1 MB of mixed text with F\n"
    "  --soak RUNS          RUNS runs of random prompts (up to --tokens long), lambda changes and map requests on\n"
    "                       --model with the chosen backend; reports errors and memory (RSS, device) over the runs\n"
    "  --json FILE          write all results as JSON\n"
    "  --only SECTION       run only this section; repeat the option for several (default: all of the backend's\n"
    "                       sections but api and cuda's views)\n"
    "options of --backend cpu:\n"
    "  --only SECTION       sections:\n"
    "                         prefill    prefill tokens/s and lambda-change latency of --model at --tokens\n"
    "                         attention  the CPU backend's tiled causal differential attention alone: one layer,\n"
    "                                    all view heads on --threads threads, at the demo DiffLlama's heads (8 of\n"
    "                                    32, 4 KV) and kajuma/DiffLlama-0.3B-handcut's (32 of 64, 8 KV) at 1K, 3K,\n"
    "                                    8K tokens: ms, TFLOP/s, share of this machine's OpenBLAS sgemm rate\n"
    "                                    (measured in the same run), peak RSS, and the PyTorch peer's ms\n"
    "                         api        the two session calls bench/python_api_bench.py times through the Python\n"
    "                                    module, on --model (default assets/models/diffllama-demo; run from the\n"
    "                                    repository root) with assets/models/default_prompt.txt repeated or cut to\n"
    "                                    --tokens: lambda_logprobs (set_lambda_override of the middle attention\n"
    "                                    layer + run + next_token_logprobs, lambda alternating) and view_1024 (a\n"
    "                                    1024 x 1024 max-pooled view of head 0 into a host MapView, reused);\n"
    "                                    median and every sample, and the ids, layer and values the script\n"
    "                                    repeats (only with --only api)\n"
    "  --attn-tokens LIST   attention: token counts, comma-separated (default 1024,3072,8192)\n"
    "  --peer-python PY     attention: run the peer, bench/peers/peer_cpu_attention.py (torch's CPU\n"
    "                       scaled_dot_product_attention, FlashDiffAttn_1/_2 recipes), with this Python and report\n"
    "                       ours against it; bench/peers/setup_cpu_peer.sh makes .venv-peer/bin/python\n"
    "options of --backend cuda:\n"
    "  --only SECTION       sections:\n"
    "                         attention  fused causal differential attention, bf16, 12 heads d=128 and 16 heads\n"
    "                                    d=64 at 2K x 8, 4K x 4, 8K x 2, 16K x 1 tokens\n"
    "                         model      whole-model prefill, next-token logits, random weights shaped like\n"
    "                                    kajuma/DiffLlama-0.3B-handcut, 1 x 1024, 1 x 2048, 8 x 2048 tokens\n"
    "                         lambda     a lambda change at a 1024-token prompt\n"
    "                         table7     the paper's Table 7: forward throughput (next-token logits) of a 3B\n"
    "                                    DIFF model (12 differential heads of 128) against its Transformer twin\n"
    "                                    (24 heads of 128) at 2K x 8 and 4K x 4 tokens, random bf16 weights;\n"
    "                                    28 layers, MLP 8192, vocab 100288 are assumed (the JSON says so)\n"
    "                         motif      prefill of a Motif-2.6b-v1.1-LC-shaped model (random bf16 weights) at\n"
    "                                    1 x 4K and 1 x 16K tokens against the GEMM-only floor of the same shapes\n"
    "                         mamba      Mamba-1's convolution and selective scan (kernels/mamba_scan.h) at\n"
    "                                    Phi-4-mini-flash's shape (d_inner 5120, d_state 16) at 4K and 32K tokens\n"
    "                         phi4flash  prefill of Phi-4-mini-flash's shape (random bf16 weights; Mamba, sliding\n"
    "                                    window, YOCO) at 1 x 4K and 1 x 32K against the GEMM-only floor, and the\n"
    "                                    scan's share of the forward\n"
    "                         decode_attn  the decoding attention kernel alone (kajuma shape) at 1K .. 128K keys:\n"
    "                                    K+V bytes per second against the device's copy bandwidth\n"
    "                         decode     batch-1 greedy decoding of the kajuma-shaped model after 1K, 8K and 32K\n"
    "                                    tokens: ms per token as the session gives it, against the bandwidth floor\n"
    "                         scan       corpus scans (diffscope-scan's per-prompt work: forward + every layer's\n"
    "                                    answer/sink/context masses) at 4K, 16K and 32K tokens, kajuma shape,\n"
    "                                    prompts/s against forward-only prompts/s; and batch 4 against batch 1\n"
    "                         views      long prompts (1K .. 128K tokens, kajuma shape) through the map queries:\n"
    "                                    forward, a 1024 x 1024 head view, every layer's statistics, a lambda\n"
    "                                    change, peak RSS (only with --only views: minutes at 128K)\n"
    "                         api        as on the cpu, on --model, else a random checkpoint shaped like\n"
    "                                    kajuma/DiffLlama-0.3B-handcut written to the temp folder (2.5 GB; the\n"
    "                                    JSON names it), at --tokens (default 1024) (only with --only api)\n"
    "  --attn-kernel NAME   attention: time only NAME: wgmma, mma-both, mma-vsplit, mma-lockstep, generic, or\n"
    "                       auto (only the default choice). Default: the kernel the dispatcher picks by default\n"
    "                       and every other fused kernel it grants for the shape\n"
    "  --attn-d D           attention: only head dim D, 64 or 128 (default: both)\n"
    "  --warmup-ms N        run each row's work for at least N ms (and at least 2-3 times) before timing it, so\n"
    "                       that it is timed in its steady state (default 1000; 0: only the 2-3 runs)\n";

nlohmann::json bench_cpu(const std::string& model_arg, int64_t tokens, int repeat, int threads) {
  std::string model = model_arg;
  nlohmann::json r;
  if (model.empty()) {
    model = (std::filesystem::temp_directory_path() / "diffscope-bench-synthetic").string();
    ds::SyntheticShape shape;  // hidden 256, 6 layers, 4 differential heads of 32, vocab 4096: ~5.4 M parameters
    r["synthetic_params"] = ds::write_synthetic_model(model, shape);
  }
  auto s = ds::Session::open(model, ds::BackendChoice::Cpu, nullptr, threads);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(s->config().vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (auto& id : ids) id = tok(rng);
  s->set_ids(ids);
  s->run();  // warm-up
  std::vector<double> full, lam;
  for (int i = 0; i < repeat; ++i) {
    ids[0] = tok(rng);  // a new prompt each time: the whole forward runs
    s->set_ids(ids);
    auto t0 = Clock::now();
    s->run();
    full.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  // lambda change in the middle layer: re-run from there, then the maps of that layer and the top-k
  const int mid = int(s->config().layers / 2);
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    s->set_lambda_override(mid, 0.1 * (i + 1));
    s->run();
    ds::ViewRequest vr;  // what the GUI asks after a lambda change: the head view (O(view), not the n x n maps)
    vr.layer = mid;
    ds::MapView view;
    s->backend().map_view(vr, view);
    s->top_k(10);
    lam.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  const double ms = median(full);
  r["name"] = "cpu_prefill";
  r["model"] = model_arg.empty() ? "synthetic" : model_arg;
  r["params"] = s->config().params();
  r["backend"] = s->backend().name();
  r["tokens"] = tokens;
  r["prefill_ms_median"] = ms;
  r["prefill_ms_min"] = *std::min_element(full.begin(), full.end());
  r["tokens_per_s"] = double(tokens) / ms * 1e3;
  r["lambda_change_ms_median"] = median(lam);
  std::printf("%-14s %-12s %10s %8s %12s %12s %16s\n", "bench", "model", "params", "tokens", "prefill ms", "tokens/s",
              "lambda change ms");
  std::printf("%-14s %-12s %10lld %8lld %12.2f %12.0f %16.2f\n", "cpu_prefill", model_arg.empty() ? "synthetic" : "given",
              (long long)s->config().params(), (long long)tokens, ms, double(tokens) / ms * 1e3, median(lam));
  return r;
}

// --attn-tokens: comma-separated positive token counts
std::vector<int64_t> parse_tokens(const std::string& opt, const std::string& v) {
  std::vector<int64_t> r;
  size_t i = 0;
  while (i <= v.size()) {
    const size_t j = std::min(v.find(',', i), v.size());
    const std::string item = v.substr(i, j - i);
    size_t used = 0;
    long long t = 0;
    try {
      t = std::stoll(item, &used);
    } catch (const std::exception&) {  // empty or not a number: the message below names the option
    }
    if (t < 1 || used != item.size())
      throw std::invalid_argument(opt + ": '" + v + "' is not a list of positive counts");
    r.push_back(t);
    i = j + 1;
  }
  return r;
}

long rss_kb() { return ds::proc_status_kb("VmRSS:"); }

// Many runs with random prompts, lambda changes and map requests; memory must stay flat and nothing may fail.
nlohmann::json bench_soak(const std::string& model, const std::string& backend, int runs, int64_t max_tokens) {
  auto s = ds::Session::open(model, ds::parse_backend_choice(backend));
  const ds::ModelConfig& c = s->config();
  std::mt19937 rng(11);
  const char* words[] = {"the", "key", "value", "is", "of", "a", "lookup", "needle", "haystack", "42", "river", "stone",
                         "\n", "answer", "question", ":", "x7", "Zebra", "caf\xc3\xa9", "\xe4\xb8\xad"};
  std::uniform_int_distribution<int> nw(1, int(std::max<int64_t>(2, max_tokens / 2)));
  std::uniform_int_distribution<int> wi(0, int(std::size(words)) - 1);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(c.vocab - 1));
  std::uniform_int_distribution<int> layer(0, int(c.layers - 1));
  std::uniform_real_distribution<double> lam(-0.5, 1.5);
  long rss0 = 0, rss_mid = 0;
  int64_t dev0 = 0, dev_mid = 0;
  int errors = 0;
  double total_ms = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < runs; ++i) {
    try {
      if (i % 4 == 0) {  // a new prompt
        if (s->tokenizer()) {
          std::string p;
          const int k = nw(rng);
          for (int w = 0; w < k; ++w) p += std::string(words[wi(rng)]) + " ";
          s->set_prompt(p);
        } else {
          std::vector<int32_t> ids(size_t(nw(rng)));
          for (auto& id : ids) id = tok(rng);
          s->set_ids(ids);
        }
      }
      if (c.is_diff()) {
        if (i % 3 == 0) s->set_lambda_scale(lam(rng));
        else s->set_lambda_override(layer(rng), i % 5 == 0 ? std::optional<double>() : std::optional<double>(lam(rng)));
      }
      auto t = Clock::now();
      s->run();
      s->maps(layer(rng));
      s->top_k(5);
      total_ms += std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    } catch (const ds::Error& e) {
      ++errors;
      std::fprintf(stderr, "soak run %d: %s\n", i, e.what());
    }
    if (i == runs / 10) {  // after warm-up: caches and allocator pools have reached their size
      rss0 = rss_kb();
      dev0 = s->backend().device_memory_used();
    }
    if (i == runs / 2) {
      rss_mid = rss_kb();
      dev_mid = s->backend().device_memory_used();
    }
  }
  const long rss1 = rss_kb();
  const int64_t dev1 = s->backend().device_memory_used();
  nlohmann::json r = {{"name", "soak"},         {"model", model},          {"backend", s->backend().name()},
                      {"runs", runs},           {"errors", errors},        {"rss_kb_after_warmup", rss0},
                      {"rss_kb_middle", rss_mid}, {"rss_kb_end", rss1},    {"device_bytes_after_warmup", dev0},
                      {"device_bytes_middle", dev_mid}, {"device_bytes_end", dev1},
                      {"mean_run_ms", total_ms / runs},
                      {"wall_s", std::chrono::duration<double>(Clock::now() - t0).count()}};
  std::printf("soak: %d runs on %s, %d errors, RSS %ld -> %ld -> %ld kB, device %lld -> %lld -> %lld bytes, "
              "mean %.2f ms/run\n",
              runs, s->backend().name().c_str(), errors, rss0, rss_mid, rss1, (long long)dev0, (long long)dev_mid,
              (long long)dev1, total_ms / runs);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "cpu", model, json_out, tokenizer;
  int64_t tokens = 256;
  bool tokens_given = false;  // api's default length differs (1024: the shape)
  int threads = 0, soak = 0;
  std::optional<int> repeat;  // unset: the backend's default
  std::set<std::string> only;  // --only, checked against the backend's sections below
  ds::CudaBenchOptions cuda_opt;
  bool cuda_opt_given = false;
  ds::CpuAttnBenchOptions attn_opt;
  bool cpu_opt_given = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
        return argv[++i];
      };
      if (k == "-h" || k == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (k == "--backend") backend = val();
      else if (k == "--model") model = val();
      else if (k == "--tokens") tokens = std::stoll(val()), tokens_given = true;
      else if (k == "--repeat") repeat = std::stoi(val());
      else if (k == "--threads") threads = std::stoi(val());
      else if (k == "--json") json_out = val();
      else if (k == "--tokenizer") tokenizer = val();
      else if (k == "--soak") soak = std::stoi(val());
      else if (k == "--only") only.insert(val());
      else if (k == "--attn-tokens") attn_opt.tokens = parse_tokens(k, val()), cpu_opt_given = true;
      else if (k == "--peer-python") attn_opt.peer_python = val(), cpu_opt_given = true;
      else if (k == "--attn-kernel") cuda_opt.attn_kernel = val(), cuda_opt_given = true;
      else if (k == "--attn-d") cuda_opt.attn_d = std::stoi(val()), cuda_opt_given = true;
      else if (k == "--warmup-ms") cuda_opt.warmup_ms = std::stoi(val()), cuda_opt_given = true;
      else throw std::invalid_argument("unknown argument '" + k + "'");
    }
    if (backend != "cpu" && backend != "cuda") throw std::invalid_argument("--backend must be cpu or cuda");
    if (tokens < 1 || (repeat && *repeat < 1))
      throw std::invalid_argument("--tokens and --repeat must be positive");
    if (!only.empty() && soak > 0) throw std::invalid_argument("--only does not apply to --soak");
    if (cuda_opt_given && (backend != "cuda" || soak > 0))
      throw std::invalid_argument("--attn-kernel, --attn-d and --warmup-ms are options of --backend cuda");
    if (cpu_opt_given && (backend != "cpu" || soak > 0))
      throw std::invalid_argument("--attn-tokens and --peer-python are options of --backend cpu");
    if (backend == "cpu")
      for (const std::string& k : only)
        if (k != "prefill" && k != "attention" && k != "api")
          throw std::invalid_argument("--only: unknown section '" + k +
                                      "' of --backend cpu (use prefill, attention, api)");
    if (backend == "cuda") {
      // api runs on a session here, not in the CUDA suite; the suite's sections are named here with it (the suite's
      // own check below knows only its own)
      std::string names = "api";
      for (const std::string& n : ds::cuda_bench_sections()) names += ", " + n;
      for (const std::string& k : only)
        if (k != "api" && !ds::cuda_bench_sections().count(k))
          throw std::invalid_argument("--only: unknown section '" + k + "' of --backend cuda (use " + names + ")");
      cuda_opt.only = only;
      cuda_opt.only.erase("api");
    }
    if (repeat) cuda_opt.repeat = *repeat, attn_opt.repeat = *repeat;
    attn_opt.threads = threads;
    cuda_opt.model_dir = model;
#ifdef DS_HAVE_CUDA
    if (backend == "cuda") ds::check_cuda_bench_options(cuda_opt);
#endif
    if (!json_out.empty()) ds::check_writable_target(json_out, "the benchmark results");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diffscope-bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  nlohmann::json all;
  all["date"] = [] {
    std::time_t t = std::time(nullptr);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return std::string(b);
  }();
  try {
    if (soak > 0) {
      if (model.empty()) throw ds::Error("--soak needs --model DIR");
      all["soak"] = bench_soak(model, backend, soak, tokens);
    } else if (backend == "cpu") {
      // api only when asked for (its numbers are for the script to set beside the Python module's)
      auto want = [&](const char* k) { return only.empty() || only.count(k); };
      if (want("prefill")) all["cpu"] = bench_cpu(model, tokens, repeat.value_or(10), threads);
      if (want("prefill") && want("attention")) std::printf("\n");
      if (want("attention")) all["attention"] = ds::bench_cpu_attention(attn_opt);
    } else if (!only.count("api") || !cuda_opt.only.empty()) {  // the suite, unless api alone was asked for
#ifdef DS_HAVE_CUDA
      all["cuda"] = ds::run_cuda_benchmarks(cuda_opt);
#else
      throw ds::Error("this build has no CUDA backend");
#endif
    }
    if (soak == 0 && only.count("api")) {  // either backend; after the rest, which has freed its model and memory
      if (all.size() > 1) std::printf("\n");
      ds::ApiBenchOptions api;
      api.backend = backend;
      api.model_dir = model;
      api.tokens = tokens_given ? tokens : 1024;
      api.repeat = repeat.value_or(30);
      api.threads = threads;
      all["api"] = ds::bench_api(api);
    }
    if (!tokenizer.empty()) {
#ifdef DS_HAVE_TOKENIZER_BENCH
      nlohmann::json t;
      run_tokenizer_bench(tokenizer, t);
      all["tokenizer"] = t;
#else
      throw ds::Error("tokenizer benchmark not built");
#endif
    }
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "diffscope-bench: %s\n", e.what());
    return 3;
  }
  if (!json_out.empty()) {
    try {  // a long suite's results are not lost to a write error silently
      ds::write_file_safely(json_out, all.dump(2) + "\n", "the benchmark results");
    } catch (const ds::Error& e) {
      std::fprintf(stderr, "diffscope-bench: %s\n", e.what());
      std::fputs(all.dump(2).c_str(), stdout);  // still somewhere
      std::fputc('\n', stdout);
      return 3;
    }
  }
  return 0;
}
