// See run_args.h.
#include "run_args.h"

#include <climits>
#include <cmath>

#include "engine/backends.h"
#include "engine/error.h"

namespace ds::cli {

const char* kUsage =
    "usage: diffscope-run --model DIR (--prompt TEXT | --token-ids 1,2,3) [options]\n"
    "       diffscope-run --tokenizer FILE --tokenize-jsonl IN.jsonl\n"
    "\n"
    "  --model DIR            Hugging Face model folder (config.json + *.safetensors)\n"
    "  --prompt TEXT          prompt text (needs the folder's tokenizer.json / tokenizer.model)\n"
    "  --token-ids LIST       comma-separated token ids instead of a prompt\n"
    "  --backend cpu|cuda|cuda:N|auto  compute backend (default auto: CUDA when a GPU is usable; cuda:N = GPU N)\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "  --top-k N              next-token candidates to print (default 5)\n"
    "  --lambda LAYER=VALUE   override lambda of one layer (repeatable; DiffLlama only)\n"
    "  --lambda-scale X       multiply every layer's model lambda by X (layers without an override)\n"
    "  --dump FILE            write logits [n, vocab], per layer layers.L.attn1/attn2 [H, n, n] and layers.L.lambda\n"
    "                         (Llama: layers.L.attn) as safetensors\n"
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
    } else if (k == "--token-ids") {
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
    } else if (k == "--backend") {
      a.backend = value(i);
      try {
        ds::parse_backend_choice(a.backend);
      } catch (const ds::Error&) {
        throw ArgError("--backend must be cpu, cuda, cuda:N or auto, not '" + a.backend + "'");
      }
    } else if (k == "--threads") {
      const long long t = parse_int(value(i), "--threads");
      if (t < 0 || t > 1024) throw ArgError("--threads must be between 0 and 1024");
      a.threads = int(t);
    } else if (k == "--top-k") {
      const long long t = parse_int(value(i), "--top-k");
      if (t < 0 || t > 1000000) throw ArgError("--top-k must be between 0 and 1000000");
      a.top_k = int(t);
    } else if (k == "--lambda") {
      const std::string s = value(i);
      const size_t eq = s.find('=');
      if (eq == std::string::npos) throw ArgError("--lambda takes LAYER=VALUE, e.g. --lambda 3=0.5");
      const long long layer = parse_int(s.substr(0, eq), "--lambda layer");
      if (layer < 0 || layer > INT32_MAX) throw ArgError("--lambda: layer must be >= 0");
      a.lambdas.push_back({int(layer), parse_double(s.substr(eq + 1), "--lambda value")});
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
  if (a.have_prompt && a.ids) throw ArgError("give either --prompt or --token-ids, not both");
  if (!a.have_prompt && !a.ids) throw ArgError("give a prompt: --prompt TEXT or --token-ids 1,2,3");
  return a;
}


}  // namespace ds::cli
