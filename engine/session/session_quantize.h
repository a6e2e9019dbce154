// The quantisation what-if (the paper's Figure 8): what fake-quantising every attention logit to `bits` bits
// (Session::set_logit_bits: symmetric absmax per query row and head, before the softmax) does to the current prompt:
// the KL divergence of the next-token distribution from full precision's, and the largest change of A1 - lambda A2
// (A1 for plain heads) over the last position's attention rows of every attention layer and head. diffscope-run
// --quantize-logits, the GUI's lambda panel and the Python module's Session.quantize_report call this.
#pragma once
#include <cstdint>
#include <string>

#include "engine/session/session.h"

namespace ds {

struct QuantizeReport {
  int bits = 0;
  int64_t position = 0;        // the sequence's last position (generated tokens included), where both are measured
  double kl = 0;               // KL(full || quantised) of the next token, nats
  double max_diff_change = 0;  // max |D_quantised - D_full| over the last position's rows
  int32_t top_full = -1, top_quantised = -1;
};

// Two runs (full precision, then `bits`), then the session's own setting again; throws ds::Error for bits outside
// 2..16 or a session without a result.
QuantizeReport quantize_report(Session& s, int bits);
// {"bits", "position", "kl", "max_diff_change", "top_full", "top_quantised"}
std::string quantize_report_json(const QuantizeReport& q);

}  // namespace ds
