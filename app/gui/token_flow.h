// Tokens laid out like text (wrapped at the panel's width) for prompts of any length: the line breaks are computed
// once per prompt and width, and only the lines on screen are drawn (ImGuiListClipper), so a 128K-token prompt
// scrolls as smoothly as a short one. Used by the prompt panel's token list and the row view's coloured text.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <imgui.h>

#include "snapshot.h"

namespace ds::gui {

class TokenFlow {
 public:
  // The label a token is drawn with (token_label, cut to a readable length).
  static std::string label(const RunResult& r, int64_t i);
  // Lay out tokens [0, count) of r in `width` pixels (cached: a no-op when nothing changed).
  void layout(const std::shared_ptr<const RunResult>& r, int64_t count, float width);
  int64_t lines() const { return int64_t(starts_.size()) - 1; }
  int64_t line_start(int64_t line) const { return starts_[size_t(line)]; }
  int64_t line_of(int64_t token) const;  // the line holding a token
  float item_width(const RunResult& r, int64_t i) const;
  static float pad() { return 4; }    // inside a token's box, left + right
  static float spacing() { return 2; }  // between boxes

  // Draws the laid-out tokens in a child window of height `height` with a clipper. For each visible token,
  // `draw` gets its index and box (screen coordinates) and draws it; returns the token under the mouse (-1).
  // scroll_to >= 0 scrolls that token's line into view once.
  int64_t draw(const char* id, float height, const std::function<void(int64_t, ImVec2, ImVec2, bool)>& draw,
               int64_t scroll_to = -1);

 private:
  std::shared_ptr<const RunResult> result_;
  int64_t count_ = -1;
  float width_ = -1, font_ = -1;
  std::vector<int64_t> starts_{0};
};

}  // namespace ds::gui
