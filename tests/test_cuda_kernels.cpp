// CUDA kernels against float64 CPU references on fresh random inputs: every attention implementation the dispatcher
// (kernels/attn_dispatch.h) can choose on this device, each chosen through the API (many n including 1 and
// non-multiples of the 64-row tile, d = 64 and 128, differential and plain, MHA and GQA, batches, padded strides),
// the dispatch rules themselves on described devices (no GPU needed), the map kernels with their statistics,
// RMSNorm, LayerNorm, RoPE (default and llama3 frequencies), SwiGLU, PolyNorm, the embedding gather and Mamba-1's
// convolution and selective scan. Every attention kernel also with a sliding window and K/V from a separate buffer
// (AttnParams::window, ::kv; Phi-4-mini-flash). Every output is poisoned with NaN before the run and must
// come back fully written, with the padding around it untouched. Skips cleanly without a CUDA device or build.
#include <gtest/gtest.h>

#ifndef DS_HAVE_CUDA
TEST(CudaKernels, NotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#else

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/detail/backend_cuda_memory.h"
#include "test_cuda_util.h"
#include "engine/core/config.h"
#include "engine/core/dtype.h"
#include "engine/core/rope.h"
#include "kernels/attn_dispatch.h"
#include "map_reference.h"
#include "kernels/attn_maps.h"
#include "kernels/diff_attn_fwd.h"
#include "kernels/embedding.h"
#include "kernels/gemm_swiglu_sm90.h"
#include "kernels/layernorm.h"
#include "kernels/mamba_scan.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/polynorm.h"
#include "kernels/elementwise.h"
#include "kernels/swiglu.h"

namespace {

using ds::cuda::DeviceBuffer;
using bf16 = __nv_bfloat16;
constexpr uint16_t kBf16NaN = 0x7fc0;

float bf(uint16_t h) { return ds::bf16_to_f32(h); }

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float amp) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = ds::f32_to_bf16(u(rng));
  return v;
}


struct AttnCase {
  int n, batch, heads, kv_heads, d;
  bool diff;
};

std::string case_name(const AttnCase& c) {
  return "n=" + std::to_string(c.n) + " batch=" + std::to_string(c.batch) + " H=" + std::to_string(c.heads) +
         " Hkv=" + std::to_string(c.kv_heads) + " d=" + std::to_string(c.d) + (c.diff ? " diff" : " plain");
}

// Options of an attention problem beyond its shape: a sliding window (0: none), K and V from a separate buffer
// (cross-layer KV reuse: the K/V columns of qkv and the Q columns of the kv buffer are then NaN, so that a kernel
// reading the wrong buffer fails), and NaN in the K/V rows [0, poison_rows) of the buffer K and V come from (rows
// whose windows leave them out must not see them: the kernels must skip those key tiles, not mask them).
struct AttnOpts {
  int window = 0;
  bool separate_kv = false;
  int poison_rows = 0;
  int logit_bits = 0;  // quantised logits (AttnParams::logit_bits)
  // a large negative logit in every row from key 2 on (Q's channel 0 at 8, key 2's at -200: q.k about -1600), so that
  // a row's largest |logit| lies far above its largest logit (the quantised Hopper pass's exact fallback)
  bool negative_outlier = false;
};

std::string opts_name(const AttnOpts& o) {
  return " window=" + std::to_string(o.window) + (o.separate_kv ? " kv-buffer" : "") +
         (o.logit_bits ? " bits=" + std::to_string(o.logit_bits) : "") +
         (o.poison_rows ? " poisoned-rows=" + std::to_string(o.poison_rows) : "") +
         (o.negative_outlier ? " negative-outlier" : "");
}

// Random Q/K/V in the fused-QKV layout with padded rows, the params for it, and the float64 reference output
// (tests/map_reference.h's ref_attention_row).
struct AttnProblem {
  AttnCase c;
  AttnOpts o;
  int64_t W, row_stride, out_w, out_row_stride;
  std::vector<uint16_t> qkv;   // [batch][n][row_stride]
  std::vector<uint16_t> kvb;   // the same layout: K and V when o.separate_kv
  std::vector<double> ref;     // [batch][n][out_w]
  std::vector<double> qkv_d, kv_d;  // qkv and kvb as float64
  float lambda, out_scale, eps = 1e-5f;

  AttnProblem(const AttnCase& cs, std::mt19937& rng, const AttnOpts& opts = {}) : c(cs), o(opts) {
    W = int64_t(c.heads + 2 * c.kv_heads) * c.d;
    row_stride = W + 24;  // padding: the kernels must honour the stride
    out_w = int64_t(c.heads) * c.d;
    out_row_stride = out_w + 16;
    qkv = random_bf16(size_t(c.batch) * c.n * row_stride, rng, 1.5f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    lambda = c.diff ? 0.1f + 0.8f * u(rng) : 0.f;
    out_scale = c.diff ? 0.3f + 0.7f * u(rng) : 1.f;
    const int64_t k_off = int64_t(c.heads) * c.d;
    if (o.separate_kv) {
      kvb = random_bf16(qkv.size(), rng, 1.5f);
      for (size_t r = 0; r < size_t(c.batch) * c.n; ++r) {
        std::fill(kvb.begin() + int64_t(r) * row_stride, kvb.begin() + int64_t(r) * row_stride + k_off, kBf16NaN);  // Q
        std::fill(qkv.begin() + int64_t(r) * row_stride + k_off, qkv.begin() + int64_t(r) * row_stride + W, kBf16NaN);
      }
    }
    std::vector<uint16_t>& src = o.separate_kv ? kvb : qkv;
    for (int b = 0; b < c.batch; ++b)
      for (int t = 0; t < std::min(o.poison_rows, c.n); ++t)
        for (int64_t e = k_off; e < W; ++e) src[(size_t(b) * c.n + t) * row_stride + e] = kBf16NaN;
    if (o.negative_outlier && !o.separate_kv)
      for (int b = 0; b < c.batch; ++b)
        for (int t = 0; t < c.n; ++t) {
          uint16_t* row = &qkv[(size_t(b) * c.n + t) * row_stride];
          for (int h = 0; h < c.heads; ++h) row[int64_t(h) * c.d] = ds::f32_to_bf16(8.f);
          if (t == 2)
            for (int g = 0; g < c.kv_heads; ++g) row[k_off + int64_t(g) * c.d] = ds::f32_to_bf16(-200.f);
        }
    reference();
  }
  double at(int b, int t, int64_t col) const { return bf(qkv[(size_t(b) * c.n + t) * row_stride + col]); }
  dstest::RefAttnInputs ref_inputs() const {
    dstest::RefAttnInputs in;
    in.qkv = qkv_d.data();
    in.kv = o.separate_kv ? kv_d.data() : nullptr;
    in.row_stride = row_stride;
    in.batch_stride = int64_t(c.n) * row_stride;
    in.q_off = 0;
    in.k_off = int64_t(c.heads) * c.d;
    in.v_off = int64_t(c.heads + c.kv_heads) * c.d;
    in.n = c.n, in.heads = c.heads, in.kv_heads = c.kv_heads, in.d = c.d, in.diff = c.diff, in.window = o.window;
    in.logit_bits = o.logit_bits;
    return in;
  }
  void reference() {
    qkv_d.resize(qkv.size());
    for (size_t i = 0; i < qkv.size(); ++i) qkv_d[i] = bf(qkv[i]);
    kv_d.resize(kvb.size());
    for (size_t i = 0; i < kvb.size(); ++i) kv_d[i] = bf(kvb[i]);
    const dstest::RefAttnInputs in = ref_inputs();
    const int hv = c.diff ? c.heads / 2 : c.heads, vw = c.diff ? 2 * c.d : c.d;
    ref.assign(size_t(c.batch) * c.n * out_w, 0.0);
    std::vector<double> row;
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < hv; ++h)
        for (int i = 0; i < c.n; ++i) {
          dstest::ref_attention_row(in, b, h, i, lambda, out_scale, eps, row);
          std::copy(row.begin(), row.end(), ref.begin() + int64_t((size_t(b) * c.n + i) * out_w) + int64_t(h) * vw);
        }
  }
  // kv: the device copy of kvb (required when o.separate_kv).
  ds::kern::AttnParams params(const DeviceBuffer& in, const DeviceBuffer& out, const DeviceBuffer* kv = nullptr) const {
    if (o.separate_kv && !kv) ADD_FAILURE() << "a problem with a separate K/V buffer needs it on the device";
    ds::kern::AttnParams p;
    p.qkv = in.as<bf16>();
    p.kv = o.separate_kv && kv ? kv->as<bf16>() : nullptr;
    p.window = o.window;
    p.logit_bits = o.logit_bits;
    p.row_stride = row_stride;
    p.batch_stride = int64_t(c.n) * row_stride;
    p.q_off = 0;
    p.k_off = int64_t(c.heads) * c.d;
    p.v_off = int64_t(c.heads + c.kv_heads) * c.d;
    p.n = c.n;
    p.batch = c.batch;
    p.heads = c.heads;
    p.kv_heads = c.kv_heads;
    p.d = c.d;
    p.diff = c.diff;
    p.scale = float(1.0 / std::sqrt(double(c.d)));
    p.lambda = lambda;
    p.out_scale = out_scale;
    p.eps = eps;
    p.out = out.as<bf16>();
    p.out_row_stride = out_row_stride;
    p.out_batch_stride = int64_t(c.n) * out_row_stride;
    return p;
  }
};

struct AttnCheck {
  double rel = 0, max_abs = 0;
  size_t unwritten = 0, padding_touched = 0;
};

using ds::kern::AttnImpl;

const ds::kern::AttnDevice& this_device() {
  static const ds::kern::AttnDevice dev = [] {
    int d = 0;
    DS_CUDA_CHECK(cudaGetDevice(&d));
    return ds::kern::query_attn_device(d);
  }();
  return dev;
}

// Whether `impl` (forced) can run case c on this device (the problems below are 16-byte aligned).
bool granted(AttnImpl impl, const AttnCase& c, int block_n = 0) {
  ds::kern::AttnShape s;
  s.d = c.d;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.diff = c.diff;
  s.n = c.n;
  s.batch = c.batch;
  return ds::kern::select_attn(this_device(), s, {impl, block_n}).impl == impl;
}

// The choice for p with `impl` forced (Auto: the default); impl None when the device cannot run it.
ds::kern::AttnChoice choose(const ds::kern::AttnParams& p, AttnImpl impl, int block_n = 0,
                            ds::kern::CtaOrder order = ds::kern::CtaOrder::Auto, bool quant_row_kernel = true) {
  ds::kern::AttnOptions o{impl, block_n, order};
  o.quant_row_kernel = quant_row_kernel;
  return ds::kern::select_attn(this_device(), ds::kern::attn_shape(p), o);
}

// Runs `impl` (forced) on the problem and compares with the reference; rows below first_row are not compared (they may
// legitimately read poisoned keys).
AttnCheck run_attention(const AttnProblem& pr, AttnImpl impl, int block_n = 0,
                        ds::kern::CtaOrder order = ds::kern::CtaOrder::Auto, int first_row = 0,
                        bool quant_row_kernel = true) {
  DeviceBuffer in = to_device(pr.qkv);
  DeviceBuffer kv = to_device(pr.o.separate_kv ? pr.kvb : std::vector<uint16_t>(8, 0));
  const size_t out_elems = size_t(pr.c.batch) * pr.c.n * pr.out_row_stride;
  DeviceBuffer out(out_elems * 2, "test output");
  std::vector<uint16_t> poison(out_elems, kBf16NaN);
  DS_CUDA_CHECK(cudaMemcpy(out.get(), poison.data(), out_elems * 2, cudaMemcpyHostToDevice));
  DeviceBuffer head_ns(size_t(pr.c.heads) * 8, "test counters");
  DS_CUDA_CHECK(cudaMemset(head_ns.get(), 0, head_ns.bytes()));
  ds::kern::AttnParams p = pr.params(in, out, &kv);
  p.head_ns = head_ns.as<unsigned long long>();
  const ds::kern::AttnChoice choice = choose(p, impl, block_n, order, quant_row_kernel);
  EXPECT_EQ(choice.impl, impl) << choice.why;
  DS_CUDA_CHECK(ds::kern::launch_attn(choice, p, nullptr));
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = to_host<uint16_t>(out, out_elems);
  AttnCheck r;
  double num = 0, den = 0;
  for (int b = 0; b < pr.c.batch; ++b)
    for (int t = first_row; t < pr.c.n; ++t)
      for (int64_t e = 0; e < pr.out_row_stride; ++e) {
        const uint16_t g = got[(size_t(b) * pr.c.n + t) * pr.out_row_stride + e];
        if (e >= pr.out_w) {
          r.padding_touched += g != kBf16NaN;
          continue;
        }
        const double v = bf(g), ref = pr.ref[(size_t(b) * pr.c.n + t) * pr.out_w + e];
        if (!std::isfinite(v)) {
          r.unwritten++;
          continue;
        }
        num += (v - ref) * (v - ref);
        den += ref * ref;
        r.max_abs = std::max(r.max_abs, std::fabs(v - ref));
      }
  r.rel = std::sqrt(num / std::max(den, 1e-30));
  return r;
}

std::vector<AttnCase> fused_cases() {
  std::vector<AttnCase> v;
  const std::vector<int> ns = small_run() ? std::vector<int>{1, 65, 130} : std::vector<int>{1, 2, 17, 63, 64, 65, 127, 128, 200, 333, 515};
  for (bool diff : {true, false})
    for (int d : {64, 128})
      for (int n : ns) {
        v.push_back({n, 1, 4, 2, d, diff});                                // GQA n_rep 2 (the DiffLlama shape)
        if (n % 3 == 2 || n == 1) v.push_back({n, 2, 8, 2, d, diff});      // n_rep 4, batch 2
        if (n % 2 == 1) v.push_back({n, 1, 4, 4, d, diff});                // MHA
        if (!diff && n % 5 == 0) v.push_back({n, 1, 6, 2, d, diff});       // n_rep 3: a pair of heads spans groups
      }
  return v;
}

// Error bound for the fused kernel. Inputs are bf16 in both (no input error); the kernel rounds P to bf16 before
// P.V (relative 2^-9 per element, random sign), accumulates in f32, uses exp2 approximations (2 ulp), and rounds
// the output to bf16 (2^-9 relative). Together ~3e-3 relative (measured far below); the cancellation in
// O1/l1 - lambda O2/l2 can amplify it by up to 1/(1 - lambda) <= 10 for lambda <= 0.9 only in rare rows, so the
// Frobenius bound is 1e-2 and the elementwise bound (outputs are O(1) after the RMS norm) 6e-2.
constexpr double kFusedRel = 1e-2, kFusedAbs = 6e-2;
// The generic kernel is f32 throughout; only the bf16 output rounding (2^-9 relative) remains.
constexpr double kGenericRel = 4e-3, kGenericAbs = 3e-2;

// The fused implementations, each checked on every case it is granted for on this device. Returns how many ran.
int check_fused(AttnImpl impl, unsigned seed, int block_n = 0, ds::kern::CtaOrder order = ds::kern::CtaOrder::Auto) {
  std::mt19937 rng(seed);
  int ran = 0;
  for (const AttnCase& c : fused_cases()) {
    if (!granted(impl, c, block_n)) continue;
    AttnProblem pr(c, rng);
    const AttnCheck r = run_attention(pr, impl, block_n, order);
    const std::string what = std::string(ds::kern::attn_impl_name(impl)) + " " + case_name(c) +
                             " block_n=" + std::to_string(block_n);
    EXPECT_EQ(r.unwritten, 0u) << what;
    EXPECT_EQ(r.padding_touched, 0u) << what;
    EXPECT_LT(r.rel, kFusedRel) << what;
    EXPECT_LT(r.max_abs, kFusedAbs) << what;
    ++ran;
  }
  return ran;
}

// Many key tiles (a software pipeline's steady state; later tiles often move no row maximum of a warp, and the
// kernels then skip the O rescale) at both head widths, and both tile widths at d = 64 for the wgmma kernel.
void check_fused_long(AttnImpl impl, unsigned seed) {
  if (small_run()) return;
  std::mt19937 rng(seed);
  for (bool diff : {true, false})
    for (auto [d, bn] : {std::pair{128, 64}, std::pair{64, 64}, std::pair{64, 128}}) {
      const AttnCase c{1100, 1, 4, 2, d, diff};
      if (!granted(impl, c, bn) || (impl != AttnImpl::Sm90 && bn != 64)) continue;
      AttnProblem pr(c, rng);
      const AttnCheck r = run_attention(pr, impl, bn);
      const std::string what = std::string(ds::kern::attn_impl_name(impl)) + " " + case_name(c) +
                               " block_n=" + std::to_string(bn);
      EXPECT_EQ(r.unwritten, 0u) << what;
      EXPECT_LT(r.rel, kFusedRel) << what;
      EXPECT_LT(r.max_abs, kFusedAbs) << what;
    }
}

// Every fused implementation that can run on this device, forced through the API; one that cannot is skipped with
// the dispatcher's reason (an A100 runs no wgmma, an H100 runs every one of them).
class FusedAttention : public ::testing::TestWithParam<AttnImpl> {};

TEST_P(FusedAttention, MatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  const AttnImpl impl = GetParam();
  if (!granted(impl, {64, 1, 4, 2, 64, true}) && !granted(impl, {64, 1, 4, 2, 128, true})) {
    ds::kern::AttnShape s;
    s.d = 64, s.heads = 4, s.kv_heads = 2, s.n = 64;
    GTEST_SKIP() << ds::kern::select_attn(this_device(), s, {impl}).why;
  }
  int ran = check_fused(impl, 1234 + unsigned(impl));
  if (impl == AttnImpl::Sm90) ran += check_fused(impl, 999, 128);  // d = 64 with 128-key tiles
  check_fused_long(impl, 8642 + unsigned(impl));
  EXPECT_GT(ran, 0);
}

TEST_P(FusedAttention, HeadMajorOrderMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  const AttnImpl impl = GetParam();
  if (check_fused(impl, 1357 + unsigned(impl), 0, ds::kern::CtaOrder::HeadMajor) == 0)
    GTEST_SKIP() << ds::kern::attn_impl_name(impl) << " runs no case here";
}

TEST_P(FusedAttention, IsDeterministic) {
  SKIP_WITHOUT_DEVICE();
  const AttnImpl impl = GetParam();
  int ran = 0;
  for (bool diff : {true, false})
    for (int d : {64, 128}) {
    std::mt19937 rng(77);
    AttnProblem pr({small_run() ? 130 : 300, 2, 8, 4, d, diff}, rng);
    DeviceBuffer in = to_device(pr.qkv);
    const size_t out_elems = size_t(pr.c.batch) * pr.c.n * pr.out_row_stride;
    DeviceBuffer o1(out_elems * 2, "test"), o2(out_elems * 2, "test");
    DS_CUDA_CHECK(cudaMemset(o1.get(), 0, o1.bytes()));
    DS_CUDA_CHECK(cudaMemset(o2.get(), 0, o2.bytes()));
    const ds::kern::AttnChoice choice = choose(pr.params(in, o1), impl);
    if (choice.impl != impl) continue;  // (the problem above is built either way: the same RNG stream per mode)
    DS_CUDA_CHECK(ds::kern::launch_attn(choice, pr.params(in, o1), nullptr));
    DS_CUDA_CHECK(ds::kern::launch_attn(choice, pr.params(in, o2), nullptr));
    DS_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(to_host<uint16_t>(o1, out_elems), to_host<uint16_t>(o2, out_elems))
        << ds::kern::attn_impl_name(impl) << (diff ? " diff" : " plain") << " d=" << d << ": a moving result is a race";
    ++ran;
    }
  if (ran == 0) GTEST_SKIP() << ds::kern::attn_impl_name(impl) << " runs no case here";
}

// Keys far below the diagonal whose scores stand far above every score of the diagonal tile: the wgmma kernel's
// first pass keeps each row's maximum from the diagonal tile, so their exponentials exceed 1 by 2^80 (a moderate
// spike: the first pass's result stands) or overflow (2^280: the CTA must take the exact pass). Q's first element
// is 8 in every head, and the spike keys' first element b: a score of about 8 b / sqrt(d) against O(10) elsewhere.
TEST_P(FusedAttention, LargeScoresFarFromTheDiagonal) {
  SKIP_WITHOUT_DEVICE();
  const AttnImpl impl = GetParam();
  std::mt19937 rng(4242 + unsigned(impl));
  int ran = 0;
  for (bool diff : {true, false})
    for (auto [d, bn] : {std::pair{64, 128}, std::pair{64, 64}, std::pair{128, 64}})
      for (float b : {60.f, 200.f}) {
        const AttnCase c{small_run() ? 300 : 700, 1, 4, 2, d, diff};
        if (!granted(impl, c, bn) || (impl != AttnImpl::Sm90 && bn != 64)) continue;
        AttnProblem pr(c, rng);
        const int64_t k_off = int64_t(c.heads) * c.d;
        const float spike = b * float(std::sqrt(double(d) / 64.0));  // the same score at both head widths
        for (int t = 0; t < c.n; ++t)
          for (int h = 0; h < c.heads; ++h) pr.qkv[size_t(t) * pr.row_stride + size_t(h) * d] = ds::f32_to_bf16(8.f);
        for (int j : {3, 150})
          for (int g = 0; g < c.kv_heads; ++g) pr.qkv[size_t(j) * pr.row_stride + k_off + size_t(g) * d] = ds::f32_to_bf16(spike);
        pr.reference();
        const AttnCheck r = run_attention(pr, impl, bn);
        const std::string what = std::string(ds::kern::attn_impl_name(impl)) + " " + case_name(c) +
                                 " block_n=" + std::to_string(bn) + " spike " + std::to_string(int(b));
        EXPECT_EQ(r.unwritten, 0u) << what;
        EXPECT_LT(r.rel, kFusedRel) << what;
        EXPECT_LT(r.max_abs, kFusedAbs) << what;
        ++ran;
      }
  if (ran == 0) GTEST_SKIP() << ds::kern::attn_impl_name(impl) << " runs no case here";
}

INSTANTIATE_TEST_SUITE_P(Impl, FusedAttention,
                         ::testing::Values(AttnImpl::Sm90, AttnImpl::MmaBoth, AttnImpl::MmaVsplit,
                                           AttnImpl::MmaLockstep),
                         [](const ::testing::TestParamInfo<AttnImpl>& i) {
                           std::string n = ds::kern::attn_impl_name(i.param);
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Both CTA orders (tile-major for launches whose K/V fit in L2, which every case above is, head-major otherwise)
// cover every (query tile, head) exactly once, heaviest tile first within a head or within a wave of heads.
TEST(CudaKernels, CtaOrdersArePermutationsHeaviestFirst) {
  for (bool tile_major : {false, true})
    for (auto [n_qt, n_bh] : {std::pair{1, 1}, std::pair{5, 3}, std::pair{16, 12}, std::pair{32, 96}}) {
      std::vector<int> seen(size_t(n_qt) * n_bh, 0);
      int prev_qt = n_qt, prev_bh = -1;
      for (int cta = 0; cta < n_qt * n_bh; ++cta) {
        const ds::kern::CtaTile t = ds::kern::cta_tile(cta, n_qt, n_bh, tile_major);
        ASSERT_TRUE(t.qt >= 0 && t.qt < n_qt && t.bh >= 0 && t.bh < n_bh) << cta;
        seen[size_t(t.qt) * n_bh + t.bh]++;
        if (tile_major) EXPECT_LE(t.qt, prev_qt) << cta;                      // query tiles never get heavier
        else if (t.bh == prev_bh) EXPECT_EQ(t.qt, prev_qt - 1) << cta;         // within a head: heaviest first
        prev_qt = t.qt;
        prev_bh = t.bh;
      }
      for (int c : seen) EXPECT_EQ(c, 1);
    }
}

TEST(CudaKernels, GenericAttentionMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(99);
  std::vector<AttnCase> cases = {{1, 1, 4, 2, 32, true},   {37, 1, 8, 8, 32, true},  {70, 2, 4, 2, 64, true},
                                 {33, 1, 8, 4, 40, true},  {1, 1, 4, 2, 32, false},  {45, 2, 8, 2, 64, false},
                                 {29, 1, 6, 3, 128, false}, {65, 1, 4, 2, 128, true}, {20, 1, 2, 2, 256, true}};
  for (const AttnCase& c : cases) {
    AttnProblem pr(c, rng);
    const AttnCheck r = run_attention(pr, AttnImpl::Generic);
    EXPECT_EQ(r.unwritten, 0u) << case_name(c);
    EXPECT_EQ(r.padding_touched, 0u) << case_name(c);
    EXPECT_LT(r.rel, kGenericRel) << case_name(c);
    EXPECT_LT(r.max_abs, kGenericAbs) << case_name(c);
  }
}

// Quantised logits (the Figure 8 what-if) in the kernels that take them, against the float64 reference quantised the
// same way: the Hopper kernel with its rows' maxima from the row-maximum kernel and from its own first pass (both
// tile widths at d = 64, many key tiles, plain and differential) and the generic kernel, at 8 and 4 bits; a windowed
// layer goes to the generic kernel. The device's f32 logits can land
// on the other side of a rounding midpoint than float64's: a logit then moves by one step, which the bounds absorb
// (a few such logits among the ~10^6 of a case).
TEST(CudaKernels, QuantisedLogitsMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(4242);
  int sm90_ran = 0;
  for (int bits : {8, 4})
    for (bool diff : {true, false})
      for (auto [d, bn] : {std::pair{64, 64}, std::pair{64, 128}, std::pair{128, 64}})
        for (int n : small_run() ? std::vector<int>{65, 300} : std::vector<int>{1, 65, 300, 1100}) {
          const AttnCase c{n, n == 300 ? 2 : 1, 4, 2, d, diff};
          AttnOpts o;
          o.logit_bits = bits;
          AttnProblem pr(c, rng, o);
          const std::string what = case_name(c) + opts_name(o) + " block_n=" + std::to_string(bn);
          // what the default dispatch takes for it: the Hopper kernel where it runs
          DeviceBuffer in = to_device(pr.qkv), out(16, "unused");
          const ds::kern::AttnChoice auto_choice = choose(pr.params(in, out), AttnImpl::Auto, bn);
          EXPECT_EQ(auto_choice.impl, granted(AttnImpl::Sm90, c) ? AttnImpl::Sm90 : AttnImpl::Generic) << what;
          for (auto [impl, one_kernel] : {std::pair{AttnImpl::Sm90, false}, std::pair{AttnImpl::Sm90, true},
                                          std::pair{AttnImpl::Generic, false}}) {
            if (!granted(impl, c, bn) || (impl == AttnImpl::Generic && bn != 64)) continue;
            const AttnCheck r = run_attention(pr, impl, impl == AttnImpl::Sm90 ? bn : 0, ds::kern::CtaOrder::Auto, 0,
                                              !one_kernel);
            const std::string w = std::string(ds::kern::attn_impl_name(impl)) + (one_kernel ? " (one kernel) " : " ") + what;
            EXPECT_EQ(r.unwritten, 0u) << w;
            EXPECT_EQ(r.padding_touched, 0u) << w;
            EXPECT_LT(r.rel, impl == AttnImpl::Sm90 ? kFusedRel : kGenericRel) << w;
            EXPECT_LT(r.max_abs, impl == AttnImpl::Sm90 ? kFusedAbs : 2 * kGenericAbs) << w;
            sm90_ran += impl == AttnImpl::Sm90;
          }
        }
  // A large negative logit in every row: the Hopper pass's fixed maximum (the row's quantised |logit| maximum)
  // would underflow every exponential; the verdict sends such a row's CTA through the exact pass.
  for (int bits : {8, 4})
    for (bool diff : {true, false})
      for (int bn : {64, 128}) {
        const AttnCase c{300, 1, 4, 2, 64, diff};
        AttnOpts o;
        o.logit_bits = bits;
        o.negative_outlier = true;
        AttnProblem pr(c, rng, o);
        for (auto [impl, one_kernel] : {std::pair{AttnImpl::Sm90, false}, std::pair{AttnImpl::Sm90, true},
                                        std::pair{AttnImpl::Generic, false}}) {
          if (!granted(impl, c, bn) || (impl == AttnImpl::Generic && bn != 64)) continue;
          const AttnCheck r = run_attention(pr, impl, impl == AttnImpl::Sm90 ? bn : 0, ds::kern::CtaOrder::Auto, 0,
                                            !one_kernel);
          const std::string w = std::string(ds::kern::attn_impl_name(impl)) + (one_kernel ? " (one kernel) " : " ") +
                                case_name(c) + opts_name(o) + " block_n=" + std::to_string(bn);
          EXPECT_EQ(r.unwritten, 0u) << w;
          EXPECT_LT(r.rel, impl == AttnImpl::Sm90 ? kFusedRel : kGenericRel) << w;
          EXPECT_LT(r.max_abs, impl == AttnImpl::Sm90 ? kFusedAbs : 2 * kGenericAbs) << w;
          sm90_ran += impl == AttnImpl::Sm90;
        }
      }
  // under a sliding window the quantised layer runs the generic kernel (the Hopper pass is built without one)
  AttnOpts o;
  o.logit_bits = 6;
  o.window = 40;
  AttnProblem pr({200, 1, 4, 2, 64, true}, rng, o);
  DeviceBuffer in = to_device(pr.qkv), out(16, "unused");
  EXPECT_EQ(choose(pr.params(in, out), AttnImpl::Auto).impl, AttnImpl::Generic);
  const AttnCheck r = run_attention(pr, AttnImpl::Generic);
  EXPECT_EQ(r.unwritten, 0u);
  EXPECT_LT(r.rel, kGenericRel);
  if (sm90_ran == 0) GTEST_SKIP() << "the generic kernel checked; the Hopper kernel cannot run here";
}

TEST(CudaKernels, AttentionRejectsUnsupportedShapes) {
  SKIP_WITHOUT_DEVICE();
  ds::kern::AttnParams p;
  p.n = 4;
  p.heads = 4;
  p.kv_heads = 2;
  p.d = 96;
  EXPECT_EQ(choose(p, AttnImpl::Sm90).impl, AttnImpl::None);
  EXPECT_EQ(choose(p, AttnImpl::MmaBoth).impl, AttnImpl::None);
  EXPECT_EQ(choose(p, AttnImpl::Auto).impl, AttnImpl::Generic);
  p.d = 12;
  const ds::kern::AttnChoice none = choose(p, AttnImpl::Auto);
  EXPECT_EQ(none.impl, AttnImpl::None);
  EXPECT_NE(none.why.find("multiple of 8"), std::string::npos) << none.why;
  EXPECT_EQ(ds::kern::launch_attn(none, p, nullptr), cudaErrorInvalidValue);
  ds::kern::AttnChoice generic;
  generic.impl = AttnImpl::Generic;
  EXPECT_EQ(ds::kern::launch_attn(generic, p, nullptr), cudaErrorInvalidValue);  // the kernel checks too
}

// Maps: f32 dot products and expf against float64: 1e-5 absolute on probabilities in [0, 1]. Row statistics from
// the map kernels and, where it runs (head_dim 64 / 128, H even), from the fused two-pass kernel
// (launch_attn_row_stats: tensor-core S, ex2.approx: 2e-4 on sums of n terms).

// The map kernels over every row of p in three chunks (row0 > 0 included), outputs NaN-poisoned first:
// maps [hv][nm][n][n] and row statistics [hv][n][MAP_NSTAT] as launch_attn_map_logits / _softmax leave them.
void run_map_kernels(const ds::kern::AttnParams& p, int hv, int nm, int n, std::vector<float>& maps,
                     std::vector<float>& stats) {
  const int split = std::max(1, n / 3);
  maps.assign(size_t(hv) * nm * n * n, NAN);
  stats.assign(size_t(hv) * n * ds::kern::MAP_NSTAT, NAN);
  for (int r0 = 0; r0 < n; r0 += split) {
    const int rows = std::min(split, n - r0);
    DeviceBuffer mb(size_t(hv) * nm * rows * n * 4, "test maps"), sb(size_t(hv) * rows * ds::kern::MAP_NSTAT * 4, "test");
    std::vector<float> nan(size_t(hv) * nm * rows * n, NAN);
    DS_CUDA_CHECK(cudaMemcpy(mb.get(), nan.data(), mb.bytes(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(ds::kern::launch_attn_map_logits(p, r0, rows, mb.as<float>(), nullptr));
    DS_CUDA_CHECK(ds::kern::launch_attn_map_softmax(p, r0, rows, mb.as<float>(), sb.as<float>(), nullptr));
    DS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto m = to_host<float>(mb, nan.size());
    const auto s = to_host<float>(sb, size_t(hv) * rows * ds::kern::MAP_NSTAT);
    for (int h = 0; h < hv; ++h)
      for (int mm = 0; mm < nm; ++mm)
        for (int r = 0; r < rows; ++r)
          std::memcpy(&maps[((size_t(h) * nm + mm) * n + r0 + r) * n], &m[((size_t(h) * nm + mm) * rows + r) * n],
                      size_t(n) * 4);
    for (int h = 0; h < hv; ++h)
      std::memcpy(&stats[(size_t(h) * n + r0) * ds::kern::MAP_NSTAT], &s[size_t(h) * rows * ds::kern::MAP_NSTAT],
                  size_t(rows) * ds::kern::MAP_NSTAT * 4);
  }
}

TEST(CudaKernels, MapsAndStatisticsMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(5);
  for (AttnCase c : {AttnCase{45, 1, 4, 2, 64, true}, AttnCase{30, 1, 4, 2, 32, false}, AttnCase{1, 1, 8, 4, 128, true},
                     AttnCase{200, 1, 4, 2, 128, true}, AttnCase{130, 1, 4, 2, 64, false},
                     AttnCase{77, 1, 6, 3, 128, false}}) {
    AttnProblem pr(c, rng);
    DeviceBuffer in = to_device(pr.qkv), dummy(16, "test");
    ds::kern::AttnParams p = pr.params(in, dummy);
    const int hv = c.diff ? c.heads / 2 : c.heads, nm = c.diff ? 2 : 1, n = c.n;
    std::vector<float> maps, stats;
    run_map_kernels(p, hv, nm, n, maps, stats);  // in chunks of rows: row0 > 0 is exercised
    const bool fused = (c.d == 64 || c.d == 128) && c.heads % 2 == 0;
    std::vector<float> fstats;
    if (fused) {
      DeviceBuffer fb(size_t(hv) * n * ds::kern::MAP_NSTAT * 4, "test stats");
      std::vector<float> nan(size_t(hv) * n * ds::kern::MAP_NSTAT, NAN);
      DS_CUDA_CHECK(cudaMemcpy(fb.get(), nan.data(), fb.bytes(), cudaMemcpyHostToDevice));
      DS_CUDA_CHECK(ds::kern::launch_attn_row_stats(p, fb.as<float>(), nullptr));
      DS_CUDA_CHECK(cudaDeviceSynchronize());
      fstats = to_host<float>(fb, nan.size());
    }
    double worst_fused = 0;
    const int H = c.heads, Hkv = c.kv_heads, d = c.d, n_rep = H / Hkv;
    double worst = 0, worst_stat = 0;
    for (int h = 0; h < hv; ++h)
      for (int i = 0; i < n; ++i) {
        std::vector<double> a[2];
        double mxl[2] = {-INFINITY, -INFINITY};
        for (int mm = 0; mm < nm; ++mm) {
          const int qh = c.diff ? (mm == 0 ? h : h + H / 2) : h;
          const int kh = c.diff ? (mm == 0 ? h / n_rep : Hkv / 2 + h / n_rep) : h / n_rep;
          a[mm].assign(size_t(n), 0.0);
          double mx = -INFINITY, mabs = 0, l = 0;
          for (int k = 0; k <= i; ++k) {
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += pr.at(0, i, int64_t(qh) * d + e) * pr.at(0, k, int64_t(H) * d + int64_t(kh) * d + e);
            a[mm][size_t(k)] = dot / std::sqrt(double(d));
            mx = std::max(mx, a[mm][size_t(k)]);
            mabs = std::max(mabs, std::fabs(a[mm][size_t(k)]));
          }
          mxl[mm] = mabs;  // the statistic is the largest |logit|
          for (int k = 0; k <= i; ++k) l += (a[mm][size_t(k)] = std::exp(a[mm][size_t(k)] - mx));
          for (int k = 0; k <= i; ++k) a[mm][size_t(k)] /= l;
          for (int k = 0; k < n; ++k)
            worst = std::max(worst, std::fabs(double(maps[((size_t(h) * nm + mm) * n + i) * n + k]) - a[mm][size_t(k)]));
        }
        double ent1 = 0, ent2 = 0, neg = 0, absd = 0, dlogd = 0, dmin = INFINITY, dmax = -INFINITY;
        for (int k = 0; k <= i; ++k) {
          if (a[0][size_t(k)] > 0) ent1 -= a[0][size_t(k)] * std::log(a[0][size_t(k)]);
          if (c.diff && a[1][size_t(k)] > 0) ent2 -= a[1][size_t(k)] * std::log(a[1][size_t(k)]);
          const double dd = a[0][size_t(k)] - (c.diff ? double(pr.lambda) * a[1][size_t(k)] : 0.0);
          neg += std::max(0.0, -dd);
          absd += std::fabs(dd);
          if (dd != 0) dlogd += std::fabs(dd) * std::log(std::fabs(dd));
          dmin = std::min(dmin, dd), dmax = std::max(dmax, dd);
        }
        if (fused) {
          const float* f = &fstats[(size_t(h) * n + i) * ds::kern::MAP_NSTAT];
          const double first_d = a[0][0] - (c.diff ? double(pr.lambda) * a[1][0] : 0.0);
          for (auto [got, want] : {std::pair{f[ds::kern::MAP_ENTROPY1], ent1}, {f[ds::kern::MAP_NEG_MASS], neg},
                                   {f[ds::kern::MAP_ENTROPY_DIFF], std::log(absd) - dlogd / absd},
                                   {f[ds::kern::MAP_FIRST1], a[0][0]}, {f[ds::kern::MAP_FIRST_DIFF], first_d},
                                   {f[ds::kern::MAP_DIFF_MIN], dmin}, {f[ds::kern::MAP_DIFF_MAX], dmax},
                                   {f[ds::kern::MAP_ENTROPY2], c.diff ? ent2 : 0.0},
                                   {f[ds::kern::MAP_FIRST2], c.diff ? a[1][0] : 0.0}})
            worst_fused = std::max(worst_fused, std::isfinite(got) ? std::fabs(got - want) : 1e9);
          worst_fused = std::max(worst_fused, std::fabs(f[ds::kern::MAP_MAX_LOGIT1] - mxl[0]) / std::max(1.0, mxl[0]));
          if (c.diff)
            worst_fused = std::max(worst_fused, std::fabs(f[ds::kern::MAP_MAX_LOGIT2] - mxl[1]) / std::max(1.0, mxl[1]));
        }
        const float* st = &stats[(size_t(h) * n + i) * ds::kern::MAP_NSTAT];
        worst_stat = std::max(worst_stat, std::fabs(st[ds::kern::MAP_ENTROPY1] - ent1));
        worst_stat = std::max(worst_stat, std::fabs(st[ds::kern::MAP_NEG_MASS] - neg));
        worst_stat = std::max(worst_stat, std::fabs(st[ds::kern::MAP_ENTROPY_DIFF] - (std::log(absd) - dlogd / absd)));
        worst_stat = std::max(worst_stat, std::fabs(st[ds::kern::MAP_FIRST1] - a[0][0]));
        worst_stat = std::max(worst_stat, std::fabs(st[ds::kern::MAP_MAX_LOGIT1] - mxl[0]) / std::max(1.0, std::fabs(mxl[0])));
        if (nm == 2)
          worst_stat = std::max(worst_stat, std::fabs(st[ds::kern::MAP_MAX_LOGIT2] - mxl[1]) / std::max(1.0, mxl[1]));
      }
    EXPECT_LT(worst, 1e-5) << case_name(c);
    EXPECT_LT(worst_stat, 1e-4) << case_name(c) << " (statistics: sums of n f32 terms)";
    if (fused) EXPECT_LT(worst_fused, 2e-4) << case_name(c) << " (fused row statistics)";
  }
}

// The fused view kernel (launch_attn_map_view) against float64 maps pooled by the definition (engine/core/map_query.h):
// long enough (n = 700) that grid cells span many 8 x 8 blocks (runs folded in registers) while rectangle edges and
// small cells take the per-element path; max and mean; differential and plain heads. ex2.approx and f32 sums: 2e-5.

// The fused view kernel's grids for one head and rectangle, finished on the device: [a1 | a2 | diff], R x C each.
std::vector<float> run_view(const ds::kern::AttnParams& p, const ds::kern::ViewPoolArgs& va, int head, bool diff) {
  const int R = va.rows, C = va.cols;
  DeviceBuffer g(size_t(3) * R * C * 4, "test view");
  DS_CUDA_CHECK(cudaMemset(g.get(), 0, g.bytes()));
  float* g1 = g.as<float>();
  DS_CUDA_CHECK(ds::kern::launch_attn_map_view(p, va, head, g1, g1 + R * C, g1 + 2 * R * C, nullptr));
  DS_CUDA_CHECK(ds::kern::launch_attn_view_finish(va, g1, diff ? g1 + R * C : nullptr, g1 + 2 * R * C, nullptr));
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<float>(g, size_t(3) * R * C);
}

TEST(CudaKernels, FusedMapViewMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(11);
  for (AttnCase c : {AttnCase{700, 1, 4, 2, 64, true}, AttnCase{700, 1, 4, 2, 128, false},
                     AttnCase{333, 1, 8, 4, 128, true}}) {
    if (small_run() && c.n > 400) continue;
    AttnProblem pr(c, rng);
    DeviceBuffer in = to_device(pr.qkv), dummy(16, "test");
    const ds::kern::AttnParams p = pr.params(in, dummy);
    const int n = c.n, H = c.heads, Hkv = c.kv_heads, d = c.d, hv = c.diff ? H / 2 : H;
    const int head = hv - 1;
    // float64 maps of the head
    std::vector<double> A[2];
    for (int m = 0; m < (c.diff ? 2 : 1); ++m) {
      const ds::kern::ViewHeadMap hm = ds::kern::view_head_map(c.diff, head, H, Hkv);
      A[m].assign(size_t(n) * n, 0.0);
      for (int i = 0; i < n; ++i) {
        double mx = -INFINITY, l = 0;
        std::vector<double> row(size_t(i) + 1);
        for (int k = 0; k <= i; ++k) {
          double dot = 0;
          for (int e = 0; e < d; ++e)
            dot += pr.at(0, i, int64_t(hm.q[m]) * d + e) * pr.at(0, k, int64_t(H) * d + int64_t(hm.k[m]) * d + e);
          row[size_t(k)] = dot / std::sqrt(double(d));
          mx = std::max(mx, row[size_t(k)]);
        }
        for (int k = 0; k <= i; ++k) l += (row[size_t(k)] = std::exp(row[size_t(k)] - mx));
        for (int k = 0; k <= i; ++k) A[m][size_t(i) * n + k] = row[size_t(k)] / l;
      }
    }
    struct Q {
      int64_t q0, q1, k0, k1;
      int R, C;
    };
    for (Q q : {Q{0, n, 0, n, 64, 50}, Q{0, n, 0, n, 7, 9}, Q{n / 4, n - 3, 5, n / 2 + 7, 31, 16},
                Q{n - 20, n, 0, n, 20, 300}, Q{100, 164, 100, 164, 64, 64}})
      for (bool mean : {false, true}) {
        const int R = int(std::min<int64_t>(q.R, q.q1 - q.q0)), C = int(std::min<int64_t>(q.C, q.k1 - q.k0));
        const ds::kern::ViewPoolArgs va{q.q0, q.q1, q.k0, q.k1, R, C, mean, pr.lambda};
        const std::vector<float> got = run_view(p, va, head, c.diff);
        double worst = 0;
        for (int bi = 0; bi < R; ++bi)
          for (int bj = 0; bj < C; ++bj) {
            const int64_t r0 = q.q0 + int64_t(bi) * (q.q1 - q.q0) / R, r1 = q.q0 + int64_t(bi + 1) * (q.q1 - q.q0) / R;
            const int64_t c0 = q.k0 + int64_t(bj) * (q.k1 - q.k0) / C, c1 = q.k0 + int64_t(bj + 1) * (q.k1 - q.k0) / C;
            double s1 = 0, s2 = 0, sd = 0, m1 = 0, m2 = 0, md = 0;
            for (int64_t i = r0; i < r1; ++i)
              for (int64_t k = c0; k < c1; ++k) {
                const double x1 = A[0][size_t(i) * n + size_t(k)], x2 = c.diff ? A[1][size_t(i) * n + size_t(k)] : 0.0;
                const double dd = x1 - (c.diff ? double(pr.lambda) : 0.0) * x2;
                s1 += x1, s2 += x2, sd += dd, m1 = std::max(m1, x1), m2 = std::max(m2, x2);
                if (std::fabs(dd) > std::fabs(md)) md = dd;
              }
            const double cnt = double(r1 - r0) * double(c1 - c0);
            const size_t at = size_t(bi) * C + bj;
            const double w1 = mean ? s1 / cnt : m1, w2 = mean ? s2 / cnt : m2, wd = mean ? sd / cnt : md;
            worst = std::max(worst, std::fabs(got[at] - w1));
            if (c.diff) worst = std::max(worst, std::fabs(got[size_t(R) * C + at] - w2));
            worst = std::max(worst, std::fabs(got[size_t(2) * R * C + at] - wd));
          }
        EXPECT_LT(worst, 2e-5) << case_name(c) << " rect " << q.q0 << ":" << q.q1 << "," << q.k0 << ":" << q.k1
                               << " grid " << R << "x" << C << (mean ? " mean" : " max");
      }
  }
}

// ---- Sliding window and K/V from a separate buffer (AttnParams::window, ::kv) --------------------------------------

ds::kern::AttnShape shape_of(const AttnCase& c) {
  ds::kern::AttnShape s;
  s.d = c.d, s.heads = c.heads, s.kv_heads = c.kv_heads, s.diff = c.diff, s.n = c.n, s.batch = c.batch;
  return s;
}

// Every forward implementation, forced: the wgmma kernel with both key-tile widths at d = 64.
struct ImplRun {
  AttnImpl impl;
  int block_n;
};
constexpr ImplRun kImplRuns[] = {{AttnImpl::Sm90, 64},     {AttnImpl::Sm90, 128},        {AttnImpl::MmaBoth, 0},
                                 {AttnImpl::MmaVsplit, 0}, {AttnImpl::MmaLockstep, 0}, {AttnImpl::Generic, 0}};

std::string impl_text(const ImplRun& r) {
  const std::string name = ds::kern::attn_impl_name(r.impl);
  return r.impl == AttnImpl::Sm90 ? name + " block_n=" + std::to_string(r.block_n) : name;
}

// Runs every implementation select_attn grants for the problem on this device against the float64 reference (rows from
// first_row on); for those it does not grant, `skipped` keeps the dispatcher's first reason. Returns how many ran.
int check_every_impl(const AttnProblem& pr, std::map<std::string, std::string>& skipped, int first_row = 0) {
  int ran = 0;
  for (const ImplRun& ir : kImplRuns) {
    if (ir.block_n == 128 && pr.c.d != 64) continue;  // d = 128 always takes 64-key tiles
    const std::string what = impl_text(ir) + " " + case_name(pr.c) + opts_name(pr.o);
    if (!granted(ir.impl, pr.c, ir.block_n)) {
      skipped.emplace(impl_text(ir) + " (" + (pr.c.diff ? "diff" : "plain") + ", d=" + std::to_string(pr.c.d) + ")",
                      ds::kern::select_attn(this_device(), shape_of(pr.c), {ir.impl, ir.block_n}).why);
      continue;
    }
    const AttnCheck r = run_attention(pr, ir.impl, ir.block_n, ds::kern::CtaOrder::Auto, first_row);
    const bool generic = ir.impl == AttnImpl::Generic;
    EXPECT_EQ(r.unwritten, 0u) << what;
    EXPECT_EQ(r.padding_touched, 0u) << what;
    EXPECT_LT(r.rel, generic ? kGenericRel : kFusedRel) << what;
    EXPECT_LT(r.max_abs, generic ? kGenericAbs : kFusedAbs) << what;
    ++ran;
  }
  return ran;
}

void report_skipped(const std::map<std::string, std::string>& skipped) {
  for (const auto& [impl, why] : skipped) std::printf("  not run here: %s: %s\n", impl.c_str(), why.c_str());
}

// Windows of 1 (the row itself), 7 (inside the diagonal tile), 64 (one tile), 100 and 129 (not multiples of the
// 64- or 128-key tiles: the window's edge crosses two tiles), and 512 > n (full causal), each with K/V in qkv and in
// a separate buffer; GQA and MHA, d = 64 and 128, differential and plain, n not a multiple of the tile, batches.
TEST(CudaKernels, WindowAndSeparateKvMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(4242);
  std::map<std::string, std::string> skipped;
  int ran = 0;
  const std::vector<int> windows = small_run() ? std::vector<int>{1, 100} : std::vector<int>{1, 7, 64, 100, 129, 512};
  for (bool diff : {true, false})
    for (int d : {64, 128}) {
      std::vector<std::pair<AttnCase, AttnOpts>> cases;
      for (int w : windows)
        for (bool kv : {false, true}) cases.push_back({{small_run() ? 130 : 300, 1, 8, 4, d, diff}, {w, kv, 0}});
      if (!small_run()) {
        cases.push_back({{1000, 1, 4, 4, d, diff}, {64, true, 0}});
        cases.push_back({{1000, 1, 4, 4, d, diff}, {100, false, 0}});
        cases.push_back({{1000, 1, 4, 4, d, diff}, {512, true, 0}});
      }
      cases.push_back({{130, 2, 8, 4, d, diff}, {50, true, 0}});  // the kv buffer's batch stride
      cases.push_back({{200, 1, 4, 2, d, diff}, {0, true, 0}});   // no window, K/V elsewhere
      for (const auto& [c, o] : cases) {
        AttnProblem pr(c, rng, o);
        ran += check_every_impl(pr, skipped);
      }
    }
  report_skipped(skipped);
  if (ran == 0) GTEST_SKIP() << "no attention implementation runs here";
}

// Float64 maps of view head h (sequence 0) as a one-head LayerMaps (f32, as a backend returns maps), and per map and
// row the largest |logit| of the row's keys ([map][row]).
ds::LayerMaps ref_head_maps(const AttnProblem& pr, int h, std::vector<double> (&max_logit)[2]) {
  const dstest::RefAttnInputs in = pr.ref_inputs();
  const int n = pr.c.n;
  ds::LayerMaps m;
  m.heads = 1, m.n = n;
  std::vector<double> a;
  for (int mm = 0; mm < (pr.c.diff ? 2 : 1); ++mm) {
    std::vector<float>& dst = mm == 0 ? m.a1 : m.a2;
    dst.assign(size_t(n) * n, 0.f);
    max_logit[mm].assign(size_t(n), 0.0);
    for (int i = 0; i < n; ++i) {
      dstest::ref_map_row(in, 0, h, mm, i, a, &max_logit[mm][size_t(i)]);
      for (int k = 0; k < n; ++k) dst[size_t(i) * n + k] = float(a[size_t(k)]);
    }
  }
  return m;
}

// The largest difference of a row's statistics (MAP_NSTAT values) from the float64 ones; max logits relative.
double stat_error(const float* st, const dstest::RefStats& r, const double (&max_logit)[2], bool diff) {
  const std::pair<float, double> pairs[] = {
      {st[ds::kern::MAP_ENTROPY1], r.entropy1},     {st[ds::kern::MAP_ENTROPY2], diff ? r.entropy2 : 0.0},
      {st[ds::kern::MAP_ENTROPY_DIFF], r.entropy_diff}, {st[ds::kern::MAP_FIRST1], r.first1},
      {st[ds::kern::MAP_FIRST2], diff ? r.first2 : 0.0}, {st[ds::kern::MAP_FIRST_DIFF], r.first_diff},
      {st[ds::kern::MAP_NEG_MASS], r.neg_mass},     {st[ds::kern::MAP_DIFF_MIN], r.diff_min},
      {st[ds::kern::MAP_DIFF_MAX], r.diff_max}};
  double worst = 0;
  for (const auto& [got, want] : pairs) worst = std::max(worst, std::isfinite(got) ? std::fabs(got - want) : 1e9);
  for (int m = 0; m < (diff ? 2 : 1); ++m) {
    const float got = st[m == 0 ? ds::kern::MAP_MAX_LOGIT1 : ds::kern::MAP_MAX_LOGIT2];
    worst = std::max(worst, std::isfinite(got) ? std::fabs(got - max_logit[m]) / std::max(1.0, max_logit[m]) : 1e9);
  }
  return worst;
}

// Row statistics of every view head from the fused two-pass kernel ([view heads][n][MAP_NSTAT]), or empty where it
// does not run (head_dim other than 64 / 128).
std::vector<float> fused_row_stats(const ds::kern::AttnParams& p, const AttnCase& c) {
  if (!(c.d == 64 || c.d == 128) || c.heads % 2) return {};
  const int hv = c.diff ? c.heads / 2 : c.heads;
  DeviceBuffer fb(size_t(hv) * c.n * ds::kern::MAP_NSTAT * 4, "test stats");
  std::vector<float> nan(size_t(hv) * c.n * ds::kern::MAP_NSTAT, NAN);
  DS_CUDA_CHECK(cudaMemcpy(fb.get(), nan.data(), fb.bytes(), cudaMemcpyHostToDevice));
  DS_CUDA_CHECK(ds::kern::launch_attn_row_stats(p, fb.as<float>(), nullptr));
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<float>(fb, nan.size());
}

// The map kernels (logits, then softmax and statistics, in two chunks of rows so that the second starts at row0 > 0)
// and the fused row-statistics kernel, with windows and K/V from a separate buffer, against float64 maps: entries
// left of the window come out 0 like those right of the diagonal, and the statistics see only the window. Same
// tolerances as MapsAndStatisticsMatchFloat64.
TEST(CudaKernels, WindowedMapsAndStatisticsMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(606);
  std::vector<std::pair<AttnCase, AttnOpts>> cases;
  const std::vector<int> windows = small_run() ? std::vector<int>{7, 100} : std::vector<int>{1, 7, 64, 100, 512};
  for (size_t i = 0; i < windows.size(); ++i) {
    cases.push_back({{300, 1, 8, 4, 64, true}, {windows[i], i % 2 == 1, 0}});
    cases.push_back({{300, 1, 4, 4, 128, false}, {windows[i], i % 2 == 0, 0}});
  }
  cases.push_back({{200, 1, 4, 2, 32, true}, {50, true, 0}});    // the map kernels alone (no fused d = 32)
  cases.push_back({{130, 1, 6, 3, 64, false}, {65, true, 0}});   // plain, n_rep 3
  cases.push_back({{260, 1, 4, 2, 128, true}, {129, false, 0}});
  for (const auto& [c, o] : cases) {
    AttnProblem pr(c, rng, o);
    const std::string what = case_name(c) + opts_name(o);
    DeviceBuffer in = to_device(pr.qkv), dummy(16, "test");
    DeviceBuffer kv = to_device(o.separate_kv ? pr.kvb : std::vector<uint16_t>(8, 0));
    const ds::kern::AttnParams p = pr.params(in, dummy, &kv);
    const int hv = c.diff ? c.heads / 2 : c.heads, nm = c.diff ? 2 : 1, n = c.n;
    std::vector<float> maps, stats;
    run_map_kernels(p, hv, nm, n, maps, stats);
    const std::vector<float> fstats = fused_row_stats(p, c);
    double worst = 0, worst_stat = 0, worst_fused = 0;
    for (int h = 0; h < hv; ++h) {
      std::vector<double> mxl[2];
      const ds::LayerMaps ref = ref_head_maps(pr, h, mxl);
      for (int i = 0; i < n; ++i) {
        for (int mm = 0; mm < nm; ++mm) {
          const std::vector<float>& r = mm == 0 ? ref.a1 : ref.a2;
          for (int k = 0; k < n; ++k) {
            const float got = maps[((size_t(h) * nm + mm) * n + i) * n + k];
            worst = std::max(worst, std::isfinite(got) ? std::fabs(double(got) - r[size_t(i) * n + k]) : 1e9);
          }
        }
        const dstest::RefStats rs =
            dstest::ref_row_stats(ref.a1.data() + size_t(i) * n, c.diff ? ref.a2.data() + size_t(i) * n : nullptr,
                                  dstest::ref_first_key(i, o.window), i, c.diff ? pr.lambda : 0.0);
        const double ml[2] = {mxl[0][size_t(i)], c.diff ? mxl[1][size_t(i)] : 0.0};
        worst_stat = std::max(worst_stat, stat_error(&stats[(size_t(h) * n + i) * ds::kern::MAP_NSTAT], rs, ml, c.diff));
        if (!fstats.empty())
          worst_fused = std::max(worst_fused, stat_error(&fstats[(size_t(h) * n + i) * ds::kern::MAP_NSTAT], rs, ml, c.diff));
      }
    }
    EXPECT_LT(worst, 1e-5) << what;
    EXPECT_LT(worst_stat, 1e-4) << what << " (statistics: sums of n f32 terms)";
    if (!fstats.empty()) EXPECT_LT(worst_fused, 2e-4) << what << " (fused row statistics)";
  }
}

// The fused view kernel with windows and K/V from a separate buffer against float64 maps pooled by the definition
// (map_reference.h's ref_view): whole maps, a rectangle across the window's edge, one wholly left of the windows of
// its rows (zeros), one cut by the diagonal and small cells.
TEST(CudaKernels, WindowedFusedMapViewMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(707);
  for (auto [c, o] : {std::pair{AttnCase{700, 1, 4, 2, 64, true}, AttnOpts{100, true, 0}},
                      std::pair{AttnCase{333, 1, 8, 4, 128, false}, AttnOpts{64, false, 0}},
                      std::pair{AttnCase{500, 1, 4, 4, 64, false}, AttnOpts{7, true, 0}},
                      std::pair{AttnCase{400, 1, 4, 2, 128, true}, AttnOpts{129, false, 0}}}) {
    if (small_run() && c.n > 400) continue;
    AttnProblem pr(c, rng, o);
    DeviceBuffer in = to_device(pr.qkv), dummy(16, "test");
    DeviceBuffer kv = to_device(o.separate_kv ? pr.kvb : std::vector<uint16_t>(8, 0));
    const ds::kern::AttnParams p = pr.params(in, dummy, &kv);
    const int n = c.n, head = (c.diff ? c.heads / 2 : c.heads) - 1;
    std::vector<double> mxl[2];
    const ds::LayerMaps ref = ref_head_maps(pr, head, mxl);
    struct Q {
      int64_t q0, q1, k0, k1;
      int R, C;
    };
    const int w = o.window;
    for (Q q : {Q{0, n, 0, n, 64, 50}, Q{0, n, 0, n, 7, 9}, Q{n / 2, n, n / 2 - w - 20, n / 2 + 10, 16, 24},
                Q{n - 64, n, 0, std::max(1, n - 64 - w - 70), 8, 8}, Q{n / 4, n - 3, 5, n / 2 + 7, 31, 16},
                Q{100, 164, 100, 164, 64, 64}})
      for (bool mean : {false, true}) {
        if (q.k0 < 0) q.k0 = 0;
        const int R = int(std::min<int64_t>(q.R, q.q1 - q.q0)), C = int(std::min<int64_t>(q.C, q.k1 - q.k0));
        const ds::kern::ViewPoolArgs va{q.q0, q.q1, q.k0, q.k1, R, C, mean, pr.lambda};
        const std::vector<float> got = run_view(p, va, head, c.diff);
        const dstest::RefView rv = dstest::ref_view(ref, 0, q.q0, q.q1, q.k0, q.k1, R, C, mean, c.diff ? pr.lambda : 0.0);
        const std::vector<float> g_a1(got.begin(), got.begin() + R * C), g_a2(got.begin() + R * C, got.begin() + 2 * R * C),
            g_d(got.begin() + 2 * R * C, got.end());
        double worst = std::max(dstest::max_abs_diff(g_a1, rv.a1), dstest::max_abs_diff(g_d, rv.diff));
        if (c.diff) worst = std::max(worst, dstest::max_abs_diff(g_a2, rv.a2));
        EXPECT_LT(worst, 2e-5) << case_name(c) << opts_name(o) << " rect " << q.q0 << ":" << q.q1 << "," << q.k0
                               << ":" << q.k1 << " grid " << R << "x" << C << (mean ? " mean" : " max");
      }
  }
}

// Key tiles wholly left of a CTA's windows are skipped, not loaded and masked: K and V of keys 0..63 are NaN, which
// the rows from the first query tile whose windows leave out every key below 128 (the widest key tile) must never
// see: a kernel that multiplied a masked P of 0 by such a V would return NaN there. Every forward implementation,
// and the row statistics and the fused view from those rows.
TEST(CudaKernels, WindowSkipsKeyTilesLeftOfIt) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(808);
  std::map<std::string, std::string> skipped;
  int ran = 0;
  for (bool diff : {true, false})
    for (int d : {64, 128})
      for (auto [c, o] : {std::pair{AttnCase{600, 1, 4, 2, d, diff}, AttnOpts{100, false, 64}},
                          std::pair{AttnCase{450, 1, 4, 4, d, diff}, AttnOpts{64, true, 64}}}) {
        AttnProblem pr(c, rng, o);
        const int first_row = (o.window + 127 + 63) / 64 * 64;  // CTAs from here on: first key >= 128
        const std::string what = case_name(c) + opts_name(o);
        ran += check_every_impl(pr, skipped, first_row);
        DeviceBuffer in = to_device(pr.qkv), dummy(16, "test");
        DeviceBuffer kv = to_device(o.separate_kv ? pr.kvb : std::vector<uint16_t>(8, 0));
        const ds::kern::AttnParams p = pr.params(in, dummy, &kv);
        const std::vector<float> fstats = fused_row_stats(p, c);
        const int n = c.n, head = (diff ? c.heads / 2 : c.heads) - 1;
        std::vector<double> mxl[2];
        const ds::LayerMaps ref = ref_head_maps(pr, head, mxl);
        double worst = 0;
        for (int i = first_row; i < n; ++i) {
          const dstest::RefStats rs =
              dstest::ref_row_stats(ref.a1.data() + size_t(i) * n, diff ? ref.a2.data() + size_t(i) * n : nullptr,
                                    dstest::ref_first_key(i, o.window), i, diff ? pr.lambda : 0.0);
          const double ml[2] = {mxl[0][size_t(i)], diff ? mxl[1][size_t(i)] : 0.0};
          worst = std::max(worst, stat_error(&fstats[(size_t(head) * n + i) * ds::kern::MAP_NSTAT], rs, ml, diff));
        }
        EXPECT_LT(worst, 2e-4) << what << " (fused row statistics)";
        for (bool mean : {false, true}) {
          const int R = 16, C = 40;
          const ds::kern::ViewPoolArgs va{first_row, n, 0, n, R, C, mean, pr.lambda};
          DeviceBuffer g(size_t(3) * R * C * 4, "test view");
          DS_CUDA_CHECK(cudaMemset(g.get(), 0, g.bytes()));
          float* g1 = g.as<float>();
          DS_CUDA_CHECK(ds::kern::launch_attn_map_view(p, va, head, g1, g1 + R * C, g1 + 2 * R * C, nullptr));
          DS_CUDA_CHECK(ds::kern::launch_attn_view_finish(va, g1, diff ? g1 + R * C : nullptr, g1 + 2 * R * C, nullptr));
          DS_CUDA_CHECK(cudaDeviceSynchronize());
          const std::vector<float> got = to_host<float>(g, size_t(3) * R * C);
          const dstest::RefView rv = dstest::ref_view(ref, 0, first_row, n, 0, n, R, C, mean, diff ? pr.lambda : 0.0);
          const std::vector<float> g_a1(got.begin(), got.begin() + R * C), g_d(got.begin() + 2 * R * C, got.end());
          EXPECT_LT(std::max(dstest::max_abs_diff(g_a1, rv.a1), dstest::max_abs_diff(g_d, rv.diff)), 2e-5)
              << what << (mean ? " mean" : " max") << " view";
        }
      }
  report_skipped(skipped);
  if (ran == 0) GTEST_SKIP() << "no attention implementation runs here";
}

// bf16 output rounding (2^-9 relative) bounds all the element-wise kernels below.
constexpr double kBf16Rel = 4e-3;

TEST(CudaKernels, RmsNormMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  // 64, 96, 2048, 8192: the register kernel at 1, 1, 4, 8 float4 per thread; 30: the two-pass scalar kernel.
  for (auto [rows, cols] : {std::pair{1, 64}, std::pair{7, 2048}, std::pair{33, 96}, std::pair{3, 8192},
                            std::pair{4, 30}}) {
    std::vector<float> x(static_cast<size_t>(rows) * (cols + 8)), w(static_cast<size_t>(cols));
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = 1.f + 0.3f * nd(rng);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dy(size_t(rows) * cols * 2, "test");
    std::vector<uint16_t> poison(size_t(rows) * cols, kBf16NaN);
    DS_CUDA_CHECK(cudaMemcpy(dy.get(), poison.data(), dy.bytes(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(ds::kern::launch_rmsnorm(dx.as<float>(), cols + 8, dw.as<float>(), dy.as<bf16>(), cols, rows, cols,
                                           1e-5f, nullptr));
    const auto y = to_host<uint16_t>(dy, size_t(rows) * cols);
    double num = 0, den = 0;
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int c = 0; c < cols; ++c) ss += double(x[size_t(r) * (cols + 8) + c]) * x[size_t(r) * (cols + 8) + c];
      const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
      for (int c = 0; c < cols; ++c) {
        const double ref = w[size_t(c)] * x[size_t(r) * (cols + 8) + c] * inv, v = bf(y[size_t(r) * cols + c]);
        ASSERT_TRUE(std::isfinite(v));
        num += (v - ref) * (v - ref);
        den += ref * ref;
      }
    }
    EXPECT_LT(std::sqrt(num / den), kBf16Rel) << rows << "x" << cols;
  }
}

// LayerNorm (SambaY's block norms) with weight and bias against float64: 64, 2560 (Phi-4-mini-flash), 4096 take the
// register kernel at 1, 3 and 4 float4 per thread; 4100 (too wide for it) and 30 (not whole float4) the three-pass
// kernel. Rows are strided; the mean is far from 0, as in a residual stream, so a one-pass variance would show.
TEST(CudaKernels, LayerNormMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto [rows, cols] : {std::pair{3, 64}, std::pair{5, 2560}, std::pair{2, 4096}, std::pair{3, 4100},
                            std::pair{4, 30}}) {
    const int ld = cols + 8;
    std::vector<float> x(static_cast<size_t>(rows) * ld), w(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
    for (auto& v : x) v = 20.f + nd(rng);
    for (auto& v : w) v = 1.f + 0.3f * nd(rng);
    for (auto& v : b) v = 0.5f * nd(rng);
    DeviceBuffer dx = to_device(x), dw = to_device(w), db = to_device(b), dy(size_t(rows) * cols * 2, "test");
    std::vector<uint16_t> poison(size_t(rows) * cols, kBf16NaN);
    DS_CUDA_CHECK(cudaMemcpy(dy.get(), poison.data(), dy.bytes(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(ds::kern::launch_layernorm(dx.as<float>(), ld, dw.as<float>(), db.as<float>(), dy.as<bf16>(), cols,
                                             rows, cols, 1e-5f, nullptr));
    const auto y = to_host<uint16_t>(dy, size_t(rows) * cols);
    double num = 0, den = 0;
    for (int r = 0; r < rows; ++r) {
      const float* xr = &x[size_t(r) * ld];
      double mean = 0, var = 0;
      for (int c = 0; c < cols; ++c) mean += xr[c];
      mean /= cols;
      for (int c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
      const double inv = 1.0 / std::sqrt(var / cols + 1e-5);
      for (int c = 0; c < cols; ++c) {
        const double ref = (xr[c] - mean) * inv * w[size_t(c)] + b[size_t(c)], v = bf(y[size_t(r) * cols + c]);
        ASSERT_TRUE(std::isfinite(v)) << rows << "x" << cols << " at " << r << ", " << c;
        num += (v - ref) * (v - ref);
        den += ref * ref;
      }
    }
    EXPECT_LT(std::sqrt(num / den), kBf16Rel) << rows << "x" << cols;
  }
}

// In place on the bf16 QKV rows: Q and K heads rotated, V heads untouched (bit for bit). d = 10 takes the
// one-element-at-a-time path (d/2 odd).
TEST(CudaKernels, RopeMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(8);
  for (int d : {64, 10})
    for (bool llama3 : {false, true}) {
      ds::ModelConfig cfg;
      cfg.head_dim = d;
      cfg.heads = 4;
      cfg.kv_heads = 2;
      cfg.rope.theta = llama3 ? 500000.0 : 10000.0;
      if (llama3) {
        cfg.rope.type = ds::RopeConfig::Llama3;
        cfg.rope.factor = 8;
        cfg.rope.original_max_position_embeddings = 16;
      }
      const std::vector<float> inv = ds::rope_inv_freq(cfg);
      const int half = d / 2, H = 4, Hkv = 2, seq = 300, batch = 2, W = (H + 2 * Hkv) * d;
      const int64_t T = int64_t(seq) * batch;
      const std::vector<uint16_t> x = random_bf16(size_t(T) * W, rng, 3.f);
      DeviceBuffer dinv = to_device(inv), dx = to_device(x), dcs(size_t(seq) * half * 8, "test");
      DS_CUDA_CHECK(ds::kern::launch_rope_table(dinv.as<float>(), seq, half, dcs.as<float2>(), nullptr));
      DS_CUDA_CHECK(ds::kern::launch_rope_qk_inplace(dx.as<bf16>(), dcs.as<float2>(), T, seq, H, Hkv, d, nullptr));
      const auto y = to_host<uint16_t>(dx, size_t(T) * W);
      double num = 0, den = 0;
      size_t v_changed = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int hh = 0; hh < H + 2 * Hkv; ++hh)
          for (int k = 0; k < half; ++k) {
            const size_t i1 = size_t(t) * W + size_t(hh) * d + k, i2 = i1 + size_t(half);
            if (hh >= H + Hkv) {
              v_changed += (y[i1] != x[i1]) + (y[i2] != x[i2]);
              continue;
            }
            const float ang = float(t % seq) * inv[size_t(k)];  // f32 angle, as transformers
            const double c = std::cos(double(ang)), s = std::sin(double(ang));
            const double x1 = bf(x[i1]), x2 = bf(x[i2]);
            const double r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
            const double g1 = bf(y[i1]), g2 = bf(y[i2]);
            num += (g1 - r1) * (g1 - r1) + (g2 - r2) * (g2 - r2);
            den += r1 * r1 + r2 * r2;
          }
      const std::string what = "d=" + std::to_string(d) + (llama3 ? " llama3" : " default");
      EXPECT_LT(std::sqrt(num / den), kBf16Rel) << what;
      EXPECT_EQ(v_changed, 0u) << what;
    }
}

// The gate/up GEMM with SwiGLU in its epilogue (Hopper) against float64: g and u summed in float64 and rounded to
// bf16 (as the unfused path's bf16 gate_up output), silu(g) * u. Shapes: a partial last row tile and K not a
// multiple of the 64-wide K step (the copy engine's zero fill), strided x rows; one tile; 170 tiles (more than an
// H100's 132 CTAs, so the persistent tile loop wraps; a partial group of row tiles) with more K steps than stages.
// The fused sm_90a GEMMs' check: `launch` (CTAs alone, then in pairs) into a poisoned `dout`, every element finite
// and the whole within bf16 rounding of the float64 `ref`. A device that cannot place CTA pairs skips them, saying so.
void check_fused_gemm(const DeviceBuffer& dout, const std::vector<double>& ref, const std::string& what,
                      const std::function<cudaError_t(int)>& launch) {
  for (int cluster : {1, 2}) {
    std::vector<uint16_t> poison(ref.size(), kBf16NaN);
    DS_CUDA_CHECK(cudaMemcpy(dout.get(), poison.data(), poison.size() * 2, cudaMemcpyHostToDevice));
    const cudaError_t e = launch(cluster);
    if (e == cudaErrorNotSupported && cluster == 2) {
      std::printf("[   NOTE   ] CTA pairs cannot be placed on this device: cluster 2 not tested\n");
      continue;
    }
    DS_CUDA_CHECK(e);
    DS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto o = to_host<uint16_t>(dout, ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double v = bf(o[i]);
      ASSERT_TRUE(std::isfinite(v)) << what << " cluster " << cluster << " at " << i;
      num += (v - ref[i]) * (v - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), kBf16Rel) << what << " cluster " << cluster;
  }
}

TEST(CudaKernels, GemmSwigluMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  if (!ds::kern::gemm_swiglu_sm90_supported(reinterpret_cast<const bf16*>(256), 64, reinterpret_cast<const bf16*>(256),
                                            128, 64, 128))
    GTEST_SKIP() << "the fused gate/up + SwiGLU GEMM needs an sm_90 device, this build's sm_90a code and the driver's "
                    "TMA encoder";
  std::mt19937 rng(31);
  struct Case {
    int64_t M;
    int K, I, ldx;
  };
  // The last shape has 512 tiles, several per CTA, so each staging area is handed back and forth. Each shape runs
  // with CTAs alone and in pairs (the weights multicast).
  for (const Case cs : {Case{300, 200, 256, 208}, Case{128, 64, 128, 64}, Case{2100, 320, 1280, 328},
                        Case{4096, 192, 2048, 192}}) {
    const std::vector<uint16_t> x = random_bf16(size_t(cs.M) * cs.ldx, rng, 1.f);
    const std::vector<uint16_t> w = random_bf16(size_t(2 * cs.I) * cs.K, rng, 0.2f);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dout(size_t(cs.M) * cs.I * 2, "test");
    std::vector<double> xd(x.size()), wd(w.size());
    for (size_t i = 0; i < x.size(); ++i) xd[i] = bf(x[i]);
    for (size_t i = 0; i < w.size(); ++i) wd[i] = bf(w[i]);
    const auto round_bf = [](double v) { return double(__bfloat162float(__float2bfloat16(float(v)))); };
    std::vector<double> ref(size_t(cs.M) * cs.I);
    for (int64_t r = 0; r < cs.M; ++r)
      for (int c = 0; c < cs.I; ++c) {
        double g = 0, u = 0;
        const double* xr = &xd[size_t(r) * cs.ldx];
        const double *wg = &wd[size_t(c) * cs.K], *wu = &wd[size_t(cs.I + c) * cs.K];
        for (int k = 0; k < cs.K; ++k) g += xr[k] * wg[k], u += xr[k] * wu[k];
        g = round_bf(g), u = round_bf(u);
        ref[size_t(r) * cs.I + c] = g / (1 + std::exp(-g)) * u;
      }
    check_fused_gemm(dout, ref, std::to_string(cs.M) + "x" + std::to_string(cs.K) + "x" + std::to_string(cs.I),
                     [&](int cluster) {
                       return ds::kern::launch_gemm_swiglu_sm90(dx.as<bf16>(), cs.ldx, dw.as<bf16>(), dout.as<bf16>(),
                                                                cs.M, cs.K, cs.I, nullptr, cluster);
                     });
  }
}

// The same kernel with the gate read from memory (the GMU's in_proj): out[t, i] = silu(bf16(x[t] . w[i])) * gate[t, i]
// for all N = 2I outputs, against float64 (the GEMM rounded to bf16 first, as in the unfused path), with a gate row
// stride above N, partial row tiles, and CTAs alone and in pairs.
TEST(CudaKernels, GemmSiluMulMatchesFloat64) {
  SKIP_WITHOUT_DEVICE();
  if (!ds::kern::gemm_swiglu_sm90_supported(reinterpret_cast<const bf16*>(256), 64, reinterpret_cast<const bf16*>(256),
                                            128, 64, 128))
    GTEST_SKIP() << "the fused GEMM needs an sm_90 device, this build's sm_90a code and the driver's TMA encoder";
  std::mt19937 rng(37);
  struct Case {
    int64_t M;
    int K, N, ldx, ldg;
  };
  for (const Case cs : {Case{300, 200, 512, 208, 520}, Case{128, 64, 256, 64, 256}, Case{2100, 320, 2560, 328, 2560}}) {
    const std::vector<uint16_t> x = random_bf16(size_t(cs.M) * cs.ldx, rng, 1.f);
    const std::vector<uint16_t> w = random_bf16(size_t(cs.N) * cs.K, rng, 0.2f);
    const std::vector<uint16_t> gate = random_bf16(size_t(cs.M) * cs.ldg, rng, 2.f);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dg = to_device(gate), dout(size_t(cs.M) * cs.N * 2, "test");
    const auto round_bf = [](double v) { return double(__bfloat162float(__float2bfloat16(float(v)))); };
    std::vector<double> ref(size_t(cs.M) * cs.N);
    for (int64_t r = 0; r < cs.M; ++r)
      for (int c = 0; c < cs.N; ++c) {
        double y = 0;
        for (int k = 0; k < cs.K; ++k) y += double(bf(x[size_t(r) * cs.ldx + k])) * bf(w[size_t(c) * cs.K + k]);
        y = round_bf(y);
        ref[size_t(r) * cs.N + c] = y / (1 + std::exp(-y)) * bf(gate[size_t(r) * cs.ldg + c]);
      }
    check_fused_gemm(dout, ref, std::to_string(cs.M) + "x" + std::to_string(cs.K) + "x" + std::to_string(cs.N),
                     [&](int cluster) {
                       return ds::kern::launch_gemm_silu_mul_sm90(dx.as<bf16>(), cs.ldx, dw.as<bf16>(), dg.as<bf16>(),
                                                                  cs.ldg, dout.as<bf16>(), cs.M, cs.K, cs.N, nullptr,
                                                                  cluster);
                     });
  }
  // Operands it does not take: N not a multiple of 256, a gate row stride below N.
  DeviceBuffer d(size_t(1) << 20, "test");
  EXPECT_EQ(ds::kern::launch_gemm_silu_mul_sm90(d.as<bf16>(), 64, d.as<bf16>(), d.as<bf16>(), 384, d.as<bf16>(), 128,
                                                64, 384, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ds::kern::launch_gemm_silu_mul_sm90(d.as<bf16>(), 64, d.as<bf16>(), d.as<bf16>(), 248, d.as<bf16>(), 128,
                                                64, 256, nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaKernels, SwigluPolyNormAndEmbeddingMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(21);
  // bf16 gate/up as the GEMM leaves them; 8200 covers a partial block, 36 (not a multiple of 8) the scalar kernel.
  // SwiGLU (the MLP) and silu_mul (the GMU's gate, on the same halves as two operands): each element must be its
  // float64 value rounded to bf16, within one bf16 step, also where e^-g overflows f32 (g below -88) or is tiny (g
  // far above 0).
  const float extremes[] = {-1000.f, -200.f, -89.f, -87.f, -30.f, -0.f, 0.f, 30.f, 89.f, 200.f};
  for (auto [rows, inter] : {std::pair{19, 136}, std::pair{3, 8200}, std::pair{5, 36}}) {
    std::vector<uint16_t> gu = random_bf16(size_t(rows) * 2 * inter, rng, 6.f);
    for (size_t e = 0; e < std::size(extremes); ++e)
      gu[(e % size_t(rows)) * 2 * inter + (e * 7) % size_t(inter)] = ds::f32_to_bf16(extremes[e]);
    DeviceBuffer dgu = to_device(gu);
    for (const bool gmu : {false, true}) {
      DeviceBuffer dout(size_t(rows) * inter * 2, "test");
      std::vector<uint16_t> poison(size_t(rows) * inter, kBf16NaN);
      DS_CUDA_CHECK(cudaMemcpy(dout.get(), poison.data(), dout.bytes(), cudaMemcpyHostToDevice));
      if (gmu)
        DS_CUDA_CHECK(ds::kern::launch_silu_mul(dgu.as<bf16>(), 2 * inter, dgu.as<bf16>() + inter, 2 * inter,
                                                dout.as<bf16>(), inter, rows, inter, nullptr));
      else
        DS_CUDA_CHECK(ds::kern::launch_swiglu(dgu.as<bf16>(), dout.as<bf16>(), rows, inter, nullptr));
      const auto o = to_host<uint16_t>(dout, size_t(rows) * inter);
      double num = 0, den = 0;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < inter; ++c) {
          const double g = bf(gu[size_t(r) * 2 * inter + c]), u = bf(gu[size_t(r) * 2 * inter + inter + c]);
          const double ref = g / (1 + std::exp(-g)) * u, v = bf(o[size_t(r) * inter + c]);
          ASSERT_TRUE(std::isfinite(v)) << (gmu ? "silu_mul " : "swiglu ") << rows << "x" << inter << " at " << r
                                        << "," << c;
          ASSERT_LE(std::abs(v - ref), std::abs(ref) / 128 + 1e-30)
              << (gmu ? "silu_mul " : "swiglu ") << "g = " << g << ", u = " << u << " at " << r << "," << c;
          num += (v - ref) * (v - ref);
          den += ref * ref;
        }
      EXPECT_LT(std::sqrt(num / den), kBf16Rel) << (gmu ? "silu_mul " : "swiglu ") << rows << "x" << inter;
    }
  }

  // PolyNorm * up (Motif's MLP activation) against float64 rows: the three mean squares over the whole row, then
  // w0 N(g^3) + w1 N(g^2) + w2 N(g) + b times up; weights away from their init so that a swapped power shows.
  const float wb_h[4] = {0.7f, -0.45f, 1.3f, 0.2f};
  DeviceBuffer dwb = to_device(std::vector<float>(wb_h, wb_h + 4));
  for (auto [rows, inter] : {std::pair{19, 136}, std::pair{3, 8200}, std::pair{5, 36}}) {
    const std::vector<uint16_t> gu = random_bf16(size_t(rows) * 2 * inter, rng, 3.f);
    DeviceBuffer dgu = to_device(gu), dout(size_t(rows) * inter * 2, "test");
    std::vector<uint16_t> poison(size_t(rows) * inter, kBf16NaN);
    DS_CUDA_CHECK(cudaMemcpy(dout.get(), poison.data(), dout.bytes(), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(ds::kern::launch_polynorm_mul(dgu.as<bf16>(), dwb.as<float>(), 1e-6f, dout.as<bf16>(), rows, inter,
                                                nullptr));
    const auto o = to_host<uint16_t>(dout, size_t(rows) * inter);
    double num = 0, den = 0;
    for (int r = 0; r < rows; ++r) {
      double s[4] = {};
      for (int c = 0; c < inter; ++c)
        for (int k = 1; k <= 3; ++k) s[k] += std::pow(bf(gu[size_t(r) * 2 * inter + c]), 2 * k);
      for (int c = 0; c < inter; ++c) {
        const double g = bf(gu[size_t(r) * 2 * inter + c]), u = bf(gu[size_t(r) * 2 * inter + inter + c]);
        double a = wb_h[3];
        for (int k = 1; k <= 3; ++k) a += wb_h[3 - k] * std::pow(g, k) / std::sqrt(s[k] / inter + 1e-6);
        const double ref = a * u, v = bf(o[size_t(r) * inter + c]);
        ASSERT_TRUE(std::isfinite(v)) << "polynorm " << rows << "x" << inter << " at " << r << "," << c;
        num += (v - ref) * (v - ref);
        den += ref * ref;
      }
    }
    EXPECT_LT(std::sqrt(num / den), kBf16Rel) << "polynorm " << rows << "x" << inter;
  }

  const int vocab = 50, hidden = 72, tokens = 23;
  const std::vector<uint16_t> table = random_bf16(size_t(vocab) * hidden, rng, 1.f);
  std::vector<int32_t> ids(tokens);
  for (auto& i : ids) i = int32_t(rng() % vocab);
  DeviceBuffer dt = to_device(table), di = to_device(ids), de(size_t(tokens) * hidden * 4, "test");
  DS_CUDA_CHECK(ds::kern::launch_embedding(di.as<int32_t>(), dt.as<bf16>(), de.as<float>(), tokens, hidden, nullptr));
  const auto e = to_host<float>(de, size_t(tokens) * hidden);
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < hidden; ++c)
      ASSERT_EQ(e[size_t(t) * hidden + c], bf(table[size_t(ids[size_t(t)]) * hidden + c]));  // exact: bf16 -> f32
}


// Mamba-1's inputs for n tokens (random: x, dt, B and C, z in bf16 with strided rows; the conv's weights and bias,
// dt's bias, A = -exp(A_log) S4D-like and D in f32) and float64 loops written from the published math
// (docs/models/phi4flash.md).
struct MambaInputs {
  int n, ch, S, K;
  int64_t ldx, ldu, ldbc;  // B and C side by side in rows of 2 ldbc
  std::vector<uint16_t> x, dt, bc, z;
  std::vector<float> w, bias, dtb, A, D;

  // packed: rows of multiples of 8 elements and B, C 16-byte aligned (with ch and S multiples of 8), the layout of
  // the engine's buffers, where the kernels take their 16-byte vector paths; else odd strides, where they do not.
  MambaInputs(int n_, int ch_, int S_, int K_, std::mt19937& rng, bool packed = false)
      : n(n_), ch(ch_), S(S_), K(K_), ldx(ch_ + (packed ? 8 : 5)), ldu(ch_ + (packed ? 16 : 3)),
        ldbc(S_ + (packed ? 0 : 2)) {
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    x = random_bf16(size_t(n) * ldx, rng, 2.f);
    dt = random_bf16(size_t(n) * ch, rng, 2.f);
    bc = random_bf16(size_t(n) * ldbc * 2, rng, 1.f);
    z = random_bf16(size_t(n) * ch, rng, 3.f);
    w.resize(size_t(ch) * K), bias.resize(size_t(ch)), dtb.resize(size_t(ch)), A.resize(size_t(ch) * S);
    D.resize(size_t(ch));
    for (auto& v : w) v = U(rng);
    for (auto& v : bias) v = 0.3f * U(rng);
    for (auto& v : dtb) v = U(rng) - 1.f;
    for (int i = 0; i < ch * S; ++i) A[size_t(i)] = -float(1 + i % S) * (1.f + 0.2f * U(rng));
    for (auto& v : D) v = U(rng);
  }
  // u[t, c] from the bf16 x, zeros before t = 0.
  double conv(int t, int c) const {
    double acc = bias[size_t(c)];
    for (int k = 0; k < K; ++k)
      if (t - (K - 1) + k >= 0) acc += double(w[size_t(c) * K + k]) * bf(x[size_t(t - (K - 1) + k) * ldx + c]);
    return acc / (1 + std::exp(-acc));
  }
  // Token t of the scan from the bf16 u row u_row [ch]: h [ch][S] one step on, y and y silu(z) [ch].
  void scan_step(int t, const uint16_t* u_row, std::vector<double>& h, std::vector<double>& y,
                 std::vector<double>& yg) const {
    const uint16_t* b = &bc[size_t(t) * ldbc * 2];
    for (int c = 0; c < ch; ++c) {
      const double ug = bf(u_row[c]), dtt = bf(dt[size_t(t) * ch + c]) + dtb[size_t(c)];
      const double delta = dtt <= 20 ? std::log1p(std::exp(dtt)) : dtt;
      double yy = double(D[size_t(c)]) * ug;
      for (int s = 0; s < S; ++s) {
        double& hs = h[size_t(c) * S + s];
        hs = std::exp(delta * A[size_t(c) * S + s]) * hs + delta * bf(b[s]) * ug;
        yy += bf(b[S + s]) * hs;
      }
      const double zz = bf(z[size_t(t) * ch + c]);
      y[size_t(c)] = yy, yg[size_t(c)] = yy * zz / (1 + std::exp(-zz));
    }
  }
};

void poison_bf16(DeviceBuffer& b) {
  const std::vector<uint16_t> poison(b.bytes() / 2, kBf16NaN);
  DS_CUDA_CHECK(cudaMemcpy(b.get(), poison.data(), b.bytes(), cudaMemcpyHostToDevice));
}

// The device copies of MambaInputs, and the scan's parameters for tokens [t0, t0 + m) of them.
struct MambaDevice {
  const MambaInputs& in;
  DeviceBuffer x, w, bias, dt, dtb, A, D, bc, z;
  MambaDevice(const MambaInputs& i)
      : in(i), x(to_device(i.x)), w(to_device(i.w)), bias(to_device(i.bias)), dt(to_device(i.dt)),
        dtb(to_device(i.dtb)), A(to_device(i.A)), D(to_device(i.D)), bc(to_device(i.bc)), z(to_device(i.z)) {}
  ds::kern::ScanParams scan(int64_t t0, int64_t m, const DeviceBuffer& u, DeviceBuffer& y, DeviceBuffer& yg) const {
    ds::kern::ScanParams p;
    p.n = m, p.channels = in.ch, p.state = in.S;
    p.u = u.as<bf16>() + t0 * in.ldu, p.ld_u = in.ldu;
    p.dt = dt.as<bf16>() + t0 * in.ch, p.ld_dt = in.ch, p.dt_bias = dtb.as<float>(), p.A = A.as<float>();
    p.D = D.as<float>();
    p.B = bc.as<bf16>() + t0 * in.ldbc * 2, p.C = p.B + in.S, p.ld_bc = in.ldbc * 2;
    p.z = z.as<bf16>() + t0 * in.ch, p.ld_z = in.ch;
    p.y = y.as<bf16>() + t0 * in.ch, p.y_gated = yg.as<bf16>() + t0 * in.ch, p.ld_y = in.ch;
    return p;
  }
};

// Mamba-1's causal depthwise convolution (+ SiLU) and selective scan against the float64 loops: channel counts that
// leave a block partly empty, strided rows, gated and ungated outputs. n = 37 and 129 run the sequential scan
// (d_state 16: half a warp per channel; 24: a whole warp, 8 lanes idle), n = 600 the chunked one over three 256-step
// chunks (their states carried) with d_state 5, n = 1100 the chunked one in the packed layout (the convolution 8
// channels per thread, the scan's B and C rows as vectors; a partial last chunk).
TEST(CudaKernels, MambaConvAndScanMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(31);
  for (auto [n, ch, S, packed] : {std::tuple{37, 24, 16, false}, std::tuple{600, 140, 5, false},
                                  std::tuple{129, 19, 24, false}, std::tuple{1100, 64, 16, true}}) {
    const MambaInputs in(n, ch, S, 4, rng, packed);
    const MambaDevice dev(in);
    DeviceBuffer du(size_t(n) * in.ldu * 2, "test"), dy(size_t(n) * ch * 2, "test"), dyg(size_t(n) * ch * 2, "test");
    for (DeviceBuffer* b : {&du, &dy, &dyg}) poison_bf16(*b);
    DS_CUDA_CHECK(ds::kern::launch_causal_conv_silu(dev.x.as<bf16>(), in.ldx, dev.w.as<float>(),
                                                    dev.bias.as<float>(), in.K, du.as<bf16>(), in.ldu, n, ch, nullptr));
    const ds::kern::ScanParams p = dev.scan(0, n, du, dy, dyg);
    DeviceBuffer ws(std::max<size_t>(ds::kern::selective_scan_workspace(p), 16), "test");
    // The chunked output pass is built per set of outputs: y alone and y silu(z) alone first, each into poisoned
    // buffers (the other output must stay untouched), then both, the run the checks below read.
    if (n > ds::kern::kScanSequentialMaxN) {
      for (const bool gated_only : {false, true}) {
        DeviceBuffer oy(dy.bytes(), "test"), og(dyg.bytes(), "test");
        poison_bf16(oy), poison_bf16(og);
        ds::kern::ScanParams q = dev.scan(0, n, du, oy, og);
        (gated_only ? q.y : q.y_gated) = nullptr;
        DS_CUDA_CHECK(ds::kern::launch_selective_scan(q, ws.get(), nullptr));
        DS_CUDA_CHECK(ds::kern::launch_selective_scan(p, ws.get(), nullptr));
        DS_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<uint16_t>(gated_only ? og : oy, size_t(n) * ch),
                   unused = to_host<uint16_t>(gated_only ? oy : og, size_t(n) * ch),
                   both = to_host<uint16_t>(gated_only ? dyg : dy, size_t(n) * ch);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i], both[i]) << (gated_only ? "y silu(z) alone" : "y alone") << " at " << i;
          ASSERT_EQ(unused[i], kBf16NaN) << "the output not asked for was written at " << i;
        }
      }
      for (DeviceBuffer* b : {&dy, &dyg}) poison_bf16(*b);
    }
    DS_CUDA_CHECK(ds::kern::launch_selective_scan(p, ws.get(), nullptr));
    DS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto u = to_host<uint16_t>(du, size_t(n) * in.ldu), y = to_host<uint16_t>(dy, size_t(n) * ch),
               yg = to_host<uint16_t>(dyg, size_t(n) * ch);
    // float64: the convolution from the bf16 x, the scan from the kernel's own bf16 u (the rounding between them is
    // the engine's, not the scan's)
    double nu = 0, du2 = 0, ny = 0, dy2 = 0, ng = 0, dg2 = 0;
    std::vector<double> h(size_t(ch) * S, 0.0), yr(static_cast<size_t>(ch)), gr(static_cast<size_t>(ch));
    for (int t = 0; t < n; ++t) {
      in.scan_step(t, &u[size_t(t) * in.ldu], h, yr, gr);
      for (int c = 0; c < ch; ++c) {
        const double uref = in.conv(t, c), ug = bf(u[size_t(t) * in.ldu + c]);
        ASSERT_TRUE(std::isfinite(ug)) << "u at " << t << "," << c;
        nu += (ug - uref) * (ug - uref), du2 += uref * uref;
        const double yy = yr[size_t(c)], gref = gr[size_t(c)];
        const double yv = bf(y[size_t(t) * ch + c]), gv = bf(yg[size_t(t) * ch + c]);
        ASSERT_TRUE(std::isfinite(yv) && std::isfinite(gv)) << "y at " << t << "," << c;
        ny += (yv - yy) * (yv - yy), dy2 += yy * yy, ng += (gv - gref) * (gv - gref), dg2 += gref * gref;
      }
    }
    EXPECT_LT(std::sqrt(nu / du2), kBf16Rel) << "conv " << n << "x" << ch;
    EXPECT_LT(std::sqrt(ny / dy2), kBf16Rel) << "scan y " << n << "x" << ch << " state " << S;
    EXPECT_LT(std::sqrt(ng / dg2), kBf16Rel) << "scan y*silu(z) " << n << "x" << ch << " state " << S;
  }
}

// The recurrent state across calls (decoding, a prompt in pieces): the sequence run as consecutive pieces through
// launch_causal_conv_silu_state and launch_selective_scan, both states carried in place (state_in == state_out; the
// first piece from null state_in, into state buffers poisoned with NaN), against one call over the whole sequence
// without state and the float64 loops. After every piece the conv state must be the last K - 1 inputs exactly (zeros
// before t = 0) and the scan state the float64 h at that position; u must equal the whole call's bit for bit (the
// same products), y and y silu(z) must match float64 within every piece. Pieces of more than kScanSequentialMaxN
// tokens run the chunked scan (its state in and out), shorter ones the sequential kernel (with null workspace);
// n < K - 1 pieces shift the conv state within itself.
TEST(CudaKernels, MambaStateCarriedAcrossCallsMatchesWhole) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(37);
  struct Case {
    int ch, S, K;
    std::vector<int> pieces;
    bool packed = false;
  };
  // The pieces below run as their comments say while the sequential scan takes 96 to 599 tokens.
  static_assert(ds::kern::kScanSequentialMaxN >= 96 && ds::kern::kScanSequentialMaxN < 600);
  std::vector<int> decode(1, 300);  // a 300-token prefill, then 20 decoding steps of one token
  decode.resize(21, 1);
  const std::vector<Case> cases = {
      {24, 16, 4, {1, 1, 5, 30}},
      {40, 24, 4, {4000, 1, 96}},  // chunked, then sequential from its state
      {37, 5, 4, decode},
      {48, 16, 4, {100, 768, 3, 600}},  // the chunked scan from a state: three whole chunks, then a partial last one
      {19, 16, 4, {1, 2, 1, 2, 2, 1, 30, 1}},  // n < K - 1 pieces, the first one too
      {16, 8, 6, {2, 3, 1, 24, 4}},
      {64, 16, 4, {700, 1, 3, 600, 2}, true},  // packed: vector paths, chunked from null and from a state
      {32, 16, 3, {2, 530}, true},
  };
  for (const Case& cs : cases) {
    int n = 0;
    std::string what = "ch " + std::to_string(cs.ch) + " S " + std::to_string(cs.S) + " K " + std::to_string(cs.K) +
                       " pieces";
    for (int m : cs.pieces) n += m, what += " " + std::to_string(m);
    const int ch = cs.ch, S = cs.S, K = cs.K;
    if (cs.packed) what += " (packed)";
    const MambaInputs in(n, ch, S, K, rng, cs.packed);
    const MambaDevice dev(in);
    DeviceBuffer du(size_t(n) * in.ldu * 2, "test"), dy(size_t(n) * ch * 2, "test"), dyg(size_t(n) * ch * 2, "test");
    DeviceBuffer wu(du.bytes(), "test"), wy(dy.bytes(), "test"), wyg(dyg.bytes(), "test");
    DeviceBuffer cst(size_t(K - 1) * ch * 2, "test"), sst(size_t(ch) * S * 4, "test"), wsst(sst.bytes(), "test");
    for (DeviceBuffer* b : {&du, &dy, &dyg, &wu, &wy, &wyg, &cst, &sst, &wsst}) poison_bf16(*b);  // f32 NaN too
    ds::kern::ScanParams pw = dev.scan(0, n, wu, wy, wyg);
    DeviceBuffer ws(std::max<size_t>(ds::kern::selective_scan_workspace(pw), 16), "test");
    // whole: no conv state, the scan's state out only
    DS_CUDA_CHECK(ds::kern::launch_causal_conv_silu(dev.x.as<bf16>(), in.ldx, dev.w.as<float>(),
                                                    dev.bias.as<float>(), K, wu.as<bf16>(), in.ldu, n, ch, nullptr));
    pw.state_out = wsst.as<float>();
    DS_CUDA_CHECK(ds::kern::launch_selective_scan(pw, ws.get(), nullptr));
    // in pieces, the states after each
    std::vector<std::vector<uint16_t>> conv_states;
    std::vector<std::vector<float>> scan_states;
    int64_t t0 = 0;
    for (int m : cs.pieces) {
      bf16* c_state = cst.as<bf16>();
      DS_CUDA_CHECK(ds::kern::launch_causal_conv_silu_state(
          dev.x.as<bf16>() + t0 * in.ldx, in.ldx, dev.w.as<float>(), dev.bias.as<float>(), K,
          du.as<bf16>() + t0 * in.ldu, in.ldu, m, ch, t0 ? c_state : nullptr, c_state, nullptr));
      ds::kern::ScanParams p = dev.scan(t0, m, du, dy, dyg);
      p.state_in = t0 ? sst.as<float>() : nullptr;
      p.state_out = sst.as<float>();
      const size_t wsb = ds::kern::selective_scan_workspace(p);
      ASSERT_LE(wsb, ws.bytes());
      DS_CUDA_CHECK(ds::kern::launch_selective_scan(p, wsb ? ws.get() : nullptr, nullptr));
      DS_CUDA_CHECK(cudaDeviceSynchronize());
      conv_states.push_back(to_host<uint16_t>(cst, size_t(K - 1) * ch));
      scan_states.push_back(to_host<float>(sst, size_t(ch) * S));
      t0 += m;
    }
    const auto u = to_host<uint16_t>(du, size_t(n) * in.ldu), y = to_host<uint16_t>(dy, size_t(n) * ch),
               yg = to_host<uint16_t>(dyg, size_t(n) * ch), uw = to_host<uint16_t>(wu, size_t(n) * in.ldu),
               yw = to_host<uint16_t>(wy, size_t(n) * ch), ygw = to_host<uint16_t>(wyg, size_t(n) * ch);
    const auto hw = to_host<float>(wsst, size_t(ch) * S);
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < ch; ++c) {
        const float a = bf(u[size_t(t) * in.ldu + c]);
        ASSERT_TRUE(std::isfinite(a)) << what << ": u at " << t << "," << c;
        ASSERT_EQ(a, bf(uw[size_t(t) * in.ldu + c])) << what << ": u at " << t << "," << c << " differs from whole";
      }
    // float64 over the whole sequence from the kernels' u, compared piece by piece
    std::vector<double> h(size_t(ch) * S, 0.0), yr(static_cast<size_t>(ch)), gr(static_cast<size_t>(ch));
    const auto rel_state = [&](const std::vector<float>& st) {
      double num = 0, den = 0;
      for (size_t i = 0; i < h.size(); ++i) {
        if (!std::isfinite(st[i])) return 1e30;
        num += (st[i] - h[i]) * (st[i] - h[i]), den += h[i] * h[i];
      }
      return std::sqrt(num / den);
    };
    t0 = 0;
    for (size_t k = 0; k < cs.pieces.size(); ++k) {
      const int m = cs.pieces[k];
      double nu = 0, du2 = 0, ny = 0, dy2 = 0, ng = 0, dg2 = 0, nw = 0;
      for (int t = int(t0); t < t0 + m; ++t) {
        in.scan_step(t, &u[size_t(t) * in.ldu], h, yr, gr);
        for (int c = 0; c < ch; ++c) {
          const double uref = in.conv(t, c), ug = bf(u[size_t(t) * in.ldu + c]);
          nu += (ug - uref) * (ug - uref), du2 += uref * uref;
          const double yv = bf(y[size_t(t) * ch + c]), gv = bf(yg[size_t(t) * ch + c]);
          const double yv_whole = bf(yw[size_t(t) * ch + c]), gv_whole = bf(ygw[size_t(t) * ch + c]);
          ASSERT_TRUE(std::isfinite(yv) && std::isfinite(gv)) << what << ": y at " << t << "," << c;
          ASSERT_TRUE(std::isfinite(yv_whole) && std::isfinite(gv_whole)) << what << ": whole y at " << t << "," << c;
          ny += (yv - yr[size_t(c)]) * (yv - yr[size_t(c)]), dy2 += yr[size_t(c)] * yr[size_t(c)];
          ng += (gv - gr[size_t(c)]) * (gv - gr[size_t(c)]), dg2 += gr[size_t(c)] * gr[size_t(c)];
          nw += (yv - yv_whole) * (yv - yv_whole);
        }
      }
      const std::string at = what + ", piece " + std::to_string(k) + " [" + std::to_string(t0) + ", " +
                             std::to_string(t0 + m) + ")";
      EXPECT_LT(std::sqrt(nu / du2), kBf16Rel) << at << ": conv";
      EXPECT_LT(std::sqrt(ny / dy2), kBf16Rel) << at << ": y";
      EXPECT_LT(std::sqrt(ng / dg2), kBf16Rel) << at << ": y silu(z)";
      EXPECT_LT(std::sqrt(nw / dy2), kBf16Rel) << at << ": y against the whole call's";
      t0 += m;
      for (int r = 0; r < K - 1; ++r)
        for (int c = 0; c < ch; ++c) {
          const int64_t pos = t0 - (K - 1) + r;
          const float want = pos >= 0 ? bf(in.x[size_t(pos) * in.ldx + c]) : 0.f;
          ASSERT_EQ(bf(conv_states[k][size_t(r) * ch + c]), want) << at << ": conv state row " << r << ", " << c;
        }
      EXPECT_LT(rel_state(scan_states[k]), 1e-3) << at << ": scan state";
    }
    EXPECT_LT(rel_state(hw), 1e-3) << what << ": the whole call's scan state";
  }
}

}  // namespace
#endif
