// Head importance: for a prompt and a target token (default: the model's greedy next token), the change of
// log p(target) at the last position when each view head of each attention layer is ablated, one head at a time,
// under the interventions and lambdas already in force. Each ablation re-runs only the layers from the ablated one on
// (the one forward's HeadOut writer, Session::set_head_scale); the session's interventions are restored afterwards.
// Modes: "head" (the head's output zeroed after its sub-layer norm, before o_proj), "a1" / "a2" (the head's A1 or A2
// dropped: the attention op's head coefficients, Session::ablate). The GUI's importance map,
// diffscope-run --importance and the Python module all call this.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/session/session.h"

namespace ds {

struct HeadImportanceRequest {
  int32_t target = -1;                      // -1: the current top-1 prediction
  std::vector<std::string> modes{"head"};  // the ablation modes to measure: "head", "a1", "a2", "mean"
};

struct HeadImportance {
  int32_t target = -1;
  std::string target_text;
  double base_logp = 0;                      // log p(target) with no head ablated
  std::vector<int> layers;                   // the attention layers, in order (the rows below)
  int heads = 0;                             // view heads per layer
  std::vector<std::string> modes;
  // [mode][layer row][head]: log p(target) with that head ablated minus base_logp (NaN where not yet measured)
  std::vector<std::vector<std::vector<double>>> delta;
  int64_t done = 0, total = 0;               // ablations measured / to measure
  enum class End { Running, Complete, Stopped, Cancelled } end = End::Running;
};

struct HeadImportanceHooks {
  std::function<void(const HeadImportance&)> progress;  // after each layer's heads (the GUI publishes the map so far)
  std::function<bool()> stop;                           // polled between ablations: true ends it (End::Stopped)
  std::function<bool()> cancel;                         // passed to each re-run (polled inside the forward)
};

// Checks the request against the session (a result, the target id, known modes), throwing ds::Error with a one-line
// message naming the argument.
void check_head_importance(const Session& s, const HeadImportanceRequest& r);
// Measures every (mode, layer, head); the session's interventions and result are restored whatever happens (a
// cancelled run leaves it stale from the last ablated layer: the caller's next run brings it back).
HeadImportance run_head_importance(Session& s, const HeadImportanceRequest& r, const HeadImportanceHooks& hooks = {});
// The modes a model's heads can be ablated in: a2, a1 and head for differential heads, head otherwise.
std::vector<std::string> importance_modes(const ModelConfig& c);

// The interventions in force (head scales, head mixes, knockouts) as a JSON array, one object per effect:
// {"kind": "ablate", "mode": "head" | "mean" | "a1" | "a2", "layer", "head"} ("head": its output scaled by 0; "a2":
// its lambda 0, however set), {"kind": "scale", "layer", "head", "factor"} (factor not 0), {"kind": "head_lambda",
// "layer", "head", "lambda"}, {"kind": "knockout", "spec", "layers": [first, last], "queries": [q0, q1], "keys": [k0,
// k1]} (positions as given: below 0 from the end; an end of null: to the end). diffscope-run's --json and dump
// metadata, diffscope-scan's report, the GUI's state, the Python module's `interventions`.
std::string interventions_json(const Session& s);
// The same as short lines for people ("3.1 output x 0 (ablated)", "2.0 A2 dropped", "knockout 3:-1:,5:9").
std::vector<std::string> intervention_lines(const Session& s);

// The JSON of diffscope-run --importance: {"target", "target_text", "base_logp", "layers", "heads" (a layer's),
// "complete", "done", "total" (ablations measured, to measure), "modes": {"head": [[delta per head] per layer]}}
// (NaN, never measured, as null).
std::string head_importance_json(const HeadImportance& h);

}  // namespace ds
