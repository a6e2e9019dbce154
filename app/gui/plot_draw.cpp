// Shared drawing primitives. See plot_draw.h.
#include "plot_draw.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "theme.h"

namespace ds::gui {

void add_text_vertical(ImDrawList* dl, ImVec2 pos, ImU32 col, const char* text) {
  // Draw horizontally, then rotate the new vertices by -90 degrees about `pos` (ImGui has no rotated text; this
  // is the usual vertex-rotation approach).
  const ImVec2 size = ImGui::CalcTextSize(text);
  const int first = dl->VtxBuffer.Size;
  // Horizontal text placed so that after rotation it reads upwards and ends at pos.y: rotating (x, y) about pos by
  // -90 degrees maps (pos.x + dx, pos.y + dy) to (pos.x + dy, pos.y - dx).
  dl->AddText(ImVec2(pos.x - size.x, pos.y - size.y * 0.5f), col, text);
  for (int i = first; i < dl->VtxBuffer.Size; ++i) {
    ImDrawVert& v = dl->VtxBuffer[i];
    const float dx = v.pos.x - pos.x, dy = v.pos.y - pos.y;
    v.pos = ImVec2(pos.x + dy, pos.y - dx);
  }
}

float colorbar_width() {
  return 14.0f + ImGui::CalcTextSize("-0.000e-00").x * 0.75f + 8.0f;
}

void draw_colorbar(ImDrawList* dl, ImVec2 p0, ImVec2 p1, Colormap cmap, const ColorScale& scale, ImU32 text_col) {
  const float bar_w = 14.0f;
  const int steps = 64;
  const float h = p1.y - p0.y;
  for (int i = 0; i < steps; ++i) {
    const float t0 = 1.0f - float(i) / steps, t1 = 1.0f - float(i + 1) / steps;
    const ImU32 c0 = colormap_rgba(cmap, t0), c1 = colormap_rgba(cmap, t1);
    const float y0 = p0.y + h * i / steps, y1 = p0.y + h * (i + 1) / steps;
    dl->AddRectFilledMultiColor(ImVec2(p0.x, y0), ImVec2(p0.x + bar_w, y1 + 0.5f), c0, c0, c1, c1);
  }
  dl->AddRect(p0, ImVec2(p0.x + bar_w, p1.y), theme_colors().grid);
  const float lh = ImGui::GetTextLineHeight();
  for (int i = 0; i <= 4; ++i) {
    const float t = 1.0f - i / 4.0f;
    const float y = p0.y + h * i / 4.0f;
    dl->AddLine(ImVec2(p0.x + bar_w, y), ImVec2(p0.x + bar_w + 3, y), theme_colors().grid);
    std::string s = fmt_value(scale.from_t(t));
    if (scale.clipped && (i == 0 || (i == 4 && scale.diverging)))
      s = (i == 0 ? "\xe2\x89\xa5" : "\xe2\x89\xa4") + s;
    const float ty = std::clamp(y - lh * 0.5f, p0.y - lh * 0.5f, p1.y - lh * 0.5f);
    dl->AddText(ImVec2(p0.x + bar_w + 5, ty), text_col, s.c_str());
  }
}



void draw_dual_plot(ImDrawList* dl, ImVec2 p0, ImVec2 p1, const Series& a, const Series& b, float marker_x,
                    const char* x_name) {
  const ThemeColors& tc = theme_colors();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const float lh = ImGui::GetTextLineHeight();
  const float left = ImGui::CalcTextSize("-00.00").x + 6, right = ImGui::CalcTextSize("00.00").x + 6;
  const ImVec2 q0(p0.x + left, p0.y + 4), q1(p1.x - right, p1.y - lh - 4);
  dl->AddRectFilled(q0, q1, ImGui::GetColorU32(ImGuiCol_FrameBg));
  dl->AddRect(q0, q1, tc.grid);
  if ((a.x->empty() && b.x->empty()) || q1.x - q0.x < 10 || q1.y - q0.y < 10)
    return;
  // The x range of both series (one may still be filling in: the sweep's log p comes point by point).
  float x0 = INFINITY, x1 = -INFINITY;
  for (const Series* s : {&a, &b})
    for (float x : *s->x)
      x0 = std::min(x0, x), x1 = std::max(x1, x);
  auto range = [](const std::vector<float>& v) {
    float lo = INFINITY, hi = -INFINITY;
    for (float f : v)
      if (std::isfinite(f))
        lo = std::min(lo, f), hi = std::max(hi, f);
    if (!std::isfinite(lo))
      return std::pair(0.f, 1.f);
    if (!(hi > lo))
      lo -= 0.5f, hi += 0.5f;
    const float pad = (hi - lo) * 0.08f;
    return std::pair(lo - pad, hi + pad);
  };
  const auto [ya0, ya1] = range(*a.y);
  const auto [yb0, yb1] = range(*b.y);
  auto px = [&](float x) { return q0.x + (x - x0) / std::max(x1 - x0, 1e-12f) * (q1.x - q0.x); };
  auto py = [&](float y, float lo, float hi) { return q1.y - (y - lo) / (hi - lo) * (q1.y - q0.y); };
  // x grid: zero (plain softmax attention) and the marker.
  if (x0 < 0 && x1 > 0) {
    dl->AddLine(ImVec2(px(0), q0.y), ImVec2(px(0), q1.y), tc.grid);
    dl->AddText(ImVec2(px(0) + 3, q0.y + 2), tc.text_dim, "softmax");
  }
  if (std::isfinite(marker_x))
    dl->AddLine(ImVec2(px(marker_x), q0.y), ImVec2(px(marker_x), q1.y), tc.selection, 2);
  dl->PushClipRect(q0, q1, true);
  for (const Series* s : {&a, &b}) {
    const auto [lo, hi] = s == &a ? std::pair(ya0, ya1) : std::pair(yb0, yb1);
    std::vector<ImVec2> pts;
    for (size_t i = 0; i < s->x->size() && i < s->y->size(); ++i)
      pts.push_back(ImVec2(px((*s->x)[i]), py((*s->y)[i], lo, hi)));
    if (pts.size() >= 2)
      dl->AddPolyline(pts.data(), int(pts.size()), s->color, 0, 2.0f);
    for (const ImVec2& p : pts)
      dl->AddCircleFilled(p, 2.5f, s->color);
  }
  dl->PopClipRect();
  // Axes labels: left for a, right for b, bottom for x.
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ya1);
  dl->AddText(ImVec2(p0.x, q0.y), a.color, buf);
  std::snprintf(buf, sizeof buf, "%.2f", ya0);
  dl->AddText(ImVec2(p0.x, q1.y - lh), a.color, buf);
  std::snprintf(buf, sizeof buf, "%.2f", yb1);
  dl->AddText(ImVec2(q1.x + 4, q0.y), b.color, buf);
  std::snprintf(buf, sizeof buf, "%.2f", yb0);
  dl->AddText(ImVec2(q1.x + 4, q1.y - lh), b.color, buf);
  std::snprintf(buf, sizeof buf, "%.2f", x0);
  dl->AddText(ImVec2(q0.x, q1.y + 2), text, buf);
  std::snprintf(buf, sizeof buf, "%.2f", x1);
  dl->AddText(ImVec2(q1.x - ImGui::CalcTextSize(buf).x, q1.y + 2), text, buf);
  const ImVec2 ns = ImGui::CalcTextSize(x_name);
  dl->AddText(ImVec2((q0.x + q1.x - ns.x) * 0.5f, q1.y + 2), text, x_name);
}

void draw_row_frame(ImDrawList* dl, ImVec2 a, ImVec2 b, int64_t count, float lo, float hi, int64_t span0, int64_t span1) {
  const ThemeColors& tc = theme_colors();
  dl->AddRectFilled(a, b, ImGui::GetColorU32(ImGuiCol_FrameBg));
  if (span0 < count) {
    const float x0 = a.x + float(span0) / float(count) * (b.x - a.x);
    const float x1 = a.x + float(std::min(span1, count)) / float(count) * (b.x - a.x);
    dl->AddRectFilled(ImVec2(x0, a.y), ImVec2(std::max(x1, x0 + 2), b.y), (tc.answer_mark & 0x00ffffffu) | 0x50000000u);
  }
  dl->AddRect(a, b, tc.grid);
  const float y0 = b.y - (0 - lo) / (hi - lo) * (b.y - a.y);
  dl->AddLine(ImVec2(a.x, y0), ImVec2(b.x, y0), tc.grid);
}

// One series over keys [0, count) drawn as a per-pixel-column min..max envelope joined column to column, so a
// row of 128K keys costs one pass and every spike stays visible.
void draw_row_series(ImDrawList* dl, ImVec2 a, ImVec2 b, const float* v, int64_t count, float lo, float hi, ImU32 col) {
  const int W = std::max(1, int(b.x - a.x));
  auto y_of = [&](float x) { return b.y - (x - lo) / (hi - lo) * (b.y - a.y); };
  float prev_x = -1, prev_y = 0;
  for (int px = 0; px < W; ++px) {
    const int64_t k0 = int64_t(px) * count / W, k1 = std::max(k0 + 1, int64_t(px + 1) * count / W);
    if (k0 >= count)
      break;
    float mn = v[k0], mx = v[k0];
    for (int64_t k = k0; k < k1 && k < count; ++k)
      mn = std::min(mn, v[k]), mx = std::max(mx, v[k]);
    const float x = count <= W ? a.x + (float(k0) + 0.5f) / float(count) * (b.x - a.x) : a.x + float(px) + 0.5f;
    if (prev_x >= 0)
      dl->AddLine(ImVec2(prev_x, prev_y), ImVec2(x, y_of(v[k0])), col, 1.5f);
    dl->AddLine(ImVec2(x, y_of(mn)), ImVec2(x, y_of(mx) - 0.5f), col, 1.5f);
    prev_x = x;
    prev_y = y_of(v[std::min(k1, count) - 1]);
  }
}

}  // namespace ds::gui
