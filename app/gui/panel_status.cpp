// Transient UI: the error modal (one line; the previous model stays loaded), toasts after exports, and the
// keyboard-shortcut sheet.
#include <imgui.h>

#include "panels.h"
#include "theme.h"

namespace ds::gui {

static void shortcuts_window(AppState& st) {
  if (!st.show_shortcuts)
    return;
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (ImGui::Begin("Keyboard shortcuts", &st.show_shortcuts, ImGuiWindowFlags_AlwaysAutoResize)) {
    static const char* const rows[][2] = {{"Ctrl+O", "open a model (focus the path field)"},
                                          {"Ctrl+Shift+O", "open a prompt file"},
                                          {"Ctrl+Enter", "run the prompt"},
                                          {"Ctrl+R", "reset lambda"},
                                          {"Ctrl+G", "generate (continue the prompt)"},
                                          {"F10", "generate one token (step)"},
                                          {"Shift+F5", "stop generating"},
                                          {"Ctrl+Shift+G", "regenerate with the same options"},
                                          {"Up / Down", "previous / next layer"},
                                          {"Left / Right", "previous / next head"},
                                          {"wheel, drag", "zoom, pan the head maps"},
                                          {"click, double-click", "lock cursor + row view, reset view"},
                                          {"Ctrl+0", "reset head zoom"},
                                          {"Ctrl+L", "log colour scale"},
                                          {"Ctrl+H", "hide the first-token column"},
                                          {"Ctrl+T", "dark / light theme"},
                                          {"Ctrl+E", "export head maps (.npy)"},
                                          {"Ctrl+Shift+E", "export head maps (.csv)"},
                                          {"Ctrl+S", "export session (.json)"},
                                          {"Ctrl+P", "export window (.png)"},
                                          {"F1", "this sheet"},
                                          {"Ctrl+Q", "quit"}};
    if (ImGui::BeginTable("keys", 2, ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg)) {
      for (const auto& r : rows) {
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r[0]);
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(r[1]);
      }
      ImGui::EndTable();
    }
  }
  ImGui::End();
}

void draw_status(AppState& st) {
  if (st.open_error_modal) {
    ImGui::OpenPopup("Error");
    st.open_error_modal = false;
  }
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (ImGui::BeginPopupModal("Error", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 40);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().plot_b), "%s", st.error_line.c_str());
    if (st.snap && st.snap->model && st.snap->error_opening && st.snap->error_seq == st.seen_error_seq)
      ImGui::TextDisabled("The model loaded before (%s) stays open.", st.snap->model->dir.c_str());
    ImGui::PopTextWrapPos();
    ImGui::Spacing();
    if (ImGui::Button("OK", ImVec2(120, 0)) || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape)) ||
        ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter)))
      ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
  if (!st.toast.text.empty() && ImGui::GetTime() < st.toast.until) {
    const ImGuiViewport* vp = ImGui::GetMainViewport();
    ImGui::SetNextWindowPos(ImVec2(vp->WorkPos.x + vp->WorkSize.x - 16, vp->WorkPos.y + vp->WorkSize.y - 16),
                            ImGuiCond_Always, ImVec2(1, 1));
    ImGui::SetNextWindowBgAlpha(0.92f);
    const ImGuiWindowFlags f = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_AlwaysAutoResize |
                               ImGuiWindowFlags_NoFocusOnAppearing | ImGuiWindowFlags_NoNav | ImGuiWindowFlags_NoMove;
    if (ImGui::Begin("##toast", nullptr, f)) {
      if (st.toast.error)
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().plot_b), "%s", st.toast.text.c_str());
      else
        ImGui::TextUnformatted(st.toast.text.c_str());
    }
    ImGui::End();
  }
  shortcuts_window(st);
}

}  // namespace ds::gui
