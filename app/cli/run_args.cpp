// See run_args.h.
#include "run_args.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>

#include "engine/session/backends.h"
#include "engine/core/error.h"

namespace ds::cli {

const char* kUsage =
    "usage: diffscope-run --model DIR (--prompt TEXT | --token-ids 1,2,3) [options]\n"
    "       diffscope-run --tokenizer FILE --tokenize-jsonl IN.jsonl\n"
    "\n"
    "  --model DIR            Hugging Face model folder (config.json + *.safetensors)\n"
    "  --prompt TEXT          prompt text (needs the folder's tokenizer.json / tokenizer.model)\n"
    "  --token-ids LIST       comma-separated token ids instead of a prompt\n"
    "  --prompt-file FILE     the prompt's text from a file (UTF-8)\n"
    "  --token-ids-file FILE  token ids from a file, separated by commas or whitespace\n"
    "  --backend cpu|cuda|cuda:N|auto  compute backend (default auto: CUDA when a GPU is usable; cuda:N = GPU N);\n"
    "                         a list (cuda:0,1 or cuda:all) puts the model on as few of them as hold it, its layers\n"
    "                         in contiguous blocks (the residual stream handed across once per boundary)\n"
    "  --gpu-mem-limit SIZE   with a list: at most SIZE (20G, 512M) on each device, forcing a split a large card\n"
    "                         would not need; the layers are placed for the prompt and --generate tokens, and the\n"
    "                         placement is printed (--json: \"backend\")\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "  --top-k N              next-token candidates to print (default 5)\n"
    "  --lambda LAYER=VALUE   override lambda of one layer (repeatable; differential models only)\n"
    "  --lambda-scale X       multiply every layer's model lambda by X (layers without an override)\n"
    "  --ablate L.H[:MODE]    ablate view head H of layer L (repeatable). MODE head (the default): zero its output\n"
    "                         (after its sub-layer norm, before o_proj); a1: drop A1 (keep -lambda A2 V, then the\n"
    "                         norm); a2: drop A2 (lambda 0 for that head); mean: its output replaced by its mean\n"
    "                         over the prompt's positions. The --json output and the dump record the interventions\n"
    "                         in force\n"
    "  --scale-head L.H=X     multiply that head's output by X instead (repeatable; one scale a head: with --ablate\n"
    "                         L.H, an error)\n"
    "  --head-lambda L.H=V    lambda V for view head H of layer L alone (differential models)\n"
    "  --knockout L:Q0:Q1,K0:K1  query positions [Q0, Q1) of layer L do not see keys [K0, K1), in both maps\n"
    "                         (repeatable). L: a layer, a range A-B or all; positions below 0 count from the\n"
    "                         prompt's end (-1: its last token; Q1 or K1 left empty after one: to the end of the\n"
    "                         sequence, generated tokens included; K1 left empty after K0 >= 0 too), e.g.\n"
    "                         all:-1:,5:9. A query left with no key attends to nothing (that head's output there\n"
    "                         is 0)\n"
    "  --importance FILE.json head importance: log p(target) change when each head of each attention layer is\n"
    "                         ablated (one at a time, re-running from its layer), as {\"target\", \"base_logp\",\n"
    "                         \"layers\", \"modes\": {\"a2\": [[delta per head] per layer], \"a1\": ..., \"head\": ...}}\n"
    "  --importance-target ID the token whose log p is followed (default: the greedy next token)\n"
    "  --importance-modes M,..  the ablation modes measured (a2, a1, head, mean; default: a2, a1, head, or head\n"
    "                         alone for plain heads)\n"
    "  --lens FILE.json       the logit lens: each layer's output through the final norm and the LM head, as\n"
    "                         {\"target\", \"layers\": [{\"layer\", \"positions\": [{\"position\", \"top\": [{\"id\",\n"
    "                         \"prob\"}], \"target_prob\", \"target_rank\"}]}]} (the last layer's: the model's logits)\n"
    "  --lens-positions P,..  positions of the lens (default -1: the last; below 0 counts from the end)\n"
    "  --quantize-logits BITS every attention logit fake-quantised to BITS (2..16) bits before the softmax (symmetric,\n"
    "                         absmax per query row and head; paper Figure 8): every output is the quantised model's,\n"
    "                         and the KL of the next token from full precision's and the largest change of\n"
    "                         A1 - lambda A2 over the last position's rows are printed (--json: \"quantization\")\n"
    "  --outliers FILE.json   activation outliers (paper Table 5): per layer the 1st, 2nd, 3rd, 10th and 100th\n"
    "                         largest |hidden state| and |attention logit| of map 1 and map 2, and their medians\n"
    "                         (exact; the logits' medians within 2^-17 relatively), as {\"layers\": [{\"layer\",\n"
    "                         \"hidden_top\", \"hidden_median\", \"logit_top1\", \"logit_median1\", \"logit_top2\",\n"
    "                         \"logit_median2\"}], \"model\": {...}}\n"
    "  --lens-top-k K         tokens per position in the lens (default 5)\n"
    "  --lens-target ID       the token whose probability and rank the lens follows (default: the greedy next one)\n"
    "  --generate N           generate up to N tokens after the prompt (KV cache; stops at the model's EOS)\n"
    "                         and print them; --dump, --rows, --view and --stats then cover prompt + generated\n"
    "  --temperature T        sample with temperature T (default 0: greedy)\n"
    "  --sample-top-k K       sample from the K most likely tokens only (default 0: all)\n"
    "  --top-p P              sample from the smallest set of tokens whose probability reaches P (default 1)\n"
    "  --seed S               the sampler's seed (default 0): the same seed gives the same continuation\n"
    "  --ignore-eos           keep generating past the model's end-of-sequence token\n"
    "  --dump FILE            write logits [n, vocab], per layer layers.L.attn1/attn2 [H, n, n], layers.L.lambda [1]\n"
    "                         and layers.L.head_lambda [H] (the lambda of each head's A1 - lambda A2: the layer's, or\n"
    "                         the head's own) (Llama: layers.L.attn) as safetensors; with --rows or --view it writes\n"
    "                         those instead\n"
    "                         of the full maps (and only the last position's logits): memory O(n heads + R C).\n"
    "                         Only layers with attention are written (hybrids: no Mamba or GMU layers)\n"
    "  --rows LIST            query positions (negative: from the end, -1 = last): layers.L.rows1 / rows2\n"
    "                         [H, len(LIST), n] in --dump, the exact attention rows of every layer and head\n"
    "  --view L.H             a pooled view of layer L, head H: view.a1, view.a2, view.diff [R, C] in --dump\n"
    "  --grid R,C             the view's grid (default 256,256; capped at the rectangle: small ones are exact)\n"
    "  --pool max|mean        how a block of cells is reduced (default max; D keeps its largest-magnitude entry)\n"
    "  --rect Q0:Q1,K0:K1     the view's rectangle of query rows x key columns (default: the whole map)\n"
    "  --stats FILE.json      per attention layer and head: entropies, first-token mass, negative mass, max |logit|;\n"
    "                         per layer max_abs_hidden, the largest |hidden state| of its output (paper Table 5)\n"
    "  --sweep L,FROM,TO,STEPS lambda sweep of layer L: for STEPS values from FROM to TO, the next token's log p\n"
    "                         (a re-run from L per value) and each head's difference entropy; a table, or\n"
    "                         \"sweep\" in the --json output\n"
    "  --sweep-head H         the sweep's entropy of view head H only\n"
    "  --tokenizer FILE       tokenizer.json or tokenizer.model (with --tokenize-jsonl)\n"
    "  --tokenize-jsonl FILE  for each line {\"text\": ...} print {\"ids\": [...]} (no special tokens added)\n"
    "  --add-special          with --tokenize-jsonl: add the tokenizer's special tokens (e.g. BOS)\n"
    "  --decode               with --tokenize-jsonl: also print \"decoded\": the ids decoded back to text\n"
    "  --json                 print the result as one JSON object instead of a table\n"
    "  -h, --help             this help\n";

namespace {

long long parse_int(const std::string& s, const std::string& what) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos != s.size() || s.empty()) throw ArgError(what + ": '" + s + "' is not an integer");
  return v;
}

double parse_double(const std::string& s, const std::string& what) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos != s.size() || s.empty() || !std::isfinite(v)) throw ArgError(what + ": '" + s + "' is not a finite number");
  return v;
}

}  // namespace

Args parse_args(int argc, const char* const* argv) {
  Args a;
  std::optional<std::pair<int, int>> grid;
  std::optional<bool> pool_mean;
  std::optional<std::array<int64_t, 4>> rect;
  int sources = 0;  // --prompt, --prompt-file, --token-ids, --token-ids-file given
  bool lens_given = false;  // --lens-positions, --lens-top-k or --lens-target
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw ArgError(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      a.help = true;
      return a;
    } else if (k == "--model") {
      a.model = value(i);
    } else if (k == "--prompt") {
      a.prompt = value(i);
      a.have_prompt = true;
      ++sources;
    } else if (k == "--token-ids") {
      ++sources;
      const std::string s = value(i);
      std::vector<int32_t> ids;
      size_t p = 0;
      while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        const long long v = parse_int(s.substr(p, q - p), "--token-ids");
        if (v < 0 || v > INT32_MAX) throw ArgError("--token-ids: " + std::to_string(v) + " is not a valid token id");
        ids.push_back(int32_t(v));
        p = q + 1;
      }
      a.ids = ids;
    } else if (k == "--prompt-file") {
      a.prompt_file = value(i);
      a.have_prompt = true;
      ++sources;
    } else if (k == "--token-ids-file") {
      a.token_ids_file = value(i);
      ++sources;
    } else if (k == "--rows") {
      const std::string s = value(i);
      size_t p = 0;
      while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        const long long v = parse_int(s.substr(p, q - p), "--rows");
        if (v < -(1LL << 40) || v > (1LL << 40)) throw ArgError("--rows: " + std::to_string(v) + " is out of range");
        a.rows.push_back(v);
        p = q + 1;
      }
    } else if (k == "--view") {
      const std::string s = value(i);
      const size_t dot = s.find('.');
      if (dot == std::string::npos) throw ArgError("--view takes LAYER.HEAD, e.g. --view 3.1");
      ViewArgs v = a.view.value_or(ViewArgs{});
      const long long l = parse_int(s.substr(0, dot), "--view layer"), h = parse_int(s.substr(dot + 1), "--view head");
      if (l < 0 || l > INT32_MAX || h < 0 || h > INT32_MAX) throw ArgError("--view: layer and head must be >= 0");
      v.layer = int(l), v.head = int(h);
      a.view = v;
    } else if (k == "--grid") {
      const std::string s = value(i);
      const size_t c = s.find(',');
      if (c == std::string::npos) throw ArgError("--grid takes ROWS,COLS, e.g. --grid 512,512");
      const long long r = parse_int(s.substr(0, c), "--grid rows"), cc = parse_int(s.substr(c + 1), "--grid cols");
      if (r < 1 || r > 8192 || cc < 1 || cc > 8192) throw ArgError("--grid: rows and columns must be 1..8192");
      grid = {int(r), int(cc)};
    } else if (k == "--pool") {
      const std::string s = value(i);
      if (s != "max" && s != "mean") throw ArgError("--pool must be max or mean, not '" + s + "'");
      pool_mean = s == "mean";
    } else if (k == "--rect") {
      const std::string s = value(i);
      const size_t comma = s.find(',');
      if (comma == std::string::npos) throw ArgError("--rect takes Q0:Q1,K0:K1, e.g. --rect 0:512,0:512");
      std::array<int64_t, 4> b{};
      for (int t = 0; t < 2; ++t) {
        const std::string part = t == 0 ? s.substr(0, comma) : s.substr(comma + 1);
        const size_t colon = part.find(':');
        if (colon == std::string::npos) throw ArgError("--rect takes Q0:Q1,K0:K1, e.g. --rect 0:512,0:512");
        const long long lo = parse_int(part.substr(0, colon), "--rect"), hi = parse_int(part.substr(colon + 1), "--rect");
        if (lo < 0 || hi > (1LL << 40) || lo >= hi) throw ArgError("--rect: each range must be 0 <= start < end");
        b[size_t(2 * t)] = lo, b[size_t(2 * t + 1)] = hi;
      }
      rect = b;
    } else if (k == "--stats") {
      a.stats = value(i);
    } else if (k == "--sweep") {
      const std::string v = value(i);
      std::vector<std::string> f;
      for (size_t p = 0;;) {
        const size_t c = v.find(',', p);
        f.push_back(v.substr(p, c == std::string::npos ? std::string::npos : c - p));
        if (c == std::string::npos) break;
        p = c + 1;
      }
      if (f.size() != 4) throw ArgError("--sweep: expected LAYER,FROM,TO,STEPS (e.g. 3,-0.5,1.5,17), got '" + v + "'");
      SweepArgs sw;
      sw.layer = int(parse_int(f[0], "--sweep layer"));
      sw.from = parse_double(f[1], "--sweep from");
      sw.to = parse_double(f[2], "--sweep to");
      const long long steps = parse_int(f[3], "--sweep steps");
      if (steps < 2 || steps > 1000) throw ArgError("--sweep: steps must be 2 to 1000, not " + f[3]);
      sw.steps = int(steps);
      a.sweep = sw;
    } else if (k == "--sweep-head") {
      a.sweep_head = int(parse_int(value(i), "--sweep-head"));
    } else if (k == "--backend") {
      a.backend = value(i);
      try {
        ds::parse_backend_list(a.backend);
      } catch (const ds::Error&) {
        throw ArgError("--backend must be cpu, cuda, cuda:N or auto, or a list (cuda:0,1, cuda:all), not '" + a.backend + "'");
      }
    } else if (k == "--gpu-mem-limit") {
      try {
        a.gpu_mem_limit = ds::parse_size(value(i), "--gpu-mem-limit");
      } catch (const ds::Error& e) {
        throw ArgError(e.what());
      }
    } else if (k == "--threads") {
      const long long t = parse_int(value(i), "--threads");
      if (t < 0 || t > 1024) throw ArgError("--threads must be between 0 and 1024");
      a.threads = int(t);
    } else if (k == "--top-k") {
      const long long t = parse_int(value(i), "--top-k");
      if (t < 0 || t > 1000000) throw ArgError("--top-k must be between 0 and 1000000");
      a.top_k = int(t);
    } else if (k == "--generate") {
      const long long t = parse_int(value(i), "--generate");
      if (t < 1 || t > 1000000) throw ArgError("--generate must be between 1 and 1000000");
      a.generate = int(t);
    } else if (k == "--temperature") {
      a.temperature = parse_double(value(i), "--temperature");
      if (a.temperature < 0) throw ArgError("--temperature must be >= 0 (0 = greedy)");
      a.sampling_given = true;
    } else if (k == "--top-p") {
      a.top_p = parse_double(value(i), "--top-p");
      if (!(a.top_p > 0 && a.top_p <= 1)) throw ArgError("--top-p must be in (0, 1]");
      a.sampling_given = true;
    } else if (k == "--sample-top-k") {
      const long long t = parse_int(value(i), "--sample-top-k");
      if (t < 0 || t > INT32_MAX) throw ArgError("--sample-top-k must be >= 0 (0 = no limit)");
      a.sample_top_k = int(t);
      a.sampling_given = true;
    } else if (k == "--seed") {
      const long long t = parse_int(value(i), "--seed");
      if (t < 0) throw ArgError("--seed must be >= 0");
      a.seed = uint64_t(t);
      a.sampling_given = true;
    } else if (k == "--ignore-eos") {
      a.ignore_eos = true;
      a.sampling_given = true;
    } else if (k == "--lambda") {
      const std::string s = value(i);
      const size_t eq = s.find('=');
      if (eq == std::string::npos) throw ArgError("--lambda takes LAYER=VALUE, e.g. --lambda 3=0.5");
      const long long layer = parse_int(s.substr(0, eq), "--lambda layer");
      if (layer < 0 || layer > INT32_MAX) throw ArgError("--lambda: layer must be >= 0");
      a.lambdas.push_back({int(layer), parse_double(s.substr(eq + 1), "--lambda value")});
    } else if (k == "--ablate" || k == "--scale-head" || k == "--head-lambda") {
      // --ablate L.H[:MODE], --scale-head L.H=X, --head-lambda L.H=V
      std::string s = value(i);
      Args::InterventionArg x;
      if (k == "--ablate") {
        x.mode = "head";
        const size_t colon = s.find(':');
        if (colon != std::string::npos) {
          x.mode = s.substr(colon + 1);
          if (x.mode != "head" && x.mode != "a1" && x.mode != "a2" && x.mode != "mean")
            throw ArgError("--ablate: mode '" + x.mode + "' is not known (L.H:a1, L.H:a2, L.H:head or L.H:mean)");
          s.resize(colon);
        }
      } else {
        const size_t eq = s.find('=');
        if (eq == std::string::npos) throw ArgError(k + " takes LAYER.HEAD=VALUE, e.g. " + k + " 3.1=0.5");
        x.kind = k == "--scale-head" ? Args::InterventionArg::Scale : Args::InterventionArg::HeadLambda;
        x.value = float(parse_double(s.substr(eq + 1), k + " value"));
        s.resize(eq);
      }
      const size_t dot = s.find('.');
      if (dot == std::string::npos) throw ArgError(k + " takes LAYER.HEAD, e.g. " + k + " 3.1");
      const long long l = parse_int(s.substr(0, dot), k + " layer"), h = parse_int(s.substr(dot + 1), k + " head");
      if (l < 0 || h < 0) throw ArgError(k + ": layer and head must be >= 0");
      if (l > INT32_MAX || h > INT32_MAX) throw ArgError(k + ": layer " + std::to_string(l) + ", head " +
                                                         std::to_string(h) + " is out of range");
      x.layer = int(l), x.head = int(h);
      a.interventions.push_back(x);
    } else if (k == "--knockout") {
      Args::InterventionArg x;
      x.kind = Args::InterventionArg::Knockout;
      x.knockout = value(i);
      a.interventions.push_back(x);
    } else if (k == "--importance-modes") {
      const std::string s = value(i);
      a.importance_modes.clear();
      for (size_t p = 0; p <= s.size();) {
        const size_t c = std::min(s.find(',', p), s.size());
        const std::string m = s.substr(p, c - p);
        if (m != "a1" && m != "a2" && m != "head" && m != "mean")
          throw ArgError("--importance-modes: '" + m + "' is not a mode (a2, a1, head, mean)");
        if (std::find(a.importance_modes.begin(), a.importance_modes.end(), m) != a.importance_modes.end())
          throw ArgError("--importance-modes: '" + m + "' is given twice");
        a.importance_modes.push_back(m);
        p = c + 1;
      }
    } else if (k == "--quantize-logits") {
      const long long b = parse_int(value(i), "--quantize-logits");
      if (b < 2 || b > 16) throw ArgError("--quantize-logits: " + std::to_string(b) + " bits is outside 2..16");
      a.quantize_bits = int(b);
    } else if (k == "--outliers") {
      a.outliers = value(i);
    } else if (k == "--lens") {
      a.lens = value(i);
    } else if (k == "--lens-positions") {
      lens_given = true;
      const std::string s = value(i);
      a.lens_positions.clear();
      for (size_t p = 0; p <= s.size();) {
        const size_t c = std::min(s.find(',', p), s.size());
        a.lens_positions.push_back(parse_int(s.substr(p, c - p), "--lens-positions"));
        p = c + 1;
      }
    } else if (k == "--lens-top-k") {
      lens_given = true;
      const long long t = parse_int(value(i), "--lens-top-k");
      if (t < 1 || t > 1000000) throw ArgError("--lens-top-k must be between 1 and 1000000");
      a.lens_top_k = int(t);
    } else if (k == "--lens-target") {
      lens_given = true;
      const long long t = parse_int(value(i), "--lens-target");
      if (t < 0 || t > INT32_MAX) throw ArgError("--lens-target must be a token id >= 0");
      a.lens_target = int32_t(t);
    } else if (k == "--importance") {
      a.importance = value(i);
    } else if (k == "--importance-target") {
      const long long t = parse_int(value(i), "--importance-target");
      if (t < 0 || t > INT32_MAX) throw ArgError("--importance-target must be a token id >= 0");
      a.importance_target = int32_t(t);
    } else if (k == "--lambda-scale") {
      a.lambda_scale = parse_double(value(i), "--lambda-scale");
    } else if (k == "--dump") {
      a.dump = value(i);
    } else if (k == "--tokenizer") {
      a.tokenizer = value(i);
    } else if (k == "--tokenize-jsonl") {
      a.tokenize_jsonl = value(i);
    } else if (k == "--add-special") {
      a.add_special = true;
    } else if (k == "--decode") {
      a.decode = true;
    } else if (k == "--json") {
      a.json = true;
    } else {
      throw ArgError("unknown argument '" + k + "' (see --help)");
    }
  }
  if (!a.tokenize_jsonl.empty()) {
    if (a.tokenizer.empty() && a.model.empty()) throw ArgError("--tokenize-jsonl needs --tokenizer FILE or --model DIR");
    return a;
  }
  if (a.model.empty()) throw ArgError("--model DIR is required (see --help)");
  if (sources > 1)
    throw ArgError("give one of --prompt, --prompt-file, --token-ids, --token-ids-file");
  if (sources == 0)
    throw ArgError("give a prompt: --prompt TEXT, --prompt-file F, --token-ids 1,2,3 or --token-ids-file F");
  if ((grid || pool_mean || rect) && !a.view) throw ArgError("--grid, --pool and --rect go with --view L.H");
  if (a.view) {
    if (grid) a.view->rows = grid->first, a.view->cols = grid->second;
    if (pool_mean) a.view->mean = *pool_mean;
    if (rect) a.view->q0 = (*rect)[0], a.view->q1 = (*rect)[1], a.view->k0 = (*rect)[2], a.view->k1 = (*rect)[3];
  }
  if ((a.view || !a.rows.empty()) && a.dump.empty()) throw ArgError("--rows and --view write into --dump FILE");
  if (a.sweep_head && !a.sweep) throw ArgError("--sweep-head goes with --sweep L,FROM,TO,STEPS");
  if (a.lens.empty() && lens_given)
    throw ArgError("--lens-positions, --lens-top-k and --lens-target go with --lens FILE.json");
  if (a.importance.empty() && (a.importance_target >= 0 || !a.importance_modes.empty()))
    throw ArgError("--importance-target and --importance-modes go with --importance FILE.json");
  // One value a head for its output's scale (--ablate L.H, --scale-head) and for its lambda (--ablate L.H:a2,
  // --head-lambda): a second one would silently replace the first.
  for (size_t i = 0; i < a.interventions.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      using K = Args::InterventionArg;
      const K &x = a.interventions[i], &y = a.interventions[j];
      if (x.kind == K::Knockout || y.kind == K::Knockout || x.layer != y.layer || x.head != y.head) continue;
      auto sets = [](const K& z, float& v) {  // 1: the output's scale, 2: the lambda, 0: neither; v: the value
        v = z.kind == K::Ablate ? 0.f : z.value;
        if (z.kind == K::Scale || (z.kind == K::Ablate && z.mode == "head")) return 1;
        if (z.kind == K::HeadLambda || (z.kind == K::Ablate && z.mode == "a2")) return 2;
        return 0;
      };
      float vx = 0, vy = 0;
      const int sx = sets(x, vx), sy = sets(y, vy);
      if (sx != 0 && sx == sy && vx != vy) {
        auto name = [](const K& z) {
          const std::string h = std::to_string(z.layer) + "." + std::to_string(z.head);
          return z.kind == K::Ablate ? "--ablate " + h + ":" + z.mode : std::string(z.kind == K::Scale ? "--scale-head " : "--head-lambda ") + h;
        };
        throw ArgError(name(x) + ": head " + std::to_string(x.layer) + "." + std::to_string(x.head) + "'s " +
                       (sx == 1 ? "output scale" : "lambda") + " is already set by " + name(y) + " (one value a head)");
      }
    }
  if (a.sweep && a.sweep_head) a.sweep->head = *a.sweep_head;
  if (a.sampling_given && a.generate == 0)
    throw ArgError("--temperature, --sample-top-k, --top-p, --seed and --ignore-eos go with --generate N");
  return a;
}

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  size_t p = 0;
  const auto sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (p < s.size()) {
    while (p < s.size() && sep(s[p])) ++p;
    size_t q = p;
    while (q < s.size() && !sep(s[q])) ++q;
    if (q == p) break;
    const long long v = parse_int(s.substr(p, q - p), what);
    if (v < 0 || v > INT32_MAX) throw ArgError(what + ": " + std::to_string(v) + " is not a valid token id");
    ids.push_back(int32_t(v));
    p = q;
  }
  if (ids.empty()) throw ArgError(what + ": no token ids");
  return ids;
}

}  // namespace ds::cli
