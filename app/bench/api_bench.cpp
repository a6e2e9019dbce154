// See api_bench.h.
#include "app/bench/api_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <sys/resource.h>
#include <vector>

#include "app/bench/bench_median.h"
#include "app/bench/synthetic_model.h"
#include "engine/core/error.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/session/session.h"

namespace ds {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

const char* const kDemoModel = "assets/models/diffllama-demo";
const char* const kPromptFile = "assets/models/default_prompt.txt";

// The lambda values the calls alternate between: any two different values do (a layer's work does not depend on
// its lambda), and a value equal to the last run's would make run() a no-op.
constexpr double kLambdas[2] = {0.25, 0.75};

constexpr int kGrid = 1024;  // the view's rows and columns

// Warm-up before the timed runs: at least kWarmupRounds rounds of both calls and at least the backend's time. The
// first calls of a process are slower: on the CPU the pool's threads wake and the view's pages are touched
// (cpu_bench_attention.cpp says by how much), on an H200 the clocks settle over hundreds of ms (cuda_bench.h,
// --warmup-ms). The JSON carries both numbers, and the script warms up by them.
constexpr int kWarmupRounds = 4;
constexpr double kWarmupMsCpu = 300, kWarmupMsCuda = 1000;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Minor page faults of this process so far: a call that allocates memory the C library has just given back to the
// system faults it in again, milliseconds at these sizes; the JSON reports them per call, beside the times, and the
// script does the same, so that an allocator effect is told from the module's own cost.
double minor_faults() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return double(ru.ru_minflt);
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

// kajuma/DiffLlama-0.3B-handcut's sizes (kajuma_shape() in cuda_bench.cpp, which is CUDA-only and holds a
// ModelConfig, not a checkpoint), written as a checkpoint that both this program and the Python module open.
SyntheticShape kajuma_synthetic() {
  SyntheticShape s;
  s.diff = true;
  s.hidden = 2048;
  s.layers = 16;
  s.heads = 32;
  s.kv_heads = 8;
  s.head_dim = 64;
  s.intermediate = 8192;
  s.vocab = 128256;
  s.max_positions = 131072;
  return s;
}

// The prompt: the default prompt through the model's tokenizer, its text repeated (without a second BOS) or cut to
// n tokens, so that the ids are the demo's real text; a model without a tokenizer (the synthetic one) gets
// fixed-seed random ids. The script takes the ids from the JSON either way.
std::vector<int32_t> api_prompt(const Session& s, int64_t n, std::string& how) {
  std::vector<int32_t> ids;
  if (const Tokenizer* tok = s.tokenizer()) {
    std::ifstream f(kPromptFile, std::ios::binary);
    if (!f)
      throw Error(std::string("api: cannot read ") + kPromptFile + " (run diffscope-bench from the repository root)");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ids = tok->encode(text, true);
    const std::vector<int32_t> body = tok->encode(text, false);
    if (body.empty()) throw Error(std::string("api: ") + kPromptFile + " encodes to no tokens");
    for (size_t i = 0; int64_t(ids.size()) < n; ++i) ids.push_back(body[i % body.size()]);
    ids.resize(size_t(n));
    how = std::string(kPromptFile) + " (tokenized, repeated or cut to the length)";
  } else {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> pick(3, int32_t(s.config().vocab - 1));
    ids.resize(size_t(n));
    for (auto& id : ids) id = pick(rng);
    how = "random ids (seed 7; the model has no tokenizer)";
  }
  return ids;
}

}  // namespace

std::string api_bench_synthetic_dir() {
  return (std::filesystem::temp_directory_path() / "diffscope-bench-api-kajuma").string();
}

json bench_api(const ApiBenchOptions& o) {
  if (o.backend != "cpu" && o.backend != "cuda") throw Error("api: --backend must be cpu or cuda");
  if (o.tokens < 1 || o.repeat < 1) throw Error("api: --tokens and --repeat must be positive");
  const BackendChoice choice = parse_backend_choice(o.backend);
  json r;
  std::string dir = o.model_dir;
  if (dir.empty() && o.backend == "cpu") {
    dir = kDemoModel;
    if (!std::filesystem::exists(dir + "/config.json"))
      throw Error(std::string("api: no ") + kDemoModel +
                  " here (run diffscope-bench from the repository root, or give --model)");
    r["model"] = "diffllama-demo";
  } else if (dir.empty()) {
    // Not 2.5 GB written for a backend that is not there.
    std::string why;
    if (!cuda_backend_available(&why, choice.device)) throw Error("api: CUDA backend unavailable: " + why);
    // Written anew by every run: the script passes --model to the runs after its first, so this costs once.
    dir = api_bench_synthetic_dir();
    std::printf("api: writing a kajuma-shaped random checkpoint to %s ...\n", dir.c_str());
    std::fflush(stdout);
    r["synthetic_params"] = write_synthetic_model(dir, kajuma_synthetic(), 1);
    r["model"] = "synthetic kajuma shape";
    r["model_shape"] = "hidden 2048, 16 layers, 32 heads of 64, 8 KV heads, MLP 8192, vocab 128256 "
                       "(kajuma/DiffLlama-0.3B-handcut), random bf16 weights; RoPE theta 10000 without Llama-3 "
                       "scaling (the work does not depend on it)";
  } else {
    r["model"] = dir;
  }
  r["synthetic"] = r.contains("model_shape");  // the script deletes a synthetic folder when it is done
  r["model_dir"] = std::filesystem::absolute(dir).lexically_normal().string();

  auto s = Session::open(dir, choice, nullptr, o.threads);
  const ModelConfig& c = s->config();
  if (!c.is_diff())
    throw Error(std::string("api: the lambda call needs a differential model; ") + dir + " is a " + c.family() +
                " model");
  const std::vector<int64_t> attn = c.map_layers();
  if (attn.empty()) throw Error("api: " + dir + " has no attention layer");
  const int layer = int(attn[attn.size() / 2]);  // the middle attention layer: half the model re-runs
  const int head = 0;
  std::string prompt_how;
  const std::vector<int32_t> ids = api_prompt(*s, o.tokens, prompt_how);
  s->set_ids(ids);
  s->run();

  ViewRequest vr;
  vr.layer = layer;
  vr.head = head;
  vr.rows = kGrid;
  vr.cols = kGrid;
  vr.pool = Pool::Max;
  const int64_t V = c.vocab;
  // One MapView for every call: prepare_view reuses its vectors' memory, so this times the engine's work alone,
  // the floor the module's calls are held to (they make a new View each time). A new MapView per call measured
  // 10.4 against 6.0 ms here (2026-11-28, 2-core VM): glibc gives the freed 12 MB back to the system at the top of
  // the heap and the next view faults every page in again, an accident of this process's heap layout that the
  // Python process, whose heap top is held by other objects, did not pay.
  MapView v;
  double checksum = 0;  // keeps every result used
  int calls = 0;        // over warm-up and timed runs: which lambda value comes next
  // One round: the lambda call, then the view of the run it made (the GUI's order). Checked, so that a call that
  // did less than it should (no re-run, a short result) cannot pass for a fast one.
  // Times (ms) and minor page faults of one round's two calls: lambda_logprobs, view_1024.
  struct Sample {
    double ms_lp = 0, ms_view = 0, faults_lp = 0, faults_view = 0;
  };
  auto round = [&](Sample* out) {
    const double lam = kLambdas[calls++ % 2];
    const double f0 = minor_faults();
    auto t0 = Clock::now();
    s->set_lambda_override(layer, lam);
    const int from = s->run();
    std::vector<float> lp = s->next_token_logprobs();
    const double ms_lp = ms_since(t0);
    const double f1 = minor_faults();
    if (from != layer)
      throw Error("api: the lambda change re-ran from layer " + std::to_string(from) + ", not " +
                  std::to_string(layer));
    if (int64_t(lp.size()) != V || !std::isfinite(lp[0]))
      throw Error("api: next_token_logprobs gave " + std::to_string(lp.size()) + " values, not finite " +
                  std::to_string(V));
    checksum += lp[size_t(calls) % lp.size()];
    const double f2 = minor_faults();
    t0 = Clock::now();
    s->backend().map_view(vr, v);
    const double ms_view = ms_since(t0);
    const double f3 = minor_faults();
    const int64_t want = std::min<int64_t>(kGrid, int64_t(ids.size()));
    if (v.rows != want || v.cols != want || v.diff.size() != size_t(want * want) || v.a2.empty())
      throw Error("api: map_view gave a " + std::to_string(v.rows) + " x " + std::to_string(v.cols) + " grid, not " +
                  std::to_string(want) + " x " + std::to_string(want));
    checksum += v.diff[v.diff.size() / 2];
    if (out) *out = {ms_lp, ms_view, f1 - f0, f3 - f2};
  };
  const double warm_ms = o.backend == "cuda" ? kWarmupMsCuda : kWarmupMsCpu;
  const auto tw = Clock::now();
  int warm = 0;
  while (warm < kWarmupRounds || ms_since(tw) < warm_ms) {
    round(nullptr);
    if (++warm >= 200) break;
  }
  std::vector<double> t_lp, t_view, f_lp, f_view;
  for (int i = 0; i < o.repeat; ++i) {
    Sample x;
    round(&x);
    t_lp.push_back(x.ms_lp);
    t_view.push_back(x.ms_view);
    f_lp.push_back(x.faults_lp);
    f_view.push_back(x.faults_view);
  }

  r["name"] = "api";
  r["backend"] = s->backend().name();
  r["backend_kind"] = s->backend().kind();
  r["threads"] = o.threads;
  r["tokens"] = int64_t(ids.size());
  r["prompt"] = prompt_how;
  r["ids"] = ids;
  r["layer"] = layer;
  r["head"] = head;
  r["grid"] = {kGrid, kGrid};
  r["pool"] = "max";
  r["view_into"] = "one host MapView reused by every call (its memory reused: no allocation timed)";
  r["lambda_values"] = {kLambdas[0], kLambdas[1]};
  r["warmup_min_rounds"] = kWarmupRounds;
  r["warmup_ms"] = warm_ms;
  r["warmup_rounds"] = warm;
  r["repeat"] = o.repeat;
  r["lambda_logprobs_ms_median"] = median(t_lp);
  r["view_1024_ms_median"] = median(t_view);
  r["lambda_logprobs_ms"] = t_lp;
  r["view_1024_ms"] = t_view;
  r["lambda_logprobs_minor_faults_mean"] = mean(f_lp);
  r["view_1024_minor_faults_mean"] = mean(f_view);
  r["checksum"] = checksum;
  std::printf("api: %s on %s, %lld tokens, layer %d head %d, %d timed runs after %d warm-up rounds\n",
              r["model"].get<std::string>().c_str(), s->backend().name().c_str(), (long long)ids.size(), layer, head,
              o.repeat, warm);
  std::printf("%-66s %10s %10s %14s\n", "call", "median ms", "min ms", "faults/call");
  std::printf("%-66s %10.3f %10.3f %14.0f\n", "lambda_logprobs: set_lambda_override + run + next_token_logprobs",
              median(t_lp), *std::min_element(t_lp.begin(), t_lp.end()), mean(f_lp));
  std::printf("%-66s %10.3f %10.3f %14.0f\n", "view_1024: map_view 1024 x 1024 (max) to a host MapView",
              median(t_view), *std::min_element(t_view.begin(), t_view.end()), mean(f_view));
  return r;
}

}  // namespace ds
