// Choosing the next token from a logit row: greedy, or sampling with temperature, top-k and top-p (nucleus) from a
// seeded generator, so that a seed gives the same continuation on every run and backend (given the same logits).
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ds {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax; the lowest id among equal logits)
  int top_k = 0;             // keep the k most likely tokens (0: all)
  double top_p = 1.0;        // then the smallest set whose probability reaches top_p (1: all)
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0; }
};

// Throws ds::Error naming the option when one is out of range (negative temperature or top_k, top_p outside (0, 1]).
void check_sampling(const SamplingOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o = {});
  // The chosen id of logits[0, vocab). Non-finite logits are never chosen (all non-finite: throws ds::Error).
  int32_t pick(const float* logits, int64_t vocab);
  const SamplingOptions& options() const { return opt_; }

 private:
  SamplingOptions opt_;
  std::mt19937_64 rng_;
};

}  // namespace ds
