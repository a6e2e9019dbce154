// Profiler: the last run's forward time, tokens/s and attention TFLOP/s against the device's measured peak, a
// rolling history over runs, per-kernel statistics and per-head attention times, updated on every run.
#include <imgui.h>

#include <algorithm>
#include <cstdio>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"

namespace ds::gui {

namespace {

void history_plot(const char* label, const std::vector<HistoryPoint>& hist, float HistoryPoint::*field,
                  const char* unit, float w, float h) {
  std::vector<float> v;
  for (const auto& p : hist)
    v.push_back(p.*field);
  char overlay[64] = "";
  if (!v.empty())
    std::snprintf(overlay, sizeof overlay, "%s %s %s", label, fmt_value(v.back()).c_str(), unit);
  ImGui::PushID(label);
  ImGui::PlotLines("##hist", v.data(), int(v.size()), 0, overlay, 0.0f, FLT_MAX, ImVec2(w, h));
  ImGui::PopID();
}

void kernel_table(const Profile& p) {
  if (p.kernels.empty()) {
    ImGui::TextDisabled("This backend reports no per-kernel timings.");
    return;
  }
  const ImGuiTableFlags f = ImGuiTableFlags_Sortable | ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                            ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_Resizable;
  if (!ImGui::BeginTable("kernels", 6, f))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("kernel", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableSetupColumn("count");
  ImGui::TableSetupColumn("total", ImGuiTableColumnFlags_DefaultSort | ImGuiTableColumnFlags_PreferSortDescending);
  ImGui::TableSetupColumn("mean");
  ImGui::TableSetupColumn("min");
  ImGui::TableSetupColumn("max");
  ImGui::TableHeadersRow();
  std::vector<KernelTiming> rows = p.kernels;
  if (const ImGuiTableSortSpecs* ss = ImGui::TableGetSortSpecs(); ss && ss->SpecsCount > 0) {
    const int col = ss->Specs[0].ColumnIndex;
    const bool asc = ss->Specs[0].SortDirection == ImGuiSortDirection_Ascending;
    auto key = [col](const KernelTiming& k) -> double {
      switch (col) {
        case 1:
          return double(k.count);
        case 2:
          return k.total_ms;
        case 3:
          return k.count ? k.total_ms / double(k.count) : 0;
        case 4:
          return k.min_ms;
        case 5:
          return k.max_ms;
        default:
          return 0;
      }
    };
    std::stable_sort(rows.begin(), rows.end(), [&](const KernelTiming& a, const KernelTiming& b) {
      if (col == 0)
        return asc ? a.name < b.name : a.name > b.name;
      return asc ? key(a) < key(b) : key(a) > key(b);
    });
  }
  for (const auto& k : rows) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(k.name.c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%lld", (long long)k.count);
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_value(k.total_ms).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_value(k.count ? k.total_ms / double(k.count) : 0.0).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_value(k.min_ms).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(fmt_value(k.max_ms).c_str());
  }
  ImGui::EndTable();
}

void head_table(AppState& st, const Profile& p) {
  if (p.heads.empty()) {
    ImGui::TextDisabled("This backend reports no per-head attention timings.");
    return;
  }
  const ImGuiTableFlags f = ImGuiTableFlags_Sortable | ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                            ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("heads", 5, f))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("layer");
  ImGui::TableSetupColumn("head");
  ImGui::TableSetupColumn("ms", ImGuiTableColumnFlags_DefaultSort | ImGuiTableColumnFlags_PreferSortDescending);
  ImGui::TableSetupColumn("GFLOP");
  ImGui::TableSetupColumn("TFLOP/s", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  std::vector<HeadTiming> rows = p.heads;
  if (const ImGuiTableSortSpecs* ss = ImGui::TableGetSortSpecs(); ss && ss->SpecsCount > 0) {
    const int col = ss->Specs[0].ColumnIndex;
    const bool asc = ss->Specs[0].SortDirection == ImGuiSortDirection_Ascending;
    auto key = [col](const HeadTiming& h) -> double {
      switch (col) {
        case 0:
          return h.layer * 1e6 + h.head;
        case 1:
          return h.head * 1e6 + h.layer;
        case 2:
          return h.ms;
        case 3:
          return h.flops;
        default:
          return h.ms > 0 ? h.flops / h.ms : 0;
      }
    };
    std::stable_sort(rows.begin(), rows.end(),
                     [&](const HeadTiming& a, const HeadTiming& b) { return asc ? key(a) < key(b) : key(a) > key(b); });
  }
  ImGuiListClipper clip;
  clip.Begin(int(rows.size()));
  while (clip.Step())
    for (int i = clip.DisplayStart; i < clip.DisplayEnd; ++i) {
      const HeadTiming& h = rows[i];
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      char id[32];
      std::snprintf(id, sizeof id, "L%d##%d", h.layer, i);
      if (ImGui::Selectable(id, h.layer == st.layer && h.head == st.head, ImGuiSelectableFlags_SpanAllColumns))
        st.select_head(h.layer, h.head);
      ImGui::TableNextColumn();
      ImGui::Text("H%d", h.head);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", h.ms);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", h.flops / 1e9);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", h.ms > 0 ? h.flops / (h.ms * 1e-3) / 1e12 : 0.0);
    }
  ImGui::EndTable();
}

// A layer split's devices as lanes on one time axis (the forward's wall time): each GPU's block from when it started
// to when its work was done, the hand-off copy of the residual stream into it in the second colour, and the layers it
// holds; a block a re-run did not reach shows as an empty lane.
void device_lanes(const Profile& p) {
  if (p.lanes.size() < 2 || p.forward_ms <= 0) return;
  const ThemeColors& tc = theme_colors();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float row_h = ImGui::GetTextLineHeight() + 4, label_w = ImGui::CalcTextSize("GPU 00  L000-000 ").x;
  const float w = std::max(40.f, ImGui::GetContentRegionAvail().x - label_w);
  for (size_t i = 0; i < p.lanes.size(); ++i) {
    const DeviceLane& d = p.lanes[i];
    char label[64];
    std::snprintf(label, sizeof label, "%s  L%d-%d", d.device.c_str(), d.first_layer, d.end_layer - 1);
    ImGui::TextUnformatted(label);
    ImGui::SameLine(label_w);
    const ImVec2 o = ImGui::GetCursorScreenPos();
    ImGui::InvisibleButton(label, ImVec2(w, row_h - 2));
    dl->AddRectFilled(o, ImVec2(o.x + w, o.y + row_h - 2), ImGui::GetColorU32(ImGuiCol_FrameBg));
    const auto x_of = [&](double ms) { return o.x + float(std::clamp(ms / p.forward_ms, 0.0, 1.0)) * w; };
    const bool ran = d.end_ms > d.start_ms;
    if (ran) {
      dl->AddRectFilled(ImVec2(x_of(d.start_ms), o.y + 1), ImVec2(std::max(x_of(d.end_ms), x_of(d.start_ms) + 1), o.y + row_h - 3),
                        tc.plot_a);
      if (d.handoff_ms > 0)
        dl->AddRectFilled(ImVec2(x_of(d.start_ms), o.y + 1),
                          ImVec2(std::max(x_of(d.start_ms + d.handoff_ms), x_of(d.start_ms) + 2), o.y + row_h - 3), tc.plot_b);
    }
    dl->AddRect(o, ImVec2(o.x + w, o.y + row_h - 2), tc.grid);
    if (ImGui::IsItemHovered()) {
      if (ran)
        ImGui::SetTooltip("%s: layers %d-%d\nfrom %.2f to %.2f ms of the forward (%.2f ms)\nhand-off of the residual "
                          "stream into it: %.3f ms\nits kernels: %.2f ms",
                          d.device.c_str(), d.first_layer, d.end_layer - 1, d.start_ms, d.end_ms, d.end_ms - d.start_ms,
                          d.handoff_ms, d.kernels_ms);
      else
        ImGui::SetTooltip("%s: layers %d-%d\nnot re-run (the change was in a later block)", d.device.c_str(),
                          d.first_layer, d.end_layer - 1);
    }
  }
  double handoff = 0;
  for (const DeviceLane& d : p.lanes) handoff += d.handoff_ms;
  ImGui::TextDisabled("%zu devices; hand-offs %s ms in all", p.lanes.size(), fmt_value(handoff).c_str());
}

}  // namespace

// The Table 5 reader (engine/core/forward.h's hook point, Session::max_abs_hidden): off by default, since turning it on
// re-runs every layer once; then every run shows each layer's largest |hidden state| as bars.
static void max_abs_tab(AppState& st, const RunResult& r) {
  if (ImGui::Checkbox("Read each layer's largest |hidden state|", &st.req.max_abs_hidden))
    st.submit();
  item_tooltip("The paper's Table 5 (activation outliers): max |h| of every layer's output over the sequence,\n"
               "reduced on the device during the forward. Turning it on re-runs every layer once.");
  if (!st.req.max_abs_hidden)
    return empty_state("Off. Turn it on to see where the residual stream's outliers grow, layer by layer.");
  const std::vector<float>& v = r.max_abs_hidden;
  if (v.empty())
    return empty_state("Waiting for a run with the reader on.");
  float top = 0;
  int top_l = 0;
  for (size_t l = 0; l < v.size(); ++l)
    if (v[l] > top)
      top = v[l], top_l = int(l);
  ImGui::Text("largest: %s at layer %d", fmt_value(top).c_str(), top_l);
  ImGui::PlotHistogram("##maxabs", v.data(), int(v.size()), 0, nullptr, 0.f, top * 1.05f,
                       ImVec2(ImGui::GetContentRegionAvail().x, std::max(60.f, ImGui::GetContentRegionAvail().y - 4)));
  if (ImGui::IsItemHovered()) {
    const float x = (ImGui::GetMousePos().x - ImGui::GetItemRectMin().x) / std::max(1.f, ImGui::GetItemRectSize().x);
    const int l = std::clamp(int(x * float(v.size())), 0, int(v.size()) - 1);
    ImGui::SetTooltip("layer %d: max |h| = %s", l, fmt_value(v[size_t(l)]).c_str());
  }
}

// Activation outliers (session_outliers.h, Table 5): per layer the largest |hidden state| and |attention logit| of each
// map, as bars, and the medians in the tooltips; computed once per result while the box is ticked.
static void outliers_tab(AppState& st, const Snapshot& s) {
  if (ImGui::Checkbox("Compute the activation outliers", &st.req.outliers))
    st.submit_now();
  item_tooltip("The paper's Table 5: per layer the largest |hidden state| over every position and channel, and\n"
               "the largest |q.k/sqrt(d)| over every causal cell of every head's map 1 and map 2 (exact), with their\n"
               "medians (the logits' within 2^-17, relatively). Recomputes each layer's Q.K twice (a radix select),\n"
               "once per result.");
  if (!st.req.outliers) return empty_state("Off. Turn it on to compare the outliers of layers (and of models).");
  const auto& ov = s.outliers;
  if (!ov || !s.result || ov->result_seq != s.result->seq) {
    if (s.outliers_fraction < 0) return empty_state("Computing...");
    char msg[64];
    std::snprintf(msg, sizeof msg, "Computing... %.0f %% of the layers' passes", 100 * s.outliers_fraction);
    return empty_state(msg);
  }
  const Outliers& o = ov->o;
  ImGui::Text("model: |h| top %s (median %s)", fmt_value(o.hidden.s.top[0]).c_str(), fmt_value(o.hidden.s.median).c_str());
  if (o.logit1.s.count) {
    if (o.differential)
      ImGui::Text("       |logit| top: map 1 %s, map 2 %s", fmt_value(o.logit1.s.top[0]).c_str(),
                  fmt_value(o.logit2.s.top[0]).c_str());
    else
      ImGui::Text("       |logit| top %s", fmt_value(o.logit1.s.top[0]).c_str());
  }
  const int L = int(o.layers.size());
  std::vector<float> hid(size_t(L), 0.f), lg1(size_t(L), 0.f), lg2(size_t(L), 0.f);
  for (int l = 0; l < L; ++l) {
    const LayerOutliers& lo = o.layers[size_t(l)];
    hid[size_t(l)] = lo.hidden.s.top[0];
    if (lo.has_logits) lg1[size_t(l)] = lo.logit1.s.top[0], lg2[size_t(l)] = o.differential ? lo.logit2.s.top[0] : 0.f;
  }
  const ThemeColors& tc = theme_colors();
  // Two plots one above the other, or side by side when the panel is short (the default layout's Profiler strip)
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const bool side = o.logit1.s.count && (avail.y - 8) / 2 < 90 && avail.x > 360;
  const float w = side ? (avail.x - 8) / 2 : avail.x;
  const float h = std::max(48.f, side ? avail.y - 4 : (avail.y - 8) / 2);
  // Bars per layer (one series, or map 1 and map 2 side by side), the scale's top on the left, layer numbers below.
  auto bars = [&](const char* id, const std::vector<const std::vector<float>*>& series, const char* what) {
    const float lh = ImGui::GetTextLineHeight(), left = ImGui::CalcTextSize("0000.0").x + 6;
    float top = 1e-12f;
    for (const auto* v : series) top = std::max(top, *std::max_element(v->begin(), v->end()));
    const ImVec2 p0 = ImGui::GetCursorScreenPos(), p1(p0.x + w, p0.y + h);
    ImGui::InvisibleButton(id, ImVec2(w, h));
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 a(p0.x + left, p0.y + lh + 2), b(p1.x - 2, p1.y - lh - 2);  // the plot area
    dl->AddRectFilled(a, b, ImGui::GetColorU32(ImGuiCol_FrameBg));
    const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text), dim = ImGui::GetColorU32(ImGuiCol_TextDisabled);
    dl->AddText(ImVec2(p0.x, p0.y), text, what);
    const std::string ymax = fmt_value(top * 1.1f);
    dl->AddText(ImVec2(a.x - ImGui::CalcTextSize(ymax.c_str()).x - 4, a.y), dim, ymax.c_str());
    if (b.y - a.y >= 2.5f * lh) dl->AddText(ImVec2(a.x - ImGui::CalcTextSize("0").x - 4, b.y - lh), dim, "0");
    const float slot = (b.x - a.x) / float(std::max(L, 1)), bw = std::max(1.f, (slot - 2) / float(series.size()));
    const ImU32 colors[2] = {tc.plot_a, tc.plot_b};
    const int every = std::max(1, int(std::ceil(ImGui::CalcTextSize("000").x / std::max(slot, 1.f))));
    for (int l = 0; l < L; ++l) {
      for (size_t k = 0; k < series.size(); ++k) {
        const float v = (*series[k])[size_t(l)], y = b.y - (b.y - a.y) * v / (top * 1.1f);
        const float x0 = a.x + slot * float(l) + 1 + bw * float(k);
        dl->AddRectFilled(ImVec2(x0, y), ImVec2(x0 + std::max(bw - 1, 1.f), b.y), colors[k]);
      }
      if (l % every == 0) {
        const std::string t = std::to_string(o.layers[size_t(l)].layer);
        dl->AddText(ImVec2(a.x + slot * (float(l) + 0.5f) - ImGui::CalcTextSize(t.c_str()).x / 2, b.y + 1), dim, t.c_str());
      }
    }
    if (series.size() == 2) {  // the legend
      const float lx = p1.x - ImGui::CalcTextSize("map 1   map 2").x - 8;
      dl->AddText(ImVec2(lx, p0.y), colors[0], "map 1");
      dl->AddText(ImVec2(lx + ImGui::CalcTextSize("map 1   ").x, p0.y), colors[1], "map 2");
    }
    if (ImGui::IsItemHovered()) {
      const int l = std::clamp(int((ImGui::GetMousePos().x - a.x) / std::max(slot, 1.f)), 0, L - 1);
      const LayerOutliers& lo = o.layers[size_t(l)];
      if (lo.has_logits)
        ImGui::SetTooltip("layer %d\n|h|: top %s, 10th %s, median %s\n|logit| map 1: top %s, median %s%s%s%s%s", lo.layer,
                          fmt_value(lo.hidden.s.top[0]).c_str(), fmt_value(lo.hidden.s.top[3]).c_str(),
                          fmt_value(lo.hidden.s.median).c_str(), fmt_value(lo.logit1.s.top[0]).c_str(),
                          fmt_value(lo.logit1.s.median).c_str(), o.differential ? "\n|logit| map 2: top " : "",
                          o.differential ? fmt_value(lo.logit2.s.top[0]).c_str() : "", o.differential ? ", median " : "",
                          o.differential ? fmt_value(lo.logit2.s.median).c_str() : "");
      else
        ImGui::SetTooltip("layer %d (no attention)\n|h|: top %s, 10th %s, median %s", lo.layer,
                          fmt_value(lo.hidden.s.top[0]).c_str(), fmt_value(lo.hidden.s.top[3]).c_str(),
                          fmt_value(lo.hidden.s.median).c_str());
    }
  };
  bars("##out_h", {&hid}, "max |hidden state| per layer");
  if (side) ImGui::SameLine(0, 8);
  if (o.logit1.s.count) {
    if (o.differential) bars("##out_l", {&lg1, &lg2}, "max |attention logit| per layer");
    else bars("##out_l", {&lg1}, "max |attention logit| per layer");
  }
}

void draw_profiler_panel(AppState& st) {
  if (!begin_panel(st, "Profiler", &st.show_profiler, Slot::Profiler))
    return end_panel();
  const Snapshot& s = *st.snap;
  if (!s.model) {
    empty_state("Open a model and run a prompt: each run's timings appear here.");
    return end_panel();
  }
  ImGui::TextUnformatted(s.model->backend_name.c_str());
  if (!s.result) {
    empty_state("Run a prompt (Ctrl+Enter) to profile it. Every re-run adds a point to the history.");
    return end_panel();
  }
  const RunResult& r = *s.result;
  const Profile& p = r.profile;
  double attn_ms = 0, flops = 0;
  for (const auto& h : p.heads)
    attn_ms += h.ms, flops += h.flops;
  const double tps = p.forward_ms > 0 ? double(r.tokens_run()) / (p.forward_ms * 1e-3) : 0;
  const double tflops = attn_ms > 0 ? flops / (attn_ms * 1e-3) / 1e12 : 0;
  if (r.decoded > 0)  // a generation step: the new token against the cached keys and values
    ImGui::TextWrapped("generation step %.2f ms, %lld new of %lld tokens, %s tokens/s", p.forward_ms,
                       (long long)r.decoded, (long long)p.tokens, fmt_value(tps).c_str());
  else
    ImGui::TextWrapped("forward %.2f ms, %lld tokens, %s tokens/s", p.forward_ms, (long long)p.tokens,
                       fmt_value(tps).c_str());
  if (r.first_layer > 0) {
    ImGui::SameLine();
    ImGui::TextDisabled("(re-ran layers %d..%lld)", r.first_layer, (long long)s.model->cfg.layers - 1);
  }
  char peak[96];
  if (p.peak_tflops > 0)
    std::snprintf(peak, sizeof peak, "%.1f%% of the measured peak, %s TFLOP/s", 100.0 * tflops / p.peak_tflops,
                  fmt_value(p.peak_tflops).c_str());
  else
    std::snprintf(peak, sizeof peak, "%s", s.model->backend_kind == "cpu" ? "peak unknown on CPU" : "peak unknown");
  if (p.heads.empty())  // a CUDA generation step is one graph: no per-head times inside it
    ImGui::TextDisabled("no per-head attention times for this step (one CUDA graph)");
  else
    ImGui::TextWrapped("attention %.2f ms, %s TFLOP/s (%s)", attn_ms, fmt_value(tflops).c_str(), peak);
  if (ImGui::IsItemHovered() && !p.heads.empty())
    ImGui::SetTooltip(
        "FLOPs per differential head: 12 n^2 d, halved for causal (kernels/attn_heads.h); "
        "the peak is the device's measured matrix throughput");

  device_lanes(p);

  const float plot_h = 44, avail_w = ImGui::GetContentRegionAvail().x;
  if (ImGui::GetContentRegionAvail().y < 5 * plot_h + 40) {  // a short panel: the two plots side by side
    const float w = (avail_w - ImGui::GetStyle().ItemSpacing.x) / 2;
    history_plot("tokens/s", st.history, &HistoryPoint::tokens_per_s, "", w, plot_h);
    ImGui::SameLine();
    history_plot("attention", st.history, &HistoryPoint::attn_tflops, "TFLOP/s", w, plot_h);
  } else {
    history_plot("tokens/s", st.history, &HistoryPoint::tokens_per_s, "", avail_w, plot_h);
    history_plot("attention", st.history, &HistoryPoint::attn_tflops, "TFLOP/s", avail_w, plot_h);
  }
  ImGui::TextDisabled("%lld runs; times in ms", (long long)st.runs_seen);

  if (ImGui::BeginTabBar("prof")) {
    if (ImGui::BeginTabItem("Kernels")) {
      kernel_table(p);
      ImGui::EndTabItem();
    }
    if (ImGui::BeginTabItem("Heads")) {
      head_table(st, p);
      ImGui::EndTabItem();
    }
    const ImGuiTabItemFlags sel = st.focus_max_abs ? ImGuiTabItemFlags_SetSelected : 0;
    st.focus_max_abs = false;
    if (ImGui::BeginTabItem("max |h|", nullptr, sel)) {
      max_abs_tab(st, r);
      ImGui::EndTabItem();
    }
    const ImGuiTabItemFlags sel_o = st.focus_outliers ? ImGuiTabItemFlags_SetSelected : 0;
    st.focus_outliers = false;
    if (ImGui::BeginTabItem("outliers", nullptr, sel_o)) {
      outliers_tab(st, s);
      ImGui::EndTabItem();
    }
    ImGui::EndTabBar();
  }
  end_panel();
}

}  // namespace ds::gui
