// See session_importance.h.
#include "engine/session/session_importance.h"

#include <algorithm>
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
  if (r.modes.empty()) throw Error("head importance: no mode given (modes: head)");
  for (const std::string& m : r.modes)
    if (m != "head")
      throw Error("head importance: mode '" + m + "' is not available (this version ablates a head's output: head; " +
                  "dropping A1 or A2 alone and the mean over positions are not built yet)");
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
  out.base_logp = double(s.next_token_logprobs().at(size_t(out.target)));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  out.delta.assign(out.modes.size(),
                   std::vector<std::vector<double>>(out.layers.size(), std::vector<double>(size_t(out.heads), nan)));
  out.total = int64_t(out.modes.size() * out.layers.size()) * out.heads;
  const std::vector<HeadScale> keep = s.head_scales();
  const auto restore = [&] { s.set_head_scales(keep); };
  try {
    for (size_t m = 0; m < out.modes.size() && out.end == HeadImportance::End::Running; ++m)
      for (size_t li = 0; li < out.layers.size() && out.end == HeadImportance::End::Running; ++li) {
        const int l = out.layers[li];
        for (int h = 0; h < out.heads; ++h) {
          if (hooks.stop && hooks.stop()) {
            out.end = HeadImportance::End::Stopped;
            break;
          }
          restore();
          s.set_head_scale(l, h, 0.f);  // mode "head"
          s.run(false, hooks.cancel);
          out.delta[m][li][size_t(h)] = double(s.next_token_logprobs().at(size_t(out.target))) - out.base_logp;
          ++out.done;
        }
        if (hooks.progress) hooks.progress(out);
      }
  } catch (const Cancelled&) {
    restore();
    out.end = HeadImportance::End::Cancelled;
    return out;
  } catch (...) {
    restore();
    throw;
  }
  restore();
  s.run();  // back to the session's own result (a re-run from the last ablated layer)
  if (out.end == HeadImportance::End::Running) out.end = HeadImportance::End::Complete;
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
                   {"modes", modes}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ds
