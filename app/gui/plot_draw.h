// Drawing primitives the panels share, on ImGui draw lists: vertical text (key labels under a map), colour bars
// with tick labels, token labels made readable, and a two-series line plot with its own axes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <imgui.h>

#include "colormap.h"
#include "widgets.h"

namespace ds::gui {

// Text rotated 90 degrees counter-clockwise, reading bottom to top, its end at `top_right`... anchored so that the
// text's last character sits at `pos` (x = centre line of the column, y = top edge of the label area).
void add_text_vertical(ImDrawList* dl, ImVec2 pos, ImU32 col, const char* text);

// A vertical colour bar in [p0, p1] with 5 ticks labelled from scale.from_t.
void draw_colorbar(ImDrawList* dl, ImVec2 p0, ImVec2 p1, Colormap cmap, const ColorScale& scale, ImU32 text_col);
float colorbar_width();  // bar + labels


struct Series {
  const std::vector<float>* x;
  const std::vector<float>* y;
  ImU32 color;
  const char* name;
};
// Two series against a shared x axis, each with its own y range (left and right axes). Draws in [p0, p1].
// marker_x: a vertical line (e.g. the current lambda); NaN for none.
void draw_dual_plot(ImDrawList* dl, ImVec2 p0, ImVec2 p1, const Series& a, const Series& b, float marker_x,
                    const char* x_name);

// A row plot's frame in [a, b] over keys [0, count) and the y range [lo, hi]: the background, the keys [span0, span1)
// shaded in the answer colour (none when span0 >= count), the border and the zero line.
void draw_row_frame(ImDrawList* dl, ImVec2 a, ImVec2 b, int64_t count, float lo, float hi, int64_t span0, int64_t span1);

// One series over keys [0, count) in [a, b] on the y range [lo, hi], drawn as a per-pixel-column min..max envelope
// joined column to column, so a row of 128K keys costs one pass and every spike stays visible.
void draw_row_series(ImDrawList* dl, ImVec2 a, ImVec2 b, const float* v, int64_t count, float lo, float hi, ImU32 col);

}  // namespace ds::gui
