// Generate panel: the model continues the prompt (Session::begin_generation / generate_step, on the worker), token
// by token as they come. Step generates one token at a time, Stop ends a generation between two tokens (what was
// generated stays), Clear goes back to the prompt. Generated tokens are clickable like the prompt's: the row view
// then shows that position's attention. Regenerate runs the same options (seed included) again under the lambda
// of now and shows the previous continuation under the new one, the first token where they part marked, so a
// lambda change shows how the answer changes.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"
#include "token_flow.h"

namespace ds::gui {

namespace {

const char* stop_text(const std::string& reason) {
  if (reason == "eos")
    return "end of sequence";
  if (reason == "max_tokens")
    return "max new tokens";
  if (reason == "context_full")
    return "context full";
  if (reason == "stopped")
    return "stopped";
  return "";
}

// "λ x1.00", "λ x0.50, 2 layers fixed": the lambda controls a continuation was generated under.
std::string lambda_text(const AppState& st, const LambdaControl& c, bool moved) {
  int fixed = 0;
  for (const auto& o : c.override_)
    fixed += o.has_value();
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s x%.2f%s%s", st.lam(), c.scale, fixed ? ", " : "",
                fixed ? (std::to_string(fixed) + (fixed == 1 ? " layer fixed" : " layers fixed")).c_str() : "");
  std::string s = buf;
  if (moved)
    s += ", changed while generating";
  return s;
}

bool same_options(const GenerateOptions& a, const GenerateOptions& b) {
  return a.max_new == b.max_new && a.stop_at_eos == b.stop_at_eos &&
         a.sampling.temperature == b.sampling.temperature && a.sampling.top_k == b.sampling.top_k &&
         a.sampling.top_p == b.sampling.top_p && a.sampling.seed == b.sampling.seed;
}

std::string options_text(const GenerateOptions& o) {
  char buf[160];
  if (o.sampling.greedy())
    std::snprintf(buf, sizeof buf, "greedy, up to %d tokens%s", o.max_new, o.stop_at_eos ? "" : ", past EOS");
  else
    std::snprintf(buf, sizeof buf, "T %.2f, top-k %d, top-p %.2f, seed %llu, up to %d tokens%s", o.sampling.temperature,
                  o.sampling.top_k, o.sampling.top_p, (unsigned long long)o.sampling.seed, o.max_new,
                  o.stop_at_eos ? "" : ", past EOS");
  return buf;
}

struct ChipStyle {
  ImU32 fill = 0, text = 0, border = 0;
  float border_w = 0;
};

// Tokens laid out as boxes wrapped like text in `width` pixels: each token's x and line.
struct ChipLayout {
  std::vector<std::string> labels;
  std::vector<ImVec2> at;  // x, line
  std::vector<float> w;
  int lines = 1;
};

ChipLayout layout_chips(const std::vector<std::string>& tokens, float width) {
  ChipLayout L;
  const float pad = TokenFlow::pad(), sp = TokenFlow::spacing();
  float x = 0;
  int line = 0;
  for (const auto& t : tokens) {
    L.labels.push_back(token_label(t, 18));
    const float w = ImGui::CalcTextSize(L.labels.back().c_str()).x + pad;
    if (x > 0 && x + w > width) {
      ++line;
      x = 0;
    }
    L.at.push_back(ImVec2(x, float(line)));
    L.w.push_back(w);
    x += w + sp;
  }
  L.lines = line + 1;
  return L;
}

float chip_line_h() {
  return ImGui::GetTextLineHeight() + 2 + TokenFlow::spacing();
}

float chip_width() {
  return std::max(40.0f, ImGui::GetContentRegionAvail().x - ImGui::GetStyle().ScrollbarSize - 4);
}

// The chips in a child at most max_lines lines tall (it scrolls beyond). Returns the token under the mouse, -1 for
// none. follow: keep the end in view while the continuation grows.
int64_t chip_flow(const char* id, const ChipLayout& L, int max_lines, bool follow,
                  const std::function<ChipStyle(int64_t, bool)>& style) {
  const float pad = TokenFlow::pad(), sp = TokenFlow::spacing(), line_h = chip_line_h();
  const float h = float(std::clamp(L.lines, 1, std::max(1, max_lines))) * line_h + 2;
  int64_t hovered = -1;
  ImGui::BeginChild(id, ImVec2(0, h), false);
  const ImVec2 o = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const bool win_hovered = ImGui::IsWindowHovered();
  for (size_t i = 0; i < L.labels.size(); ++i) {
    const ImVec2 a(o.x + L.at[i].x, o.y + L.at[i].y * line_h), b(a.x + L.w[i], a.y + line_h - sp);
    const bool hov = win_hovered && mouse.x >= a.x && mouse.x < b.x && mouse.y >= a.y && mouse.y < b.y;
    if (hov)
      hovered = int64_t(i);
    const ChipStyle cs = style(int64_t(i), hov);
    dl->AddRectFilled(a, b, cs.fill, 2.0f);
    dl->AddText(ImVec2(a.x + pad * 0.5f, a.y + 1), cs.text, L.labels[i].c_str());
    if (cs.border_w > 0)
      dl->AddRect(a, b, cs.border, 2.0f, 0, cs.border_w);
  }
  ImGui::Dummy(ImVec2(1, float(L.lines) * line_h));
  if (follow)
    ImGui::SetScrollY(ImGui::GetScrollMaxY());
  ImGui::EndChild();
  return hovered;
}

// Lines the decoded text takes when wrapped to the panel.
int text_lines(const std::string& text) {
  if (text.empty())
    return 0;
  const float w = ImGui::GetContentRegionAvail().x - ImGui::GetStyle().ScrollbarSize;
  const ImVec2 sz = ImGui::CalcTextSize(("\"" + text + "\"").c_str(), nullptr, false, w);
  return std::max(1, int(std::lround(sz.y / ImGui::GetTextLineHeight())));
}

// The decoded text of a continuation, quoted and wrapped, in at most max_lines lines (a scrolling box beyond).
void continuation_text(const char* id, const std::string& text, ImU32 col, int max_lines, bool follow) {
  if (text.empty())
    return;
  const std::string quoted = "\"" + text + "\"";
  const int lines = text_lines(text);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(col));
  if (lines > max_lines) {
    ImGui::BeginChild(id, ImVec2(0, float(max_lines) * ImGui::GetTextLineHeight() + 2), false);
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted(quoted.c_str());
    ImGui::PopTextWrapPos();
    if (follow)
      ImGui::SetScrollY(ImGui::GetScrollMaxY());
    ImGui::EndChild();
  } else {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted(quoted.c_str());
    ImGui::PopTextWrapPos();
  }
  ImGui::PopStyleColor();
}




// Two rows: how much and when to stop, greedy or sampling; then the sampling parameters (disabled for greedy).
void options_controls(AppState& st, const ModelInfo& m, bool locked) {
  ImGui::BeginDisabled(locked);
  ImGui::SetNextItemWidth(ImGui::CalcTextSize("000000").x + ImGui::GetStyle().FramePadding.x * 2);
  int max_new = st.generation.options.max_new;
  if (ImGui::InputInt("max new", &max_new, 0, 0))
    st.generation.options.max_new = std::clamp(max_new, 1, int(std::min<int64_t>(m.cfg.max_positions, 1000000)));
  item_tooltip("Tokens to generate at most (fewer when the model's context fills up)");
  same_line_if_fits(checkbox_w("stop at EOS"));
  ImGui::BeginDisabled(m.eos_ids.empty());
  ImGui::Checkbox("stop at EOS", &st.generation.options.stop_at_eos);
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) {
    if (m.eos_ids.empty()) {
      ImGui::SetTooltip("This model names no end-of-sequence token");
    } else {
      std::string ids;
      for (size_t i = 0; i < m.eos_ids.size() && i < 8; ++i)
        ids += (i ? ", " : "") + std::to_string(m.eos_ids[i]);
      ImGui::SetTooltip("Stop after the model's end-of-sequence token (id %s)", ids.c_str());
    }
  }
  same_line_if_fits(checkbox_w("sample"));
  ImGui::Checkbox("sample", &st.generation.sample);
  item_tooltip("Off: greedy, always the most likely token.\n"
               "On: draw each token from the distribution (temperature, top-k, top-p) with a seeded\n"
               "generator: the same seed gives the same continuation");
  ImGui::BeginDisabled(!st.generation.sample);
  // Four fields of equal width after their labels.
  const float inner = ImGui::GetStyle().ItemInnerSpacing.x, gap = ImGui::GetStyle().ItemSpacing.x;
  const float labels = ImGui::CalcTextSize("temp").x + ImGui::CalcTextSize("top-k").x +
                       ImGui::CalcTextSize("top-p").x + ImGui::CalcTextSize("seed").x + 4 * inner + 3 * gap;
  const float avail = ImGui::GetContentRegionAvail().x;
  float field = (avail - labels) / 4;
  const bool two_rows = field < 44;  // a narrow panel: two fields a row
  if (two_rows) {
    const float row_labels = std::max(ImGui::CalcTextSize("temp").x + ImGui::CalcTextSize("top-k").x,
                                      ImGui::CalcTextSize("top-p").x + ImGui::CalcTextSize("seed").x);
    field = std::max(30.0f, (avail - row_labels - 2 * inner - gap) / 2);
  }
  float temp = float(st.generation.temperature);
  ImGui::SetNextItemWidth(field);
  if (ImGui::SliderFloat("temp", &temp, 0.05f, 2.0f, "%.2f"))
    st.generation.temperature = std::max(0.01, double(temp));
  item_tooltip("Temperature: below 1 sharpens the distribution, above 1 flattens it");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(field);
  int top_k = st.generation.options.sampling.top_k;
  if (ImGui::DragInt("top-k", &top_k, 0.5f, 0, int(std::min<int64_t>(m.cfg.vocab, INT32_MAX)), top_k ? "%d" : "all"))
    st.generation.options.sampling.top_k = std::max(0, top_k);
  item_tooltip("Sample from the k most likely tokens only (0: all)");
  if (!two_rows)
    ImGui::SameLine();
  ImGui::SetNextItemWidth(field);
  float top_p = float(st.generation.options.sampling.top_p);
  if (ImGui::SliderFloat("top-p", &top_p, 0.01f, 1.0f, "%.2f"))
    st.generation.options.sampling.top_p = std::clamp(double(top_p), 0.01, 1.0);
  item_tooltip("Then the smallest set of tokens whose probability reaches p (1: all)");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(field);
  int seed = int(std::min<uint64_t>(st.generation.options.sampling.seed, INT32_MAX));
  if (ImGui::DragInt("seed", &seed, 0.2f, 0, INT32_MAX))
    st.generation.options.sampling.seed = uint64_t(std::max(0, seed));
  ImGui::EndDisabled();
  ImGui::EndDisabled();
}

}  // namespace

namespace {

void generate_title(const Generation* gp, char* title, size_t size) {
  if (gp && gp->streaming)
    std::snprintf(title, size, "Generate  generating...###Generate");
  else if (gp && !gp->now.empty())
    std::snprintf(title, size, "Generate  %zu tokens###Generate", gp->now.ids.size());
  else
    std::snprintf(title, size, "Generate###Generate");
}

// Generate, Step, Stop, Clear and Regenerate, each enabled when it can act.
void action_buttons(AppState& st, bool streaming, bool active, bool have_now) {
  const bool can = st.can_generate();
  ImGui::BeginDisabled(!can);
  if (ImGui::Button("Generate"))
    st.generate();
  item_tooltip("Continue the prompt with these options, token by token (Ctrl+G)");
  same_line_if_fits(button_w(active ? "Step +1" : "Step"));
  if (ImGui::Button(active ? "Step +1" : "Step"))
    st.generate_step();
  item_tooltip("%s", active ? "One more token of this continuation (F10)"
                            : "One token: begins a new continuation of the prompt (F10); Step again for the next");
  ImGui::EndDisabled();
  same_line_if_fits(button_w("Stop"));
  ImGui::BeginDisabled(!streaming && !active);
  if (ImGui::Button("Stop"))
    st.stop_generation();
  item_tooltip("Stop after the token being computed; what was generated stays (Shift+F5)");
  ImGui::EndDisabled();
  same_line_if_fits(button_w("Clear"));
  ImGui::BeginDisabled(!can || !have_now);
  if (ImGui::Button("Clear"))
    st.clear_generation();
  item_tooltip("Back to the prompt alone (the continuation is kept as the one to compare with)");
  ImGui::EndDisabled();
  same_line_if_fits(button_w("Regenerate"));
  const GenerateOptions* last = st.last_generate_options();
  ImGui::BeginDisabled(!can || !last);
  if (ImGui::Button("Regenerate"))
    st.regenerate();
  item_tooltip("Generate again with the same options (seed included) under the current %s, and compare\n"
               "with the previous continuation: move %s, then Regenerate to see how the answer changes\n"
               "(Ctrl+Shift+G)",
               st.lam(), st.lam());
  ImGui::EndDisabled();
}

// Progress while streaming, then how it ended.
void status_line(const AppState& st, const Generation& g, bool streaming, bool have_now) {
  const ThemeColors& tc = theme_colors();
  char status[192];
  const double tps = g.tokens_per_s();
  if (streaming)
    std::snprintf(status, sizeof status, "generating... %zu / %d   %.1f tokens/s", g.now.ids.size(),
                  g.now.options.max_new, tps);
  else if (have_now)
    std::snprintf(status, sizeof status, "%zu tokens   %.1f tokens/s   %s%s", g.now.ids.size(), tps,
                  g.now.stop_reason.empty() ? "paused: Step continues" : "stop: ", stop_text(g.now.stop_reason));
  else
    std::snprintf(status, sizeof status, "cleared: back to the prompt (%lld tokens)", (long long)g.prompt_len);
  ImGui::Spacing();
  ImGui::PushStyleColor(ImGuiCol_Text, streaming ? ImGui::ColorConvertU32ToFloat4(tc.generated_mark)
                                                 : ImGui::GetStyle().Colors[ImGuiCol_Text]);
  ImGui::TextWrapped("%s", status);
  ImGui::PopStyleColor();
  if (have_now && ImGui::IsItemHovered())
    ImGui::SetTooltip("%s\n%s", options_text(g.now.options).c_str(),
                      lambda_text(st, g.now.lambda, g.now.lambda_moved).c_str());
}

// How many chip lines each continuation gets of the height left (the current one first, the previous one when
// comparing), and how many lines of the current one's text.
struct ChipShares {
  int now_lines = 0, before_lines = 0, now_text = 0;
};
ChipShares share_height(const Generation& g, const ChipLayout& now_chips, const ChipLayout& before_chips, bool show_now,
                        bool compare) {
  ChipShares c;
  const float line_h = chip_line_h(), tl = ImGui::GetTextLineHeightWithSpacing();
  c.now_text = show_now ? std::min(text_lines(g.now.text), compare ? 2 : 4) : 0;
  const float labels_h = compare ? 3 * tl + ImGui::GetStyle().ItemSpacing.y * 2 : 0;
  const float room = ImGui::GetContentRegionAvail().y - labels_h - float(c.now_text) * ImGui::GetTextLineHeight() -
                     3 * ImGui::GetStyle().ItemSpacing.y;
  const int chip_lines = std::max(2, int(room / line_h));
  c.now_lines = show_now ? now_chips.lines : 0;
  c.before_lines = compare ? before_chips.lines : 0;
  if (c.now_lines + c.before_lines > chip_lines) {
    const int half = std::max(1, chip_lines / 2);
    if (c.now_lines > half && c.before_lines > chip_lines - half)
      c.now_lines = chip_lines - std::min(c.before_lines, half), c.before_lines = chip_lines - c.now_lines;
    else if (c.now_lines > half)
      c.now_lines = chip_lines - c.before_lines;
    else
      c.before_lines = chip_lines - c.now_lines;
  }
  return c;
}

// The continuation of now: clickable like the prompt's tokens (a click shows its attention row).
void now_continuation(AppState& st, const Generation& g, const ChipLayout& chips, const ChipShares& sh, bool streaming,
                      bool compare, int64_t row_q) {
  const ThemeColors& tc = theme_colors();
  const ImU32 text_col = ImGui::GetColorU32(ImGuiCol_Text);
  const int64_t P = g.prompt_len;
  if (compare)
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.generated_mark), "now   %s",
                       lambda_text(st, g.now.lambda, g.now.lambda_moved).c_str());
  const int64_t hov = chip_flow("##now", chips, std::max(1, sh.now_lines), streaming, [&](int64_t i, bool h) {
    ChipStyle cs;
    cs.fill = h ? tc.generated_hover : tc.generated;
    cs.text = text_col;
    if (P + i == row_q) {
      cs.border = tc.selection;
      cs.border_w = 2;
    } else if (compare && i == g.first_diff) {
      cs.border = tc.diff_mark;
      cs.border_w = 2;
    }
    return cs;
  });
  if (hov >= 0) {
    ImGui::SetTooltip("generated token %lld (position %lld)\nid %d\n\"%s\"\nclick: show its attention row",
                      (long long)hov + 1, (long long)(P + hov), g.now.ids[size_t(hov)], g.now.tokens[size_t(hov)].c_str());
    if (ImGui::IsMouseClicked(0))
      st.select_row(P + hov);
  }
  continuation_text("##now_text", g.now.text, text_col, std::max(1, sh.now_text), streaming);
}

// The previous continuation, dimmed, and where the two part.
void before_continuation(const AppState& st, const Generation& g, const ChipLayout& chips, const ChipShares& sh,
                         bool streaming, bool active, bool have_now) {
  const ThemeColors& tc = theme_colors();
  const ImU32 text_col = ImGui::GetColorU32(ImGuiCol_Text), dim_col = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  const Continuation& b = *g.before;
  ImGui::TextDisabled("before   %s%s", lambda_text(st, b.lambda, b.lambda_moved).c_str(),
                      same_options(b.options, g.now.options) || g.now.empty() ? "" : ", other options");
  if (ImGui::IsItemHovered() && !b.text.empty())
    ImGui::SetTooltip("\"%s\"", b.text.c_str());
  const int64_t hov = chip_flow("##before", chips, std::max(1, sh.before_lines), false, [&](int64_t i, bool) {
    ChipStyle cs;
    cs.fill = ImGui::GetColorU32(ImGuiCol_FrameBg);
    cs.text = dim_col;
    if (i == g.first_diff) {
      cs.border = tc.diff_mark;
      cs.border_w = 2;
      cs.text = text_col;
    }
    return cs;
  });
  if (hov >= 0)
    ImGui::SetTooltip("previous continuation, token %lld\nid %d\n\"%s\"%s%s", (long long)hov + 1, b.ids[size_t(hov)],
                      b.tokens[size_t(hov)].c_str(), b.text.empty() ? "" : "\n\n", b.text.c_str());
  if (have_now && g.first_diff >= 0) {
    const size_t d = size_t(g.first_diff);
    const std::string was = d < b.tokens.size() ? "\"" + token_label(b.tokens[d], 16) + "\"" : "(ended)";
    const std::string is = d < g.now.tokens.size() ? "\"" + token_label(g.now.tokens[d], 16) + "\"" : "(ended)";
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.diff_mark), "differs from token %zu: %s %s %s", d + 1,
                       was.c_str(), st.greek ? "\xe2\x86\x92" : "->", is.c_str());
  } else if (have_now && !streaming && !active) {
    ImGui::TextDisabled("the same %zu tokens as before", g.now.ids.size());
  } else if (!have_now && !streaming) {
    ImGui::TextDisabled("Generate or Regenerate to compare with this continuation.");
  }
}

}  // namespace

void draw_generate_panel(AppState& st) {
  const Snapshot& s = *st.snap;
  const std::shared_ptr<const Generation> gp = s.gen;
  char title[96];
  generate_title(gp.get(), title, sizeof title);
  if (!begin_panel(st, title, &st.show_generate, Slot::Generate))
    return end_panel();
  if (!s.model) {
    empty_state("Open a model and run a prompt; then Generate continues it, token by token.");
    return end_panel();
  }
  const bool streaming = gp && gp->streaming;
  const bool active = gp && gp->active;
  const bool have_now = gp && !gp->now.empty();
  action_buttons(st, streaming, active, have_now);
  options_controls(st, *s.model, streaming);
  if (!gp || (!have_now && !streaming && !gp->before)) {
    ImGui::Spacing();
    if (!s.result)
      empty_state("Run the prompt first.");
    else
      empty_state("Generate continues the prompt. Click a generated token to see its attention in the row view; "
                  "change lambda and Regenerate to compare the answers.");
    return end_panel();
  }
  const Generation& g = *gp;
  status_line(st, g, streaming, have_now);
  const bool compare = g.before != nullptr, show_now = have_now || streaming;
  const float width = chip_width();
  const ChipLayout now_chips = layout_chips(g.now.tokens, width);
  const ChipLayout before_chips = compare ? layout_chips(g.before->tokens, width) : ChipLayout{};
  const ChipShares sh = share_height(g, now_chips, before_chips, show_now, compare);
  if (show_now)
    now_continuation(st, g, now_chips, sh, streaming, compare, s.row ? s.row->q : -1);
  if (compare)
    before_continuation(st, g, before_chips, sh, streaming, active, have_now);
  end_panel();
}

}  // namespace ds::gui
