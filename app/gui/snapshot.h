// What the engine thread publishes for the UI: an immutable picture of the session after its latest step. The UI
// takes one shared_ptr<const Snapshot> per frame under one lock, so no engine object is ever touched by two
// threads. Heavy parts sit behind their own shared_ptrs: a snapshot that only updates the loading progress copies
// pointers, not maps. No ImGui or GL here.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/backend.h"
#include "engine/core/config.h"
#include "engine/session/session.h"
#include "engine/session/session_importance.h"
#include "engine/session/session_lens.h"
#include "engine/session/session_outliers.h"
#include "engine/session/session_quantize.h"
#include "engine/session/session_scan.h"

namespace ds::gui {

// Per-head statistics are the engine's (ds::HeadStats in engine/core/map_query.h, from Backend::head_stats): one
// definition for the GUI, the CLI and the tests. Map-2 fields are NaN for plain (Llama) heads.

// Miniature of one head's maps for the overview grid: the whole map mean-pooled by the engine (map_view).
struct Thumb {
  int size = 0;
  std::vector<float> a1, a2, diff;  // [size, size]; a2 empty for Llama, where diff = a1
};

struct LayerSummary {
  double lambda = 0;
  std::vector<HeadStats> heads;  // [Hv]; empty until computed
  std::vector<Thumb> thumbs;     // [Hv]; empty when the prompt is too long for thumbnails
};

// The overview grid of one result: statistics of every layer, filled layer by layer (published as they come).
struct Overview {
  uint64_t result_seq = 0;
  int64_t n = 0;                     // tokens
  std::vector<LayerSummary> layers;  // [L]
  std::string note;                  // what is missing and why (e.g. no thumbnails for a long prompt)
  bool complete = false;
};

// The head view's maps: the rectangle [q0, q1) x [k0, k1) of one head that the UI asked for, pooled by the engine
// (Backend::map_view) to at most the panel's pixels; exact (one cell per token) when the rectangle fits.
struct HeadMaps {
  uint64_t result_seq = 0;
  int layer = -1, head = -1;
  int64_t n = 0;
  double lambda = 0;
  bool differential = true;  // false for Llama: a1 is the only map and diff == a1
  // A Mamba layer's scan: `head` is a channel and a1 = diff = its implicit attention M (signed; Backend::mamba_view)
  bool implicit = false;
  int64_t window = 0;        // sliding-window layers: keys a query sees (0: all earlier keys)
  MapView view;              // a1, a2, diff [rows, cols], row = query block, column = key block
  bool exact() const { return view.rows == view.q1 - view.q0 && view.cols == view.k1 - view.k0; }
  // Block arithmetic of map_query.h: first token of row block i / column block j (i = rows gives q1), and the
  // block holding a token.
  int64_t row_start(int i) const { return view.q0 + view_block_start(i, view.q1 - view.q0, view.rows); }
  int64_t col_start(int j) const { return view.k0 + view_block_start(j, view.k1 - view.k0, view.cols); }
  int row_of(int64_t q) const { return view_block(q - view.q0, view.q1 - view.q0, view.rows); }
  int col_of(int64_t k) const { return view_block(k - view.k0, view.k1 - view.k0, view.cols); }
  bool contains(int64_t q, int64_t k) const { return q >= view.q0 && q < view.q1 && k >= view.k0 && k < view.k1; }
};

// The row view: the exact attention rows of one query position in one layer, every head (Backend::map_rows).
struct RowMaps {
  uint64_t result_seq = 0;
  int layer = -1;
  int64_t q = -1;    // the query position
  double lambda = 0;  // the layer's lambda (D = A1 - lambda*A2; 0 for Llama, where D = A1)
  bool differential = true;
  // A Mamba layer: the row of one channel's implicit attention M (rows.heads = 1, a1 = M's row, signed)
  bool implicit = false;
  int channel = -1;
  MapRows rows;  // a1 / a2 [heads, 1, n]
};

struct ModelInfo {
  uint64_t seq = 0;  // 1, 2, ... per successful open
  std::string dir;
  ModelConfig cfg;
  std::string backend_name, backend_kind;
  bool has_tokenizer = false;
  std::string tokenizer;             // kind, or why there is none
  std::vector<double> model_lambda;  // [L]
  int64_t max_tokens = 0;
  std::vector<int32_t> eos_ids;  // the model's end-of-sequence tokens (generation stops there)
  double load_seconds = 0;
};

struct RunResult {
  uint64_t seq = 0;  // 1, 2, ... per completed run of this model
  uint64_t model_seq = 0;
  std::vector<int32_t> ids;         // [n]
  std::vector<std::string> tokens;  // [n] display labels
  std::vector<TopToken> top;        // next-token top-k
  std::vector<double> lambda;       // [L] effective lambda of this run
  LambdaControl control;
  int64_t prompt_len = 0;  // positions [prompt_len, n) are generated tokens
  // > 0: the last forward was a generation step that ran only this many new positions against the cached ones
  // (Profile::tokens counts the whole sequence); the throughput is of these.
  int64_t decoded = 0;
  int64_t tokens_run() const { return decoded > 0 ? decoded : profile.tokens; }
  int first_layer = 0;  // first layer the run recomputed
  double run_ms = 0;    // wall time of Session::run
  Profile profile;
  std::vector<float> max_abs_hidden;  // [L] with the Table 5 reader on (Session::max_abs_hidden), else empty
  std::string interventions;                // the interventions this run had (interventions_json)
  int logit_bits = 0;                       // its attention logits' quantisation (0: full precision)
  std::vector<std::string> intervention_lines;
};

struct SweepPoint {
  double lambda = 0;
  double logprob = 0;  // log p(token) at the last position (NaN until this point's re-run has finished)
  double entropy = 0;  // entropy of |A1 - lambda*A2| of the selected head (nats)
};

// Next-token log-probability of `token` and the head's difference entropy against this layer's lambda.
struct Sweep {
  uint64_t result_seq = 0;
  int layer = -1, head = -1;
  int32_t token = -1;
  std::string token_text;
  double current_lambda = 0;
  std::vector<SweepPoint> points;
  bool complete = false;
};

// One continuation of the prompt: the generated tokens and what produced them.
struct Continuation {
  std::vector<int32_t> ids;
  std::vector<std::string> tokens;  // display labels
  std::string text;                 // decoded text ("" without a tokenizer)
  GenerateOptions options;
  LambdaControl lambda;         // the lambda controls when it began
  bool lambda_moved = false;    // lambda was changed while it was being generated
  std::string stop_reason;      // stop_reason_name(): "" while it can go on
  bool empty() const { return ids.empty(); }
};

// Generation (Session::begin_generation / generate_step): the continuation being shown and the one it replaced,
// so that a regeneration after a lambda change shows how the answer changed.
struct Generation {
  int64_t prompt_len = 0;
  bool streaming = false;  // the worker is generating token after token (Stop ends it between steps)
  bool active = false;     // the session can take another step: Step continues this continuation
  Continuation now;
  std::shared_ptr<const Continuation> before;  // the previous continuation of the same prompt, if any
  int64_t first_diff = -1;  // first index where now and before differ; -1 while they agree
  double step_ms = 0;       // engine time of the steps so far (Session::generate_step)
  double tokens_per_s() const { return step_ms > 0 ? 1e3 * double(now.ids.size()) / step_ms : 0.0; }
};

// [SECTION] corpus analysis (engine/session/session_scan.h): the scan the worker runs, its progress and its report.

// What a scan runs with (the Corpus panel's options; diffscope-scan's flags of the same names).
struct ScanOptions {
  std::string path;                 // the JSONL corpus
  double lambda_scale = 1.0;        // every differential layer's lambda times this (per-layer overrides are off)
  bool compare = false;             // a second run of the same model at compare_scale
  double compare_scale = 0.0;
  int max_answer_tokens = 32;       // greedy tokens at most to check a target
  int stop_after = 0;               // tests (--scan-stop-after): Stop once this many prompts are done; 0 = never
};

// The twelve fractions in session_scan.h's order (kFractionKeys), NaN where absent.
using Fractions12 = std::array<double, ds::scan::kNumFractions>;

// One run of the report, read out of its JSON once (on the worker) so that panels draw plain numbers.
struct ScanRunView {
  std::string label;
  double lambda_scale = 1.0;
  bool differential = true;
  int64_t prompts = 0, tokens = 0, with_target = 0, correct = 0;
  double accuracy = NAN;  // NaN without targets
  Fractions12 mean{};
  std::vector<int> layers;          // the attention layers (model indices): the heatmap's rows
  int heads = 0;                    // view heads per layer: its columns
  std::vector<Fractions12> cells;   // [layers.size() * heads], mean over prompts
  struct Group {
    std::string key, value;  // "length" / "depth", and the tag's value as text
    int64_t prompts = 0;
    double accuracy = NAN;
    Fractions12 mean{};
  };
  std::vector<Group> groups;
  struct Row {  // one prompt
    int line = 0;
    int64_t tokens = 0, answer_begin = 0, answer_end = 0;  // token positions
    Fractions12 mean{};
    int correct = -1;  // -1 no target, 0 wrong, 1 right
    std::string target, output, tags;
    double ms = 0;
  };
  std::vector<Row> rows;
  const Fractions12& cell(size_t layer_index, int head) const { return cells[layer_index * size_t(heads) + size_t(head)]; }
};

struct ScanReport {
  ds::scan::Report report;  // make_report's: what Save report writes and Save plot draws
  bool complete = false;
  ScanRunView run;
  bool has_compare = false;
  ScanRunView compare;  // the second run (same prompts, in the same order)
};

struct ScanState {
  uint64_t seq = 0;  // the Request::scan_seq this scan serves
  ScanOptions options;
  bool running = false;
  bool complete = false;  // every prompt of the file was tried
  bool stopped = false;   // Stop (or --scan-stop-after) ended it early; what was done stays
  std::string error;      // why it could not run or ended (one line); empty when fine
  int total = 0;          // prompts the file holds (bad lines not counted)
  int tried = 0;          // prompts run so far (the ones the model refused included)
  int done = 0;           // prompts in the report
  int current_line = 0;   // the line being run (the last one handed out)
  int replicas = 1;       // model replicas scanning (diffscope --backend cuda:all: one a GPU)
  double elapsed_s = 0;
  std::shared_ptr<const ds::scan::Corpus> corpus;                   // the prompts, to open one in the views
  std::shared_ptr<const std::vector<ds::scan::LineError>> skipped;  // bad lines and prompts the model refused
  std::shared_ptr<const ScanReport> report;                         // null until the first prompt is in
  double prompts_per_s() const { return elapsed_s > 0 ? double(tried) / elapsed_s : 0.0; }
  double eta_s() const {
    const double r = prompts_per_s();
    return r > 0 ? double(total - tried) / r : NAN;
  }
  // The corpus line of a prompt of the report (null when absent).
  const ds::scan::Prompt* prompt_at_line(int line) const;
};

struct Snapshot {
  uint64_t seq = 0;
  // Loading
  bool loading = false;
  std::string loading_dir;
  double load_fraction = 0;
  std::string load_what;
  bool running = false;  // a run or sweep is in progress
  // The last error, one line; error_seq counts errors so the UI shows each once.
  std::string error;
  uint64_t error_seq = 0;
  bool error_opening = false;  // the error is a model that could not be opened (the one before stays)
  std::shared_ptr<const ModelInfo> model;
  std::shared_ptr<const RunResult> result;
  std::shared_ptr<const HeadMaps> head;
  std::shared_ptr<const Overview> overview;
  std::shared_ptr<const RowMaps> row;
  std::shared_ptr<const Sweep> sweep;
  // Head importance (the Overview's importance mode): measured for the result of result_seq, whole or so far.
  struct Importance {
    uint64_t result_seq = 0;
    HeadImportance h;
  };
  std::shared_ptr<const Importance> importance;
  // The logit lens at the row view's position (Request::lens), for the result of result_seq.
  struct LensView {
    uint64_t result_seq = 0;
    int64_t asked_row = -1;
    Lens lens;
  };
  std::shared_ptr<const LensView> lens;
  // The activation outliers (Request::outliers) of the result of result_seq.
  struct OutlierView {
    uint64_t result_seq = 0;
    Outliers o;
  };
  std::shared_ptr<const OutlierView> outliers;
  // The interventions of the request that the session refused, each with why (one line); the others are in force.
  // The Lambda panel marks them in its list; empty when every one was taken.
  struct Refused {
    std::vector<std::pair<HeadScale, std::string>> scales;
    std::vector<std::pair<HeadMix, std::string>> mixes;
    std::vector<std::pair<std::pair<int, int>, std::string>> means;
    std::vector<std::pair<Knockout, std::string>> knockouts;
    bool empty() const { return scales.empty() && mixes.empty() && means.empty() && knockouts.empty(); }
  };
  std::shared_ptr<const Refused> refused;
  bool error_refusal = false;  // the error is refused interventions (cleared from view once none is left)
  // The quantised logits against full precision (Request::quant_report_seq; session_quantize.h) for the result of
  // result_seq.
  struct QuantView {
    uint64_t result_seq = 0;
    QuantizeReport q;
  };
  std::shared_ptr<const QuantView> quant;
  double outliers_fraction = -1;  // the outliers being computed for the current result: the fraction done (-1: none)
  std::shared_ptr<const Generation> gen;  // null until the first prompt ran
  std::shared_ptr<const ScanState> scan;  // the latest corpus scan (running or done); null before the first
};

}  // namespace ds::gui
