// Head view: A1, A2 and A1 - lambda*A2 of one head side by side, keys on x and queries on y, with linked zoom,
// pan and hover cursor, token labels (or positions, when tokens are too narrow for text) on both axes, the causal
// upper triangle hatched, colour bars and optional log scale. The maps are the engine's pooled view of the visible
// rectangle (Backend::map_view) at the panel's pixel resolution: zoom and pan ask the worker for the new rectangle,
// and the last image stays on screen, moved with the view, until it arrives. Textures are rebuilt only when the
// view's data or the display options change.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "panels.h"
#include "plot_draw.h"
#include "theme.h"

namespace ds::gui {

namespace {

constexpr int k_max_grid = 1024;  // cells per side of the head view's grid (the engine pools beyond)

// Token labels of the current result, made on demand (a long prompt has too many to lay out every frame).
struct LabelCache {
  uint64_t seq = 0;
  std::shared_ptr<const RunResult> result;
  float max_w = 0;  // widest label of the first 4096 tokens
};
LabelCache g_labels;

void update_labels(const std::shared_ptr<const RunResult>& r) {
  if (g_labels.result == r)
    return;
  g_labels.result = r;
  g_labels.max_w = 0;
  const size_t count = std::min<size_t>(r->tokens.size(), 4096);
  for (size_t i = 0; i < count; ++i)
    g_labels.max_w = std::max(g_labels.max_w, ImGui::CalcTextSize(token_label(r->tokens[i], 12).c_str()).x);
}

std::string label_at(int64_t i) {
  const auto& r = g_labels.result;
  return r && i >= 0 && i < int64_t(r->tokens.size()) ? token_label(r->tokens[size_t(i)], 12) : std::string("?");
}

uint64_t style_key(const AppState& st) {
  return uint64_t(st.settings.seq_cmap) | uint64_t(st.settings.log_scale) << 4 | uint64_t(st.settings.link_scales) << 6 |
         uint64_t(theme_is_dark()) << 7 | uint64_t(st.settings.robust_range) << 8;
}

bool same_scale(const ColorScale& a, const ColorScale& b) {
  return a.lo == b.lo && a.hi == b.hi && a.log == b.log && a.diverging == b.diverging;
}

bool same_geom(const MapView& a, const MapView& b) {
  return a.q0 == b.q0 && a.q1 == b.q1 && a.k0 == b.k0 && a.k1 == b.k1 && a.rows == b.rows && a.cols == b.cols;
}

// Build the three textures, skipping any whose data and scale did not change (moving this layer's lambda changes
// only the difference map).
void rebuild_textures(AppState& st) {
  HeadTextures& T = st.head_tex;
  const auto& src = st.snap->head;
  const uint64_t key = style_key(st);
  if (T.source == src && T.style_key == key)
    return;
  const HeadMaps& hm = *src;
  const MapView& v = hm.view;
  const GridGeom g = GridGeom::of(v, hm.window);
  const bool same_style = T.source && T.style_key == key && same_geom(T.source->view, v);
  HeatmapStyle seq;
  seq.cmap = Colormap(st.settings.seq_cmap);
  seq.log = st.settings.log_scale;
  seq.robust = st.settings.robust_range;
  seq.masked_rgba = 0;  // transparent: the panel draws a hatch behind the causal upper triangle (and the window)
  HeatmapStyle div = seq;
  div.cmap = Colormap::CoolWarm;
  div.diverging = true;

  const std::vector<float>* data[3] = {&v.a1, &v.a2, &v.diff};
  const std::vector<float>* prev[3] = {nullptr, nullptr, nullptr};
  if (same_style)
    prev[0] = &T.source->view.a1, prev[1] = &T.source->view.a2, prev[2] = &T.source->view.diff;
  ColorScale sc[3];
  sc[0] = heatmap_scale(v.a1.data(), g, hm.implicit ? div : seq);  // a Mamba channel's M is signed
  if (hm.differential) {
    sc[1] = heatmap_scale(v.a2.data(), g, seq);
    if (st.settings.link_scales)
      sc[0].hi = sc[1].hi = std::max(sc[0].hi, sc[1].hi);
    sc[2] = heatmap_scale(v.diff.data(), g, div);
  }
  const int maps = hm.differential ? 3 : 1;
  for (int i = 0; i < 3; ++i) {
    if (i >= maps) {
      T.tex[i].reset();
      continue;
    }
    if (prev[i] && *prev[i] == *data[i] && same_scale(T.meta[i].scale, sc[i]) && T.tex[i].valid())
      continue;
    HeatmapImage img;
    build_heatmap(data[i]->data(), g, i == 2 || hm.implicit ? div : seq, sc[i], img);
    T.tex[i].upload(img.rgba.data(), img.w, img.h, /*mipmaps=*/true);
    img.rgba = {};
    T.meta[i] = std::move(img);
  }
  T.source = src;
  T.style_key = key;
}

// The visible part of the map: a square of `span` tokens per side drawn in S pixels, clamped to the map (queries
// [0, n), keys [kf, n); kf = 1 hides the first key column).
struct Frame {
  int64_t n = 0, kf = 0;
  double span = 1, ppt = 1;  // tokens per side, pixels per token
  double qlo = 0, klo = 0;   // first visible query / key (fractional)
  double vq = 1, vk = 1;     // visible queries / keys (<= span)
};

Frame make_frame(HeadView& v, int64_t n, int64_t kf, float S) {
  Frame f;
  f.n = n;
  f.kf = std::min(kf, n - 1);
  const double full = double(n), min_span = std::min(4.0, full);  // at least 4 tokens stay visible
  f.span = v.span <= 0 ? full : std::clamp(v.span, min_span, full);
  v.span = f.span >= full ? 0 : f.span;
  f.vq = std::min(f.span, full);
  f.vk = std::min(f.span, double(n - f.kf));
  f.ppt = S / f.span;
  const double cq = v.cq < 0 ? full / 2 : v.cq, ck = v.ck < 0 ? (double(f.kf) + full) / 2 : v.ck;
  f.qlo = std::clamp(cq - f.vq / 2, 0.0, full - f.vq);
  f.klo = std::clamp(ck - f.vk / 2, double(f.kf), full - f.vk);
  if (v.span > 0)
    v.cq = f.qlo + f.vq / 2, v.ck = f.klo + f.vk / 2;
  return f;
}

// The engine request for a frame: the integer rectangle around the visible part, at most one cell per pixel.
ViewRequest frame_request(const Frame& f, float S_px, bool mean) {
  ViewRequest r;
  r.q0 = int64_t(std::floor(f.qlo));
  r.q1 = std::min(f.n, int64_t(std::ceil(f.qlo + f.vq - 1e-9)));
  r.k0 = int64_t(std::floor(f.klo));
  r.k1 = std::min(f.n, int64_t(std::ceil(f.klo + f.vk - 1e-9)));
  const int grid = std::clamp(int(S_px), 16, k_max_grid);
  r.rows = int(std::min<int64_t>(r.q1 - r.q0, grid));
  r.cols = int(std::min<int64_t>(r.k1 - r.k0, grid));
  r.pool = mean ? Pool::Mean : Pool::Max;
  return r;
}

bool same_request(const ViewRequest& a, const ViewRequest& b) {
  return a.q0 == b.q0 && a.q1 == b.q1 && a.k0 == b.k0 && a.k1 == b.k1 && a.rows == b.rows && a.cols == b.cols &&
         a.pool == b.pool;
}

// The smallest 1, 2 or 5 x 10^k at or above x: tick spacing in tokens.
int64_t nice_step(double x) {
  double p = 1;
  while (p * 10 <= x)
    p *= 10;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= x)
      return int64_t(m * p);
  return int64_t(10 * p);
}

void toolbar(AppState& st, const ModelInfo& m) {
  int layer = st.layer, head = st.head;
  const bool implicit = m.cfg.has_scan(st.layer);  // a Mamba layer: one signed map, always on the diverging colours
  ImGui::SetNextItemWidth(110);
  ImGui::SliderInt("layer", &layer, 0, int(m.cfg.layers) - 1);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(110);
  if (implicit) {  // one of its scan's channels
    ImGui::SliderInt("channel", &head, 0, int(m.cfg.d_inner) - 1);
    item_tooltip("Channel of the layer's selective scan (Ctrl+click to type one)");
  } else {
    ImGui::SliderInt("head", &head, 0, int(m.cfg.view_heads()) - 1);
  }
  if (layer != st.layer || head != st.head) {
    const HeadView keep = st.view;  // a new head keeps the zoomed rectangle, so heads compare like for like
    st.select_head(layer, head);
    st.view = keep;
  }
  if (m.cfg.has_maps(st.layer)) {
    same_line_if_fits(checkbox_w("ablate"));
    bool ablate = st.ablated(st.layer, st.head);
    if (ImGui::Checkbox("ablate", &ablate))
      st.toggle_ablation(st.layer, st.head);
    item_tooltip(
                 "Zero this head's output (after its sub-layer norm, before o_proj) from now on: the model re-runs\n"
                 "from this layer, and predictions, later layers' maps and generation show the effect. The Lambda\n"
                 "panel lists the heads ablated; untick to restore.");
    same_line_if_fits(checkbox_w("mean"));
    bool mean = st.mean_ablated(st.layer, st.head);
    if (ImGui::Checkbox("mean", &mean))
      st.toggle_mean(st.layer, st.head);
    item_tooltip("Replace this head's output by its mean over the prompt's positions (mean ablation)");
    if (m.cfg.is_diff()) {
      for (int map = 1; map <= 2; ++map) {
        same_line_if_fits(checkbox_w("-A1"));
        bool drop = st.map_dropped(st.layer, st.head, map);
        if (ImGui::Checkbox(map == 1 ? "-A1" : "-A2", &drop))
          st.toggle_map(st.layer, st.head, map);
        item_tooltip(map == 1 ? "Drop A1: the head keeps -lambda A2 V, then its norm as usual (a re-run from this layer)"
                              : "Drop A2: lambda 0 for this head alone (a re-run from this layer)");
      }
    }
  }
  if (!implicit) {
    same_line_if_fits(90);
    ImGui::SetNextItemWidth(90);
    const char* cmaps[] = {"viridis", "magma"};
    ImGui::Combo("##cmap", &st.settings.seq_cmap, cmaps, 2);
    item_tooltip("Colour map of A1 and A2 (the difference uses a diverging map)");
  }
  same_line_if_fits(70);
  ImGui::SetNextItemWidth(70);
  int pool = st.settings.mean_pool ? 1 : 0;
  const char* pools[] = {"max", "mean"};
  if (ImGui::Combo("##pool", &pool, pools, 2))
    st.settings.mean_pool = pool == 1;
  item_tooltip(
               "When the visible map has more tokens than the panel has pixels, each cell pools a block of tokens:\n"
               "max shows the block's largest value (its largest magnitude for the difference), so a single strong\n"
               "key stays visible; mean shows the block's average (masked cells count as 0).");
  same_line_if_fits(checkbox_w("log"));
  ImGui::Checkbox("log", &st.settings.log_scale);
  item_tooltip("Log colour scale (Ctrl+L); symmetric log for the difference");
  same_line_if_fits(checkbox_w("hide first token"));
  ImGui::Checkbox("hide first token", &st.settings.hide_first);
  item_tooltip("Hide key 0, the attention sink, so the rest of the map gets the colour range (Ctrl+H)");
  if (m.cfg.is_diff() && !implicit) {
    same_line_if_fits(checkbox_w("link A1/A2 scale"));
    ImGui::Checkbox("link A1/A2 scale", &st.settings.link_scales);
  }
  same_line_if_fits(checkbox_w("robust range"));
  ImGui::Checkbox("robust range", &st.settings.robust_range);
  item_tooltip(
               "Colour range up to the 99.5th percentile of the visible cells (brighter cells clamp, marked on the\n"
               "colour bar); off: up to the largest cell. The cell of query 0 never sets the range (it is always 1).");
  same_line_if_fits(button_w("reset view"));
  if (ImGui::SmallButton("reset view"))
    st.view = HeadView{};
}

const char* pool_name(Pool p) {
  return p == Pool::Mean ? "mean" : "max";
}

void token_line(const char* what, const char* plural, int64_t a, int64_t b) {
  if (b - a == 1)
    ImGui::Text("%s %lld  \"%s\"", what, (long long)a, label_at(a).c_str());
  else
    ImGui::Text("%s %lld..%lld (%lld tokens)", plural, (long long)a, (long long)(b - 1), (long long)(b - a));
}

void hover_tooltip(const AppState& st, const HeadMaps& hm, int64_t q, int64_t k) {
  ImGui::BeginTooltip();
  if (!hm.contains(q, k)) {
    ImGui::Text("query %lld  \"%s\"", (long long)q, label_at(q).c_str());
    ImGui::Text("key   %lld  \"%s\"", (long long)k, label_at(k).c_str());
    ImGui::TextDisabled("computing this part of the map...");
    ImGui::EndTooltip();
    return;
  }
  const MapView& v = hm.view;
  const int i = hm.row_of(q), j = hm.col_of(k);
  const int64_t r0 = hm.row_start(i), r1 = hm.row_start(i + 1), c0 = hm.col_start(j), c1 = hm.col_start(j + 1);
  const bool single = r1 - r0 == 1 && c1 - c0 == 1;
  token_line("query", "queries", r0, r1);
  token_line("key  ", "keys   ", c0, c1);
  if (c0 > r1 - 1) {
    ImGui::TextDisabled("masked: a token never attends to later tokens");
    ImGui::EndTooltip();
    return;
  }
  if (hm.window > 0 && c1 - 1 < r0 - hm.window + 1) {
    ImGui::TextDisabled("masked: outside the sliding window (a query sees its last %lld tokens)", (long long)hm.window);
    ImGui::EndTooltip();
    return;
  }
  ImGui::Separator();
  const size_t at = size_t(i) * size_t(v.cols) + size_t(j);
  const char* agg = single ? "" : (v.pool == Pool::Mean ? "mean " : "max |.| ");
  if (hm.implicit) {
    ImGui::Text("%sM = %+.5g", agg, v.a1[at]);
    ImGui::TextDisabled("y[q] = sum over k of M[q, k] u[k] + D u[q] for this channel's input u");
  } else if (hm.differential) {
    ImGui::Text("%sA1 = %.5f", agg, v.a1[at]);
    ImGui::Text("%sA2 = %.5f", agg, v.a2[at]);
    ImGui::Text("%sA1 - %s*A2 = %+.5f   (%s = %.3f)", agg, st.lam(), v.diff[at], st.lam(), hm.lambda);
  } else {
    ImGui::Text("%sA = %.5f", agg, v.a1[at]);
  }
  if (!single) {
    ImGui::Separator();
    ImGui::TextDisabled("one cell pools %lld x %lld tokens (%s); zoom in for single tokens", (long long)(r1 - r0),
                        (long long)(c1 - c0), pool_name(v.pool));
    ImGui::TextDisabled("under the mouse: query %lld \"%s\", key %lld \"%s\"", (long long)q, label_at(q).c_str(),
                        (long long)k, label_at(k).c_str());
  }
  ImGui::EndTooltip();
}

}  // namespace

namespace {

// Where the maps sit this frame: the label band, the side of each map, and what the axes are labelled with.
struct MapsLayout {
  ImVec2 origin;
  float label_w = 0, S = 0, cbw = 0, gap = 14, title_h = 0, lh = 0;
  int maps = 1;
  int64_t n = 0, gen_from = 0, step = 1;
  bool token_labels = false;
  ImVec2 p0(int i) const { return ImVec2(origin.x + label_w + i * (S + cbw + gap), origin.y + title_h); }
};
float sx(const Frame& f, const ImVec2& p0, double k) { return p0.x + float((k - f.klo) * f.ppt); }
float sy(const Frame& f, const ImVec2& p0, double q) { return p0.y + float((q - f.qlo) * f.ppt); }
ImVec2 img_end(const Frame& f, const ImVec2& p0) { return ImVec2(p0.x + float(f.vk * f.ppt), p0.y + float(f.vq * f.ppt)); }

// The panel's title: the layer and head, and on hybrids what kind of layer it is.
void head_title(const Snapshot& s, char* title, size_t size) {
  const auto& hp = s.head;
  const ModelConfig* mc = s.model ? &s.model->cfg : nullptr;
  if (hp && mc && hp->implicit)  // a Mamba layer: one channel of its scan
    std::snprintf(title, size, "Head  L%d channel %d  %s, implicit attention###Head", hp->layer, hp->head,
                  mc->layer_label(hp->layer).c_str());
  else if (hp && mc && mc->spec().schedule != Schedule::Uniform)  // hybrids: say what kind of attention the layer has
    std::snprintf(title, size, "Head  L%d.H%d  %s###Head", hp->layer, hp->head, mc->layer_label(hp->layer).c_str());
  else if (hp)
    std::snprintf(title, size, "Head  L%d.H%d###Head", hp->layer, hp->head);
  else
    std::snprintf(title, size, "Head###Head");
}

// The three maps' titles (A1 or the implicit map, A2 with its noise group, the difference with lambda).
struct MapTitles {
  char diff[96], a2[96] = "A2", m[96];
  const char* of[3];
};
void map_titles(const AppState& st, const HeadMaps& hm, MapTitles& t) {
  const std::string lam = st.lam();
  std::snprintf(t.diff, sizeof t.diff, "A1 - %s*A2   (%s = %.3f)", lam.c_str(), lam.c_str(), hm.lambda);
  // Grouped differential attention: the noise map A2 is shared by the group's signal heads; say which.
  const int64_t gr = st.snap->model ? st.snap->model->cfg.noise_group : 1;
  if (gr > 1) {
    const int64_t g = hm.head / gr;
    std::snprintf(t.a2, sizeof t.a2, "A2: noise head of group %lld, shared by heads %lld-%lld", (long long)g,
                  (long long)(g * gr), (long long)(g * gr + gr - 1));
  }
  std::snprintf(t.m, sizeof t.m, "M: implicit attention of channel %d (signed, unnormalised)", hm.head);
  t.of[0] = hm.implicit ? t.m : hm.differential ? "A1" : "A (softmax)";
  t.of[1] = t.a2;
  t.of[2] = t.diff;
}

// Map i: its image over the hatched background, the window edge, the generated and answer marks, its colour bar.
void draw_map_image(AppState& st, const HeadMaps& hm, const MapsLayout& L, const Frame& f, int i, const char* title) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ThemeColors& tc = theme_colors();
  const HeadTextures& T = st.head_tex;
  const MapView& mv = hm.view;
  const int64_t n = L.n;
  const ImVec2 p0 = L.p0(i), img1 = img_end(f, p0);
  dl->AddText(ImVec2(p0.x, L.origin.y), ImGui::GetColorU32(ImGuiCol_Text), title);
  // Hatch behind the image: masked cells are transparent, and so is what a new view has not filled in yet.
  dl->PushClipRect(p0, img1, true);
  for (float t = -(img1.y - p0.y); t < img1.x - p0.x; t += 7.0f)
    dl->AddLine(ImVec2(p0.x + t, img1.y), ImVec2(p0.x + t + (img1.y - p0.y), p0.y), tc.masked, 1.0f);
  if (T.tex[i].valid())
    dl->AddImage(T.tex[i].im_id(), ImVec2(sx(f, p0, double(mv.k0)), sy(f, p0, double(mv.q0))),
                 ImVec2(sx(f, p0, double(mv.k1)), sy(f, p0, double(mv.q1))));
  if (hm.window > 0 && hm.window < n) {  // the sliding window's far edge: row q sees keys q - w + 1 .. q
    const double w = double(hm.window);
    dl->AddLine(ImVec2(sx(f, p0, 0.0), sy(f, p0, w - 1)), ImVec2(sx(f, p0, double(n) - w + 1), sy(f, p0, double(n))),
                tc.grid, 1.5f);
  }
  dl->PopClipRect();
  dl->AddRect(ImVec2(p0.x - 1, p0.y - 1), ImVec2(img1.x + 1, img1.y + 1), tc.grid);
  // Generated positions: a bar along the key axis under the map and along the query axis left of it.
  if (L.gen_from < n) {
    const float kx0 = std::max(p0.x, sx(f, p0, double(L.gen_from))), kx1 = std::min(img1.x, sx(f, p0, double(n)));
    if (kx1 > kx0)
      dl->AddRectFilled(ImVec2(kx0, img1.y + 1), ImVec2(kx1, img1.y + 4), tc.generated_mark);
    const float qy0 = std::max(p0.y, sy(f, p0, double(L.gen_from))), qy1 = std::min(img1.y, sy(f, p0, double(n)));
    if (i == 0 && qy1 > qy0)
      dl->AddRectFilled(ImVec2(p0.x - 4, qy0), ImVec2(p0.x - 1, qy1), tc.generated_mark);
  }
  // The answer span of a prompt opened from a corpus scan: a bar along the key axis.
  if (const AppState::AnswerMark* ans = st.answer_span(); ans && ans->begin < n) {
    const float kx0 = std::max(p0.x, sx(f, p0, double(ans->begin))),
                kx1 = std::min(img1.x, sx(f, p0, double(std::min(ans->end, n))));
    if (kx1 > kx0)
      dl->AddRectFilled(ImVec2(kx0, img1.y + 1), ImVec2(std::max(kx1, kx0 + 2), img1.y + 4), tc.answer_mark);
  }
  st.map_rects[i] =
      PanelRect{p0.x * st.fb_scale, p0.y * st.fb_scale, (img1.x - p0.x) * st.fb_scale, (img1.y - p0.y) * st.fb_scale};
  draw_colorbar(dl, ImVec2(p0.x + L.S + 6, p0.y), ImVec2(p0.x + L.S + 20, img1.y),
                i == 2 || hm.implicit ? Colormap::CoolWarm : Colormap(st.settings.seq_cmap), T.meta[i].scale,
                ImGui::GetColorU32(ImGuiCol_Text));
}

// The cell under the mouse and what the mouse did to the view over map i: wheel zooms around the cursor, drag pans,
// click locks the cursor (and moves the row view there), double-click resets. True when the view changed.
bool map_interaction(AppState& st, const MapsLayout& L, const Frame& f, int i, int64_t& hover_q, int64_t& hover_k,
                     bool view_changed) {
  ImGuiIO& io = ImGui::GetIO();
  const int64_t n = L.n;
  const ImVec2 p0 = L.p0(i), img1 = img_end(f, p0);
  ImGui::SetCursorScreenPos(p0);
  ImGui::PushID(i);
  ImGui::InvisibleButton("map", ImVec2(std::max(img1.x - p0.x, 1.0f), std::max(img1.y - p0.y, 1.0f)));
  ImGui::PopID();
  bool changed = false;
  if (ImGui::IsItemHovered() && !view_changed) {
    const double tk = f.klo + (io.MousePos.x - p0.x) / f.ppt, tq = f.qlo + (io.MousePos.y - p0.y) / f.ppt;
    if (tk >= f.kf && tq >= 0 && tk < double(n) && tq < double(n)) {
      hover_k = int64_t(tk);
      hover_q = int64_t(tq);
    }
    if (io.MouseWheel != 0) {
      // Keep the token under the mouse where it is.
      const double span = std::clamp(f.span / std::pow(1.25, double(io.MouseWheel)), std::min(4.0, double(n)),
                                     double(n));
      const double dx = (io.MousePos.x - p0.x) / f.ppt, dy = (io.MousePos.y - p0.y) / f.ppt;
      const double scale = span / f.span;
      st.view.span = span;
      st.view.ck = tk - dx * scale + std::min(span, double(n - f.kf)) / 2;
      st.view.cq = tq - dy * scale + std::min(span, double(n)) / 2;
      changed = true;
    }
    if (ImGui::IsMouseDoubleClicked(0)) {
      st.view = HeadView{};
      changed = true;
    }
  }
  if (ImGui::IsItemActive() && ImGui::IsMouseDragging(0, 2.0f) && !view_changed && !changed) {
    st.view.span = f.span;
    st.view.ck = f.klo + f.vk / 2 - io.MouseDelta.x / f.ppt;
    st.view.cq = f.qlo + f.vq / 2 - io.MouseDelta.y / f.ppt;
    changed = true;
  }
  if (ImGui::IsItemDeactivated() && io.MouseDragMaxDistanceSqr[0] < 9 && hover_q >= 0) {
    if (st.view.locked && st.view.lock_q == hover_q && st.view.lock_k == hover_k) {
      st.view.locked = false;
    } else {
      st.view.locked = true;
      st.view.lock_q = hover_q;
      st.view.lock_k = hover_k;
      st.select_row(hover_q);  // the row view follows the clicked query
    }
  }
  return changed;
}

// Key labels under map i, and query labels left of the first map: every token's text when a token is taller than
// a line, else positions at round steps.
void map_labels(const MapsLayout& L, const Frame& f, int i, int64_t hover_q, int64_t hover_k) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ThemeColors& tc = theme_colors();
  const ImU32 text_col = ImGui::GetColorU32(ImGuiCol_Text);
  const ImVec2 p0 = L.p0(i), img1 = img_end(f, p0);
  const float lh = L.lh;
  char num[32];
  dl->PushClipRect(ImVec2(p0.x - lh, img1.y), ImVec2(img1.x + lh, img1.y + L.label_w + 2), true);
  for (int64_t k = int64_t(std::ceil(f.klo / double(L.step))) * L.step; double(k) < f.klo + f.vk; k += L.step) {
    const float x = sx(f, p0, double(k) + (L.token_labels ? 0.5 : 0.0));
    const ImU32 col = k == hover_k ? tc.selection : text_col;
    if (L.token_labels) {
      add_text_vertical(dl, ImVec2(x, img1.y + 4), col, label_at(k).c_str());
    } else {
      std::snprintf(num, sizeof num, "%lld", (long long)k);
      dl->AddLine(ImVec2(x, img1.y), ImVec2(x, img1.y + 3), tc.grid);
      add_text_vertical(dl, ImVec2(x, img1.y + 5), col, num);
    }
  }
  dl->PopClipRect();
  if (i != 0)
    return;
  dl->PushClipRect(ImVec2(L.origin.x, p0.y - lh), ImVec2(p0.x, img1.y + lh), true);
  for (int64_t q = int64_t(std::ceil(f.qlo / double(L.step))) * L.step; double(q) < f.qlo + f.vq; q += L.step) {
    const float y = sy(f, p0, double(q) + (L.token_labels ? 0.5 : 0.0));
    std::string t;
    if (L.token_labels) {
      t = label_at(q);
    } else {
      std::snprintf(num, sizeof num, "%lld", (long long)q);
      t = num;
      dl->AddLine(ImVec2(p0.x - 3, y), ImVec2(p0.x, y), tc.grid);
    }
    const float w = ImGui::CalcTextSize(t.c_str()).x;
    dl->AddText(ImVec2(p0.x - 6 - w, y - lh * 0.5f), q == hover_q ? tc.selection : text_col, t.c_str());
  }
  dl->PopClipRect();
}

// The cursor in every map: the hovered cell (the pooled block under the mouse), else the locked token.
void draw_cursor(const HeadMaps& hm, const MapsLayout& L, const Frame& f, int64_t cq, int64_t ck) {
  if (cq < 0 || cq >= L.n || ck >= L.n)
    return;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ThemeColors& tc = theme_colors();
  int64_t r0 = cq, r1 = cq + 1, c0 = ck, c1 = ck + 1;
  if (hm.contains(cq, ck)) {
    const int i = hm.row_of(cq), j = hm.col_of(ck);
    r0 = hm.row_start(i), r1 = hm.row_start(i + 1), c0 = hm.col_start(j), c1 = hm.col_start(j + 1);
  }
  for (int i = 0; i < L.maps; ++i) {
    const ImVec2 p0 = L.p0(i), img1 = img_end(f, p0);
    dl->PushClipRect(p0, img1, true);
    const ImU32 faint = (tc.cursor & 0x00ffffffu) | 0x50000000u;
    const float ymid = sy(f, p0, double(cq) + 0.5), xmid = sx(f, p0, double(ck) + 0.5);
    dl->AddLine(ImVec2(p0.x, ymid), ImVec2(img1.x, ymid), faint);
    dl->AddLine(ImVec2(xmid, p0.y), ImVec2(xmid, img1.y), faint);
    dl->AddRect(ImVec2(sx(f, p0, double(c0)) - 1, sy(f, p0, double(r0)) - 1),
                ImVec2(std::max(sx(f, p0, double(c1)), sx(f, p0, double(c0)) + 2) + 1,
                       std::max(sy(f, p0, double(r1)), sy(f, p0, double(r0)) + 2) + 1),
                tc.cursor, 0, 0, 2);
    dl->PopClipRect();
  }
}

// Footer: the cursor cell's values, or the view's resolution and how to interact.
void head_footer(const AppState& st, const HeadMaps& hm, int64_t cq, int64_t ck, bool hovering, bool pending) {
  const MapView& mv = hm.view;
  char res[160];
  if (hm.exact())
    std::snprintf(res, sizeof res, "%lld x %lld tokens, one cell per token", (long long)(mv.q1 - mv.q0),
                  (long long)(mv.k1 - mv.k0));
  else
    std::snprintf(res, sizeof res, "%lld x %lld tokens in %d x %d cells (%s)", (long long)(mv.q1 - mv.q0),
                  (long long)(mv.k1 - mv.k0), mv.rows, mv.cols, pool_name(mv.pool));
  if (cq >= 0 && hm.contains(cq, ck) && ck <= cq) {
    const int i = hm.row_of(cq), j = hm.col_of(ck);
    const size_t at = size_t(i) * size_t(mv.cols) + size_t(j);
    const char* tag = st.view.locked && !hovering ? "[locked] " : "";
    if (hm.implicit)
      ImGui::Text("%sq %lld \"%s\"  k %lld \"%s\"   M %+.4g%s", tag, (long long)cq, label_at(cq).c_str(), (long long)ck,
                  label_at(ck).c_str(), mv.a1[at], hm.exact() ? "" : "   (pooled cell)");
    else if (hm.differential)
      ImGui::Text("%sq %lld \"%s\"  k %lld \"%s\"   A1 %.4f   A2 %.4f   A1 - %s*A2 %+.4f%s", tag, (long long)cq,
                  label_at(cq).c_str(), (long long)ck, label_at(ck).c_str(), mv.a1[at], mv.a2[at], st.lam(),
                  mv.diff[at], hm.exact() ? "" : "   (pooled cell)");
    else
      ImGui::Text("%sq %lld \"%s\"  k %lld \"%s\"   A %.4f%s", tag, (long long)cq, label_at(cq).c_str(),
                  (long long)ck, label_at(ck).c_str(), mv.a1[at], hm.exact() ? "" : "   (pooled cell)");
  } else {
    ImGui::TextDisabled("%s%s   |   wheel: zoom   drag: pan   click: lock cursor + row view   double-click: reset", res,
                        pending ? "   updating..." : "");
  }
}

}  // namespace

void draw_head_panel(AppState& st) {
  char title[160];
  head_title(*st.snap, title, sizeof title);
  if (!begin_panel(st, title, &st.show_head, Slot::Head,
                   ImGuiWindowFlags_NoScrollbar | ImGuiWindowFlags_NoScrollWithMouse))
    return end_panel();
  const Snapshot& s = *st.snap;
  if (!s.model) {
    empty_state(
        "No model loaded. Open a checkpoint folder in the Model panel (Ctrl+O), drop a folder on this "
        "window, or start `diffscope DIR`.");
    return end_panel();
  }
  toolbar(st, *s.model);
  if (!s.result || !s.head) {
    empty_state(s.running ? "Running..." : "Type a prompt in the Prompt panel and press Ctrl+Enter to see this head.");
    return end_panel();
  }
  const HeadMaps& hm = *s.head;
  const MapView& mv = hm.view;
  update_labels(s.result);
  rebuild_textures(st);

  MapsLayout L;
  L.maps = hm.differential ? 3 : 1;
  L.lh = ImGui::GetTextLineHeight();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  L.n = int64_t(s.result->tokens.size());
  L.gen_from = s.result->prompt_len > 0 ? s.result->prompt_len : L.n;  // first generated position
  // Token text labels need a wider band than positions; use them when a token is at least a line tall.
  char digits[32];
  std::snprintf(digits, sizeof digits, "%lld", (long long)L.n);
  const float num_w = std::clamp(ImGui::CalcTextSize(digits).x + 12, 28.0f, 110.0f);
  const float tok_w = std::clamp(std::max(g_labels.max_w, ImGui::CalcTextSize(digits).x) + 8, 28.0f, 110.0f);
  L.cbw = colorbar_width();
  L.title_h = L.lh + 6;
  const float footer_h = L.lh + 8;
  auto side = [&](float lw) {
    return std::floor(std::min((avail.x - lw - L.maps * (L.cbw + L.gap)) / L.maps, avail.y - L.title_h - lw - footer_h));
  };
  const double span_now = st.view.span > 0 ? std::min(st.view.span, double(L.n)) : double(L.n);
  L.token_labels = side(tok_w) / span_now >= L.lh + 1;
  L.label_w = L.token_labels ? tok_w : num_w;
  L.S = side(L.label_w);
  if (L.S < 48 || L.n < 1) {
    empty_state("Make this panel larger to see the maps.");
    return end_panel();
  }
  // The rectangle this frame shows; the worker is asked for it when it changes.
  Frame f = make_frame(st.view, L.n, st.settings.hide_first ? 1 : 0, L.S);
  const ViewRequest want = frame_request(f, L.S * st.fb_scale, st.settings.mean_pool);
  if (!same_request(want, st.req.view)) {
    st.req.view = want;
    st.submit();
  }
  const bool pending = !(hm.result_seq == s.result->seq && hm.layer == st.layer && hm.head == st.head &&
                         same_request(want, [&] {
                           ViewRequest r;
                           r.q0 = mv.q0, r.q1 = mv.q1, r.k0 = mv.k0, r.k1 = mv.k1;
                           r.rows = mv.rows, r.cols = mv.cols, r.pool = mv.pool;
                           return r;
                         }()));
  L.origin = ImGui::GetCursorScreenPos();
  L.step = L.token_labels ? 1 : nice_step((L.lh + 2) / float(f.ppt));

  MapTitles titles;
  map_titles(st, hm, titles);
  int64_t hover_q = -1, hover_k = -1;
  bool view_changed = false;
  for (int i = 0; i < L.maps; ++i) {
    draw_map_image(st, hm, L, f, i, titles.of[i]);
    view_changed |= map_interaction(st, L, f, i, hover_q, hover_k, view_changed);
    map_labels(L, f, i, hover_q, hover_k);
  }
  if (view_changed)
    f = make_frame(st.view, L.n, st.settings.hide_first ? 1 : 0, L.S);  // the cursor below uses the new frame
  if (hover_q >= 0) {
    st.view.hover_q = hover_q;
    st.view.hover_k = hover_k;
    hover_tooltip(st, hm, hover_q, hover_k);
  } else {
    st.view.hover_q = st.view.hover_k = -1;
  }
  const int64_t cq = hover_q >= 0 ? hover_q : (st.view.locked ? st.view.lock_q : -1);
  const int64_t ck = hover_q >= 0 ? hover_k : (st.view.locked ? st.view.lock_k : -1);
  draw_cursor(hm, L, f, cq, ck);
  ImGui::SetCursorScreenPos(ImVec2(L.origin.x, L.origin.y + L.title_h + L.S + L.label_w + 4));
  head_footer(st, hm, cq, ck, hover_q >= 0, pending);
  end_panel();
}

}  // namespace ds::gui
