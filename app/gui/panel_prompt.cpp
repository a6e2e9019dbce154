// Prompt panel: the multi-line prompt (text, or token ids for models without a tokenizer), Run on Ctrl+Enter,
// the tokens as the model sees them (generated ones after the prompt, in their own colour), and the next-token
// top-k with probabilities.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"
#include "token_flow.h"

namespace ds::gui {

// The tokens as the model sees them, wrapped like text; only the lines on screen are laid out and drawn, so the list
// stays usable at 128K tokens. Click a token to see its attention row in the row view.
static TokenFlow g_token_flow;

static void token_list(AppState& st, const std::shared_ptr<const RunResult>& rp) {
  const RunResult& r = *rp;
  const int64_t n = int64_t(r.tokens.size());
  g_token_flow.layout(rp, n, ImGui::GetContentRegionAvail().x - ImGui::GetStyle().ScrollbarSize - 4);
  const float lines_h = float(g_token_flow.lines()) * (ImGui::GetTextLineHeight() + 2 + TokenFlow::spacing());
  const float h = std::clamp(lines_h + 4, ImGui::GetTextLineHeight() * 2, ImGui::GetTextLineHeight() * 9);
  const ThemeColors& tc = theme_colors();
  const int64_t row = st.snap->row ? st.snap->row->q : -1;
  const int64_t P = r.prompt_len > 0 ? r.prompt_len : n;
  // While a generation streams the list follows its end.
  const int64_t follow = st.snap->gen && st.snap->gen->streaming ? n - 1 : -1;
  const AppState::AnswerMark* ans = st.answer_span();  // a prompt opened from a corpus scan: its answer span
  const int64_t hovered = g_token_flow.draw("##tokens", h, [&](int64_t i, ImVec2 a, ImVec2 b, bool hov) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImU32 fill = i >= P ? (hov ? tc.generated_hover : tc.generated)
                              : ImGui::GetColorU32(hov ? ImGuiCol_ButtonHovered : ImGuiCol_Button);
    dl->AddRectFilled(a, b, fill, 2.0f);
    dl->AddText(ImVec2(a.x + TokenFlow::pad() * 0.5f, a.y + 1), ImGui::GetColorU32(ImGuiCol_Text),
                TokenFlow::label(r, i).c_str());
    if (ans && i >= ans->begin && i < ans->end)
      dl->AddRectFilled(ImVec2(a.x + 1, b.y - 3), ImVec2(b.x - 1, b.y), tc.answer_mark, 1.0f);
    if (i == row)
      dl->AddRect(a, b, tc.selection, 2.0f, 0, 2.0f);
  }, follow);
  if (hovered >= 0) {
    const bool in_answer = ans && hovered >= ans->begin && hovered < ans->end;
    ImGui::SetTooltip("position %lld%s%s\nid %d\n\"%s\"\nclick: show its attention row", (long long)hovered,
                      hovered >= P ? " (generated)" : "", in_answer ? " (answer span)" : "", r.ids[size_t(hovered)],
                      r.tokens[size_t(hovered)].c_str());
    if (ImGui::IsMouseClicked(0))
      st.select_row(hovered);
  }
}

static void top_k_table(const RunResult& r) {
  if (r.top.empty())
    return;
  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("topk", 4, flags))
    return;
  ImGui::TableSetupColumn("#");
  ImGui::TableSetupColumn("token", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableSetupColumn("p", ImGuiTableColumnFlags_WidthFixed, 120);
  ImGui::TableSetupColumn("logit");
  ImGui::TableHeadersRow();
  for (size_t i = 0; i < r.top.size(); ++i) {
    const TopToken& t = r.top[i];
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%zu", i + 1);
    ImGui::TableNextColumn();
    const std::string lab = token_label(t.text, 24);
    ImGui::Text("%s", lab.c_str());
    item_tooltip("id %d\n\"%s\"", t.id, t.text.c_str());
    ImGui::TableNextColumn();
    char p[32];
    std::snprintf(p, sizeof p, "%.3f", t.prob);
    ImGui::ProgressBar(t.prob, ImVec2(-1, ImGui::GetTextLineHeight()), p);
    ImGui::TableNextColumn();
    ImGui::Text("%.2f", t.logit);
  }
  ImGui::EndTable();
}

void draw_prompt_panel(AppState& st) {
  if (!begin_panel(st, "Prompt", &st.show_prompt, Slot::Prompt))
    return end_panel();
  const Snapshot& s = *st.snap;
  if (!s.model) {
    empty_state("Open a model first (Model panel); then type a prompt here and press Ctrl+Enter.");
    return end_panel();
  }
  const ModelInfo& m = *s.model;

  if (!m.has_tokenizer) {
    ImGui::TextWrapped("This model has no tokenizer.json: type token ids from 0 to %lld, separated by commas.",
                       (long long)m.cfg.vocab - 1);
  }
  std::string& buf = st.prompt.ids_mode ? st.prompt.ids : st.prompt.text;
  if (st.prompt.focus) {
    ImGui::SetKeyboardFocusHere();
    st.prompt.focus = false;
  }
  const float box_h = ImGui::GetTextLineHeight() * 5 + 8;
  if (ImGui::InputTextMultiline("##prompt", &buf, ImVec2(-1, box_h), ImGuiInputTextFlags_EnterReturnsTrue)) {
    st.run_prompt();  // Ctrl+Enter (plain Enter types a new line)
    st.prompt.focus = true;
  }
  ImGui::BeginDisabled(s.loading || st.scanning());
  if (ImGui::Button("Run"))
    st.run_prompt();
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip(st.scanning() ? "A corpus scan is running: the prompt can run when it has finished (or Stop it)"
                                    : "Run the prompt (Ctrl+Enter)");
  ImGui::SameLine();
  ImGui::BeginDisabled(!m.has_tokenizer);
  ImGui::Checkbox("token ids", &st.prompt.ids_mode);
  ImGui::EndDisabled();
  ImGui::SameLine();
  const int64_t n_all = s.result ? int64_t(s.result->tokens.size()) : 0;
  const int64_t n_gen = s.result && s.result->prompt_len > 0 ? n_all - s.result->prompt_len : 0;
  if (st.scanning())
    ImGui::TextDisabled("corpus scan running...");
  else if (s.gen && s.gen->streaming)
    ImGui::TextDisabled("generating... %lld + %lld tokens", (long long)(n_all - n_gen), (long long)n_gen);
  else if (s.running)
    ImGui::TextDisabled("running...");
  else if (s.result && n_gen > 0)
    ImGui::TextDisabled("%lld + %lld generated tokens, %.1f ms", (long long)(n_all - n_gen), (long long)n_gen,
                        s.result->run_ms);
  else if (s.result)
    ImGui::TextDisabled("%zu tokens, %.1f ms", s.result->tokens.size(), s.result->run_ms);

  if (const AppState::AnswerMark* ans = st.answer_span())
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().answer_mark),
                       "corpus line %d: answer span %lld..%lld (underlined)", ans->line, (long long)ans->begin,
                       (long long)ans->end - 1);
  if (!s.result) {
    empty_state("Press Ctrl+Enter or Run to see the model's attention for this prompt.");
    return end_panel();
  }
  const RunResult& r = *s.result;
  char tokens_title[96];
  if (n_gen > 0)
    std::snprintf(tokens_title, sizeof tokens_title, "Tokens (%lld + %lld generated)###Tokens",
                  (long long)(n_all - n_gen), (long long)n_gen);
  else
    std::snprintf(tokens_title, sizeof tokens_title, "Tokens (%zu)###Tokens", r.tokens.size());
  if (ImGui::CollapsingHeader(tokens_title, ImGuiTreeNodeFlags_None))
    token_list(st, s.result);
  section_title("Next token");
  top_k_table(r);
  end_panel();
}

}  // namespace ds::gui
