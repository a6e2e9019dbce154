// Activation outliers as in the paper's Table 5, for the current result: per layer, over |value| of every position
// and channel of the layer's output (hidden), and over |q.k / sqrt(d)| of every causal cell (inside the window) of
// every view head's map 1 and map 2 (logit1, logit2; Llama and other plain models have map 1 only; layers without
// attention have none): the 1st, 2nd, 3rd, 10th and 100th largest value and the median -- exact, by a radix select
// over the values recomputed pass by pass (engine/core/outlier_select.h), so no pass holds more than a chunk. The
// model's line takes the same keys over the values of all layers. diffscope-run --outliers, diffscope-scan --outliers,
// the GUI's outlier plot and the Python module's Session.outliers all call this.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/outlier_select.h"
#include "engine/session/session.h"

namespace ds {

struct OutlierRequest {
  bool logits = true;  // false: the hidden states only (the logits cost two recomputations of every layer's Q.K)
  // The hidden states' selection on the backend's device where it has one (Backend::outlier_hidden_select); false:
  // the host's RankFinder over the backend's counts (the tests hold the two equal)
  bool device_select = true;
  // With the logits, the passes go layer by layer (seconds at long prompts, minutes on a CPU): `cancel` is polled
  // before each layer's step (true: ds::Cancelled; nothing is kept, as a part of the layers is not the model's
  // statistics, and the session is as it was), `progress` gets the fraction done after each.
  std::function<bool()> cancel;
  std::function<void(double)> progress;
  // A step after one that took under this many milliseconds takes twice as many layers (fewer round trips at short
  // prompts); 0: one layer a step.
  double min_step_ms = 20;
};

// One value set: the TopMedian summary and its 100 largest values, largest first (fewer when the set is smaller).
struct OutlierSet {
  TopMedian s;
  std::vector<float> top100;
};

struct LayerOutliers {
  int layer = 0;
  OutlierSet hidden;
  bool has_logits = false;  // an attention layer (and logits asked for)
  OutlierSet logit1, logit2;  // logit2 only for differential heads
};

struct Outliers {
  bool differential = false, logits = false;
  std::vector<LayerOutliers> layers;
  OutlierSet hidden, logit1, logit2;  // over every layer's values
};

Outliers outlier_stats(Session& s, const OutlierRequest& r = {});
// {"layers": [{"layer", "hidden_top": [t1, t2, t3, t10, t100], "hidden_median", "logit_top1": [...5], "logit_median1",
// "logit_top2", "logit_median2"}], "model": {the same keys}} (logit keys only where the layer has maps; *2 only for
// differential models; null where a set has fewer values than the rank).
std::string outliers_json(const Outliers& o);

// The summary of a multiset given its 100 largest values and its size and median.
TopMedian top_median_of(const std::vector<float>& top100_desc, uint64_t count, float median);
// Several prompts' outliers as one corpus's (diffscope-scan --outliers): the top values exact over all prompts' values
// (each prompt's 100 largest hold every value of the union's 100 largest); the medians are the median of the
// prompts' medians (a corpus median would need every prompt's values again). Empty input: an empty result.
Outliers merge_outliers(const std::vector<const Outliers*>& prompts);

// What merge_outliers keeps of a set of prompts, per value set: the 100 largest values of their union, the number
// of values and every prompt's median. Two parts of one corpus (diffscope-scan --shard) merge exactly: the result is
// the part of all their prompts, whatever the order.
struct OutlierPart {
  std::vector<float> top100;  // largest first
  uint64_t count = 0;
  std::vector<float> medians;  // ascending
};
struct OutlierParts {
  bool differential = false, logits = false;
  struct Layer {
    int layer = 0;
    bool has_logits = false;
    OutlierPart hidden, logit1, logit2;
  };
  std::vector<Layer> layers;
  OutlierPart hidden, logit1, logit2;  // over every layer's values
};
OutlierParts outlier_parts(const std::vector<const Outliers*>& prompts);
// a += b; throws ds::Error when they describe different models (layers or maps).
void merge_parts(OutlierParts& a, const OutlierParts& b);
Outliers outliers_of(const OutlierParts& p);
nlohmann::json outlier_parts_json(const OutlierParts& p);
// Throws ds::Error naming `what` when j is not outlier_parts_json's shape.
OutlierParts outlier_parts_from_json(const nlohmann::json& j, const std::string& what);

}  // namespace ds
