// See session_importance.h.
#include "engine/session/session_importance.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/core/error.h"

namespace ds {

void check_head_importance(const Session& s, const HeadImportanceRequest& r) {
  if (!s.has_result()) throw Error("head importance: no result yet: run the model first");
  const ModelConfig& c = s.config();
  if (r.target < -1 || r.target >= c.vocab)
    throw Error("head importance: target " + std::to_string(r.target) + " is outside the vocabulary (" +
                std::to_string(c.vocab) + " tokens)");
  if (r.modes.empty()) throw Error("head importance: no mode given (modes: a1, a2, head, mean)");
  for (const std::string& m : r.modes) {
    if (m != "head" && m != "a1" && m != "a2" && m != "mean")
      throw Error("head importance: mode '" + m + "' is not known (modes: a1, a2, head, mean)");
    if ((m == "a1" || m == "a2") && !c.is_diff())
      throw Error("head importance: mode '" + m + "' needs differential heads (this model's have one map)");
    if (std::count(r.modes.begin(), r.modes.end(), m) > 1) throw Error("head importance: mode '" + m + "' is given twice");
  }
  if (c.map_layers().empty()) throw Error("head importance: the model has no attention layer");
}

HeadImportance run_head_importance(Session& s, const HeadImportanceRequest& r, const HeadImportanceHooks& hooks) {
  check_head_importance(s, r);
  const ModelConfig& c = s.config();
  HeadImportance out;
  out.modes = r.modes;
  out.heads = int(c.view_heads());
  for (int64_t l : c.map_layers()) out.layers.push_back(int(l));
  s.run();  // whatever is stale first: the base is the session as it stands
  out.target = r.target >= 0 ? r.target : s.top_k(1).at(0).id;
  out.target_text = s.tokenizer() ? s.tokenizer()->token_text(out.target) : std::to_string(out.target);
  out.base_logp = s.next_token_logprob(out.target);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  out.delta.assign(out.modes.size(),
                   std::vector<std::vector<double>>(out.layers.size(), std::vector<double>(size_t(out.heads), nan)));
  out.total = int64_t(out.modes.size() * out.layers.size()) * out.heads;
  const std::vector<HeadScale> keep = s.head_scales();
  const std::vector<HeadMix> keep_mix = s.head_mixes();
  const std::vector<std::pair<int, int>> keep_mean = s.head_means();
  const auto restore = [&] {
    s.set_head_scales(keep);
    s.set_head_mixes(keep_mix);
    s.set_head_means(keep_mean);
  };
  // A layer's ablations are queued back to back (bulk re-runs: each leaves its logits on the device, is not
  // profiled, and queues its log p; no wait between them on the CUDA backend); the layer's values come back together.
  int queued = 0, q0 = 0;  // ablations queued, from head q0 on
  size_t qm = 0, ql = 0;
  const auto take = [&] {
    const std::vector<double> lp = s.take_queued_logprobs(queued);
    for (int h = 0; h < queued; ++h) out.delta[qm][ql][size_t(q0 + h)] = lp[size_t(h)] - out.base_logp;
    out.done += queued;
    q0 += queued;
    queued = 0;
  };
  try {
    for (size_t m = 0; m < out.modes.size() && out.end == HeadImportance::End::Running; ++m)
      for (size_t li = 0; li < out.layers.size() && out.end == HeadImportance::End::Running; ++li) {
        const int l = out.layers[li];
        qm = m, ql = li, q0 = 0;
        for (int h = 0; h < out.heads; ++h) {
          if (queued == Session::kLogprobSlots) take();  // (a layer of more heads than the queue's slots)
          if (hooks.stop && hooks.stop()) {
            out.end = HeadImportance::End::Stopped;
            break;
          }
          restore();
          s.ablate(l, h, out.modes[m]);
          // (head writers leave the layer's attention as it was: it is kept from the layer's first re-run)
          const bool writer = out.modes[m] == "head" || out.modes[m] == "mean";
          s.run_bulk(hooks.cancel, writer ? l : -1);
          s.queue_next_token_logprob(out.target, queued++);
        }
        take();
        if (hooks.progress) hooks.progress(out);
      }
  } catch (const Cancelled&) {
    try {
      take();  // the ablations queued before the cancelled one ran to the end
    } catch (...) {
    }
    restore();
    out.end = HeadImportance::End::Cancelled;
    return out;
  } catch (...) {
    try {
      s.take_queued_logprobs(queued);
    } catch (...) {
    }
    restore();
    throw;
  }
  restore();
  s.run();  // back to the session's own result (a re-run from the last ablated layer)
  if (out.end == HeadImportance::End::Running) out.end = HeadImportance::End::Complete;
  return out;
}

std::vector<std::string> importance_modes(const ModelConfig& c) {
  if (c.is_diff()) return {"a2", "a1", "head"};
  return {"head"};
}

std::string interventions_json(const Session& s) {
  nlohmann::json v = nlohmann::json::array();
  for (const HeadScale& x : s.head_scales()) {
    if (x.factor == 0.f) v.push_back({{"kind", "ablate"}, {"mode", "head"}, {"layer", x.layer}, {"head", x.head}});
    else v.push_back({{"kind", "scale"}, {"layer", x.layer}, {"head", x.head}, {"factor", x.factor}});
  }
  for (const auto& [l, h] : s.head_means()) v.push_back({{"kind", "ablate"}, {"mode", "mean"}, {"layer", l}, {"head", h}});
  for (const HeadMix& x : s.head_mixes()) {
    if (x.drop_a1) v.push_back({{"kind", "ablate"}, {"mode", "a1"}, {"layer", x.layer}, {"head", x.head}});
    if (x.lambda && *x.lambda == 0.f) v.push_back({{"kind", "ablate"}, {"mode", "a2"}, {"layer", x.layer}, {"head", x.head}});
    else if (x.lambda) v.push_back({{"kind", "head_lambda"}, {"layer", x.layer}, {"head", x.head}, {"lambda", *x.lambda}});
  }
  auto end = [](int64_t a, int64_t b) {  // null: to the end of the sequence ("5:", "-1:")
    return (a < 0 && b == 0) || b == Knockout::kToEnd ? nlohmann::json() : nlohmann::json(b);
  };
  for (const Knockout& k : s.knockouts())
    v.push_back({{"kind", "knockout"},
                 {"spec", knockout_text(k)},
                 {"layers", {k.layer0, k.layer1 - 1}},
                 {"queries", {k.q0, end(k.q0, k.q1)}},
                 {"keys", {k.k0, end(k.k0, k.k1)}}});
  return v.dump();
}

std::vector<std::string> intervention_lines(const Session& s) {
  std::vector<std::string> out;
  auto head = [](int l, int h) { return std::to_string(l) + "." + std::to_string(h); };
  char buf[64];
  for (const HeadScale& x : s.head_scales()) {
    std::snprintf(buf, sizeof buf, "%g", double(x.factor));
    out.push_back(head(x.layer, x.head) + " output x " + buf + (x.factor == 0.f ? " (ablated)" : ""));
  }
  for (const auto& [l, h] : s.head_means()) out.push_back(head(l, h) + " output = its mean over positions");
  for (const HeadMix& x : s.head_mixes()) {
    if (x.drop_a1) out.push_back(head(x.layer, x.head) + " A1 dropped");
    if (x.lambda && *x.lambda == 0.f) {
      out.push_back(head(x.layer, x.head) + " A2 dropped");
    } else if (x.lambda) {
      std::snprintf(buf, sizeof buf, "%g", double(*x.lambda));
      out.push_back(head(x.layer, x.head) + " lambda " + buf);
    }
  }
  for (const Knockout& k : s.knockouts()) out.push_back("knockout " + knockout_text(k));
  return out;
}

std::string head_importance_json(const HeadImportance& h) {
  nlohmann::json modes = nlohmann::json::object();
  for (size_t m = 0; m < h.modes.size(); ++m) {
    nlohmann::json rows = nlohmann::json::array();
    for (const std::vector<double>& row : h.delta[m]) {
      nlohmann::json r = nlohmann::json::array();
      for (double d : row) r.push_back(std::isfinite(d) ? nlohmann::json(d) : nlohmann::json(nullptr));
      rows.push_back(r);
    }
    modes[h.modes[m]] = rows;
  }
  nlohmann::json j{{"target", h.target},       {"target_text", h.target_text},
                   {"base_logp", h.base_logp}, {"layers", h.layers},
                   {"heads", h.heads},         {"complete", h.end == HeadImportance::End::Complete},
                   {"done", h.done},           {"total", h.total},
                   {"modes", modes}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ds
