// Themes and fonts. See theme.h.
#include "theme.h"

#include <filesystem>

namespace ds::gui {

namespace {
ThemeColors g_colors;
bool g_dark = true;
}  // namespace

const ThemeColors& theme_colors() {
  return g_colors;
}
bool theme_is_dark() {
  return g_dark;
}

void apply_theme(bool dark) {
  g_dark = dark;
  ImGuiStyle& st = ImGui::GetStyle();
  st = ImGuiStyle();
  if (dark)
    ImGui::StyleColorsDark(&st);
  else
    ImGui::StyleColorsLight(&st);
  st.WindowRounding = 4;
  st.FrameRounding = 3;
  st.GrabRounding = 3;
  st.PopupRounding = 3;
  st.ScrollbarRounding = 3;
  st.TabRounding = 3;
  st.WindowPadding = ImVec2(10, 8);
  st.FramePadding = ImVec2(6, 3);
  st.ItemSpacing = ImVec2(8, 5);
  st.WindowBorderSize = 1;
  st.FrameBorderSize = dark ? 0.0f : 1.0f;
  st.WindowTitleAlign = ImVec2(0.0f, 0.5f);
  ImVec4* c = st.Colors;
  c[ImGuiCol_PopupBg].w = 1.0f;  // opaque drop-downs and tooltips (the text under a list showed through)
  if (dark) {
    c[ImGuiCol_WindowBg] = ImVec4(0.105f, 0.11f, 0.12f, 1.0f);
    c[ImGuiCol_ChildBg] = ImVec4(0.09f, 0.095f, 0.105f, 1.0f);
    c[ImGuiCol_TitleBg] = ImVec4(0.13f, 0.14f, 0.16f, 1.0f);
    c[ImGuiCol_TitleBgActive] = ImVec4(0.16f, 0.24f, 0.36f, 1.0f);
    c[ImGuiCol_MenuBarBg] = ImVec4(0.13f, 0.14f, 0.16f, 1.0f);
    c[ImGuiCol_FrameBg] = ImVec4(0.18f, 0.19f, 0.21f, 1.0f);
    c[ImGuiCol_Border] = ImVec4(0.25f, 0.26f, 0.29f, 1.0f);
    c[ImGuiCol_PlotLines] = ImVec4(0.45f, 0.75f, 0.95f, 1.0f);
    g_colors.masked = IM_COL32(62, 64, 71, 255);
    g_colors.grid = IM_COL32(90, 94, 102, 255);
    g_colors.cursor = IM_COL32(255, 255, 255, 220);
    g_colors.selection = IM_COL32(255, 196, 0, 255);
    g_colors.text_dim = IM_COL32(150, 155, 165, 255);
    g_colors.plot_a = IM_COL32(110, 190, 245, 255);
    g_colors.plot_b = IM_COL32(245, 160, 80, 255);
    g_colors.error_bg = IM_COL32(120, 30, 35, 255);
    g_colors.error_text = IM_COL32(255, 235, 235, 255);
    g_colors.generated = IM_COL32(24, 88, 74, 255);
    g_colors.generated_hover = IM_COL32(36, 122, 102, 255);
    g_colors.generated_mark = IM_COL32(72, 208, 160, 255);
    g_colors.diff_mark = IM_COL32(240, 84, 120, 255);
    g_colors.answer_mark = IM_COL32(190, 120, 255, 255);
  } else {
    c[ImGuiCol_WindowBg] = ImVec4(0.97f, 0.97f, 0.975f, 1.0f);
    c[ImGuiCol_ChildBg] = ImVec4(1.0f, 1.0f, 1.0f, 1.0f);
    c[ImGuiCol_TitleBg] = ImVec4(0.88f, 0.89f, 0.91f, 1.0f);
    c[ImGuiCol_TitleBgActive] = ImVec4(0.74f, 0.82f, 0.93f, 1.0f);
    c[ImGuiCol_MenuBarBg] = ImVec4(0.90f, 0.91f, 0.93f, 1.0f);
    c[ImGuiCol_Border] = ImVec4(0.70f, 0.72f, 0.76f, 1.0f);
    c[ImGuiCol_PlotLines] = ImVec4(0.10f, 0.40f, 0.75f, 1.0f);
    g_colors.masked = IM_COL32(178, 181, 188, 255);
    g_colors.grid = IM_COL32(170, 174, 182, 255);
    g_colors.cursor = IM_COL32(20, 20, 20, 230);
    g_colors.selection = IM_COL32(230, 90, 0, 255);
    g_colors.text_dim = IM_COL32(100, 105, 115, 255);
    g_colors.plot_a = IM_COL32(20, 100, 190, 255);
    g_colors.plot_b = IM_COL32(210, 100, 20, 255);
    g_colors.error_bg = IM_COL32(250, 220, 222, 255);
    g_colors.error_text = IM_COL32(130, 10, 20, 255);
    g_colors.generated = IM_COL32(190, 232, 216, 255);
    g_colors.generated_hover = IM_COL32(160, 216, 196, 255);
    g_colors.generated_mark = IM_COL32(16, 140, 100, 255);
    g_colors.diff_mark = IM_COL32(205, 30, 75, 255);
    g_colors.answer_mark = IM_COL32(130, 50, 200, 255);
  }
}

bool load_fonts(float size_px) {
  ImGuiIO& io = ImGui::GetIO();
  io.Fonts->Clear();
  static const char* const k_paths[] = {
      "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
      "/usr/share/fonts/TTF/DejaVuSans.ttf",
      "/usr/share/fonts/dejavu/DejaVuSans.ttf",
  };
  // Latin-1, Greek (lambda), general punctuation (dashes, ellipsis), arrows, math operators (minus sign),
  // geometric shapes (triangles used as markers).
  static const ImWchar k_ranges[] = {0x0020, 0x00FF, 0x0100, 0x017F, 0x0370, 0x03FF, 0x2000, 0x206F,
                                     0x2190, 0x21FF, 0x2200, 0x22FF, 0x25A0, 0x25FF, 0};
  for (const char* p : k_paths) {
    std::error_code ec;
    if (!std::filesystem::exists(p, ec))
      continue;
    ImFontConfig cfg;
    cfg.OversampleH = 2;
    if (io.Fonts->AddFontFromFileTTF(p, size_px, &cfg, k_ranges))
      return true;
  }
  io.Fonts->AddFontDefault();
  return false;
}

}  // namespace ds::gui
