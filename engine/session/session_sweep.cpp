#include "engine/session/session_sweep.h"

#include <cmath>
#include <limits>
#include <optional>

#include "engine/core/error.h"

namespace ds {

std::pair<double, double> default_sweep_range(double lambda) {
  return {std::min(-0.5, lambda - 0.25), std::max(1.5, lambda + 0.25)};
}

void check_lambda_sweep(const Session& s, const LambdaSweepRequest& r) {
  const ModelConfig& c = s.config();
  if (!c.is_diff()) throw Error("lambda sweep: " + std::string(c.family()) + " has no lambda (not differential)");
  if (r.layer < 0 || r.layer >= c.layers)
    throw Error("lambda sweep: layer " + std::to_string(r.layer) + " does not exist (the model has " +
                std::to_string(c.layers) + " layers)");
  if (!c.has_maps(r.layer)) throw Error("lambda sweep: " + c.no_attention(r.layer, "lambda"));
  if (r.head < -1 || r.head >= c.view_heads())
    throw Error("lambda sweep: head " + std::to_string(r.head) + " does not exist (layers have " +
                std::to_string(c.view_heads()) + " view heads)");
  if (r.steps < 2 || r.steps > 1000) throw Error("lambda sweep: steps must be 2 to 1000, not " + std::to_string(r.steps));
  if (!std::isfinite(r.from) || !std::isfinite(r.to) || std::fabs(r.from) > 1e6 || std::fabs(r.to) > 1e6)
    throw Error("lambda sweep: the range must be finite numbers within +-1e6");
  if (r.token < -1 || r.token >= c.vocab)
    throw Error("lambda sweep: token " + std::to_string(r.token) + " is outside the vocabulary");
}

LambdaSweep run_lambda_sweep(Session& s, const LambdaSweepRequest& r, const LambdaSweepHooks& hooks) {
  check_lambda_sweep(s, r);
  if (!s.has_result()) throw Error("lambda sweep: run the prompt first");
  s.run();  // the maps the entropies come from are those of the session's own lambda
  const int layer = r.layer;
  LambdaSweep sw;
  sw.layer = layer;
  sw.head = r.head;
  sw.current_lambda = s.effective_lambda(layer);
  if (r.token >= 0) {
    sw.token = r.token;
  } else {
    const auto top = s.top_k(1);
    if (top.empty()) throw Error("lambda sweep: no next-token prediction to follow");
    sw.token = top[0].id;
  }
  sw.token_text = s.tokenizer() ? s.tokenizer()->token_text(sw.token) : "#" + std::to_string(sw.token);

  std::vector<float> lams;
  for (int i = 0; i < r.steps; ++i) lams.push_back(float(r.from + (r.to - r.from) * i / (r.steps - 1)));
  const int H = int(s.config().view_heads());
  std::vector<std::vector<double>> ent;  // [heads][steps]
  for (int h = r.head < 0 ? 0 : r.head; h < (r.head < 0 ? H : r.head + 1); ++h)
    ent.push_back(s.backend().entropy_sweep(layer, h, lams));
  for (int i = 0; i < r.steps; ++i) {
    LambdaSweepPoint p;
    p.lambda = double(lams[size_t(i)]);
    p.logprob = std::numeric_limits<double>::quiet_NaN();
    for (const auto& e : ent) p.entropy.push_back(e.at(size_t(i)));
    sw.points.push_back(std::move(p));
  }
  if (hooks.progress) hooks.progress(sw);

  std::vector<int> order;  // coarse to fine: the ends, then every stride-th point, the stride halving down to 1
  std::vector<char> queued(size_t(r.steps), 0);
  for (int stride = r.steps - 1;; stride = std::max(1, stride / 2)) {
    for (int i = 0; i < r.steps; i += stride)
      if (!queued[size_t(i)]) queued[size_t(i)] = 1, order.push_back(i);
    if (stride == 1) break;
  }
  const auto& ov = s.lambda_control().override_;
  const std::optional<double> saved = size_t(layer) < ov.size() ? ov[size_t(layer)] : std::nullopt;
  try {
    for (int i : order) {
      if (hooks.stop && hooks.stop()) {
        sw.end = LambdaSweep::End::Stopped;
        break;
      }
      LambdaSweepPoint& pt = sw.points[size_t(i)];
      s.set_lambda_override(layer, pt.lambda);
      try {
        s.run(false, hooks.cancel);
      } catch (const Cancelled&) {
        sw.end = LambdaSweep::End::Cancelled;
        break;
      }
      pt.logprob = s.next_token_logprob(sw.token);
      if (hooks.progress) hooks.progress(sw);
    }
  } catch (...) {
    s.set_lambda_override(layer, saved);  // never leave the sweep's lambda behind
    throw;
  }
  s.set_lambda_override(layer, saved);
  if (sw.end == LambdaSweep::End::Cancelled) return sw;  // the caller's next run brings the session back
  if (sw.end == LambdaSweep::End::Running) sw.end = LambdaSweep::End::Complete;
  s.run();  // back to the state the caller had: a run from `layer` with its own lambda
  return sw;
}

}  // namespace ds
