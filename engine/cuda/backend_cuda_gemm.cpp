// The CUDA backend's GEMMs (backend_cuda_impl.h): one cuBLASLt plan per shape (descriptors and an algorithm chosen by
// timing the heuristic's candidates on the first call of a shape), the launch with its bias and residual epilogue,
// and the bf16 peak the profiler reports.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/error.h"
#include "engine/core/length_bucket.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"

namespace ds::cuda {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kGemmCandidates = 8;  // heuristic candidates timed per GEMM shape
}  // namespace

GemmPlan::~GemmPlan() {
  if (d) cublasLtMatrixLayoutDestroy(d);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (op) cublasLtMatmulDescDestroy(op);
}

namespace {

// The largest power of two up to 256 that divides the address: what cuBLASLt's MIN_ALIGNMENT preferences mean.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

// The leading dimensions. A one-row product addresses no second row, so its ld is the row's width whatever the caller's
// (the last row of a prompt sits n rows into its buffer): otherwise every prompt length was a new shape to time.
int64_t ld_x(const GemmArgs& g) { return g.ldx && g.tokens > 1 ? g.ldx : g.in_f; }
int64_t ld_y(const GemmArgs& g) { return g.ldy && g.tokens > 1 ? g.ldy : g.out_f; }
size_t elem_y(const GemmArgs& g) { return g.y_f32 ? 4 : 2; }
// Bytes from y's first element to one past its last (rows ld_y apart).
size_t gemm_out_bytes(const GemmArgs& g) {
  return (size_t(g.tokens - 1) * size_t(ld_y(g)) + size_t(g.out_f)) * elem_y(g);
}

// The timed choice per shape with its tokens rounded to a length bucket (core/length_bucket.h), per kind of device, for
// the whole process: a new length in a tuned bucket takes that algorithm wherever cuBLASLt accepts it for the shape,
// without timing, and the backends of a scan's replicas on identical GPUs (session_scan_replicas.h) share what each
// of them timed.
struct TunedKey {
  std::string device;
  GemmKey key;
  auto operator<=>(const TunedKey&) const = default;
};
std::mutex g_tuned_mu;
std::map<TunedKey, cublasLtMatmulAlgo_t> g_tuned;
std::atomic<int64_t> g_timings{0};  // shapes timed (cuda_gemm_timings)

}  // namespace

// Row-major y[tokens, out] = x[tokens, in] w[out, in]^T is, column-major, y^T = w^T(op T on [in, out]) x^T: A = w
// stored [in, out] (ld in) with transa = T, B = x stored [in, tokens] (ld in), C = D stored [out, tokens] (ld out).
GemmPlan& CudaBackend::gemm_plan(const GemmArgs& g) {
  const void* c = g.c ? g.c : g.y;
  const GemmKey key{g.out_f, g.tokens, g.in_f, ld_x(g), ld_y(g), g.y_f32, g.beta != 0.f, g.bias != nullptr,
                    alignment_of(g.w), alignment_of(g.x), alignment_of(c), alignment_of(g.y)};
  auto it = gemm_plans_.find(key);
  if (it == gemm_plans_.end()) {
    auto plan = std::make_unique<GemmPlan>();
    GemmPlan* p = plan.get();
    const cudaDataType_t dt = g.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g.bias) {  // the bias vector has y's type (cuBLASLt's default); its pointer is set again at every launch
      const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
      DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    }
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, uint64_t(g.in_f), uint64_t(g.out_f), g.in_f));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, uint64_t(g.in_f), uint64_t(g.tokens), ld_x(g)));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, dt, uint64_t(g.out_f), uint64_t(g.tokens), ld_y(g)));
    const uint64_t ws = lt_ws_.bytes();
    // A length of a tuned bucket: its algorithm, where cuBLASLt says it runs this shape within the workspace, without
    // asking the heuristic. (Taking it only where the heuristic offered it again, with the one-row products' lds above,
    // timed GEMMs at most new lengths: 2.9 s of a 6.9 s scan of 256 prompts of 2K-4K tokens on the H200,
    // bench/RESULTS.md.)
    if (autotune_) {
      TunedKey bucket{device_name_, key};
      bucket.key.n = gemm_length_bucket(key.n);
      std::optional<cublasLtMatmulAlgo_t> chosen;
      {
        std::lock_guard<std::mutex> lk(g_tuned_mu);
        if (const auto t = g_tuned.find(bucket); t != g_tuned.end()) chosen = t->second;
      }
      cublasLtMatmulHeuristicResult_t check{};
      if (chosen && cublasLtMatmulAlgoCheck(lt_.get(), p->op, p->a, p->b, p->d, p->d, &*chosen, &check) ==
                        CUBLAS_STATUS_SUCCESS && check.workspaceSize <= ws) {
        p->algo = *chosen;
        p->lt = p->tuned = true;
      }
    }
    if (!p->tuned) {  // the heuristic's candidates: its first choice, or (autotune_) the fastest of them, timed
      PreferencePtr pref = make_preference();
      std::vector<cublasLtMatmulHeuristicResult_t> res(kGemmCandidates);
      int count = 0;
      DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof ws));
      const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
      for (const auto& [attr, v] : aligns)
        DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &v, sizeof v));
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_.get(), p->op, p->a, p->b, p->d, p->d, pref.get(),
                                                               kGemmCandidates, res.data(), &count);
      // NOT_SUPPORTED: no cuBLASLt kernel for this shape/alignment; cublasGemmEx still runs it (its own fallbacks).
      if (st != CUBLAS_STATUS_NOT_SUPPORTED) DS_CUBLAS_CHECK(st);
      for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < count; ++i)
        if (res[size_t(i)].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(res[size_t(i)].algo);
      p->lt = !p->candidates.empty();
      if (p->lt) p->algo = p->candidates.front();
      p->tuned = !p->lt || !autotune_ || p->candidates.size() == 1;
    }
    if (p->tuned) p->candidates.clear();
    it = gemm_plans_.emplace(key, std::move(plan)).first;
  }
  GemmPlan& p = *it->second;
  if (!p.tuned) {
    // Where the timing runs may write: y itself when nothing reads it back (beta = 0) or when C is another buffer
    // (every run then writes the same y = xw^T + c); an in-place accumulation needs the caller's spare bytes.
    void* d = g.beta == 0.f || c != g.y ? g.y : (g.spare_bytes >= gemm_out_bytes(g) ? g.spare : nullptr);
    if (d) gemm_tune(p, g, d);
    if (p.tuned) {
      TunedKey bucket{device_name_, key};
      bucket.key.n = gemm_length_bucket(key.n);
      std::lock_guard<std::mutex> lk(g_tuned_mu);
      g_tuned.emplace(bucket, p.algo);
    }
  }
  return p;
}

// Times every candidate on the real operands (2 warm-up + 5 timed runs each, CUDA events on the backend stream)
// and keeps the fastest; ties go to the heuristic's order. It runs before the GEMM's profiler mark, but it does
// synchronise the host with the stream once per candidate: the first forward that meets a shape (a new prompt
// length, say) is slower in wall time by its tuning, up to ~0.1 s for the 8 x 2048-token MLP shapes, once.
void CudaBackend::gemm_tune(GemmPlan& p, const GemmArgs& g, void* d) {
  const float alpha = 1.f;
  const void* c = g.c ? g.c : g.y;  // in place: C stays y, only read; D is the spare
  constexpr int kWarm = 2, kRuns = 5;
  CudaEvent e0, e1;
  float best = INFINITY;
  int runnable = 0;
  set_bias(p, g);
  for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
    auto launch = [&] {
      return cublasLtMatmul(lt_.get(), p.op, &alpha, g.w, p.a, g.x, p.b, &g.beta, c, p.d, d, p.d, &algo, lt_ws_.get(),
                            lt_ws_.bytes(), stream());
    };
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < kWarm && st == CUBLAS_STATUS_SUCCESS; ++i) st = launch();
    if (st != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();  // a candidate that cannot run here must not leave an error for the next kernel's check
      continue;
    }
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), stream()));
    for (int i = 0; i < kRuns; ++i) DS_CUBLAS_CHECK(launch());
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), stream()));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
    ++runnable;
    if (ms < best) {
      best = ms;
      p.algo = algo;
    }
  }
  if (runnable == 0)
    throw Error("cuBLASLt: none of the " + std::to_string(p.candidates.size()) +
                " algorithms its heuristic offered could run the bf16 GEMM " + std::to_string(g.out_f) + " x " +
                std::to_string(g.tokens) + " x " + std::to_string(g.in_f) + "; HINT: DS_GEMM_AUTOTUNE=0 skips timing");
  p.tuned = true;
  p.candidates.clear();
  ++g_timings;
}

void CudaBackend::gemm_launch(const GemmPlan& p, const GemmArgs& g) {
  const float alpha = 1.f;
  const void* c = g.c ? g.c : g.y;
  // compute-sanitizer initcheck does not see cuBLAS's Hopper epilogue stores, so every read of a GEMM output
  // reports as uninitialised. Under DS_CUDA_INITCHECK_MARK_GEMM the output is zeroed first (cuBLAS then
  // overwrites it) whenever the GEMM does not read it back, which leaves initcheck to judge our own kernels.
  // Diagnostics only: off in normal runs.
  if (initcheck_mark_ && (g.beta == 0.f || c != g.y))
    DS_CUDA_CHECK(cudaMemset2DAsync(g.y, size_t(ld_y(g)) * elem_y(g), 0, size_t(g.out_f) * elem_y(g),
                                    size_t(g.tokens), stream()));
  if (p.lt) {
    set_bias(p, g);
    DS_CUBLAS_CHECK(cublasLtMatmul(lt_.get(), p.op, &alpha, g.w, p.a, g.x, p.b, &g.beta, c, p.d, g.y, p.d, &p.algo,
                                   lt_ws_.get(), lt_ws_.bytes(), stream()));
    return;
  }
  // cublasGemmEx has no separate C: bring the beta term into y first.
  if (g.beta != 0.f && c != g.y)
    DS_CUDA_CHECK(cudaMemcpy2DAsync(g.y, size_t(ld_y(g)) * elem_y(g), c, size_t(ld_y(g)) * elem_y(g),
                                    size_t(g.out_f) * elem_y(g), size_t(g.tokens), cudaMemcpyDeviceToDevice, stream()));
  DS_CUBLAS_CHECK(cublasGemmEx(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(g.out_f), int(g.tokens), int(g.in_f), &alpha, g.w,
                               CUDA_R_16BF, int(g.in_f), g.x, CUDA_R_16BF, int(ld_x(g)), &g.beta, g.y,
                               g.y_f32 ? CUDA_R_32F : CUDA_R_16BF, int(ld_y(g)), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
  if (g.bias) {
    if (!g.bias_f32) throw Error("CUDA backend: a GEMM with a bias but no f32 copy of it for cublasGemmEx");
    if (g.y_f32)
      DS_CUDA_CHECK(kern::launch_add_bias(static_cast<float*>(g.y), ld_y(g), g.bias_f32, g.tokens, int(g.out_f),
                                          stream()));
    else
      DS_CUDA_CHECK(kern::launch_add_bias(static_cast<bf16*>(g.y), ld_y(g), g.bias_f32, g.tokens, int(g.out_f),
                                          stream()));
  }
}

// The plan's descriptor is shared by every GEMM of its shape; each brings its own bias vector.
void CudaBackend::set_bias(const GemmPlan& p, const GemmArgs& g) {
  if (g.bias)
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
}

void CudaBackend::gemm(const char* name, int layer, const GemmArgs& g) {
  const GemmPlan& p = gemm_plan(g);  // before the mark: a first-seen shape's tuning is not the GEMM's time
  if (name) timed(name, layer, [&] { gemm_launch(p, g); });
  else gemm_launch(p, g);
}

double CudaBackend::gemm_peak_tflops() {
  const DeviceGuard on(device_);
  if (peak_tflops_ > 0) return peak_tflops_;
  const int N = 8192;
  DeviceBuffer a(size_t(N) * N * 2, "GEMM peak measurement"), b(size_t(N) * N * 2, "GEMM peak measurement"),
      c(size_t(N) * N * 2, "GEMM peak measurement");
  DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(a.as<bf16>(), int64_t(N) * N, 11, 1.f, stream()));
  DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(b.as<bf16>(), int64_t(N) * N, 12, 1.f, stream()));
  const GemmArgs g{.out_f = N, .tokens = N, .in_f = N, .w = a.as<bf16>(), .x = b.as<bf16>(), .y = c.get()};
  gemm(nullptr, -1, g);  // plans (and tunes) the shape outside the timed runs
  CudaEvent e0, e1;
  std::vector<float> t;
  for (int i = 0; i < 13; ++i) {
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), stream()));
    gemm(nullptr, -1, g);
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), stream()));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  peak_tflops_ = 2.0 * double(N) * N * N / double(t[t.size() / 2]) / 1e9;
  return peak_tflops_;
}

}  // namespace ds::cuda

namespace ds {
int64_t cuda_gemm_timings() { return cuda::g_timings.load(); }
}  // namespace ds
