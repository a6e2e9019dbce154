// Panel frames: the default tiled layout (used on first start, after View > Reset layout and in --screenshot runs),
// and each panel's rectangle recorded for PNG export and the --state-json sidecar.
#include <algorithm>

#include <imgui_internal.h>

#include "panels.h"
#include "theme.h"

namespace ds::gui {

// Inputs on the left (model, prompt with the next-token table, generation, profiler), the head view across the top
// right, the row view under it, the overview and the lambda controls below (the corpus panel over both of them
// when it is open).
static ImRect slot_rect(Slot s) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  // On the very first frame WorkPos does not yet account for the main menu bar (ImGui applies it a frame later),
  // so reserve its height here.
  const float menu = std::max(0.0f, vp->Pos.y + ImGui::GetFrameHeight() - vp->WorkPos.y);
  const ImVec2 o(vp->WorkPos.x, vp->WorkPos.y + menu), sz(vp->WorkSize.x, vp->WorkSize.y - menu);
  const float lw = std::clamp(sz.x * 0.25f, 330.0f, 440.0f);
  const float h = sz.y;
  float model_h = std::clamp(h * 0.15f, 140.0f, 200.0f);
  float prompt_h = std::clamp(h * 0.31f, 260.0f, 460.0f);
  float gen_h = std::clamp(h * 0.34f, 260.0f, 440.0f);
  // Short windows: the left column shrinks in proportion, leaving the profiler a strip.
  if (const float room = std::max(120.0f, h - 100.0f), used = model_h + prompt_h + gen_h; used > room) {
    model_h *= room / used;
    prompt_h *= room / used;
    gen_h *= room / used;
  }
  const float head_h = std::max(330.0f, h * 0.45f);
  const float row_h = std::max(150.0f, h * 0.18f);
  const float rx = o.x + lw, rw = sz.x - lw;
  const float ow = std::max(rw * 0.45f, 280.0f);
  switch (s) {
    case Slot::Model:
      return ImRect(o.x, o.y, o.x + lw, o.y + model_h);
    case Slot::Prompt:
      return ImRect(o.x, o.y + model_h, o.x + lw, o.y + model_h + prompt_h);
    case Slot::Generate:
      return ImRect(o.x, o.y + model_h + prompt_h, o.x + lw, o.y + model_h + prompt_h + gen_h);
    case Slot::Profiler:
      return ImRect(o.x, o.y + model_h + prompt_h + gen_h, o.x + lw, o.y + h);
    case Slot::Head:
      return ImRect(rx, o.y, o.x + sz.x, o.y + head_h);
    case Slot::Row:
      return ImRect(rx, o.y + head_h, o.x + sz.x, o.y + head_h + row_h);
    case Slot::Overview:
      return ImRect(rx, o.y + head_h + row_h, rx + ow, o.y + h);
    case Slot::Lambda:
      return ImRect(rx + ow, o.y + head_h + row_h, o.x + sz.x, o.y + h);
    case Slot::Corpus:
      return ImRect(rx, o.y + head_h + row_h, o.x + sz.x, o.y + h);
  }
  return ImRect(o, ImVec2(o.x + sz.x, o.y + sz.y));
}

bool begin_panel(AppState& st, const char* name, bool* open, Slot slot, ImGuiWindowFlags flags) {
  const ImRect r = slot_rect(slot);
  const ImGuiCond cond = st.reset_layout ? ImGuiCond_Always : ImGuiCond_FirstUseEver;
  ImGui::SetNextWindowPos(r.Min, cond);
  ImGui::SetNextWindowSize(ImVec2(r.GetWidth(), r.GetHeight()), cond);
  const bool visible = ImGui::Begin(name, open, flags | ImGuiWindowFlags_NoCollapse);
  const ImVec2 p = ImGui::GetWindowPos(), s = ImGui::GetWindowSize();
  std::string key = name;  // "Title  details###Id" is recorded as "Id"
  if (const size_t at = key.find("###"); at != std::string::npos)
    key = key.substr(at + 3);
  st.panel_rects[key] = PanelRect{p.x * st.fb_scale, p.y * st.fb_scale, s.x * st.fb_scale, s.y * st.fb_scale};
  return visible;
}

void end_panel() {
  ImGui::End();
}



}  // namespace ds::gui
