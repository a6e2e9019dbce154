// Sampler: the distribution softmax(logits / T) in double, cut to the top k, then to the nucleus of mass top_p,
// renormalised, and one draw from it with the session's seeded generator.
#include "engine/core/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/core/error.h"

namespace ds {

void check_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    throw Error("temperature must be a finite number >= 0 (0 = greedy)");
  if (o.top_k < 0) throw Error("top-k must be >= 0 (0 = no limit)");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) throw Error("top-p must be in (0, 1]");
}

Sampler::Sampler(const SamplingOptions& o) : opt_(o), rng_(o.seed) { check_sampling(o); }

int32_t Sampler::pick(const float* logits, int64_t vocab) {
  // The first largest logit, found in two passes that the compiler vectorises (a step of 128K logits is
  // decoded every few milliseconds): the largest value (NaN never compares greater), then its first index.
  float lanes[8];
  std::fill(lanes, lanes + 8, -INFINITY);
  int64_t i = 0;
  for (; i + 8 <= vocab; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] = logits[i + k] > lanes[k] ? logits[i + k] : lanes[k];
  float best_v = -INFINITY;
  for (int k = 0; k < 8; ++k) best_v = lanes[k] > best_v ? lanes[k] : best_v;
  for (; i < vocab; ++i) best_v = logits[i] > best_v ? logits[i] : best_v;
  if (!std::isfinite(best_v)) throw Error("the model's next-token logits are not finite: nothing to choose from");
  const int64_t best = std::find(logits, logits + vocab, best_v) - logits;
  if (opt_.greedy()) return int32_t(best);
  // Candidates by logit, best first (only as many as top_k keeps need ordering).
  std::vector<int32_t> idx;
  idx.reserve(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isfinite(logits[i])) idx.push_back(int32_t(i));
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const size_t keep = opt_.top_k > 0 ? std::min(idx.size(), size_t(opt_.top_k)) : idx.size();
  if (keep < idx.size() || opt_.top_p < 1.0) {
    std::partial_sort(idx.begin(), idx.begin() + ptrdiff_t(keep), idx.end(), by_logit);
    idx.resize(keep);
  }
  const double inv_t = 1.0 / opt_.temperature, top = double(logits[best]);
  std::vector<double> w(idx.size());
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (w[i] = std::exp((double(logits[idx[i]]) - top) * inv_t));
  if (opt_.top_p < 1.0) {  // idx is sorted: keep the shortest prefix whose mass reaches top_p
    double acc = 0;
    size_t cut = idx.size();
    for (size_t i = 0; i < idx.size(); ++i) {
      acc += w[i] / sum;
      if (acc >= opt_.top_p) {
        cut = i + 1;
        break;
      }
    }
    idx.resize(cut);
    w.resize(cut);
    sum = std::accumulate(w.begin(), w.end(), 0.0);
  }
  // One uniform draw in [0, sum): the same sequence of draws on every platform (std::mt19937_64 is specified;
  // std::uniform_real_distribution is not, so the draw is made from the raw 53 bits).
  const double r = double(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    acc += w[i];
    if (r < acc) return idx[i];
  }
  return idx.back();
}

}  // namespace ds
