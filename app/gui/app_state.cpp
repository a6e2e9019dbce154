// UI actions and the reaction to new snapshots. See app_state.h.
#include "app_state.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/plot/plot.h"
#include "engine/core/input_limits.h"

namespace ds::gui {

namespace fs = std::filesystem;

const char* overview_mode_name(OverviewMode m) {
  switch (m) {
    case OverviewMode::A1:
      return "A1 maps";
    case OverviewMode::A2:
      return "A2 maps";
    case OverviewMode::Diff:
      return "A1 - lambda*A2 maps";
    case OverviewMode::EntropyA1:
      return "entropy of A1";
    case OverviewMode::EntropyDiff:
      return "entropy of |A1 - lambda*A2|";
    case OverviewMode::FirstA1:
      return "first-token mass of A1";
    case OverviewMode::FirstDiff:
      return "first-token value of A1 - lambda*A2";
    case OverviewMode::NegMass:
      return "negative mass of A1 - lambda*A2";
    case OverviewMode::EntropyA2:
      return "entropy of A2";
    case OverviewMode::MaxLogit1:
      return "max |logit| of map 1";
    case OverviewMode::MaxLogit2:
      return "max |logit| of map 2";
    case OverviewMode::Importance:
      return "head importance (ablation)";
    default:
      return "?";
  }
}

bool overview_mode_is_map(OverviewMode m) {
  return m == OverviewMode::A1 || m == OverviewMode::A2 || m == OverviewMode::Diff;
}

bool overview_mode_needs_a2(OverviewMode m) {
  return m == OverviewMode::A2 || m == OverviewMode::Diff || m == OverviewMode::EntropyDiff ||
         m == OverviewMode::FirstDiff || m == OverviewMode::NegMass || m == OverviewMode::EntropyA2 ||
         m == OverviewMode::MaxLogit2;
}

// The engine's rule (map_query.h row_mass_of, session_scan.h fractions_of): the numbers a corpus scan reports.
Fractions12 row_fractions(const RowMaps& rm, int head, int64_t begin, int64_t end) {
  Fractions12 f;
  f.fill(NAN);
  const int64_t n = rm.rows.n, q = rm.q;
  if (head < 0 || head >= rm.rows.heads || q < 0 || q >= n)
    return f;
  const float* a1 = rm.rows.a1.data() + size_t(head) * size_t(n);
  const float* a2 = rm.differential && !rm.rows.a2.empty() ? rm.rows.a2.data() + size_t(head) * size_t(n) : nullptr;
  const ds::scan::Fractions fr =
      ds::scan::fractions_of(row_mass_of(a1, a2, q, float(rm.lambda), begin, end), a2 != nullptr);
  for (int i = 0; i < ds::scan::kNumFractions; ++i)
    f[size_t(i)] = ds::scan::fraction(fr, i);
  return f;
}

void AppState::open_model(const std::string& dir) {
  if (dir.empty())
    return;
  if (scanning()) {
    notify("A corpus scan is running: Stop it (Corpus panel) before opening another model.", true);
    return;
  }
  req.open_dir = dir;
  ++req.open_seq;
  submit();
}

std::vector<int32_t> AppState::parse_prompt_ids(std::string* why) const {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&]() {
    if (cur.empty())
      return true;
    try {
      ids.push_back(int32_t(std::stol(cur)));
    } catch (const std::exception&) {
      if (why)
        *why = "'" + cur + "' is not a token id";
      return false;
    }
    cur.clear();
    return true;
  };
  for (char c : prompt.ids) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      cur += c;
    } else if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      if (!flush())
        return {};
    } else {
      if (why)
        *why = std::string("unexpected '") + c + "' in the token ids: use numbers separated by commas";
      return {};
    }
  }
  if (!flush())
    return {};
  if (ids.empty() && why)
    *why = "no token ids: type ids separated by commas, e.g. 1, 17, 42";
  return ids;
}

void AppState::run_prompt() {
  if (!snap || !snap->model) {
    show_error("no model loaded: open a checkpoint folder first (File > Open, or drop a folder on the window)");
    return;
  }
  if (scanning()) {
    notify("A corpus scan is running: the prompt can run when it has finished (or Stop it in the Corpus panel).", true);
    return;
  }
  if (prompt.ids_mode) {
    std::string why;
    auto ids = parse_prompt_ids(&why);
    if (ids.empty()) {
      show_error(why);
      return;
    }
    req.use_ids = true;
    req.ids = std::move(ids);
  } else {
    req.use_ids = false;
    req.text = prompt.text;
  }
  ++req.prompt_seq;
  submit();
}

// The engine's reader (engine/core/input_limits.h), as the CLI reads it: a regular file within the limit, one trailing
// line end dropped.
bool read_prompt_file(const std::string& path, std::string& text, std::string* why) {
  try {
    text = ds::read_prompt_file(path);
    return true;
  } catch (const std::exception& e) {
    if (why)
      *why = e.what();
    return false;
  }
}

bool AppState::open_prompt_file(const std::string& path, std::string* why) {
  std::string text;
  if (!read_prompt_file(path, text, why))
    return false;
  prompt.text = std::move(text);
  prompt.path = path;
  prompt.ids_mode = false;
  if (snap && snap->model)
    run_prompt();
  return true;
}

void AppState::reset_lambda() {
  req.lambda.scale = 1.0;
  std::fill(req.lambda.override_.begin(), req.lambda.override_.end(), std::nullopt);
  submit();
}

bool AppState::ablated(int l, int h) const {
  return std::any_of(req.head_scales.begin(), req.head_scales.end(),
                     [&](const HeadScale& x) { return x.layer == l && x.head == h && x.factor == 0.f; });
}

bool AppState::mean_ablated(int l, int h) const {
  return std::find(req.head_means.begin(), req.head_means.end(), std::pair<int, int>{l, h}) != req.head_means.end();
}

void AppState::toggle_mean(int l, int h) {
  auto& v = req.head_means;
  const auto it = std::find(v.begin(), v.end(), std::pair<int, int>{l, h});
  if (it != v.end()) v.erase(it);
  else v.push_back({l, h});
  submit_now();
}

bool AppState::map_dropped(int l, int h, int map) const {
  for (const HeadMix& x : req.head_mixes)
    if (x.layer == l && x.head == h) return map == 1 ? x.drop_a1 : (x.lambda && *x.lambda == 0.f);
  return false;
}

void AppState::toggle_map(int l, int h, int map) {
  auto& v = req.head_mixes;
  auto it = std::find_if(v.begin(), v.end(), [&](const HeadMix& x) { return x.layer == l && x.head == h; });
  if (it == v.end()) it = v.insert(v.end(), HeadMix{l, h});
  if (map == 1) it->drop_a1 = !it->drop_a1;
  else it->lambda = it->lambda && *it->lambda == 0.f ? std::nullopt : std::optional<float>(0.f);
  if (!it->drop_a1 && !it->lambda) v.erase(it);
  submit_now();
}

void AppState::toggle_ablation(int l, int h) {
  auto& v = req.head_scales;
  const auto it = std::find_if(v.begin(), v.end(), [&](const HeadScale& x) { return x.layer == l && x.head == h; });
  if (it != v.end())
    v.erase(it);
  else
    v.push_back({l, h, 0.f});
  submit_now();
}

void AppState::set_lambda_scale(double s) {
  req.lambda.scale = s;
  submit_now();
}

void AppState::select_head(int l, int h) {
  if (snap && snap->model) {
    // GMU layers have no map of any kind: step over them; Mamba layers show a channel's implicit attention, so the
    // head index is a channel there
    const ModelConfig& c = snap->model->cfg;
    l = int(c.nearest_view_layer(l, l < layer ? -1 : 1));
    h = std::clamp(h, 0, int(c.has_scan(l) ? c.d_inner : c.view_heads()) - 1);
  }
  if (l == layer && h == head)
    return;
  layer = l;
  head = h;
  req.layer = l;
  req.head = h;
  view = HeadView{};
  submit();
}

void AppState::select_row(int64_t q) {
  row_scroll = true;
  show_row = true;
  if (q == row && req.row == q)
    return;
  row = q;
  req.row = q;
  submit();
}

GenerateOptions AppState::gen_options() const {
  GenerateOptions o = generation.options;
  o.sampling.temperature = generation.sample ? generation.temperature : 0.0;
  return o;
}

bool AppState::can_generate() const {
  return snap && snap->model && snap->result && !snap->loading && !(snap->gen && snap->gen->streaming) && !scanning();
}

// [SECTION] corpus scan
bool AppState::scanning() const {
  if (req.scan_seq == 0)
    return false;
  const auto& sc = snap ? snap->scan : nullptr;
  return !sc || sc->seq != req.scan_seq || sc->running;
}

void AppState::start_scan() {
  if (scanning())
    return;
  if (!snap || !snap->model || snap->loading) {
    show_error("no model loaded: open a model first, then scan a corpus");
    return;
  }
  if (corpus.opts.path.empty()) {
    notify("Type the path of a JSONL corpus first (one JSON object a line).", true);
    return;
  }
  req.scan = corpus.opts;
  req.scan.stop_after = corpus.stop_after;
  req.scan_stop_base = req.scan_stop_seq;
  ++req.scan_seq;
  corpus.answer_mark.reset();
  corpus.open_row = -1;
  if (!corpus.opts.compare && corpus.view != 0)
    corpus.view = 0;
  if (!show_corpus)
    raise_corpus = true;
  show_corpus = true;
  submit();
}

void AppState::stop_scan() {
  if (!scanning())
    return;
  ++req.scan_stop_seq;
  submit();
}

bool AppState::open_scan_prompt(int row, std::string* why) {
  const auto fail = [&](const std::string& w) {
    if (why)
      *why = w;
    return false;
  };
  const auto& sc = snap ? snap->scan : nullptr;
  if (!sc || !sc->report)
    return fail("no corpus scan to open a prompt from: scan a corpus first");
  if (scanning())
    return fail("the scan is still running: open a prompt when it has finished (or Stop it)");
  if (!snap->model)
    return fail("no model loaded");
  const ScanReport& rep = *sc->report;
  const auto& rows = rep.run.rows;
  const int n = int(rows.size());
  const int i = row < 0 ? row + n : row;
  if (i < 0 || i >= n)
    return fail("prompt " + std::to_string(row) + ": the scan has " + std::to_string(n) +
                (n == 1 ? " prompt" : " prompts") + (n ? " (0.." + std::to_string(n - 1) + ")" : ""));
  const ScanRunView::Row& r = rows[size_t(i)];
  const ds::scan::Prompt* p = sc->prompt_at_line(r.line);
  if (!p)
    return fail("line " + std::to_string(r.line) + " is not in the corpus any more");
  if (p->is_text && !snap->model->has_tokenizer)
    return fail("line " + std::to_string(r.line) + " is text, and this model has no tokenizer");
  if (p->is_text) {
    prompt.text = p->text;
    prompt.ids_mode = false;
  } else {
    prompt.ids.clear();
    for (size_t k = 0; k < p->ids.size(); ++k)
      prompt.ids += (k ? ", " : "") + std::to_string(p->ids[k]);
    prompt.ids_mode = true;
  }
  // The lambda the prompt was scanned with (the compare run's when the panel shows it), without per-layer
  // overrides: then the row view's answer mass is the scan's.
  const double scale = corpus.view == 1 && rep.has_compare ? sc->options.compare_scale : sc->options.lambda_scale;
  bool lambda_moved = req.lambda.scale != scale;
  for (auto& o : req.lambda.override_) {
    lambda_moved |= o.has_value();
    o.reset();
  }
  req.lambda.scale = scale;
  run_prompt();
  select_row(r.tokens - 1);
  corpus.answer_mark = AnswerMark{req.use_ids, req.use_ids ? std::string() : req.text, req.use_ids ? req.ids : std::vector<int32_t>{},
                           r.line, r.tokens, r.answer_begin, r.answer_end};
  corpus.open_row = i;
  char buf[200];
  std::snprintf(buf, sizeof buf, "Opened line %d: %lld tokens, answer span %lld..%lld", r.line, (long long)r.tokens,
                (long long)r.answer_begin, (long long)r.answer_end - 1);
  std::string msg = buf;
  if (lambda_moved && snap->model->cfg.is_diff()) {
    std::snprintf(buf, sizeof buf, ", %s x%g as scanned", lam(), scale);
    msg += buf;
  }
  // A prompt of a scan of another model (the twin, say) opens too; the numbers of the report are that model's.
  const std::string scanned = rep.report.run.model;
  std::error_code ec;
  if (!scanned.empty() && !fs::equivalent(scanned, snap->model->dir, ec))
    msg += " (scanned with " + (fs::path(scanned).filename().empty() ? fs::path(scanned).parent_path() : fs::path(scanned)).filename().string() + ")";
  notify(msg);
  return true;
}

const AppState::AnswerMark* AppState::answer_span() const {
  if (!corpus.answer_mark || !snap || !snap->result || req.use_ids != corpus.answer_mark->use_ids ||
      (req.use_ids ? req.ids != corpus.answer_mark->ids : req.text != corpus.answer_mark->text))
    return nullptr;
  return snap->result->prompt_len == corpus.answer_mark->tokens ? &*corpus.answer_mark : nullptr;
}

// The scan's report through `write` (a writer of session_scan.h or plot.h that throws naming the file); `none`:
// why nothing was written when there is no report yet.
template <class W>
static bool save_scan_file(const AppState& st, const std::string& path, std::string* why, const char* none,
                           W&& write) {
  const auto& sc = st.snap ? st.snap->scan : nullptr;
  if (!sc || !sc->report) {
    if (why)
      *why = none;
    return false;
  }
  try {
    write(sc->report->report, path);
  } catch (const std::exception& e) {
    if (why)
      *why = e.what();
    return false;
  }
  return true;
}

bool AppState::save_scan_report(const std::string& path, std::string* why) const {
  return save_scan_file(*this, path, why, "no report to save yet: scan a corpus first",
                        [](const ds::scan::Report& r, const std::string& p) { ds::scan::write_json_atomic(r, p); });
}

bool AppState::save_scan_plot(const std::string& path, std::string* why) const {
  return save_scan_file(*this, path, why, "no report to plot yet: scan a corpus first",
                        [](const ds::scan::Report& r, const std::string& p) { ds::scan::write_plot_png(r, p); });
}

const GenerateOptions* AppState::last_generate_options() const {
  if (!snap || !snap->gen)
    return nullptr;
  const Generation& g = *snap->gen;
  if (!g.now.empty())
    return &g.now.options;
  return g.before ? &g.before->options : nullptr;
}

namespace {
void send_generation(AppState& st, GenCommand c, const GenerateOptions& o) {
  st.generation.tail_steps = c == GenCommand::Step ? st.generation.tail_steps + 1 : 0;
  st.req.gen_cmd = c;
  st.req.gen = o;
  st.req.gen_steps = std::max(1, st.generation.tail_steps);
  ++st.req.gen_seq;
  st.submit();
}
}  // namespace

void AppState::generate() {
  if (!can_generate())
    return;
  send_generation(*this, GenCommand::Start, gen_options());
}

void AppState::regenerate() {
  const GenerateOptions* o = last_generate_options();
  if (!can_generate() || !o)
    return;
  send_generation(*this, GenCommand::Start, *o);
}

void AppState::generate_step() {
  if (!can_generate())
    return;
  send_generation(*this, GenCommand::Step, gen_options());
}

void AppState::stop_generation() {
  send_generation(*this, GenCommand::Stop, req.gen);
}

void AppState::clear_generation() {
  if (!can_generate())
    return;
  send_generation(*this, GenCommand::Clear, req.gen);
}

void AppState::notify(const std::string& text, bool error) {
  toast.text = text;
  toast.error = error;
  toast.until = ImGui::GetTime() + (error ? 6.0 : 3.5);
}

void AppState::show_error(const std::string& line) {
  error_line = line;
  open_error_modal = true;
}

std::string AppState::default_prompt() const {
  std::ifstream f(fs::path(assets_dir) / "models" / "default_prompt.txt");
  if (f) {
    std::stringstream ss;
    ss << f.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r'))
      s.pop_back();
    if (!s.empty())
      return s;
  }
  // A retrieval prompt in the demo model's training format (tools/demo_data.py, "needle"): one fact among
  // near-duplicate distractors and filler, then the question. The answer is " 4729".
  return "The pass code of the blue door is 4729. The function returns a list of the matching entries. "
         "The pass code of the red door is 1185. This option is ignored when the file does not exist. "
         "The pass code of the blue gate is 6032. Question: what is the pass code of the blue door? Answer:";
}

std::string AppState::default_ids(int64_t vocab) const {
  // A pattern that repeats (so induction-style heads have something to find), drawn deterministically from the
  // vocabulary: BOS-like id 1, twelve ids, then the same twelve again.
  std::vector<int64_t> base;
  uint32_t x = 12345;
  const int64_t v = std::max<int64_t>(vocab, 8);
  for (int i = 0; i < 12; ++i) {
    x = x * 1664525u + 1013904223u;
    base.push_back(3 + int64_t(x >> 8) % (v - 3));
  }
  std::string s = "1";
  for (int rep = 0; rep < 2; ++rep)
    for (int64_t id : base)
      s += ", " + std::to_string(id);
  return s;
}

std::string AppState::export_path(const std::string& stem, const std::string& ext) const {
  const std::time_t t = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  const fs::path dir = settings.export_dir.empty() ? fs::current_path() : fs::path(settings.export_dir);
  const std::string base = "diffscope_" + stem + "_" + stamp;
  fs::path p = dir / (base + "." + ext);
  std::error_code ec;
  for (int i = 2; fs::exists(p, ec); ++i)
    p = dir / (base + "-" + std::to_string(i) + "." + ext);  // same second
  return p.string();
}

void AppState::absorb_snapshot() {
  if (!snap)
    return;
  if (snap->error_seq != seen_error_seq) {
    seen_error_seq = snap->error_seq;
    show_error(snap->error);
    refusal_line = snap->error_refusal ? snap->error : std::string();
  }
  if (!snap->refused && !refusal_line.empty()) {  // every refused intervention removed: its error is gone too
    if (error_line == refusal_line) error_line.clear();
    refusal_line.clear();
  }
  if (snap->model && snap->model->seq != seen_model_seq) {
    const ModelInfo& m = *snap->model;
    const bool first_model = seen_model_seq == 0;
    seen_model_seq = m.seq;
    path_input = m.dir;
    settings.add_recent(m.dir);
    if (persist)
      save_settings(settings);
    // Lambda controls sized to this model; the global scale survives a model change.
    req.lambda.override_.assign(size_t(m.cfg.layers), std::nullopt);
    if (!first_model)
      req.head_scales.clear(), req.head_mixes.clear(), req.head_means.clear(), req.knockouts.clear();  // another model's (--ablate: the first)
    // The command line's interventions against this model: a bad one is dropped from the request with an error
    // naming its flag (the others run)
    std::vector<std::string> bad;
    for (const PendingHeadEdit& x : pending_head_edits) {
      try {
        if (x.mode != "head" && x.mode != "mean" && !m.cfg.is_diff())
          throw Error(std::string("this model's heads are not differential (one map a head): ") +
                      (x.mode == "lambda" ? "no lambda of their own" : "no A1 or A2 to drop"));
        check_view_head(m.cfg, x.layer, x.head, x.mode == "lambda" ? "heads with a lambda" : "heads to ablate");
      } catch (const std::exception& e) {
        bad.push_back(x.flag + ": " + e.what());
        auto at = [&](const auto& v) { return v.layer == x.layer && v.head == x.head; };
        if (x.mode == "head") std::erase_if(req.head_scales, at);
        else if (x.mode == "mean") std::erase(req.head_means, std::pair<int, int>{x.layer, x.head});
        else std::erase_if(req.head_mixes, at);
      }
    }
    pending_head_edits.clear();
    for (const std::string& k : pending_knockouts) {
      try {
        const Knockout ko = parse_knockout(k, int(m.cfg.layers));
        try {
          check_knockout(m.cfg, ko);  // (its spans against the prompt: the worker, which has it)
        } catch (const std::exception& e) {
          throw Error("knockout " + k + ": " + e.what());
        }
        req.knockouts.push_back(ko);
      } catch (const std::exception& e) {
        bad.push_back("--" + std::string(e.what()));  // "knockout SPEC: ..."
      }
    }
    pending_knockouts.clear();
    if (!bad.empty()) {
      std::string line = bad[0];
      for (size_t i = 1; i < bad.size(); ++i) line += "; " + bad[i];
      show_error(line);
    }
    if (pending_scale) {
      req.lambda.scale = *pending_scale;
      pending_scale.reset();
    }
    if (first_model && asked_head) {
      const auto [al, ah] = *asked_head;
      asked_head.reset();
      const int heads = al < int(m.cfg.layers) ? int(m.cfg.has_scan(al) ? m.cfg.d_inner : m.cfg.view_heads()) : 0;
      if (al >= int(m.cfg.layers))
        show_error("--head " + std::to_string(al) + "." + std::to_string(ah) + ": layer " + std::to_string(al) +
                   " does not exist (the model has " + std::to_string(m.cfg.layers) + " layers)");
      else if (ah >= heads)
        show_error("--head " + std::to_string(al) + "." + std::to_string(ah) + ": head " + std::to_string(ah) +
                   " does not exist (layer " + std::to_string(al) + " has " + std::to_string(heads) + ")");
    }
    layer = int(m.cfg.nearest_view_layer(layer));
    head = std::clamp(head, 0, int(m.cfg.has_scan(layer) ? m.cfg.d_inner : m.cfg.view_heads()) - 1);
    req.layer = layer;
    req.head = head;
    if (!first_model)
      view = HeadView{};  // the first model keeps the view --view asked for
    if (!m.has_tokenizer) {
      prompt.ids_mode = true;
      if (prompt.ids.empty())
        prompt.ids = default_ids(m.cfg.vocab);
    }
    run_prompt();
  }
  if (snap->result && snap->result->seq != seen_result_seq) {
    seen_result_seq = snap->result->seq;
    const int64_t n = int64_t(snap->result->ids.size());
    if (asked_row) {
      if (*asked_row >= n + asked_row_extra || *asked_row < -n)
        show_error("--row " + std::to_string(*asked_row) + ": the prompt has " + std::to_string(n) + " tokens" +
                   (asked_row_extra ? " (and --generate adds at most " + std::to_string(asked_row_extra) + ")" : ""));
      asked_row.reset();
    }
    if (asked_view) {
      const auto& v = *asked_view;
      if (v[0] >= n || v[2] >= n)
        show_error("--view " + std::to_string(v[0]) + ":" + std::to_string(v[1]) + "," + std::to_string(v[2]) + ":" +
                   std::to_string(v[3]) + ": the rectangle starts past the prompt's " + std::to_string(n) + " tokens");
      asked_view.reset();
    }
    const Profile& p = snap->result->profile;
    HistoryPoint h;
    h.forward_ms = float(p.forward_ms);
    h.tokens_per_s = p.forward_ms > 0 ? float(double(snap->result->tokens_run()) / (p.forward_ms * 1e-3)) : 0.0f;
    double flops = 0, ms = 0;
    for (const auto& hd : p.heads) {
      flops += hd.flops;
      ms += hd.ms;
    }
    h.attn_tflops = ms > 0 ? float(flops / (ms * 1e-3) / 1e12) : 0.0f;
    history.push_back(h);
    if (history.size() > 240)
      history.erase(history.begin());
    ++runs_seen;
  }
  // --generate N: once the first run of the first model is in, generate with the options the flags set; then,
  // with --regenerate-lambda-scale, change lambda and regenerate when that generation has stopped.
  if (generation.pending > 0 && snap->model && snap->result && snap->result->model_seq == snap->model->seq &&
      !snap->loading) {
    generation.options.max_new = generation.pending;
    generation.pending = 0;
    generate();
    generation.started = true;
  } else if (generation.pending_regenerate_scale && generation.started && snap->gen && !snap->gen->streaming &&
             !snap->gen->now.empty() && !snap->gen->now.stop_reason.empty() && worker && worker->idle()) {
    req.lambda.scale = *generation.pending_regenerate_scale;
    generation.pending_regenerate_scale.reset();
    regenerate();
  }
  // --scan FILE: once the model is in and the worker has served its first prompt (run or refused); then
  // --scan-report, --scan-plot and --scan-open when the scan has finished.
  if (corpus.pending && snap->model && seen_model_seq == snap->model->seq && !snap->loading && !req_dirty && worker &&
      worker->idle()) {
    corpus.opts.path = *corpus.pending;
    corpus.pending.reset();
    start_scan();
  }
  const auto& sc = snap->scan;
  if (req.scan_seq != 0 && sc && sc->seq == req.scan_seq && !sc->running &&
      (corpus.pending_open || !corpus.pending_report.empty() || !corpus.pending_plot.empty())) {
    std::string why;
    if (!sc->report) {  // the scan could not run: its error is on screen already
      corpus.pending_open.reset();
      corpus.pending_report.clear();
      corpus.pending_plot.clear();
    }
    if (!corpus.pending_report.empty()) {
      if (save_scan_report(corpus.pending_report, &why))
        notify("Wrote " + corpus.pending_report);
      else
        show_error("--scan-report: " + why);
      corpus.pending_report.clear();
    }
    if (!corpus.pending_plot.empty()) {
      if (save_scan_plot(corpus.pending_plot, &why))
        notify("Wrote " + corpus.pending_plot);
      else
        show_error("--scan-plot: " + why);
      corpus.pending_plot.clear();
    }
    if (corpus.pending_open) {
      if (!open_scan_prompt(*corpus.pending_open, &why))
        show_error("--scan-open: " + why);
      corpus.pending_open.reset();
    }
  }
}

}  // namespace ds::gui
