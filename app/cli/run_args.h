// diffscope-run's command line: parsing only, kept apart from running so that it can be fuzzed.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ds::cli {

extern const char* kUsage;

// Bad arguments: exit code 2.
struct ArgError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --view L.H with its grid, pooling and optional rectangle (engine/core/map_query.h).
struct ViewArgs {
  int layer = 0, head = 0;
  int rows = 256, cols = 256;
  bool mean = false;
  int64_t q0 = 0, q1 = -1, k0 = 0, k1 = -1;  // -1: to the end
};

// --sweep L,FROM,TO,STEPS (engine/session/session_sweep.h), --sweep-head H (default: every view head).
struct SweepArgs {
  int layer = 0, steps = 0, head = -1;
  double from = 0, to = 0;
};

struct Args {
  std::string model, prompt, dump, tokenizer, tokenize_jsonl, backend = "auto";
  int64_t gpu_mem_limit = 0;  // --gpu-mem-limit (0: each device's free memory)
  std::string prompt_file, token_ids_file, stats;  // files read / written by run(), not by the parser
  std::vector<int64_t> rows;                        // --rows positions (negative: from the end)
  std::optional<ViewArgs> view;
  std::optional<SweepArgs> sweep;
  std::optional<int> sweep_head;
  std::optional<std::vector<int32_t>> ids;
  bool have_prompt = false, json = false, help = false;
  bool add_special = false, decode = false;  // --tokenize-jsonl options
  int top_k = 5, threads = 0;
  std::vector<std::pair<int, double>> lambdas;
  // --ablate L.H[:MODE], --scale-head L.H=X, --head-lambda L.H=V, --knockout SPEC, in the order given (checked against
  // the model by run(): Session::ablate, set_head_scale, set_head_mix, parse_knockout).
  struct InterventionArg {
    enum Kind { Ablate, Scale, HeadLambda, Knockout } kind = Ablate;
    int layer = 0, head = 0;
    float value = 0.f;     // Scale: the factor; HeadLambda: the head's lambda
    std::string mode;      // Ablate: a1 | a2 | head
    std::string knockout;  // Knockout: L:Q0:Q1,K0:K1
  };
  std::vector<InterventionArg> interventions;
  std::string importance;                 // --importance FILE.json
  int32_t importance_target = -1;         // --importance-target ID (-1: the greedy next token)
  std::vector<std::string> importance_modes;  // --importance-modes a2,a1,head (default: all the model has)
  std::string lens;                       // --lens FILE.json (the logit lens, session_lens.h)
  std::string outliers;                   // --outliers FILE.json (activation outliers, session_outliers.h)
  int quantize_bits = 0;                  // --quantize-logits BITS (session_quantize.h)
  std::vector<int64_t> lens_positions;    // --lens-positions P,... (default: the last)
  int lens_top_k = 5;                     // --lens-top-k K
  int32_t lens_target = -1;               // --lens-target ID (default: the greedy next token)
  std::optional<double> lambda_scale;
  // generation (engine/session/session.h): --generate N, sampling options, --ignore-eos
  int generate = 0;
  double temperature = 0.0, top_p = 1.0;
  int sample_top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool sampling_given = false;  // any of --temperature/--top-p/--sample-top-k/--seed (they need --generate)
};

// Throws ArgError with a one-line message. Sets help (and nothing else is checked) for -h/--help.
Args parse_args(int argc, const char* const* argv);

// Token ids separated by commas and/or whitespace; throws ArgError naming `what` and the bad entry.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what);

}  // namespace ds::cli
