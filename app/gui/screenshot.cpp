// The --screenshot driver and its --state-json sidecar. See screenshot.h.
#include "screenshot.h"

#include <imgui.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/core/safe_write.h"
#include "export.h"
#include "theme.h"

namespace ds::gui {

namespace {
// A guard against hangs only, never a speed goal: --screenshot waits for the work it asked for to complete, however
// long a loaded machine takes (the tests' own guard, ctest's TIMEOUT, is longer still).
constexpr double k_timeout_s = 1200;
constexpr int k_settle_frames = 4;   // auto-sized windows and freshly uploaded textures settle in 2-3 frames

nlohmann::json rect_json(const PanelRect& r) {
  return {std::lround(r.x), std::lround(r.y), std::lround(r.w), std::lround(r.h)};
}

// FNV-1a over the bytes of a map: a cheap fingerprint the tests compare between runs.
uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

double sum(const std::vector<float>& v) {
  double s = 0;
  for (float f : v)
    s += f;
  return s;
}
}  // namespace

// The corpus scan in the state JSON: options, progress, skipped lines, the report (make_report's JSON), the prompt
// opened from it and where the panel drew its heatmap.
static nlohmann::json scan_json(const AppState& st) {
  using nlohmann::json;
  const auto& sc = st.snap ? st.snap->scan : nullptr;
  if (!sc)
    return nullptr;
  json skipped = json::array();
  if (sc->skipped)
    for (const auto& e : *sc->skipped)
      skipped.push_back({{"line", e.line}, {"error", e.error}});
  json j = {{"seq", sc->seq},
            {"path", sc->options.path},
            {"lambda_scale", sc->options.lambda_scale},
            {"compare_scale", sc->options.compare ? json(sc->options.compare_scale) : json(nullptr)},
            {"running", sc->running},
            {"complete", sc->complete},
            {"stopped", sc->stopped},
            {"error", sc->error},
            {"total", sc->total},
            {"tried", sc->tried},
            {"replicas", sc->replicas},
            {"done", sc->done},
            {"elapsed_s", sc->elapsed_s},
            {"skipped", skipped},
            {"report", sc->report ? ds::scan::report_json(sc->report->report) : json(nullptr)},
            {"view", st.corpus.view},
            {"fraction", ds::scan::kFractionKeys[std::clamp(st.corpus.part * 4 + st.corpus.map, 0, ds::scan::kNumFractions - 1)]}};
  j["heatmap_rect"] = st.show_corpus && sc->report ? rect_json(st.corpus.heat_rect) : json(nullptr);
  j["open"] = nullptr;
  if (sc->report && st.corpus.open_row >= 0 && size_t(st.corpus.open_row) < sc->report->run.rows.size()) {
    const auto& r = sc->report->run.rows[size_t(st.corpus.open_row)];
    j["open"] = {{"index", st.corpus.open_row},
                 {"line", r.line},
                 {"tokens", r.tokens},
                 {"answer", {r.answer_begin, r.answer_end}},
                 {"on_screen", st.answer_span() != nullptr}};
  }
  return j;
}

// The Compare panel (--compare): the second model, whether its tokens are the main result's, both rows' masses of the
// selected heads on the answer span (session_scan.h's keys) and both models' outliers (diffscope-run --outliers's JSON).
static nlohmann::json compare_json(const AppState& st) {
  const ComparePanelState& c = st.compare;
  if (!c.worker || !c.snap) return nullptr;
  const Snapshot& cs = *c.snap;
  nlohmann::json j = {{"dir", cs.model ? cs.model->dir : ""}, {"error", c.error}, {"shown", st.show_compare}};
  if (!cs.model || !st.snap || !st.snap->result) return j;
  j["family"] = cs.model->cfg.family();
  j["same_ids"] = cs.result && cs.result->ids == st.snap->result->ids;
  j["n_tokens"] = cs.result ? cs.result->ids.size() : 0;
  if (cs.result && !cs.result->top.empty()) j["next_token"] = {{"id", cs.result->top[0].id}, {"prob", cs.result->top[0].prob}};
  const auto ans = st.compare_answer();
  j["answer"] = ans ? nlohmann::json{ans->first, ans->second} : nlohmann::json(nullptr);
  auto side = [&](const Snapshot& s, int head) -> nlohmann::json {
    if (!s.row || !s.result || s.row->result_seq != s.result->seq || s.row->implicit) return nullptr;
    const RowMaps& rm = *s.row;
    const int h = std::clamp(head, 0, int(rm.rows.heads) - 1);
    const Fractions12 fr = row_fractions(rm, h, ans ? ans->first : 0, ans ? ans->second : 0);
    nlohmann::json fj = nlohmann::json::object();
    for (int i = 0; i < ds::scan::kNumFractions; ++i)
      if (std::isfinite(fr[size_t(i)]) && ds::scan::fraction_applies(i, rm.differential)) fj[ds::scan::kFractionKeys[i]] = fr[size_t(i)];
    // the table's row of A1 - lambda*A2 (A of a plain model)
    const std::array<double, 3> cols = sink_answer_rest(fr, rm.differential ? 2 : 0);
    nlohmann::json o = {{"layer", rm.layer}, {"head", h}, {"q", rm.q}, {"fractions", fj},
                        {"table", {{"sink", cols[0]}, {"answer", cols[1]}, {"rest", cols[2]}}}};
    if (s.outliers && s.outliers->result_seq == s.result->seq) o["outliers"] = nlohmann::json::parse(outliers_json(s.outliers->o));
    return o;
  };
  j["main"] = side(*st.snap, st.head);
  j["second"] = side(cs, c.req.head);
  return j;
}

ScreenshotDriver::ScreenshotDriver(const CliOptions& opt) : opt_(opt) {}

bool ScreenshotDriver::ready(const AppState& st) const {
  if (!st.worker->idle() || st.req_dirty || !st.snap || st.snap->loading || !st.compare_ready())
    return false;
  const Snapshot& s = *st.snap;
  if (st.seen_error_seq > 0 && s.error_seq == st.seen_error_seq)
    return true;  // an error is on screen
  if (!s.model)
    return st.req.open_seq == 0;  // nothing to open: the empty state is the picture
  // --generate (and --regenerate-lambda-scale): wait until they were sent and have stopped (the worker is idle
  // only once no generation streams).
  if (st.generation.pending > 0 || st.generation.pending_regenerate_scale)
    return false;
  // --scan (and what follows it): wait until it was started, has finished, and --scan-open's prompt was sent.
  if (st.corpus.pending || st.corpus.pending_open || !st.corpus.pending_report.empty() || !st.corpus.pending_plot.empty() ||
      st.scanning())
    return false;
  if (st.seen_model_seq != s.model->seq)
    return false;
  if (!s.result || s.result->model_seq != s.model->seq || !s.head)
    return false;
  if (st.req.quant_report_seq > 0 && st.req.logit_bits > 0 && !s.quant)
    return false;  // --quantize-logits: the report against full precision
  return st.head_tex.source == s.head;
}

void ScreenshotDriver::advance(AppState& st) {
  if (start_ == 0)
    start_ = ImGui::GetTime() + 1e-9;
  if (ImGui::GetTime() - start_ > k_timeout_s) {
    phase_ = Phase::Capture;
    return;
  }
  switch (phase_) {
    case Phase::Wait:
      if (ready(st)) {
        if (!opt_.open_after.empty() && !opened_after_) {
          opened_after_ = true;
          st.open_model(opt_.open_after);
          return;
        }
        if (opt_.replay && replay_set_.empty() && st.snap->model && opt_.replay->layer < st.snap->model->cfg.layers) {
          phase_ = Phase::Replay;
          replay_frame(st);
          return;
        }
        phase_ = Phase::Settle;
        settle_frames_ = 0;
      }
      break;
    case Phase::Replay:
      replay_frame(st);
      break;
    case Phase::Settle:
      if (!ready(st)) {
        phase_ = Phase::Wait;
      } else if (++settle_frames_ >= k_settle_frames) {
        phase_ = Phase::Capture;
      }
      break;
    case Phase::Capture:
      break;
  }
}

// One frame of a lambda drag: note which value the engine shows now (and how long after it was set), then set the
// next value as a slider drag does (an override of the layer, submitted); once every value is set, wait for the
// last one to be shown before settling.
void ScreenshotDriver::replay_frame(AppState& st) {
  const auto& r = *opt_.replay;
  const double now = ImGui::GetTime() * 1e3;
  const double frame = last_frame_ms_ > 0 ? now - last_frame_ms_ : 0;
  last_frame_ms_ = now;
  double shown = NAN, latency = NAN;
  if (st.snap && st.snap->result && size_t(r.layer) < st.snap->result->lambda.size()) {
    shown = st.snap->result->lambda[size_t(r.layer)];
    const bool changed = replay_log_.empty() || !(replay_log_.back().lambda_shown == shown);
    for (size_t i = replay_shown_; changed && i < replay_set_.size(); ++i)
      if (std::fabs(replay_set_[i].first - shown) < 1e-9) {  // a value set earlier reached the screen
        latency = now - replay_set_[i].second;
        replay_shown_ = i;
        break;
      }
  }
  // The difference map of the head view (the layer being dragged is the one on screen): it may show a value before
  // the run under it ends (Worker::preview_head).
  double diff_shown = NAN, diff_latency = NAN;
  if (st.snap && st.snap->head && st.snap->head->layer == r.layer && st.head_tex.source == st.snap->head) {
    diff_shown = st.snap->head->lambda;
    const bool changed = replay_log_.empty() || !(replay_log_.back().diff_lambda == diff_shown);
    for (size_t i = diff_shown_; changed && i < replay_set_.size(); ++i)
      if (std::fabs(replay_set_[i].first - diff_shown) < 1e-6) {
        diff_latency = now - replay_set_[i].second;
        diff_shown_ = i + 1;
        break;
      }
  }
  const size_t k = replay_set_.size();
  double set = NAN;
  if (k < size_t(r.steps)) {
    set = r.from + (r.to - r.from) * double(k) / double(r.steps - 1);
    if (size_t(r.layer) < st.req.lambda.override_.size()) {
      st.req.lambda.override_[size_t(r.layer)] = set;
      st.submit_now();  // as the slider does
    }
    replay_set_.push_back({set, now});
  } else if (replay_shown_ + 1 == replay_set_.size() && ready(st)) {
    phase_ = Phase::Settle;
    settle_frames_ = 0;
  }
  replay_log_.push_back({now, frame, set, shown, latency, diff_shown, diff_latency});
}

void ScreenshotDriver::write_replay_log() const {
  if (opt_.replay_log.empty())
    return;
  std::ostringstream f;
  f << "frame,t_ms,frame_ms,lambda_set,lambda_shown,latency_ms,diff_lambda_shown,diff_latency_ms\n";
  auto num = [](double x) { return std::isnan(x) ? std::string() : std::to_string(x); };
  for (size_t i = 0; i < replay_log_.size(); ++i) {
    const ReplayFrame& r = replay_log_[i];
    f << i << ',' << num(r.t_ms) << ',' << num(r.frame_ms) << ',' << num(r.lambda_set) << ',' << num(r.lambda_shown)
      << ',' << num(r.latency_ms) << ',' << num(r.diff_lambda) << ',' << num(r.diff_latency_ms) << '\n';
  }
  try {
    ds::write_file_safely(opt_.replay_log, f.str(), "the replay log");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diffscope: --replay-log: %s\n", e.what());
  }
}

int ScreenshotDriver::finish(AppState& st, int fb_w, int fb_h) {
  write_replay_log();
  const bool timed_out = ImGui::GetTime() - start_ > k_timeout_s;
  int rc = 0;
  std::string err;
  const auto px = read_framebuffer(0, 0, fb_w, fb_h, fb_h);
  // Unfiltered rows: a little larger (UI screenshots compress well either way), and the tests' stdlib-only PNG
  // reader then needs no per-byte Python unfiltering.
  stbi_write_force_png_filter = 0;
  if (!write_png(opt_.screenshot, px, fb_w, fb_h, &err)) {
    std::fprintf(stderr, "diffscope: %s\n", err.c_str());
    rc = 3;
  }
  if (!opt_.export_dir.empty() && st.snap && st.snap->head) {
    // The same exporters the File menu uses, so the tests cover them.
    const std::string d = opt_.export_dir + "/";
    std::vector<std::string> files;
    const auto& r = st.panel_rects["Head"];
    const int x = int(r.x), y = int(r.y), w = std::min(int(r.w), fb_w - x), h = std::min(int(r.h), fb_h - y);
    if (!export_head_npy(st, d + "head", &files, &err) || !export_head_csv(st, d + "head.csv", &err) ||
        !export_session_json(st, d + "session.json", &err) ||
        !write_png(d + "panel_Head.png", read_framebuffer(x, y, w, h, fb_h), w, h, &err)) {
      std::fprintf(stderr, "diffscope: export: %s\n", err.c_str());
      rc = 3;
    }
  }
  // The engine's errors and the UI's own (a --scan-open past the report, a prompt the UI refused) alike.
  const bool error_shown = st.seen_error_seq > 0 || !st.error_line.empty();
  if (!opt_.state_json.empty()) {
    nlohmann::json j = session_json(st);
    j["screenshot"] = opt_.screenshot;
    j["window"] = {fb_w, fb_h};
    j["theme"] = theme_is_dark() ? "dark" : "light";
    j["error_shown"] = error_shown;
    j["error"] = st.error_line;
    j["timed_out"] = timed_out;
    j["has_model"] = bool(st.snap && st.snap->model);
    j["n_tokens"] = st.snap && st.snap->result ? st.snap->result->tokens.size() : 0;
    nlohmann::json panels = nlohmann::json::object();
    for (const auto& [name, r] : st.panel_rects)
      panels[name] = rect_json(r);
    j["panels"] = panels;
    if (st.snap && st.snap->head) {
      const HeadMaps& hm = *st.snap->head;
      const MapView& v = hm.view;
      j["map_rects"] = {
          {"a1", rect_json(st.map_rects[0])}, {"a2", rect_json(st.map_rects[1])}, {"diff", rect_json(st.map_rects[2])}};
      double abs_diff = 0;
      for (float f : v.diff)
        abs_diff += std::fabs(f);
      // Sums and checksums are over the view's grid (the whole map, exactly, for a short prompt at zoom 1).
      j["head_maps"] = {{"layer", hm.layer},
                        {"head", hm.head},
                        {"n", hm.n},
                        {"lambda", hm.lambda},
                        {"differential", hm.differential},
                        {"implicit", hm.implicit},
                        {"window", hm.window},
                        {"kind", st.snap->model ? layer_kind_name(st.snap->model->cfg.kind(hm.layer)) : ""},
                        {"a1_sum", sum(v.a1)},
                        {"a2_sum", sum(v.a2)},
                        {"diff_sum", sum(v.diff)},
                        {"diff_abs_sum", abs_diff},
                        {"a1_checksum", std::to_string(fnv1a(v.a1))},
                        {"diff_checksum", std::to_string(fnv1a(v.diff))}};
      j["head_view"] = {{"q0", v.q0},
                        {"q1", v.q1},
                        {"k0", v.k0},
                        {"k1", v.k1},
                        {"rows", v.rows},
                        {"cols", v.cols},
                        {"pool", v.pool == Pool::Mean ? "mean" : "max"},
                        {"exact", hm.exact()},
                        {"span", st.view.span}};
    }
    if (st.snap && st.snap->row) {
      const RowMaps& rm = *st.snap->row;
      const int h = std::clamp(st.head, 0, int(std::max<int64_t>(1, rm.rows.heads)) - 1);
      const size_t n = size_t(rm.rows.n);
      auto row_sum = [&](const std::vector<float>& v) {
        double s = 0;
        for (size_t k = 0; k < n && !v.empty(); ++k)
          s += v[size_t(h) * n + k];
        return s;
      };
      const int64_t P = st.snap->result && st.snap->result->prompt_len > 0 ? st.snap->result->prompt_len : rm.rows.n;
      j["row_view"] = {{"layer", rm.layer}, {"q", rm.q},         {"head", h},
                       {"n", rm.rows.n},    {"a1_sum", row_sum(rm.rows.a1)}, {"a2_sum", row_sum(rm.rows.a2)},
                       {"generated", rm.q >= P}, {"implicit", rm.implicit}, {"channel", rm.channel}};
      // The selected row when it is a generated position: its place in the continuation (0 = first generated).
      j["selected_generated_row"] = rm.q >= P ? nlohmann::json{{"q", rm.q}, {"index", rm.q - P}} : nlohmann::json(nullptr);
      // A prompt opened from a corpus scan: the answer span and this head's fractions of the row, as the scan
      // measures them (session_scan.h's keys).
      if (const AppState::AnswerMark* ans = st.answer_span()) {
        const Fractions12 fr = row_fractions(rm, h, ans->begin, ans->end);
        nlohmann::json fj = nlohmann::json::object();
        for (int i = 0; i < ds::scan::kNumFractions; ++i)
          if (std::isfinite(fr[size_t(i)]))
            fj[ds::scan::kFractionKeys[i]] = fr[size_t(i)];
        j["row_view"]["answer"] = {{"line", ans->line}, {"begin", ans->begin}, {"end", ans->end}, {"fractions", fj}};
      }
    }
    j["scan"] = scan_json(st);
    j["compare"] = compare_json(st);
    try {
      ds::write_file_safely(opt_.state_json, j.dump(2) + "\n", "the state JSON");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "diffscope: %s\n", e.what());
      rc = 3;
    }
  }
  if (timed_out) {
    std::fprintf(stderr, "diffscope: --screenshot: the run did not complete within %.0f s\n", k_timeout_s);
    return 4;
  }
  if (error_shown) {
    std::fprintf(stderr, "diffscope: %s\n", st.error_line.c_str());
    return rc ? rc : 1;
  }
  return rc;
}

}  // namespace ds::gui
