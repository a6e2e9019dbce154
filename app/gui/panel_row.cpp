// Row view: one query token's attention in the selected head, exactly (Backend::map_rows): A1, A2 and
// A1 - lambda*A2 over the key positions 0..q as a plot, and the prompt up to q with every token coloured by the
// chosen row. Pick the query by clicking a cell in the head view, a token in the prompt's token list, or a token
// here; it starts on the last token (the one whose next-token prediction the prompt asks for).
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"
#include "token_flow.h"

namespace ds::gui {

namespace {

TokenFlow g_flow;

}  // namespace

namespace {

// The row on screen: one head's attention of query q over keys 0..q, and the difference under the layer's lambda.
struct RowData {
  const RunResult* r = nullptr;
  const RowMaps* rm = nullptr;
  int64_t q = 0, count = 0, P = INT64_MAX;  // P: the first generated position
  int head = 0;
  const float* a1 = nullptr;
  const float* a2 = nullptr;  // null for plain heads and Mamba channels
  std::vector<float> d;       // A1 - lambda A2 (A1 alone without A2)
  std::string diff_name;      // "A1 - lambda*A2" with the panel's lambda glyph
};

void row_title(const Snapshot& s, int head, char* title, size_t size) {
  const auto& rp = s.row;
  const int64_t P = s.result && s.result->prompt_len > 0 ? s.result->prompt_len : INT64_MAX;
  if (rp && s.result && rp->implicit)
    std::snprintf(title, size, "Row  query %lld%s, L%d channel %d (implicit attention)###Row", (long long)rp->q,
                  rp->q >= P ? " (generated)" : "", rp->layer, rp->channel);
  else if (rp && s.result)
    std::snprintf(title, size, "Row  query %lld%s, L%d.H%d###Row", (long long)rp->q, rp->q >= P ? " (generated)" : "",
                  rp->layer, head);
  else
    std::snprintf(title, size, "Row###Row");
}

// One key's values, in the plot's and the text's tooltips.
void key_values(const AppState& st, const RowData& row, int64_t k) {
  ImGui::Text("key %lld \"%s\"", (long long)k, TokenFlow::label(*row.r, k).c_str());
  if (row.a2)
    ImGui::Text("A1 %.5f   A2 %.5f   A1 - %s*A2 %+.5f", row.a1[k], row.a2[k], st.lam(), row.d[size_t(k)]);
  else
    ImGui::Text(row.rm->implicit ? "M %+.5g" : "A %.5f", row.a1[k]);
}

// Header: the query, what colours the text, and for a prompt opened from a corpus scan the answer span's share.
void row_header(AppState& st, const RowData& row, const AppState::AnswerMark* ans) {
  const RowMaps& rm = *row.rm;
  const int64_t q = row.q;
  const std::string qlab = TokenFlow::label(*row.r, q);
  if (q >= row.P)
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().generated_mark), "query %lld \"%s\", generated #%lld",
                       (long long)q, qlab.c_str(), (long long)(q - row.P + 1));
  else
    ImGui::Text("query %lld \"%s\"", (long long)q, qlab.c_str());
  ImGui::SameLine();
  if (ImGui::SmallButton("last token"))
    st.select_row(-1);
  ImGui::SameLine();
  ImGui::TextDisabled("| colour text by");
  ImGui::SameLine();
  const char* names[3] = {row.diff_name.c_str(), "A1", "A2"};
  if (!rm.differential)
    st.row_color = 1, names[1] = rm.implicit ? "M" : "A";
  ImGui::SetNextItemWidth(130);
  ImGui::Combo("##rowcol", &st.row_color, names, rm.differential ? 3 : 2);
  ImGui::SameLine();
  if (ImGui::Checkbox("logit lens", &st.req.lens))
    st.submit_now();
  item_tooltip("What each layer predicts at this position: its output on the residual stream through the final\n"
               "norm and the LM head (the last layer's is the model's own). Shown in place of the text, with the\n"
               "probability and rank of the model's next token after the last position.");
  if (!ans || ans->begin > q)
    return;
  const Fractions12 f = row_fractions(rm, row.head, ans->begin, ans->end);
  char buf[160];
  if (rm.differential)
    std::snprintf(buf, sizeof buf, "answer %lld..%lld: A1 %.3f  A2 %.3f  D %.3f", (long long)ans->begin,
                  (long long)ans->end - 1, f[0], f[1], f[2]);
  else
    std::snprintf(buf, sizeof buf, "answer %lld..%lld: %.3f", (long long)ans->begin, (long long)ans->end - 1, f[0]);
  same_line_if_fits(ImGui::CalcTextSize(buf).x);
  ImGui::AlignTextToFramePadding();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().answer_mark), "%s", buf);
  item_tooltip("corpus line %d: the answer span's share of this row (head %d), as the corpus scan measures it:\n"
               "A1, A2 and D = A1 - %s*A2 summed over the span, over the row's sum\n"
               "(the scan's heatmap averages this over prompts)",
               ans->line, row.head, st.lam());
}

// The logit lens at the row's position (Request::lens): per layer the top token and its probability, and the
// probability and rank of the target (the model's next token after the last position).
void lens_table(const Snapshot& s, int64_t q) {
  const auto& lv = s.lens;
  if (!lv || lv->result_seq != s.result->seq || lv->lens.layers.empty() || lv->lens.layers[0].positions.empty() ||
      lv->lens.layers[0].positions[0].position != q) {
    ImGui::TextDisabled("logit lens: computing...");
    return;
  }
  const Lens& lens = lv->lens;
  ImGui::Text("logit lens at %lld   target \"%s\"", (long long)q, token_label(lens.target_text, 24).c_str());
  item_tooltip("Each layer's output on the residual stream through the final norm and the LM head: its top token\n"
               "at this position and the target's probability and rank. The target is the model's own next token\n"
               "after the last position (diffscope-run --lens-target picks another). Hover a top token: its top 5.");
  const ImGuiTableFlags tf = ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY;
  if (!ImGui::BeginTable("lens", 5, tf))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("layer");
  ImGui::TableSetupColumn("top token");
  ImGui::TableSetupColumn("p");
  ImGui::TableSetupColumn("target p");
  ImGui::TableSetupColumn("rank", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  for (const LensLayer& l : lens.layers) {
    const LensEntry& e = l.positions[0];
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%d", l.layer);
    ImGui::TableNextColumn();
    ImGui::PushID(int(l.layer));
    ImGui::Selectable(token_label(e.top.at(0).text, 16).c_str(), false);  // (the whole cell takes the hover)
    ImGui::PopID();
    if (ImGui::IsItemHovered()) {
      std::string t = "layer " + std::to_string(l.layer) + ", top " + std::to_string(e.top.size()) + ":";
      char buf[32];
      for (const auto& x : e.top) {
        std::snprintf(buf, sizeof buf, "  %.3g", double(x.prob));
        t += "\n\"" + token_label(x.text, 24) + "\"" + buf;
      }
      ImGui::SetTooltip("%s", t.c_str());
    }
    ImGui::TableNextColumn();
    ImGui::Text("%.3g", double(e.top.at(0).prob));
    ImGui::TableNextColumn();
    ImGui::Text("%.3g", double(e.target_prob));
    ImGui::TableNextColumn();
    ImGui::Text("%lld", (long long)e.target_rank);
  }
  ImGui::EndTable();
}

// The row over key positions: A1, A2 and the difference, the answer span shaded, the key under the mouse.
void row_plot(const AppState& st, const RowData& row, const AppState::AnswerMark* ans, float plot_w, float plot_h) {
  const RowMaps& rm = *row.rm;
  const ThemeColors& tc = theme_colors();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const float lh = ImGui::GetTextLineHeight();
  const int64_t count = row.count, q = row.q;
  const float *a1 = row.a1, *a2 = row.a2;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float left = ImGui::CalcTextSize("-0.00").x + 6;
  const ImVec2 a(p0.x + left, p0.y + 2), b(p0.x + plot_w - 8, p0.y + plot_h - lh - 4);
  float lo = 0, hi = 0;
  for (int64_t k = 0; k < count; ++k) {
    lo = std::min({lo, a1[k], a2 ? a2[k] : 0.0f, row.d[size_t(k)]});
    hi = std::max({hi, a1[k], a2 ? a2[k] : 0.0f, row.d[size_t(k)]});
  }
  hi = std::max(hi, lo + 1e-6f);
  if (b.x - a.x > 20 && b.y - a.y > 20) {
    draw_row_frame(dl, a, b, count, lo, hi, ans ? ans->begin : count, ans ? ans->end : count);  // the answer span shaded
    if (a2)
      draw_row_series(dl, a, b, a2, count, lo, hi, (tc.plot_b & 0x00ffffffu) | 0xb0000000u);
    draw_row_series(dl, a, b, a1, count, lo, hi, (tc.plot_a & 0x00ffffffu) | 0xb0000000u);
    if (a2)
      draw_row_series(dl, a, b, row.d.data(), count, lo, hi, tc.selection);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", hi);
    dl->AddText(ImVec2(p0.x, a.y), text, buf);
    std::snprintf(buf, sizeof buf, "%.2f", lo);
    dl->AddText(ImVec2(p0.x, b.y - lh), text, buf);
    dl->AddText(ImVec2(a.x, b.y + 2), text, "key 0");
    std::snprintf(buf, sizeof buf, "key %lld", (long long)q);
    dl->AddText(ImVec2(b.x - ImGui::CalcTextSize(buf).x, b.y + 2), text, buf);
    // Legend in the middle of the axis line.
    float lx = a.x + ImGui::CalcTextSize("key 0").x + 16;
    auto legend = [&](const char* name, ImU32 col) {
      dl->AddLine(ImVec2(lx, b.y + 2 + lh * 0.5f), ImVec2(lx + 14, b.y + 2 + lh * 0.5f), col, 2.5f);
      dl->AddText(ImVec2(lx + 18, b.y + 2), text, name);
      lx += 18 + ImGui::CalcTextSize(name).x + 12;
    };
    legend(rm.differential ? "A1" : rm.implicit ? "M" : "A", tc.plot_a);
    if (a2) {
      legend("A2", tc.plot_b);
      legend(row.diff_name.c_str(), tc.selection);
    }
    // Hover: the key under the mouse.
    const ImVec2 m = ImGui::GetIO().MousePos;
    if (ImGui::IsWindowHovered() && m.x >= a.x && m.x < b.x && m.y >= a.y && m.y < b.y) {
      const int64_t k = std::clamp<int64_t>(int64_t((m.x - a.x) / (b.x - a.x) * float(count)), 0, q);
      dl->AddLine(ImVec2(m.x, a.y), ImVec2(m.x, b.y), tc.cursor);
      ImGui::BeginTooltip();
      key_values(st, row, k);
      ImGui::EndTooltip();
    }
  }
  ImGui::Dummy(ImVec2(plot_w, plot_h));
}

// The prompt up to the query, each token on its value's colour; a click makes a token the query.
void row_text(AppState& st, const Snapshot& s, const RowData& row, const AppState::AnswerMark* ans) {
  const RowMaps& rm = *row.rm;
  const ThemeColors& tc = theme_colors();
  const int64_t count = row.count, q = row.q, P = row.P;
  const float* colour_src = st.row_color == 0 ? row.d.data() : (st.row_color == 1 || !row.a2) ? row.a1 : row.a2;
  const bool diverging = (st.row_color == 0 && rm.differential) || rm.implicit;  // M is signed
  ColorScale sc;
  sc.diverging = diverging;
  float top = 0;
  for (int64_t k = 1; k < count; ++k)  // key 0 (the sink) would set the range for most heads
    top = std::max(top, diverging ? std::fabs(colour_src[k]) : colour_src[k]);
  if (count == 1)
    top = std::fabs(colour_src[0]);
  sc.hi = std::max(top, 1e-6f);
  sc.lo = diverging ? -sc.hi : 0.0f;
  const Colormap cm = diverging ? Colormap::CoolWarm : Colormap(st.settings.seq_cmap);
  const RunResult& r = *row.r;
  ImGui::BeginGroup();
  const float text_w = ImGui::GetContentRegionAvail().x;
  g_flow.layout(s.result, count, text_w - ImGui::GetStyle().ScrollbarSize - 4);
  const int64_t hovered = g_flow.draw(
      "##rowtext", ImGui::GetContentRegionAvail().y,
      [&](int64_t i, ImVec2 a, ImVec2 b, bool hov) {
        ImDrawList* cdl = ImGui::GetWindowDrawList();
        const float t = sc.to_t(colour_src[i]);
        cdl->AddRectFilled(a, b, colormap_rgba(cm, t), 2.0f);
        const bool dark_text = diverging ? std::fabs(t - 0.5f) < 0.3f : t > 0.55f;
        cdl->AddText(ImVec2(a.x + TokenFlow::pad() * 0.5f, a.y + 1),
                     dark_text ? IM_COL32(0, 0, 0, 255) : IM_COL32(255, 255, 255, 255), TokenFlow::label(r, i).c_str());
        if (i >= P)  // a generated token: a bar along its bottom edge
          cdl->AddRectFilled(ImVec2(a.x + 1, b.y - 3), ImVec2(b.x - 1, b.y), tc.generated_mark, 1.0f);
        else if (ans && i >= ans->begin && i < ans->end)  // the answer span of a prompt opened from a scan
          cdl->AddRectFilled(ImVec2(a.x + 1, b.y - 3), ImVec2(b.x - 1, b.y), tc.answer_mark, 1.0f);
        if (i == q || hov)
          cdl->AddRect(a, b, i == q ? tc.selection : tc.cursor, 2.0f, 0, 2.0f);
      },
      st.row_scroll ? q : -1);
  st.row_scroll = false;
  ImGui::EndGroup();
  if (hovered >= 0) {
    ImGui::BeginTooltip();
    key_values(st, row, hovered);
    ImGui::TextDisabled("click: make it the query");
    ImGui::EndTooltip();
    if (ImGui::IsMouseClicked(0))
      st.select_row(hovered);
  }
}

}  // namespace

void draw_row_panel(AppState& st) {
  char title[96];
  row_title(*st.snap, st.head, title, sizeof title);
  if (!begin_panel(st, title, &st.show_row, Slot::Row))
    return end_panel();
  const Snapshot& s = *st.snap;
  const auto& rp = s.row;
  if (!s.model || !s.result || !rp || rp->result_seq != s.result->seq) {
    empty_state(s.result ? "Computing..." : "Run a prompt; then click a row of the head view to see that token's attention.");
    return end_panel();
  }
  RowData row;
  row.r = s.result.get();
  row.rm = rp.get();
  row.P = s.result->prompt_len > 0 ? s.result->prompt_len : INT64_MAX;
  const RowMaps& rm = *rp;
  const int64_t n = rm.rows.n;
  row.q = rm.q;
  row.count = rm.q + 1;  // keys 0..q (later keys are masked)
  row.head = std::clamp(st.head, 0, int(rm.rows.heads) - 1);
  row.a1 = rm.rows.a1.data() + size_t(row.head) * size_t(n);
  row.a2 = rm.differential ? rm.rows.a2.data() + size_t(row.head) * size_t(n) : nullptr;
  row.d.resize(size_t(row.count));
  for (int64_t k = 0; k < row.count; ++k)
    row.d[size_t(k)] = row.a2 ? float(row.a1[k] - rm.lambda * row.a2[k]) : row.a1[k];
  row.diff_name = std::string("A1 - ") + st.lam() + "*A2";
  // A prompt opened from a corpus scan: its answer span (not for a Mamba channel's map).
  const AppState::AnswerMark* ans = rm.implicit ? nullptr : st.answer_span();

  row_header(st, row, ans);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const bool side_by_side = avail.x >= 700;
  const float plot_w = side_by_side ? std::floor(avail.x * 0.42f) : avail.x;
  const float plot_h = side_by_side ? avail.y : std::min(avail.y * 0.45f, 140.0f);
  row_plot(st, row, ans, plot_w, plot_h);
  if (side_by_side)
    ImGui::SameLine();
  if (st.req.lens) {
    ImGui::BeginChild("lens_child", ImVec2(0, 0));
    lens_table(s, row.q);
    ImGui::EndChild();
  } else {
    row_text(st, s, row, ans);
  }
  end_panel();
}

}  // namespace ds::gui
