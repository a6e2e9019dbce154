// Model panel: open a checkpoint (path field, recent models, drag-and-drop, command line), the loading progress,
// what was loaded and on which backend, and the last error as a one-line banner.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <cstdio>
#include <filesystem>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"

namespace ds::gui {

static void info_row(const char* key, const std::string& value) {
  ImGui::TableNextRow();
  ImGui::TableNextColumn();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().text_dim), "%s", key);
  ImGui::TableNextColumn();
  ImGui::TextWrapped("%s", value.c_str());
  item_tooltip("%s", value.c_str());
}

static std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f B", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1f K", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

static void error_banner(AppState& st) {
  if (st.error_line.empty())
    return;
  const ThemeColors& tc = theme_colors();
  ImGui::PushStyleColor(ImGuiCol_ChildBg, ImGui::ColorConvertU32ToFloat4(tc.error_bg));
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(tc.error_text));
  const float h = ImGui::GetTextLineHeightWithSpacing() + 8;
  ImGui::BeginChild("##error", ImVec2(0, h), false, ImGuiWindowFlags_NoScrollbar);
  ImGui::SetCursorPos(ImVec2(6, 4));
  if (ImGui::SmallButton("x"))
    st.error_line.clear();
  ImGui::SameLine();
  ImGui::TextUnformatted(st.error_line.c_str());
  item_tooltip("%s", st.error_line.c_str());
  ImGui::EndChild();
  ImGui::PopStyleColor(2);
}

void draw_model_panel(AppState& st) {
  if (!begin_panel(st, "Model", &st.show_model, Slot::Model))
    return end_panel();
  const Snapshot& s = *st.snap;

  // Path field, Open, recent models.
  const float open_w = ImGui::CalcTextSize("Open").x + ImGui::GetStyle().FramePadding.x * 2;
  const float recent_w = ImGui::GetFrameHeight();
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x - open_w - recent_w - 2 * ImGui::GetStyle().ItemSpacing.x);
  if (st.focus_path) {
    ImGui::SetKeyboardFocusHere();
    st.focus_path = false;
  }
  const bool enter = ImGui::InputTextWithHint("##path", "checkpoint folder (config.json + *.safetensors)",
                                              &st.path_input, ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  ImGui::BeginDisabled(s.loading || st.path_input.empty());
  if (ImGui::Button("Open") || enter)
    st.open_model(st.path_input);
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (ImGui::ArrowButton("##recent", ImGuiDir_Down))
    ImGui::OpenPopup("recent");
  item_tooltip("Recent models");
  if (ImGui::BeginPopup("recent")) {
    if (st.settings.recent.empty())
      ImGui::TextDisabled("No recent models yet.");
    for (const auto& r : st.settings.recent)
      if (ImGui::Selectable(r.c_str())) {
        st.path_input = r;
        st.open_model(r);
      }
    ImGui::EndPopup();
  }

  if (s.loading) {
    ImGui::TextUnformatted(("Loading " + s.loading_dir).c_str());
    char overlay[160];
    std::snprintf(overlay, sizeof overlay, "%.0f%%  %s", s.load_fraction * 100, s.load_what.c_str());
    ImGui::ProgressBar(float(s.load_fraction), ImVec2(-1, 0), overlay);
  }
  error_banner(st);

  if (!s.model) {
    if (!s.loading)
      empty_state(
          "No model loaded.\nType a checkpoint folder above and press Open, drop a folder on this window, "
          "or start `diffscope DIR`.\nA folder holds config.json and the safetensors weights (DiffLlama, Motif or "
          "Llama).");
    return end_panel();
  }
  const ModelInfo& m = *s.model;
  const ModelConfig& c = m.cfg;
  // A model and its twin side by side in one folder (diffllama-demo / llama-demo): one click opens the twin in the
  // Compare panel on the same tokens; "switch" opens it here instead, keeping the prompt.
  const std::filesystem::path dir(m.dir);
  const std::string base = dir.filename().string();
  const std::string twin = base.rfind("diff", 0) == 0 ? base.substr(4) : "diff" + base;
  std::error_code ec;
  if (!s.loading && base.size() > 4 && std::filesystem::exists(dir.parent_path() / twin / "config.json", ec)) {
    const std::string label = std::string(c.is_diff() ? "Compare with the Transformer twin (" : "Compare with the "
                                                        "differential twin (") + twin + ")";
    if (ImGui::Button(label.c_str()))
      st.open_compare((dir.parent_path() / twin).string());
    item_tooltip("Opens %s beside this model in the Compare panel, on the same tokens.", twin.c_str());
    same_line_if_fits(button_w("switch"));
    if (ImGui::SmallButton("switch")) {
      st.path_input = (dir.parent_path() / twin).string();
      st.open_model(st.path_input);
    }
    item_tooltip("Opens %s here in place of this model, keeping the prompt.", twin.c_str());
  }
  char buf[256];
  if (!ImGui::BeginTable("info", 2, ImGuiTableFlags_SizingFixedFit))
    return end_panel();
  ImGui::TableSetupColumn("k");
  ImGui::TableSetupColumn("v", ImGuiTableColumnFlags_WidthStretch);
  if (c.is_diff() && c.noise_group > 1)  // grouped: the checkpoint's q heads are signal heads and shared noise heads
    std::snprintf(buf, sizeof buf, "%s, %lld layers x %lld differential heads (q: %lld signal + %lld noise, %lld kv)",
                  c.family(), (long long)c.layers, (long long)c.view_heads(), (long long)c.view_heads(),
                  (long long)(c.stored_q_heads - c.view_heads()), (long long)c.kv_heads);
  else if (c.is_diff())
    std::snprintf(buf, sizeof buf, "%s, %lld layers x %lld differential heads (%lld q, %lld kv)", c.family(),
                  (long long)c.layers, (long long)c.view_heads(), (long long)c.heads, (long long)c.kv_heads);
  else
    std::snprintf(buf, sizeof buf, "%s, %lld layers x %lld heads (%lld kv)", c.family(), (long long)c.layers,
                  (long long)c.heads, (long long)c.kv_heads);
  info_row("model", buf);
  if (c.spec().schedule != Schedule::Uniform) {  // a hybrid: which layers have attention
    int count[6] = {};
    for (int64_t l = 0; l < c.layers; ++l) ++count[int(c.kind(l))];
    std::snprintf(buf, sizeof buf,
                  "%d with maps (%d sliding window of %lld, %d full, %d cross on layer %lld's keys); %d mamba, %d gated "
                  "memory units",
                  count[int(LayerKind::SlidingAttention)] + count[int(LayerKind::Attention)] +
                      count[int(LayerKind::CrossAttention)],
                  count[int(LayerKind::SlidingAttention)], (long long)c.window, count[int(LayerKind::Attention)],
                  count[int(LayerKind::CrossAttention)], (long long)c.kv_source,
                  count[int(LayerKind::Mamba)] + count[int(LayerKind::Memory)], count[int(LayerKind::Gmu)]);
    info_row("layers", buf);
  }
  std::snprintf(buf, sizeof buf, "%s params, hidden %lld, d %lld, vocab %s", human_count(double(c.params())).c_str(),
                (long long)c.hidden, (long long)c.head_dim, human_count(double(c.vocab)).c_str());
  info_row("size", buf);
  info_row("backend", m.backend_name);
  info_row("tokenizer", m.has_tokenizer ? m.tokenizer : "none: the prompt is token ids");
  if (!m.has_tokenizer && ImGui::IsItemHovered())
    ImGui::SetTooltip("%s", m.tokenizer.c_str());
  info_row("folder", m.dir);
  ImGui::EndTable();

  end_panel();
}

}  // namespace ds::gui
