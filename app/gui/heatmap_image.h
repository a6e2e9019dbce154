// Turns a pooled view of an attention map (rows x cols cells over a rectangle of tokens, engine/core/map_query.h) into
// RGBA pixels: colour scale chosen from the visible cells, blocks that lie wholly in the causal upper triangle
// painted in a neutral "masked" colour. CPU only; the caller uploads the pixels to a GlTexture.
#pragma once
#include <cstdint>
#include <vector>

#include "colormap.h"
#include "engine/core/map_query.h"

namespace ds::gui {

struct HeatmapStyle {
  Colormap cmap = Colormap::Viridis;
  bool diverging = false;  // symmetric limits around zero
  bool log = false;
  bool robust = true;  // range up to the 99.5th percentile of magnitudes (brighter cells clamp), else the max
  uint32_t masked_rgba = 0xff404040u;
};

// The geometry of a grid: the rectangle [q0, q1) x [k0, k1) pooled into rows x cols blocks (map_query.h's rule).
struct GridGeom {
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  int rows = 0, cols = 0;
  int64_t window = 0;  // sliding window: a query q sees keys q - window + 1 .. q (0: all keys up to q)
  static GridGeom of(const MapView& v, int64_t window = 0) { return {v.q0, v.q1, v.k0, v.k1, v.rows, v.cols, window}; }
  int64_t row_start(int i) const { return q0 + view_block_start(i, q1 - q0, rows); }
  int64_t col_start(int j) const { return k0 + view_block_start(j, k1 - k0, cols); }
  // Every key of column block j comes after every query of row block i (k > q), or lies before every query's
  // window: the block is all masked.
  bool masked(int i, int j) const {
    return col_start(j) > row_start(i + 1) - 1 || (window > 0 && col_start(j + 1) - 1 < row_start(i) - window + 1);
  }
};

struct HeatmapImage {
  int w = 0, h = 0;  // pixels = grid cells
  ColorScale scale;
  std::vector<uint32_t> rgba;  // [h, w]
};

// Colour range over the grid's cells that are not all masked, leaving out the block of query 0 / key 0 (A = 1 there
// whatever the head does): [0, max] for maps, [-m, m] for the difference.
ColorScale heatmap_scale(const float* m, const GridGeom& g, const HeatmapStyle& st);
// Build the pixels with a given scale (panels share one scale across maps when linked).
void build_heatmap(const float* m, const GridGeom& g, const HeatmapStyle& st, const ColorScale& scale,
                   HeatmapImage& out);

}  // namespace ds::gui
