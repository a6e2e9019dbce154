// Rotary-embedding frequencies exactly as transformers computes them (default and llama3), shared by backends.
#pragma once
#include <vector>

#include "engine/core/config.h"

namespace ds {

// inv_freq [head_dim/2] in f32, as transformers' rope init functions produce it.
std::vector<float> rope_inv_freq(const ModelConfig& c);
// cos/sin tables [n, head_dim/2] for positions 0..n-1 (angle = f32(pos) * inv_freq in f32, as transformers does).
void rope_tables(const std::vector<float>& inv_freq, int64_t n, std::vector<float>& cos_t, std::vector<float>& sin_t);

}  // namespace ds
