// Dark and light themes and the UI font (DejaVu Sans from fonts-dejavu-core, with Greek and math symbols so that
// lambda, minus and arrows render; ImGui's built-in font when the file is missing).
#pragma once
#include <cstdint>

#include <imgui.h>

namespace ds::gui {

struct ThemeColors {
  ImU32 masked;     // causal upper triangle
  ImU32 grid;       // cell borders, plot frames
  ImU32 cursor;     // hover crosshair
  ImU32 selection;  // selected head in the overview
  ImU32 text_dim;
  ImU32 plot_a, plot_b;  // two series
  ImU32 error_bg, error_text;
  ImU32 generated, generated_hover;  // generated tokens' boxes (the prompt's are ImGuiCol_Button)
  ImU32 generated_mark;              // generated positions marked along map axes and under row-view tokens
  ImU32 diff_mark;                   // the first token where two continuations differ
  ImU32 answer_mark;                 // the answer span of a prompt opened from a corpus scan
};

void apply_theme(bool dark);
const ThemeColors& theme_colors();
bool theme_is_dark();
// Returns true when DejaVu Sans was loaded (the font has the lambda glyph).
bool load_fonts(float size_px);

}  // namespace ds::gui
