// diffscope-bench --backend cpu --only attention: see cpu_bench_attention.h. Order of the run: the sgemm rate, our
// rows (shape by shape, token count by token count), the PyTorch peer in a child process, the sgemm rate again. The
// better of the two sgemm measurements is the yardstick: on a shared machine either one may have had company (each
// records its CPU share). OpenBLAS's threads spin for a moment after a call; the rows' warm-up outlasts that.
#include "app/bench/cpu_bench_attention.h"

#include <cblas.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/bench/bench_median.h"
#include "engine/cpu/detail/backend_cpu_attention.h"
#include "kernels/attn_heads.h"

namespace ds {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace ca = cpu_attn;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// /proc/loadavg's first three fields: on a shared machine, whether something else ran beside the timings.
std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// CPU time (user + system) of the whole process so far, ms.
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3);
}

// A DiffLlama attention layer's head counts (the only part of the model the section needs).
struct AttnShape {
  const char* name;
  const char* source;
  int heads, kv_heads, head_dim;
};

const AttnShape kShapes[] = {
    {"demo", "assets/models/diffllama-demo/config.json", 8, 4, 32},
    // the numbers of kajuma_shape() in app/bench/cuda_bench.cpp (CUDA-only, so not callable here), from the model's
    // config.json: https://huggingface.co/kajuma/DiffLlama-0.3B-handcut
    {"kajuma", "kajuma/DiffLlama-0.3B-handcut (config.json on huggingface.co)", 32, 8, 64},
};

// Any value does: the work does not depend on it. The peer gets the same one.
constexpr float kLambda = 0.5f;

// Warm-up before each row's timed runs: at least one run and at least this long. One run alone was not enough for
// the first row of the process: on a quiet 2-core VM (2026-11-28) demo x 1024 read 11.5 ms after one warm-up run as
// the process's first row, 5.7 ms as its second, the runs settling over ~100 ms (clocks, the pool's threads
// waking). The peer warms up the same way.
constexpr double kWarmupMs = 300;

// One layer's inputs laid out as CpuBackend keeps them: q [n, H d], k and v [n, Hkv d], out [n, Hv 2d].
struct Layer {
  int64_t n, H, Hkv, d, Hv, vw;
  std::vector<float> q, k, v, out;
};

Layer make_layer(const AttnShape& s, int64_t n, uint32_t seed) {
  Layer L;
  L.n = n, L.H = s.heads, L.Hkv = s.kv_heads, L.d = s.head_dim;
  L.Hv = kern::view_heads(true, s.heads), L.vw = kern::view_width(true, s.head_dim);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);  // N(0, 1), never zeros: the scores span a realistic softmax range
  auto fill = [&](std::vector<float>& x, int64_t count) {
    x.resize(size_t(count));
    for (float& e : x) e = nd(rng);
  };
  fill(L.q, n * L.H * L.d);
  fill(L.k, n * L.Hkv * L.d);
  fill(L.v, n * L.Hkv * L.d);
  L.out.assign(size_t(n * L.Hv * L.vw), 0.f);
  return L;
}

// Every view head of the layer, all query rows: the items and head mapping of CpuBackend::attention_block (s = 0,
// no window), the heaviest query blocks first.
void run_layer(Layer& L, ca::Pool& pool, std::vector<std::vector<float>>& scratch) {
  const int64_t blocks = (L.n + ca::kBlockQ - 1) / ca::kBlockQ;
  pool.run(blocks * L.Hv, [&](int64_t item, int thread) {
    const int64_t j = item % L.Hv, bi = blocks - 1 - item / L.Hv;
    const kern::ViewHeadMap hm = kern::view_head_map(true, int(j), int(L.H), int(L.Hkv));
    ca::Block b;
    b.p0 = bi * ca::kBlockQ;
    b.p1 = std::min(L.n, b.p0 + ca::kBlockQ);
    b.s = 0;
    b.window = 0;
    b.d = L.d;
    b.vw = L.vw;
    b.scale = float(1.0 / std::sqrt(double(L.d)));
    b.maps = 2;
    b.c2 = kLambda;
    for (int i = 0; i < 2; ++i) {
      b.q[i] = L.q.data() + hm.q[i] * L.d;
      b.k[i] = L.k.data() + hm.k[i] * L.d;
      b.v[i] = L.v.data() + hm.v[i] * L.d;
    }
    b.ldq = L.H * L.d;
    b.ldk = b.ldv = L.Hkv * L.d;
    b.out = L.out.data() + j * L.vw;
    b.ldo = L.Hv * L.vw;
    ca::run_block(b, scratch[size_t(thread)].data());
  });
}

// The largest |ours - reference| over a few rows (first, middle, last query of the first and last view head), the
// reference in double straight from the definition: so that the section never times a set-up that computes
// something else (a wrong head mapping or stride would show here).
double check_rows(const Layer& L) {
  double worst = 0;
  const double scale = 1.0 / std::sqrt(double(L.d));
  for (int64_t j : {int64_t(0), L.Hv - 1})
    for (int64_t p : {int64_t(0), L.n / 2, L.n - 1}) {
      const kern::ViewHeadMap hm = kern::view_head_map(true, int(j), int(L.H), int(L.Hkv));
      std::vector<double> ref(size_t(L.vw), 0.0), sc(size_t(p + 1));
      for (int m = 0; m < 2; ++m) {
        const float* q = L.q.data() + p * L.H * L.d + hm.q[m] * L.d;
        double mx = -1e300, sum = 0;
        for (int64_t t = 0; t <= p; ++t) {
          const float* k = L.k.data() + t * L.Hkv * L.d + hm.k[m] * L.d;
          double dot = 0;
          for (int64_t c = 0; c < L.d; ++c) dot += double(q[c]) * k[c];
          sc[size_t(t)] = dot * scale;
          mx = std::max(mx, sc[size_t(t)]);
        }
        for (int64_t t = 0; t <= p; ++t) sum += sc[size_t(t)] = std::exp(sc[size_t(t)] - mx);
        const double w = (m == 0 ? 1.0 : -double(kLambda)) / sum;
        for (int64_t t = 0; t <= p; ++t)
          for (int64_t c = 0; c < L.vw; ++c) {
            const int half = c < L.d ? 0 : 1;
            ref[size_t(c)] += w * sc[size_t(t)] * L.v[size_t(t * L.Hkv * L.d + hm.v[half] * L.d + c % L.d)];
          }
      }
      const float* o = L.out.data() + p * L.Hv * L.vw + j * L.vw;
      for (int64_t c = 0; c < L.vw; ++c) worst = std::max(worst, std::abs(double(o[c]) - ref[size_t(c)]));
    }
  return worst;
}

// "5" resets VmHWM to the current RSS (Linux >= 4.0), so that each shape's peak is its own and not the sgemm's or
// an earlier section's.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

// OpenBLAS sgemm, square n^3, all threads: the best of 3 after a warm-up call (GFLOP/s).
json sgemm_rate(int threads) {
  openblas_set_num_threads(threads);
  json r;
  r["loadavg"] = loadavg();
  r["blas"] = std::string("OpenBLAS ") + openblas_get_config();
  r["core"] = openblas_get_corename();
  r["threads"] = threads;
  double best_rate = 0;
  for (int n : {1024, 2048}) {
    std::mt19937 rng{uint32_t(n)};
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> a(size_t(n) * n), b(a.size()), c(a.size());
    for (float& e : a) e = nd(rng);
    for (float& e : b) e = nd(rng);
    auto mm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    };
    mm();
    double best = 1e300, wall = 0;
    const double cpu0 = process_cpu_ms();
    for (int i = 0; i < 3; ++i) {
      const auto t = Clock::now();
      mm();
      const double ms = ms_since(t);
      best = std::min(best, ms);
      wall += ms;
    }
    const double gflops = 2.0 * n * n * double(n) / (best * 1e-3) / 1e9;
    const double share = (process_cpu_ms() - cpu0) / (wall * threads);
    r["sizes"].push_back({{"n", n}, {"ms", best}, {"gflops", gflops}, {"cpu_share", share}});
    best_rate = std::max(best_rate, gflops);
  }
  r["gflops"] = best_rate;
  return r;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// bench/peers/peer_cpu_attention.py: beside this source tree (the usual case: the binary runs where it was built),
// else relative to the working directory.
std::string find_peer_script() {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("bench") / "peers" / "peer_cpu_attention.py";
  const fs::path here = fs::path(__FILE__).parent_path().parent_path().parent_path() / rel;
  std::error_code ec;
  if (fs::is_regular_file(here, ec)) return here.string();
  if (fs::is_regular_file(rel, ec)) return rel.string();
  return {};
}

// Runs the peer with the same threads, repeat, token counts and shapes; its JSON (the last line on stdout that is
// one) or {"error": ...}.
json run_peer(const CpuAttnBenchOptions& o, int threads) {
  if (o.peer_python.empty()) return {{"error", "not run: no --peer-python given"}};
  const std::string script = find_peer_script();
  if (script.empty()) return {{"error", "bench/peers/peer_cpu_attention.py not found"}};
  std::string cmd = shell_quote(o.peer_python) + " " + shell_quote(script) + " --threads " + std::to_string(threads) +
                    " --repeat " + std::to_string(o.repeat) + " --warmup-ms " + std::to_string(int(kWarmupMs)) +
                    " --lambda " + std::to_string(kLambda) + " --tokens ";
  for (size_t i = 0; i < o.tokens.size(); ++i) cmd += (i ? "," : "") + std::to_string(o.tokens[i]);
  for (const AttnShape& s : kShapes)
    cmd += std::string(" --shape ") + s.name + ":" + std::to_string(kern::view_heads(true, s.heads)) + ":" +
           std::to_string(s.head_dim);
  std::fprintf(stderr, "attention: peer: %s\n", cmd.c_str());
  std::fflush(nullptr);  // the child inherits our stderr: keep the lines in order
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {{"error", "could not start: " + cmd}};
  std::string out;
  char buf[4096];
  for (size_t got; (got = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, got);
  const int status = pclose(p);
  std::string last;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') last = line;
  if (status != 0 || last.empty()) {
    std::string how = "wait status " + std::to_string(status);
    if (status != -1 && WIFEXITED(status)) how = "exit status " + std::to_string(WEXITSTATUS(status));
    else if (status != -1 && WIFSIGNALED(status)) how = "killed by signal " + std::to_string(WTERMSIG(status));
    return {{"error", how + (last.empty() ? ", no JSON on stdout" : "") + " (command: " + cmd + ")"}};
  }
  try {
    json r = json::parse(last);
    r["command"] = cmd;
    return r;
  } catch (const std::exception& e) {
    return {{"error", std::string("unparsable JSON: ") + e.what()}};
  }
}

}  // namespace

long proc_status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string k;
  long v = 0;
  while (in >> k) {
    if (k == field) {
      in >> v;
      return v;
    }
    std::getline(in, k);
  }
  return -1;
}

json bench_cpu_attention(const CpuAttnBenchOptions& o) {
  const int T = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::fflush(stdout);  // what earlier sections printed, before this section's progress on stderr
  ca::Pool pool(T);
  json r;
  r["name"] = "cpu_attention";
  r["kernel"] = ca::isa();
  r["threads"] = T;
  r["repeat"] = o.repeat;
  r["timing"] = "warm-up (at least one run and " + std::to_string(int(kWarmupMs)) +
                " ms of runs), then the median of repeat runs; each run is one layer's causal differential attention, "
                "all view heads, (head, " + std::to_string(ca::kBlockQ) + "-query block) items on the pool";
  r["flops"] = "kern::attn_flops: 12 n^2 d per differential head, halved for causal";
  r["lambda"] = kLambda;
  r["loadavg_at_start"] = loadavg();
  const json sgemm_start = sgemm_rate(T);
  json shapes = json::array();
  for (const AttnShape& s : kShapes) {
    json sh = {{"name", s.name},           {"source", s.source},
               {"heads", s.heads},         {"kv_heads", s.kv_heads},
               {"head_dim", s.head_dim},   {"view_heads", kern::view_heads(true, s.heads)},
               {"value_width", kern::view_width(true, s.head_dim)}};
    const bool reset = reset_peak_rss();
    // What the process holds before the shape's buffers (the linked libraries' pages, OpenBLAS's buffers): the peak
    // minus this is the shape's own.
    sh["rss_kb_at_start"] = proc_status_kb("VmRSS:");
    json rows = json::array();
    for (int64_t n : o.tokens) {
      Layer L = make_layer(s, n, uint32_t(n * 131 + s.head_dim));  // fresh inputs per shape and length
      std::vector<std::vector<float>> scratch(size_t(T), std::vector<float>(size_t(ca::scratch_floats(L.d, L.vw))));
      for (const auto w0 = Clock::now(); ms_since(w0) < kWarmupMs;) run_layer(L, pool, scratch);  // >= 1 run
      std::vector<double> ms;
      const double cpu0 = process_cpu_ms();
      for (int i = 0; i < o.repeat; ++i) {
        const auto t = Clock::now();
        run_layer(L, pool, scratch);
        ms.push_back(ms_since(t));
      }
      // The share of the T cores this process had while timed: well below 1 means something else ran on them (on a
      // shared machine), or the pool's threads waited on each other.
      double wall = 0;
      for (double x : ms) wall += x;
      const double cpu_share = (process_cpu_ms() - cpu0) / (wall * T);
      const double med = median(ms), flops = kern::attn_flops(true, L.Hv, L.d, n);
      const double err = check_rows(L);
      rows.push_back({{"tokens", n},
                      {"ms", med},
                      {"ms_min", *std::min_element(ms.begin(), ms.end())},
                      {"runs_ms", ms},
                      {"flops", flops},
                      {"tflops", flops / med / 1e9},
                      {"check_max_abs_err", err},
                      {"cpu_share", cpu_share}});
      sh["buffers_kb"] = int64_t((L.q.size() + L.k.size() + L.v.size() + L.out.size()) * sizeof(float) / 1024 +
                                 T * ca::scratch_floats(L.d, L.vw) * int64_t(sizeof(float)) / 1024);
      std::fprintf(stderr, "attention: %s n=%lld: %.2f ms (%.3f TFLOP/s), cpu share %.2f, check max |err| %.2e\n",
                   s.name, (long long)n, med, flops / med / 1e9, cpu_share, err);
      if (err > 1e-3) std::fprintf(stderr, "attention: WARNING: %s n=%lld differs from the reference\n", s.name,
                                   (long long)n);
    }
    // After the largest length (the inputs of the last one are freed by now, their pages' peak stays in VmHWM).
    sh["peak_rss_kb"] = proc_status_kb("VmHWM:");
    sh["peak_rss_reset"] = reset;
    sh["rows"] = rows;
    shapes.push_back(sh);
  }

  r["loadavg_after_ours"] = loadavg();
  json peer = run_peer(o, T);
  const json sgemm_end = sgemm_rate(T);
  r["loadavg_at_end"] = loadavg();
  const json& sg = sgemm_start["gflops"].get<double>() >= sgemm_end["gflops"].get<double>() ? sgemm_start : sgemm_end;
  const double sgemm = sg["gflops"].get<double>();
  r["sgemm"] = sg;  // the better of the two
  r["sgemm_runs"] = {{"start", sgemm_start}, {"end", sgemm_end}};

  // Ratios, and the table.
  std::printf("CPU attention: kernel %s, %d threads, causal differential, one layer (all view heads), median of %d\n",
              ca::isa(), T, o.repeat);
  std::printf("sgemm (%s, %s kernels, %d threads): %.1f GFLOP/s, the better of\n",
              sg["blas"].get<std::string>().c_str(), sg["core"].get<std::string>().c_str(), T, sgemm);
  for (const char* when : {"start", "end"}) {
    std::printf("  at the %-5s", when);
    for (const json& z : r["sgemm_runs"][when]["sizes"])
      std::printf("  %d^3: %.1f GFLOP/s (cpu %.2f)", z["n"].get<int>(), z["gflops"].get<double>(),
                  z["cpu_share"].get<double>());
    std::printf("\n");
  }
  if (peer.contains("error")) std::printf("peer: %s\n", peer["error"].get<std::string>().c_str());
  else
    std::printf("peer: torch %s CPU SDPA (capability %s, %d threads; its f32 matmul 2048^3: %.1f GFLOP/s), the faster "
                "of fd1 (2 calls, V 2d) and fd2 (4 calls, V halves)\n",
                peer.value("torch", "?").c_str(), peer.value("cpu_capability", "?").c_str(), peer.value("threads", 0),
                peer.value("matmul_gflops", 0.0));
  std::printf("%-8s %7s %10s %9s %8s %4s %11s %-5s %-15s %4s %9s  %s\n", "shape", "tokens", "ms", "TFLOP/s", "% sgemm",
              "cpu", "peer ms", "peer", "peer SDPA", "cpu", "ours/peer", "peak RSS MB (+ over start)");
  for (json& sh : shapes) {
    const json* ps = nullptr;
    if (peer.contains("shapes"))
      for (const json& x : peer["shapes"])
        if (x.value("name", "") == sh["name"].get<std::string>()) ps = &x;
    json& rows = sh["rows"];
    for (size_t i = 0; i < rows.size(); ++i) {
      json& row = rows[i];
      const double tf = row["tflops"].get<double>();
      row["sgemm_fraction"] = sgemm > 0 ? tf * 1e3 / sgemm : 0.0;
      std::string peer_ms = "-", recipe = "-", backend = "-", ratio = "-", peer_cpu = "-";
      if (ps && ps->contains("rows"))
        for (const json& pr : (*ps)["rows"])
          if (pr.value("tokens", int64_t(0)) == row["tokens"].get<int64_t>() && pr.contains("ms")) {
            const double pms = pr["ms"].get<double>();
            const std::string best = pr.value("best", "");
            row["peer_ms"] = pms;
            row["peer_recipe"] = best;
            // > 1: ours is faster (the peer's time over ours)
            row["speedup_vs_peer"] = pms / row["ms"].get<double>();
            char b[32];
            std::snprintf(b, sizeof b, "%.2f", pms);
            peer_ms = b;
            std::snprintf(b, sizeof b, "%.2fx", pms / row["ms"].get<double>());
            ratio = b;
            recipe = best;
            backend = pr[best].value("sdpa_backend", "?");
            if (pr[best].contains("cpu_share")) {
              std::snprintf(b, sizeof b, "%.2f", pr[best]["cpu_share"].get<double>());
              peer_cpu = b;
            }
          }
      const bool last = i + 1 == rows.size();
      char rss[64] = "";
      if (last)
        std::snprintf(rss, sizeof rss, "%.1f (+%.1f)", sh["peak_rss_kb"].get<long>() / 1024.0,
                      (sh["peak_rss_kb"].get<long>() - sh["rss_kb_at_start"].get<long>()) / 1024.0);
      std::printf("%-8s %7lld %10.2f %9.3f %7.1f%% %4.2f %11s %-5s %-15s %4s %9s  %s\n",
                  sh["name"].get<std::string>().c_str(), (long long)row["tokens"].get<int64_t>(),
                  row["ms"].get<double>(), tf, 100 * row["sgemm_fraction"].get<double>(),
                  row["cpu_share"].get<double>(), peer_ms.c_str(), recipe.c_str(), backend.c_str(), peer_cpu.c_str(),
                  ratio.c_str(), rss);
    }
    if (ps && ps->contains("peak_rss_kb")) {
      sh["peer_peak_rss_kb"] = (*ps)["peak_rss_kb"];
      sh["peer_rss_kb_at_start"] = ps->value("rss_kb_at_start", -1L);
    }
  }
  std::printf("ours/peer: the peer's time over ours (> 1: ours is faster)\n"
              "cpu: the process's CPU time over wall time x threads while timed (well below 1: the cores were shared)\n"
              "peak RSS: VmHWM of this process after the shape's last length%s\n"
              "load average: %s at the start, %s after our rows, %s at the end\n",
              shapes.empty() || shapes[0]["peak_rss_reset"].get<bool>() ? " (reset before each shape)" : "",
              r["loadavg_at_start"].get<std::string>().c_str(), r["loadavg_after_ours"].get<std::string>().c_str(),
              r["loadavg_at_end"].get<std::string>().c_str());
  r["shapes"] = shapes;
  r["peer"] = peer;
  return r;
}

}  // namespace ds
