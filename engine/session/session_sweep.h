// The lambda sweep: how a layer's lambda moves the model's next-token prediction and a head's noise cancellation.
// For each of `steps` lambda values from `from` to `to` on one layer: the difference entropy of |A1 - lambda A2| of
// every view head (or one), from the current maps in one pass (a layer's maps do not depend on its own lambda:
// Backend::entropy_sweep), and the log-probability of a token at the last position, from a re-run of the layers from
// the swept one per value, coarse to fine (ends, middle, quarters, ...). The session's lambda is restored afterwards.
// The GUI's sweep plot, diffscope-run --sweep and the Python module all call this.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/session/session.h"

namespace ds {

struct LambdaSweepRequest {
  int layer = -1;          // a layer with attention
  double from = 0, to = 1;
  int steps = 17;          // >= 2 values, from and to included
  int head = -1;           // the entropy of this view head only; -1: every view head
  int32_t token = -1;      // the token whose log-probability is followed; -1: the current top-1 prediction
};

struct LambdaSweepPoint {
  double lambda = 0;
  double logprob = 0;            // log p(token) at the last position (NaN until this value's re-run has finished)
  std::vector<double> entropy;   // difference entropy per requested head (nats)
};

struct LambdaSweep {
  int layer = -1, head = -1;
  int32_t token = -1;
  std::string token_text;
  double current_lambda = 0;     // the layer's lambda when the sweep began (restored after it)
  std::vector<LambdaSweepPoint> points;
  enum class End { Running, Complete, Stopped, Cancelled } end = End::Running;
};

struct LambdaSweepHooks {
  // After the entropy pass and after each point's log-probability: the sweep so far (the GUI publishes it).
  std::function<void(const LambdaSweep&)> progress;
  // Polled before each point: true ends the sweep (End::Stopped); the session is then run back to its own lambda.
  std::function<bool()> stop;
  // Passed to each point's Session::run (polled inside the forward): true ends the sweep at once (End::Cancelled)
  // and leaves the session stale from the swept layer (the caller's next run brings it back).
  std::function<bool()> cancel;
};

// Checks the request against the session (layer with attention, head, steps, finite bounds, token), throwing ds::Error
// with a one-line message naming the argument.
void check_lambda_sweep(const Session& s, const LambdaSweepRequest& r);
// Runs the sweep on a session that has a result. The layer's lambda override is restored whatever happens.
LambdaSweep run_lambda_sweep(Session& s, const LambdaSweepRequest& r, const LambdaSweepHooks& hooks = {});
// The GUI's default range around a lambda: [min(-0.5, lambda - 0.25), max(1.5, lambda + 0.25)].
std::pair<double, double> default_sweep_range(double lambda);

}  // namespace ds
