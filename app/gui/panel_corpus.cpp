// Corpus panel: corpus analysis in the window (engine/session/session_scan.h, the same measures and report as
// diffscope-scan). A JSONL file of prompts, each with its answer span, runs through the model on the worker (one
// run, or two at two lambda scales to compare); for the last prompt token of each prompt, per layer and head, the
// attention mass on the answer span, on position 0 (the sink) and on the rest (the context), for A1, A2 and
// A1 - lambda*A2, averaged over prompts, with the greedy answer's accuracy where a line has a target. Shown: the
// progress (Stop keeps what was done), the bad lines with their line numbers, a summary, the layer x head heatmap
// (click a head to open it), the groups by length and depth, and one row per prompt (click it to open that prompt
// in the views, its answer span marked). Save report writes the JSON, Save plot the report's PNG figure.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"

namespace ds::gui {

namespace {

const char* const k_parts[3] = {"answer", "sink", "context"};

int fraction_index(int part, int map) {
  return part * 4 + map;  // session_scan.h's order: answer1, answer2, answer_diff, answer_diff_abs, sink1, ...
}

std::string map_name(const AppState& st, int map, bool differential) {
  if (!differential)
    return "A";
  switch (map) {
    case 0:
      return "A1";
    case 1:
      return "A2";
    case 2:
      return std::string("A1 - ") + st.lam() + "*A2";
    default:
      return std::string("|A1 - ") + st.lam() + "*A2|";
  }
}

std::string short_map_name(int map, bool differential) {
  if (!differential)
    return "A";
  static const char* const names[4] = {"A1", "A2", "D", "|D|"};
  return names[map];
}

std::string fmt_frac(double v) {
  if (!std::isfinite(v))
    return "\xe2\x80\x93";  // en dash: no value
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string fmt_signed(double v) {
  if (!std::isfinite(v))
    return "\xe2\x80\x93";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.3f", v);
  return buf;
}

std::string fmt_pct(double v) {
  if (!std::isfinite(v))
    return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v);
  return buf;
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0)
    return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string fmt_scale(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "x%g", s);
  return buf;
}




// What the panel shows: the first run, the compare run, or the compare run minus the first.
struct Shown {
  const ScanReport* rep = nullptr;
  int view = 0;  // 0, 1, 2 (AppState::scan_view)
  const ScanRunView& run() const { return view == 1 ? rep->compare : rep->run; }
  bool diff() const { return view == 2; }
  double cell(size_t li, int h, int idx) const {
    if (view == 2) {
      if (li >= rep->compare.layers.size() || h >= rep->compare.heads)
        return NAN;
      return rep->compare.cell(li, h)[size_t(idx)] - rep->run.cell(li, h)[size_t(idx)];
    }
    return run().cell(li, h)[size_t(idx)];
  }
  double mean(int idx) const {
    return view == 2 ? rep->compare.mean[size_t(idx)] - rep->run.mean[size_t(idx)] : run().mean[size_t(idx)];
  }
  std::string name(const AppState& st) const {
    if (view == 2)
      return std::string(st.lam()) + " " + fmt_scale(rep->compare.lambda_scale) + " minus " + fmt_scale(rep->run.lambda_scale);
    return std::string(st.lam()) + " " + fmt_scale(run().lambda_scale);
  }
};

// The fractions as a table: a row per part (answer, sink, context), a column per map; value(index) the number at
// session_scan.h's fraction index. The cell (hp, hm) is drawn in the selection colour (-1: none).
template <class F>
void fraction_table(const char* id, const char* corner, ImGuiTableFlags flags, const AppState& st, const Shown& sh,
                    bool diff, F&& value, int hp = -1, int hm = -1) {
  const int maps = diff ? 4 : 1;
  if (!ImGui::BeginTable(id, maps + 1, flags))
    return;
  ImGui::TableSetupColumn(corner);
  for (int m = 0; m < maps; ++m)
    ImGui::TableSetupColumn(map_name(st, m, diff).c_str());
  ImGui::TableHeadersRow();
  for (int p = 0; p < 3; ++p) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(k_parts[p]);
    for (int m = 0; m < maps; ++m) {
      ImGui::TableNextColumn();
      const double v = value(fraction_index(p, m));
      const std::string t = sh.diff() ? fmt_signed(v) : fmt_frac(v);
      if (p == hp && m == hm)
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().selection), "%s", t.c_str());
      else
        ImGui::TextUnformatted(t.c_str());
    }
  }
  ImGui::EndTable();
}

// [SECTION] controls: file, options, Start / Stop
void controls(AppState& st, const ModelInfo& m) {
  const bool running = st.scanning();
  const bool diff = m.cfg.is_diff();
  const ImGuiStyle& style = ImGui::GetStyle();
  const float buttons = button_w("Start") + button_w("Stop") + 2 * style.ItemSpacing.x;
  ImGui::SetNextItemWidth(std::max(160.0f, std::min(ImGui::GetContentRegionAvail().x - buttons, 560.0f)));
  if (st.corpus.focus_path) {
    ImGui::SetKeyboardFocusHere();
    st.corpus.focus_path = false;
  }
  ImGui::BeginDisabled(running);
  const bool enter = ImGui::InputTextWithHint("##corpus", "corpus.jsonl (or drop a .jsonl file on the window)",
                                              &st.corpus.opts.path, ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::EndDisabled();
  item_tooltip("A JSONL file, one prompt a line:\n"
               "  {\"text\": \"...\", \"answer\": [begin, end)}   character offsets into the text\n"
               "  {\"ids\": [...], \"answer\": [begin, end)}     token positions\n"
               "optional \"target\": the answer the model should give greedily (text or ids);\n"
               "other keys are kept as tags (\"length\" and \"depth\" group the report).\n"
               "Bad lines are listed with their line numbers and skipped.");
  ImGui::SameLine();
  ImGui::BeginDisabled(running || st.corpus.opts.path.empty() || m.seq == 0 || st.snap->loading);
  if (ImGui::Button("Start") || (enter && !running))
    st.start_scan();
  ImGui::EndDisabled();
  item_tooltip("Scan every prompt of the file (the views wait until it ends; the prompt on screen then runs again)");
  ImGui::SameLine();
  ImGui::BeginDisabled(!running);
  if (ImGui::Button("Stop"))
    st.stop_scan();
  ImGui::EndDisabled();
  item_tooltip("Stop between prompts: the report keeps the prompts done so far");

  // Options: lambda scale, a second run to compare, the answer length.
  ImGui::BeginDisabled(running);
  const float num_w = ImGui::CalcTextSize("-0.000").x + style.FramePadding.x * 2;
  ImGui::BeginDisabled(!diff);
  ImGui::AlignTextToFramePadding();
  ImGui::Text("%s x", st.lam());
  ImGui::SameLine(0, style.ItemInnerSpacing.x);
  ImGui::SetNextItemWidth(num_w);
  if (ImGui::InputDouble("##scan_scale", &st.corpus.opts.lambda_scale, 0, 0, "%.2f") && !std::isfinite(st.corpus.opts.lambda_scale))
    st.corpus.opts.lambda_scale = 1.0;
  item_tooltip(diff ? "Every differential layer's lambda times this during the scan (1: the model's own;\n"
               "0: plain softmax attention A1). Per-layer overrides are not used."
               : "A plain (Llama) model has no lambda");
  const float cmp_w = ImGui::GetFrameHeight() + ImGui::CalcTextSize("compare at x").x + num_w + 3 * style.ItemInnerSpacing.x;
  same_line_if_fits(cmp_w);
  ImGui::Checkbox("##scan_compare", &st.corpus.opts.compare);
  item_tooltip("A second run of the same model at another lambda scale, prompt by prompt: the report\n"
               "holds both (its \"compare\" run) and the panel shows either, or their difference");
  ImGui::SameLine(0, style.ItemInnerSpacing.x);
  ImGui::TextUnformatted("compare at x");
  ImGui::SameLine(0, style.ItemInnerSpacing.x);
  ImGui::BeginDisabled(!st.corpus.opts.compare);
  ImGui::SetNextItemWidth(num_w);
  if (ImGui::InputDouble("##scan_compare_scale", &st.corpus.opts.compare_scale, 0, 0, "%.2f") &&
      !std::isfinite(st.corpus.opts.compare_scale))
    st.corpus.opts.compare_scale = 0.0;
  ImGui::EndDisabled();
  ImGui::EndDisabled();
  if (!diff)
    st.corpus.opts.compare = false;
  same_line_if_fits(ImGui::CalcTextSize("answer <= 000 tokens").x + num_w);
  ImGui::AlignTextToFramePadding();
  ImGui::TextUnformatted("answer \xe2\x89\xa4");
  ImGui::SameLine(0, style.ItemInnerSpacing.x);
  ImGui::SetNextItemWidth(ImGui::CalcTextSize("0000").x + style.FramePadding.x * 2);
  int max_answer = st.corpus.opts.max_answer_tokens;
  if (ImGui::InputInt("##scan_answer", &max_answer, 0, 0))
    st.corpus.opts.max_answer_tokens = std::clamp(max_answer, 1, 100000);
  item_tooltip("Greedy tokens generated at most after each prompt to check its \"target\"");
  ImGui::SameLine(0, style.ItemInnerSpacing.x);
  ImGui::TextUnformatted("tokens");
  ImGui::EndDisabled();
}

// [SECTION] Save report... / Save plot...: a path field (there is no native file dialog)
struct SavePopup {
  const char* id;
  const char* what;
  std::string path, why;
  bool open = false;
};
SavePopup g_save_report{"Save report", "The report as JSON (what diffscope-scan --out writes)", "", "", false};
SavePopup g_save_plot{"Save plot", "The report's figure as PNG (what diffscope-scan --plot draws)", "", "", false};

void save_popup(AppState& st, SavePopup& p, bool plot) {
  if (p.open) {
    ImGui::OpenPopup(p.id);
    p.open = false;
  }
  ImGui::SetNextWindowPos(ImGui::GetMainViewport()->GetCenter(), ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  if (!ImGui::BeginPopupModal(p.id, nullptr, ImGuiWindowFlags_AlwaysAutoResize))
    return;
  ImGui::TextUnformatted(p.what);
  if (ImGui::IsWindowAppearing())
    ImGui::SetKeyboardFocusHere();
  ImGui::SetNextItemWidth(560);
  const bool enter = ImGui::InputText("##save_path", &p.path, ImGuiInputTextFlags_EnterReturnsTrue);
  if (ImGui::Button("Save") || enter) {
    p.why.clear();
    const bool ok = plot ? st.save_scan_plot(p.path, &p.why) : st.save_scan_report(p.path, &p.why);
    if (ok) {
      st.notify("Wrote " + p.path);
      ImGui::CloseCurrentPopup();
    }
  }
  ImGui::SameLine();
  if (ImGui::Button("Cancel") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
    p.why.clear();
    ImGui::CloseCurrentPopup();
  }
  if (!p.why.empty())
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().plot_b), "%s", p.why.c_str());
  ImGui::EndPopup();
}

// [SECTION] progress and status: one line
void status_line(AppState& st, const ScanState& sc) {
  const ThemeColors& tc = theme_colors();
  const ImVec4 warn = ImGui::ColorConvertU32ToFloat4(tc.plot_b);
  const size_t skipped = sc.skipped ? sc.skipped->size() : 0;
  const float save_w = button_w("Save report...") + button_w("Save plot...") + ImGui::GetStyle().ItemSpacing.x;
  if (sc.running) {
    char overlay[64];
    std::snprintf(overlay, sizeof overlay, "%d / %d prompts", sc.tried, sc.total);
    const float frac = sc.total > 0 ? float(sc.tried) / float(sc.total) : 0.0f;
    ImGui::ProgressBar(frac, ImVec2(std::clamp(ImGui::GetContentRegionAvail().x * 0.28f, 140.0f, 300.0f), 0), overlay);
    ImGui::SameLine();
    ImGui::AlignTextToFramePadding();
    if (sc.tried > 0 && sc.replicas > 1)
      ImGui::Text("%.2f prompts/s on %d replicas   ETA %s", sc.prompts_per_s(), sc.replicas, fmt_duration(sc.eta_s()).c_str());
    else if (sc.tried > 0)
      ImGui::Text("%.2f prompts/s   ETA %s   line %d", sc.prompts_per_s(), fmt_duration(sc.eta_s()).c_str(),
                  sc.current_line);
    else
      ImGui::Text("line %d...", sc.current_line);
  } else if (!sc.error.empty()) {
    ImGui::AlignTextToFramePadding();
    ImGui::TextColored(warn, "%s", sc.error.c_str());
    item_tooltip(sc.error.c_str());
  } else if (sc.stopped) {
    ImGui::AlignTextToFramePadding();
    ImGui::TextColored(warn, "stopped after %d of %d prompts in %.1f s: the report keeps the %d done", sc.tried,
                       sc.total, sc.elapsed_s, sc.done);
  } else if (sc.done == 0) {
    ImGui::AlignTextToFramePadding();
    ImGui::TextColored(warn, "no prompt could be scanned: %s", skipped == 1 ? "the line below was skipped"
                                                                           : "the lines below were skipped");
  } else {
    ImGui::AlignTextToFramePadding();
    ImGui::Text("%d %s in %.1f s (%.2f/s)", sc.done, sc.done == 1 ? "prompt" : "prompts", sc.elapsed_s, sc.prompts_per_s());
  }
  if (skipped > 0 && (sc.done > 0 || sc.running)) {
    ImGui::SameLine();
    ImGui::TextColored(warn, "%zu %s skipped", skipped, skipped == 1 ? "line" : "lines");
    if (ImGui::IsItemHovered()) {
      ImGui::BeginTooltip();
      for (size_t i = 0; i < skipped && i < 24; ++i)
        ImGui::Text("line %d: %s", (*sc.skipped)[i].line, (*sc.skipped)[i].error.c_str());
      if (skipped > 24)
        ImGui::TextDisabled("... and %zu more (listed in the summary)", skipped - 24);
      ImGui::EndTooltip();
    }
  }
  // Save buttons on the right.
  const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  ImGui::SameLine();
  if (ImGui::GetCursorScreenPos().x + save_w <= right)
    ImGui::SetCursorScreenPos(ImVec2(right - save_w, ImGui::GetCursorScreenPos().y));
  else
    ImGui::NewLine();
  ImGui::BeginDisabled(!sc.report);
  if (ImGui::Button("Save report...")) {
    g_save_report.path = st.export_path("scan", "json");
    g_save_report.why.clear();
    g_save_report.open = true;
  }
  item_tooltip(sc.running ? "The report so far (\"complete\": false)" : "The report as JSON");
  ImGui::SameLine();
  if (ImGui::Button("Save plot...")) {
    g_save_plot.path = st.export_path("scan", "png");
    g_save_plot.why.clear();
    g_save_plot.open = true;
  }
  item_tooltip("Answer / context / sink bars, the layer x head heatmaps and the groups, as PNG");
  ImGui::EndDisabled();
}

// [SECTION] summary: means, accuracy, groups, skipped lines
void summary(AppState& st, const ScanState& sc, const Shown& sh) {
  const ScanReport& rep = *sh.rep;
  const ScanRunView& r = sh.run();
  const bool diff = r.differential;
  if (rep.has_compare) {
    // Which run the summary, the heatmap and the output column show.
    const std::string a = std::string(st.lam()) + " " + fmt_scale(rep.run.lambda_scale) + "##first";
    const std::string b = std::string(st.lam()) + " " + fmt_scale(rep.compare.lambda_scale) + "##compare";
    ImGui::RadioButton(a.c_str(), &st.corpus.view, 0);
    ImGui::SameLine();
    ImGui::RadioButton(b.c_str(), &st.corpus.view, 1);
    ImGui::SameLine();
    ImGui::RadioButton("difference", &st.corpus.view, 2);
    item_tooltip("The second run minus the first");
  }
  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit;
  fraction_table("##means", "mean", flags, st, sh, diff, [&](int idx) { return sh.mean(idx); }, st.corpus.part,
                 st.corpus.map);
  item_tooltip("Attention of the last prompt token, as a fraction of its row, averaged over layers, heads\n"
               "and prompts: on the answer span, on position 0 (the sink), on every other key (the context).\n"
               "A1 - %s*A2: the part of the row's sum; |A1 - %s*A2|: the part of its absolute sum.",
               st.lam(), st.lam());
  // Prompts, tokens, accuracy.
  if (sh.diff()) {
    ImGui::Text("%lld prompts   accuracy %s \xe2\x86\x92 %s", (long long)rep.run.prompts, fmt_pct(rep.run.accuracy).c_str(),
                fmt_pct(rep.compare.accuracy).c_str());
  } else {
    ImGui::Text("%lld prompts, %lld tokens", (long long)r.prompts, (long long)r.tokens);
    if (r.with_target > 0)
      ImGui::Text("accuracy %s (%lld of %lld with a target)", fmt_pct(r.accuracy).c_str(), (long long)r.correct,
                  (long long)r.with_target);
    else
      ImGui::TextDisabled("no targets: no accuracy");
  }
  // Groups by length and depth: the shown fraction and the accuracy per value.
  const int idx = fraction_index(st.corpus.part, diff ? st.corpus.map : 0);
  for (const char* key : {"length", "depth"}) {
    std::vector<size_t> at;
    for (size_t i = 0; i < r.groups.size(); ++i)
      if (r.groups[i].key == key)
        at.push_back(i);
    if (at.empty())
      continue;
    ImGui::Spacing();
    char id[32];
    std::snprintf(id, sizeof id, "##group_%s", key);
    if (!ImGui::BeginTable(id, 4, flags))
      continue;
    ImGui::TableSetupColumn(key);
    ImGui::TableSetupColumn("prompts");
    ImGui::TableSetupColumn((std::string(k_parts[st.corpus.part]) + " " + short_map_name(st.corpus.map, diff)).c_str());
    ImGui::TableSetupColumn("accuracy");
    ImGui::TableHeadersRow();
    for (size_t i : at) {
      const auto& g = r.groups[i];
      const auto* gb = sh.diff() && i < rep.compare.groups.size() ? &rep.compare.groups[i] : nullptr;
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(g.value.c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%lld", (long long)g.prompts);
      ImGui::TableNextColumn();
      if (gb)
        ImGui::TextUnformatted(fmt_signed(gb->mean[size_t(idx)] - g.mean[size_t(idx)]).c_str());
      else
        ImGui::TextUnformatted(fmt_frac(g.mean[size_t(idx)]).c_str());
      ImGui::TableNextColumn();
      if (gb)
        ImGui::Text("%s \xe2\x86\x92 %s", fmt_pct(g.accuracy).c_str(), fmt_pct(gb->accuracy).c_str());
      else
        ImGui::TextUnformatted(fmt_pct(g.accuracy).c_str());
    }
    ImGui::EndTable();
  }
  // Skipped lines, each with its reason.
  if (sc.skipped && !sc.skipped->empty()) {
    char title[64];
    std::snprintf(title, sizeof title, "Skipped lines (%zu)###skipped", sc.skipped->size());
    ImGui::Spacing();
    if (ImGui::CollapsingHeader(title, ImGuiTreeNodeFlags_DefaultOpen)) {
      const ImVec4 dim = ImGui::ColorConvertU32ToFloat4(theme_colors().text_dim);
      ImGuiListClipper clip;
      clip.Begin(int(sc.skipped->size()));
      while (clip.Step())
        for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
          const auto& e = (*sc.skipped)[size_t(i)];
          ImGui::TextColored(dim, "line %d", e.line);
          ImGui::SameLine();
          ImGui::TextUnformatted(e.error.c_str());
          item_tooltip(e.error.c_str());
        }
    }
  }
}

// [SECTION] the layer x head heatmap of the chosen fraction
void heatmap(AppState& st, const Shown& sh, ImVec2 size) {
  const ScanRunView& r = sh.run();
  const bool diff = r.differential;
  const ImGuiStyle& style = ImGui::GetStyle();
  // Which fraction: the part (answer / sink / context) and the map.
  ImGui::SetNextItemWidth(ImGui::CalcTextSize("context").x + ImGui::GetFrameHeight() + style.FramePadding.x * 2);
  ImGui::Combo("##part", &st.corpus.part, k_parts, 3);
  if (diff) {
    ImGui::SameLine();
    const std::string cur = map_name(st, st.corpus.map, true);
    ImGui::SetNextItemWidth(ImGui::CalcTextSize("|A1 - lambda*A2|").x + ImGui::GetFrameHeight());
    if (ImGui::BeginCombo("##map", cur.c_str())) {
      for (int m = 0; m < 4; ++m)
        if (ImGui::Selectable(map_name(st, m, true).c_str(), m == st.corpus.map))
          st.corpus.map = m;
      ImGui::EndCombo();
    }
  } else {
    st.corpus.map = 0;
  }
  ImGui::SameLine();
  ImGui::AlignTextToFramePadding();
  ImGui::TextDisabled("per head");

  const int L = int(r.layers.size()), H = r.heads;
  const int idx = fraction_index(st.corpus.part, st.corpus.map);
  if (L == 0 || H == 0)
    return;
  // Colours: a fraction of a probability row from 0 to the largest head; signed quantities (the difference's
  // share of its row sum, which can leave [0, 1], and run differences) on a diverging scale around 0.
  double lo = INFINITY, hi = -INFINITY;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      if (const double v = sh.cell(size_t(l), h, idx); std::isfinite(v))
        lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi >= lo))
    lo = 0, hi = 1;
  ColorScale sc;
  sc.diverging = sh.diff() || (st.corpus.map == 2 && lo < 0);
  if (sc.diverging) {
    sc.hi = float(std::max({std::fabs(lo), std::fabs(hi), 1e-6}));
    sc.lo = -sc.hi;
  } else {
    sc.lo = 0;
    sc.hi = float(std::max(hi, 1e-6));
  }
  const Colormap cm = sc.diverging ? Colormap::CoolWarm : Colormap(st.settings.seq_cmap);

  const float lh = ImGui::GetTextLineHeight();
  const ImVec2 o = ImGui::GetCursorScreenPos();
  const ImVec2 room = ImGui::GetContentRegionAvail();
  const float left = ImGui::CalcTextSize("L00").x + 8, top = lh + 4, cbw = colorbar_width() + 10;
  // Cells fill the room: square when they can be, else up to twice as wide as tall (values fit in them sooner).
  const float fit_w = (std::min(size.x, room.x) - left - cbw) / float(H), fit_h = (room.y - top - 6) / float(L);
  const float cell_h = std::floor(std::clamp(std::min(fit_h, fit_w), 6.0f, 90.0f));
  const float cell_w = std::floor(std::clamp(std::min(fit_w, 2 * cell_h), cell_h, 120.0f));
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ThemeColors& tc = theme_colors();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const float gap = cell_h >= 24 ? 1.0f : 0.0f;
  char buf[32];
  for (int h = 0; h < H; ++h) {
    std::snprintf(buf, sizeof buf, cell_w >= 26 ? "H%d" : "%d", h);
    if (cell_w < 14 && h % 4 != 0)
      continue;
    const float w = ImGui::CalcTextSize(buf).x;
    dl->AddText(ImVec2(o.x + left + h * cell_w + (cell_w - w) * 0.5f, o.y), h == st.head ? tc.selection : text, buf);
  }
  const ImVec2 grid0(o.x + left, o.y + top);
  for (int l = 0; l < L; ++l) {
    const int layer = r.layers[size_t(l)];
    std::snprintf(buf, sizeof buf, "L%d", layer);
    if (cell_h >= lh - 2 || l % std::max(1, int(std::ceil(lh / cell_h))) == 0)
      dl->AddText(ImVec2(o.x, grid0.y + l * cell_h + (cell_h - lh) * 0.5f), layer == st.layer ? tc.selection : text, buf);
    for (int h = 0; h < H; ++h) {
      const ImVec2 p0(grid0.x + h * cell_w + gap, grid0.y + l * cell_h + gap), p1(p0.x + cell_w - 2 * gap, p0.y + cell_h - 2 * gap);
      const double v = sh.cell(size_t(l), h, idx);
      dl->AddRectFilled(p0, p1, std::isfinite(v) ? colormap_rgba(cm, sc.to_t(float(v))) : tc.masked);
      if (std::isfinite(v) && cell_h >= lh + 2 && cell_w >= ImGui::CalcTextSize("-0.000").x + 4) {
        char t_buf[32];
        std::snprintf(t_buf, sizeof t_buf, std::fabs(v) < 9.9995 ? "%.3f" : "%.1f", v);
        const std::string t = t_buf;
        const float tw = ImGui::CalcTextSize(t.c_str()).x;
        const float lum = sc.to_t(float(v));
        const bool dark_text = sc.diverging ? std::fabs(lum - 0.5f) < 0.3f : lum > 0.55f;
        dl->AddText(ImVec2((p0.x + p1.x - tw) * 0.5f, (p0.y + p1.y - lh) * 0.5f),
                    dark_text ? IM_COL32(0, 0, 0, 255) : IM_COL32(255, 255, 255, 255), t.c_str());
      }
      if (layer == st.layer && h == st.head)
        dl->AddRect(ImVec2(p0.x - gap, p0.y - gap), ImVec2(p1.x + gap, p1.y + gap), tc.selection, 0, 0, 2.0f);
    }
  }
  const ImVec2 grid1(grid0.x + H * cell_w, grid0.y + L * cell_h);
  st.corpus.heat_rect = PanelRect{grid0.x * st.fb_scale, grid0.y * st.fb_scale, (grid1.x - grid0.x) * st.fb_scale,
                                (grid1.y - grid0.y) * st.fb_scale};
  draw_colorbar(dl, ImVec2(grid1.x + 10, grid0.y), ImVec2(grid1.x + 24, grid1.y), cm, sc, text);
  // Hover: every fraction of the head; click: open it in the head view.
  ImGui::SetCursorScreenPos(grid0);
  ImGui::InvisibleButton("##heat", ImVec2(std::max(1.0f, grid1.x - grid0.x), std::max(1.0f, grid1.y - grid0.y)));
  const bool clicked = ImGui::IsItemClicked(0);
  if (ImGui::IsItemHovered()) {
    const ImVec2 m = ImGui::GetIO().MousePos;
    const int h = std::clamp(int((m.x - grid0.x) / cell_w), 0, H - 1), l = std::clamp(int((m.y - grid0.y) / cell_h), 0, L - 1);
    const int layer = r.layers[size_t(l)];
    dl->AddRect(ImVec2(grid0.x + h * cell_w, grid0.y + l * cell_h), ImVec2(grid0.x + (h + 1) * cell_w, grid0.y + (l + 1) * cell_h),
                tc.cursor, 0, 0, 1.5f);
    ImGui::BeginTooltip();
    ImGui::Text("layer %d, head %d   (%s, mean over %lld prompts)", layer, h, sh.name(st).c_str(), (long long)r.prompts);
    ImGui::Separator();
    fraction_table("##tip", "", ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_BordersInnerV, st, sh, diff,
                   [&](int idx) { return sh.cell(size_t(l), h, idx); });
    ImGui::TextDisabled("click: open this head in the head view");
    ImGui::EndTooltip();
    if (clicked)
      st.select_head(layer, h);
  }
  ImGui::SetCursorScreenPos(ImVec2(o.x, grid1.y + 4));
  ImGui::Dummy(ImVec2(grid1.x - o.x + cbw, 1));
}

// [SECTION] one row per prompt: click to open it in the views
struct TableOrder {
  const ScanReport* rep = nullptr;
  int column = -1, view = -1, idx = -1;
  bool descending = false;
  std::vector<int> order;
};
TableOrder g_order;

void prompt_table(AppState& st, const ScanState& sc, const Shown& sh, ImVec2 size) {
  const ScanReport& rep = *sh.rep;
  const ScanRunView& a = rep.run;
  const bool cmp = rep.has_compare;
  const bool diff = a.differential;
  const int idx = fraction_index(st.corpus.part, diff ? st.corpus.map : 0);
  bool tags = false;
  for (const auto& r : a.rows)
    tags |= !r.tags.empty();
  // Columns: #, line, tokens, value (per run), correct (per run), output, tags.
  enum { C_INDEX, C_LINE, C_TOKENS, C_VALUE_A, C_VALUE_B, C_OK_A, C_OK_B, C_OUTPUT, C_TAGS, C_COUNT };
  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_ScrollY |
                                ImGuiTableFlags_ScrollX | ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_Sortable |
                                ImGuiTableFlags_Resizable | ImGuiTableFlags_Hideable;
  if (!ImGui::BeginTable("##prompts", C_COUNT, flags, size))
    return;
  const std::string value = std::string(k_parts[st.corpus.part]) + " " + short_map_name(st.corpus.map, diff);
  const std::string va = cmp ? value + " " + fmt_scale(a.lambda_scale) : value;
  const std::string vb = cmp ? value + " " + fmt_scale(rep.compare.lambda_scale) : "";
  // Fixed widths that fit the header and the widest value (the sort arrow included).
  const auto width = [](const std::string& header, const char* widest) {
    return std::max(ImGui::CalcTextSize(header.c_str()).x + ImGui::GetFontSize(), ImGui::CalcTextSize(widest).x) + 4;
  };
  const std::string ok_a = cmp ? "ok " + fmt_scale(a.lambda_scale) : "ok";
  const std::string ok_b = cmp ? "ok " + fmt_scale(rep.compare.lambda_scale) : "ok 2";
  const ImGuiTableColumnFlags fixed = ImGuiTableColumnFlags_WidthFixed;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("#", fixed | ImGuiTableColumnFlags_DefaultSort, width("#", "0000"), C_INDEX);
  ImGui::TableSetupColumn("line", fixed, width("line", "00000"), C_LINE);
  ImGui::TableSetupColumn("tokens", fixed, width("tokens", "00000"), C_TOKENS);
  ImGui::TableSetupColumn(va.c_str(), fixed | ImGuiTableColumnFlags_PreferSortDescending, width(va, "-0.000"), C_VALUE_A);
  ImGui::TableSetupColumn(vb.c_str(), fixed | ImGuiTableColumnFlags_PreferSortDescending | (cmp ? 0 : ImGuiTableColumnFlags_Disabled),
                          width(vb, "-0.000"), C_VALUE_B);
  ImGui::TableSetupColumn(ok_a.c_str(), fixed, width(ok_a, "yes"), C_OK_A);
  ImGui::TableSetupColumn(ok_b.c_str(), fixed | (cmp ? 0 : ImGuiTableColumnFlags_Disabled), width(ok_b, "yes"), C_OK_B);
  ImGui::TableSetupColumn("output", fixed | ImGuiTableColumnFlags_NoSort, width("output", "\"0000000000000000000000\""), C_OUTPUT);
  ImGui::TableSetupColumn("tags", tags ? 0 : ImGuiTableColumnFlags_Disabled, 0, C_TAGS);
  ImGui::TableHeadersRow();

  // Row order: the sort the headers ask for, kept until the report or the column's meaning changes.
  const int n = int(a.rows.size());
  const auto* b = cmp && rep.compare.rows.size() == a.rows.size() ? &rep.compare : nullptr;
  if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs()) {
    const int column = specs->SpecsCount > 0 ? int(specs->Specs[0].ColumnUserID) : C_INDEX;
    const bool desc = specs->SpecsCount > 0 && specs->Specs[0].SortDirection == ImGuiSortDirection_Descending;
    if (specs->SpecsDirty || g_order.rep != &rep || g_order.column != column || g_order.descending != desc ||
        g_order.idx != idx || int(g_order.order.size()) != n) {
      g_order.rep = &rep;
      g_order.column = column;
      g_order.descending = desc;
      g_order.idx = idx;
      g_order.order.resize(size_t(n));
      std::iota(g_order.order.begin(), g_order.order.end(), 0);
      const auto key = [&](int i) -> double {
        const auto& r = a.rows[size_t(i)];
        switch (column) {
          case C_LINE:
            return r.line;
          case C_TOKENS:
            return double(r.tokens);
          case C_VALUE_A:
            return r.mean[size_t(idx)];
          case C_VALUE_B:
            return b ? b->rows[size_t(i)].mean[size_t(idx)] : NAN;
          case C_OK_A:
            return r.correct;
          case C_OK_B:
            return b ? b->rows[size_t(i)].correct : -1;
          default:
            return i;
        }
      };
      std::stable_sort(g_order.order.begin(), g_order.order.end(), [&](int x, int y) {
        const double kx = key(x), ky = key(y);
        if (std::isnan(kx) != std::isnan(ky))
          return std::isnan(ky);  // values without a number last
        return desc ? kx > ky : kx < ky;
      });
      if (column == C_TAGS)
        std::stable_sort(g_order.order.begin(), g_order.order.end(), [&](int x, int y) {
          return desc ? a.rows[size_t(x)].tags > a.rows[size_t(y)].tags : a.rows[size_t(x)].tags < a.rows[size_t(y)].tags;
        });
      specs->SpecsDirty = false;
    }
  }
  const ThemeColors& tc = theme_colors();
  const ImVec4 good = ImGui::ColorConvertU32ToFloat4(tc.generated_mark), bad = ImGui::ColorConvertU32ToFloat4(tc.diff_mark);
  const auto ok_cell = [&](int c) {
    if (c < 0)
      ImGui::TextDisabled("\xe2\x80\x93");
    else
      ImGui::TextColored(c ? good : bad, "%s", c ? "yes" : "no");
  };
  ImGuiListClipper clip;
  clip.Begin(n);
  while (clip.Step())
    for (int k = clip.DisplayStart; k < clip.DisplayEnd; ++k) {
      const int i = g_order.order.size() == size_t(n) ? g_order.order[size_t(k)] : k;
      const auto& r = a.rows[size_t(i)];
      const auto* rb = b ? &b->rows[size_t(i)] : nullptr;
      const auto& ro = sh.view == 1 && rb ? *rb : r;
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      char label[32];
      std::snprintf(label, sizeof label, "%d##row", i);
      ImGui::PushID(i);
      if (ImGui::Selectable(label, i == st.corpus.open_row, ImGuiSelectableFlags_SpanAllColumns | ImGuiSelectableFlags_AllowItemOverlap)) {
        std::string why;
        if (!st.open_scan_prompt(i, &why))
          st.notify(why, true);
      }
      if (ImGui::IsItemHovered()) {
        ImGui::BeginTooltip();
        ImGui::Text("line %d: %lld tokens, answer span %lld..%lld", r.line, (long long)r.tokens, (long long)r.answer_begin,
                    (long long)r.answer_end - 1);
        if (const ds::scan::Prompt* p = sc.prompt_at_line(r.line); p && p->is_text) {
          const std::string text = p->text.size() > 400 ? "..." + p->text.substr(p->text.size() - 400) : p->text;
          ImGui::PushTextWrapPos(ImGui::GetFontSize() * 36);
          ImGui::TextDisabled("%s", text.c_str());
          ImGui::PopTextWrapPos();
        }
        if (ro.correct >= 0)
          ImGui::Text("target \"%s\"\noutput \"%s\"", ro.target.c_str(), ro.output.c_str());
        ImGui::TextDisabled("%s", st.scanning() ? "the scan is running: a prompt opens once it has finished (or Stop it)"
                                                : "click: open this prompt in the views (row view on its last token)");
        ImGui::EndTooltip();
      }
      ImGui::PopID();
      ImGui::TableNextColumn();
      ImGui::Text("%d", r.line);
      ImGui::TableNextColumn();
      ImGui::Text("%lld", (long long)r.tokens);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(fmt_frac(r.mean[size_t(idx)]).c_str());
      ImGui::TableNextColumn();
      if (rb)
        ImGui::TextUnformatted(fmt_frac(rb->mean[size_t(idx)]).c_str());
      ImGui::TableNextColumn();
      ok_cell(r.correct);
      ImGui::TableNextColumn();
      if (rb)
        ok_cell(rb->correct);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(ro.correct >= 0 ? ("\"" + token_label(ro.output, 24) + "\"").c_str() : "");
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.tags.c_str());
    }
  ImGui::EndTable();
}

}  // namespace

void draw_corpus_panel(AppState& st) {
  const Snapshot& s = *st.snap;
  const std::shared_ptr<const ScanState> scp = s.scan && s.scan->seq == st.req.scan_seq ? s.scan : nullptr;
  char title[128];
  if (st.scanning())
    std::snprintf(title, sizeof title, "Corpus  scanning %d / %d...###Corpus", scp ? scp->tried : 0, scp ? scp->total : 0);
  else if (scp && scp->report)
    std::snprintf(title, sizeof title, "Corpus  %lld prompts%s%s###Corpus", (long long)scp->report->run.prompts,
                  scp->report->run.with_target ? ", accuracy " : "",
                  scp->report->run.with_target ? fmt_pct(scp->report->run.accuracy).c_str() : "");
  else
    std::snprintf(title, sizeof title, "Corpus###Corpus");
  if (st.raise_corpus) {
    ImGui::SetNextWindowFocus();
    st.raise_corpus = false;
  }
  if (!begin_panel(st, title, &st.show_corpus, Slot::Corpus))
    return end_panel();
  if (!s.model) {
    empty_state("Open a model; then scan a corpus here: a JSONL file, one prompt a line with its answer span, "
                "e.g. {\"text\": \"... Answer:\", \"answer\": [34, 38], \"target\": \" 4729\"}.");
    return end_panel();
  }
  controls(st, *s.model);
  if (!scp) {
    empty_state("Scan a JSONL corpus: for the last prompt token of each prompt, per layer and head, how much "
                "attention goes to the line's answer span, to the first token (the sink) and to the rest, for A1, A2 "
                "and A1 - lambda*A2, with the greedy answer's accuracy where a line has a \"target\". "
                "Then click a prompt to open it in the views.");
    return end_panel();
  }
  const ScanState& sc = *scp;
  status_line(st, sc);
  save_popup(st, g_save_report, false);
  save_popup(st, g_save_plot, true);
  if (!sc.report) {
    if (sc.running)
      empty_state("Scanning: the report appears after the first prompts.");
    return end_panel();
  }
  const ScanReport& rep = *sc.report;
  if (!rep.has_compare)
    st.corpus.view = 0;
  Shown sh{&rep, st.corpus.view};
  if (rep.run.prompts == 0) {  // nothing to average yet: the lines skipped so far, with their reasons
    ImGui::BeginChild("##skipped_only", ImVec2(0, 0), false);
    if (sc.skipped)
      for (const auto& e : *sc.skipped) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(theme_colors().text_dim), "line %d", e.line);
        ImGui::SameLine();
        ImGui::TextUnformatted(e.error.c_str());
      }
    ImGui::EndChild();
    return end_panel();
  }

  // Three columns (summary | heatmap | prompts); tabs when the panel is narrow.
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  if (avail.x >= 820) {
    const float left_w = std::floor(std::clamp(avail.x * 0.29f, 280.0f, 440.0f));
    const float heat_w = std::floor(std::clamp(avail.x * 0.30f, 260.0f, 520.0f));
    const float table_w = avail.x - left_w - heat_w - 2 * gap;
    ImGui::BeginChild("##summary", ImVec2(left_w, avail.y), false);
    summary(st, sc, sh);
    ImGui::EndChild();
    ImGui::SameLine();
    ImGui::BeginChild("##heatmap", ImVec2(heat_w, avail.y), false, ImGuiWindowFlags_NoScrollbar);
    heatmap(st, sh, ImVec2(heat_w, avail.y));
    ImGui::EndChild();
    ImGui::SameLine();
    prompt_table(st, sc, sh, ImVec2(table_w, avail.y));
  } else if (ImGui::BeginTabBar("##corpus_tabs")) {
    if (ImGui::BeginTabItem("Summary")) {
      ImGui::BeginChild("##summary", ImVec2(0, 0), false);
      summary(st, sc, sh);
      ImGui::EndChild();
      ImGui::EndTabItem();
    }
    if (ImGui::BeginTabItem("Heads")) {
      heatmap(st, sh, ImGui::GetContentRegionAvail());
      ImGui::EndTabItem();
    }
    if (ImGui::BeginTabItem("Prompts")) {
      prompt_table(st, sc, sh, ImGui::GetContentRegionAvail());
      ImGui::EndTabItem();
    }
    ImGui::EndTabBar();
  }
  end_panel();
}

}  // namespace ds::gui
