// diffscope-scan: noise cancellation measured over a corpus (engine/session/session_scan.h has the measures and the report).
//
//   diffscope-scan --model DIR --input PROMPTS.jsonl --out REPORT.json [--backend auto|cpu|cuda[:N]] [--csv FILE]
//                  [--plot FILE.png] [--compare-model DIR2] [--compare-lambda-scale S] ...
//
// The report is rewritten (atomically) as prompts finish, so an interrupted scan (Ctrl-C) leaves a valid partial
// report with "complete": false. Exit codes: 0 done (bad lines skipped and listed), 2 bad arguments, 3 unusable
// model or input file, 130 interrupted (the partial report is written).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/plot/plot.h"
#include "engine/core/error.h"
#include "engine/session/session.h"
#include "engine/session/session_scan.h"
#include "engine/session/session_scan_replicas.h"
#include "engine/core/safe_write.h"

namespace {

constexpr int kExitArgs = 2, kExitInput = 3, kExitInterrupted = 130;

const char* kUsage =
    "usage: diffscope-scan --model DIR --input PROMPTS.jsonl --out REPORT.json [options]\n"
    "\n"
    "For the last prompt token of each prompt, per attention layer and head: the attention on the answer span, on\n"
    "position 0 (sink) and on the rest (context), for A1, A2 and A1 - lambda*A2, averaged over prompts; and the\n"
    "greedy answer's accuracy where a line has a \"target\".\n"
    "\n"
    "input lines:  {\"text\": \"...\", \"answer\": [begin, end)}   character offsets into the text\n"
    "              {\"ids\": [...], \"answer\": [begin, end)}     token positions\n"
    "              optional \"target\": \"text\" or [ids]; other keys (\"length\", \"depth\", ...) are kept as tags\n"
    "\n"
    "options:\n"
    "  --backend B               auto (default: CUDA when a GPU is usable), cpu, cuda, cuda:N; or one replica of\n"
    "                            the model per entry of a list, prompts handed to whichever is free: cuda:all\n"
    "                            (every GPU), cuda:0,1, cpu,cpu (the same report as one backend); a model larger\n"
    "                            than one device runs as one replica per group of devices its layer split needs\n"
    "  --gpu-mem-limit SIZE      at most SIZE (20G) on each device: forces the split a smaller card would need\n"
    "  --threads N               CPU backend threads (default: all cores)\n"
    "  --csv FILE                per (run, layer, head) fractions as CSV\n"
    "  --plot FILE.png           answer vs noise bars (the paper's Figure 1), layer x head heatmaps, depth/length\n"
    "  --lambda-scale S          scale every differential layer's lambda (default 1)\n"
    "  --label NAME              the run's name in the report and the plot (default: the model folder)\n"
    "  --compare-model DIR2      a second model in the same report (e.g. the Transformer twin)\n"
    "  --compare-lambda-scale S  a second run at lambda scale S (of --compare-model, else of --model)\n"
    "  --compare-label NAME      the second run's name\n"
    "  --max-prompts N           stop after N prompts\n"
    "  --max-answer-tokens N     greedy tokens generated at most to check a target (default 32)\n"
    "  --quantize-logits BITS    attention logits fake-quantised to BITS (2..16) bits in every run (paper Figure 8:\n"
    "                            accuracy and attention under quantisation)\n"
    "  --outliers                activation outliers of every prompt (paper Table 5; diffscope-run --outliers's\n"
    "                            keys) in the report's \"outliers\": top values exact over all prompts, medians the\n"
    "                            median of the prompts' medians\n"
    "  --shard I/N               scan only the I-th of N slices of the input (lines l with (l - 1) % N == I; I from\n"
    "                            0): N machines or jobs each run one, and --merge makes the whole input's report\n"
    "  --merge A.json B.json ... --out REPORT.json [--csv F] [--plot F]\n"
    "                            merge the reports of every shard of one scan into exactly the report of one run\n"
    "                            over the whole input (means, groups, accuracy, outliers, per-prompt list in input\n"
    "                            order; only the timings are the shards' own)\n"
    "  --no-progress             no progress bar\n"
    "  -h, --help                this text\n";

struct ArgError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string model, input, out, csv, plot, backend = "auto", label, compare_model, compare_label;
  std::optional<double> compare_lambda_scale;
  double lambda_scale = 1.0;
  int threads = 0, max_prompts = -1, max_answer_tokens = 32;
  bool progress = true, help = false, outliers = false;
  int logit_bits = 0;
  std::optional<std::pair<int, int>> shard;  // --shard I/N
  int64_t gpu_mem_limit = 0;
  std::vector<std::string> merge;            // --merge FILES
};

double parse_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used != v.size() || !std::isfinite(x)) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    throw ArgError(flag + ": '" + v + "' is not a number");
  }
}

int parse_int(const std::string& flag, const std::string& v, int lo) {
  try {
    size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < lo || x > 1'000'000'000) throw std::invalid_argument(v);
    return int(x);
  } catch (const std::exception&) {
    throw ArgError(flag + ": '" + v + "' is not an integer >= " + std::to_string(lo));
  }
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      a.help = true;
      return a;
    }
    if (f == "--no-progress") {
      a.progress = false;
      continue;
    }
    if (f == "--outliers") {
      a.outliers = true;
      continue;
    }
    if (f == "--merge") {
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) a.merge.push_back(argv[++i]);
      if (a.merge.empty()) throw ArgError("--merge needs the shard reports: --merge A.json B.json ... --out REPORT.json");
      continue;
    }
    if (f.rfind("--", 0) != 0) throw ArgError("unexpected argument '" + f + "' (options start with --)");
    static const char* const kValued[] = {"--model", "--input", "--out", "--csv", "--plot", "--backend", "--label",
                                          "--compare-model", "--compare-label", "--lambda-scale",
                                          "--compare-lambda-scale", "--threads", "--max-prompts",
                                          "--max-answer-tokens", "--gpu-mem-limit", "--shard", "--quantize-logits"};
    if (std::find(std::begin(kValued), std::end(kValued), f) == std::end(kValued))
      throw ArgError("unknown option " + f + " (see --help)");
    if (i + 1 >= argc) throw ArgError(f + " needs a value");
    const std::string v = argv[++i];
    if (f == "--model") a.model = v;
    else if (f == "--input") a.input = v;
    else if (f == "--out") a.out = v;
    else if (f == "--csv") a.csv = v;
    else if (f == "--plot") a.plot = v;
    else if (f == "--backend") a.backend = v;
    else if (f == "--label") a.label = v;
    else if (f == "--compare-model") a.compare_model = v;
    else if (f == "--compare-label") a.compare_label = v;
    else if (f == "--lambda-scale") a.lambda_scale = parse_double(f, v);
    else if (f == "--compare-lambda-scale") a.compare_lambda_scale = parse_double(f, v);
    else if (f == "--threads") a.threads = parse_int(f, v, 0);
    else if (f == "--max-prompts") a.max_prompts = parse_int(f, v, 1);
    else if (f == "--max-answer-tokens") a.max_answer_tokens = parse_int(f, v, 1);
    else if (f == "--gpu-mem-limit") {
      try {
        a.gpu_mem_limit = ds::parse_size(v, f);
      } catch (const ds::Error& e) {
        throw ArgError(e.what());
      }
    }
    else if (f == "--shard") {
      long long si = -1, sn = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%lld/%lld%c", &si, &sn, &tail) != 2 || sn < 1 || sn > 1000000 || si < 0 || si >= sn)
        throw ArgError("--shard: '" + v + "' is not I/N with 0 <= I < N (e.g. --shard 0/4 ... --shard 3/4)");
      a.shard = std::pair(int(si), int(sn));
    }
    else if (f == "--quantize-logits") {
      char* end = nullptr;
      errno = 0;
      const long b = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != 0 || errno != 0) throw ArgError("--quantize-logits: '" + v + "' is not a whole number of bits");
      if (b < 2 || b > 16) throw ArgError("--quantize-logits: " + v + " bits is outside 2..16");
      a.logit_bits = int(b);
    }
    else throw ArgError("unknown option " + f + " (see --help)");
  }
  try {
    ds::parse_backend_list(a.backend);
  } catch (const ds::Error& e) {
    throw ArgError(e.what());
  }
  if (!a.merge.empty()) {
    if (!a.model.empty() || !a.input.empty() || a.shard || !a.compare_model.empty() || a.compare_lambda_scale || a.outliers)
      throw ArgError("--merge takes shard reports, --out and optionally --csv and --plot: the scan's options were the shards'");
    if (a.out.empty()) throw ArgError("--merge needs --out REPORT.json");
    return a;
  }
  if (a.model.empty()) throw ArgError("--model DIR is required");
  if (a.input.empty()) throw ArgError("--input PROMPTS.jsonl is required");
  if (a.out.empty()) throw ArgError("--out REPORT.json is required");
  if (!a.compare_label.empty() && a.compare_model.empty() && !a.compare_lambda_scale)
    throw ArgError("--compare-label needs --compare-model or --compare-lambda-scale");
  return a;
}

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  if (g_interrupted.exchange(true)) std::_Exit(kExitInterrupted);  // a second Ctrl-C: the report on disk stays valid
  // Said at once (write(2) is safe in a handler): the current prompt is stopped between its steps.
  static const char msg[] = "\nscan: stopping (Ctrl-C again to quit at once; the report on disk stays valid)\n";
  const ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

// One line on a terminal, redrawn in place; elsewhere a line at every tenth of the work.
class ProgressBar {
 public:
  ProgressBar(bool on, size_t total) : on_(on), tty_(isatty(STDERR_FILENO)), total_(total) {}
  void update(size_t done, int64_t tokens, double elapsed_s, size_t skipped) {
    if (!on_ || total_ == 0) return;
    const double rate = elapsed_s > 0 ? double(done) / elapsed_s : 0.0;
    const double eta = rate > 0 ? double(total_ - done) / rate : 0.0;
    char tail[160];
    std::snprintf(tail, sizeof tail, "%zu/%zu prompts  %.2f prompts/s  %lld tokens  ETA %.0f s%s", done, total_, rate,
                  static_cast<long long>(tokens), eta,
                  skipped ? ("  (" + std::to_string(skipped) + " skipped)").c_str() : "");
    if (tty_) {
      const int width = 30, fill = int(double(width) * double(done) / double(total_));
      std::string bar(size_t(fill), '=');
      bar.resize(size_t(width), ' ');
      std::fprintf(stderr, "\r[%s] %s\x1b[K", bar.c_str(), tail);
      if (done == total_) std::fputc('\n', stderr);
    } else if (done == total_ || done * 10 / total_ != last_ * 10 / total_) {
      std::fprintf(stderr, "scan: %s\n", tail);
    }
    last_ = done;
    std::fflush(stderr);
  }
  void clear_line() {
    if (on_ && tty_) std::fputs("\r\x1b[K", stderr);
  }

 private:
  bool on_, tty_;
  size_t total_, last_ = 0;
};

void print_summary(const ds::scan::Report& report) {
  for (const ds::scan::RunReport* r : {&report.run, report.compare ? &*report.compare : nullptr}) {
    if (!r) continue;
    const ds::scan::Fractions& m = r->mean;
    const bool d = r->differential;
    std::printf("%-28s prompts %lld  answer %.4f  context %.4f  sink %.4f%s", r->label.c_str(), (long long)r->prompts,
                d ? m.answer_diff : m.answer1, d ? m.context_diff : m.context1, d ? m.sink_diff : m.sink1,
                d ? " (A1 - lambda*A2)" : " (softmax)");
    if (r->logit_bits > 0) std::printf("  logits at %d bits", r->logit_bits);
    if (std::isfinite(r->accuracy)) std::printf("  accuracy %.3f", r->accuracy);
    std::printf("\n");
  }
}

// --merge: the shard reports read (each a one-line error naming the file when it is not one), merged, written.
// Every output before any work: none may be an input, a directory or a device, nor two of them one file.
void check_outputs(const Args& a, const std::vector<std::string>& inputs) {
  const std::vector<std::pair<std::string, std::string>> outs{{a.out, "the report"}, {a.csv, "the CSV"}, {a.plot, "the plot"}};
  for (const auto& [path, what] : outs) {
    if (path.empty()) continue;
    ds::check_writable_target(path, what, inputs);
    for (const auto& [other, other_what] : outs)
      if (&other != &path && !other.empty() && std::filesystem::weakly_canonical(other) == std::filesystem::weakly_canonical(path))
        throw ds::Error(path + ": named for both " + what + " and " + other_what);
  }
}

int merge(const Args& a) {
  check_outputs(a, a.merge);  // (the paths; the model folders the shards name are known once they are read)
  std::vector<std::pair<std::string, ds::scan::Report>> shards;
  for (const std::string& f : a.merge) {
    std::error_code ec;
    if (std::filesystem::is_directory(f, ec)) throw ds::Error(f + ": is a directory, not a shard report");
    if (!std::filesystem::is_regular_file(f, ec)) throw ds::Error(f + ": no such file");
    const auto size = std::filesystem::file_size(f, ec);
    if (ec || size > (size_t(2) << 30)) throw ds::Error(f + ": cannot be read, or larger than 2 GiB");
    std::ifstream in(f, std::ios::binary);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      throw ds::Error(f + ": not JSON (a syntax error at byte " + std::to_string(e.byte) + "): not a shard report");
    } catch (const nlohmann::json::exception&) {
      throw ds::Error(f + ": not JSON: not a shard report");
    }
    shards.emplace_back(f, ds::scan::shard_report_from_json(j, f));
  }
  for (const auto& [f, r] : shards) {  // no output over a file of the models the shards scanned
    ds::protect_input_folder(r.run.model);
    if (r.compare) ds::protect_input_folder(r.compare->model);
  }
  check_outputs(a, a.merge);
  const ds::scan::Report report = ds::scan::merge_shard_reports(shards);
  ds::scan::write_json_atomic(report, a.out);
  if (!a.csv.empty()) ds::scan::write_csv(report, a.csv);
  if (!a.plot.empty()) ds::scan::write_plot_png(report, a.plot);
  std::fprintf(stderr, "scan: merged %zu shards of %s: %lld prompts%s\n", shards.size(), report.input.c_str(),
               (long long)report.run.prompts, report.complete ? "" : " (a shard was incomplete: the report is too)");
  print_summary(report);
  return 0;
}

int scan(const Args& a) {
  const std::vector<ds::BackendChoice> backends = ds::parse_backend_list(a.backend);
  ds::protect_input_folder(a.model);  // (a file of the model folders is never an output either)
  if (!a.compare_model.empty()) ds::protect_input_folder(a.compare_model);
  check_outputs(a, {a.input});
  ds::scan::Corpus corpus = ds::scan::read_corpus(a.input);
  bool cut = false;  // --max-prompts left prompts out: the report is not of the whole input (or slice)
  if (a.max_prompts > 0 && corpus.prompts.size() > size_t(a.max_prompts)) {
    corpus.prompts.resize(size_t(a.max_prompts));  // the first N prompts of the input, then the slice of them
    cut = true;
  }
  if (a.shard) {  // the I-th slice: lines l with (l - 1) % N == I, bad lines included
    const auto mine = [&](int line) { return (line - 1) % a.shard->second == a.shard->first; };
    std::erase_if(corpus.prompts, [&](const ds::scan::Prompt& p) { return !mine(p.line); });
    std::erase_if(corpus.errors, [&](const ds::scan::LineError& e) { return !mine(e.line); });
  }
  ds::scan::ReplicaScanOptions ro;
  ro.model = a.model;
  ro.compare_model = a.compare_model;
  ro.backends = backends;
  ro.mem_limit = a.gpu_mem_limit;
  if (backends.size() > 1 || a.gpu_mem_limit > 0)  // a layer split is placed for the longest prompt
    ro.plan_tokens = ds::scan::corpus_plan_tokens(corpus, a.model, a.max_answer_tokens);
  ro.threads = a.threads;
  ro.first = ds::scan::RunOptions{a.label, a.lambda_scale, a.max_answer_tokens, a.outliers, a.logit_bits};
  if (!a.compare_model.empty() || a.compare_lambda_scale)
    ro.second = ds::scan::RunOptions{a.compare_label, a.compare_lambda_scale.value_or(1.0), a.max_answer_tokens,
                                     a.outliers, a.logit_bits};
  ds::scan::ReplicaScan rs(ro);
  const ds::scan::Report first = rs.report(a.input, {}, false, 0);
  std::fprintf(stderr, "scan: %zu prompts from %s on %s%s\n", corpus.prompts.size(), a.input.c_str(),
               rs.backend_name().c_str(), first.compare ? (", comparing " + first.run.label + " with " +
                                                           first.compare->label).c_str()
                                                        : "");
  for (const ds::scan::LineError& e : corpus.errors)
    std::fprintf(stderr, "%s: line %d skipped: %s\n", a.input.c_str(), e.line, e.error.c_str());

  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<ds::scan::LineError> skipped = corpus.errors;
  const size_t total = corpus.prompts.size();
  ProgressBar bar(a.progress, total);
  const auto cancelled = [] { return g_interrupted.load(); };
  // A shard's report names the input's and the models' content, which --merge matches (paths may differ by machine)
  const std::string input_fp = a.shard ? ds::scan::file_fingerprint(a.input) : "";
  const std::string model_fp = a.shard ? ds::scan::model_fingerprint(a.model) : "";
  const std::string compare_fp = a.shard && !a.compare_model.empty() ? ds::scan::model_fingerprint(a.compare_model)
                                                                     : model_fp;
  const auto report_now = [&](bool complete) {
    ds::scan::Report r = rs.report(a.input, skipped, complete, elapsed());
    r.shard = a.shard;
    r.input_fingerprint = input_fp;
    r.run.model_fingerprint = model_fp;
    if (r.compare) r.compare->model_fingerprint = compare_fp;
    return r;
  };
  const auto write = [&](bool complete) { ds::scan::write_json_atomic(report_now(complete), a.out); };
  write(false);  // a valid (empty) report from the start
  double last_write = 0;
  int64_t tokens = 0;
  size_t done = 0;
  const bool all = rs.run(corpus.prompts, cancelled,
                          [&](const ds::scan::Prompt& p, const ds::scan::PromptResult* r, const std::string* err) {
                            if (r) tokens += r->tokens;
                            else {
                              bar.clear_line();
                              std::fprintf(stderr, "%s: line %d skipped: %s\n", a.input.c_str(), p.line, err->c_str());
                              skipped.push_back({p.line, *err});
                            }
                            ++done;
                            bar.update(done, tokens, elapsed(), skipped.size());
                            if (elapsed() - last_write > 2.0) {
                              write(false);
                              last_write = elapsed();
                            }
                          });
  const bool interrupted = !all || g_interrupted;
  const bool complete = !interrupted && !cut && rs.scanned() > 0;
  write(complete);
  if (interrupted) {
    bar.clear_line();
    std::fprintf(stderr, "scan: interrupted after %zu prompts; partial report in %s\n", rs.scanned(), a.out.c_str());
  }
  const ds::scan::Report report = report_now(complete);
  if (!a.csv.empty()) ds::scan::write_csv(report, a.csv);
  if (!a.plot.empty()) ds::scan::write_plot_png(report, a.plot);
  print_summary(report);
  if (interrupted) return kExitInterrupted;
  if (rs.scanned() == 0 && !a.shard)  // a report of nothing is no success (a shard's slice may be all bad)
    throw ds::Error(a.input + ": no prompt could be scanned (" + std::to_string(skipped.size()) +
                    " lines skipped; the report says why)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse_args(argc, argv);
  } catch (const ArgError& e) {
    std::fprintf(stderr, "diffscope-scan: %s\n", e.what());
    return kExitArgs;
  }
  if (a.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    return a.merge.empty() ? scan(a) : merge(a);
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "diffscope-scan: %s\n", e.what());
    return kExitInput;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "diffscope-scan: out of host memory\n");
    return kExitInput;
  }
}
