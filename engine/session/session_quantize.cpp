// See session_quantize.h.
#include "engine/session/session_quantize.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/error.h"

namespace ds {

namespace {
// A1 - lambda A2 (each head's lambda) of every attention layer's heads at the last position, concatenated ([layers][heads][n]).
std::vector<float> last_rows(Session& s) {
  const ModelConfig& c = s.config();
  const int64_t n = int64_t(s.ids().size());
  std::vector<float> out;
  for (int64_t l : c.map_layers()) {
    MapRows r;
    s.backend().map_rows(int(l), {n - 1}, r);
    for (size_t i = 0; i < r.a1.size(); ++i) {  // [heads][1][n]: each head's own lambda (Session::head_lambda)
      const float lam = r.a2.empty() ? 0.f : float(s.head_lambda(int(l), int(i / size_t(n))));
      out.push_back(r.a1[i] - (r.a2.empty() ? 0.f : lam * r.a2[i]));
    }
  }
  return out;
}
}  // namespace

QuantizeReport quantize_report(Session& s, int bits) {
  if (bits < 2 || bits > 16) throw Error("quantised logits: " + std::to_string(bits) + " bits is outside 2..16");
  if (!s.has_result()) throw Error("quantisation what-if: no result yet: run the model first");
  const int keep = s.logit_bits();
  QuantizeReport q;
  q.bits = bits;
  q.position = int64_t(s.ids().size()) - 1;
  try {
    s.set_logit_bits(0);
    s.run();
    const std::vector<float> p = s.next_token_logprobs();
    const std::vector<float> d0 = last_rows(s);
    s.set_logit_bits(bits);
    s.run();
    const std::vector<float> r = s.next_token_logprobs();
    const std::vector<float> d1 = last_rows(s);
    double kl = 0;
    for (size_t i = 0; i < p.size(); ++i)
      if (std::isfinite(p[i])) kl += std::exp(double(p[i])) * (double(p[i]) - double(r[i]));
    q.kl = std::max(0.0, kl);
    for (size_t i = 0; i < d0.size() && i < d1.size(); ++i)
      q.max_diff_change = std::max(q.max_diff_change, double(std::fabs(d1[i] - d0[i])));
    q.top_full = int32_t(std::max_element(p.begin(), p.end()) - p.begin());
    q.top_quantised = int32_t(std::max_element(r.begin(), r.end()) - r.begin());
  } catch (...) {
    s.set_logit_bits(keep);
    throw;
  }
  s.set_logit_bits(keep);
  s.run();
  return q;
}

std::string quantize_report_json(const QuantizeReport& q) {
  return nlohmann::json{{"bits", q.bits},
                        {"position", q.position},
                        {"kl", q.kl},
                        {"max_diff_change", q.max_diff_change},
                        {"top_full", q.top_full},
                        {"top_quantised", q.top_quantised}}
      .dump();
}

}  // namespace ds
