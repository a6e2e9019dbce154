// Attention map -> RGBA pixels. See heatmap_image.h.
#include "heatmap_image.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ds::gui {

ColorScale heatmap_scale(const float* m, const GridGeom& g, const HeatmapStyle& st) {
  ColorScale s;
  s.diverging = st.diverging;
  s.log = st.log;
  // Sequential log: four decades below the maximum. Symmetric log of the difference: linear within 1% of the
  // largest magnitude (a smaller threshold saturates every cell).
  s.floor = st.diverging ? 1e-2f : 1e-4f;
  // Magnitudes of the cells that set the range: not wholly masked, and not the block of query 0 and key 0, because
  // query 0 can only attend to itself (A = 1 there) and would pin every map's range at 1 (unless it is all there is).
  std::vector<float> mags;
  mags.reserve(size_t(g.rows) * size_t(g.cols));
  float top = 0;
  const bool skip00 = g.row_start(0) == 0 && g.col_start(0) == 0 && (g.rows > 1 || g.cols > 1);
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.cols; ++j) {
      if (g.masked(i, j) || (skip00 && i == 0 && j == 0))
        continue;
      const float v = m[size_t(i) * g.cols + j];
      if (!std::isfinite(v))
        continue;
      const float a = st.diverging ? std::fabs(v) : std::max(v, 0.0f);
      top = std::max(top, a);
      mags.push_back(a);
    }
  float hi = top;
  if (st.robust && !mags.empty()) {
    // Long causal rows spread attention thin while the first rows concentrate it: a max-based range leaves most
    // of a long map in the lowest colours. The 99.5th percentile keeps the range where the cells are.
    auto at = mags.begin() + std::ptrdiff_t(double(mags.size() - 1) * 0.995);
    std::nth_element(mags.begin(), at, mags.end());
    if (*at > 0)
      hi = *at;
  }
  s.clipped = hi < top;
  s.hi = std::max(hi, 1e-12f);
  s.lo = st.diverging ? -s.hi : 0.0f;
  return s;
}

namespace {

// log2 from the float's exponent plus a cubic in the mantissa: within 0.005 of std::log2 over all normal
// floats, far below one of the 256 colour steps, and several times faster for 16 M cells.
inline float fast_log2(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const float e = float(int((bits >> 23) & 0xff) - 127);
  bits = (bits & 0x007fffffu) | 0x3f800000u;  // mantissa in [1, 2)
  float m;
  std::memcpy(&m, &bits, 4);
  return e + ((0.15824871f * m - 1.05187502f) * m + 3.04788415f) * m - 2.15419367f;
}

// Maps a value to a LUT index 0..255 for one scale; the three kinds get their own straight-line code.
struct IndexFn {
  enum Kind { Linear, Log, Generic } kind = Generic;
  float a = 0, b = 0, lo = 0;  // Linear: t = v*a + b; Log: t = (log2(max(v, lo)))*a + b
  const ColorScale* sc = nullptr;
  explicit IndexFn(const ColorScale& s) : sc(&s) {
    if (!s.log) {
      kind = Linear;
      if (s.diverging) {
        a = 0.5f / std::max(s.hi, 1e-30f);
        b = 0.5f;
      } else {
        a = s.hi > s.lo ? 1.0f / (s.hi - s.lo) : 0.0f;
        b = -s.lo * a;
      }
    } else if (!s.diverging) {
      kind = Log;
      lo = std::max(std::max(s.lo, s.hi * s.floor), 1e-30f);
      const float l0 = std::log2(lo), l1 = std::log2(std::max(s.hi, 1e-30f));
      a = l1 > l0 ? 1.0f / (l1 - l0) : 0.0f;
      b = -l0 * a;
    }
  }
  int operator()(float v) const {
    float t;
    if (kind == Linear)
      t = v * a + b;
    else if (kind == Log)
      t = fast_log2(std::max(v, lo)) * a + b;
    else
      t = sc->to_t(v);
    if (!(t >= 0))
      return 0;  // also NaN
    return t >= 1 ? 255 : int(t * 255.0f + 0.5f);
  }
};

}  // namespace

void build_heatmap(const float* m, const GridGeom& g, const HeatmapStyle& st, const ColorScale& scale,
                   HeatmapImage& out) {
  out.scale = scale;
  out.w = g.cols;
  out.h = g.rows;
  out.rgba.resize(size_t(out.w) * out.h);
  uint32_t lut[256];
  for (int i = 0; i < 256; ++i)
    lut[i] = colormap_rgba(st.cmap, i / 255.0f);
  const IndexFn index(scale);
  // Column block starts once; row i shows blocks up to the last one holding a key <= its last query.
  std::vector<int64_t> cs(size_t(g.cols) + 1);
  for (int j = 0; j <= g.cols; ++j)
    cs[size_t(j)] = g.col_start(j);
  for (int y = 0; y < g.rows; ++y) {
    const int64_t q_last = g.row_start(y + 1) - 1;
    const int visible = int(std::upper_bound(cs.begin(), cs.end() - 1, q_last) - cs.begin());
    uint32_t* row = out.rgba.data() + size_t(y) * out.w;
    const float* src = m + size_t(y) * g.cols;
    for (int x = 0; x < visible; ++x)
      row[x] = g.window > 0 && g.masked(y, x) ? st.masked_rgba : lut[index(src[x])];  // left of a sliding window
    for (int x = visible; x < out.w; ++x)
      row[x] = st.masked_rgba;
  }
}

}  // namespace ds::gui
