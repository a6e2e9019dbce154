// The batch-1 GEMV (kernels/gemv.h) against float64 CPU references on fresh random bf16 inputs: the decoder's shapes
// (3072x2048 bf16 out with and without bias, 2048x2048 f32 out with a separate c and in place, 16384x2048 SwiGLU,
// 2048x8192 f32 in place, the 128256x2048 lm_head), odd shapes (out_f 1, 7, 100 by in_f 8, 72, 4104), and the
// refusals. Every output is poisoned with NaN before the run and must come back fully written, with the padding
// beyond out_f untouched. GemvNorm.*: the RMSNorm prologue (x_f32, norm_w) against the engine's launch_rmsnorm
// followed by launch_gemv on its output (bit for bit: outputs and the normed vector), and against float64. GemvPerf.Bandwidth (DS_GEMV_PERF=1 only) prints the GB/s of W per shape against a
// measured device-to-device copy. Skips cleanly without a CUDA device or build.
#include <gtest/gtest.h>

#ifndef DS_HAVE_CUDA
TEST(Gemv, NotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#else

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/detail/backend_cuda_memory.h"
#include "engine/core/dtype.h"
#include "kernels/gemv.h"
#include "kernels/rmsnorm.h"
#include "test_cuda_util.h"

namespace {

using ds::cuda::DeviceBuffer;
using bf16 = __nv_bfloat16;
constexpr uint16_t kBf16NaN = 0x7fc0;
constexpr uint16_t kBf16Sentinel = 0x4321;  // padding beyond out_f (bf16 outputs)
constexpr float kF32Sentinel = 12345.f;     // padding beyond out_f (f32 outputs)
constexpr int kPad = 16;

float bf(uint16_t h) { return ds::bf16_to_f32(h); }

// splitmix64: fast enough for the 262M weights of the lm_head.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float amp) { return amp * (2.f * float(next() >> 40) * (1.f / 16777216.f) - 1.f); }
};

std::vector<uint16_t> random_bf16(size_t n, Rng& rng, float amp) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = ds::f32_to_bf16(rng.uniform(amp));
  return v;
}
std::vector<float> random_f32(size_t n, Rng& rng, float amp) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(amp);
  return v;
}


// Error bound of an f32 sum of products of bf16 values against its float64 value: every product is exact in f32
// (8 x 8 significant bits), and each lane of the warp that owns a row sums at most in_f / 32 of them in sequence
// before the 5 butterfly levels, the up-to-4 K slices and the bias / c additions, so no partial sum passes through
// more than n = in_f / 32 + 16 roundings, each of relative size <= 2^-24: |f32 - exact| <= n 2^-24 sum |terms|
// (the classical gamma_n bound, first order). For bf16 outputs the kernel then rounds once more: another
// 2^-8 |value| at most (round to nearest, 8 significant bits).
double f32_sum_tol(int in_f, double abs_sum) { return (in_f / 32 + 16) * std::ldexp(1.0, -24) * abs_sum; }
double bf16_round_tol(double v) { return std::ldexp(std::fabs(v), -8); }

// The distance from a bf16 value to the next one up in magnitude (the ulp at v).
double bf16_ulp(float v) {
  const uint16_t b = ds::f32_to_bf16(std::fabs(v));
  return double(bf(uint16_t(b + 1))) - double(bf(b));
}

enum class Out { Bf16, F32, F32C, F32InPlace, Swiglu };

const char* out_name(Out o) {
  switch (o) {
    case Out::Bf16: return "bf16";
    case Out::F32: return "f32";
    case Out::F32C: return "f32+c";
    case Out::F32InPlace: return "f32 in place";
    case Out::Swiglu: return "swiglu";
  }
  return "?";
}

struct GemvCase {
  int out_f, in_f;
  Out out;
  bool bias;
  int row_step = 1;  // check every row_step-th row (plus the last 64) against float64; every row for NaN/padding
};

// SwiGLU as the engine otherwise runs it (kernels/swiglu.cu on a bf16 GEMM's output): f32 arithmetic, one rounding.
float swiglu_f32(float g, float u) { return g / (1.f + std::exp(-g)) * u; }

void run_case(const GemvCase& cs, uint64_t seed) {
  const std::string what = std::to_string(cs.out_f) + "x" + std::to_string(cs.in_f) + " " + out_name(cs.out) +
                           (cs.bias ? " +bias" : "");
  SCOPED_TRACE(what);
  Rng rng{seed};
  const size_t out_f = size_t(cs.out_f), in_f = size_t(cs.in_f);
  const std::vector<uint16_t> w = random_bf16(out_f * in_f, rng, 1.f), x = random_bf16(in_f, rng, 1.f);
  const std::vector<float> bias = cs.bias ? random_f32(out_f, rng, 1.f) : std::vector<float>();
  const bool swiglu = cs.out == Out::Swiglu, f32 = cs.out != Out::Bf16 && !swiglu;
  const size_t n_out = swiglu ? out_f / 2 : out_f;
  const std::vector<float> c = (cs.out == Out::F32C || cs.out == Out::F32InPlace) ? random_f32(n_out, rng, 4.f)
                                                                                  : std::vector<float>();
  DeviceBuffer dw = to_device(w), dx = to_device(x), dbias, dc, dy;
  if (cs.bias) dbias = to_device(bias);
  if (cs.out == Out::F32C) dc = to_device(c);
  ds::kern::GemvParams p;
  p.w = dw.as<bf16>();
  p.x = dx.as<bf16>();
  p.out_f = cs.out_f;
  p.in_f = cs.in_f;
  p.bias = cs.bias ? dbias.as<float>() : nullptr;
  p.swiglu = swiglu;
  if (f32) {
    std::vector<float> init(n_out + kPad, kF32Sentinel);
    for (size_t i = 0; i < n_out; ++i) init[i] = cs.out == Out::F32InPlace ? c[i] : std::nanf("");
    dy = to_device(init);
    p.y_f32 = dy.as<float>();
    p.c = cs.out == Out::F32C ? dc.as<float>() : cs.out == Out::F32InPlace ? p.y_f32 : nullptr;
  } else {
    std::vector<uint16_t> init(n_out + kPad, kBf16Sentinel);
    std::fill(init.begin(), init.begin() + long(n_out), kBf16NaN);
    dy = to_device(init);
    p.y_bf16 = dy.as<bf16>();
  }
  ASSERT_EQ(ds::kern::launch_gemv(p, nullptr), cudaSuccess);
  DS_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> yf;
  std::vector<uint16_t> yb;
  if (f32) yf = to_host<float>(dy, n_out + kPad);
  else yb = to_host<uint16_t>(dy, n_out + kPad);
  auto out_at = [&](size_t i) { return f32 ? double(yf[i]) : double(bf(yb[i])); };
  for (size_t i = 0; i < n_out; ++i) ASSERT_TRUE(std::isfinite(out_at(i))) << "output " << i << " not written";
  for (size_t i = n_out; i < n_out + kPad; ++i) {
    if (f32) ASSERT_EQ(yf[i], kF32Sentinel) << "padding " << i << " written";
    else ASSERT_EQ(yb[i], kBf16Sentinel) << "padding " << i << " written";
  }

  std::vector<double> xd(in_f);
  for (size_t k = 0; k < in_f; ++k) xd[k] = bf(x[k]);
  // Float64 row r: the dot product plus bias, and the sum of |terms| for the bound.
  auto dot = [&](size_t r, double* abs_sum) {
    const uint16_t* wr = w.data() + r * in_f;
    double s = 0, a = 0;
    for (size_t k = 0; k < in_f; ++k) {
      const double t = double(bf(wr[k])) * xd[k];
      s += t;
      a += std::fabs(t);
    }
    if (cs.bias) {
      s += bias[r];
      a += std::fabs(bias[r]);
    }
    *abs_sum = a;
    return s;
  };
  const size_t step = size_t(std::max(cs.row_step, 1));
  size_t checked = 0, exact = 0, ambiguous = 0;
  double worst = 0;  // largest |error| / bound
  for (size_t i = 0; i < n_out; ++i) {
    if (i % step != 0 && i + 64 < n_out) continue;
    ++checked;
    const double got = out_at(i);
    if (!swiglu) {
      double a = 0;
      double ref = dot(i, &a);
      if (!c.empty()) {
        ref += c[i];
        a += std::fabs(c[i]);
      }
      double tol = f32_sum_tol(cs.in_f, a);
      if (!f32) tol += bf16_round_tol(std::fabs(ref) + tol);
      worst = std::max(worst, std::fabs(got - ref) / tol);
      ASSERT_LE(std::fabs(got - ref), tol) << "row " << i << ": got " << got << ", float64 " << ref;
      continue;
    }
    // SwiGLU: the kernel's f32 gate/up lie within tg/tu of the float64 ones, then round to bf16.
    double ag = 0, au = 0;
    const double g = dot(i, &ag), u = dot(i + n_out, &au);
    const double tg = f32_sum_tol(cs.in_f, ag), tu = f32_sum_tol(cs.in_f, au);
    // (1) Against float64 silu(g) u, with the bound the two bf16 roundings and the f32 errors allow: silu' lies in
    // [-0.1, 1.1], |silu(g)| <= |g|; then the output's own rounding (2^-8) with slack for f32 exp/division.
    const double dg = tg + bf16_round_tol(std::fabs(g) + tg), du = tu + bf16_round_tol(std::fabs(u) + tu);
    const double sg = g / (1 + std::exp(-g)), ref = sg * u;
    const double bound = 1.1 * dg * (std::fabs(u) + du) + std::fabs(sg) * du + std::ldexp(std::fabs(ref), -7) + 1e-30;
    worst = std::max(worst, std::fabs(got - ref) / bound);
    ASSERT_LE(std::fabs(got - ref), bound) << "index " << i << ": got " << got << ", float64 " << ref;
    // (2) Against the composition the engine would run (bf16 gate/up from a GEMM, then kernels/swiglu.cu), from
    // the float64 dot products rounded to bf16: within 1 bf16 ulp (the f32 exp on host and device may differ in
    // the last f32 bit and flip the final rounding). Where g or u lies within the f32 error of a bf16 rounding
    // boundary, the kernel may round it either way: any of those roundings is accepted.
    const float g_lo = bf(ds::f32_to_bf16(float(g - tg))), g_hi = bf(ds::f32_to_bf16(float(g + tg)));
    const float u_lo = bf(ds::f32_to_bf16(float(u - tu))), u_hi = bf(ds::f32_to_bf16(float(u + tu)));
    const float g_b = bf(ds::f32_to_bf16(float(g))), u_b = bf(ds::f32_to_bf16(float(u)));
    const bool amb = g_lo != g_hi || u_lo != u_hi;
    ambiguous += amb;
    bool ok = false;
    for (float gc : {g_b, g_lo, g_hi})
      for (float uc : {u_b, u_lo, u_hi}) {
        if (!amb && (gc != g_b || uc != u_b)) continue;
        const float comp = bf(ds::f32_to_bf16(swiglu_f32(gc, uc)));
        ok = ok || std::fabs(got - comp) <= bf16_ulp(comp);
      }
    exact += got == double(bf(ds::f32_to_bf16(swiglu_f32(g_b, u_b))));
    // Far into a binade-crossing region (|g| tiny next to its f32 error) more than two roundings are possible:
    // there (1) is the check.
    const bool wide = amb && (std::fabs(g_hi - g_lo) > 1.5 * bf16_ulp(std::min(std::fabs(g_lo), std::fabs(g_hi))) ||
                              std::fabs(u_hi - u_lo) > 1.5 * bf16_ulp(std::min(std::fabs(u_lo), std::fabs(u_hi))));
    if (!wide)
      ASSERT_TRUE(ok) << "index " << i << ": got " << got << ", composition of bf16(" << g << ")=" << g_b
                      << " and bf16(" << u << ")=" << u_b;
  }
  if (swiglu) {
    // The bound behind "ambiguous" is the worst case, far wider than the real f32 error, so many indices count as
    // ambiguous; that the kernel still equals the composition of the float64 g and u almost everywhere is what shows it rounds
    // gate and up to bf16 before silu * up.
    EXPECT_GE(exact + checked / 100 + 2, checked) << "the kernel should equal the bf16 composition almost everywhere";
    std::printf("[ %s: %zu checked, %zu equal to bf16(silu(bf16(g)) bf16(u)) of the float64 g, u, %zu ambiguous, "
                "worst |err|/bound %.3f ]\n",
                what.c_str(), checked, exact, ambiguous, worst);
  } else {
    std::printf("[ %s: %zu rows checked, worst |err|/bound %.3f ]\n", what.c_str(), checked, worst);
  }
}

// The RMSNorm prologue: launch_gemv with x_f32/norm_w against launch_rmsnorm (the engine's kernel) followed by
// launch_gemv on its bf16 output, on the same inputs. The prologue re-enacts rmsnorm.cu's sum of squares, so every
// output (and x_normed_out against the rmsnorm output) must be bit-equal. Then against float64: the normed vector
// v_k = w_k x_k / sqrt(mean x^2 + eps) in float64, the kernel's one differs by its bf16 rounding (<= 2^-8 |v_k|)
// plus the f32 error of r and the two products (< 2^-20 |v_k| with rsqrtf's 2 ulp), so each output lies within
// sum_k |W_k| (2^-8 + 2^-20) |v_k| plus the f32 sum bound of the dot product (and the bf16 output rounding).
void run_norm_case(int out_f_i, int in_f_i, Out out, bool with_bias, uint64_t seed) {
  const std::string what = "norm " + std::to_string(out_f_i) + "x" + std::to_string(in_f_i) + " " + out_name(out) +
                           (with_bias ? " +bias" : "");
  SCOPED_TRACE(what);
  Rng rng{seed};
  const size_t out_f = size_t(out_f_i), in_f = size_t(in_f_i);
  const std::vector<uint16_t> w = random_bf16(out_f * in_f, rng, 1.f);
  const std::vector<float> xf = random_f32(in_f, rng, 3.f);
  std::vector<float> nw = random_f32(in_f, rng, 0.5f);
  for (auto& v : nw) v += 1.f;  // a trained RMSNorm weight: around 1
  const float eps = 1e-5f;
  const std::vector<float> bias = with_bias ? random_f32(out_f, rng, 1.f) : std::vector<float>();
  const bool swiglu = out == Out::Swiglu, f32 = out != Out::Bf16 && !swiglu;
  const size_t n_out = swiglu ? out_f / 2 : out_f;
  const std::vector<float> c = out == Out::F32InPlace ? random_f32(n_out, rng, 4.f) : std::vector<float>();
  DeviceBuffer dw = to_device(w), dxf = to_device(xf), dnw = to_device(nw), dbias;
  if (with_bias) dbias = to_device(bias);
  std::vector<uint16_t> xn_init(in_f + kPad, kBf16Sentinel);
  DeviceBuffer dxn_ref = to_device(xn_init), dxn = to_device(xn_init);
  auto make_out = [&]() {
    if (f32) {
      std::vector<float> init(n_out + kPad, kF32Sentinel);
      for (size_t i = 0; i < n_out; ++i) init[i] = out == Out::F32InPlace ? c[i] : std::nanf("");
      return to_device(init);
    }
    std::vector<uint16_t> init(n_out + kPad, kBf16Sentinel);
    std::fill(init.begin(), init.begin() + long(n_out), kBf16NaN);
    return to_device(init);
  };
  DeviceBuffer dy_ref = make_out(), dy = make_out();
  ds::kern::GemvParams p;
  p.w = dw.as<bf16>();
  p.out_f = out_f_i;
  p.in_f = in_f_i;
  p.bias = with_bias ? dbias.as<float>() : nullptr;
  p.swiglu = swiglu;
  auto set_out = [&](ds::kern::GemvParams& q, DeviceBuffer& d) {
    if (f32) {
      q.y_f32 = d.as<float>();
      q.c = out == Out::F32InPlace ? q.y_f32 : nullptr;
    } else {
      q.y_bf16 = d.as<bf16>();
    }
  };
  // Reference: the engine's two launches.
  ASSERT_EQ(ds::kern::launch_rmsnorm(dxf.as<float>(), in_f_i, dnw.as<float>(), dxn_ref.as<bf16>(), in_f_i, 1, in_f_i,
                                     eps, nullptr),
            cudaSuccess);
  ds::kern::GemvParams pr = p;
  pr.x = dxn_ref.as<bf16>();
  set_out(pr, dy_ref);
  ASSERT_EQ(ds::kern::launch_gemv(pr, nullptr), cudaSuccess);
  // The fused form.
  ds::kern::GemvParams pn = p;
  pn.x_f32 = dxf.as<float>();
  pn.norm_w = dnw.as<float>();
  pn.norm_eps = eps;
  pn.x_normed_out = dxn.as<bf16>();
  set_out(pn, dy);
  ASSERT_EQ(ds::kern::launch_gemv(pn, nullptr), cudaSuccess);
  DS_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<uint16_t> xn_ref = to_host<uint16_t>(dxn_ref, in_f + kPad), xn = to_host<uint16_t>(dxn, in_f + kPad);
  for (size_t k = in_f; k < in_f + kPad; ++k) ASSERT_EQ(xn[k], kBf16Sentinel) << "x_normed_out padding " << k;
  size_t xn_equal = 0;
  for (size_t k = 0; k < in_f; ++k) xn_equal += xn[k] == xn_ref[k];
  EXPECT_EQ(xn_equal, in_f) << "x_normed_out differs from launch_rmsnorm's output";

  std::vector<float> yf, yf_ref;
  std::vector<uint16_t> yb, yb_ref;
  if (f32) {
    yf = to_host<float>(dy, n_out + kPad);
    yf_ref = to_host<float>(dy_ref, n_out + kPad);
  } else {
    yb = to_host<uint16_t>(dy, n_out + kPad);
    yb_ref = to_host<uint16_t>(dy_ref, n_out + kPad);
  }
  auto out_at = [&](size_t i) { return f32 ? double(yf[i]) : double(bf(yb[i])); };
  size_t equal = 0;
  for (size_t i = 0; i < n_out; ++i) {
    ASSERT_TRUE(std::isfinite(out_at(i))) << "output " << i << " not written";
    equal += f32 ? std::memcmp(&yf[i], &yf_ref[i], 4) == 0 : yb[i] == yb_ref[i];
  }
  for (size_t i = n_out; i < n_out + kPad; ++i) {
    if (f32) ASSERT_EQ(yf[i], kF32Sentinel) << "padding " << i << " written";
    else ASSERT_EQ(yb[i], kBf16Sentinel) << "padding " << i << " written";
  }
  EXPECT_EQ(equal, n_out) << "the fused form should equal launch_rmsnorm + launch_gemv bit for bit";

  // Float64.
  double ss = 0;
  for (size_t k = 0; k < in_f; ++k) ss += double(xf[k]) * xf[k];
  const double r = 1.0 / std::sqrt(ss / double(in_f) + double(eps));
  std::vector<double> v(in_f);
  for (size_t k = 0; k < in_f; ++k) v[k] = double(nw[k]) * double(xf[k]) * r;
  const double vrel = std::ldexp(1.0, -8) + std::ldexp(1.0, -20);
  auto dot = [&](size_t row, double* tol) {
    const uint16_t* wr = w.data() + row * in_f;
    double s = 0, a = 0, e = 0;
    for (size_t k = 0; k < in_f; ++k) {
      const double wk = bf(wr[k]);
      s += wk * v[k];
      e += std::fabs(wk * v[k]) * vrel;
      a += std::fabs(wk * v[k]) * (1 + vrel);
    }
    if (with_bias) {
      s += bias[row];
      a += std::fabs(bias[row]);
    }
    *tol = e + f32_sum_tol(in_f_i, a);
    return s;
  };
  double worst = 0;
  for (size_t i = 0; i < n_out; ++i) {
    const double got = out_at(i);
    if (!swiglu) {
      double tol = 0;
      double ref = dot(i, &tol);
      if (!c.empty()) {
        ref += c[i];
        tol += f32_sum_tol(in_f_i, std::fabs(c[i]));
      }
      if (!f32) tol += bf16_round_tol(std::fabs(ref) + tol);
      worst = std::max(worst, std::fabs(got - ref) / tol);
      ASSERT_LE(std::fabs(got - ref), tol) << "row " << i << ": got " << got << ", float64 " << ref;
      continue;
    }
    double tg = 0, tu = 0;
    const double g = dot(i, &tg), u = dot(i + n_out, &tu);
    const double dg = tg + bf16_round_tol(std::fabs(g) + tg), du = tu + bf16_round_tol(std::fabs(u) + tu);
    const double sg = g / (1 + std::exp(-g)), ref = sg * u;
    const double bound = 1.1 * dg * (std::fabs(u) + du) + std::fabs(sg) * du + std::ldexp(std::fabs(ref), -7) + 1e-30;
    worst = std::max(worst, std::fabs(got - ref) / bound);
    ASSERT_LE(std::fabs(got - ref), bound) << "index " << i << ": got " << got << ", float64 " << ref;
  }
  std::printf("[ %s: %zu/%zu outputs and %zu/%zu normed entries bit-equal to rmsnorm + gemv, worst |err|/bound "
              "vs float64 %.3f ]\n",
              what.c_str(), equal, n_out, xn_equal, in_f, worst);
}

TEST(GemvNorm, Bf16Out3072x2048) {
  SKIP_WITHOUT_DEVICE();
  run_norm_case(3072, 2048, Out::Bf16, false, 201);
  run_norm_case(3072, 2048, Out::Bf16, true, 202);
}

TEST(GemvNorm, Swiglu16384x2048) {
  SKIP_WITHOUT_DEVICE();
  run_norm_case(16384, 2048, Out::Swiglu, false, 203);
}

TEST(GemvNorm, F32InPlace2048x2048) {
  SKIP_WITHOUT_DEVICE();
  run_norm_case(2048, 2048, Out::F32InPlace, false, 204);
}

// Every rmsnorm.cu block shape: VPT 1 (in_f 8, 72: one virtual warp), 2 (1024), 4, 8 with 5 virtual warps (4104:
// more than the GEMV block's 4 warps, not a multiple of them), 8192 (ksplit 4) and the largest in_f accepted.
TEST(GemvNorm, OddShapes) {
  SKIP_WITHOUT_DEVICE();
  uint64_t seed = 300;
  for (int in_f : {8, 72, 1024, 4104, 8192, ds::kern::kGemvNormMaxInF}) {
    run_norm_case(7, in_f, Out::Bf16, true, seed++);
    run_norm_case(100, in_f, Out::F32InPlace, false, seed++);
    run_norm_case(14, in_f, Out::Swiglu, true, seed++);
  }
}

TEST(Gemv, Bf16Out3072x2048) {
  SKIP_WITHOUT_DEVICE();
  run_case({3072, 2048, Out::Bf16, false}, 1);
  run_case({3072, 2048, Out::Bf16, true}, 2);
}

TEST(Gemv, F32Out2048x2048WithCAndInPlace) {
  SKIP_WITHOUT_DEVICE();
  run_case({2048, 2048, Out::F32C, true}, 3);
  run_case({2048, 2048, Out::F32InPlace, false}, 4);
  run_case({2048, 2048, Out::F32, false}, 5);  // c null: 0
}

TEST(Gemv, Swiglu16384x2048) {
  SKIP_WITHOUT_DEVICE();
  run_case({16384, 2048, Out::Swiglu, false}, 6);
  run_case({16384, 2048, Out::Swiglu, true}, 7);
}

TEST(Gemv, F32InPlace2048x8192) {
  SKIP_WITHOUT_DEVICE();
  run_case({2048, 8192, Out::F32InPlace, false}, 8);
}

TEST(Gemv, LmHead128256x2048) {
  SKIP_WITHOUT_DEVICE();
  run_case({128256, 2048, Out::F32, false, 7}, 9);  // every 7th row and the last 64 against float64
}

TEST(Gemv, OddShapes) {
  SKIP_WITHOUT_DEVICE();
  uint64_t seed = 100;
  for (int out_f : {1, 7, 100})
    for (int in_f : {8, 72, 4104}) {
      run_case({out_f, in_f, Out::Bf16, true}, seed++);
      run_case({out_f, in_f, Out::F32C, true}, seed++);
      run_case({out_f, in_f, Out::F32InPlace, false}, seed++);
    }
  for (int out_f : {2, 14, 100})
    for (int in_f : {8, 72, 4104}) run_case({out_f, in_f, Out::Swiglu, true}, seed++);
}

TEST(Gemv, Refusals) {
  SKIP_WITHOUT_DEVICE();
  DeviceBuffer dw(64 * 1024 * 2 + 64, "w"), dx(1024 * 2 + 64, "x"), dyb(64 * 2, "yb"), dyf(64 * 4, "yf");
  std::vector<uint16_t> poison_b(64, kBf16NaN);
  DS_CUDA_CHECK(cudaMemcpy(dyb.get(), poison_b.data(), dyb.bytes(), cudaMemcpyHostToDevice));
  ds::kern::GemvParams ok;
  ok.w = dw.as<bf16>();
  ok.x = dx.as<bf16>();
  ok.out_f = 64;
  ok.in_f = 1024;
  ok.y_bf16 = dyb.as<bf16>();
  auto refused = [&](ds::kern::GemvParams p, const char* why) {
    EXPECT_EQ(ds::kern::launch_gemv(p, nullptr), cudaErrorInvalidValue) << why;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << why;
  };
  auto p = ok;
  p.in_f = 1020;
  refused(p, "in_f % 8");
  p = ok;
  p.in_f = 0;
  refused(p, "in_f 0");
  p = ok;
  p.out_f = -1;
  refused(p, "out_f < 0");
  p = ok;
  p.w = ok.w + 1;
  refused(p, "w misaligned");
  p = ok;
  p.x = ok.x + 4;
  refused(p, "x misaligned");
  p = ok;
  p.w = nullptr;
  refused(p, "w null");
  p = ok;
  p.y_bf16 = nullptr;
  refused(p, "no output");
  p = ok;
  p.y_f32 = dyf.as<float>();
  refused(p, "two outputs");
  p = ok;
  p.c = dyf.as<float>();
  refused(p, "c with a bf16 output");
  p = ok;
  p.swiglu = true;
  p.out_f = 63;
  refused(p, "swiglu, odd out_f");
  p = ok;
  p.swiglu = true;
  p.y_bf16 = nullptr;
  p.y_f32 = dyf.as<float>();
  refused(p, "swiglu without y_bf16");
  // The RMSNorm prologue.
  DeviceBuffer dxf(4 * (ds::kern::kGemvNormMaxInF + 8) + 64, "x_f32"), dnw(4 * (ds::kern::kGemvNormMaxInF + 8) + 64, "norm_w");
  auto okn = ok;
  okn.x = nullptr;
  okn.x_f32 = dxf.as<float>();
  okn.norm_w = dnw.as<float>();
  okn.norm_eps = 1e-5f;
  p = okn;
  p.x = ok.x;
  refused(p, "x and x_f32 both set");
  p = ok;
  p.x = nullptr;
  refused(p, "x and x_f32 both null");
  p = okn;
  p.norm_w = nullptr;
  refused(p, "x_f32 without norm_w");
  p = okn;
  p.x_f32 = okn.x_f32 + 1;
  refused(p, "x_f32 misaligned");
  p = okn;
  p.norm_w = okn.norm_w + 2;
  refused(p, "norm_w misaligned");
  p = okn;
  p.in_f = ds::kern::kGemvNormMaxInF + 8;
  p.out_f = 1;
  refused(p, "x_f32 with in_f beyond kGemvNormMaxInF");
  DS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(to_host<uint16_t>(dyb, 64), poison_b) << "a refused call wrote its output";
  // out_f == 0: nothing to do, nothing launched.
  p = ok;
  p.out_f = 0;
  EXPECT_EQ(ds::kern::launch_gemv(p, nullptr), cudaSuccess);
  // And the valid calls go through.
  EXPECT_EQ(ds::kern::launch_gemv(ok, nullptr), cudaSuccess);
  DS_CUDA_CHECK(cudaMemset(dxf.get(), 0, dxf.bytes()));
  DS_CUDA_CHECK(cudaMemset(dnw.get(), 0, dnw.bytes()));
  EXPECT_EQ(ds::kern::launch_gemv(okn, nullptr), cudaSuccess);
  DS_CUDA_CHECK(cudaDeviceSynchronize());
}

// GB/s of W per decoder shape: CUDA events around each launch, median of 50 after warm-up, W rotated over enough
// copies (>= 256 MB in all) that L2 (50 MB on an H100) holds none of them when read again; against the bandwidth
// of a 256 MB device-to-device cudaMemcpy (read + write bytes). Also the mean of 50 back-to-back launches between
// two events (what a CUDA graph of a decoding step sees). Prints only.
TEST(GemvPerf, Bandwidth) {
  const char* env = std::getenv("DS_GEMV_PERF");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set DS_GEMV_PERF=1 to time the GEMV";
  SKIP_WITHOUT_DEVICE();
  cudaDeviceProp prop{};
  DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  DS_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  DS_CUDA_CHECK(cudaEventCreate(&e0));
  DS_CUDA_CHECK(cudaEventCreate(&e1));
  auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };

  // Copy bandwidth.
  const size_t copy_bytes = size_t(256) << 20;
  double copy_gbs = 0;
  {
    DeviceBuffer a(copy_bytes, "copy src"), b(copy_bytes, "copy dst");
    DS_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, copy_bytes, stream));
    std::vector<float> ms;
    for (int i = 0; i < 23; ++i) {
      DS_CUDA_CHECK(cudaEventRecord(e0, stream));
      DS_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
      DS_CUDA_CHECK(cudaEventRecord(e1, stream));
      DS_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      DS_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 3) ms.push_back(t);
    }
    copy_gbs = 2.0 * double(copy_bytes) / (double(median(ms)) * 1e6);
  }
  std::printf("[ %s: device-to-device copy %.0f GB/s (read + write) ]\n", prop.name, copy_gbs);

  struct Shape {
    const char* name;
    int out_f, in_f;
    Out out;
  };
  const Shape shapes[] = {{"3072x2048 bf16 +bias", 3072, 2048, Out::Bf16},
                          {"2048x2048 f32 in place", 2048, 2048, Out::F32InPlace},
                          {"16384x2048 swiglu", 16384, 2048, Out::Swiglu},
                          {"2048x8192 f32 in place", 2048, 8192, Out::F32InPlace},
                          {"128256x2048 f32 (lm_head)", 128256, 2048, Out::F32}};
  Rng rng{77};
  for (const Shape& s : shapes) {
    const size_t w_elems = size_t(s.out_f) * size_t(s.in_f), w_bytes = w_elems * 2;
    const int copies = int(std::max<size_t>(2, ((size_t(256) << 20) + w_bytes - 1) / w_bytes));
    DeviceBuffer dw(w_bytes * size_t(copies), "W copies");
    {
      DeviceBuffer one = to_device(random_bf16(w_elems, rng, 1.f));
      for (int i = 0; i < copies; ++i)
        DS_CUDA_CHECK(cudaMemcpyAsync(dw.as<uint8_t>() + size_t(i) * w_bytes, one.get(), w_bytes,
                                      cudaMemcpyDeviceToDevice, stream));
      DS_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    DeviceBuffer dx = to_device(random_bf16(size_t(s.in_f), rng, 1.f));
    DeviceBuffer dbias = to_device(random_f32(size_t(s.out_f), rng, 1.f));
    DeviceBuffer dy(size_t(s.out_f) * 4, "y");
    DS_CUDA_CHECK(cudaMemsetAsync(dy.get(), 0, dy.bytes(), stream));
    ds::kern::GemvParams p;
    p.x = dx.as<bf16>();
    p.out_f = s.out_f;
    p.in_f = s.in_f;
    p.swiglu = s.out == Out::Swiglu;
    if (s.out == Out::Bf16 || s.out == Out::Swiglu) {
      p.y_bf16 = dy.as<bf16>();
      if (s.out == Out::Bf16) p.bias = dbias.as<float>();
    } else {
      p.y_f32 = dy.as<float>();
      if (s.out == Out::F32InPlace) p.c = p.y_f32;
    }
    auto launch = [&](int i) {
      p.w = reinterpret_cast<const bf16*>(dw.as<uint8_t>() + size_t(i % copies) * w_bytes);
      DS_CUDA_CHECK(ds::kern::launch_gemv(p, stream));
    };
    for (int i = 0; i < 2 * copies; ++i) launch(i);  // warm-up
    std::vector<float> ms;
    for (int i = 0; i < 50; ++i) {
      DS_CUDA_CHECK(cudaEventRecord(e0, stream));
      launch(i);
      DS_CUDA_CHECK(cudaEventRecord(e1, stream));
      DS_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      DS_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    const double med = median(ms);
    DS_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < 50; ++i) launch(i);
    DS_CUDA_CHECK(cudaEventRecord(e1, stream));
    DS_CUDA_CHECK(cudaEventSynchronize(e1));
    float all = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&all, e0, e1));
    const double b2b = double(all) / 50;
    const double gbs = double(w_bytes) / (med * 1e6), gbs_b2b = double(w_bytes) / (b2b * 1e6);
    std::printf("[ %-26s W %7.1f MB x%d: median %8.2f us %7.0f GB/s (%.2f of copy); back-to-back %8.2f us %7.0f GB/s "
                "(%.2f) ]\n",
                s.name, double(w_bytes) / 1e6, copies, med * 1e3, gbs, gbs / copy_gbs, b2b * 1e3, gbs_b2b,
                gbs_b2b / copy_gbs);
  }
  DS_CUDA_CHECK(cudaEventDestroy(e0));
  DS_CUDA_CHECK(cudaEventDestroy(e1));
  DS_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace

#endif  // DS_HAVE_CUDA
