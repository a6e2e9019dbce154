// The logit lens: each layer's output on the residual stream (Stream(l + 1) of the one forward) through the final norm
// and the LM head, as a next-token distribution: top-k tokens and the target's probability and rank, at chosen
// positions (default the last). The last layer's is the model's own logits. diffscope-run --lens, the GUI's lens
// panel and the Python module's Session.lens all call this.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/session/session.h"

namespace ds {

struct LensRequest {
  std::vector<int64_t> positions{-1};  // below 0: from the end (-1: the last token)
  std::vector<int> layers;             // empty: every layer
  int top_k = 5;
  int32_t target = -1;                 // -1: the model's greedy next token after the last position
};

struct LensEntry {
  int64_t position = 0;
  std::vector<TopToken> top;  // the k most likely tokens, most likely first
  float target_prob = 0;
  int64_t target_rank = 0;    // 1: the most likely token
};
struct LensLayer {
  int layer = 0;
  std::vector<LensEntry> positions;
};
struct Lens {
  int32_t target = -1;
  std::string target_text;
  std::vector<LensLayer> layers;
};

// Checks the request (a result, layers, positions, k, the target id), throwing ds::Error with a one-line message.
void check_lens(const Session& s, const LensRequest& r);
// Runs what is stale first; a lens of the last layer at a position other than the last needs every row's logits (the
// session runs them once). Costs one final norm and LM head product per (layer, position).
Lens logit_lens(Session& s, const LensRequest& r);
// {"target", "target_text", "layers": [{"layer", "positions": [{"position", "top": [{"id", "text", "prob"}],
//  "target_prob", "target_rank"}]}]}
std::string lens_json(const Lens& lens);

}  // namespace ds
