// The host side of the map queries (map_query.h): request checks, pooling rows into a view, the statistics.
#include "engine/core/map_query.h"

#include <algorithm>
#include <cmath>

#include "engine/core/config.h"
#include "engine/core/error.h"

namespace ds {

void mamba_implicit_row(const MambaChannel& ch, int64_t q, int64_t k0, int64_t k1, float* row) {
  const float* Cq = ch.C + q * ch.ld;
  const int64_t end = std::min(k1, q + 1);
  for (int64_t k = std::max<int64_t>(k0, 0); k < end; ++k) {
    const double dc = ch.cum[size_t(q)] - ch.cum[size_t(k)];
    const float* Bk = ch.B + k * ch.ld;
    double acc = 0;
    for (int s = 0; s < ch.S; ++s) acc += double(Cq[s]) * std::exp(ch.A[size_t(s)] * dc) * double(Bk[s]);
    row[k] = float(ch.delta[size_t(k)] * acc);
  }
}

void prepare_mamba_view(const ViewRequest& req, const ModelConfig& cfg, int64_t n, MapView& out, bool zero) {
  if (req.layer >= 0 && req.layer < cfg.layers) {
    const LayerKind k = cfg.kind(req.layer);
    if (!cfg.has_scan(req.layer))
      throw Error("layer " + std::to_string(req.layer) + " is " + (k == LayerKind::Attention ? "an " : "a ") +
                  layer_kind_name(k) + " layer: implicit attention maps are for Mamba layers (their scan)");
    if (req.head < 0 || req.head >= cfg.d_inner)
      throw Error("channel " + std::to_string(req.head) + " does not exist (layer " + std::to_string(req.layer) +
                  "'s scan has " + std::to_string(cfg.d_inner) + " channels)");
  }
  prepare_view(req, int(cfg.layers), int(cfg.d_inner), n, false, 0.f, out, zero);
}

void check_mamba_row(int layer, int channel, int64_t q, const ModelConfig& cfg, int64_t n) {
  if (n <= 0) throw Error("no maps: run a prompt first");
  ViewRequest req;
  req.layer = layer, req.head = channel, req.rows = req.cols = 1;
  MapView probe;
  prepare_mamba_view(req, cfg, n, probe, false);  // the layer and the channel
  if (q < 0 || q >= n)
    throw Error("position " + std::to_string(q) + " is outside the prompt (" + std::to_string(n) + " tokens)");
}

void prepare_view(const ViewRequest& req, int layers, int heads, int64_t n, bool differential, float lambda,
                  MapView& out, bool zero) {
  if (n <= 0) throw Error("no maps: run a prompt first");
  if (req.lambda && differential) lambda = *req.lambda;
  if (req.layer < 0 || req.layer >= layers)
    throw Error("layer " + std::to_string(req.layer) + " does not exist (the model has " + std::to_string(layers) +
                " layers)");
  if (req.head < 0 || req.head >= heads)
    throw Error("head " + std::to_string(req.head) + " does not exist (layers have " + std::to_string(heads) +
                " view heads)");
  const int64_t q1 = req.q1 < 0 ? n : std::min(req.q1, n), k1 = req.k1 < 0 ? n : std::min(req.k1, n);
  const int64_t q0 = std::max<int64_t>(0, req.q0), k0 = std::max<int64_t>(0, req.k0);
  if (q0 >= q1 || k0 >= k1)
    throw Error("empty view rectangle: queries " + std::to_string(q0) + ":" + std::to_string(q1) + ", keys " +
                std::to_string(k0) + ":" + std::to_string(k1) + " of " + std::to_string(n) + " tokens");
  if (req.rows <= 0 || req.cols <= 0 || req.rows > 8192 || req.cols > 8192)
    throw Error("view grid " + std::to_string(req.rows) + "x" + std::to_string(req.cols) +
                ": rows and columns must be between 1 and 8192");
  out.layer = req.layer;
  out.head = req.head;
  out.q0 = q0, out.q1 = q1, out.k0 = k0, out.k1 = k1;
  out.rows = int(std::min<int64_t>(req.rows, q1 - q0));
  out.cols = int(std::min<int64_t>(req.cols, k1 - k0));
  out.pool = req.pool;
  out.differential = differential;
  out.lambda = differential ? lambda : 0.f;
  const size_t cells = size_t(out.rows) * size_t(out.cols);
  for (std::vector<float>* g : {&out.a1, &out.a2, &out.diff}) {
    const size_t want = (g == &out.a2 && !differential) || req.device_out ? 0 : cells;
    if (zero) {
      g->assign(want, 0.f);
    } else {
      g->resize(want);  // a backend that writes every cell: no pass over a grid kept from the previous view
    }
  }
}

void view_add_row(MapView& v, int64_t q, const float* a1, const float* a2) {
  if (q < v.q0 || q >= v.q1) return;
  const int64_t E_r = v.q1 - v.q0, E_c = v.k1 - v.k0;
  const size_t base = size_t(view_block(q - v.q0, E_r, v.rows)) * size_t(v.cols);
  for (int j = 0; j < v.cols; ++j) {
    const int64_t c0 = v.k0 + view_block_start(j, E_c, v.cols), c1 = v.k0 + view_block_start(j + 1, E_c, v.cols);
    // Masked cells (k > q) are 0: in a cell pooled by max they change nothing (the cell starts at 0 and a 0 wins no
    // comparison), by mean they add nothing (view_finish divides by the whole cell). So the row stops at q.
    if (c0 > q) break;
    float& o1 = v.a1[base + size_t(j)];
    float* o2 = a2 ? &v.a2[base + size_t(j)] : nullptr;
    float& od = v.diff[base + size_t(j)];
    for (int64_t k = c0, ce = std::min(c1, q + 1); k < ce; ++k) {
      const float x1 = a1[k], x2 = a2 ? a2[k] : 0.f;
      const float d = x1 - v.lambda * x2;
      if (v.pool == Pool::Mean) {
        o1 += x1;
        if (o2) *o2 += x2;
        od += d;
      } else {
        o1 = std::max(o1, x1);
        if (o2) *o2 = std::max(*o2, x2);
        if (std::fabs(d) > std::fabs(od) || (std::fabs(d) == std::fabs(od) && d > od)) od = d;
      }
    }
  }
}

void view_finish(MapView& v) {
  if (v.pool != Pool::Mean) return;
  const int64_t E_r = v.q1 - v.q0, E_c = v.k1 - v.k0;
  for (int i = 0; i < v.rows; ++i)
    for (int j = 0; j < v.cols; ++j) {
      const double cells = double(view_block_start(i + 1, E_r, v.rows) - view_block_start(i, E_r, v.rows)) *
                           double(view_block_start(j + 1, E_c, v.cols) - view_block_start(j, E_c, v.cols));
      const size_t at = size_t(i) * size_t(v.cols) + size_t(j);
      v.a1[at] = float(v.a1[at] / cells);
      if (!v.a2.empty()) v.a2[at] = float(v.a2[at] / cells);
      v.diff[at] = float(v.diff[at] / cells);
    }
}

std::vector<int64_t> resolve_positions(const std::vector<int64_t>& positions, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t p : positions) {
    const int64_t q = p < 0 ? n + p : p;
    if (q < 0 || q >= n)
      throw Error("position " + std::to_string(p) + " is outside the sequence's " + std::to_string(n) +
                  " tokens (negative positions count from the end: -1 is the last)");
    out.push_back(q);
  }
  return out;
}

void prepare_rows(int layer, int64_t heads, int64_t n, bool differential, const std::vector<int64_t>& positions,
                  MapRows& out) {
  out.layer = layer;
  out.heads = heads;
  out.n = n;
  out.positions = resolve_positions(positions, n);
  const size_t cells = size_t(heads) * out.positions.size() * size_t(n);
  if (out.device_out1 || out.out1) {  // the caller's memory (a1 / a2 stay empty)
    if ((out.device_out1 ? out.device_out2 : out.out2) == nullptr && differential)
      throw Error("map rows: no memory for map 2 of a differential model");
    out.a1.clear(), out.a2.clear();
    if (out.out1 && !out.device_out1) {
      std::fill_n(out.out1, cells, 0.f);
      if (differential) std::fill_n(out.out2, cells, 0.f);
    }
    return;
  }
  out.a1.assign(cells, 0.f);
  out.a2.assign(differential ? cells : 0, 0.f);
}

void check_row_mass(int64_t q, int64_t n, int64_t a0, int64_t a1) {
  if (q < 0 || q >= n)
    throw Error("row " + std::to_string(q) + " is outside the sequence's " + std::to_string(n) + " positions");
  if (a0 < 0 || a0 >= a1 || a1 > q + 1)
    throw Error("span [" + std::to_string(a0) + ", " + std::to_string(a1) + ") is not a non-empty range of row " +
                std::to_string(q) + "'s keys 0.." + std::to_string(q));
}

RowMass row_mass_of(const float* a1, const float* a2, int64_t q, float lambda, int64_t a0, int64_t a1_end) {
  RowMass m;
  for (int64_t k = 0; k <= q; ++k) {
    const double x1 = a1[k], x2 = a2 ? a2[k] : 0.0, d = x1 - double(lambda) * x2;
    const double v[MASS_NMAPS] = {x1, x2, d, std::fabs(d)};
    double* part = k >= a0 && k < a1_end ? m.answer : k == 0 ? m.sink : m.context;
    for (int i = 0; i < MASS_NMAPS; ++i) part[i] += v[i];
  }
  return m;
}

void StatsAccumulator::add_row(int64_t q, const float* a1, const float* a2, float lambda, float ml1, float ml2) {
  double e1 = 0, e2 = 0, absd = 0, dlogd = 0, neg = 0;
  for (int64_t k = 0; k <= q; ++k) {
    const double x1 = a1[k], x2 = a2 ? a2[k] : 0.0;
    if (x1 > 0) e1 -= x1 * std::log(x1);
    if (x2 > 0) e2 -= x2 * std::log(x2);
    const double d = x1 - double(lambda) * x2, ad = std::fabs(d);
    absd += ad;
    if (ad > 0) dlogd += ad * std::log(ad);
    if (d < 0) neg -= d;
    diff_min = std::min(diff_min, float(d));
    diff_max = std::max(diff_max, float(d));
  }
  const double f2 = a2 ? a2[0] : 0.0;
  add_terms(e1, e2, absd > 0 ? std::log(absd) - dlogd / absd : 0.0, a1[0], f2, a1[0] - double(lambda) * f2, neg,
            diff_min, diff_max, ml1, ml2);
}

void StatsAccumulator::add_terms(double e1, double e2, double ediff, double f1, double f2, double fd, double neg,
                                 float dmin, float dmax, float ml1, float ml2) {
  add_sums(e1, e2, ediff, f1, f2, fd, neg, dmin, dmax, ml1, ml2, 1);
}

void StatsAccumulator::add_sums(double e1, double e2, double ediff, double f1, double f2, double fd, double neg,
                                float dmin, float dmax, float ml1, float ml2, int64_t count) {
  entropy1 += e1;
  entropy2 += e2;
  entropy_diff += ediff;
  first1 += f1;
  first2 += f2;
  first_diff += fd;
  neg_mass += neg;
  diff_min = std::min(diff_min, dmin);
  diff_max = std::max(diff_max, dmax);
  max_logit1 = std::max(max_logit1, ml1);
  max_logit2 = std::max(max_logit2, ml2);
  rows += count;
}

HeadStats StatsAccumulator::finish(bool differential) const {
  HeadStats s;
  if (rows == 0) return s;
  const double inv = 1.0 / double(rows);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  s.entropy1 = float(entropy1 * inv);
  s.entropy2 = differential ? float(entropy2 * inv) : nan;
  s.entropy_diff = float(entropy_diff * inv);
  s.first1 = float(first1 * inv);
  s.first2 = differential ? float(first2 * inv) : nan;
  s.first_diff = float(first_diff * inv);
  s.neg_mass = float(neg_mass * inv);
  s.diff_min = diff_min;
  s.diff_max = diff_max;
  s.max_logit1 = max_logit1;
  s.max_logit2 = differential ? max_logit2 : nan;
  return s;
}

}  // namespace ds
