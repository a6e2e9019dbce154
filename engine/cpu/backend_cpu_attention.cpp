// The CPU backend's tiled attention: the generic instance of the kernels, the run-time choice between it and the
// AVX2 + FMA one, and the thread pool. See backend_cpu_attention.h.
#include "engine/cpu/detail/backend_cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#define DS_KNS generic
#define DS_KTARGET
// The 8-float vectors pass only between this instance's own internal functions: the ABI note (which GCC gives at the
// end of the file) is not for us.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "engine/cpu/detail/backend_cpu_attention_kernels.inc"
#undef DS_KNS
#undef DS_KTARGET

namespace ds::cpu_attn {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace avx2 {
void run_block(const Block& b, float* ws);
float softmax_row(float* r, int64_t n, int64_t lo, int64_t hi);
void row_terms(const float* a1, const float* a2, int64_t count, float lambda, RowTerms& t);
void score_rows(const float* q, int64_t ldq, const float* k, int64_t ldk, int64_t d, float scale, int64_t rows,
                int64_t klo, int64_t khi, float* out, int64_t ldo, float* ws);
}  // namespace avx2
#define DS_HAVE_AVX2_INSTANCE 1
#endif

namespace {
struct Kernels {
  void (*block)(const Block&, float*);
  float (*softmax)(float*, int64_t, int64_t, int64_t);
  void (*terms)(const float*, const float*, int64_t, float, RowTerms&);
  void (*scores)(const float*, int64_t, const float*, int64_t, int64_t, float, int64_t, int64_t, int64_t, float*,
                 int64_t, float*);
  const char* isa;
};
Kernels pick() {
#ifdef DS_HAVE_AVX2_INSTANCE
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {avx2::run_block, avx2::softmax_row, avx2::row_terms, avx2::score_rows, "avx2+fma"};
#endif
  return {generic::run_block, generic::softmax_row, generic::row_terms, generic::score_rows, "generic"};
}
Kernels& kernels() {
  static Kernels k = pick();
  return k;
}
}  // namespace

int64_t scratch_floats(int64_t d, int64_t vw) {
  const int64_t vwp = (vw + 15) / 16 * 16;
  return kBlockQ * d + d * kBlockK + kBlockQ * kBlockK + kBlockK * vwp + kBlockQ * vwp + 3 * kBlockQ;
}
const char* isa() { return kernels().isa; }
bool use_isa(const char* name) {
  const std::string want = name;
  if (want == "generic") {
    kernels() = {generic::run_block, generic::softmax_row, generic::row_terms, generic::score_rows, "generic"};
    return true;
  }
  const Kernels best = pick();
  if (want != best.isa) return false;
  kernels() = best;
  return true;
}
void run_block(const Block& b, float* scratch) { kernels().block(b, scratch); }
float softmax_row(float* r, int64_t n, int64_t lo, int64_t hi) { return kernels().softmax(r, n, lo, hi); }
void row_terms(const float* a1, const float* a2, int64_t count, float lambda, RowTerms& t) {
  kernels().terms(a1, a2, count, lambda, t);
}
void score_rows(const float* q, int64_t ldq, const float* k, int64_t ldk, int64_t d, float scale, int64_t rows,
                int64_t klo, int64_t khi, float* out, int64_t ldo, float* ws) {
  kernels().scores(q, ldq, k, ldk, d, scale, rows, klo, khi, out, ldo, ws);
}

// --- the pool -------------------------------------------------------------------------------------------------
struct Pool::Impl {
  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable start, done;
  const std::function<void(int64_t, int)>* fn = nullptr;
  int64_t count = 0;
  std::atomic<int64_t> next{0};
  uint64_t generation = 0;
  int busy = 0;
  bool stop = false;

  void work(int thread) {
    for (int64_t i; (i = next.fetch_add(1)) < count;) (*fn)(i, thread);
  }
  void loop(int thread) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lk(mu);
        start.wait(lk, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
      }
      work(thread);
      std::lock_guard lk(mu);
      if (--busy == 0) done.notify_one();
    }
  }
};

Pool::Pool(int threads) : impl_(std::make_unique<Impl>()) {
  for (int t = 1; t < std::max(1, threads); ++t) impl_->workers.emplace_back([this, t] { impl_->loop(t); });
}
Pool::~Pool() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->start.notify_all();
  for (auto& t : impl_->workers) t.join();
}
int Pool::threads() const { return int(impl_->workers.size()) + 1; }

void Pool::run(int64_t count, const std::function<void(int64_t, int)>& fn) {
  if (count <= 0) return;
  if (impl_->workers.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard lk(impl_->mu);
    impl_->fn = &fn;
    impl_->count = count;
    impl_->next = 0;
    impl_->busy = int(impl_->workers.size());
    ++impl_->generation;
  }
  impl_->start.notify_all();
  impl_->work(0);
  std::unique_lock lk(impl_->mu);
  impl_->done.wait(lk, [&] { return impl_->busy == 0; });
}

}  // namespace ds::cpu_attn
