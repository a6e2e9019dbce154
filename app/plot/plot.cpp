// See plot.h. Layout: a header, then panels a (bars), b (heatmaps + one colour bar) and c (line charts, only with
// groups), then a note on the quantities. Heights are computed before the surface is made; text goes through cairo's
// toy API with DejaVu Sans. Every cairo failure (surface, context, drawing, PNG encoding) and every write failure
// becomes ds::Error("PATH: ...").
#include "app/plot/plot.h"

#include <cairo.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/safe_write.h"
#include "engine/session/session_scan.h"

namespace ds::scan {

namespace {

using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------------------------------
// colours and numbers

struct Rgb {
  double r = 0, g = 0, b = 0;
};
constexpr Rgb hex(uint32_t v) { return {((v >> 16) & 255) / 255.0, ((v >> 8) & 255) / 255.0, (v & 255) / 255.0}; }
Rgb mix(Rgb a, Rgb b, double t) { return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t}; }

// Paul Tol's "bright" scheme: runs blue / red; the bars' categories green / grey / yellow.
constexpr Rgb kRunColors[2] = {hex(0x4477AA), hex(0xEE6677)};
constexpr Rgb kAnswerColor = hex(0x228833), kContextColor = hex(0xBBBBBB), kSinkColor = hex(0xCCBB44);
constexpr Rgb kText = hex(0x222222), kMuted = hex(0x666666), kAxis = hex(0x444444), kGrid = hex(0xE6E6E6);
constexpr Rgb kMissing = hex(0xDDDDDD), kWhite = hex(0xFFFFFF), kWarn = hex(0xB03030);

// viridis (matplotlib, CC0), 17 samples of the 256-entry table, linearly interpolated.
constexpr uint8_t kViridis[17][3] = {{68, 1, 84},    {72, 24, 106},  {71, 45, 123},  {66, 64, 134},  {59, 82, 139},
                                     {51, 99, 141},  {44, 114, 142}, {38, 130, 142}, {33, 145, 140}, {31, 159, 136},
                                     {39, 173, 129}, {61, 188, 116}, {92, 200, 99},  {129, 211, 77}, {170, 220, 50},
                                     {213, 226, 26}, {253, 231, 37}};
Rgb viridis(double t) {
  if (!(t > 0)) t = 0;
  if (t > 1) t = 1;
  double f = t * 16;
  int i = std::min(15, static_cast<int>(f));
  f -= i;
  Rgb a{kViridis[i][0] / 255.0, kViridis[i][1] / 255.0, kViridis[i][2] / 255.0};
  Rgb b{kViridis[i + 1][0] / 255.0, kViridis[i + 1][1] / 255.0, kViridis[i + 1][2] / 255.0};
  return mix(a, b, f);
}

std::string printf_str(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}
// A number for a label: a typographic minus sign (U+2212) instead of the hyphen.
std::string with_minus(std::string s) {
  if (!s.empty() && s[0] == '-') s.replace(0, 1, "\xE2\x88\x92");
  return s;
}
// "0.312", small values with two significant digits ("0.0042").
std::string fmt_value(double v) {
  if (std::fabs(v) >= 0.01 || v == 0) return with_minus(printf_str("%.3f", v));
  return with_minus(printf_str("%.2g", v));
}
// A tick label with as many decimals as the step needs.
std::string fmt_tick(double v, double step) {
  int decimals = 0;
  if (step > 0 && step < 1) {
    decimals = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    if (std::fabs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) > 1e-6) ++decimals;
  }
  if (std::fabs(v) < step * 1e-6) v = 0;  // no "-0.0"
  char fmt[16];
  std::snprintf(fmt, sizeof fmt, "%%.%df", std::min(decimals, 6));
  return with_minus(printf_str(fmt, v));
}
// A group value on an axis: integers as integers, others with up to 3 significant digits.
std::string fmt_number(double v) {
  if (std::fabs(v) < 1e15 && v == std::round(v)) return printf_str("%.0f", v);
  return printf_str("%.3g", v);
}

double nice_step(double range, int target) {
  if (!(range > 0)) return 1;
  double raw = range / std::max(1, target);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / mag;
  double nf = f < 1.5 ? 1 : f < 2.25 ? 2 : f < 3.5 ? 2.5 : f < 7.5 ? 5 : 10;
  return nf * mag;
}
std::vector<double> ticks_in(double lo, double hi, double step) {
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9 && t.size() < 64; v += step) t.push_back(v);
  return t;
}

// Text cairo can show: valid UTF-8 (invalid bytes become '?', which would otherwise put the context in an error
// state), control characters as spaces.
std::string clean_text(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; ok && k < len; ++k) {
      unsigned char d = s[i + k];
      ok = (d >> 6) == 2;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (ok && len > 1) {
      static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    if (len == 1 && (c < 0x20 || c == 0x7F))
      out += ' ';
    else
      out.append(s, i, len);
    i += len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// the report, read into what is drawn

struct GroupPoint {
  bool numeric = false;
  double x = kNaN;    // the value, when numeric
  std::string label;  // the value as text
  double answer = kNaN, accuracy = kNaN;
};

struct RunData {
  std::string label, subtitle;
  bool differential = false;
  const char* answer_key = "answer1";
  double answer = kNaN, context = kNaN, sink = kNaN;  // means over layers, heads and prompts
  std::vector<std::string> layer_names;
  std::vector<std::vector<double>> cells;  // [layer][head], NaN where absent
  std::vector<double> layer_mean;
  int heads = 0;
  std::vector<GroupPoint> groups[2];  // depth, length
  Rgb color;
};

constexpr const char* kGroupKeys[2] = {"depth", "length"};

RunData read_run(const RunReport& r, int index) {
  RunData d;
  d.color = kRunColors[index];
  d.differential = r.differential;
  d.answer_key = d.differential ? "answer_diff" : "answer1";
  d.answer = d.differential ? r.mean.answer_diff : r.mean.answer1;
  d.context = d.differential ? r.mean.context_diff : r.mean.context1;
  d.sink = d.differential ? r.mean.sink_diff : r.mean.sink1;
  const auto answer_of = [&](const Fractions& f) { return d.differential ? f.answer_diff : f.answer1; };

  std::string model = r.model;
  while (model.size() > 1 && model.back() == '/') model.pop_back();
  if (auto slash = model.rfind('/'); slash != std::string::npos && slash + 1 < model.size())
    model = model.substr(slash + 1);
  d.label = r.label;
  if (d.label.empty()) d.label = model;
  if (d.label.empty()) d.label = "run " + std::to_string(index + 1);
  d.label = clean_text(d.label);

  std::vector<std::string> parts;
  if (!r.architecture.empty()) parts.push_back(r.architecture);
  const double ls = r.lambda_scale;
  if (d.differential)
    parts.push_back(std::isfinite(ls) && ls != 1 ? "differential, \xCE\xBB \xC3\x97 " + fmt_number(ls)
                                                 : std::string("differential"));
  else
    parts.push_back("plain softmax attention");
  if (r.logit_bits > 0) parts.push_back("logits at " + std::to_string(r.logit_bits) + " bits");
  if (!r.interventions.empty())
    parts.push_back(std::to_string(r.interventions.size()) + (r.interventions.size() == 1 ? " intervention" : " interventions"));
  parts.push_back(fmt_number(double(r.prompts)) + (r.prompts == 1 ? " prompt" : " prompts"));
  if (std::isfinite(r.accuracy))
    parts.push_back("accuracy " + printf_str("%.1f%%", r.accuracy * 100) + " (" + fmt_number(double(r.correct)) + "/" +
                    fmt_number(double(r.with_target)) + ")");
  else
    parts.push_back("no targets");
  for (size_t i = 0; i < parts.size(); ++i) d.subtitle += (i ? "  \xC2\xB7  " : "") + parts[i];
  d.subtitle = clean_text(d.subtitle);

  for (const LayerReport& layer : r.layers) {
    d.layer_names.push_back(fmt_number(double(layer.layer)));
    std::vector<double> row;
    for (const Fractions& h : layer.heads) row.push_back(answer_of(h));
    d.heads = std::max<int>(d.heads, static_cast<int>(row.size()));
    d.cells.push_back(std::move(row));
  }
  for (auto& row : d.cells) {
    row.resize(d.heads, kNaN);
    double sum = 0;
    int n = 0;
    for (double v : row)
      if (std::isfinite(v)) sum += v, ++n;
    d.layer_mean.push_back(n ? sum / n : kNaN);
  }

  for (int g = 0; g < 2; ++g) {
    for (const auto& [key, arr] : r.groups) {
      if (key != kGroupKeys[g]) continue;
      for (const GroupReport& e : arr) {
        const json& v = e.value;
        GroupPoint p;
        if (v.is_number()) {
          p.numeric = true;
          p.x = v.get<double>();
          if (!std::isfinite(p.x)) continue;
          p.label = fmt_number(p.x);
        } else {
          p.label = clean_text(v.is_string() ? v.get<std::string>() : v.dump());
        }
        p.answer = answer_of(e.mean);
        p.accuracy = e.accuracy;
        d.groups[g].push_back(std::move(p));
      }
    }
    if (std::all_of(d.groups[g].begin(), d.groups[g].end(), [](const GroupPoint& p) { return p.numeric; }))
      std::stable_sort(d.groups[g].begin(), d.groups[g].end(),
                       [](const GroupPoint& a, const GroupPoint& b) { return a.x < b.x; });
  }
  return d;
}

// ---------------------------------------------------------------------------------------------------------------
// drawing

enum class HAlign { Left, Center, Right };
enum class VAlign { Top, Middle, Baseline, Bottom };

class Canvas {
 public:
  explicit Canvas(cairo_t* cr) : cr_(cr) {}
  cairo_t* cr() const { return cr_; }

  void font(double size, bool bold = false) {
    cairo_select_font_face(cr_, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr_, size);
  }
  double width(const std::string& s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr_, s.c_str(), &e);
    return e.x_advance;
  }
  // s cut (at a code point) with an ellipsis to fit max_w.
  std::string fit(std::string s, double max_w) {
    if (width(s) <= max_w) return s;
    while (!s.empty()) {
      unsigned char last;
      do {  // one code point: continuation bytes up to its lead byte
        last = static_cast<unsigned char>(s.back());
        s.pop_back();
      } while (!s.empty() && (last & 0xC0) == 0x80);
      if (width(s + "\xE2\x80\xA6") <= max_w) return s + "\xE2\x80\xA6";
    }
    return s;
  }
  // Draws s with (x, y) at the given anchor; returns its width.
  double text(double x, double y, const std::string& s, Rgb c, HAlign ha = HAlign::Left, VAlign va = VAlign::Baseline) {
    double w = width(s);
    cairo_font_extents_t fe;
    cairo_font_extents(cr_, &fe);
    double bx = ha == HAlign::Left ? x : ha == HAlign::Center ? x - w / 2 : x - w;
    double by = va == VAlign::Baseline ? y
                : va == VAlign::Top    ? y + fe.ascent
                : va == VAlign::Middle ? y + (fe.ascent - fe.descent) / 2
                                       : y - fe.descent;
    set(c);
    cairo_move_to(cr_, bx, by);
    cairo_show_text(cr_, s.c_str());
    cairo_new_path(cr_);
    return w;
  }
  // Text reading bottom to top, centred on (x, y).
  void text_up(double x, double y, const std::string& s, Rgb c) {
    cairo_save(cr_);
    cairo_translate(cr_, x, y);
    cairo_rotate(cr_, -M_PI / 2);
    text(0, 0, s, c, HAlign::Center, VAlign::Middle);
    cairo_restore(cr_);
  }
  void rect(double x, double y, double w, double h, Rgb c) {
    set(c);
    cairo_rectangle(cr_, x, y, w, h);
    cairo_fill(cr_);
  }
  void line(double x0, double y0, double x1, double y1, Rgb c, double lw = 1) {
    set(c);
    cairo_set_line_width(cr_, lw);
    cairo_move_to(cr_, x0, y0);
    cairo_line_to(cr_, x1, y1);
    cairo_stroke(cr_);
  }
  // A horizontal / vertical hairline on the pixel grid.
  void hline(double x0, double x1, double y, Rgb c) { line(x0, std::floor(y) + 0.5, x1, std::floor(y) + 0.5, c); }
  void vline(double x, double y0, double y1, Rgb c) { line(std::floor(x) + 0.5, y0, std::floor(x) + 0.5, y1, c); }
  void marker(double x, double y, int shape, Rgb c) {
    if (shape == 0)
      cairo_arc(cr_, x, y, 4.2, 0, 2 * M_PI);
    else
      cairo_rectangle(cr_, x - 3.8, y - 3.8, 7.6, 7.6);
    set(c);
    cairo_fill_preserve(cr_);
    set(kWhite);
    cairo_set_line_width(cr_, 1.4);
    cairo_stroke(cr_);
  }
  void set(Rgb c) { cairo_set_source_rgb(cr_, c.r, c.g, c.b); }

 private:
  cairo_t* cr_;
};

constexpr double kWidth = 1600, kMargin = 48;

// "a  Title   description" on one baseline.
void section_header(Canvas& c, double x, double right, double y, const char* letter, const std::string& title,
                    const std::string& desc) {
  c.font(19, true);
  x += c.text(x, y, letter, kText) + 12;
  c.font(16, true);
  x += c.text(x, y, c.fit(title, right - x), kText) + 14;
  c.font(13);
  if (right - x > 40) c.text(x, y, c.fit(desc, right - x), kMuted);
}

void run_title(Canvas& c, double x, double y, const RunData& r, double max_w, const std::string& suffix = {}) {
  c.rect(x, y - 11, 12, 12, r.color);
  c.font(15, true);
  double w = c.text(x + 19, y, c.fit(r.label, (max_w - 19) * (suffix.empty() ? 1 : 0.6)), kText);
  if (!suffix.empty()) {
    c.font(13);
    c.text(x + 19 + w + 10, y, c.fit(suffix, max_w - 19 - w - 10), kMuted);
  }
}

// --- a: bars ---------------------------------------------------------------------------------------------------

struct BarScale {
  double lo = 0, hi = 1, step = 0.2;
};

void draw_bars(Canvas& c, const RunData& r, double x, double y, double w, double h, const BarScale& s) {
  run_title(c, x, y + 14, r, w);
  c.font(12.5);
  c.text(x + 19, y + 34, c.fit(r.subtitle, w - 19), kMuted);

  const double px = x + 70, py = y + 58, pw = w - 80, ph = h - 58 - 46;
  auto map = [&](double v) { return py + ph - (v - s.lo) / (s.hi - s.lo) * ph; };
  c.font(12);
  for (double t : ticks_in(s.lo, s.hi, s.step)) {
    c.hline(px, px + pw, map(t), kGrid);
    c.text(px - 8, map(t), fmt_tick(t, s.step), kMuted, HAlign::Right, VAlign::Middle);
  }
  c.font(13);
  c.text_up(x + 14, py + ph / 2, "normalised attention", kText);

  struct Bar {
    const char* name;
    double v;
    Rgb color;
  };
  const Bar bars[3] = {{"answer span", r.answer, kAnswerColor},
                       {"noise context", r.context, kContextColor},
                       {"sink (key 0)", r.sink, kSinkColor}};
  const double slot = pw / 3, bw = std::min(120.0, slot * 0.56), y0 = map(0);
  for (int i = 0; i < 3; ++i) {
    double cx = px + slot * (i + 0.5);
    const Bar& b = bars[i];
    if (std::isfinite(b.v)) {
      double yv = std::clamp(map(b.v), py - 4, py + ph + 4);
      double top = std::min(yv, y0), bh = std::max(1.0, std::fabs(yv - y0));
      c.rect(std::round(cx - bw / 2), std::round(top), std::round(bw), std::round(bh), b.color);
      cairo_set_source_rgb(c.cr(), b.color.r * 0.7, b.color.g * 0.7, b.color.b * 0.7);
      cairo_set_line_width(c.cr(), 1);
      cairo_rectangle(c.cr(), std::round(cx - bw / 2) + 0.5, std::round(top) + 0.5, std::round(bw) - 1,
                      std::max(0.0, std::round(bh) - 1));
      cairo_stroke(c.cr());
      c.font(14, true);
      if (b.v >= 0)
        c.text(cx, top - 6, fmt_value(b.v), kText, HAlign::Center, VAlign::Bottom);
      else
        c.text(cx, top + bh + 5, fmt_value(b.v), kText, HAlign::Center, VAlign::Top);
    } else {
      c.font(13);
      c.text(cx, y0 - 6, "n/a", kMuted, HAlign::Center, VAlign::Bottom);
    }
    c.font(13);
    c.text(cx, py + ph + 12, b.name, kText, HAlign::Center, VAlign::Top);
  }
  c.hline(px, px + pw, y0, kAxis);
}

// --- b: heatmaps -----------------------------------------------------------------------------------------------

struct ColorScale {
  double lo = 0, hi = 1;
  bool clip_lo = false, clip_hi = false;
  double t(double v) const { return (v - lo) / (hi - lo); }
};

// One scale for every run's cells: [min(0, min), max], robust (1st / 99th percentile) where values leave [-1, 1].
ColorScale heat_scale(const std::vector<RunData>& runs) {
  std::vector<double> v;
  for (const auto& r : runs)
    for (const auto& row : r.cells)
      for (double x : row)
        if (std::isfinite(x)) v.push_back(x);
  ColorScale s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v[static_cast<size_t>(std::round(p * (v.size() - 1)))]; };
  double mn = v.front(), mx = v.back();
  s.lo = std::min(0.0, mn < -1 && v.size() >= 10 ? q(0.01) : mn);
  s.hi = mx > 1 && v.size() >= 10 ? std::max(1.0, q(0.99)) : mx;
  if (!(s.hi - s.lo > 1e-12)) s.hi = s.lo + (s.lo != 0 ? std::fabs(s.lo) * 0.1 : 1.0);
  s.clip_lo = mn < s.lo;
  s.clip_hi = mx > s.hi;
  return s;
}

// Integer cell sizes shared by all runs.
struct HeatGeom {
  int cw = 8, ch = 8, mw = 16;  // cell width and height, the mean column's width
  double grid_h(const RunData& r) const { return static_cast<double>(r.cells.size()) * ch; }
};

constexpr double kHeatTitleH = 40, kHeatAxisH = 52, kColorbarColW = 110, kRunGap = 48, kHeatLeft = 64;
constexpr double kMeanGap = 12;

int nice_stride(double cell, double min_spacing) {
  static constexpr int kStrides[] = {1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 256, 512, 1024};
  for (int s : kStrides)
    if (s * cell >= min_spacing) return s;
  return 2048;
}

double heat_block_w(const RunData& r, const HeatGeom& g) { return kHeatLeft + r.heads * g.cw + kMeanGap + g.mw; }

void draw_cell(Canvas& c, double x, double y, int w, const HeatGeom& g, double v, const ColorScale& s) {
  const double gap = std::min(g.cw, g.ch) >= 8 ? 1 : 0;
  c.rect(x, y, w - gap, g.ch - gap, std::isfinite(v) ? viridis(s.t(v)) : kMissing);
  if (std::isfinite(v) && w >= 40 && g.ch >= 18) {
    c.font(w >= 48 ? 11.5 : 10.5);
    c.text(x + (w - gap) / 2, y + (g.ch - gap) / 2, with_minus(printf_str("%.2f", v)), s.t(v) < 0.6 ? kWhite : kText,
           HAlign::Center, VAlign::Middle);
  }
}

void draw_heatmap(Canvas& c, const RunData& r, double x, double y, double w, const HeatGeom& g, const ColorScale& s) {
  run_title(c, x, y + 14, r, w, std::string(r.answer_key) + ", mean over prompts");
  const double gx = x + kHeatLeft, gy = y + kHeatTitleH;
  const double grid_w = r.heads * g.cw, grid_h = g.grid_h(r);
  // Beyond a few hundred heads the cells (at least 2 px) would leave the column: cut them at its edge.
  cairo_save(c.cr());
  cairo_rectangle(c.cr(), x, y, w + 20, kHeatTitleH + grid_h + kHeatAxisH);  // + the "mean" label's overhang
  cairo_clip(c.cr());
  struct Restore {
    cairo_t* cr;
    ~Restore() { cairo_restore(cr); }
  } restore{c.cr()};
  if (r.cells.empty() || r.heads == 0) {
    c.font(13);
    c.text(gx, gy + 20, r.cells.empty() ? "no attention layers in the report" : "no heads in the report", kMuted);
    return;
  }
  for (size_t i = 0; i < r.cells.size(); ++i)
    for (int j = 0; j < r.heads; ++j) draw_cell(c, gx + j * g.cw, gy + i * g.ch, g.cw, g, r.cells[i][j], s);
  const double mx = gx + grid_w + kMeanGap;
  for (size_t i = 0; i < r.cells.size(); ++i) draw_cell(c, mx, gy + i * g.ch, g.mw, g, r.layer_mean[i], s);
  c.font(11.5);
  c.text(mx + g.mw / 2.0, gy - 5, "mean", kMuted, HAlign::Center, VAlign::Bottom);

  // layers down the left, heads along the bottom
  c.font(12);
  const int ls = nice_stride(g.ch, 15);
  double label_w = 0;
  for (size_t i = 0; i < r.cells.size(); i += ls) {
    double cy = gy + i * g.ch + (g.ch - 1) / 2.0;
    label_w = std::max(label_w, c.text(gx - 7, cy, r.layer_names[i], kMuted, HAlign::Right, VAlign::Middle));
    if (ls > 1) c.hline(gx - 4, gx - 1, cy, kAxis);
  }
  const int hs = nice_stride(g.cw, 26);
  for (int j = 0; j < r.heads; j += hs) {
    double cx = gx + j * g.cw + (g.cw - 1) / 2.0;
    c.text(cx, gy + grid_h + 7, std::to_string(j), kMuted, HAlign::Center, VAlign::Top);
    if (hs > 1) c.vline(cx, gy + grid_h, gy + grid_h + 4, kAxis);
  }
  c.font(13);
  c.text_up(gx - 7 - label_w - 14, gy + grid_h / 2, "layer", kText);
  c.text(gx + grid_w / 2, gy + grid_h + 28, "head", kText, HAlign::Center, VAlign::Top);
}

void draw_colorbar(Canvas& c, double x, double y, double h, const ColorScale& s) {
  const double bw = 16, tri = s.clip_hi || s.clip_lo ? 10 : 0;
  c.font(12.5, true);
  c.text(x, y - 8, "answer mass", kText);
  const double by = y + (s.clip_hi ? tri : 0), bh = h - (s.clip_hi ? tri : 0) - (s.clip_lo ? tri : 0);
  cairo_pattern_t* pat = cairo_pattern_create_linear(0, by + bh, 0, by);
  for (int i = 0; i <= 16; ++i)
    cairo_pattern_add_color_stop_rgb(pat, i / 16.0, kViridis[i][0] / 255.0, kViridis[i][1] / 255.0,
                                     kViridis[i][2] / 255.0);
  cairo_rectangle(c.cr(), x, by, bw, bh);
  cairo_set_source(c.cr(), pat);
  cairo_fill(c.cr());
  cairo_pattern_destroy(pat);
  if (s.clip_hi) {
    cairo_move_to(c.cr(), x, by);
    cairo_line_to(c.cr(), x + bw / 2, by - tri);
    cairo_line_to(c.cr(), x + bw, by);
    cairo_close_path(c.cr());
    c.set(viridis(1));
    cairo_fill(c.cr());
  }
  if (s.clip_lo) {
    cairo_move_to(c.cr(), x, by + bh);
    cairo_line_to(c.cr(), x + bw / 2, by + bh + tri);
    cairo_line_to(c.cr(), x + bw, by + bh);
    cairo_close_path(c.cr());
    c.set(viridis(0));
    cairo_fill(c.cr());
  }
  const double step = nice_step(s.hi - s.lo, std::clamp(static_cast<int>(bh / 60), 2, 6));
  c.font(12);
  for (double t : ticks_in(s.lo, s.hi, step)) {
    double ty = by + bh - (t - s.lo) / (s.hi - s.lo) * bh;
    c.hline(x + bw, x + bw + 4, ty, kAxis);
    c.text(x + bw + 7, ty, fmt_tick(t, step), kMuted, HAlign::Left, VAlign::Middle);
  }
  c.rect(x, by + h + 14 - (s.clip_hi ? tri : 0), 12, 12, kMissing);
  c.text(x + 18, by + h + 20 - (s.clip_hi ? tri : 0), "no value", kMuted, HAlign::Left, VAlign::Middle);
}

// --- c: line charts --------------------------------------------------------------------------------------------

struct XAxis {
  bool categorical = false, log = false;
  std::vector<std::string> categories;
  double lo = 0, hi = 1;
  std::vector<std::pair<double, std::string>> ticks;  // position (in axis units), label
  double pos(const GroupPoint& p) const {
    if (categorical) {
      auto it = std::find(categories.begin(), categories.end(), p.label);
      return static_cast<double>(it - categories.begin());
    }
    return log ? std::log2(p.x) : p.x;
  }
};

XAxis make_x_axis(const std::vector<RunData>& runs, int g) {
  XAxis a;
  std::vector<double> xs;
  for (const auto& r : runs)
    for (const auto& p : r.groups[g]) {
      if (!p.numeric) a.categorical = true;
      if (std::find(a.categories.begin(), a.categories.end(), p.label) == a.categories.end())
        a.categories.push_back(p.label);
      if (p.numeric) xs.push_back(p.x);
    }
  if (a.categorical) {
    a.lo = -0.5;
    a.hi = a.categories.size() - 0.5;
    for (size_t i = 0; i < a.categories.size(); ++i) a.ticks.emplace_back(static_cast<double>(i), a.categories[i]);
    return a;
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  if (xs.empty()) return a;
  a.log = xs.front() > 0 && xs.back() / xs.front() >= 16;
  auto tr = [&](double v) { return a.log ? std::log2(v) : v; };
  double lo = tr(xs.front()), hi = tr(xs.back());
  if (hi - lo < 1e-12) lo -= 1, hi += 1;
  double pad = (hi - lo) * 0.05;
  a.lo = lo - pad;
  a.hi = hi + pad;
  if (xs.size() <= 12) {
    for (double v : xs) a.ticks.emplace_back(tr(v), fmt_number(v));
  } else if (a.log) {
    for (double e = std::ceil(lo); e <= hi + 1e-9; e += 1) a.ticks.emplace_back(e, fmt_number(std::pow(2.0, e)));
  } else {
    double step = nice_step(hi - lo, 6);
    for (double v : ticks_in(lo, hi, step)) a.ticks.emplace_back(v, fmt_tick(v, step));
  }
  return a;
}

void draw_chart(Canvas& c, const std::vector<RunData>& runs, int g, bool accuracy, const XAxis& xa, double x, double y,
                double w, double h) {
  const std::string dim = kGroupKeys[g];
  c.font(14, true);
  c.text(x, y + 14, c.fit(accuracy ? "Accuracy by " + dim : "Answer mass by " + dim, w), kText);
  const double px = x + 66, py = y + 34, pw = w - 66 - 14, ph = h - 34 - 52;

  // y range
  double scale = 1;  // accuracy as a fraction -> percent
  double ylo = 0, yhi = 1, step = 0.2;
  std::vector<double> ys;
  for (const auto& r : runs)
    for (const auto& p : r.groups[g]) {
      double v = accuracy ? p.accuracy : p.answer;
      if (std::isfinite(v)) ys.push_back(v);
    }
  if (accuracy) {
    scale = !ys.empty() && *std::max_element(ys.begin(), ys.end()) > 1.0001 ? 1 : 100;
    ylo = 0, yhi = 100, step = 20;
    for (double v : ys) ylo = std::min(ylo, v * scale), yhi = std::max(yhi, v * scale);
  } else if (!ys.empty()) {
    double mn = std::min(0.0, *std::min_element(ys.begin(), ys.end()));
    double mx = *std::max_element(ys.begin(), ys.end());
    if (mx <= mn) mx = mn + 0.1;
    step = nice_step((mx - mn) * 1.08, 5);
    ylo = std::floor(mn / step + 1e-9) * step;
    yhi = std::ceil(mx * 1.04 / step - 1e-9) * step;
    if (yhi <= ylo) yhi = ylo + step;
  }
  auto mapx = [&](double v) { return px + (v - xa.lo) / (xa.hi - xa.lo) * pw; };
  auto mapy = [&](double v) { return py + ph - (v - ylo) / (yhi - ylo) * ph; };

  c.font(12);
  for (double t : ticks_in(ylo, yhi, step)) {
    c.hline(px, px + pw, mapy(t), kGrid);
    c.text(px - 8, mapy(t), fmt_tick(t, step), kMuted, HAlign::Right, VAlign::Middle);
  }
  double last_right = -1e9;
  for (const auto& [pos, label] : xa.ticks) {
    double tx = mapx(pos);
    c.vline(tx, py + ph, py + ph + 5, kAxis);
    std::string l = xa.categorical ? c.fit(label, std::max(30.0, pw / xa.ticks.size() - 6)) : label;
    double lw = c.width(l);
    if (tx - lw / 2 < last_right + 8) continue;  // would overlap the previous label
    c.text(tx, py + ph + 8, l, kMuted, HAlign::Center, VAlign::Top);
    last_right = tx + lw / 2;
  }
  c.hline(px, px + pw, py + ph, kAxis);
  c.vline(px, py, py + ph, kAxis);
  c.font(13);
  c.text(px + pw / 2, py + ph + 30, xa.log ? dim + " (log scale)" : dim, kText, HAlign::Center, VAlign::Top);
  c.text_up(x + 12, py + ph / 2, accuracy ? "accuracy (%)" : "answer mass", kText);

  cairo_save(c.cr());
  cairo_rectangle(c.cr(), px - 6, py - 6, pw + 12, ph + 12);
  cairo_clip(c.cr());
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    const RunData& r = runs[ri];
    std::vector<std::pair<double, double>> pts;  // NaN y breaks the line
    for (const auto& p : r.groups[g]) {
      double v = accuracy ? p.accuracy * scale : p.answer;
      pts.emplace_back(mapx(xa.pos(p)), std::isfinite(v) ? mapy(v) : kNaN);
    }
    c.set(r.color);
    cairo_set_line_width(c.cr(), 2.4);
    cairo_set_line_join(c.cr(), CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(c.cr(), CAIRO_LINE_CAP_ROUND);
    if (ri == 1) {
      const double dash[2] = {7, 4};
      cairo_set_dash(c.cr(), dash, 2, 0);
    }
    bool open = false;
    for (const auto& [px_, py_] : pts) {
      if (!std::isfinite(py_)) {
        open = false;
        continue;
      }
      if (open)
        cairo_line_to(c.cr(), px_, py_);
      else
        cairo_move_to(c.cr(), px_, py_);
      open = true;
    }
    cairo_stroke(c.cr());
    cairo_set_dash(c.cr(), nullptr, 0, 0);
    for (const auto& [px_, py_] : pts)
      if (std::isfinite(py_)) c.marker(px_, py_, static_cast<int>(ri), r.color);
  }
  cairo_restore(c.cr());
}

void draw_run_legend(Canvas& c, const std::vector<RunData>& runs, double right, double y) {
  c.font(13);
  double x = right;
  for (size_t i = runs.size(); i-- > 0;) {
    std::string l = c.fit(runs[i].label, 260);
    x -= c.width(l);
    c.text(x, y, l, kText, HAlign::Left, VAlign::Middle);
    x -= 40;
    c.set(runs[i].color);
    cairo_set_line_width(c.cr(), 2.4);
    if (i == 1) {
      const double dash[2] = {7, 4};
      cairo_set_dash(c.cr(), dash, 2, 0);
    }
    cairo_move_to(c.cr(), x, y);
    cairo_line_to(c.cr(), x + 32, y);
    cairo_stroke(c.cr());
    cairo_set_dash(c.cr(), nullptr, 0, 0);
    c.marker(x + 16, y, static_cast<int>(i), runs[i].color);
    x -= 28;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// the file

using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using ContextPtr = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

cairo_status_t append_png(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

}  // namespace

void write_plot_png(const Report& report, const std::string& path) {
  std::vector<RunData> runs;
  runs.push_back(read_run(report.run, 0));
  if (report.compare) runs.push_back(read_run(*report.compare, 1));
  const double n = static_cast<double>(runs.size());
  const bool one = runs.size() == 1;
  const double content_w = kWidth - 2 * kMargin, half_w = (content_w - kRunGap) / 2;
  // Two runs: a and b each a full-width row. One run: a on the left, b on the right of one row.
  const double a_x = kMargin, a_w = one ? half_w : content_w;
  const double b_x = one ? kMargin + half_w + kRunGap : kMargin, b_w = one ? half_w : content_w;
  const double heat_col_w = (b_w - kColorbarColW - kRunGap * (n - 1)) / n;

  // --- layout ---------------------------------------------------------------------------------------------------
  const double header_h = 96;
  const double bars_h = 370, sec_a = 40 + bars_h + 28;

  HeatGeom geom;
  {
    int max_heads = 1;
    size_t max_layers = 1;
    for (const auto& r : runs)
      max_heads = std::max(max_heads, r.heads), max_layers = std::max(max_layers, r.cells.size());
    geom.cw = static_cast<int>(std::clamp(std::floor((heat_col_w - kHeatLeft - kMeanGap - 16) / max_heads), 2.0, 56.0));
    geom.ch = static_cast<int>(
        std::clamp(std::floor(std::min<double>(std::max(geom.cw, 14), 640.0 / max_layers)), 2.0, 30.0));
    geom.mw = std::max(geom.cw, 16);
  }
  double grid_h = 0;
  for (const auto& r : runs) grid_h = std::max(grid_h, geom.grid_h(r));
  const double colorbar_h = std::max(grid_h, 180.0);
  const double sec_b = 40 + kHeatTitleH + std::max(grid_h + kHeatAxisH, colorbar_h + 40) + 24;

  struct Chart {
    int group;
    bool accuracy;
  };
  std::vector<Chart> charts;
  for (int g = 0; g < 2; ++g) {
    bool any = false, any_acc = false;
    for (const auto& r : runs)
      for (const auto& p : r.groups[g]) any = true, any_acc = any_acc || std::isfinite(p.accuracy);
    if (any) charts.push_back({g, false});
    if (any_acc) charts.push_back({g, true});
  }
  const double chart_h = 310, sec_c = charts.empty() ? 0 : 40 + chart_h + 24;
  const double note_h = 52;
  const double height = std::ceil(header_h + (one ? std::max(sec_a, sec_b) : sec_a + sec_b) + sec_c + note_h);

  // --- surface --------------------------------------------------------------------------------------------------
  SurfacePtr surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(kWidth), static_cast<int>(height)),
                     &cairo_surface_destroy);
  if (cairo_status_t st = cairo_surface_status(surface.get()); st != CAIRO_STATUS_SUCCESS)
    fail_file(path, std::string("cannot create the plot's image: ") + cairo_status_to_string(st));
  ContextPtr ctx(cairo_create(surface.get()), &cairo_destroy);
  if (cairo_status_t st = cairo_status(ctx.get()); st != CAIRO_STATUS_SUCCESS)
    fail_file(path, std::string("cannot draw the plot: ") + cairo_status_to_string(st));
  Canvas c(ctx.get());
  c.rect(0, 0, kWidth, height, kWhite);

  // --- header ---------------------------------------------------------------------------------------------------
  c.font(22, true);
  c.text(kMargin, 42, "Corpus scan: where the last prompt token attends", kText);
  {
    std::vector<std::pair<std::string, Rgb>> parts;
    std::string input = clean_text(report.input);
    if (!input.empty()) parts.push_back({"input " + input, kMuted});
    if (const size_t sk = report.skipped.size())
      parts.push_back({std::to_string(sk) + (sk == 1 ? " line skipped" : " lines skipped"), kMuted});
    // The prompts, not the scan's wall time: the figure depends on the data alone, so a report merged from shards
    // (diffscope-scan --merge) draws the same picture as one run.
    parts.push_back({std::to_string(report.run.prompts) + (report.run.prompts == 1 ? " prompt" : " prompts"), kMuted});
    if (!report.complete) parts.push_back({"incomplete: the scan was interrupted", kWarn});
    if (runs.size() == 2) parts.push_back({runs[0].label + " vs " + runs[1].label, kMuted});
    c.font(13);
    double x = kMargin;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) x += c.text(x, 68, "  \xC2\xB7  ", kMuted);
      x += c.text(x, 68, c.fit(parts[i].first, std::max(60.0, kWidth - kMargin - x)), parts[i].second);
    }
  }
  c.hline(kMargin, kWidth - kMargin, header_h - 14, kGrid);
  double y = header_h;

  // --- a --------------------------------------------------------------------------------------------------------
  section_header(c, a_x, a_x + a_w, y + 16, "a", "Attention on the answer vs the noise context",
                 one ? "mean over layers, heads and prompts"
                     : "the last prompt token's normalised attention, mean over layers, heads and prompts");
  {
    BarScale s;
    double mn = 0, mx = 0;
    for (const auto& r : runs)
      for (double v : {r.answer, r.context, r.sink})
        if (std::isfinite(v)) mn = std::min(mn, v), mx = std::max(mx, v);
    if (mx > mn) {
      s.step = nice_step((mx - mn) * 1.15, 5);
      s.lo = std::floor(mn * 1.3 / s.step + 1e-9) * s.step;  // room for a negative bar's label
      s.hi = std::ceil(mx * 1.12 / s.step - 1e-9) * s.step;
    }
    for (size_t i = 0; i < runs.size(); ++i)
      draw_bars(c, runs[i], a_x + i * (half_w + kRunGap), y + 40, half_w, bars_h, s);
  }
  if (!one) y += sec_a;

  // --- b --------------------------------------------------------------------------------------------------------
  {
    ColorScale s = heat_scale(runs);
    section_header(c, b_x, b_x + b_w, y + 16, "b", "Answer mass per layer and head",
                   one ? "mean over prompts"
                       : "share of each head's attention row on the answer span, one colour scale for all runs");
    const double col_w = heat_col_w;
    double right = b_x;
    for (size_t i = 0; i < runs.size(); ++i) {
      double x = b_x + i * (col_w + kRunGap);
      // a narrow grid sits in the middle of its column, its title on the column's left edge
      double block = std::min(col_w, heat_block_w(runs[i], geom));
      double off = runs.size() == 1 ? 0 : std::max(0.0, (col_w - block) / 2);
      draw_heatmap(c, runs[i], x + off, y + 40, col_w - off, geom, s);
      right = std::max(right, x + off + block);
    }
    const double cbx = runs.size() == 1 ? right + 40 : kWidth - kMargin - kColorbarColW + 36;
    bool any_cells = false;
    for (const auto& r : runs) any_cells = any_cells || (!r.cells.empty() && r.heads > 0);
    if (any_cells) draw_colorbar(c, cbx, y + 40 + kHeatTitleH, colorbar_h, s);
  }
  y += one ? std::max(sec_a, sec_b) : sec_b;

  // --- c --------------------------------------------------------------------------------------------------------
  if (!charts.empty()) {
    bool has[2] = {false, false};
    for (const auto& ch : charts) has[ch.group] = true;
    std::string title = has[0] && has[1] ? "Answer mass and accuracy by depth and by length"
                        : has[0]         ? "Answer mass and accuracy by depth"
                                         : "Answer mass and accuracy by length";
    section_header(c, kMargin, kWidth - kMargin - 300, y + 16, "c", title,
                   "prompts grouped by their tags (means over each group)");
    draw_run_legend(c, runs, kWidth - kMargin, y + 11);
    const double gap = 36, cn = static_cast<double>(charts.size());
    const double cw = std::min(700.0, (content_w - gap * (cn - 1)) / cn);
    XAxis axes[2] = {make_x_axis(runs, 0), make_x_axis(runs, 1)};
    for (size_t i = 0; i < charts.size(); ++i)
      draw_chart(c, runs, charts[i].group, charts[i].accuracy, axes[charts[i].group], kMargin + i * (cw + gap), y + 44,
                 cw, chart_h);
    y += sec_c;
  }

  // --- note -----------------------------------------------------------------------------------------------------
  c.hline(kMargin, kWidth - kMargin, y, kGrid);
  c.font(12);
  c.text(kMargin, y + 20,
         "Fractions of the attention row of the last prompt token: answer span = the keys of the answer, sink = key 0, "
         "noise context = every other key.",
         kMuted);
  c.text(kMargin, y + 38,
         "Differential runs: D = A1 \xE2\x88\x92 \xCE\xBB\xC2\xB7"
         "A2 divided by its row sum (answer_diff, context_diff, "
         "sink_diff); plain runs: the softmax row (answer1, context1, sink1). Missing values are left out.",
         kMuted);

  // --- checks and the file --------------------------------------------------------------------------------------
  if (cairo_status_t st = cairo_status(ctx.get()); st != CAIRO_STATUS_SUCCESS)
    fail_file(path, std::string("cannot draw the plot: ") + cairo_status_to_string(st));
  cairo_surface_flush(surface.get());
  std::string png;
  if (cairo_status_t st = cairo_surface_write_to_png_stream(surface.get(), append_png, &png);
      st != CAIRO_STATUS_SUCCESS)
    fail_file(path, std::string("cannot encode the plot as PNG: ") + cairo_status_to_string(st));
  write_file_safely(path, png, "the plot", {report.input});
}

}  // namespace ds::scan
