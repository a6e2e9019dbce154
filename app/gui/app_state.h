// The UI's state: the request it wants the engine in, the snapshot it draws this frame, selections, view options,
// derived GL textures (rebuilt only when their inputs change) and the actions panels share (open a model, run the
// prompt, reset lambda). Panels read and write this; only app_state.cpp talks to the Worker.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <imgui.h>

#include "gl_texture.h"
#include "heatmap_image.h"
#include "settings.h"
#include "snapshot.h"
#include "worker.h"

namespace ds::gui {

// Appended modes keep the indices settings.json remembers.
enum class OverviewMode {
  A1, A2, Diff, EntropyA1, EntropyDiff, FirstA1, FirstDiff, NegMass, EntropyA2, MaxLogit1, MaxLogit2, Importance,
  Count
};
const char* overview_mode_name(OverviewMode m);
// The whole file as prompt text, one trailing newline dropped; false with *why when it cannot be read.
bool read_prompt_file(const std::string& path, std::string& text, std::string* why);
bool overview_mode_is_map(OverviewMode m);
bool overview_mode_needs_a2(OverviewMode m);  // not shown for Llama models

// The twelve fractions of session_scan.h (answer / sink / context of A1, A2, A1 - lambda*A2 and its absolute value)
// of one head's row in the row view, for the answer span [begin, end): what the corpus scan measured, recomputed
// from the exact row (NaN where a map is absent or a denominator is zero).
Fractions12 row_fractions(const RowMaps& rm, int head, int64_t begin, int64_t end);
// The Compare panel's columns sink, answer, rest of map m (0: A1 or A, 1: A2, 2: A1 - lambda*A2) in those fractions.
inline std::array<double, 3> sink_answer_rest(const Fractions12& f, int m) {
  return {f[size_t(4 + m)], f[size_t(m)], f[size_t(8 + m)]};  // the parts answer, sink, context of session_scan.h
}

// Linked zoom, pan and hover of the three head maps, in token coordinates. The panel turns this into the visible
// rectangle and asks the engine for it (Request::view); the last image stays on screen until the new one comes.
struct HeadView {
  double span = 0;                         // tokens along each side of the square; 0 = the whole map
  double cq = -1, ck = -1;                 // centre of the view (query, key), in tokens; -1 = the map's centre
  int64_t hover_q = -1, hover_k = -1;      // token under the mouse in any of the three maps
  bool locked = false;                     // click locks the cursor token; click again unlocks
  int64_t lock_q = -1, lock_k = -1;
};

struct HeadTextures {
  std::shared_ptr<const HeadMaps> source;
  uint64_t style_key = 0;
  GlTexture tex[3];      // A1, A2, A1 - lambda*A2: one texel per grid cell of source->view
  HeatmapImage meta[3];  // size and scale of each (pixels dropped after upload)
};

struct OverviewTexture {
  std::shared_ptr<const Overview> source;
  uint64_t style_key = 0;
  GlTexture atlas;  // [L * tile, Hv * tile]
  int tile = 0, rows = 0, cols = 0;
  ColorScale scale;
};

// One entry per completed run, for the profiler's rolling plots.
struct HistoryPoint {
  float forward_ms = 0, tokens_per_s = 0, attn_tflops = 0;
};

struct Toast {
  std::string text;
  double until = 0;
  bool error = false;
};

struct PanelRect {
  float x = 0, y = 0, w = 0, h = 0;  // framebuffer pixels, origin top left
};

// The prompt panel's own state.
struct PromptPanelState {
  std::string text, ids;
  bool ids_mode = false;
  std::string path;        // File > Open prompt...: the path field
  bool open_popup = false;  // open the popup next frame
  bool focus = false;
};

// The Generate panel's own state: what Generate and Step use.
struct GeneratePanelState {
  // max new tokens, top-k, top-p, seed, stop at EOS; the temperature comes from the two fields below
  GenerateOptions options = [] {
    GenerateOptions o;
    o.max_new = 32;
    return o;
  }();
  bool sample = false;       // sample instead of greedy
  double temperature = 0.8;  // the temperature when sampling
  int tail_steps = 0;        // Step commands sent since the last other generation command (Request::gen_steps)
  int pending = 0;           // --generate N: generate N tokens once the first run is in
  std::optional<double> pending_regenerate_scale;  // --regenerate-lambda-scale X: then lambda scale X, Regenerate
  bool started = false;      // --generate was sent (the screenshot waits for it to finish)
};

// The Corpus panel's own state (the scan itself runs on the worker, worker_scan.cpp).
struct CorpusPanelState {
  ScanOptions opts;  // the panel's file and options (path, lambda scale, compare)
  bool focus_path = false;
  std::optional<std::string> pending;  // --scan FILE: started once the first prompt of the first model ran
  std::optional<int> pending_open;     // --scan-open K: open the K-th prompt once the scan has finished
  std::string pending_report, pending_plot;  // --scan-report / --scan-plot: saved once it has finished
  int stop_after = 0;   // --scan-stop-after N (tests): the worker stops after N prompts
  int view = 0;         // what the panel shows: 0 the first run, 1 the compare run, 2 their difference
  int open_row = -1;    // the report row opened in the views (-1: none)
  int part = 0;         // heatmap and table: 0 answer, 1 sink, 2 context
  int map = 2;          // 0 A1, 1 A2, 2 A1 - lambda*A2, 3 |A1 - lambda*A2| (plain models: A1)
  PanelRect heat_rect;  // last frame's layer x head heatmap (framebuffer pixels; state JSON)
  // The answer span of the prompt opened from a scan, marked in the token list, the row view and the head view
  // while that prompt is the one on screen.
  struct AnswerMark {
    bool use_ids = false;  // the prompt as it was sent (Request::use_ids / text / ids): the mark holds while the
    std::string text;      // prompt on screen is this one
    std::vector<int32_t> ids;
    int line = 0;                            // its corpus line
    int64_t tokens = 0, begin = 0, end = 0;  // prompt length and the span [begin, end), token positions
  };
  std::optional<AnswerMark> answer_mark;
};

// The Compare panel (panel_compare.cpp): a second model on its own worker, given the main result's token ids (the
// models share a tokenizer), its row on the main row view's query, its outliers beside the main model's.
struct ComparePanelState {
  std::unique_ptr<Worker> worker;        // made by the first open_compare(); reset by close_compare()
  Request req;                           // what the second worker was last sent
  std::shared_ptr<const Snapshot> snap;  // taken once per frame (AppState::sync_compare)
  std::string path;                      // the panel's path field
  std::string error;                     // its last error (shown in the panel, not the main banner)
  uint64_t seen_model_seq = 0, seen_error_seq = 0;
  int head = -1;            // the second model's head in the row plots (-1: the main view's head index)
  std::string answer;       // the answer span field, "B:E" token positions (empty: the corpus mark, else none)
  std::string answer_error; // why the field does not parse
  bool raise = false;
};

struct AppState {
  // --- engine link
  Worker* worker = nullptr;
  std::function<void()> wake;      // what a worker calls when it publishes (main.cpp: glfwPostEmptyEvent)
  std::vector<BackendChoice> backends;  // --backend, --threads, --gpu-mem-limit: the Compare panel's worker takes the same
  int cpu_threads = 0;
  int64_t gpu_mem_limit = 0;
  std::shared_ptr<const Snapshot> snap;  // taken once per frame
  Request req;
  bool req_dirty = false;
  bool focus_max_abs = false;  // --max-abs-hidden: the Profiler opens on its "max |h|" tab
  void submit() { req_dirty = true; }  // sent once at the end of the frame (coalesces widget drags)
  // A lambda drag is sent at once, not at the end of the frame: the worker shows the head view under the new value
  // (and stops the run of the previous one) a frame sooner; it serves only the newest request either way.
  void submit_now() {
    if (worker) {
      worker->submit(req);
      req_dirty = false;
    } else {
      req_dirty = true;
    }
  }

  // --- persistence and look
  Settings settings;
  bool persist = true;  // false in --screenshot runs
  bool greek = true;    // the loaded font has a lambda glyph
  const char* lam() const { return greek ? "\xce\xbb" : "lambda"; }
  std::string assets_dir;

  // --- model panel
  std::string path_input;
  bool focus_path = false;
  uint64_t seen_model_seq = 0, seen_error_seq = 0, seen_result_seq = 0;
  std::string error_line;  // shown in the banner and the modal
  std::string refusal_line;  // error_line's text when it is about refused interventions (Snapshot::refused)
  bool open_error_modal = false;
  std::optional<double> pending_scale;  // --lambda-scale, applied to the first model
  std::vector<std::string> pending_knockouts;  // --knockout, parsed against the first model's layers
  // --ablate / --head-lambda as given (already in req), checked against the first model: a bad one leaves req with
  // an error that names its flag
  struct PendingHeadEdit {
    std::string flag;  // "--ablate 3.1:a2"
    int layer = 0, head = 0;
    std::string mode;  // head | mean | a1 | a2 | lambda
  };
  std::vector<PendingHeadEdit> pending_head_edits;
  // --head, --row and --view as given, checked against the first model and prompt: out of range is said in the
  // banner (the view then shows the nearest thing there is), never silently clamped.
  std::optional<std::pair<int, int>> asked_head;
  std::optional<int64_t> asked_row;
  int64_t asked_row_extra = 0;  // --generate N: the row may name one of the N positions to come
  std::optional<std::array<int64_t, 4>> asked_view;

  // --- prompt panel (panel_prompt.cpp)
  PromptPanelState prompt;

  // --- generation (panel_generate.cpp)
  GeneratePanelState generation;

  // --- corpus analysis (panel_corpus.cpp; the scan runs on the worker, worker_scan.cpp)
  CorpusPanelState corpus;

  // --- a second model side by side (panel_compare.cpp)
  ComparePanelState compare;
  bool show_compare = false;  // over the overview and lambda panels, as the Corpus panel
  void open_compare(const std::string& dir);
  void close_compare();
  // Once per frame after absorb_snapshot: takes the second worker's snapshot and sends it the main result's ids,
  // row, layer and head when they changed (not while a generation streams: it follows when it stops).
  void sync_compare();
  bool compare_ready() const;  // the second model is open and shows what the main view shows (or its error)
  // The answer span the Compare panel measures the row's masses on: its field, else the corpus mark on screen.
  std::optional<std::pair<int64_t, int64_t>> compare_answer() const;

  // --- selection and views
  int layer = 0, head = 0;
  HeadView view;
  int64_t row = -1;        // the row view's query position (-1: the last token)
  int row_color = 0;       // row view text colour: 0 difference, 1 A1, 2 A2
  bool row_scroll = true;  // scroll the row view's text to the query once
  OverviewMode ov_mode = OverviewMode::A1;
  HeadTextures head_tex;
  OverviewTexture ov_tex;
  std::vector<HistoryPoint> history;  // most recent last, capped
  int64_t runs_seen = 0;

  // --- panels and layout
  bool show_model = true, show_prompt = true, show_generate = true, show_overview = true, show_head = true, show_lambda = true,
       show_profiler = true, show_row = true, show_shortcuts = false, show_imgui_demo = false;
  bool show_corpus = false;  // over the overview and lambda panels when shown (View > Corpus, File > Scan corpus...)
  bool raise_corpus = false;  // bring the Corpus panel to the front next frame
  bool reset_layout = false;
  std::map<std::string, PanelRect> panel_rects;  // last frame's panel rectangles (PNG export, state JSON)
  PanelRect map_rects[3];                        // last frame's A1 / A2 / difference image rectangles
  float fb_scale = 1.0f;                         // framebuffer pixels per ImGui unit

  // --- export and feedback
  std::string capture_panel, capture_path;  // a PNG capture of this panel after the frame is rendered
  Toast toast;
  bool quit = false;

  // --- actions
  void open_model(const std::string& dir);
  void run_prompt();
  void reset_lambda();
  // Head interventions (the head panel's "ablate" box, --ablate): whether view head h of layer l is ablated, and
  // turning that on or off (a re-run from layer l).
  bool ablated(int l, int h) const;
  void toggle_ablation(int l, int h);
  // The head panel's -A1 / -A2 boxes (map 1 or 2 of view head h of layer l dropped), and turning one over.
  bool map_dropped(int l, int h, int map) const;
  bool mean_ablated(int l, int h) const;
  void toggle_mean(int l, int h);
  void toggle_map(int l, int h, int map);
  char knockout_input[64] = {};  // the Lambda panel's knockout field
  bool focus_outliers = false;   // --outliers: the Profiler opens on its outliers tab
  void set_lambda_scale(double s);
  void select_head(int layer, int head);
  void select_row(int64_t q);  // the row view's query (negative counts from the end)
  // Generation (the worker carries them out between steps; see GenCommand).
  GenerateOptions gen_options() const;  // the panel's options as the engine takes them
  bool can_generate() const;            // a model and a result, no generation streaming
  void generate();                      // from the prompt, with the panel's options, streaming
  void regenerate();                    // again with the options of the last continuation (under today's lambda)
  void generate_step();                 // one token (begins a generation when none is active)
  void stop_generation();
  void clear_generation();
  // The options of the continuation shown (or the one before it, after Clear); null when there is none.
  const GenerateOptions* last_generate_options() const;
  // Corpus scan (the worker serves nothing else while it runs: prompts, generation and model changes are refused
  // with a message, selections wait).
  bool scanning() const;   // a scan was asked for and has not finished
  void start_scan();       // scan_opts.path with scan_opts
  void stop_scan();        // between prompts; what was done stays
  // Opens row `row` of the scan's report (negative counts from the end) in the views: its prompt (text or ids) at
  // the lambda it was scanned with, the row view on its last token, the answer span marked. False with *why.
  bool open_scan_prompt(int row, std::string* why);
  using AnswerMark = CorpusPanelState::AnswerMark;
  const AnswerMark* answer_span() const;  // answer_mark when the result on screen is that prompt's
  bool save_scan_report(const std::string& path, std::string* why) const;  // JSON (write_json_atomic)
  bool save_scan_plot(const std::string& path, std::string* why) const;    // PNG (write_plot_png)
  void notify(const std::string& text, bool error = false);
  void show_error(const std::string& line);
  // Call once per frame after taking the snapshot: reacts to a new model, result or error.
  void absorb_snapshot();
  std::vector<int32_t> parse_prompt_ids(std::string* why) const;
  // Reads a prompt file into the prompt text (one trailing newline dropped) and runs it; false with *why when it
  // cannot be read.
  bool open_prompt_file(const std::string& path, std::string* why);
  std::string default_prompt() const;
  std::string default_ids(int64_t vocab) const;
  std::string export_path(const std::string& stem, const std::string& ext) const;
};

}  // namespace ds::gui
