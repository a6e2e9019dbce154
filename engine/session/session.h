// The one object the GUI, the CLI, the tests and the benchmarks drive: a loaded model on a backend, its
// tokenizer, the prompt, the lambda controls and the latest results. Not thread-safe: the GUI owns it on its
// worker thread.
#pragma once
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/session/backends.h"
#include "engine/core/error.h"
#include "engine/core/sampling.h"
#include "engine/core/tokenizer.h"

namespace ds {

// Per layer: the checkpoint's lambda, that lambda times the global scale, or an absolute override.
struct LambdaControl {
  double scale = 1.0;                          // applies to layers without an override
  std::vector<std::optional<double>> override_;  // [L]
};

struct TopToken {
  int32_t id;
  float prob;
  float logit;
  std::string text;
};

// An intervention on one view head's output (the one forward's HeadOut writer, forward.h scale_head_hook): the head's
// output after its sub-layer norm and 1 - lambda_init, before o_proj, times `factor` (0: the head ablated).
struct HeadScale {
  int layer = 0, head = 0;
  float factor = 0.f;
  bool operator==(const HeadScale&) const = default;
};

// How one differential view head combines its two maps (the attention op's edit, forward.h AttnEdit): its output before
// the sub-layer norm is (drop_a1 ? 0 : A1 V) - lambda_h A2 V, lambda_h = lambda or else the layer's. lambda 0 drops A2.
struct HeadMix {
  int layer = 0, head = 0;
  bool drop_a1 = false;
  std::optional<float> lambda;
  bool operator==(const HeadMix&) const = default;
};

// Attention knockout: in layers [layer0, layer1) (those with attention), query positions [q0, q1) do not see keys
// [k0, k1), in both maps. Positions below 0 count from the end of the prompt (-1: its last token; the prompt as given,
// so that generated tokens do not move them); q1 / k1 of 0 after a negative q0 / k0 mean "to the end of the
// sequence", generated tokens included: "-1:" as the query span knocks out the last prompt token's view and that of
// every token generated after it, as a full forward of the whole sequence would.
struct Knockout {
  // An end of a span from a start >= 0 to the end of the sequence ("5:"; a negative start takes an end of 0)
  static constexpr int64_t kToEnd = std::numeric_limits<int64_t>::max();
  int layer0 = 0, layer1 = 0;
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  bool operator==(const Knockout&) const = default;
};
// "3:-1:,5:9" (layer 3, query the last position, keys 5..8), "all:...", "2-4:..." (layers 2, 3, 4): diffscope-run's
// --knockout; throws ds::Error naming the problem.
Knockout parse_knockout(const std::string& spec, int layers);
// That view head `head` of attention layer `layer` exists (Session::ablate and the other head edits check it so);
// throws ds::Error naming the problem, `what` the edit ("heads to ablate") for a layer without attention.
void check_view_head(const ModelConfig& c, int layer, int head, const char* what);
// Its layers (with attention) and the shape of its spans against the model, as Session::add_knockout checks them;
// throws ds::Error naming the problem.
void check_knockout(const ModelConfig& c, const Knockout& k);
// Its spans as positions of a sequence of n tokens whose prompt is the first prompt_len (negative positions count
// from the prompt's end); throws ds::Error for a span outside it.
fwd::KeySpan resolve_knockout(const Knockout& k, int64_t n, int64_t prompt_len);
std::string knockout_text(const Knockout& k);

struct GenerateOptions {
  int max_new = 64;            // tokens to generate at most
  SamplingOptions sampling;    // greedy by default
  bool stop_at_eos = true;     // stop after the model's end-of-sequence token (config / generation_config)
};

enum class StopReason { None, Eos, MaxTokens, ContextFull, Stopped };
const char* stop_reason_name(StopReason r);  // "", "eos", "max_tokens", "context_full", "stopped"

class Session {
 public:
  // Loads config + weights, validates, uploads to the backend. Throws ds::Error; nothing half-made survives.
  static std::unique_ptr<Session> open(const std::string& model_dir, BackendChoice backend,
                                       const ProgressFn& progress = nullptr, int cpu_threads = 0);
  // Several devices (--backend cuda:0,1, cuda:all; cpu,cpu in the tests): the model on as few of them as hold it, its
  // layers in contiguous blocks (engine/session/split_backend.h); gpu_mem_limit: bytes each device may hold (0: its
  // free memory), which forces a split a large card would not need and refuses prompts such a card could not hold;
  // plan_tokens: the prompt length (with what will be generated) the placement plans activations for (0: 4096).
  static std::unique_ptr<Session> open(const std::string& model_dir, const std::vector<BackendChoice>& backends,
                                       const ProgressFn& progress, int cpu_threads, int64_t gpu_mem_limit,
                                       int64_t plan_tokens = 0);

  const ModelConfig& config() const { return cfg_; }
  const std::string& model_dir() const { return dir_; }
  Backend& backend() { return *backend_; }
  const Tokenizer* tokenizer() const { return tok_.get(); }
  const std::string& tokenizer_error() const { return tok_error_; }  // why there is no tokenizer, if any

  // Prompt. Text needs a tokenizer; ids are checked against the vocabulary and max_position_embeddings.
  void set_prompt(const std::string& text);
  void set_ids(const std::vector<int32_t>& ids);
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::vector<TokenSpan>& tokens() const { return spans_; }  // display labels (from ids when no text)

  // Lambda (differential families; no-ops report 0 for the others and for layers without attention).
  double model_lambda(int layer) const;
  double effective_lambda(int layer) const;
  // The lambda view head `head` of `layer` runs with: its own (set_head_lambda, or 0 with A2 dropped), else the layer's.
  double head_lambda(int layer, int head) const;
  const LambdaControl& lambda_control() const { return lam_; }
  void set_lambda_scale(double s);
  void set_lambda_override(int layer, std::optional<double> value);
  void reset_lambda();

  // Run what is stale: everything after a prompt change, or from the first layer whose lambda changed.
  // Returns the first layer that was recomputed (L when nothing had to run).
  // cancel (optional): polled during a re-run of a prompt that has run before (a lambda change); when it returns true
  // the run stops, throws ds::Cancelled, and the next run() goes on from the first layer it did not finish.
  // cancel_new_prompt: also poll it during the first run of a prompt (the Python module's Ctrl-C); a stopped first
  // run keeps nothing (no result until the next run, which starts at layer 0). The GUI leaves it off: a prompt's
  // first run always completes there, however often the user moves lambda meanwhile.
  int run(bool all_logits = false, const std::function<bool()>& cancel = nullptr, bool cancel_new_prompt = false);
  // Whether run() keeps a per-kernel profile (default on: the GUI's profiler, the CLI's --profile). Off, a forward
  // records no events around its kernels and computes the last layer's attention for the last row alone when only the
  // next-token logits are kept; profile() stays the last profiled run's. A scan turns it off for its prompts.
  void set_profiled(bool on) { profiled_ = on; }
  bool profiled() const { return profiled_; }
  // run() as one of many re-runs queued back to back (head importance): the backend may leave the last position's
  // logits on its device and return before its work is done (ForwardRequest::logits_on_demand; readers fetch them
  // when asked), and keeps no per-kernel profile of it (ForwardRequest::profile; profile() stays the last run's).
  // keep_attention >= 0: that layer's attention output is kept for the next bulk re-runs from it whose input and
  // attention edits are the same (ForwardRequest::keep_attention: ablations by head writers of one layer).
  int run_bulk(const std::function<bool()>& cancel, int keep_attention = -1);
  // The first layer run() would recompute now (0 after a prompt change, L when nothing is stale). The maps of layers
  // up to it are those of the next run already: a lambda change shows in them before the run.
  int stale_from() const;
  const ForwardResult& result() const {  // logits included (fetched now if a greedy step left them on the device)
    ensure_logits();
    return res_;
  }
  bool has_result() const { return has_result_; }
  // Non-empty when the last position's logits hold NaN or Inf (non-finite weights, or a lambda so large that the
  // model overflows): the one-line reason. Every front end shows it instead of a plausible-looking top-k.
  std::string nonfinite_logits() const;

  // Generation. The sequence is the prompt and the tokens generated after it: ids(), tokens(), maps, rows and
  // statistics cover both, and run() after a lambda change re-runs the whole sequence from the changed layer.
  // begin_generation drops an earlier continuation (back to the prompt: the backend cuts its caches where it can,
  // else the prompt runs again), runs what is stale and seeds the sampler; each generate_step then picks the next
  // token from the last position's distribution, appends it and runs only that position (the KV cache), under
  // the lambda in force at that moment. Throws ds::Error for bad options; stops (StopReason) at EOS, max_new, or
  // when the model's positions or the backend's memory are full.
  void begin_generation(const GenerateOptions& o);
  int32_t generate_step();  // the appended id; -1 (and nothing appended) when generation has stopped
  bool generating() const { return gen_active_; }
  StopReason stop_reason() const { return stop_; }
  void stop_generation();   // the user stopped it: keeps what was generated
  // Goes on after a stop (the user's, or max_new) for up to `more` tokens with the same options and sampler stream;
  // false (nothing changed) when nothing was generated, a generation is running, or it ended at EOS or full context.
  bool continue_generation(int more);
  void clear_generation();  // back to the prompt alone
  // begin_generation, then generate_step until it stops or on_token(id) returns false.
  std::vector<int32_t> generate(const GenerateOptions& o, const std::function<bool(int32_t)>& on_token = nullptr);
  int64_t prompt_length() const { return prompt_len_; }
  std::vector<int32_t> generated() const;  // ids after the prompt
  std::string generated_text() const;      // their decoded text (needs a tokenizer; else "")
  bool is_generated(int64_t position) const { return position >= prompt_len_; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }

  // Next-token distribution at the last position.
  std::vector<TopToken> top_k(int k) const;
  std::vector<float> next_token_logprobs() const;  // [vocab]
  // log p of one token (the same value as next_token_logprobs()[id], without the vocabulary-sized array); NaN
  // without a result.
  double next_token_logprob(int32_t id) const;
  // The same of the last run, into slot `slot` (below kLogprobSlots) without waiting where the backend can queue it
  // (CUDA: a kernel after the forward); take_queued_logprobs(count) waits and returns slots [0, count). Head
  // importance queues a layer's ablations back to back this way.
  static constexpr int kLogprobSlots = 256;  // (Backend::queue_logprob's)
  void queue_next_token_logprob(int32_t id, int slot);
  std::vector<double> take_queued_logprobs(int count);

  // The paper's Table 5 reader (forward.h max_abs_hidden_hook): while on, every forward also keeps per layer the
  // largest |hidden state| of the layer's output over the sequence (the prompt and every generated position). Turning
  // it on makes the next run() start from layer 0 (earlier runs were not read).
  void set_watch_max_abs_hidden(bool on);
  bool watching_max_abs_hidden() const { return watch_max_abs_; }
  // [L] for the current result; throws ds::Error when the reader is off or has not run since it was turned on.
  std::vector<float> max_abs_hidden() const;

  // Head interventions, in force from the next run() on (which starts at the first changed layer, as a lambda change
  // does) and in every decoding step. set_head_scale(l, h, nullopt) removes the head's; throws ds::Error for a layer
  // without attention, a head out of range or a non-finite factor. Listed in the order they were set.
  void set_head_scale(int layer, int head, std::optional<float> factor);
  const std::vector<HeadScale>& head_scales() const { return head_scales_; }
  void clear_head_scales();
  // Makes the interventions in force exactly `want` (removing the others; each set as above). Returns whether they
  // changed. The GUI's worker applies its request with it; head importance restores the user's with it.
  bool set_head_scales(const std::vector<HeadScale>& want);
  // A differential head's map mix (HeadMix): set_head_mix(l, h, false, nullopt) restores the head. Throws ds::Error
  // for a model without differential heads, a layer without attention, a head out of range, a non-finite lambda.
  void set_head_mix(int layer, int head, bool drop_a1, std::optional<float> lambda);
  const std::vector<HeadMix>& head_mixes() const { return head_mixes_; }
  bool set_head_mixes(const std::vector<HeadMix>& want);
  // One head's own lambda (nullopt: the layer's again), keeping whether its A1 is dropped.
  void set_head_lambda(int layer, int head, std::optional<float> lambda);
  // Mean ablations: view head h of layer l's output replaced by its mean over the prompt's positions (the one
  // forward's HeadOut writer, forward.h mean_head_hook; decoding steps write the prompt's mean). Same checks as above.
  void set_head_mean(int layer, int head, bool on);
  const std::vector<std::pair<int, int>>& head_means() const { return head_means_; }
  // Makes the mean ablations exactly `want`, in its order; returns whether they changed.
  bool set_head_means(const std::vector<std::pair<int, int>>& want);
  // Knockouts (Knockout), in force from the next run() on as the head interventions are. Throws ds::Error for layers
  // out of range or without attention, an empty or reversed span; spans past the prompt fail at run().
  void add_knockout(const Knockout& k);
  const std::vector<Knockout>& knockouts() const { return knockouts_; }
  bool set_knockouts(const std::vector<Knockout>& want);
  // One head ablated in a mode: "head" (its output zeroed: set_head_scale 0), "a1" (A1 dropped), "a2" (A2 dropped:
  // its lambda 0), "mean" (its output replaced by its mean over positions: set_head_mean), keeping the head's other
  // interventions; throws ds::Error naming an unknown mode.
  void ablate(int layer, int head, const std::string& mode);
  // The quantisation what-if (the paper's Figure 8): every attention layer's logits fake-quantised to `bits` bits
  // (2..16; 0: full precision) before the softmax, symmetric absmax per query row and head (forward.h
  // AttnEdit::logit_bits), in the forward and the map queries, from the next run() on. Throws ds::Error for bits
  // outside 2..16. Not an intervention: clear_interventions() leaves it.
  void set_logit_bits(int bits);
  int logit_bits() const { return logit_bits_; }
  // Every head scale, head mix and knockout removed.
  void clear_interventions();

  // Runs what is stale, then makes the result cover every row of every layer (the last layer again for every row when
  // the last run kept only the last position's): the outlier statistics read them all.
  void run_every_row();

  // Maps of a layer for the current result (cached until the next run).
  const LayerMaps& maps(int layer);
  std::string token_label(int position) const;

  // A knockout's spans as positions of a sequence of n tokens (negative ones from the prompt's end); throws
  // ds::Error for a span outside it.
  fwd::KeySpan resolve_knockout(const Knockout& k, int64_t n) const;

 private:
  Session() = default;
  std::string dir_;
  ModelConfig cfg_;
  std::vector<double> model_lambda_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tok_;
  std::string tok_error_;
  std::vector<int32_t> ids_;
  std::vector<TokenSpan> spans_;
  LambdaControl lam_;
  // mutable: a greedy decoding step may leave the logits on the device, and const readers fetch them on demand.
  mutable ForwardResult res_;
  std::optional<int> bulk_;  // during run_bulk: its keep_attention
  bool profiled_ = true;     // set_profiled
  std::vector<double> queued_logp_;   // queue_next_token_logprob's values computed here
  std::vector<uint8_t> queued_dev_;   // 1: that slot's value was queued on the backend
  void ensure_logits() const;
  bool has_result_ = false;
  bool ids_dirty_ = true;
  std::vector<float> ran_lambda_;  // [L] lambda of the last run
  std::shared_ptr<const fwd::Hooks> hooks_;  // the forward's readers and writers (null: none)
  bool watch_max_abs_ = false;
  bool reader_dirty_ = false;      // the reader was turned on (or its slots cut) since the last run: next from layer 0
  std::vector<HeadScale> head_scales_;
  std::vector<HeadMix> head_mixes_;
  std::vector<std::pair<int, int>> head_means_;
  std::vector<Knockout> knockouts_;
  int logit_bits_ = 0;
  // The attention edits the last run resolved (the positions of the prompt it ran) and ran with; decoding steps bring
  // them. Null: none.
  std::shared_ptr<const std::vector<fwd::AttnEdit>> edits_;
  std::shared_ptr<const std::vector<fwd::AttnEdit>> resolve_edits(int64_t n) const;
  int64_t writers_stale_from_ = 1 << 30;  // the first layer whose writers changed since the last run
  void rebuild_hooks();
  std::vector<LayerMaps> maps_cache_;
  bool logits_stale_ = false;  // the backend was cut back: the next run() recomputes the last position's logits
  bool every_row_ = false;       // the last run carried every row through the last layer
  bool all_rows_wanted_ = false;  // run_every_row(): the next run must
  // generation
  int64_t prompt_len_ = 0;
  std::vector<int32_t> eos_;
  GenerateOptions gen_opt_;
  Sampler sampler_;
  bool gen_active_ = false;
  int gen_count_ = 0;
  int64_t gen_cap_ = 0;  // positions the backend had memory for when the generation began
  StopReason stop_ = StopReason::None;
  void set_stop(StopReason r) {
    stop_ = r;
    gen_active_ = false;
  }
  std::vector<float> run_lambda() const;  // [L] effective lambda of every layer
};

}  // namespace ds
