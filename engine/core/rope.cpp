// RoPE frequencies: default  inv_freq[i] = 1 / theta^(2i/d);  llama3 (Llama 3.1 scaling): long wavelengths
// divided by `factor`, short ones kept, a smooth blend between (transformers' _compute_llama3_parameters).
#include "engine/core/rope.h"

#include <cmath>

namespace ds {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = float(2 * i) / float(c.head_dim);
    f[size_t(i)] = float(1.0 / double(std::pow(float(c.rope.theta), e)));
  }
  if (c.rope.type == RopeConfig::Llama3) {
    const double factor = c.rope.factor, lo = c.rope.low_freq_factor, hi = c.rope.high_freq_factor;
    const double old_len = c.rope.original_max_position_embeddings;
    const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
    for (float& x : f) {
      const double wavelen = 2 * M_PI / x;
      double v = wavelen > low_freq_wavelen ? x / factor : x;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const double smooth = (old_len / wavelen - lo) / (hi - lo);
        v = (1 - smooth) * v / factor + smooth * v;
      }
      x = float(v);
    }
  }
  return f;
}

void rope_tables(const std::vector<float>& inv_freq, int64_t n, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const size_t half = inv_freq.size();
  cos_t.resize(size_t(n) * half);
  sin_t.resize(size_t(n) * half);
  for (int64_t p = 0; p < n; ++p)
    for (size_t i = 0; i < half; ++i) {
      const float a = float(p) * inv_freq[i];
      cos_t[size_t(p) * half + i] = float(std::cos(double(a)));
      sin_t[size_t(p) * half + i] = float(std::sin(double(a)));
    }
}

}  // namespace ds
