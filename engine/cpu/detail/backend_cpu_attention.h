// The CPU backend's attention (library diffscope_cpu): causal, optionally sliding-window, plain or differential
// attention of every view head of a layer, tiled (flash style: scores -> online softmax -> P.V in cache-sized tiles,
// nothing above the diagonal or left of the window, no n x n buffer), f32 throughout, the (head, query block) work
// items spread over a pool of threads. The kernels are written once (backend_cpu_attention_kernels.inc) with GCC/clang
// vector extensions and compiled twice: for the baseline x86-64 / any target, and with AVX2 + FMA, picked at run time.
// Also the vectorised softmax row the map queries use, so that maps and outputs share one exponential.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

namespace ds::cpu_attn {

// One work item: query positions [p0, p1) of one view head (p1 - p0 <= kBlockQ).
struct Block {
  int64_t p0 = 0, p1 = 0;  // absolute query positions
  int64_t s = 0;           // absolute position of q row 0 and out row 0
  int64_t window = 0;      // > 0: query p sees keys [p - window + 1, p]; else [0, p]
  int64_t d = 0;           // head dim (of q and k)
  int64_t vw = 0;          // value width: d (plain) or 2 d (differential: [V of v[0] | V of v[1]])
  float scale = 1.f;       // applied to the scores
  int maps = 1;            // 1: out = c1 softmax(q0 k0^T) V; 2: out = c1 softmax(q0 k0^T) V - c2 softmax(q1 k1^T) V
  float c1 = 1.f, c2 = 0.f;  // c2: the head's lambda
  // Knockout: query p in [q0, q1) of span i does not see keys [k0, k1); a row with no key left gives 0.
  struct Knock {
    int64_t q0, q1, k0, k1;
  };
  const Knock* ko = nullptr;
  int nko = 0;
  int bits = 0;  // > 0: the scores fake-quantised (quantize_logit) with each row's largest |score| over its keys
  const float* q[2] = {nullptr, nullptr};  // row r at q[m] + r * ldq (rows from position s)
  int64_t ldq = 0;
  const float* k[2] = {nullptr, nullptr};  // key p at k[m] + p * ldk
  int64_t ldk = 0;
  const float* v[2] = {nullptr, nullptr};  // value p at v[i] + p * ldv; v[1] only when vw == 2 d
  int64_t ldv = 0;
  float* out = nullptr;  // row r at out + r * ldo, vw values (rows from position s)
  int64_t ldo = 0;
};

// Attention logits fake-quantised to `bits` bits (the quantisation what-if, forward.h AttnEdit::logit_bits): symmetric,
// absmax-scaled per query row and head: step = amax / (2^(bits-1) - 1), x -> rint(x / step) * step (ties to even).
inline float quantize_logit(float x, float amax, int bits) {
  if (!(amax > 0.f)) return x;
  const float step = amax / float((1 << (bits - 1)) - 1);
  return __builtin_rintf(x / step) * step;
}

constexpr int64_t kBlockQ = 64;  // query rows per work item
constexpr int64_t kBlockK = 64;  // keys per tile

// floats of work space one thread needs for blocks of this shape
int64_t scratch_floats(int64_t d, int64_t vw);

// Which kernel instance runs ("avx2+fma" or "generic"), for the backend's name and the benchmark.
const char* isa();
// Selects the kernel instance by name ("avx2+fma", "generic"); false when this CPU or build lacks it. Not for use
// while a forward runs (tests and the benchmark compare the instances).
bool use_isa(const char* name);

// A fixed pool of threads (the caller's thread is one of them). run() hands out items 0 .. count-1 in order, each
// to the next free thread, and returns when all are done; fn(item, thread) with thread in [0, threads()).
class Pool {
 public:
  explicit Pool(int threads);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  int threads() const;
  void run(int64_t count, const std::function<void(int64_t item, int thread)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One block into out (rows [p0 - s, p1 - s)); scratch: scratch_floats(d, vw) floats of this thread.
void run_block(const Block& b, float* scratch);

// out[r, klo .. khi) = scale * q[r] . k[j] for rows r < rows (q row r at q + r ldq, key j at k + j ldk, out row r at
// out + r ldo; other columns untouched): the map queries' scores, tiled like the attention. ws: scratch_floats(d, d).
void score_rows(const float* q, int64_t ldq, const float* k, int64_t ldk, int64_t d, float scale, int64_t rows,
                int64_t klo, int64_t khi, float* out, int64_t ldo, float* ws);

// Sums over one attention row (count entries: keys 0..q) of A1, A2 and D = A1 - lambda A2, for the map statistics
// (map_query.h's StatsAccumulator terms): e1 = -sum a1 log a1, e2 likewise (0 without a2), absd = sum |D|, dlogd =
// sum |D| log |D|, neg = -sum of the negative D, and D's extremes. Vectorised logarithms (within 2 ulp of logf).
struct RowTerms {
  double e1 = 0, e2 = 0, absd = 0, dlogd = 0, neg = 0;
  float dmin = 0, dmax = 0;
};
void row_terms(const float* a1, const float* a2, int64_t count, float lambda, RowTerms& t);

// Softmax in place of r[lo..hi] (inclusive); every other entry of the row of n becomes 0. Returns max |r[lo..hi]|
// before the softmax (the statistics' max |logit|).
float softmax_row(float* r, int64_t n, int64_t lo, int64_t hi);

}  // namespace ds::cpu_attn
