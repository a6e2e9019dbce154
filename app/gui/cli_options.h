// Command line of the diffscope GUI:
//   diffscope [DIR] [--model DIR] [--prompt TEXT | --prompt-file FILE | --ids 1,2,3] [--head L.H] [--view Q0:Q1,K0:K1] [--pool max|mean]
//             [--lambda-scale X] [--generate N [--regenerate-lambda-scale X]] [--temperature T] [--top-p P]
//             [--sample-top-k K] [--seed S] [--ignore-eos]
//             [--theme light|dark] [--overview MODE] [--backend cpu|cuda|auto] [--threads N]
//             [--scan FILE.jsonl [--scan-lambda-scale X] [--scan-compare X] [--scan-max-answer N] [--scan-open K]
//              [--scan-report OUT.json] [--scan-plot OUT.png] [--scan-stop-after N] [--scan-view V] [--scan-fraction KEY]]
//             [--screenshot OUT.png [--state-json OUT.json] [--open-after DIR] [--export-dir DIR] [--size WxH]]
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ds::gui {

struct CliOptions {
  std::string model;  // empty: the default model
  std::optional<std::string> prompt;
  std::string prompt_file;  // --prompt-file FILE: the prompt text from a file
  std::optional<std::vector<int>> ids;
  int layer = -1, head = -1;  // --head L.H
  std::optional<std::array<int64_t, 4>> view;  // --view Q0:Q1,K0:K1: the head view's rectangle at start
  std::optional<bool> mean_pool;               // --pool max|mean
  std::optional<int64_t> row;                  // --row Q: the row view's query (negative from the end)
  std::optional<double> lambda_scale;
  // Generation: --generate N generates N tokens after the first run (then --screenshot waits for it); the sampling
  // flags set the Generate panel's options and match diffscope-run's names.
  int generate = 0;
  std::optional<double> temperature, top_p;
  std::optional<int> sample_top_k;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  bool max_abs_hidden = false;  // --max-abs-hidden: the Table 5 reader on from the start
  struct Ablation {
    int layer = 0, head = 0;
    std::string mode = "head";  // head | a1 | a2 | mean | lambda (--head-lambda: the head's own lambda)
    float lambda = 0.f;
  };
  std::vector<Ablation> ablate;        // --ablate L.H[:MODE], --head-lambda L.H=V (repeatable), from the start
  std::vector<std::string> knockout;   // --knockout L:Q0:Q1,K0:K1 (repeatable; parsed against the model)
  bool lens = false;                   // --lens: the Row panel's logit lens on
  bool outliers = false;               // --outliers: the Profiler's activation outliers on
  std::string compare;                 // --compare DIR: a second model in the Compare panel
  int64_t gpu_mem_limit = 0;           // --gpu-mem-limit SIZE (bytes; 0: each device's free memory)
  std::string compare_answer;          // --compare-answer B:E (checked)
  int quantize_bits = 0;               // --quantize-logits BITS: the lambda panel's quantisation from the start
  bool importance = false;  // --importance: the Overview's head importance, measured after the first run
  std::optional<double> regenerate_scale;  // --regenerate-lambda-scale X: then lambda scale X and Regenerate
  // Corpus scan (the Corpus panel): --scan FILE starts one once the first prompt ran; the rest set its options and
  // what happens when it has finished (open a prompt, save the report and the plot).
  std::string scan;
  std::optional<double> scan_lambda_scale, scan_compare;
  std::optional<int> scan_max_answer;
  std::optional<int> scan_open;  // K-th prompt of the report (negative counts from the end)
  std::string scan_report, scan_plot;
  int scan_stop_after = 0;  // with --screenshot: Stop after N prompts (tests)
  int scan_view = -1;       // --scan-view first|compare|difference: 0, 1, 2
  int scan_fraction = -1;   // --scan-fraction KEY: index into ds::scan::kFractionKeys
  std::optional<bool> dark;
  int overview = -1;  // --overview MODE: OverviewMode index, -1 = remembered / default
  std::string backend = "auto";
  int threads = 0;
  std::string screenshot;  // non-empty: render once the run is done, write PNG, exit
  std::string state_json;
  std::string open_after;  // screenshot mode: open this model after the first run (error-path tests)
  std::string export_dir;  // screenshot mode: also run every exporter into this folder (tests)
  int width = 1600, height = 1000;
  std::optional<std::array<float, 2>> mouse;  // --mouse X,Y: with --screenshot, the pointer rests there (tooltips)
  // --replay-lambda L,FROM,TO,STEPS: with --screenshot, drag layer L's lambda from FROM to TO over STEPS frames
  // (one value a frame, as a mouse drag does), then capture; --replay-log FILE: per-frame times as CSV.
  struct Replay {
    int layer = 0;
    double from = 0, to = 1;
    int steps = 0;
  };
  std::optional<Replay> replay;
  std::string replay_log;
  bool help = false;
};

// Throws ds::Error with a one-line message on a bad argument.
CliOptions parse_cli(int argc, char** argv);
const char* cli_usage();

}  // namespace ds::gui
