// The menu bar (every action with its shortcut shown) and the keyboard shortcuts themselves, plus the export
// actions the menu and the shortcuts share.
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_stdlib.h>

#include <cstdio>

#include "export.h"
#include "panels.h"
#include "theme.h"

namespace ds::gui {

namespace {

void export_npy(AppState& st) {
  if (!st.snap || !st.snap->head)
    return st.notify("Nothing to export yet: run a prompt first.", true);
  const auto& hm = *st.snap->head;
  const std::string prefix = st.export_path("L" + std::to_string(hm.layer) + "H" + std::to_string(hm.head), "npy");
  std::vector<std::string> files;
  std::string err;
  if (!export_head_npy(st, prefix.substr(0, prefix.size() - 4), &files, &err))
    return st.notify(err, true);
  st.notify("Wrote " + std::to_string(files.size()) + " .npy files: " + files.front() + " ...");
}

void export_csv(AppState& st) {
  if (!st.snap || !st.snap->head)
    return st.notify("Nothing to export yet: run a prompt first.", true);
  const auto& hm = *st.snap->head;
  const std::string path = st.export_path("L" + std::to_string(hm.layer) + "H" + std::to_string(hm.head), "csv");
  std::string err;
  if (!export_head_csv(st, path, &err))
    return st.notify(err, true);
  st.notify("Wrote " + path);
}

void export_json(AppState& st) {
  if (!st.snap || !st.snap->model)
    return st.notify("Nothing to export yet: open a model first.", true);
  const std::string path = st.export_path("session", "json");
  std::string err;
  if (!export_session_json(st, path, &err))
    return st.notify(err, true);
  st.notify("Wrote " + path);
}

void export_png(AppState& st, const std::string& panel) {
  st.capture_panel = panel;  // main.cpp reads the pixels after this frame is rendered
  st.capture_path = st.export_path(panel.empty() ? "window" : panel, "png");
}

bool s_streaming(const AppState& st) {
  return st.snap && st.snap->gen && st.snap->gen->streaming;
}

bool ctrl_key(int key, bool shift = false) {
  const ImGuiIO& io = ImGui::GetIO();
  return io.KeyCtrl && io.KeyShift == shift && ImGui::IsKeyPressed(key, false);
}

}  // namespace

void handle_shortcuts(AppState& st) {
  const ImGuiIO& io = ImGui::GetIO();
  if (ctrl_key(GLFW_KEY_O))
    st.focus_path = st.show_model = true;
  if (ctrl_key(GLFW_KEY_O, true))
    st.prompt.open_popup = true;
  if (ctrl_key(GLFW_KEY_ENTER) && !io.WantTextInput)
    st.run_prompt();
  if (ctrl_key(GLFW_KEY_R))
    st.reset_lambda();
  if (ctrl_key(GLFW_KEY_G))
    st.generate();
  if (ctrl_key(GLFW_KEY_G, true))
    st.regenerate();
  if (ImGui::IsKeyPressed(GLFW_KEY_F10, false) && !io.KeyCtrl && !io.KeyShift)
    st.generate_step();
  if (ImGui::IsKeyPressed(GLFW_KEY_F5, false) && io.KeyShift && st.snap && st.snap->gen &&
      (st.snap->gen->streaming || st.snap->gen->active))
    st.stop_generation();
  if (ctrl_key(GLFW_KEY_E))
    export_npy(st);
  if (ctrl_key(GLFW_KEY_E, true))
    export_csv(st);
  if (ctrl_key(GLFW_KEY_S))
    export_json(st);
  if (ctrl_key(GLFW_KEY_P))
    export_png(st, "");
  if (ctrl_key(GLFW_KEY_T))
    st.settings.dark = !st.settings.dark;
  if (ctrl_key(GLFW_KEY_L))
    st.settings.log_scale = !st.settings.log_scale;
  if (ctrl_key(GLFW_KEY_H))
    st.settings.hide_first = !st.settings.hide_first;
  if (ctrl_key(GLFW_KEY_0))
    st.view = HeadView{};
  if (ctrl_key(GLFW_KEY_Q))
    st.quit = true;
  if (ImGui::IsKeyPressed(GLFW_KEY_F1, false))
    st.show_shortcuts = !st.show_shortcuts;
  // Arrow keys browse heads when no text field has the keyboard.
  if (!io.WantTextInput && !io.KeyCtrl && st.snap && st.snap->model) {
    const auto& c = st.snap->model->cfg;
    int l = st.layer, h = st.head;
    if (ImGui::IsKeyPressed(GLFW_KEY_UP))  // (select_head steps over layers without attention)
      l = std::max(0, l - 1);
    if (ImGui::IsKeyPressed(GLFW_KEY_DOWN))
      l = std::min(int(c.layers) - 1, l + 1);
    if (ImGui::IsKeyPressed(GLFW_KEY_LEFT))
      h = std::max(0, h - 1);
    if (ImGui::IsKeyPressed(GLFW_KEY_RIGHT))
      h = std::min(int(c.view_heads()) - 1, h + 1);
    st.select_head(l, h);
  }
}

// File > Open prompt...: a path field (there is no native file dialog); the file's text becomes the prompt and runs.
static void open_prompt_popup(AppState& st) {
  if (st.prompt.open_popup) {
    ImGui::OpenPopup("Open prompt");
    st.prompt.open_popup = false;
  }
  if (!ImGui::BeginPopupModal("Open prompt", nullptr, ImGuiWindowFlags_AlwaysAutoResize))
    return;
  ImGui::TextUnformatted("A text file whose contents become the prompt (UTF-8; it runs at once).");
  if (ImGui::IsWindowAppearing())
    ImGui::SetKeyboardFocusHere();
  ImGui::SetNextItemWidth(520);
  const bool enter =
      ImGui::InputTextWithHint("##path", "/path/to/prompt.txt", &st.prompt.path, ImGuiInputTextFlags_EnterReturnsTrue);
  static std::string why;
  if (ImGui::Button("Open") || enter) {
    why.clear();
    if (st.open_prompt_file(st.prompt.path, &why))
      ImGui::CloseCurrentPopup();
  }
  ImGui::SameLine();
  if (ImGui::Button("Cancel") || ImGui::IsKeyPressed(GLFW_KEY_ESCAPE)) {
    why.clear();
    ImGui::CloseCurrentPopup();
  }
  if (!why.empty())
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().error_text), "%s", why.c_str());
  ImGui::EndPopup();
}

void draw_menu_bar(AppState& st) {
  open_prompt_popup(st);
  if (!ImGui::BeginMainMenuBar())
    return;
  if (ImGui::BeginMenu("File")) {
    if (ImGui::MenuItem("Open model...", "Ctrl+O"))
      st.focus_path = st.show_model = true;
    if (ImGui::MenuItem("Open prompt...", "Ctrl+Shift+O"))
      st.prompt.open_popup = true;
    if (ImGui::MenuItem("Scan corpus...")) {  // the Corpus panel, its file field focused
      st.raise_corpus = st.corpus.focus_path = true;
      st.show_corpus = true;
    }
    if (ImGui::BeginMenu("Recent models", !st.settings.recent.empty())) {
      for (const auto& r : st.settings.recent)
        if (ImGui::MenuItem(r.c_str())) {
          st.path_input = r;
          st.open_model(r);
        }
      ImGui::EndMenu();
    }
    ImGui::Separator();
    if (ImGui::MenuItem("Export head maps (.npy)", "Ctrl+E"))
      export_npy(st);
    if (ImGui::MenuItem("Export head maps (.csv)", "Ctrl+Shift+E"))
      export_csv(st);
    if (ImGui::MenuItem("Export session (.json)", "Ctrl+S"))
      export_json(st);
    if (ImGui::BeginMenu("Export PNG")) {
      if (ImGui::MenuItem("Whole window", "Ctrl+P"))
        export_png(st, "");
      for (const char* p : {"Model", "Prompt", "Generate", "Head", "Row", "Overview", "Lambda", "Profiler", "Corpus", "Compare"})
        if (ImGui::MenuItem(p, nullptr, false, st.panel_rects.count(p) > 0))
          export_png(st, p);
      ImGui::EndMenu();
    }
    ImGui::SetNextItemWidth(260);
    ImGui::InputTextWithHint("export folder", "current directory", &st.settings.export_dir);
    ImGui::Separator();
    if (ImGui::MenuItem("Quit", "Ctrl+Q"))
      st.quit = true;
    ImGui::EndMenu();
  }
  if (ImGui::BeginMenu("Run")) {
    if (ImGui::MenuItem("Run prompt", "Ctrl+Enter"))
      st.run_prompt();
    if (ImGui::MenuItem("Reset lambda", "Ctrl+R"))
      st.reset_lambda();
    if (ImGui::MenuItem("Lambda scale 0 (plain softmax)"))
      st.set_lambda_scale(0.0);
    ImGui::Separator();
    const bool streaming = s_streaming(st), active = st.snap && st.snap->gen && st.snap->gen->active;
    if (ImGui::MenuItem("Generate", "Ctrl+G", false, st.can_generate()))
      st.generate();
    if (ImGui::MenuItem("Step one token", "F10", false, st.can_generate()))
      st.generate_step();
    if (ImGui::MenuItem("Stop generating", "Shift+F5", false, streaming || active))
      st.stop_generation();
    if (ImGui::MenuItem("Regenerate (same options)", "Ctrl+Shift+G", false,
                        st.can_generate() && st.last_generate_options()))
      st.regenerate();
    if (ImGui::MenuItem("Clear the continuation", nullptr, false,
                        st.can_generate() && st.snap->gen && !st.snap->gen->now.empty()))
      st.clear_generation();
    ImGui::Separator();
    if (ImGui::MenuItem("Scan corpus", nullptr, false, !st.scanning() && !st.corpus.opts.path.empty() && st.snap->model))
      st.start_scan();
    if (ImGui::MenuItem("Stop the scan", nullptr, false, st.scanning()))
      st.stop_scan();
    ImGui::EndMenu();
  }
  if (ImGui::BeginMenu("View")) {
    ImGui::MenuItem("Model", nullptr, &st.show_model);
    ImGui::MenuItem("Prompt", nullptr, &st.show_prompt);
    ImGui::MenuItem("Generate", nullptr, &st.show_generate);
    ImGui::MenuItem("Head", nullptr, &st.show_head);
    ImGui::MenuItem("Row", nullptr, &st.show_row);
    ImGui::MenuItem("Overview", nullptr, &st.show_overview);
    ImGui::MenuItem("Lambda", nullptr, &st.show_lambda);
    ImGui::MenuItem("Profiler", nullptr, &st.show_profiler);
    if (ImGui::MenuItem("Corpus", nullptr, &st.show_corpus) && st.show_corpus)
      st.raise_corpus = true;
    if (ImGui::MenuItem("Compare (a second model)", nullptr, &st.show_compare) && st.show_compare)
      st.compare.raise = true;
    ImGui::Separator();
    if (ImGui::MenuItem("Dark theme", "Ctrl+T", st.settings.dark))
      st.settings.dark = true;
    if (ImGui::MenuItem("Light theme", "Ctrl+T", !st.settings.dark))
      st.settings.dark = false;
    if (ImGui::MenuItem("viridis", nullptr, st.settings.seq_cmap == 0))
      st.settings.seq_cmap = 0;
    if (ImGui::MenuItem("magma", nullptr, st.settings.seq_cmap == 1))
      st.settings.seq_cmap = 1;
    ImGui::MenuItem("Log colour scale", "Ctrl+L", &st.settings.log_scale);
    ImGui::MenuItem("Hide first-token column", "Ctrl+H", &st.settings.hide_first);
    ImGui::MenuItem("Link A1/A2 colour scales", nullptr, &st.settings.link_scales);
    ImGui::MenuItem("Robust colour range (99.5th percentile)", nullptr, &st.settings.robust_range);
    if (ImGui::MenuItem("Reset head zoom", "Ctrl+0"))
      st.view = HeadView{};
    ImGui::Separator();
    if (ImGui::MenuItem("Reset layout"))
      st.reset_layout = true;
    ImGui::EndMenu();
  }
  if (ImGui::BeginMenu("Help")) {
    ImGui::MenuItem("Keyboard shortcuts", "F1", &st.show_shortcuts);
    ImGui::MenuItem("ImGui demo", nullptr, &st.show_imgui_demo);
    ImGui::EndMenu();
  }
  // Status on the right: what the engine is doing.
  const Snapshot& s = *st.snap;
  char status[160];
  if (s.loading)
    std::snprintf(status, sizeof status, "loading %.0f%%", s.load_fraction * 100);
  else if (st.scanning())
    std::snprintf(status, sizeof status, "scanning %d / %d...", s.scan && s.scan->seq == st.req.scan_seq ? s.scan->tried : 0,
                  s.scan && s.scan->seq == st.req.scan_seq ? s.scan->total : 0);
  else if (s.gen && s.gen->streaming)
    std::snprintf(status, sizeof status, "generating %zu / %d...", s.gen->now.ids.size(), s.gen->now.options.max_new);
  else if (s.running)
    std::snprintf(status, sizeof status, "running...");
  else if (s.model)
    std::snprintf(status, sizeof status, "%s", s.model->backend_name.c_str());
  else
    std::snprintf(status, sizeof status, "no model");
  const float w = ImGui::CalcTextSize(status).x;
  ImGui::SameLine(ImGui::GetWindowWidth() - w - 16);
  ImGui::TextDisabled("%s", status);
  ImGui::EndMainMenuBar();
}

}  // namespace ds::gui
