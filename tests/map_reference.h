// Float64 references for the map queries (engine/core/map_query.h), built from a layer's full maps: what a pooled view,
// a row or a head's statistics must be; and the float64 attention itself (maps and outputs) from Q, K and V, with a
// sliding window and K/V from a separate buffer (kernels/attn_params.h). Written from the definitions, independently
// of the engine's pooling code and of the kernels.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include <string>

#include "engine/core/backend.h"
#include "kernels/attn_heads.h"

namespace dstest {

struct RefView {
  int rows = 0, cols = 0;
  std::vector<double> a1, a2, diff;  // [rows, cols]
};

// Block b of E cells in B blocks: [floor(b E / B), floor((b + 1) E / B)).
inline int64_t ref_block_start(int b, int64_t E, int B) { return int64_t(b) * E / B; }

inline RefView ref_view(const ds::LayerMaps& m, int head, int64_t q0, int64_t q1, int64_t k0, int64_t k1, int R, int C,
                        bool mean, double lambda) {
  const int64_t n = m.n;
  RefView v;
  v.rows = int(std::min<int64_t>(R, q1 - q0));
  v.cols = int(std::min<int64_t>(C, k1 - k0));
  const bool two = !m.a2.empty();
  const size_t cells = size_t(v.rows) * size_t(v.cols);
  v.a1.assign(cells, 0.0);
  v.a2.assign(two ? cells : 0, 0.0);
  v.diff.assign(cells, 0.0);
  for (int i = 0; i < v.rows; ++i)
    for (int j = 0; j < v.cols; ++j) {
      const int64_t r0 = q0 + ref_block_start(i, q1 - q0, v.rows), r1 = q0 + ref_block_start(i + 1, q1 - q0, v.rows);
      const int64_t c0 = k0 + ref_block_start(j, k1 - k0, v.cols), c1 = k0 + ref_block_start(j + 1, k1 - k0, v.cols);
      double s1 = 0, s2 = 0, sd = 0, m1 = 0, m2 = 0, md = 0;
      for (int64_t q = r0; q < r1; ++q)
        for (int64_t k = c0; k < c1; ++k) {
          const double x1 = m.a1[(size_t(head) * size_t(n) + size_t(q)) * size_t(n) + size_t(k)];
          const double x2 = two ? m.a2[(size_t(head) * size_t(n) + size_t(q)) * size_t(n) + size_t(k)] : 0.0;
          const double d = two ? x1 - lambda * x2 : x1;
          s1 += x1, s2 += x2, sd += d;
          m1 = std::max(m1, x1), m2 = std::max(m2, x2);
          if (std::fabs(d) > std::fabs(md) || (std::fabs(d) == std::fabs(md) && d > md)) md = d;
        }
      const double cnt = double(r1 - r0) * double(c1 - c0);
      const size_t at = size_t(i) * size_t(v.cols) + size_t(j);
      v.a1[at] = mean ? s1 / cnt : m1;
      if (two) v.a2[at] = mean ? s2 / cnt : m2;
      v.diff[at] = mean ? sd / cnt : md;
    }
  return v;
}

struct RefStats {
  double entropy1 = 0, entropy2 = 0, entropy_diff = 0, first1 = 0, first2 = 0, first_diff = 0, neg_mass = 0;
  double diff_min = std::numeric_limits<double>::infinity(), diff_max = -std::numeric_limits<double>::infinity();
};

// The first key query row `row` sees under a sliding window of `window` keys (0: none): max(0, row - window + 1).
inline int64_t ref_first_key(int64_t row, int window) {
  return window > 0 ? std::max<int64_t>(0, row - int64_t(window) + 1) : 0;
}

// The statistics of one query row (kernels/attn_maps.h's MAP_*, before any averaging over rows) from its
// probabilities r1 (and r2 for differential heads, else null) over the keys [lo, hi] the row sees; the first-token
// values read key 0 whatever the band (0 outside it). diff_min / diff_max: over the band only.
template <class T>
RefStats ref_row_stats(const T* r1, const T* r2, int64_t lo, int64_t hi, double lambda) {
  const bool two = r2 != nullptr;
  RefStats s;
  double abs_sum = 0;
  for (int64_t k = lo; k <= hi; ++k) abs_sum += std::fabs(double(r1[k]) - (two ? lambda * double(r2[k]) : 0.0));
  for (int64_t k = lo; k <= hi; ++k) {
    const double x1 = double(r1[k]), x2 = two ? double(r2[k]) : 0.0, d = x1 - lambda * x2;
    if (x1 > 0) s.entropy1 -= x1 * std::log(x1);
    if (x2 > 0) s.entropy2 -= x2 * std::log(x2);
    const double pd = abs_sum > 0 ? std::fabs(d) / abs_sum : 0.0;
    if (pd > 0) s.entropy_diff -= pd * std::log(pd);
    if (d < 0) s.neg_mass -= d;
    s.diff_min = std::min(s.diff_min, d);
    s.diff_max = std::max(s.diff_max, d);
  }
  s.first1 = double(r1[0]);
  s.first2 = two ? double(r2[0]) : 0.0;
  s.first_diff = double(r1[0]) - (two ? lambda * double(r2[0]) : 0.0);
  return s;
}

// A head's statistics: the rows' means of the summed terms, the extremes of D. `window`: the sliding window the
// maps were made with (0: none), so that row q's statistics see its keys ref_first_key(q, window) .. q only.
inline RefStats ref_stats(const ds::LayerMaps& m, int head, double lambda, int window = 0) {
  const int64_t n = m.n;
  const bool two = !m.a2.empty();
  RefStats s;
  for (int64_t q = 0; q < n; ++q) {
    const float* r1 = m.a1.data() + (size_t(head) * size_t(n) + size_t(q)) * size_t(n);
    const float* r2 = two ? m.a2.data() + (size_t(head) * size_t(n) + size_t(q)) * size_t(n) : nullptr;
    const RefStats r = ref_row_stats(r1, r2, ref_first_key(q, window), q, two ? lambda : 0.0);
    s.entropy1 += r.entropy1, s.entropy2 += r.entropy2, s.entropy_diff += r.entropy_diff;
    s.first1 += r.first1, s.first2 += r.first2, s.first_diff += r.first_diff, s.neg_mass += r.neg_mass;
    s.diff_min = std::min(s.diff_min, r.diff_min);
    s.diff_max = std::max(s.diff_max, r.diff_max);
  }
  for (double* x : {&s.entropy1, &s.entropy2, &s.entropy_diff, &s.first1, &s.first2, &s.first_diff, &s.neg_mass})
    *x /= double(n);
  return s;
}

// A layer's attention inputs in host memory as float64, in the fused-QKV layout of kernels/attn_params.h (rows of
// row_stride values, sequences batch_stride apart, Q / K / V heads from q_off / k_off / v_off): Q from `qkv`, K and V
// from `kv` when it is set (cross-layer KV reuse), else from `qkv`. Query row i sees keys ref_first_key(i, window)
// .. i. Heads follow kernels/attn_heads.h (DiffLlama's mapping for differential heads).
struct RefAttnInputs {
  const double* qkv = nullptr;
  const double* kv = nullptr;
  int64_t row_stride = 0, batch_stride = 0, q_off = 0, k_off = 0, v_off = 0;
  int n = 0, heads = 0, kv_heads = 0, d = 0;
  bool diff = true;
  int window = 0;
  double scale = 0;  // 0: 1/sqrt(d)
  int logit_bits = 0;  // > 0: each row's logits fake-quantised (symmetric absmax over the row's keys, half to even)

  const double* row(const double* base, int b, int64_t t) const { return base + b * batch_stride + t * row_stride; }
  const double* q(int b, int64_t t, int head) const { return row(qkv, b, t) + q_off + int64_t(head) * d; }
  const double* k(int b, int64_t t, int kv_head) const {
    return row(kv ? kv : qkv, b, t) + k_off + int64_t(kv_head) * d;
  }
  const double* v(int b, int64_t t, int kv_head) const {
    return row(kv ? kv : qkv, b, t) + v_off + int64_t(kv_head) * d;
  }
  double logit_scale() const { return scale > 0 ? scale : 1.0 / std::sqrt(double(d)); }
};

// Map m (0, or 1 for a differential head's second map) of view head h at query row i of sequence b: the float64
// probabilities over all n keys in a (0 right of the diagonal and left of the window), and the largest |logit|
// (q.k * scale) among the row's keys.
inline void ref_map_row(const RefAttnInputs& in, int b, int h, int m, int64_t i, std::vector<double>& a,
                        double* max_abs_logit = nullptr) {
  const ds::kern::ViewHeadMap hm = ds::kern::view_head_map(in.diff, h, in.heads, in.kv_heads);
  const int64_t lo = ref_first_key(i, in.window);
  const double* q = in.q(b, i, hm.q[m]);
  a.assign(size_t(in.n), 0.0);
  double mx = -std::numeric_limits<double>::infinity(), mabs = 0;
  for (int64_t k = lo; k <= i; ++k) {
    const double* kr = in.k(b, k, hm.k[m]);
    double dot = 0;
    for (int e = 0; e < in.d; ++e) dot += q[e] * kr[e];
    a[size_t(k)] = dot * in.logit_scale();
    mx = std::max(mx, a[size_t(k)]);
    mabs = std::max(mabs, std::fabs(a[size_t(k)]));
  }
  if (in.logit_bits > 0 && mabs > 0) {  // the published what-if: step = amax / (2^(b-1) - 1), round half to even
    const double step = mabs / double((1 << (in.logit_bits - 1)) - 1);
    mx = -std::numeric_limits<double>::infinity();
    for (int64_t k = lo; k <= i; ++k) mx = std::max(mx, a[size_t(k)] = std::nearbyint(a[size_t(k)] / step) * step);
  }
  double l = 0;
  for (int64_t k = lo; k <= i; ++k) l += (a[size_t(k)] = std::exp(a[size_t(k)] - mx));
  for (int64_t k = lo; k <= i; ++k) a[size_t(k)] /= l;
  if (max_abs_logit) *max_abs_logit = mabs;
}

// The attention output of view head h at query row i of sequence b (view_width values): plain, A V; differential,
// out_scale * RMSNorm_2d(A1 V - lambda A2 V) with V = [V of kv head v[0] | V of kv head v[1]].
inline void ref_attention_row(const RefAttnInputs& in, int b, int h, int64_t i, double lambda, double out_scale,
                              double eps, std::vector<double>& o) {
  const ds::kern::ViewHeadMap hm = ds::kern::view_head_map(in.diff, h, in.heads, in.kv_heads);
  const int d = in.d, vw = ds::kern::view_width(in.diff, d);
  o.assign(size_t(vw), 0.0);
  std::vector<double> a;
  for (int m = 0; m < (in.diff ? 2 : 1); ++m) {
    ref_map_row(in, b, h, m, i, a);
    const double w = m == 0 ? 1.0 : -lambda;
    for (int64_t k = ref_first_key(i, in.window); k <= i; ++k)
      for (int e = 0; e < vw; ++e) o[size_t(e)] += w * a[size_t(k)] * in.v(b, k, hm.v[e < d ? 0 : 1])[e % d];
  }
  if (in.diff) {
    double ss = 0;
    for (double x : o) ss += x * x;
    const double f = out_scale / std::sqrt(ss / vw + eps);
    for (double& x : o) x *= f;
  }
}

inline double max_abs_diff(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) m = std::max(m, std::fabs(double(got[i]) - want[i]));
  return m;
}

// Views of the implicit attention of Mamba layer `layer` (Backend::mamba_view) against float64 pooling of a
// reference's maps of some of its channels: `maps` [channels.size(), n, n]. The whole map at full resolution and
// pooled (grids that do not divide it), a rectangle cutting the diagonal, with both poolings. Errors are relative to
// the largest |M| of the channel; returns how many views were compared.
inline int expect_implicit_views(ds::Backend& be, int layer, const std::vector<float>& channels,
                                 const std::vector<float>& maps, int64_t n, double rel_tol, const std::string& what) {
  ds::LayerMaps ref;  // one "head" per stored channel
  ref.heads = int64_t(channels.size());
  ref.n = n;
  ref.a1 = maps;
  struct Rect {
    int64_t q0, q1, k0, k1;
    int rows, cols;
  };
  const Rect rects[] = {{0, n, 0, n, int(n), int(n)}, {0, n, 0, n, 7, 5}, {n / 3, n, 1, n - 2, 4, 6}};
  int compared = 0;
  for (size_t ci = 0; ci < channels.size(); ++ci) {
    double scale = 0;
    for (size_t i = ci * size_t(n * n); i < (ci + 1) * size_t(n * n); ++i) scale = std::max(scale, double(std::fabs(maps[i])));
    for (const Rect& r : rects)
      for (bool mean : {false, true}) {
        ds::ViewRequest q;
        q.layer = layer;
        q.head = int(channels[ci]);
        q.q0 = r.q0, q.q1 = r.q1, q.k0 = r.k0, q.k1 = r.k1, q.rows = r.rows, q.cols = r.cols;
        q.pool = mean ? ds::Pool::Mean : ds::Pool::Max;
        ds::MapView v;
        be.mamba_view(q, v);
        const RefView want = ref_view(ref, int(ci), r.q0, r.q1, r.k0, r.k1, r.rows, r.cols, mean, 0.0);
        const std::string at = what + " layer " + std::to_string(layer) + " channel " + std::to_string(q.head) +
                               " rect " + std::to_string(&r - rects) + (mean ? " mean" : " max");
        EXPECT_FALSE(v.differential) << at;
        EXPECT_TRUE(v.a2.empty()) << at;
        EXPECT_EQ(v.a1, v.diff) << at;
        // Max pooling keeps the entry of largest magnitude with its sign: where a block holds a near tie of opposite
        // signs, two computations may keep different entries, so only the magnitude must agree (full resolution,
        // one entry per cell, checks the signs).
        std::vector<float> got = v.diff;
        std::vector<double> expect = want.diff;
        if (!mean && (r.rows < r.q1 - r.q0 || r.cols < r.k1 - r.k0)) {
          for (float& x : got) x = std::fabs(x);
          for (double& x : expect) x = std::fabs(x);
        }
        EXPECT_LE(max_abs_diff(got, expect), rel_tol * scale) << at << " (largest |M| " << scale << ")";
        ++compared;
      }
    // The exact rows (Backend::mamba_row): keys 0..q, nothing after.
    for (const int64_t q : {int64_t(0), n / 2, n - 1}) {
      std::vector<float> row;
      be.mamba_row(layer, int(channels[ci]), q, row);
      const std::string at = what + " layer " + std::to_string(layer) + " channel " +
                             std::to_string(int(channels[ci])) + " row " + std::to_string(q);
      EXPECT_EQ(row.size(), size_t(q + 1)) << at;
      if (row.size() != size_t(q + 1)) continue;
      double err = 0;
      for (int64_t k = 0; k <= q; ++k)
        err = std::max(err, std::fabs(double(row[size_t(k)]) - double(maps[ci * size_t(n * n) + size_t(q * n + k)])));
      EXPECT_LE(err, rel_tol * scale) << at << " (largest |M| " << scale << ")";
      ++compared;
    }
  }
  return compared;
}

// Every query of the backend's last forward against the float64 references built from the same backend's full maps
// (layer_maps): views of several rectangles (the whole map, grids that do not divide it, a rectangle cutting the
// diagonal, one cell) with both poolings, rows at the ends and the middle, and every head's statistics. `lambda`:
// the lambda each layer ran with; `window`: the sliding window of the layers' attention (0: none), whose keys alone
// the statistics see.
inline void expect_queries_match_maps(ds::Backend& be, const ds::ModelConfig& c, const std::vector<float>& lambda,
                                      double tol, const std::string& what, int window_override = 0) {
  for (int l = 0; l < int(c.layers); ++l) {
    if (!c.has_maps(l)) continue;  // hybrids: Mamba and GMU layers have none
    const int window = window_override ? window_override : int(c.layer_window(l));
    ds::LayerMaps m;
    be.layer_maps(l, m);
    const int64_t n = m.n;
    const double lam = c.is_diff() ? lambda[size_t(l)] : 0.0;
    const std::vector<ds::HeadStats> st = be.head_stats(l);
    ASSERT_EQ(st.size(), size_t(m.heads)) << what;
    for (int h = 0; h < int(m.heads); ++h) {
      const std::string at = what + " layer " + std::to_string(l) + " head " + std::to_string(h);
      struct Rect {
        int64_t q0, q1, k0, k1;
        int R, C;
      };
      const std::vector<Rect> rects = {{0, n, 0, n, int(n), int(n)},
                                       {0, n, 0, n, 3, 5},
                                       {n / 3, n, 0, std::max<int64_t>(1, n - 1), 2, 4},
                                       {n - 1, n, 0, n, 7, 2},
                                       {0, 1, 0, 1, 4, 4}};
      for (const Rect& r : rects)
        for (bool mean : {false, true}) {
          ds::ViewRequest q;
          q.layer = l, q.head = h, q.q0 = r.q0, q.q1 = r.q1, q.k0 = r.k0, q.k1 = r.k1, q.rows = r.R, q.cols = r.C;
          q.pool = mean ? ds::Pool::Mean : ds::Pool::Max;
          ds::MapView v;
          be.map_view(q, v);
          const RefView ref = ref_view(m, h, r.q0, r.q1, r.k0, r.k1, r.R, r.C, mean, lam);
          const std::string vw = at + " view " + std::to_string(r.q0) + ":" + std::to_string(r.q1) + "," +
                                 std::to_string(r.k0) + ":" + std::to_string(r.k1) + " grid " + std::to_string(r.R) +
                                 "x" + std::to_string(r.C) + (mean ? " mean" : " max");
          ASSERT_EQ(v.rows, ref.rows) << vw;
          ASSERT_EQ(v.cols, ref.cols) << vw;
          EXPECT_EQ(v.differential, c.is_diff()) << vw;
          EXPECT_LE(max_abs_diff(v.a1, ref.a1), tol) << vw << " a1";
          if (c.is_diff()) EXPECT_LE(max_abs_diff(v.a2, ref.a2), tol) << vw << " a2";
          else EXPECT_TRUE(v.a2.empty()) << vw;
          EXPECT_LE(max_abs_diff(v.diff, ref.diff), tol * (1 + std::fabs(lam))) << vw << " diff";
        }
      const RefStats rs = ref_stats(m, h, lam, window);
      const ds::HeadStats& s = st[size_t(h)];
      EXPECT_NEAR(s.entropy1, rs.entropy1, 20 * tol) << at;  // a log of each probability: looser than the maps
      EXPECT_NEAR(s.entropy_diff, rs.entropy_diff, 20 * tol) << at;
      EXPECT_NEAR(s.first1, rs.first1, tol) << at;
      EXPECT_NEAR(s.first_diff, rs.first_diff, tol * (1 + std::fabs(lam))) << at;
      EXPECT_NEAR(s.neg_mass, rs.neg_mass, tol * (1 + std::fabs(lam))) << at;
      EXPECT_NEAR(s.diff_min, rs.diff_min, tol * (1 + std::fabs(lam))) << at;
      EXPECT_NEAR(s.diff_max, rs.diff_max, tol * (1 + std::fabs(lam))) << at;
      if (c.is_diff()) {
        EXPECT_NEAR(s.entropy2, rs.entropy2, 20 * tol) << at;
        EXPECT_NEAR(s.first2, rs.first2, tol) << at;
      } else {
        EXPECT_TRUE(std::isnan(s.entropy2) && std::isnan(s.first2) && std::isnan(s.max_logit2)) << at;
      }
      // The largest |logit| bounds each row's spread: max_k log A - min_k log A <= 2 max|logit|.
      double spread = 0;
      for (int64_t q = 0; q < n; ++q) {
        const float* r1 = m.a1.data() + (size_t(h) * size_t(n) + size_t(q)) * size_t(n);
        double lo = 1e300, hi = 0;
        for (int64_t k = ref_first_key(q, window); k <= q; ++k)
          lo = std::min(lo, double(r1[k])), hi = std::max(hi, double(r1[k]));
        if (lo > 0) spread = std::max(spread, std::log(hi / lo));
      }
      EXPECT_GE(2.0 * s.max_logit1 + 1e-3, spread) << at;
    }
    // Rows: the first, the middle and the last position, also as -1.
    const std::vector<int64_t> pos = {0, n / 2, -1};
    ds::MapRows rows;
    be.map_rows(l, pos, rows);
    ASSERT_EQ(rows.positions.size(), pos.size()) << what;
    EXPECT_EQ(rows.positions.back(), n - 1) << what;
    for (int h = 0; h < int(m.heads); ++h)
      for (size_t i = 0; i < pos.size(); ++i)
        for (int64_t k = 0; k < n; ++k) {
          const size_t at = (size_t(h) * pos.size() + i) * size_t(n) + size_t(k);
          const size_t src = (size_t(h) * size_t(n) + size_t(rows.positions[i])) * size_t(n) + size_t(k);
          ASSERT_NEAR(rows.a1[at], m.a1[src], tol) << what << " rows layer " << l;
          if (c.is_diff()) ASSERT_NEAR(rows.a2[at], m.a2[src], tol) << what << " rows layer " << l;
        }
    EXPECT_THROW(be.map_rows(l, {n}, rows), ds::Error) << what;
  }
  ds::ViewRequest bad;
  bad.layer = int(c.layers);
  ds::MapView v;
  EXPECT_THROW(be.map_view(bad, v), ds::Error) << what;
  bad.layer = 0, bad.head = int(c.view_heads());
  EXPECT_THROW(be.map_view(bad, v), ds::Error) << what;
}

}  // namespace dstest
