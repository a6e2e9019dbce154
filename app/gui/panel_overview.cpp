// Overview: a layer x head grid. Each cell is a thumbnail of A1, A2 or A1 - lambda*A2 (each scaled to its own
// range), or one per-head statistic as a colour on a shared scale. Click a cell to open that head.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"

namespace ds::gui {

namespace {

float stat_of(const HeadStats& s, OverviewMode m) {
  switch (m) {
    case OverviewMode::EntropyA1:
      return s.entropy1;
    case OverviewMode::EntropyDiff:
      return s.entropy_diff;
    case OverviewMode::FirstA1:
      return s.first1;
    case OverviewMode::FirstDiff:
      return s.first_diff;
    case OverviewMode::NegMass:
      return s.neg_mass;
    case OverviewMode::EntropyA2:
      return s.entropy2;
    case OverviewMode::MaxLogit1:
      return s.max_logit1;
    case OverviewMode::MaxLogit2:
      return s.max_logit2;
    default:
      return 0;
  }
}

// The thumbnails of every head in one atlas texture: row = layer, column = head, each tile scaled to its own max
// (symmetric for the difference) so that every head's pattern is visible.
void rebuild_atlas(AppState& st, const Overview& r, int heads) {
  OverviewTexture& T = st.ov_tex;
  const uint64_t key = uint64_t(st.ov_mode) | uint64_t(st.settings.seq_cmap) << 8 | uint64_t(theme_is_dark()) << 12;
  if (T.source == st.snap->overview && T.style_key == key)
    return;
  T.source = st.snap->overview;
  T.style_key = key;
  int tile = 0;
  for (const auto& l : r.layers)
    for (const auto& t : l.thumbs)
      tile = std::max(tile, t.size);
  T.tile = tile;
  T.rows = int(r.layers.size());
  T.cols = heads;
  if (tile == 0) {
    T.atlas.reset();
    return;
  }
  const bool diff = st.ov_mode == OverviewMode::Diff;
  const Colormap cm = diff ? Colormap::CoolWarm : Colormap(st.settings.seq_cmap);
  const int W = heads * tile, H = T.rows * tile;
  std::vector<uint32_t> px(size_t(W) * H, theme_colors().masked);
  for (int l = 0; l < T.rows; ++l) {
    for (int h = 0; h < heads && h < int(r.layers[l].thumbs.size()); ++h) {
      const Thumb& th = r.layers[l].thumbs[h];
      const std::vector<float>& m = st.ov_mode == OverviewMode::A1   ? th.a1
                                    : st.ov_mode == OverviewMode::A2 ? th.a2
                                                                     : th.diff;
      if (m.empty())
        continue;
      float hi = 0;
      for (float v : m)
        hi = std::max(hi, diff ? std::fabs(v) : v);
      ColorScale sc;
      sc.diverging = diff;
      sc.hi = std::max(hi, 1e-12f);
      sc.lo = diff ? -sc.hi : 0;
      const GridGeom g{0, r.n, 0, r.n, th.size, th.size};
      for (int y = 0; y < th.size; ++y)
        for (int x = 0; x < th.size; ++x) {
          // Blocks wholly above the diagonal average only masked cells: keep them in the masked colour.
          const uint32_t c = g.masked(y, x) ? theme_colors().masked : colormap_rgba(cm, sc.to_t(m[y * th.size + x]));
          px[size_t(l * tile + y) * W + h * tile + x] = c;
        }
    }
  }
  T.atlas.upload(px.data(), W, H);
}

}  // namespace

namespace {

// The mode combo (what each cell shows); the modes that need A2 only for differential models.
void mode_combo(AppState& st, const ModelConfig& cfg) {
  int mode = int(st.ov_mode);
  ImGui::SetNextItemWidth(std::min(300.0f, ImGui::GetContentRegionAvail().x));
  if (ImGui::BeginCombo("##ovmode", overview_mode_name(st.ov_mode))) {
    for (int i = 0; i < int(OverviewMode::Count); ++i) {
      if (!cfg.is_diff() && overview_mode_needs_a2(OverviewMode(i)))
        continue;
      if (ImGui::Selectable(overview_mode_name(OverviewMode(i)), i == mode))
        mode = i;
    }
    ImGui::EndCombo();
  }
  st.ov_mode = OverviewMode(mode);
  st.settings.overview_mode = mode;
}

// The colour scale a statistic's cells share: signed statistics around 0, masses from 0, entropies and logits over the
// range the heads span (at 32K tokens every entropy is near ln n: the differences between heads must show).
ColorScale stat_scale(const Overview& r, OverviewMode shown) {
  ColorScale sc;
  float lo = INFINITY, hi = -INFINITY;
  for (const auto& l : r.layers)
    for (const auto& h : l.heads) {
      const float v = stat_of(h, shown);
      if (std::isfinite(v))
        lo = std::min(lo, v), hi = std::max(hi, v);
    }
  if (!(hi >= lo))
    lo = 0, hi = 1;
  sc.diverging = shown == OverviewMode::FirstDiff;
  if (sc.diverging) {
    sc.hi = std::max(std::max(std::fabs(lo), std::fabs(hi)), 1e-12f);
    sc.lo = -sc.hi;
  } else {
    const bool spread = shown == OverviewMode::EntropyA1 || shown == OverviewMode::EntropyA2 ||
                        shown == OverviewMode::EntropyDiff || shown == OverviewMode::MaxLogit1 ||
                        shown == OverviewMode::MaxLogit2;
    sc.lo = spread ? lo : std::min(lo, 0.0f);
    sc.hi = std::max(hi, sc.lo + 1e-6f * std::max(1.0f, std::fabs(sc.lo)));
  }
  return sc;
}

// The whole text of a band when the mouse is over it (the band may be too narrow to show it).
void item_tooltip_rect(ImVec2 p0, ImVec2 p1, const char* text) {
  if (ImGui::IsWindowHovered() && ImGui::IsMouseHoveringRect(p0, p1))
    ImGui::SetTooltip("%s", text);
}

// A layer without attention (hybrids): one band naming its kind; a Mamba layer's band opens its implicit attention.
void layer_band(AppState& st, const ModelConfig& cfg, int l, ImVec2 p0, ImVec2 p1, float cell) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  dl->AddRectFilled(p0, p1, theme_colors().masked);
  const std::string what =
      cfg.layer_label(l) + (cfg.has_scan(l) ? ": implicit attention per channel (click)" : ": no attention maps");
  if (cell >= lh + 2) {  // clipped to the band: the colour bar beside the grid must stay readable
    dl->PushClipRect(p0, p1, true);
    dl->AddText(ImVec2(p0.x + 6, (p0.y + p1.y - lh) * 0.5f), ImGui::GetColorU32(ImGuiCol_TextDisabled), what.c_str());
    dl->PopClipRect();
  }
  item_tooltip_rect(p0, p1, what.c_str());
  if (cfg.has_scan(l)) {
    ImGui::SetCursorScreenPos(p0);
    ImGui::PushID(l);
    if (ImGui::InvisibleButton("scan", ImVec2(std::max(p1.x - p0.x, 1.0f), std::max(p1.y - p0.y, 1.0f))))
      st.select_head(l, st.snap->head && st.snap->head->implicit ? st.head : 0);
    ImGui::PopID();
  }
}

// A head's statistics, under the mouse.
void head_tooltip(const AppState& st, const ModelConfig& cfg, const LayerSummary& ls, int l, int h) {
  const HeadStats& hs = ls.heads[h];
  ImGui::BeginTooltip();
  ImGui::Text("layer %d, head %d   (%s = %.3f)", l, h, st.lam(), ls.lambda);
  if (cfg.spec().schedule != Schedule::Uniform)
    ImGui::TextDisabled("%s", cfg.layer_label(l).c_str());
  ImGui::Separator();
  if (cfg.is_diff()) {
    ImGui::Text("entropy A1 %.3f   A2 %.3f   |A1 - %s*A2| %.3f", hs.entropy1, hs.entropy2, st.lam(), hs.entropy_diff);
    ImGui::Text("first-token mass A1 %.3f   A2 %.3f   diff %+.3f", hs.first1, hs.first2, hs.first_diff);
    ImGui::Text("negative mass %.4f   diff range [%.3f, %.3f]", hs.neg_mass, hs.diff_min, hs.diff_max);
    ImGui::Text("max |logit| map 1 %.2f   map 2 %.2f", hs.max_logit1, hs.max_logit2);
  } else {
    ImGui::Text("entropy %.3f   first-token mass %.3f   range [%.3f, %.3f]", hs.entropy1, hs.first1, hs.diff_min,
                hs.diff_max);
    ImGui::Text("max |logit| %.2f", hs.max_logit1);
  }
  ImGui::TextDisabled("click to open in the head view");
  ImGui::EndTooltip();
}

// What the grid's cells show, and how.
struct CellStyle {
  OverviewMode shown;
  bool maps;  // thumbnails (else a statistic's colour and value)
  ColorScale sc;
  Colormap cm;
};

// One head's cell: its thumbnail, or its statistic's colour with the value where the cell is large enough; the
// selection, the hover outline and tooltip, a click opens it.
void head_cell(AppState& st, const ModelConfig& cfg, const LayerSummary& ls, const CellStyle& cs, int l, int h,
               ImVec2 p0, ImVec2 p1, float cell, float gap) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ThemeColors& tc = theme_colors();
  const float lh = ImGui::GetTextLineHeight();
  if (cs.maps && st.ov_tex.atlas.valid() && h < int(ls.thumbs.size())) {
    const float T = float(st.ov_tex.tile), W = float(st.ov_tex.atlas.width()), Hh = float(st.ov_tex.atlas.height());
    const float ts = float(ls.thumbs[h].size);
    dl->AddImage(st.ov_tex.atlas.im_id(), p0, p1, ImVec2(h * T / W, l * T / Hh),
                 ImVec2((h * T + ts) / W, (l * T + ts) / Hh));
  } else if (cs.maps) {
    dl->AddRectFilled(p0, p1, tc.masked);
  } else {
    const float v = stat_of(ls.heads[h], cs.shown);
    dl->AddRectFilled(p0, p1, std::isfinite(v) ? colormap_rgba(cs.cm, cs.sc.to_t(v)) : tc.masked);
    if (cell >= 44 && std::isfinite(v)) {
      const std::string t = fmt_value(v);
      const float tw = ImGui::CalcTextSize(t.c_str()).x;
      const float lum = cs.sc.to_t(v);
      const ImU32 tcol = (cs.cm == Colormap::CoolWarm ? std::fabs(lum - 0.5f) < 0.3f : lum > 0.55f)
                             ? IM_COL32(0, 0, 0, 255)
                             : IM_COL32(255, 255, 255, 255);
      dl->AddText(ImVec2((p0.x + p1.x - tw) * 0.5f, (p0.y + p1.y - lh) * 0.5f), tcol, t.c_str());
    }
  }
  if (l == st.layer && h == st.head)
    dl->AddRect(ImVec2(p0.x - gap, p0.y - gap), ImVec2(p1.x + gap, p1.y + gap), tc.selection, 0, 0, 2.5f);
  ImGui::SetCursorScreenPos(p0);
  ImGui::PushID(l * 4096 + h);
  if (ImGui::InvisibleButton("cell", ImVec2(std::max(p1.x - p0.x, 1.0f), std::max(p1.y - p0.y, 1.0f))))
    st.select_head(l, h);
  ImGui::PopID();
  if (ImGui::IsItemHovered()) {
    dl->AddRect(p0, p1, tc.cursor);
    head_tooltip(st, cfg, ls, l, h);
  }
}

// The importance mode: log p(next token) change when each head is ablated (engine/session/session_importance.h),
// measured on request (one re-run per head from its layer); a click opens the head, a shift-click toggles its
// ablation (the model then re-runs with it).
void draw_importance(AppState& st, const ModelConfig& cfg, const Snapshot& s) {
  const int heads_total = int(cfg.map_layers().size() * size_t(cfg.view_heads()));
  const Snapshot::Importance* imp = s.importance.get();
  const std::vector<std::string> modes = importance_modes(cfg);  // head, and a2 / a1 for differential heads
  std::vector<std::string> all = modes;
  all.push_back("mean");
  if (std::find(all.begin(), all.end(), st.req.importance_mode) == all.end()) st.req.importance_mode = "head";
  ImGui::SetNextItemWidth(ImGui::CalcTextSize("head (zeroed)").x + ImGui::GetFrameHeight() + 12);
  if (ImGui::BeginCombo("##impmode", st.req.importance_mode.c_str())) {
    for (const std::string& m : all)
      if (ImGui::Selectable(m.c_str(), m == st.req.importance_mode) && m != st.req.importance_mode) {
        st.req.importance_mode = m;
        if (imp) {  // a map on screen follows the menu: measured again in the new mode
          ++st.req.importance_seq;
          st.submit_now();
        }
      }
    ImGui::EndCombo();
  }
  item_tooltip("How each head is ablated: head (its output zeroed before o_proj), a2 (A2 dropped: lambda 0), a1 (A1\n"
               "dropped), mean (its output replaced by its mean over positions). diffscope-run --importance-modes.");
  ImGui::SameLine();
  if (ImGui::SmallButton(imp ? "recompute" : "compute")) {
    ++st.req.importance_seq;
    st.submit_now();
  }
  item_tooltip("Ablate each head in turn in the chosen mode, re-running from its layer: %d re-runs.", heads_total);
  if (!imp) {
    empty_state(s.result ? "How much each head carries the prediction: press compute (one re-run per head)."
                         : "Run a prompt (Ctrl+Enter), then compute which heads the prediction depends on.");
    return;
  }
  const HeadImportance& h = imp->h;
  const bool stale = !s.result || imp->result_seq != s.result->seq;
  const std::string mode = h.modes.empty() ? "" : h.modes[0];
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("change of log p(%s) (%.3f) when a head is ablated (%s); %lld of %lld heads%s%s",
                     token_label(h.target_text).c_str(), h.base_logp, mode.c_str(), (long long)h.done,
                     (long long)h.total, h.end == HeadImportance::End::Complete ? "" : " (incomplete)",
                     stale ? "; stale: the run changed since" : "");
  ImGui::PopStyleColor();
  if (h.delta.empty())
    return;
  const auto& d = h.delta[0];
  float mx = 1e-6f;
  for (const auto& row : d)
    for (double v : row)
      if (std::isfinite(v))
        mx = std::max(mx, float(std::fabs(v)));
  ColorScale sc;
  sc.diverging = true;
  sc.lo = -mx, sc.hi = mx;
  const float lh = ImGui::GetTextLineHeight();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const int L = int(h.layers.size()), H = h.heads;
  const float left = ImGui::CalcTextSize("L00").x + 8, top = lh + 4, cbw = colorbar_width() + 10;
  const float cell = std::floor(std::clamp(std::min((avail.x - left - cbw) / H, (avail.y - top - 4) / L), 14.0f, 110.0f));
  ImGui::BeginChild("##importance", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 o = ImGui::GetCursorScreenPos();
  const ThemeColors& tc = theme_colors();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  char buf[32];
  for (int j = 0; j < H; ++j) {
    std::snprintf(buf, sizeof buf, cell >= 26 ? "H%d" : "%d", j);
    dl->AddText(ImVec2(o.x + left + j * cell + (cell - ImGui::CalcTextSize(buf).x) * 0.5f, o.y),
                j == st.head ? tc.selection : text, buf);
  }
  for (int li = 0; li < L; ++li) {
    const int l = h.layers[size_t(li)];
    std::snprintf(buf, sizeof buf, "L%d", l);
    dl->AddText(ImVec2(o.x, o.y + top + li * cell + (cell - lh) * 0.5f), l == st.layer ? tc.selection : text, buf);
    for (int j = 0; j < H; ++j) {
      const ImVec2 p0(o.x + left + j * cell + 1, o.y + top + li * cell + 1), p1(p0.x + cell - 2, p0.y + cell - 2);
      const double v = d[size_t(li)][size_t(j)];
      dl->AddRectFilled(p0, p1, std::isfinite(v) ? colormap_rgba(Colormap::CoolWarm, sc.to_t(float(v))) : tc.masked);
      // the value, as short as the cell needs (blank only where not even one digit fits)
      char t[16] = "";
      for (const char* f : {"%+.2g", "%.2g", "%.1g"}) {
        std::snprintf(t, sizeof t, f, v);
        if (ImGui::CalcTextSize(t).x <= cell - 6) break;
        t[0] = 0;
      }
      if (std::isfinite(v) && t[0]) {
        dl->AddText(ImVec2((p0.x + p1.x - ImGui::CalcTextSize(t).x) * 0.5f, (p0.y + p1.y - lh) * 0.5f),
                    IM_COL32(0, 0, 0, 255), t);
      }
      // an ablation in force in the mode shown: crossed out
      const bool in_force = mode == "a2"   ? st.map_dropped(l, j, 2)
                            : mode == "a1" ? st.map_dropped(l, j, 1)
                            : mode == "mean" ? st.mean_ablated(l, j)
                                             : st.ablated(l, j);
      if (in_force) {
        dl->AddLine(p0, p1, tc.cursor, 2.0f);
        dl->AddLine(ImVec2(p0.x, p1.y), ImVec2(p1.x, p0.y), tc.cursor, 2.0f);
      }
      if (l == st.layer && j == st.head)
        dl->AddRect(ImVec2(p0.x - 1, p0.y - 1), ImVec2(p1.x + 1, p1.y + 1), tc.selection, 0, 0, 2.5f);
      ImGui::SetCursorScreenPos(p0);
      ImGui::PushID(li * 4096 + j);
      if (ImGui::InvisibleButton("imp", ImVec2(std::max(p1.x - p0.x, 1.0f), std::max(p1.y - p0.y, 1.0f)))) {
        if (ImGui::GetIO().KeyShift) {  // the ablation of the mode shown
          if (mode == "a2") st.toggle_map(l, j, 2);
          else if (mode == "a1") st.toggle_map(l, j, 1);
          else if (mode == "mean") st.toggle_mean(l, j);
          else st.toggle_ablation(l, j);
        } else
          st.select_head(l, j);
      }
      ImGui::PopID();
      if (ImGui::IsItemHovered()) {
        dl->AddRect(p0, p1, tc.cursor);
        ImGui::SetTooltip("layer %d, head %d: log p(%s) changes by %+.4g when ablated (%s)\nclick: open the head; "
                          "shift-click: %s it",
                          l, j, token_label(h.target_text).c_str(), v, mode.c_str(), in_force ? "restore" : "ablate");
      }
    }
  }
  draw_colorbar(dl, ImVec2(o.x + left + H * cell + 10, o.y + top), ImVec2(o.x + left + H * cell + 24, o.y + top + L * cell),
                Colormap::CoolWarm, sc, text);
  ImGui::SetCursorScreenPos(ImVec2(o.x, o.y + top + L * cell + 2));
  ImGui::Dummy(ImVec2(left + H * cell + cbw, 1));
  ImGui::EndChild();
}

}  // namespace

void draw_overview_panel(AppState& st) {
  if (!begin_panel(st, "Overview", &st.show_overview, Slot::Overview))
    return end_panel();
  const Snapshot& s = *st.snap;
  if (!s.model) {
    empty_state("Open a model to see every layer and head at a glance.");
    return end_panel();
  }
  const ModelConfig& cfg = s.model->cfg;
  mode_combo(st, cfg);
  ImGui::SameLine();
  if (st.ov_mode == OverviewMode::Importance) {
    draw_importance(st, cfg, s);
    return end_panel();
  }
  ImGui::TextDisabled("click a head to open it");

  const auto no_stats = [](const LayerSummary& l) { return l.heads.empty(); };
  if (!s.result || !s.overview || std::all_of(s.overview->layers.begin(), s.overview->layers.end(), no_stats)) {
    empty_state(s.running || (s.result && !s.overview) ? "Computing..." : "Run a prompt (Ctrl+Enter) to fill this grid.");
    return end_panel();
  }
  const Overview& r = *s.overview;
  const int L = int(r.layers.size()), H = int(cfg.view_heads());
  // A map mode without thumbnails (a long prompt) shows the entropy statistic of the same map instead of an empty grid.
  const auto has_thumbs = [](const LayerSummary& l) { return !l.thumbs.empty(); };
  const bool thumbs = std::any_of(r.layers.begin(), r.layers.end(), has_thumbs);
  CellStyle cs;
  cs.shown = st.ov_mode;
  if (overview_mode_is_map(cs.shown) && !thumbs)
    cs.shown = cs.shown == OverviewMode::A2 ? OverviewMode::EntropyA2
               : cs.shown == OverviewMode::Diff && cfg.is_diff() ? OverviewMode::EntropyDiff : OverviewMode::EntropyA1;
  cs.maps = overview_mode_is_map(cs.shown);
  if (cs.maps)
    rebuild_atlas(st, r, H);
  else
    cs.sc = stat_scale(r, cs.shown);
  cs.cm = (cs.shown == OverviewMode::Diff || cs.shown == OverviewMode::FirstDiff) ? Colormap::CoolWarm
                                                                                  : Colormap(st.settings.seq_cmap);

  const float lh = ImGui::GetTextLineHeight();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float left = ImGui::CalcTextSize("L00").x + 8, top = lh + 4;
  const float cbw = cs.maps ? 0.0f : colorbar_width() + 10;
  std::string note = r.note;
  if (!r.complete)
    note = "computing..." + (note.empty() ? "" : "   " + note);
  const float note_h = note.empty() ? 0.0f : lh + 4;
  const float cell =
      std::floor(std::clamp(std::min((avail.x - left - cbw) / H, (avail.y - top - note_h - 4) / L), 14.0f, 110.0f));
  ImGui::BeginChild("##grid", ImVec2(0, avail.y - note_h), false, ImGuiWindowFlags_HorizontalScrollbar);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 o = ImGui::GetCursorScreenPos();
  const ThemeColors& tc = theme_colors();
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const float gap = cell >= 30 ? 2.0f : 1.0f;
  char buf[32];
  for (int h = 0; h < H; ++h) {
    std::snprintf(buf, sizeof buf, cell >= 26 ? "H%d" : "%d", h);
    const float w = ImGui::CalcTextSize(buf).x;
    dl->AddText(ImVec2(o.x + left + h * cell + (cell - w) * 0.5f, o.y), h == st.head ? tc.selection : text, buf);
  }
  for (int l = 0; l < L; ++l) {
    std::snprintf(buf, sizeof buf, "L%d", l);
    dl->AddText(ImVec2(o.x, o.y + top + l * cell + (cell - lh) * 0.5f), l == st.layer ? tc.selection : text, buf);
    const LayerSummary& ls = r.layers[l];
    if (!cfg.has_maps(l)) {
      layer_band(st, cfg, l, ImVec2(o.x + left + gap, o.y + top + l * cell + gap),
                 ImVec2(o.x + left + H * cell - gap, o.y + top + (l + 1) * cell - gap), cell);
      continue;
    }
    for (int h = 0; h < H; ++h) {
      const ImVec2 p0(o.x + left + h * cell + gap, o.y + top + l * cell + gap);
      const ImVec2 p1(p0.x + cell - 2 * gap, p0.y + cell - 2 * gap);
      if (ls.heads.empty())
        dl->AddRectFilled(p0, p1, tc.masked);
      else
        head_cell(st, cfg, ls, cs, l, h, p0, p1, cell, gap);
    }
  }
  if (!cs.maps)
    draw_colorbar(dl, ImVec2(o.x + left + H * cell + 10, o.y + top),
                  ImVec2(o.x + left + H * cell + 24, o.y + top + L * cell), cs.cm, cs.sc, text);
  ImGui::SetCursorScreenPos(ImVec2(o.x, o.y + top + L * cell + 2));
  ImGui::Dummy(ImVec2(left + H * cell + cbw, 1));
  ImGui::EndChild();
  if (!note.empty())
    ImGui::TextDisabled("%s", note.c_str());
  end_panel();
}

}  // namespace ds::gui
