// Compare panel: a second model beside the first on the same tokens (the DIFF model and its Transformer twin, or
// any two models with one tokenizer). The second model runs on its own worker (worker.h), fed the main result's
// token ids; its row view follows the main row view's query and layer, the row's masses (sink, answer, rest) are the
// corpus scan's rule (row_fractions) for both, and the activation outliers of both are drawn layer by layer.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/session/session_scan.h"
#include "panels.h"
#include "plot_draw.h"
#include "theme.h"
#include "token_flow.h"

namespace ds::gui {

// [SECTION] actions
void AppState::open_compare(const std::string& dir) {
  if (dir.empty())
    return;
  ComparePanelState& c = compare;
  if (!c.worker)
    c.worker = std::make_unique<Worker>(wake, backends, cpu_threads, gpu_mem_limit);
  c.path = dir;
  c.error.clear();
  c.req.open_dir = dir;
  ++c.req.open_seq;
  c.req.ids.clear();  // the new model gets the main result's ids once it is open (sync_compare)
  c.req.overview = c.req.sweep = c.req.lens = false;
  c.req.view.rows = c.req.view.cols = 32;  // the head view is not shown here: keep its grid small
  c.worker->submit(c.req);
  show_compare = c.raise = true;
}

void AppState::close_compare() {
  compare.worker.reset();  // joins its thread; the model is freed
  compare.snap = nullptr;
  compare.req = Request{};
  compare.error.clear();
  compare.seen_model_seq = compare.seen_error_seq = 0;
}

void AppState::sync_compare() {
  ComparePanelState& c = compare;
  if (!c.worker)
    return;
  c.snap = c.worker->snapshot();
  const Snapshot& cs = *c.snap;
  if (cs.error_seq != c.seen_error_seq) {
    c.seen_error_seq = cs.error_seq;
    c.error = cs.error;
  }
  if (!cs.model || cs.loading)
    return;
  Request want = c.req;
  if (cs.model->seq != c.seen_model_seq) {  // a model opened: it runs the main tokens from scratch
    c.seen_model_seq = cs.model->seq;
    want.ids.clear();
  }
  const bool streaming = snap && snap->gen && snap->gen->streaming;
  if (snap && snap->result && !streaming && (snap->result->ids != want.ids || want.prompt_seq == 0)) {
    want.use_ids = true;
    want.ids = snap->result->ids;
    ++want.prompt_seq;
    c.error.clear();
  }
  if (want.prompt_seq == 0)
    return;  // no main result yet
  const ModelConfig& cc = cs.model->cfg;
  want.layer = std::clamp(layer, 0, int(cc.layers) - 1);
  const int heads = int(cc.has_scan(cc.nearest_view_layer(want.layer)) ? cc.d_inner : cc.view_heads());
  want.head = std::clamp(c.head >= 0 ? c.head : head, 0, heads - 1);
  want.row = req.row;
  want.outliers = req.outliers;
  want.logit_bits = req.logit_bits;  // the quantisation what-if for both (a model's own interventions stay its own)
  if (want.prompt_seq != c.req.prompt_seq || want.layer != c.req.layer || want.head != c.req.head ||
      want.row != c.req.row || want.outliers != c.req.outliers || want.logit_bits != c.req.logit_bits) {
    c.req = std::move(want);
    c.worker->submit(c.req);
  }
}

bool AppState::compare_ready() const {
  const ComparePanelState& c = compare;
  if (!c.worker)
    return true;
  if (!c.worker->idle() || !c.snap || c.snap->loading)
    return false;
  const Snapshot& cs = *c.snap;
  if (!c.error.empty())
    return true;  // its error is on screen
  if (!cs.model || cs.model->seq != c.seen_model_seq || !snap || !snap->result || c.req.ids != snap->result->ids)
    return false;
  if (!cs.result || cs.result->ids != c.req.ids || !cs.row || cs.row->result_seq != cs.result->seq)
    return false;
  return !c.req.outliers || (cs.outliers && cs.outliers->result_seq == cs.result->seq);
}

std::optional<std::pair<int64_t, int64_t>> AppState::compare_answer() const {
  if (!compare.answer.empty()) {
    long long b = 0, e = 0;
    char tail = 0;
    if (std::sscanf(compare.answer.c_str(), "%lld:%lld%c", &b, &e, &tail) == 2 && b >= 0 && e > b)
      return std::pair<int64_t, int64_t>(b, e);
    return std::nullopt;
  }
  if (const AnswerMark* m = answer_span())
    return std::pair<int64_t, int64_t>(m->begin, m->end);
  return std::nullopt;
}

namespace {

// [SECTION] the row: one model's row of the selected head, its masses, and the plot
struct Side {
  const char* name = "";
  const Snapshot* s = nullptr;
  const RowMaps* rm = nullptr;
  int head = 0;
  ImU32 color = 0;
  std::string label;  // the folder name
};

std::string folder_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty())
    p = p.parent_path();
  return p.filename().string();
}

void masses_table(const AppState& st, const Side (&sides)[2], std::optional<std::pair<int64_t, int64_t>> ans) {
  const ImGuiTableFlags tf = ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV;
  if (!ImGui::BeginTable("masses", 5, tf))
    return;
  ImGui::TableSetupColumn("model");
  ImGui::TableSetupColumn("map");
  ImGui::TableSetupColumn("sink");
  ImGui::TableSetupColumn(ans ? "answer" : "answer (no span)");
  ImGui::TableSetupColumn("rest");
  ImGui::TableHeadersRow();
  const int64_t b = ans ? ans->first : 0, e = ans ? ans->second : 0;
  for (const Side& sd : sides) {
    if (!sd.rm)
      continue;
    const Fractions12 f = row_fractions(*sd.rm, sd.head, b, e);
    const int maps[2] = {0, 2};
    for (int mi = 0; mi < (sd.rm->differential ? 2 : 1); ++mi) {
      const int map = sd.rm->differential ? maps[mi] : 0;
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      if (mi == 0)
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(sd.color), "%s H%d", sd.label.c_str(), sd.head);
      ImGui::TableNextColumn();
      if (!sd.rm->differential)
        ImGui::TextUnformatted("A");
      else if (map == 0)
        ImGui::TextUnformatted("A1");
      else
        ImGui::Text("A1-%s*A2", st.lam());
      const std::array<double, 3> cols = sink_answer_rest(f, map);
      for (int col = 0; col < 3; ++col) {
        ImGui::TableNextColumn();
        const double v = cols[size_t(col)];
        if (col == 1 && !ans)
          ImGui::TextDisabled("-");
        else if (std::isfinite(v))
          ImGui::Text("%.3f", v);
        else
          ImGui::TextDisabled("n/a");
      }
    }
  }
  ImGui::EndTable();
  item_tooltip("The selected row's attention split as the corpus scan measures it: the answer span, key 0 (the sink)\n"
               "and every other key, each over the map's row sum. A1 - %s*A2 uses the head's own %s.",
               st.lam(), st.lam());
}

// The row a side shows: D = A1 - lambda*A2 of its head (A for a plain head) over keys 0..q.
std::vector<float> shown_row(const Side& sd) {
  const RowMaps& rm = *sd.rm;
  const int64_t n = rm.rows.n, count = rm.q + 1;
  std::vector<float> v(static_cast<size_t>(count));
  const float* a1 = rm.rows.a1.data() + size_t(sd.head) * size_t(n);
  const float* a2 = rm.differential && !rm.rows.a2.empty() ? rm.rows.a2.data() + size_t(sd.head) * size_t(n) : nullptr;
  for (int64_t k = 0; k < count; ++k) v[size_t(k)] = a2 ? a1[k] - float(rm.lambda) * a2[k] : a1[k];
  return v;
}

// One side's row (shown_row), on a y range shared by both sides; a click makes the key the query.
void row_plot(AppState& st, const Side& sd, const std::vector<float>& v, std::optional<std::pair<int64_t, int64_t>> ans,
              float lo, float hi, float w, float h) {
  const RowMaps& rm = *sd.rm;
  const ThemeColors& tc = theme_colors();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  const int64_t q = rm.q, count = q + 1;
  const bool a2 = rm.differential && !rm.rows.a2.empty();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  // the plot box, with the y range to its left and the keys' ends below it
  const float left = ImGui::CalcTextSize("-0.000").x + 8;
  const ImVec2 a(p0.x + left, p0.y + lh + 2), b(p0.x + w - 4, p0.y + h - lh - 2);
  char title[160];
  std::snprintf(title, sizeof title, "%s  L%d.H%d  %s%s%s", sd.label.c_str(), rm.layer, sd.head, a2 ? "A1 - " : "A",
                a2 ? st.lam() : "", a2 ? "*A2" : "");
  dl->AddText(p0, sd.color, title);
  if (b.x - a.x > 20 && b.y - a.y > 10) {
    draw_row_frame(dl, a, b, count, lo, hi, ans ? ans->first : count, ans ? ans->second : count);
    draw_row_series(dl, a, b, v.data(), count, lo, hi, sd.color);
    // the shared y range left of the box, the keys' ends below it
    const std::string top = fmt_value(hi), bottom = fmt_value(lo), last = "key " + std::to_string(q);
    dl->AddText(ImVec2(a.x - ImGui::CalcTextSize(top.c_str()).x - 4, a.y), tc.text_dim, top.c_str());
    dl->AddText(ImVec2(a.x - ImGui::CalcTextSize(bottom.c_str()).x - 4, b.y - lh), tc.text_dim, bottom.c_str());
    dl->AddText(ImVec2(a.x, b.y + 1), tc.text_dim, "key 0");
    dl->AddText(ImVec2(b.x - ImGui::CalcTextSize(last.c_str()).x, b.y + 1), tc.text_dim, last.c_str());
    const ImVec2 m = ImGui::GetIO().MousePos;
    if (ImGui::IsWindowHovered() && m.x >= a.x && m.x < b.x && m.y >= a.y && m.y < b.y) {
      const int64_t k = std::clamp<int64_t>(int64_t((m.x - a.x) / (b.x - a.x) * float(count)), 0, q);
      dl->AddLine(ImVec2(m.x, a.y), ImVec2(m.x, b.y), tc.cursor);
      ImGui::BeginTooltip();
      ImGui::Text("key %lld \"%s\": %+.5f", (long long)k, sd.s && sd.s->result ? TokenFlow::label(*sd.s->result, k).c_str() : "",
                  v[size_t(k)]);
      ImGui::TextDisabled("click: make this token the query of both rows");
      ImGui::EndTooltip();
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Left))
        st.select_row(k);
    }
  }
  ImGui::Dummy(ImVec2(w, h));
}

// [SECTION] outliers: per layer the largest |hidden state| (and |attention logit|) of both models as paired bars
void outlier_bars(const char* title, const std::vector<float> (&v)[2], const ImU32 (&col)[2], const std::string (&names)[2],
                  float w, float h) {
  const ThemeColors& tc = theme_colors();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 a(p0.x + 4, p0.y + lh + 2), b(p0.x + w - 4, p0.y + h - lh - 2);
  const int L = int(std::max(v[0].size(), v[1].size()));
  float top = 0;
  for (const auto& s : v)
    for (float x : s) top = std::max(top, x);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s (top %s)", title, fmt_value(top).c_str());
  dl->AddText(p0, ImGui::GetColorU32(ImGuiCol_Text), buf);
  if (L == 0 || top <= 0 || b.x - a.x < 20 || b.y - a.y < 10) {
    ImGui::Dummy(ImVec2(w, h));
    return;
  }
  dl->AddRectFilled(a, b, ImGui::GetColorU32(ImGuiCol_FrameBg));
  const float slot = (b.x - a.x) / float(L), bw = std::max(1.f, slot * 0.38f);
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < 2; ++s) {
      if (l >= int(v[s].size()))
        continue;
      const float x0 = a.x + slot * float(l) + slot * 0.1f + bw * float(s);
      const float y = b.y - v[s][size_t(l)] / (top * 1.05f) * (b.y - a.y);
      dl->AddRectFilled(ImVec2(x0, y), ImVec2(x0 + bw, b.y), col[s]);
    }
  dl->AddRect(a, b, tc.grid);
  dl->AddText(ImVec2(a.x, b.y + 1), tc.text_dim, "layer 0");
  std::snprintf(buf, sizeof buf, "layer %d", L - 1);
  dl->AddText(ImVec2(b.x - ImGui::CalcTextSize(buf).x, b.y + 1), tc.text_dim, buf);
  const ImVec2 m = ImGui::GetIO().MousePos;
  if (ImGui::IsWindowHovered() && m.x >= a.x && m.x < b.x && m.y >= a.y && m.y < b.y) {
    const int l = std::clamp(int((m.x - a.x) / slot), 0, L - 1);
    ImGui::BeginTooltip();
    ImGui::Text("layer %d", l);
    for (int s = 0; s < 2; ++s)
      if (l < int(v[s].size()))
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col[s]), "%s: %s", names[s].c_str(),
                           fmt_value(v[s][size_t(l)]).c_str());
    ImGui::EndTooltip();
  }
  ImGui::Dummy(ImVec2(w, h));
}

}  // namespace

// [SECTION] the panel
void draw_compare_panel(AppState& st) {
  ComparePanelState& c = st.compare;
  if (c.raise) {
    ImGui::SetNextWindowFocus();
    c.raise = false;
  }
  if (!begin_panel(st, "Compare###Compare", &st.show_compare, Slot::Corpus))
    return end_panel();
  const Snapshot& s = *st.snap;
  // Path field, Open, Close.
  const float bw = button_w("Open") + button_w("Close") + 2 * ImGui::GetStyle().ItemSpacing.x;
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x - bw);
  const bool enter = ImGui::InputTextWithHint("##cmp_path", "a second checkpoint folder (same tokenizer)", &c.path,
                                              ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  const bool loading = c.snap && c.snap->loading;
  ImGui::BeginDisabled(c.path.empty() || loading);
  if (ImGui::Button("Open") || (enter && !c.path.empty()))
    st.open_compare(c.path);
  ImGui::EndDisabled();
  ImGui::SameLine();
  ImGui::BeginDisabled(!c.worker);
  if (ImGui::Button("Close"))
    st.close_compare();
  ImGui::EndDisabled();
  if (loading) {
    char overlay[160];
    std::snprintf(overlay, sizeof overlay, "%.0f%%  %s", c.snap->load_fraction * 100, c.snap->load_what.c_str());
    ImGui::ProgressBar(float(c.snap->load_fraction), ImVec2(-1, 0), overlay);
  }
  if (!c.error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(theme_colors().error_text));
    ImGui::TextWrapped("%s", c.error.c_str());
    ImGui::PopStyleColor();
  }
  const Snapshot* cs = c.snap.get();
  if (!s.model || !cs || !cs->model) {
    if (!loading)
      empty_state("Open a second model here to see it beside the first on the same tokens: the differential model "
                  "and its Transformer twin, or any two models with one tokenizer. Its row follows the Row panel's "
                  "query, and the activation outliers of both are drawn layer by layer.");
    return end_panel();
  }
  const ThemeColors& tc = theme_colors();
  Side sides[2];
  sides[0] = {"main", &s, s.row && s.result && s.row->result_seq == s.result->seq ? s.row.get() : nullptr,
              st.head, tc.plot_a, folder_name(s.model->dir)};
  const bool current = cs->result && s.result && cs->result->ids == s.result->ids;
  sides[1] = {"compare", cs, current && cs->row && cs->row->result_seq == cs->result->seq ? cs->row.get() : nullptr,
              c.req.head, tc.plot_b, folder_name(cs->model->dir)};
  if (sides[0].label == sides[1].label)
    sides[1].label += " (2)";
  for (Side& sd : sides)  // a quantised result says so (both follow the lambda panel's menu)
    if (sd.s && sd.s->result && sd.s->result->logit_bits > 0)
      sd.label += ", " + std::to_string(sd.s->result->logit_bits) + "-bit logits";
  if (sides[0].rm && sides[0].rm->implicit)
    sides[0].rm = nullptr;  // a Mamba channel's implicit attention has no sink / answer / rest of a softmax row
  if (sides[1].rm && sides[1].rm->implicit)
    sides[1].rm = nullptr;
  for (Side& sd : sides)
    if (sd.rm)
      sd.head = std::clamp(sd.head, 0, int(sd.rm->rows.heads) - 1);

  // The two models in a line each, and whether they read the same tokens.
  for (int i = 0; i < 2; ++i) {
    const Snapshot& x = *sides[i].s;
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(sides[i].color), "%s", sides[i].label.c_str());
    ImGui::SameLine();
    const ModelConfig& mc = x.model->cfg;
    std::string top = "-";
    if (x.result && !x.result->top.empty()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "\"%s\" %.3f", token_label(x.result->top[0].text, 16).c_str(), x.result->top[0].prob);
      top = buf;
    }
    ImGui::TextDisabled("%s, %lld layers x %lld heads; next %s", mc.family(), (long long)mc.layers,
                        (long long)mc.view_heads(), top.c_str());
  }
  if (s.model->cfg.vocab != cs->model->cfg.vocab)
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.error_text),
                       "vocabularies differ (%lld and %lld): the same ids may be different tokens",
                       (long long)s.model->cfg.vocab, (long long)cs->model->cfg.vocab);
  if (!current) {
    ImGui::TextDisabled(cs->running || !c.worker->idle() ? "running the tokens..." : "waiting for the tokens...");
    return end_panel();
  }

  // Heads and the answer span.
  ImGui::AlignTextToFramePadding();
  ImGui::Text("query %lld, layer %d", (long long)(sides[0].rm ? sides[0].rm->q : -1), st.layer);
  ImGui::SameLine();
  int ch = c.head < 0 ? c.req.head : c.head;
  ImGui::SetNextItemWidth(90);
  if (ImGui::InputInt("second head", &ch)) {
    c.head = std::max(0, ch);
    st.sync_compare();
  }
  item_tooltip("The second model's head in the row plot and the masses (the main model's is the Head panel's).\n"
               "It follows the main head's index until set here.");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(90);
  ImGui::InputTextWithHint("answer", "B:E", &c.answer);
  const auto ans = st.compare_answer();
  item_tooltip("The answer span as token positions [B, E): its share of each row beside the sink (key 0) and the\n"
               "rest. Empty: the span of a prompt opened from a corpus scan, when that prompt is on screen.");
  if (!c.answer.empty() && !ans) {
    ImGui::SameLine();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(tc.error_text), "not B:E with 0 <= B < E");
  }

  // Left: the masses and the two rows on one y range. Right: the outliers of both.
  if (!ImGui::BeginTable("cmp", 2, ImGuiTableFlags_Resizable | ImGuiTableFlags_BordersInnerV)) return end_panel();
  ImGui::TableSetupColumn("rows", ImGuiTableColumnFlags_WidthStretch, 0.6f);
  ImGui::TableSetupColumn("outliers", ImGuiTableColumnFlags_WidthStretch, 0.4f);
  ImGui::TableNextRow();
  ImGui::TableNextColumn();
  masses_table(st, sides, ans);
  std::vector<float> shown[2];
  float lo = 0, hi = 1e-6f;
  for (int i = 0; i < 2; ++i) {
    if (!sides[i].rm) continue;
    shown[i] = shown_row(sides[i]);
    for (float d : shown[i]) lo = std::min(lo, d), hi = std::max(hi, d);
  }
  const float w = ImGui::GetContentRegionAvail().x;
  const float ph = std::max(48.f, (ImGui::GetContentRegionAvail().y - 8) / 2);
  for (int i = 0; i < 2; ++i)
    if (sides[i].rm) row_plot(st, sides[i], shown[i], ans, lo, hi, w, ph);
  ImGui::TableNextColumn();
  if (ImGui::Checkbox("activation outliers", &st.req.outliers)) st.submit_now();
  item_tooltip("Per layer the largest |hidden state| over every position and channel, and the largest |attention\n"
               "logit| of map 1 or 2, of both models (the paper's Table 5; the Profiler's outliers tab).");
  if (st.req.outliers) {
    const bool have0 = s.outliers && s.outliers->result_seq == s.result->seq;
    const bool have1 = cs->outliers && cs->outliers->result_seq == cs->result->seq;
    if (!have0 || !have1) {
      ImGui::TextDisabled("computing...");
    } else {
      const Outliers* o[2] = {&s.outliers->o, &cs->outliers->o};
      std::vector<float> hid[2], lg[2];
      for (int i = 0; i < 2; ++i)
        for (const LayerOutliers& lo_ : o[i]->layers) {
          hid[i].push_back(lo_.hidden.s.top[0]);
          lg[i].push_back(lo_.has_logits ? std::max(lo_.logit1.s.top[0], o[i]->differential ? lo_.logit2.s.top[0] : 0.f) : 0.f);
        }
      const ImU32 cols[2] = {sides[0].color, sides[1].color};
      const std::string names[2] = {sides[0].label, sides[1].label};
      const float ow = ImGui::GetContentRegionAvail().x, oh = std::max(50.f, (ImGui::GetContentRegionAvail().y - 6) / 2);
      outlier_bars("max |hidden|", hid, cols, names, ow, oh);
      outlier_bars("max |attention logit|", lg, cols, names, ow, oh);
    }
  } else {
    ImGui::TextDisabled("Tick it to compare the outliers of the two models.");
  }
  ImGui::EndTable();
  end_panel();
}

}  // namespace ds::gui
