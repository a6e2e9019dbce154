// Wrapped token layout with a list clipper. See token_flow.h.
#include "token_flow.h"

#include <algorithm>

#include "plot_draw.h"

namespace ds::gui {

std::string TokenFlow::label(const RunResult& r, int64_t i) {
  return i >= 0 && i < int64_t(r.tokens.size()) ? token_label(r.tokens[size_t(i)], 18) : std::string("?");
}

float TokenFlow::item_width(const RunResult& r, int64_t i) const {
  return ImGui::CalcTextSize(label(r, i).c_str()).x + pad();
}

void TokenFlow::layout(const std::shared_ptr<const RunResult>& r, int64_t count, float width) {
  const float font = ImGui::GetFontSize();
  if (r == result_ && count == count_ && width == width_ && font == font_)
    return;
  result_ = r;
  count_ = count;
  width_ = width;
  font_ = font;
  starts_.assign(1, 0);
  float x = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float w = item_width(*r, i);
    if (x > 0 && x + w > width) {
      starts_.push_back(i);
      x = 0;
    }
    x += w + spacing();
  }
  starts_.push_back(count);
}

int64_t TokenFlow::line_of(int64_t token) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, token);
  return std::max<int64_t>(0, int64_t(it - starts_.begin()) - 1);
}

int64_t TokenFlow::draw(const char* id, float height,
                        const std::function<void(int64_t, ImVec2, ImVec2, bool)>& draw_token, int64_t scroll_to) {
  int64_t hovered = -1;
  if (!result_ || lines() <= 0)
    return hovered;
  const float line_h = ImGui::GetTextLineHeight() + 2 + spacing();
  ImGui::BeginChild(id, ImVec2(0, height), false);
  if (scroll_to >= 0 && scroll_to < count_) {
    const float y = float(line_of(scroll_to)) * line_h;
    const float h = ImGui::GetWindowHeight();
    if (y < ImGui::GetScrollY() || y + line_h > ImGui::GetScrollY() + h)
      ImGui::SetScrollY(std::max(0.0f, y - h * 0.4f));
  }
  ImGui::PushStyleVar(ImGuiStyleVar_ItemSpacing, ImVec2(ImGui::GetStyle().ItemSpacing.x, 0));  // rows of line_h
  ImGuiListClipper clipper;
  clipper.Begin(int(lines()), line_h);
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const bool window_hovered = ImGui::IsWindowHovered();
  while (clipper.Step()) {
    for (int line = clipper.DisplayStart; line < clipper.DisplayEnd; ++line) {
      const ImVec2 p = ImGui::GetCursorScreenPos();
      float x = p.x;
      for (int64_t i = line_start(line); i < line_start(line + 1); ++i) {
        const float w = item_width(*result_, i);
        const ImVec2 a(x, p.y), b(x + w, p.y + line_h - spacing());
        const bool hov = window_hovered && mouse.x >= a.x && mouse.x < b.x && mouse.y >= a.y && mouse.y < b.y;
        if (hov)
          hovered = i;
        draw_token(i, a, b, hov);
        x += w + spacing();
      }
      ImGui::Dummy(ImVec2(std::max(1.0f, x - p.x), line_h));
    }
  }
  clipper.End();
  ImGui::PopStyleVar();
  ImGui::EndChild();
  return hovered;
}

}  // namespace ds::gui
