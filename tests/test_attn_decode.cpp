// The decoding attention kernel (kernels/attn_decode.h) against a float64 CPU reference written here from the
// definitions (DiffLlama's head mapping, two softmaxes, O1/l1 - lambda O2/l2, RMS norm over 2d, out_scale; plain
// softmax attention; sliding window), on fresh random bf16 inputs: context lengths 1 to 128K (including lengths on
// and off the 64-key tile and the split chunk), GQA ratios 1, 2, 4 and 8, differential and plain heads, d = 64 and
// 128 (and other multiples of 8), windows, K/V from a separate buffer, 1 to 16 query rows, padded strides and
// offsets. Positions the launch must not read hold NaN (Q of other rows, K/V rows past n or left of every window,
// the row padding, the other buffer's columns), the workspace starts as NaN, and every output is poisoned with NaN
// first: it must come back fully written with its padding untouched. One launch's arguments replayed with growing
// lengths, directly and through a captured CUDA graph, as the engine's decoding step uses them. Skips cleanly
// without a CUDA device or build.
#include <gtest/gtest.h>

#ifndef DS_HAVE_CUDA
TEST(AttnDecode, NotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#else

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/cuda/detail/backend_cuda_memory.h"
#include "engine/core/dtype.h"
#include "kernels/attn_decode.h"
#include "test_cuda_util.h"

namespace {

using ds::cuda::DeviceBuffer;
using bf16 = __nv_bfloat16;
constexpr uint16_t kNaN = 0x7fc0;
constexpr int64_t kTail = 64;  // poisoned elements after the last output row

// Error bounds. Inputs are bf16 in both the kernel and the reference, so the differences come from the kernel's
// arithmetic: P is rounded to bf16 before P V (relative 2^-9 per term, random sign, so far less on the sum), f32
// accumulation and ex2.approx (relative ~1e-6), and the bf16 output (half an ulp: 2^-9 relative, 0.008 at |x| = 4,
// about the largest value a 2d-wide row of RMS <= out_scale <= 1 reaches here; plain outputs are averages of V, |x|
// <= 1.5). The differential combine O1/l1 - lambda O2/l2 can amplify the P rounding by up to 1/(1 - lambda) = 5 for
// lambda <= 0.8 where the two maps nearly agree (short contexts). Hence 3e-2 elementwise; over a whole launch the
// output rounding dominates (2^-9 / sqrt(3) ~ 1.1e-3 relative), bound 6e-3 (Frobenius, relative).
constexpr double kAbs = 3e-2, kRel = 6e-3;

// splitmix64: fast, reproducible random numbers for inputs of up to hundreds of MB.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(double(next() >> 40) * 0x1p-24); }
  uint16_t bf(float amp) { return ds::f32_to_bf16(uniform(-amp, amp)); }
};

double bfd(uint16_t h) { return double(ds::bf16_to_f32(h)); }

struct Shape {
  int H, Hkv, d;
  bool diff;
};

struct Opts {
  int q_rows = 1;
  int window = 0;
  bool separate_kv = false;
  int64_t lead = 0;     // elements before Q in each row (q_off)
  int64_t row_pad = 24; // elements after V in each row
  int64_t out_pad = 16; // elements after a row's outputs
  float q_amp = 1.5f;   // larger: peakier softmax rows (the running maximum moves more)
  int logit_bits = 0;   // > 0: the logits fake-quantised (AttnParams::logit_bits)
};

std::string name(const Shape& s, const Opts& o, int n) {
  return std::string(s.diff ? "diff" : "plain") + " H=" + std::to_string(s.H) + " Hkv=" + std::to_string(s.Hkv) +
         " d=" + std::to_string(s.d) + " n=" + std::to_string(n) + " q_rows=" + std::to_string(o.q_rows) +
         " window=" + std::to_string(o.window) + (o.separate_kv ? " kv-buffer" : "") +
         " q_amp=" + std::to_string(o.q_amp) + (o.logit_bits ? " bits=" + std::to_string(o.logit_bits) : "");
}

// One sequence of `rows` positions in the fused-QKV layout (attn_params.h). Q is random in rows [q_lo, rows), K and
// V in rows [kv_lo, kv_hi); everything else (other rows, row padding, and with a separate K/V buffer the K/V columns
// of qkv and the Q columns of kv) is NaN, so a kernel that reads it fails.
struct Problem {
  Shape s;
  Opts o;
  int rows;
  int64_t W, rs, k_off, v_off, out_w, ors;
  std::vector<uint16_t> qkv, kv;
  float lambda = 0, out_scale = 1, eps = 1e-5f;

  Problem(const Shape& shape, const Opts& opts, int rows_, uint64_t seed, int q_lo = 0, int kv_lo = 0, int kv_hi = -1)
      : s(shape), o(opts), rows(rows_) {
    if (kv_hi < 0) kv_hi = rows;
    W = o.lead + int64_t(s.H + 2 * s.Hkv) * s.d;
    rs = W + o.row_pad;
    k_off = o.lead + int64_t(s.H) * s.d;
    v_off = k_off + int64_t(s.Hkv) * s.d;
    out_w = int64_t(s.diff ? s.H / 2 : s.H) * (s.diff ? 2 * s.d : s.d);
    ors = out_w + o.out_pad;
    Rng rng(seed);
    lambda = s.diff ? rng.uniform(0.1f, 0.8f) : 0.f;
    out_scale = s.diff ? rng.uniform(0.3f, 1.f) : 1.f;
    qkv.assign(size_t(rows) * size_t(rs), kNaN);
    if (o.separate_kv) kv.assign(qkv.size(), kNaN);
    std::vector<uint16_t>& kvsrc = o.separate_kv ? kv : qkv;
    for (int t = std::max(q_lo, 0); t < rows; ++t)
      for (int64_t e = o.lead; e < k_off; ++e) qkv[size_t(t) * size_t(rs) + size_t(e)] = rng.bf(o.q_amp);
    for (int t = std::max(kv_lo, 0); t < std::min(kv_hi, rows); ++t)
      for (int64_t e = k_off; e < W; ++e) kvsrc[size_t(t) * size_t(rs) + size_t(e)] = rng.bf(1.5f);
  }

  int views() const { return s.diff ? s.H / 2 : s.H; }
  int vw() const { return s.diff ? 2 * s.d : s.d; }

  // The float64 attention output of the last q_rows positions of an n-token prefix: [q_rows][out_w].
  std::vector<double> reference(int n) const {
    const int R = o.q_rows, d = s.d, n_rep = s.H / s.Hkv, vw_ = vw();
    const std::vector<uint16_t>& kvsrc = o.separate_kv ? kv : qkv;
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<double> out(size_t(R) * size_t(out_w), 0.0), logit;
    std::vector<double> q = std::vector<double>(size_t(d)), res = std::vector<double>(size_t(vw_));
    for (int r = 0; r < R; ++r) {
      const int64_t pos = int64_t(n) - R + r;
      if (pos < 0) continue;  // written as zeros
      const int64_t first = o.window > 0 ? std::max<int64_t>(0, pos - o.window + 1) : 0;
      for (int j = 0; j < views(); ++j) {
        // DiffLlama: differential head j takes query heads j and j + H/2 against kv heads g and Hkv/2 + g
        // (g = j / n_rep) and V = [v_g ; v_{Hkv/2+g}]; plain head h takes kv head h / n_rep.
        int qh[2], kh[2];
        if (s.diff) {
          const int g = j / n_rep;
          qh[0] = j, qh[1] = j + s.H / 2, kh[0] = g, kh[1] = s.Hkv / 2 + g;
        } else {
          qh[0] = qh[1] = j, kh[0] = kh[1] = j / n_rep;
        }
        std::fill(res.begin(), res.end(), 0.0);
        for (int m = 0; m < (s.diff ? 2 : 1); ++m) {
          const uint16_t* qr = qkv.data() + size_t(pos) * size_t(rs) + size_t(o.lead + int64_t(qh[m]) * d);
          for (int e = 0; e < d; ++e) q[size_t(e)] = bfd(qr[e]);
          logit.assign(size_t(pos - first + 1), 0.0);
          double mx = -INFINITY, amax = 0;
          for (int64_t k = first; k <= pos; ++k) {
            const uint16_t* kr = kvsrc.data() + size_t(k) * size_t(rs) + size_t(k_off + int64_t(kh[m]) * d);
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += q[size_t(e)] * bfd(kr[e]);
            logit[size_t(k - first)] = dot * scale;
            mx = std::max(mx, dot * scale);
            amax = std::max(amax, std::fabs(dot * scale));
          }
          if (o.logit_bits > 0 && amax > 0) {  // the published what-if: step = amax / (2^(b-1) - 1), half to even
            const double step = amax / double((1 << (o.logit_bits - 1)) - 1);
            mx = -INFINITY;
            for (double& x : logit) mx = std::max(mx, x = std::nearbyint(x / step) * step);
          }
          double l = 0;
          for (double& x : logit) l += (x = std::exp(x - mx));
          const double w = m == 0 ? 1.0 : -double(lambda);
          for (int64_t k = first; k <= pos; ++k) {
            const double pk = w * logit[size_t(k - first)] / l;
            for (int e = 0; e < vw_; ++e) {
              const int head = e < d ? kh[0] : kh[1];
              res[size_t(e)] +=
                  pk * bfd(kvsrc[size_t(k) * size_t(rs) + size_t(v_off + int64_t(head) * d + e % d)]);
            }
          }
        }
        if (s.diff) {
          double ss = 0;
          for (double x : res) ss += x * x;
          const double f = double(out_scale) / std::sqrt(ss / vw_ + double(eps));
          for (double& x : res) x *= f;
        }
        std::copy(res.begin(), res.end(), out.begin() + int64_t(r) * out_w + int64_t(j) * vw_);
      }
    }
    return out;
  }
};

// The device side of a problem: inputs, the poisoned output, the length, a workspace for max_len.
struct Device {
  DeviceBuffer qkv, kv, out, len, ws;
  ds::kern::AttnParams p;
  size_t out_elems = 0;
  int max_len = 0;

  Device(const Problem& pr, int max_len_) : max_len(max_len_) {
    qkv = to_device(pr.qkv);
    if (pr.o.separate_kv) kv = to_device(pr.kv);
    out_elems = size_t(pr.o.q_rows) * size_t(pr.ors) + size_t(kTail);
    out = DeviceBuffer(out_elems * 2, "test output");
    len = DeviceBuffer(4, "test length");
    p.qkv = qkv.as<bf16>();
    p.kv = pr.o.separate_kv ? kv.as<bf16>() : nullptr;
    p.row_stride = pr.rs;
    p.batch_stride = int64_t(pr.rows) * pr.rs;
    p.q_off = pr.o.lead;
    p.k_off = pr.k_off;
    p.v_off = pr.v_off;
    p.n = -7;  // not read
    p.batch = 1;
    p.heads = pr.s.H;
    p.kv_heads = pr.s.Hkv;
    p.d = pr.s.d;
    p.diff = pr.s.diff;
    p.scale = float(1.0 / std::sqrt(double(pr.s.d)));
    p.lambda = pr.lambda;
    p.out_scale = pr.out_scale;
    p.eps = pr.eps;
    p.out = out.as<bf16>();
    p.out_row_stride = pr.ors;
    p.out_batch_stride = 0;
    p.window = pr.o.window;
    p.logit_bits = pr.o.logit_bits;
    const size_t ws_bytes = ds::kern::attn_decode_workspace(p, pr.o.q_rows, max_len);
    EXPECT_GT(ws_bytes, 0u);
    ws = DeviceBuffer(std::max<size_t>(ws_bytes, 16), "test workspace");
    DS_CUDA_CHECK(cudaMemset(ws.get(), 0xff, ws.bytes()));  // NaN: the kernel must not depend on its contents
  }
  void poison(cudaStream_t s = nullptr) {
    const std::vector<uint16_t> nan(out_elems, kNaN);
    DS_CUDA_CHECK(cudaMemcpyAsync(out.get(), nan.data(), out_elems * 2, cudaMemcpyHostToDevice, s));
    DS_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void set_len(int n, cudaStream_t s = nullptr) {
    DS_CUDA_CHECK(cudaMemcpyAsync(len.get(), &n, 4, cudaMemcpyHostToDevice, s));
    DS_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  cudaError_t launch(int q_rows, cudaStream_t s = nullptr) {
    return ds::kern::launch_attn_decode(p, len.as<int32_t>(), q_rows, max_len, ws.get(), s);
  }
  std::vector<uint16_t> result() const {
    std::vector<uint16_t> v(out_elems);
    DS_CUDA_CHECK(cudaMemcpy(v.data(), out.get(), out_elems * 2, cudaMemcpyDeviceToHost));
    return v;
  }
};

struct Check {
  double rel = 0, max_abs = 0;
  size_t unwritten = 0, padding_touched = 0;
};

Check compare(const Problem& pr, const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  Check c;
  double num = 0, den = 0;
  for (int r = 0; r < pr.o.q_rows; ++r)
    for (int64_t e = 0; e < pr.ors; ++e) {
      const uint16_t g = got[size_t(r) * size_t(pr.ors) + size_t(e)];
      if (e >= pr.out_w) {
        c.padding_touched += g != kNaN;
        continue;
      }
      const double v = bfd(g), want = ref[size_t(r) * size_t(pr.out_w) + size_t(e)];
      if (!std::isfinite(v)) {
        ++c.unwritten;
        continue;
      }
      num += (v - want) * (v - want);
      den += want * want;
      c.max_abs = std::max(c.max_abs, std::fabs(v - want));
    }
  for (size_t i = size_t(pr.o.q_rows) * size_t(pr.ors); i < got.size(); ++i) c.padding_touched += got[i] != kNaN;
  c.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

// The worst errors a test saw, printed at its end (the measured margins under the bounds).
struct Worst {
  double rel = 0, max_abs = 0;
  int runs = 0;
  void add(const Check& c) { rel = std::max(rel, c.rel), max_abs = std::max(max_abs, c.max_abs), ++runs; }
  void print(const char* what) const {
    std::printf("[decode] %s: %d runs, worst relative error %.2e (bound %.0e), worst abs error %.2e (bound %.0e)\n",
                what, runs, rel, kRel, max_abs, kAbs);
  }
};

void expect_ok(const Check& c, const std::string& what) {
  EXPECT_EQ(c.unwritten, 0u) << what;
  EXPECT_EQ(c.padding_touched, 0u) << what;
  EXPECT_LT(c.rel, kRel) << what;
  EXPECT_LT(c.max_abs, kAbs) << what;
}

// Launches once on the problem's buffers at length n (workspace sized for max_len) and checks the output.
Check run_check(Device& dv, const Problem& pr, int n, const std::string& what) {
  dv.poison();
  dv.set_len(n);
  EXPECT_EQ(dv.launch(pr.o.q_rows), cudaSuccess) << what;
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  const Check c = compare(pr, dv.result(), pr.reference(n));
  expect_ok(c, what);
  return c;
}

// A fresh problem of exactly the rows the launch may read ([0, n + extra), rows past n NaN), one launch.
Check run_one(const Shape& s, const Opts& o, int n, uint64_t seed, int max_len = 0, int extra = 37) {
  const int rows = n + extra;
  // Keys left of the first query row's window and past n are NaN: the kernel must not load them.
  const int kv_lo = o.window > 0 ? std::max(0, n - o.q_rows - o.window + 1) : 0;
  const Problem pr(s, o, rows, seed, std::max(0, n - o.q_rows), kv_lo, n);
  Device dv(pr, max_len > 0 ? max_len : n);
  return run_check(dv, pr, n, name(s, o, n) + " max_len=" + std::to_string(dv.max_len));
}

}  // namespace

// Differential and plain heads, d = 64 and 128, GQA ratios 1, 2, 4 and 8, context lengths around the 64-key tile and
// longer ones, one query row; max_len past n (rows past n are NaN).
TEST(AttnDecode, ShapesAgainstFloat64) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<int> ns =
      small_run() ? std::vector<int>{1, 65, 1000} : std::vector<int>{1, 2, 63, 64, 65, 1000, 4097};
  const std::vector<int> reps = small_run() ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8};
  Worst worst;
  uint64_t seed = 1;
  for (bool diff : {true, false})
    for (int d : {64, 128})
      for (int rep : reps)
        for (int n : ns) {
          // Differential: Hkv = 4 (two kv heads per map); plain: Hkv = 2.
          const Shape s = diff ? Shape{4 * rep, 4, d, true} : Shape{2 * rep, 2, d, false};
          worst.add(run_one(s, Opts{}, n, seed++, n + 100));
        }
  worst.print("shapes");
}

// Quantised logits (8 and 4 bits): the row-maximum launch, then the split kernel quantising against it, against the
// float64 attention of the quantised logits; differential and plain heads, d 64 and 128, lengths around the key
// tile and past several splits, a sliding window and several query rows.
TEST(AttnDecode, QuantisedLogitsAgainstFloat64) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<int> ns = small_run() ? std::vector<int>{1, 65, 1000} : std::vector<int>{1, 2, 64, 65, 1000, 4097};
  Worst worst;
  uint64_t seed = 900;
  for (int bits : {8, 4})
    for (bool diff : {true, false})
      for (int d : {64, 128})
        for (int n : ns) {
          const Shape s = diff ? Shape{8, 4, d, true} : Shape{4, 2, d, false};
          Opts o;
          o.logit_bits = bits;
          worst.add(run_one(s, o, n, seed++, n + 100));
          if (n >= 65) {
            o.window = 50, o.q_rows = 3;
            worst.add(run_one(s, o, n, seed++, n + 100));
          }
        }
  worst.print("quantised logits");
}

// Lengths on and off the split chunk and the key tile: the chunk is ceil(n / splits) keys (attn_decode.cu), for
// the split count the plan gives max_len on this device, so chunks start inside 64-key tiles.
TEST(AttnDecode, SplitChunkBoundaries) {
  SKIP_WITHOUT_DEVICE();
  const Shape s{8, 2, 64, true};
  const int max_len = small_run() ? 3000 : 20000;
  const Problem probe(s, Opts{}, 1, 0);
  Device dv(probe, max_len);
  ds::kern::AttnDecodePlan plan;
  ASSERT_TRUE(ds::kern::attn_decode_plan(dv.p, 1, max_len, &plan));
  ASSERT_GE(plan.splits, 1);
  const int S = plan.splits;
  auto chunk = [&](int n) { return (n + S - 1) / S; };
  std::vector<int> ns = {max_len, max_len - 1, 64 * S, 64 * S + 1, 64 * S - 1, 128 * S + 5, max_len / 3};
  bool off_chunk = false;
  bool off_tile = false;
  for (int n : ns) off_chunk |= n % chunk(n) != 0, off_tile |= chunk(n) % 64 != 0;
  EXPECT_TRUE(off_chunk) << "no length off the split chunk with " << S << " splits";
  EXPECT_TRUE(off_tile) << "no chunk off the 64-key tile with " << S << " splits";
  Worst worst;
  uint64_t seed = 100;
  for (int n : ns) {
    if (n < 1 || n > max_len) continue;
    for (bool diff : {true, false}) {
      const Shape sh = diff ? s : Shape{4, 2, 64, false};
      worst.add(run_one(sh, Opts{}, n, seed++, max_len));
    }
  }
  std::printf("[decode] %d splits for max_len %d (%d CTAs, %d keys per tile)\n", S, max_len, plan.ctas,
              plan.keys_per_tile);
  worst.print("split chunk boundaries");
}

// Sliding window 512 (also shorter and longer contexts than it), 1 and 3 query rows; the K/V rows left of every
// query row's window are NaN. Peaky rows (Q amplitude 6) move the running maximum across tiles and splits.
TEST(AttnDecode, SlidingWindow) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<int> ns =
      small_run() ? std::vector<int>{100, 700} : std::vector<int>{1, 3, 100, 512, 513, 514, 1000, 4097, 9000};
  Worst worst;
  uint64_t seed = 200;
  for (bool diff : {true, false})
    for (int q_rows : {1, 3})
      for (int n : ns) {
        Opts o;
        o.window = 512;
        o.q_rows = q_rows;
        o.q_amp = (n % 2) ? 6.f : 1.5f;
        const Shape s = diff ? Shape{8, 4, 64, true} : Shape{8, 4, 128, false};
        worst.add(run_one(s, o, n, seed++, 9000));
      }
  // A window wider than any context, and a window of 1 key.
  for (int window : {1, 100000}) {
    Opts o;
    o.window = window;
    o.q_rows = 2;
    worst.add(run_one(Shape{8, 2, 64, true}, o, 777, seed++));
  }
  worst.print("sliding window");
}

// K and V from p.kv (cross-layer KV reuse): the K/V columns of qkv and the Q columns of kv are NaN.
TEST(AttnDecode, SeparateKvBuffer) {
  SKIP_WITHOUT_DEVICE();
  Worst worst;
  uint64_t seed = 300;
  for (bool diff : {true, false})
    for (int n : small_run() ? std::vector<int>{65} : std::vector<int>{65, 1000, 5000})
      for (int q_rows : {1, 3})
        for (int window : {0, 512}) {
          Opts o;
          o.separate_kv = true;
          o.q_rows = q_rows;
          o.window = window;
          const Shape s = diff ? Shape{8, 2, 64, true} : Shape{6, 2, 64, false};
          worst.add(run_one(s, o, n, seed++));
        }
  worst.print("separate kv buffer");
}

// 1 to 16 query rows (the rows of a group then span several M tiles and row chunks), a lead offset before Q in each
// row, wider padding; and fewer positions than query rows (rows at negative positions are zeros).
TEST(AttnDecode, QueryRows) {
  SKIP_WITHOUT_DEVICE();
  Worst worst;
  uint64_t seed = 400;
  for (bool diff : {true, false})
    for (int q_rows : {1, 2, 3, 5, 16})
      for (int n : small_run() ? std::vector<int>{300} : std::vector<int>{16, 300, 2100}) {
        Opts o;
        o.q_rows = q_rows;
        o.lead = 8;
        o.row_pad = 40;
        o.out_pad = 3;
        const Shape s = diff ? Shape{16, 4, 64, true} : Shape{16, 2, 64, false};  // 4 and 8 query heads per kv head
        worst.add(run_one(s, o, n, seed++));
      }
  for (int n : {1, 2}) {
    Opts o;
    o.q_rows = 3;
    worst.add(run_one(Shape{4, 2, 64, true}, o, n, seed++, 50));
  }
  worst.print("query rows");
}

// Head dims other than 64 and 128: multiples of 8 (zero-padded to 64 or 128 inside), and 256 for plain heads.
TEST(AttnDecode, OtherHeadDims) {
  SKIP_WITHOUT_DEVICE();
  Worst worst;
  uint64_t seed = 500;
  for (int d : {8, 40, 96, 120})
    for (bool diff : {true, false}) {
      Opts o;
      o.q_rows = 2;
      worst.add(run_one(diff ? Shape{4, 2, d, true} : Shape{4, 1, d, false}, o, 300, seed++));
    }
  for (int d : {136, 256}) worst.add(run_one(Shape{4, 2, d, false}, Opts{}, 300, seed++));
  worst.print("other head dims");
}

// The kajuma/DiffLlama-0.3B-handcut attention shape (32 query heads, 8 kv heads, d = 64, differential) at 32K
// tokens, and its plain twin.
TEST(AttnDecode, Long32K) {
  SKIP_WITHOUT_DEVICE();
  if (small_run()) GTEST_SKIP() << "DS_CUDA_TEST_SMALL: 32K contexts left out";
  Worst worst;
  worst.add(run_one(Shape{32, 8, 64, true}, Opts{}, 32768, 600, 32768, 0));
  Opts o;
  o.q_rows = 3;
  worst.add(run_one(Shape{32, 8, 64, false}, o, 32768, 601, 40000, 0));
  worst.print("32K");
}

TEST(AttnDecode, Long128K) {
  SKIP_WITHOUT_DEVICE();
  if (small_run()) GTEST_SKIP() << "DS_CUDA_TEST_SMALL: 128K contexts left out";
  Worst worst;
  worst.add(run_one(Shape{4, 2, 64, true}, Opts{}, 131072, 700, 131072, 0));
  worst.add(run_one(Shape{4, 1, 64, false}, Opts{}, 131072, 701, 131072, 0));
  worst.print("128K");
}

// One set of launch arguments (max_len fixed, the same workspace and output) replayed with other lengths in the
// device int, as the engine's decoding step does: growing, shrinking, on and off tile and chunk boundaries.
TEST(AttnDecode, ReplayWithChangingLength) {
  SKIP_WITHOUT_DEVICE();
  const int max_len = small_run() ? 1500 : 6000;
  const std::vector<int> ns = small_run() ? std::vector<int>{1, 65, 1500, 700}
                                          : std::vector<int>{1, 2, 64, 65, 700, 4097, 6000, 5999, 3, 1000};
  Worst worst;
  uint64_t seed = 800;
  for (bool diff : {true, false})
    for (int window : {0, 512}) {
      Opts o;
      o.window = window;
      o.q_rows = diff ? 1 : 2;
      o.q_amp = 4.f;
      const Problem pr(diff ? Shape{32, 8, 64, true} : Shape{8, 2, 128, false}, o, max_len, seed++);
      Device dv(pr, max_len);
      for (int n : ns) worst.add(run_check(dv, pr, n, "replay " + name(pr.s, o, n)));
    }
  worst.print("replay");
}

// The launch captured once in a CUDA graph (two layers sharing the workspace and the length, as in the engine's
// step), replayed for several lengths with only the device int changed in between.
TEST(AttnDecode, CudaGraphReplay) {
  SKIP_WITHOUT_DEVICE();
  const int max_len = small_run() ? 1200 : 8192;
  const std::vector<int> ns = small_run() ? std::vector<int>{1, 200, 1200, 65}
                                          : std::vector<int>{1, 64, 65, 1000, 4097, 8192, 2, 6000};
  Opts o;
  o.q_rows = 1;
  const Shape s{32, 8, 64, true};
  const Problem a(s, o, max_len, 900), b(s, o, max_len, 901);
  Device da(a, max_len), db(b, max_len);
  db.ws = DeviceBuffer();  // layer b uses layer a's workspace and length
  cudaStream_t st = nullptr;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DS_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  const cudaError_t ea = da.launch(1, st);
  const cudaError_t eb =
      ds::kern::launch_attn_decode(db.p, da.len.as<int32_t>(), 1, max_len, da.ws.get(), st);
  DS_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  EXPECT_EQ(ea, cudaSuccess);
  EXPECT_EQ(eb, cudaSuccess);
  DS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  Worst worst;
  for (int n : ns) {
    da.poison(st);
    db.poison(st);
    da.set_len(n, st);
    DS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    DS_CUDA_CHECK(cudaStreamSynchronize(st));
    const Check ca = compare(a, da.result(), a.reference(n)), cb = compare(b, db.result(), b.reference(n));
    expect_ok(ca, "graph layer a " + name(s, o, n));
    expect_ok(cb, "graph layer b " + name(s, o, n));
    worst.add(ca), worst.add(cb);
  }
  // The same graph replayed many times in a row (two layers on one workspace each time): nothing the workspace
  // keeps between launches may change the result.
  for (int n : {max_len, max_len / 3 + 1}) {
    da.set_len(n, st);
    for (int rep = 0; rep < 50; ++rep) DS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    da.poison(st);
    db.poison(st);
    DS_CUDA_CHECK(cudaGraphLaunch(exec, st));
    DS_CUDA_CHECK(cudaStreamSynchronize(st));
    const Check ca = compare(a, da.result(), a.reference(n)), cb = compare(b, db.result(), b.reference(n));
    expect_ok(ca, "graph x50 layer a " + name(s, o, n));
    expect_ok(cb, "graph x50 layer b " + name(s, o, n));
    worst.add(ca), worst.add(cb);
  }
  DS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DS_CUDA_CHECK(cudaGraphDestroy(graph));
  DS_CUDA_CHECK(cudaStreamDestroy(st));
  worst.print("CUDA graph replay");
}

// Shapes and arguments the kernels do not take: cudaErrorInvalidValue, a zero workspace size, nothing launched.
TEST(AttnDecode, RejectsUnsupported) {
  SKIP_WITHOUT_DEVICE();
  const Problem pr(Shape{8, 2, 64, true}, Opts{}, 8, 1000);
  Device dv(pr, 8);
  dv.poison();
  dv.set_len(8);
  struct Bad {
    const char* what;
    void (*edit)(ds::kern::AttnParams&, int&);
  };
  const Bad bad[] = {
      {"diff d=136", [](ds::kern::AttnParams& p, int&) { p.d = 136; }},
      {"plain d=264", [](ds::kern::AttnParams& p, int&) { p.diff = false, p.d = 264; }},
      {"d=12", [](ds::kern::AttnParams& p, int&) { p.d = 12; }},
      {"d=0", [](ds::kern::AttnParams& p, int&) { p.d = 0; }},
      {"q_rows=0", [](ds::kern::AttnParams&, int& q) { q = 0; }},
      {"q_rows=17", [](ds::kern::AttnParams&, int& q) { q = 17; }},
      {"H % Hkv != 0", [](ds::kern::AttnParams& p, int&) { p.heads = 6, p.kv_heads = 4; }},
      {"diff with odd H", [](ds::kern::AttnParams& p, int&) { p.heads = 7, p.kv_heads = 7; }},
      {"kv_heads=0", [](ds::kern::AttnParams& p, int&) { p.kv_heads = 0; }},
      {"row stride not a multiple of 8", [](ds::kern::AttnParams& p, int&) { p.row_stride += 2; }},
      {"k_off not a multiple of 8", [](ds::kern::AttnParams& p, int&) { p.k_off += 4; }},
      {"qkv not 16-byte aligned", [](ds::kern::AttnParams& p, int&) { p.qkv += 1; }},
      {"kv not 16-byte aligned", [](ds::kern::AttnParams& p, int&) { p.kv = p.qkv + 3; }},
      {"null out", [](ds::kern::AttnParams& p, int&) { p.out = nullptr; }},
      {"negative window", [](ds::kern::AttnParams& p, int&) { p.window = -1; }},
  };
  for (const Bad& b : bad) {
    ds::kern::AttnParams p = dv.p;
    int q_rows = 1;
    b.edit(p, q_rows);
    EXPECT_EQ(ds::kern::attn_decode_workspace(p, q_rows, 8), 0u) << b.what;
    EXPECT_EQ(ds::kern::launch_attn_decode(p, dv.len.as<int32_t>(), q_rows, 8, dv.ws.get(), nullptr),
              cudaErrorInvalidValue)
        << b.what;
  }
  EXPECT_EQ(ds::kern::launch_attn_decode(dv.p, nullptr, 1, 8, dv.ws.get(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ds::kern::launch_attn_decode(dv.p, dv.len.as<int32_t>(), 1, 8, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ds::kern::launch_attn_decode(dv.p, dv.len.as<int32_t>(), 1, 0, dv.ws.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = dv.result();
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint16_t v) { return v == kNaN; })) << "an output was written";
  // The same buffers with the arguments intact still work.
  run_check(dv, pr, 8, "after rejected launches");
}

#endif  // DS_HAVE_CUDA
