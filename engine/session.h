// The one object the GUI, the CLI, the tests and the benchmarks drive: a loaded model on a backend, its
// tokenizer, the prompt, the lambda controls and the latest results. Not thread-safe: the GUI owns it on its
// worker thread.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "backends.h"
#include "error.h"
#include "tokenizer.h"

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

class Session {
 public:
  // Loads config + weights, validates, uploads to the backend. Throws ds::Error; nothing half-made survives.
  static std::unique_ptr<Session> open(const std::string& model_dir, BackendChoice backend,
                                       const ProgressFn& progress = nullptr, int cpu_threads = 0);

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

  // Lambda (DiffLlama only; no-ops report 0 for Llama).
  double model_lambda(int layer) const;
  double effective_lambda(int layer) const;
  const LambdaControl& lambda_control() const { return lam_; }
  void set_lambda_scale(double s);
  void set_lambda_override(int layer, std::optional<double> value);
  void reset_lambda();

  // Run what is stale: everything after a prompt change, or from the first layer whose lambda changed.
  // Returns the first layer that was recomputed (L when nothing had to run).
  int run(bool all_logits = false);
  const ForwardResult& result() const { return res_; }
  bool has_result() const { return has_result_; }

  // Next-token distribution at the last position.
  std::vector<TopToken> top_k(int k) const;
  std::vector<float> next_token_logprobs() const;  // [vocab]

  // Maps of a layer for the current result (cached until the next run).
  const LayerMaps& maps(int layer);
  std::string token_label(int position) const;

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
  ForwardResult res_;
  bool has_result_ = false;
  bool ids_dirty_ = true;
  std::vector<float> ran_lambda_;  // [L] lambda of the last run
  std::vector<LayerMaps> maps_cache_;
};

}  // namespace ds
