// Argument parsing for the GUI. See cli_options.h.
#include "cli_options.h"

#include <filesystem>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "engine/core/error.h"
#include "engine/session/session_scan.h"

namespace ds::gui {

const char* cli_usage() {
  return "usage: diffscope [MODEL_DIR] [options]\n"
         "  --model DIR            checkpoint folder (config.json + *.safetensors)\n"
         "  --prompt TEXT          prompt text (needs the model's tokenizer.json)\n"
         "  --prompt-file FILE     prompt text from a file (long prompts; one trailing newline is dropped)\n"
         "  --ids 1,2,3            prompt as token ids (models without a tokenizer)\n"
         "  --head L.H             open head H of layer L in the head view (a Mamba layer: channel H of its scan)\n"
         "  --view Q0:Q1,K0:K1     head view zoomed to queries Q0..Q1-1 and keys K0..K1-1 (a square around them)\n"
         "  --row Q                row view of query Q (negative counts from the end; default -1, the last token)\n"
         "  --pool max|mean        how the head view pools tokens into a cell when they outnumber the pixels\n"
         "  --lambda-scale X       multiply every layer's lambda by X\n"
         "  --generate N           after the first run, generate N tokens (then --screenshot waits for them)\n"
         "  --temperature T        sample with temperature T (default 0: greedy)\n"
         "  --sample-top-k K       sample from the K most likely tokens only (default 0: all)\n"
         "  --top-p P              sample from the smallest set of tokens whose probability reaches P (default 1)\n"
         "  --seed S               the sampler's seed (default 0): the same seed gives the same continuation\n"
         "  --ignore-eos           keep generating past the model's end-of-sequence token\n"
         "  --max-abs-hidden       read each layer's largest |hidden state| (Profiler, max |h|; paper Table 5)\n"
         "  --ablate L.H[:MODE]    ablate head H of layer L from the start (repeatable; the head panel's boxes):\n"
         "                         MODE head (its output zeroed; the default), a1 or a2 (that map dropped), mean\n"
         "                         (its output replaced by its mean over positions)\n"
         "  --head-lambda L.H=V    lambda V for head H of layer L alone (repeatable; the Lambda panel's own lambda)\n"
         "  --knockout L:Q0:Q1,K0:K1  queries [Q0, Q1) of layer L (a range A-B, or all) do not see keys [K0, K1)\n"
         "                         (repeatable; below 0 counts from the prompt's end; the Lambda panel's field)\n"
         "  --lens                 the logit lens at the Row panel's position (what each layer predicts there)\n"
         "  --outliers             the activation outliers of each result (Profiler, outliers; paper Table 5)\n"
         "  --compare DIR          open DIR beside the model in the Compare panel, on the same tokens (its twin, or\n"
         "                         any model with the same tokenizer): rows, their masses and the outliers of both\n"
         "  --compare-answer B:E   the Compare panel's answer span, token positions [B, E)\n"
         "  --quantize-logits BITS attention logits fake-quantised to BITS (2..16) bits (the lambda panel's menu)\n"
         "  --importance           measure every head's importance (Overview, importance mode) after the first run\n"
         "  --regenerate-lambda-scale X  with --generate: then set the lambda scale to X and regenerate with the\n"
         "                         same options (the Generate panel compares the two continuations)\n"
         "  --scan FILE.jsonl      scan a corpus once the model has run its first prompt (Corpus panel; with\n"
         "                         --screenshot, the picture waits for it): per layer and head, the last prompt\n"
         "                         token's attention on each line's answer span, as diffscope-scan\n"
         "  --scan-lambda-scale X  the scan's lambda scale (default 1)\n"
         "  --scan-compare X       also scan at lambda scale X (a second run of the same model)\n"
         "  --scan-max-answer N    greedy tokens at most to check a line's target (default 32)\n"
         "  --scan-open K          when the scan has finished, open its K-th prompt (0 = first, -1 = last) in the\n"
         "                         views: the prompt, the row view on its last token, the answer span marked\n"
         "  --scan-report OUT.json, --scan-plot OUT.png   when the scan has finished, save its report / plot\n"
         "  --scan-stop-after N    with --screenshot: stop the scan after N prompts (what was done stays)\n"
         "  --scan-view V          what the Corpus panel shows: first | compare | difference (of the two runs)\n"
         "  --scan-fraction KEY    its heatmap and table: answer1 | answer2 | answer_diff (default) |\n"
         "                         answer_diff_abs | sink1 ... | context_diff_abs (diffscope-scan's report keys)\n"
         "  --theme dark|light\n"
         "  --overview MODE        a1 | a2 | diff | entropy | entropy-diff | first | first-diff | negative |\n"
         "                         entropy-a2 | max-logit | max-logit2\n"
         "  --backend auto|cpu|cuda|cuda:N   --threads N\n"
         "                         (a list, cuda:all or cuda:0,1: the model on as few of them as hold it, its layers\n"
         "                         split in blocks when one is too small; the Corpus panel's scans run a replica on\n"
         "                         each device left)   --gpu-mem-limit SIZE  at most SIZE (20G) on each device\n"
         "  --screenshot OUT.png   render the window once the run is complete, save it, exit\n"
         "  --state-json OUT.json  with --screenshot: write the engine state and panel rectangles\n"
         "  --open-after DIR       with --screenshot: then open DIR (tests the error path)\n"
         "  --export-dir DIR       with --screenshot: also export the head (.npy, .csv), session (.json), Head PNG\n"
         "  --size WxH             window size (default 1600x1000)\n"
         "  --mouse X,Y            with --screenshot: the mouse pointer rests at X,Y (shows tooltips)\n"
         "  --replay-lambda L,FROM,TO,STEPS  with --screenshot: after the first run, drag layer L's lambda from FROM\n"
         "                         to TO, one value a frame over STEPS frames, then capture\n"
         "  --replay-log FILE      with --replay-lambda: per frame the time, the lambda set and the lambda shown, and\n"
         "                         per shown value its latency from being set (CSV)\n";
}

// A whole-string number, else a one-line error naming the flag.
static double parse_number(const std::string& v, const std::string& flag) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x))
    throw Error(flag + ": '" + v + "' is not a number");
  return x;
}

static long long parse_integer(const std::string& v, const std::string& flag) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE)
    throw Error(flag + ": '" + v + "' is not a whole number");
  return x;
}

static std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::string tok;
  std::istringstream in(s);
  while (std::getline(in, tok, ',')) {
    if (tok.empty())
      continue;
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (*end != '\0' || v < 0)
      throw Error("--ids: '" + tok + "' is not a token id. HINT: --ids 1,17,42");
    ids.push_back(int(v));
  }
  if (ids.empty())
    throw Error("--ids: no ids given. HINT: --ids 1,17,42");
  return ids;
}

CliOptions parse_cli(int argc, char** argv) {
  CliOptions o;
  auto need = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc)
      throw Error(flag + ": missing value. HINT: diffscope --help");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (a == "--model") {
      o.model = need(i, a);
    } else if (a == "--prompt") {
      o.prompt = need(i, a);
    } else if (a == "--prompt-file") {
      o.prompt_file = need(i, a);
    } else if (a == "--ids") {
      o.ids = parse_ids(need(i, a));
    } else if (a == "--head") {
      const std::string v = need(i, a);
      if (std::sscanf(v.c_str(), "%d.%d", &o.layer, &o.head) != 2 || o.layer < 0 || o.head < 0)
        throw Error("--head: '" + v + "' is not LAYER.HEAD. HINT: --head 1.3");
    } else if (a == "--view") {
      const std::string v = need(i, a);
      long long q0, q1, k0, k1;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%lld:%lld,%lld:%lld%c", &q0, &q1, &k0, &k1, &tail) != 4 || q0 < 0 || k0 < 0 ||
          q1 <= q0 || k1 <= k0)
        throw Error("--view: '" + v + "' is not Q0:Q1,K0:K1 with Q0 < Q1 and K0 < K1. HINT: --view 0:64,0:64");
      o.view = std::array<int64_t, 4>{q0, q1, k0, k1};
    } else if (a == "--row") {
      const std::string v = need(i, a);
      char* end = nullptr;
      const long long q = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0')
        throw Error("--row: '" + v + "' is not a token position. HINT: --row 12, or --row -1 for the last token");
      o.row = q;
    } else if (a == "--pool") {
      const std::string v = need(i, a);
      if (v != "max" && v != "mean")
        throw Error("--pool: '" + v + "' is not max or mean");
      o.mean_pool = v == "mean";
    } else if (a == "--lambda-scale") {
      const std::string v = need(i, a);
      char* end = nullptr;
      o.lambda_scale = std::strtod(v.c_str(), &end);
      if (*end != '\0')
        throw Error("--lambda-scale: '" + v + "' is not a number");
    } else if (a == "--generate") {
      const long long n = parse_integer(need(i, a), a);
      if (n < 1 || n > 1000000)
        throw Error("--generate must be between 1 and 1000000");
      o.generate = int(n);
    } else if (a == "--temperature") {
      o.temperature = parse_number(need(i, a), a);
      if (*o.temperature < 0)
        throw Error("--temperature must be >= 0 (0 = greedy)");
    } else if (a == "--top-p") {
      o.top_p = parse_number(need(i, a), a);
      if (!(*o.top_p > 0 && *o.top_p <= 1))
        throw Error("--top-p must be in (0, 1]");
    } else if (a == "--sample-top-k") {
      const long long k = parse_integer(need(i, a), a);
      if (k < 0 || k > INT32_MAX)
        throw Error("--sample-top-k must be >= 0 (0 = no limit)");
      o.sample_top_k = int(k);
    } else if (a == "--seed") {
      const long long v = parse_integer(need(i, a), a);
      if (v < 0)
        throw Error("--seed must be >= 0");
      o.seed = uint64_t(v);
    } else if (a == "--ignore-eos") {
      o.ignore_eos = true;
    } else if (a == "--max-abs-hidden") {
      o.max_abs_hidden = true;
    } else if (a == "--importance") {
      o.importance = true;
    } else if (a == "--knockout") {
      o.knockout.push_back(need(i, a));
    } else if (a == "--lens") {
      o.lens = true;
    } else if (a == "--outliers") {
      o.outliers = true;
    } else if (a == "--compare") {
      o.compare = need(i, a);
      if (o.compare.empty()) throw Error("--compare: no folder given. HINT: --compare assets/models/llama-demo");
    } else if (a == "--compare-answer") {
      const std::string v = need(i, a);
      long long b = 0, e = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%lld:%lld%c", &b, &e, &tail) != 2 || b < 0 || e <= b)
        throw Error("--compare-answer: '" + v + "' is not B:E with 0 <= B < E (token positions)");
      o.compare_answer = v;
    } else if (a == "--quantize-logits") {
      const long long b = parse_integer(need(i, a), a);
      if (b < 2 || b > 16) throw Error("--quantize-logits: " + std::to_string(b) + " bits is outside 2..16");
      o.quantize_bits = int(b);
    } else if (a == "--ablate" || a == "--head-lambda") {
      std::string v = need(i, a);
      std::string mode = a == "--ablate" ? "head" : "lambda";
      float lambda = 0.f;
      if (a == "--head-lambda") {
        const size_t eq = v.find('=');
        if (eq == std::string::npos) throw Error("--head-lambda takes LAYER.HEAD=VALUE, e.g. --head-lambda 3.1=0.5");
        lambda = float(parse_number(v.substr(eq + 1), "--head-lambda value"));
        v.resize(eq);
      } else if (const size_t colon = v.find(':'); colon != std::string::npos) {
        mode = v.substr(colon + 1);
        if (mode != "head" && mode != "a1" && mode != "a2" && mode != "mean")
          throw Error("--ablate: mode '" + mode + "' is not known (L.H:a1, L.H:a2, L.H:head or L.H:mean)");
        v.resize(colon);
      }
      const size_t dot = v.find('.');
      if (dot == std::string::npos)
        throw Error(a + " takes LAYER.HEAD, e.g. " + a + " 3.1");
      const long long l = parse_integer(v.substr(0, dot), a + " layer"), h = parse_integer(v.substr(dot + 1), a + " head");
      if (l < 0 || h < 0) throw Error(a + ": layer and head must be >= 0");
      if (l > INT32_MAX || h > INT32_MAX) throw Error(a + ": layer " + std::to_string(l) + ", head " + std::to_string(h) + " is out of range");
      o.ablate.push_back({int(l), int(h), mode, lambda});
    } else if (a == "--regenerate-lambda-scale") {
      o.regenerate_scale = parse_number(need(i, a), a);
    } else if (a == "--scan") {
      o.scan = need(i, a);
      if (o.scan.empty())
        throw Error("--scan: no file given. HINT: --scan prompts.jsonl");
    } else if (a == "--scan-lambda-scale") {
      o.scan_lambda_scale = parse_number(need(i, a), a);
    } else if (a == "--scan-compare") {
      o.scan_compare = parse_number(need(i, a), a);
    } else if (a == "--scan-max-answer") {
      const long long n = parse_integer(need(i, a), a);
      if (n < 1 || n > 100000)
        throw Error("--scan-max-answer must be between 1 and 100000");
      o.scan_max_answer = int(n);
    } else if (a == "--scan-open") {
      const long long k = parse_integer(need(i, a), a);
      if (k < INT32_MIN || k > INT32_MAX)
        throw Error("--scan-open: '" + std::to_string(k) + "' is out of range");
      o.scan_open = int(k);
    } else if (a == "--scan-report") {
      o.scan_report = need(i, a);
    } else if (a == "--scan-plot") {
      o.scan_plot = need(i, a);
    } else if (a == "--scan-stop-after") {
      const long long n = parse_integer(need(i, a), a);
      if (n < 1 || n > INT32_MAX)
        throw Error("--scan-stop-after must be >= 1");
      o.scan_stop_after = int(n);
    } else if (a == "--scan-view") {
      const std::string v = need(i, a);
      o.scan_view = v == "first" ? 0 : v == "compare" ? 1 : v == "difference" ? 2 : -1;
      if (o.scan_view < 0)
        throw Error("--scan-view: '" + v + "' is not first, compare or difference");
    } else if (a == "--scan-fraction") {
      const std::string v = need(i, a);
      for (int k = 0; k < ds::scan::kNumFractions; ++k)
        if (v == ds::scan::kFractionKeys[k])
          o.scan_fraction = k;
      if (o.scan_fraction < 0)
        throw Error("--scan-fraction: '" + v + "' is not a report key (answer1, answer2, answer_diff, answer_diff_abs, "
                    "sink1, ..., context_diff_abs)");
    } else if (a == "--theme") {
      const std::string v = need(i, a);
      if (v != "dark" && v != "light")
        throw Error("--theme: '" + v + "' is not dark or light");
      o.dark = v == "dark";
    } else if (a == "--overview") {
      static const char* const modes[] = {"a1",    "a2",         "diff",     "entropy",    "entropy-diff", "first",
                                          "first-diff", "negative", "entropy-a2", "max-logit",  "max-logit2"};
      const std::string v = need(i, a);
      for (int m = 0; m < int(sizeof modes / sizeof modes[0]); ++m)
        if (v == modes[m])
          o.overview = m;
      if (o.overview < 0)
        throw Error("--overview: '" + v +
                    "' is not one of a1 a2 diff entropy entropy-diff first first-diff negative entropy-a2 max-logit "
                    "max-logit2");
    } else if (a == "--backend") {
      o.backend = need(i, a);
    } else if (a == "--gpu-mem-limit") {
      o.gpu_mem_limit = ds::parse_size(need(i, a), a);
    } else if (a == "--threads") {
      o.threads = std::atoi(need(i, a).c_str());
    } else if (a == "--screenshot") {
      o.screenshot = need(i, a);
    } else if (a == "--state-json") {
      o.state_json = need(i, a);
    } else if (a == "--open-after") {
      o.open_after = need(i, a);
    } else if (a == "--export-dir") {
      o.export_dir = need(i, a);
    } else if (a == "--mouse") {
      const std::string v = need(i, a);
      float x, y;
      if (std::sscanf(v.c_str(), "%f,%f", &x, &y) != 2)
        throw Error("--mouse: '" + v + "' is not X,Y");
      o.mouse = std::array<float, 2>{x, y};
    } else if (a == "--replay-lambda") {
      const std::string v = need(i, a);
      CliOptions::Replay r;
      if (std::sscanf(v.c_str(), "%d,%lf,%lf,%d", &r.layer, &r.from, &r.to, &r.steps) != 4 || r.layer < 0 ||
          r.steps < 2 || r.steps > 100000 || !std::isfinite(r.from) || !std::isfinite(r.to))
        throw Error("--replay-lambda: '" + v + "' is not LAYER,FROM,TO,STEPS (e.g. 8,0,1.5,60)");
      o.replay = r;
    } else if (a == "--replay-log") {
      o.replay_log = need(i, a);
    } else if (a == "--size") {
      const std::string v = need(i, a);
      if (std::sscanf(v.c_str(), "%dx%d", &o.width, &o.height) != 2 || o.width < 320 || o.height < 240)
        throw Error("--size: '" + v + "' is not WIDTHxHEIGHT (at least 320x240)");
    } else if (!a.empty() && a[0] == '-') {
      throw Error("unknown option '" + a + "'. HINT: diffscope --help");
    } else if (o.model.empty()) {
      o.model = a;
    } else {
      throw Error("unexpected argument '" + a + "': only one model folder can be given");
    }
  }
  if (o.prompt && !o.prompt_file.empty())
    throw Error("--prompt and --prompt-file: give one of them");
  if (!o.state_json.empty() && o.screenshot.empty())
    throw Error("--state-json needs --screenshot");
  if (!o.open_after.empty() && o.screenshot.empty())
    throw Error("--open-after needs --screenshot");
  if (o.mouse && o.screenshot.empty())
    throw Error("--mouse needs --screenshot");
  if (!o.export_dir.empty() && o.screenshot.empty())
    throw Error("--export-dir needs --screenshot");
  if ((o.replay || !o.replay_log.empty()) && o.screenshot.empty())
    throw Error("--replay-lambda and --replay-log need --screenshot");
  if (o.regenerate_scale && o.generate == 0)
    throw Error("--regenerate-lambda-scale needs --generate N");
  if (o.scan.empty() && (o.scan_lambda_scale || o.scan_compare || o.scan_max_answer || o.scan_open ||
                         !o.scan_report.empty() || !o.scan_plot.empty() || o.scan_stop_after || o.scan_view >= 0 ||
                         o.scan_fraction >= 0))
    throw Error("--scan-lambda-scale, --scan-compare, --scan-max-answer, --scan-open, --scan-report, --scan-plot, "
                "--scan-stop-after, --scan-view and --scan-fraction need --scan FILE.jsonl");
  if (o.scan_view > 0 && !o.scan_compare)
    throw Error("--scan-view compare|difference needs --scan-compare X");
  if (!o.scan_report.empty() && !o.scan_plot.empty() &&
      std::filesystem::weakly_canonical(o.scan_report) == std::filesystem::weakly_canonical(o.scan_plot))
    throw Error("--scan-report and --scan-plot name the same file " + o.scan_report);
  if (o.scan_stop_after && o.screenshot.empty())
    throw Error("--scan-stop-after needs --screenshot");
  if (!o.compare_answer.empty() && o.compare.empty())
    throw Error("--compare-answer needs --compare DIR");
  if (!o.replay_log.empty() && !o.replay)
    throw Error("--replay-log needs --replay-lambda");
  return o;
}

}  // namespace ds::gui
