// Corpus analysis (diffscope-scan, the GUI's Corpus panel): for the last prompt token of each prompt of a JSONL
// file, per attention layer and head, how the attention row splits between the answer span, position 0 (the sink)
// and the rest (the context), for A1, A2 and D = A1 - lambda*A2; averaged over prompts, with the greedy answer's
// accuracy where a line has a target. The rows are reduced where the maps live (Backend::row_mass): nothing of
// size n x n, and on the GPU nothing of size n, leaves the device.
//
// Input lines (one JSON object each; blank lines are ignored):
//   {"text": "...", "answer": [begin, end)}   character (Unicode code point) offsets into the text, mapped to the
//                                             tokens whose byte spans overlap them
//   {"ids": [...], "answer": [begin, end)}    token positions
//   optional "target": "..." (text) or [ids]: the answer the model should give greedily after the prompt
//   any other keys (length, depth, needles, ...) are kept as the prompt's tags; "length" and "depth" also group
//   the report.
// A bad line (not JSON, missing or wrong fields, an empty or out-of-range span, a prompt the model cannot run) is
// reported with its line number and skipped.
//
// Fractions of one row r (the last prompt position q, keys 0..q), S = the answer span, "sink" = key 0 (0 when the
// span contains it), "context" = every other key:
//   answer1 = sum_S A1 / sum A1 (and likewise sink1, context1; A1's row sums to 1), the same for A2;
//   answer_diff = sum_S D / sum D (the row divided by its sum, which is 1 - lambda);
//   answer_diff_abs = sum_S |D| / sum |D| (the |.|-normalised variant: a distribution, the three parts sum to 1).
// Plain (Llama) heads have one map: only answer1, sink1, context1 (no "2" or "diff" keys).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/session/session.h"
#include "engine/session/session_outliers.h"

namespace ds::scan {

// ---------------------------------------------------------------------------------------------------------------
// input

struct Prompt {
  int line = 0;                        // 1-based line of the input file
  bool is_text = false;                // "text" (else "ids")
  std::string text;
  std::vector<int32_t> ids;
  int64_t answer_begin = 0, answer_end = 0;  // as given: characters for text, token positions for ids
  bool has_target = false, target_is_text = false;
  std::string target_text;
  std::vector<int32_t> target_ids;
  nlohmann::json tags = nlohmann::json::object();  // the line's other keys
};

struct LineError {
  int line = 0;
  std::string error;  // one line, without the file name
};

struct Corpus {
  std::string path;
  std::vector<Prompt> prompts;
  std::vector<LineError> errors;  // lines that could not be parsed (skipped)
};

// A corpus line longer than this is skipped with its line number (no prompt a model takes comes near it).
constexpr size_t kMaxCorpusLineBytes = size_t(32) << 20;
// One line; throws ds::Error with a one-line reason (without file or line).
Prompt parse_line(const std::string& line, int line_no);
// The whole file; a bad line goes to errors, never stops the read. Throws ds::Error (naming the file) when the
// file cannot be opened or read, or holds no line at all.
Corpus read_corpus(const std::string& path);
// The longest prompt of the corpus in tokens, plus the answer tokens a prompt may generate: what a layer split plans
// its activations for (ReplicaScanOptions::plan_tokens). Text prompts are counted with the model's tokenizer (the
// longest few by bytes); without one, a byte a token bounds them.
int64_t corpus_plan_tokens(const Corpus& c, const std::string& model_dir, int max_answer_tokens);

// ---------------------------------------------------------------------------------------------------------------
// one prompt

// The twelve fractions of one head's row (NaN where a map is absent or a denominator is zero).
struct Fractions {
  double answer1 = 0, answer2 = 0, answer_diff = 0, answer_diff_abs = 0;
  double sink1 = 0, sink2 = 0, sink_diff = 0, sink_diff_abs = 0;
  double context1 = 0, context2 = 0, context_diff = 0, context_diff_abs = 0;
};
// The report's key names, in the order of the fields above, and access by index.
constexpr int kNumFractions = 12;
extern const char* const kFractionKeys[kNumFractions];
double& fraction(Fractions& f, int i);
double fraction(const Fractions& f, int i);
// Whether key i exists for a differential / plain model (plain: answer1, sink1, context1 only).
bool fraction_applies(int i, bool differential);
// A row's masses (map_query.h row_mass_of) as fractions of each map's row total (the scan's rule; the GUI's row view
// shows the same numbers).
Fractions fractions_of(const RowMass& m, bool differential);

// An exactly rounded sum (Shewchuk's non-overlapping partials, the algorithm of Python's math.fsum; written here, as
// no Debian library offers it): value() is the exact sum of the terms rounded once, whatever their order, so means
// over prompts that finished in any order, or over shards merged afterwards, equal one run's bit for bit.
class ExactSum {
 public:
  void add(double x);
  void add(const ExactSum& o) {
    for (double v : o.p_) add(v);
  }
  double value() const;
  const std::vector<double>& partials() const { return p_; }

 private:
  std::vector<double> p_;
};

// The mean of each of the twelve fractions, NaN entries left out (NaN when none is finite).
struct FractionSums {
  ExactSum sum[kNumFractions];
  int64_t count[kNumFractions] = {};
  void add(const Fractions& f);
  void add(const FractionSums& o);
  Fractions mean() const;
};

struct PromptResult {
  int line = 0;
  int64_t tokens = 0;                        // prompt length (special tokens included)
  int64_t answer_begin = 0, answer_end = 0;  // token positions
  std::vector<std::vector<Fractions>> heads; // [attention layer][view head], in the order of Run::layers()
  Fractions mean;                            // over those layers and heads
  bool has_target = false, correct = false;
  std::string target, output;                // texts (ids written out when there is no tokenizer)
  std::vector<int32_t> output_ids;
  double ms = 0;                             // wall time of the prompt (forward, rows and answer)
  nlohmann::json tags = nlohmann::json::object();
  std::shared_ptr<const Outliers> outliers;  // RunOptions::outliers
};

// ---------------------------------------------------------------------------------------------------------------
// a run: one model at one lambda setting, accumulating over prompts

struct RunOptions {
  std::string label;              // shown in the report and the plot (default: the model folder's name)
  double lambda_scale = 1.0;      // applied to every differential layer's lambda
  int max_answer_tokens = 32;     // greedy tokens generated at most to check a target
  bool outliers = false;          // activation outliers of every prompt (session_outliers.h), merged in the report
  int logit_bits = 0;             // attention logits fake-quantised to this many bits (Session::set_logit_bits)
};

class Run {
 public:
  Run(Session& session, RunOptions opt);
  // Runs one prompt and adds it to the averages. Throws ds::Error (one line, no file name) for a prompt this model
  // cannot run (too long, a span outside it, an id outside the vocabulary, text without a tokenizer): nothing is
  // added then. `cancelled` is polled between steps; a cancelled prompt throws ds::Cancelled and adds nothing.
  const PromptResult& scan(const Prompt& p, const std::function<bool()>& cancelled = nullptr);

  const std::vector<int>& layers() const { return layers_; }  // the attention layers, model indices
  bool differential() const;
  int64_t heads() const;  // view heads per layer
  const std::vector<PromptResult>& results() const { return results_; }
  void drop_last() { if (!results_.empty()) results_.pop_back(); }  // takes back a prompt (a comparison's other run failed)
  Session& session() { return s_; }
  const RunOptions& options() const { return opt_; }
  // The run's part of the report (see make_report).
  struct RunReport report() const;
  // The same for results this run's session (or a replica's, the same model and options) computed; they need not
  // be in input order.
  struct RunReport report_for(const std::vector<PromptResult>& results) const;

 private:
  Session& s_;
  RunOptions opt_;
  std::vector<int> layers_;
  std::vector<PromptResult> results_;
};

// One prompt through every run (a comparison): it counts for all of them or for none. When a later run fails or
// is cancelled, the earlier runs' results for it are taken back and the exception goes on.
void scan_all(const std::vector<std::unique_ptr<Run>>& runs, const Prompt& p,
              const std::function<bool()>& cancelled = nullptr);

// ---------------------------------------------------------------------------------------------------------------
// the report: a struct from the engine to the CLI, the GUI and the plot; JSON only at the file boundary

// What a run's report is computed from (sums, counts, outlier parts): the totals of two sets of prompts of one corpus
// merge exactly into the totals of their union (diffscope-scan --shard / --merge, a scan over several GPUs).
struct GroupTotals {
  nlohmann::json value;
  int64_t prompts = 0, with_target = 0, correct = 0;
  FractionSums mean;
};
struct RunTotals {
  int64_t prompts = 0, tokens = 0, with_target = 0, correct = 0;
  FractionSums mean;                                 // over layers, heads and prompts
  std::vector<std::vector<FractionSums>> heads;      // [attention layer][view head]
  std::vector<std::pair<std::string, std::vector<GroupTotals>>> groups;  // "length", "depth"; values sorted
  std::optional<OutlierParts> outliers;
};
// The totals of `results` (every one with its per-head fractions) over `layers` x `heads`.
RunTotals totals_of(const std::vector<PromptResult>& results, size_t layers, int64_t heads, bool outliers);
// a += b (b's prompts are others of the same corpus); throws ds::Error when their layers or heads differ.
void merge_totals(RunTotals& a, const RunTotals& b);

struct GroupReport {                 // the prompts whose tag "length" or "depth" has one value
  nlohmann::json value;              // the tag's value (a number or a string)
  int64_t prompts = 0;
  double accuracy = 0;               // NaN without targets
  Fractions mean;
};
struct LayerReport {
  int layer = 0;
  std::string kind;                  // layer_kind_name
  std::vector<Fractions> heads;      // [view head]: means over prompts
};
struct RunReport {
  std::string label, model, architecture, backend;
  bool differential = false;
  double lambda_scale = 1.0;
  int logit_bits = 0;                // RunOptions::logit_bits (0: full precision)
  // The session's interventions in force (interventions_json: ablations, head lambdas, knockouts; [] for none)
  nlohmann::json interventions = nlohmann::json::array();
  int64_t prompts = 0, tokens = 0, with_target = 0, correct = 0;
  double accuracy = 0;               // NaN without targets
  Fractions mean;                    // over layers, heads and prompts
  std::vector<LayerReport> layers;   // the attention layers
  std::vector<std::pair<std::string, std::vector<GroupReport>>> groups;  // "length", "depth" where lines have them
  std::vector<PromptResult> per_prompt;  // in input order (their per-head fractions left out)
  std::optional<Outliers> outliers;      // RunOptions::outliers: merge_outliers over the prompts
  std::string model_fingerprint;         // a shard's (model_fingerprint; "" where unknown)
  RunTotals totals;                      // what the numbers above were computed from (a shard's report keeps it)
};
// Fills prompts, tokens, accuracy, mean, the layers' heads, groups and outliers from r.totals (r.layers holds the
// layers' indices and kinds).
void finish_report(RunReport& r);
struct Report {
  std::string input;
  bool complete = false;
  double elapsed_s = 0;
  std::vector<LineError> skipped;
  RunReport run;
  std::optional<RunReport> compare;  // the second run of a comparison (same prompts, same order)
  // diffscope-scan --shard I/N: this report covers the I-th of N slices of the input (input lines l with
  // (l - 1) % N == I), and its JSON carries each run's totals so that --merge can make the whole input's report.
  std::optional<std::pair<int, int>> shard;
  // A shard's: the input's content (file_fingerprint), so that --merge matches shards by what they scanned, not by
  // how their paths were spelled ("" where unknown: the paths must then be equal)
  std::string input_fingerprint;
};

// A file's content as 16 hex digits (FNV-1a, 64 bits: an identity check of corpora, not a security one); a model
// folder's as the same over its config.json and the names and sizes of its weight files. Throws ds::Error naming
// the path when it cannot be read.
std::string file_fingerprint(const std::string& path);
std::string model_fingerprint(const std::string& dir);

// Throws ds::Error unless there are one or two runs.
Report make_report(const std::vector<const Run*>& runs, const std::string& input, const std::vector<LineError>& skipped,
                   bool complete, double elapsed_s);
// The same over results kept apart from the runs (results[k]: run k's; a scan on several replicas), any order.
Report make_report(const std::vector<const Run*>& runs, const std::vector<std::vector<PromptResult>>& results,
                   const std::string& input, const std::vector<LineError>& skipped, bool complete, double elapsed_s);
// The report file's JSON:
// {"tool": "diffscope-scan", "input": path, "complete": bool, "skipped": [{"line", "error"}], "elapsed_s",
//  then the first run's keys:
//    "label", "model", "architecture", "differential", "backend", "lambda_scale", "logit_bits", "interventions",
//    "prompts": N, "tokens", "accuracy" (null without targets), "with_target", "correct",
//    "mean": {fraction keys}  (over layers, heads and prompts),
//    "layers": [{"layer": l, "kind": "attention", "heads": [{"head": j, <fraction keys>}]}],
//    "groups": {"length": [{"value", "prompts", "accuracy", "mean": {...}}], "depth": [...]}  (when lines have them),
//    "per_prompt": [{"line", "tokens", "answer": [b, e), "tags", "mean": {...}, "target", "output", "correct", "ms"}]
//    "outliers": {outliers_json's keys, "medians": "median of the prompts' medians"}  (RunOptions::outliers),
//  and "compare": {the second run's keys} when there is one}.
// Fraction values that are NaN are written as null.
nlohmann::json report_json(const Report& r);
nlohmann::json run_report_json(const RunReport& r, bool with_totals = false);
// A shard report's JSON read back (with its totals); throws ds::Error naming `file` when it is not one.
Report shard_report_from_json(const nlohmann::json& j, const std::string& file);
// The reports of the N shards of one input (every index once, the same runs) merged into the report one run over
// the whole input writes: the same means, groups, accuracy, outliers and per-prompt list in input order (only the
// timings are the shards' own; elapsed_s is the longest shard's). Throws ds::Error naming the file at fault.
Report merge_shard_reports(const std::vector<std::pair<std::string, Report>>& shards);
// Writes the report's JSON to `path` atomically (engine/core/safe_write.h: a temporary renamed over it), so an
// interrupted scan leaves a valid report. Throws ds::Error naming the file.
void write_json_atomic(const Report& report, const std::string& path);
// CSV: one row per (run, layer, head): label,layer,head,<fraction keys> (empty cells where a key does not apply).
void write_csv(const Report& report, const std::string& path);

}  // namespace ds::scan
