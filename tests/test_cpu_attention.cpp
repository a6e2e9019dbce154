// The CPU backend's tiled attention (engine/cpu/detail/backend_cpu_attention.h) against a float64 reference written from the
// definition: causal (optionally sliding-window) softmax(q k^T scale) V, and for differential heads
// softmax(q0 k0^T) [V0 | V1] - lambda softmax(q1 k1^T) [V0 | V1]. Fresh random inputs, output poisoned first, shapes
// that leave partial tiles, query rows starting past 0 (decoding), windows that cut tiles, and several threads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/detail/backend_cpu_attention.h"

namespace {

struct Shape {
  int64_t n, s, d, window;
  bool diff;
  int threads;
};

// out [m, vw] in double, rows for positions [s, n)
std::vector<double> reference(const Shape& sh, const std::vector<float>* q, const std::vector<float>* k,
                              const std::vector<float>* v, float scale, float lambda) {
  const int64_t m = sh.n - sh.s, d = sh.d, vw = sh.diff ? 2 * d : d;
  std::vector<double> out(size_t(m * vw), 0.0);
  for (int map = 0; map < (sh.diff ? 2 : 1); ++map)
    for (int64_t r = 0; r < m; ++r) {
      const int64_t p = sh.s + r, lo = sh.window > 0 ? std::max<int64_t>(0, p - sh.window + 1) : 0;
      std::vector<double> sc(size_t(p + 1), 0.0);
      double mx = -INFINITY;
      for (int64_t j = lo; j <= p; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += double(q[map][size_t(r * d + c)]) * double(k[map][size_t(j * d + c)]);
        sc[size_t(j)] = acc * scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = lo; j <= p; ++j) sum += sc[size_t(j)] = std::exp(sc[size_t(j)] - mx);
      const double sign = map == 0 ? 1.0 : -double(lambda);
      for (int64_t j = lo; j <= p; ++j)
        for (int64_t c = 0; c < vw; ++c) {
          const double val = c < d ? v[0][size_t(j * d + c)] : v[1][size_t(j * d + c - d)];
          out[size_t(r * vw + c)] += sign * sc[size_t(j)] / sum * val;
        }
    }
  return out;
}

void check_shape(const Shape& sh, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t m = sh.n - sh.s, d = sh.d, vw = sh.diff ? 2 * d : d;
  std::vector<float> q[2], k[2], v[2];
  for (int i = 0; i < 2; ++i) {
    q[i].resize(size_t(m * d));
    k[i].resize(size_t(sh.n * d));
    v[i].resize(size_t(sh.n * d));
    for (auto* x : {&q[i], &k[i], &v[i]})
      for (float& f : *x) f = 2.f * nd(rng);  // scores of a few units: peaked rows, not uniform ones
  }
  const float scale = float(1.0 / std::sqrt(double(d))), lambda = 0.37f;
  std::vector<float> out(size_t(m * vw), std::numeric_limits<float>::quiet_NaN());  // poison
  ds::cpu_attn::Pool pool(sh.threads);
  const int64_t blocks = (m + ds::cpu_attn::kBlockQ - 1) / ds::cpu_attn::kBlockQ;
  std::vector<std::vector<float>> ws(size_t(pool.threads()),
                                     std::vector<float>(size_t(ds::cpu_attn::scratch_floats(d, vw)), NAN));
  pool.run(blocks, [&](int64_t bi, int t) {
    ds::cpu_attn::Block b;
    b.p0 = sh.s + bi * ds::cpu_attn::kBlockQ;
    b.p1 = std::min(sh.n, b.p0 + ds::cpu_attn::kBlockQ);
    b.s = sh.s;
    b.window = sh.window;
    b.d = d;
    b.vw = vw;
    b.scale = scale;
    b.maps = sh.diff ? 2 : 1;
    b.c2 = lambda;
    for (int i = 0; i < 2; ++i) b.q[i] = q[i].data(), b.k[i] = k[i].data();
    b.ldq = b.ldk = d;
    b.v[0] = v[0].data();
    b.v[1] = sh.diff ? v[1].data() : nullptr;
    b.ldv = d;
    b.out = out.data();
    b.ldo = vw;
    ds::cpu_attn::run_block(b, ws[size_t(t)].data());
  });
  const std::vector<double> ref = reference(sh, q, k, v, scale, lambda);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " was not written";
    worst = std::max(worst, std::fabs(double(out[i]) - ref[i]) / (1.0 + std::fabs(ref[i])));
  }
  EXPECT_LT(worst, 2e-5) << "n " << sh.n << " s " << sh.s << " d " << sh.d << " window " << sh.window << " diff "
                         << sh.diff << " (kernel " << ds::cpu_attn::isa() << ")";
}

// Every instance this machine can run: the generic one always, the AVX2 + FMA one where the CPU has it.
std::vector<const char*> instances() {
  std::vector<const char*> out{"generic"};
  const std::string best = ds::cpu_attn::isa();
  if (best != "generic") out.push_back(ds::cpu_attn::isa());
  return out;
}

TEST(CpuAttention, MatchesFloat64) {
  const Shape shapes[] = {
      {1, 0, 32, 0, true, 1},     {5, 0, 4, 0, true, 2},       {64, 0, 32, 0, true, 2},   {65, 0, 32, 0, false, 2},
      {200, 0, 7, 0, true, 3},    {300, 0, 64, 0, false, 2},   {257, 0, 128, 0, true, 2}, {333, 0, 32, 50, true, 2},
      {400, 0, 24, 64, false, 2}, {190, 0, 16, 130, true, 1},  {300, 299, 32, 0, true, 2}, {300, 137, 32, 0, false, 2},
      {500, 480, 32, 100, true, 2}, {129, 70, 80, 0, true, 4},
  };
  const std::string best = ds::cpu_attn::isa();
  for (const char* isa : instances()) {
    ASSERT_TRUE(ds::cpu_attn::use_isa(isa)) << isa;
    uint32_t seed = 1;
    for (const Shape& sh : shapes) check_shape(sh, seed++);
  }
  ASSERT_TRUE(ds::cpu_attn::use_isa(best.c_str()));
}

TEST(CpuAttention, SoftmaxRowMatchesFloat64) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 8.f);
  for (int64_t n : {1, 7, 8, 9, 100, 1000}) {
    std::vector<float> r(static_cast<size_t>(n));
    for (float& f : r) f = nd(rng);
    const int64_t lo = n / 3, hi = n - 1 - n / 5;
    std::vector<double> ref(size_t(n), 0.0);
    double mx = -INFINITY, sum = 0, mabs = 0;
    for (int64_t j = lo; j <= hi; ++j) mx = std::max(mx, double(r[size_t(j)])), mabs = std::max(mabs, std::fabs(double(r[size_t(j)])));
    for (int64_t j = lo; j <= hi; ++j) sum += ref[size_t(j)] = std::exp(double(r[size_t(j)]) - mx);
    for (double& x : ref) x /= sum;
    const float got_mabs = ds::cpu_attn::softmax_row(r.data(), n, lo, hi);
    EXPECT_FLOAT_EQ(got_mabs, float(mabs));
    for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(r[size_t(j)], ref[size_t(j)], 1e-6 * (1 + ref[size_t(j)])) << j;
  }
}

// The statistics' row sums (vectorised logarithms) against float64, zeros and a row long enough for several chunks.
TEST(CpuAttention, RowTermsMatchFloat64) {
  const std::string best = ds::cpu_attn::isa();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (const char* isa : instances()) {
    ASSERT_TRUE(ds::cpu_attn::use_isa(isa));
    for (int64_t count : {1, 7, 8, 33, 600, 3000}) {
      std::vector<float> a1(static_cast<size_t>(count)), a2(static_cast<size_t>(count));
      for (int64_t k = 0; k < count; ++k) {
        a1[size_t(k)] = k % 5 == 0 ? 0.f : u(rng) * u(rng);  // some exact zeros (masked or underflowed entries)
        a2[size_t(k)] = k % 7 == 0 ? 0.f : u(rng);
      }
      for (const float lam : {0.f, 0.6f, -0.3f}) {
        for (const bool two : {true, false}) {
          double e1 = 0, e2 = 0, absd = 0, dlogd = 0, neg = 0, mn = INFINITY, mx = -INFINITY;
          for (int64_t k = 0; k < count; ++k) {
            const double x1 = a1[size_t(k)], x2 = two ? a2[size_t(k)] : 0.0, d = x1 - double(lam) * x2;
            if (x1 > 0) e1 -= x1 * std::log(x1);
            if (x2 > 0) e2 -= x2 * std::log(x2);
            absd += std::fabs(d);
            if (d != 0) dlogd += std::fabs(d) * std::log(std::fabs(d));
            if (d < 0) neg -= d;
            mn = std::min(mn, d), mx = std::max(mx, d);
          }
          ds::cpu_attn::RowTerms t;
          ds::cpu_attn::row_terms(a1.data(), two ? a2.data() : nullptr, count, lam, t);
          const double tol = 2e-6 * double(count);
          EXPECT_NEAR(t.e1, e1, tol) << isa << " " << count;
          EXPECT_NEAR(t.e2, e2, tol) << isa << " " << count;
          EXPECT_NEAR(t.absd, absd, tol) << isa << " " << count;
          EXPECT_NEAR(t.dlogd, dlogd, tol) << isa << " " << count;
          EXPECT_NEAR(t.neg, neg, tol) << isa << " " << count;
          EXPECT_NEAR(t.dmin, mn, 1e-6);
          EXPECT_NEAR(t.dmax, mx, 1e-6);
        }
      }
    }
  }
  ASSERT_TRUE(ds::cpu_attn::use_isa(best.c_str()));
}

// Scores far apart (a row whose later keys score hundreds of units above the first tile's) must rescale exactly.
TEST(CpuAttention, LargeScoreJumpsBetweenTiles) {
  Shape sh{260, 0, 16, 0, true, 2};
  check_shape(sh, 99);  // baseline
  std::mt19937 rng(5);
  // keys scaled so that scores span about +-300 units
  std::vector<float> q(size_t(260 * 16)), k(size_t(260 * 16)), v(size_t(260 * 16));
  for (size_t i = 0; i < q.size(); ++i) q[i] = 1.f, k[i] = float(i / 16) * 0.3f, v[i] = float(int(rng() % 7) - 3);
  std::vector<float> out(size_t(260 * 16), NAN);
  std::vector<float> ws(size_t(ds::cpu_attn::scratch_floats(16, 16)));
  for (int64_t p0 = 0; p0 < 260; p0 += ds::cpu_attn::kBlockQ) {
    ds::cpu_attn::Block b;
    b.p0 = p0, b.p1 = std::min<int64_t>(260, p0 + ds::cpu_attn::kBlockQ), b.d = 16, b.vw = 16, b.scale = 0.25f;
    b.q[0] = q.data(), b.k[0] = k.data(), b.v[0] = v.data(), b.ldq = b.ldk = b.ldv = b.ldo = 16, b.out = out.data();
    ds::cpu_attn::run_block(b, ws.data());
  }
  // scores q.k * 0.25, about 1.2 j: each row is dominated by its last keys, hundreds of units above its first tile's
  // (f32 scores of ~300 carry ~1e-5 relative error into the exponentials: the tolerance allows that, not a lost rescale)
  auto score = [&](int64_t j) { return 0.25 * 16.0 * double(k[size_t(j * 16)]); };
  for (int64_t p = 0; p < 260; ++p)
    for (int64_t c = 0; c < 16; ++c) {
      double num = 0, den = 0;
      for (int64_t j = 0; j <= p; ++j) {
        const double e = std::exp(score(j) - score(p));
        num += e * v[size_t(j * 16 + c)];
        den += e;
      }
      ASSERT_NEAR(out[size_t(p * 16 + c)], num / den, 1e-4 * (1 + std::fabs(num / den))) << p << "," << c;
    }
}

}  // namespace
