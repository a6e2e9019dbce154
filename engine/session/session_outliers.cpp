// See session_outliers.h.
#include "engine/session/session_outliers.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace ds {

namespace {

// The cells of one source (a layer's hidden states, or its logits) as the backend counts them: maps per call and the
// number of values of each map.
struct Source {
  int layer;
  bool logits;
  int maps;
  uint64_t count;  // values per map
};

// The values of map m of the ranks a RankFinder asked for in this pass, from counts [maps][histograms][bins] of a
// pass whose prefixes are `have` (a superset of the finder's).
std::vector<uint64_t> slice(const std::vector<uint64_t>& counts, const RadixPass& have, int m, const RadixPass& want) {
  const size_t bins = size_t(have.bins()), H = size_t(have.histograms());
  std::vector<uint64_t> out;
  if (want.prefixes.empty()) {
    out.assign(counts.begin() + size_t(m) * H * bins, counts.begin() + size_t(m) * H * bins + bins);
    return out;
  }
  for (uint32_t p : want.prefixes) {
    const size_t h = size_t(std::find(have.prefixes.begin(), have.prefixes.end(), p) - have.prefixes.begin());
    const auto b = counts.begin() + (size_t(m) * H + h) * bins;
    out.insert(out.end(), b, b + long(bins));
  }
  return out;
}

uint64_t causal_cells(const ModelConfig& c, int layer, int64_t n) {
  const int64_t w = c.layer_window(layer);
  uint64_t cells = 0;
  for (int64_t q = 0; q < n; ++q) cells += uint64_t(w > 0 ? std::min<int64_t>(q + 1, w) : q + 1);
  return cells * uint64_t(c.view_heads());
}

}  // namespace

TopMedian top_median_of(const std::vector<float>& top, uint64_t count, float median) {
  TopMedian t;
  t.count = count;
  t.median = median;
  const int ranks[5] = {1, 2, 3, 10, 100};
  for (int i = 0; i < 5; ++i)
    t.top[i] = size_t(ranks[i]) <= top.size() ? top[size_t(ranks[i] - 1)] : std::numeric_limits<float>::quiet_NaN();
  return t;
}

Outliers outlier_stats(Session& s, const OutlierRequest& r) {
  if (!s.has_result()) throw Error("outlier statistics: no result yet: run the model first");
  s.run_every_row();
  const ModelConfig& c = s.config();
  const int L = int(c.layers), nmaps = c.is_diff() ? 2 : 1;
  const int64_t n = int64_t(s.ids().size());
  Outliers out;
  out.differential = c.is_diff();
  out.logits = r.logits;
  std::vector<Source> src;
  for (int l = 0; l < L; ++l) {
    src.push_back({l, false, 1, uint64_t(n) * uint64_t(c.hidden)});
    if (r.logits && c.has_maps(l)) src.push_back({l, true, nmaps, causal_cells(c, l, n)});
  }
  // Finders: per source and map (the 100th largest and the two middles), and per kind and map over all layers (the
  // two middles; the model's top values come from the layers' top 100).
  std::vector<std::vector<RankFinder>> own(src.size());
  uint64_t total[3] = {0, 0, 0};  // hidden, logit1, logit2
  for (size_t i = 0; i < src.size(); ++i)
    for (int m = 0; m < src[i].maps; ++m) {
      own[i].emplace_back(top_median_ranks(src[i].count));
      total[src[i].logits ? 1 + m : 0] += src[i].count;
    }
  std::vector<RankFinder> all;
  for (uint64_t t : total) {
    const std::vector<uint64_t> rk = top_median_ranks(std::max<uint64_t>(t, 1));
    all.emplace_back(std::vector<uint64_t>{rk[1], rk[2]});
  }
  for (int pass = 0; pass < RankFinder::kPasses; ++pass) {
    std::vector<std::vector<uint64_t>> all_counts(3);
    std::vector<RadixPass> all_pass;
    for (const RankFinder& f : all) all_pass.push_back(f.pass());
    for (size_t i = 0; i < src.size(); ++i) {
      RadixPass q = own[i][0].pass();  // the union of this source's and the model's prefixes
      auto add = [&](const RadixPass& p) {
        for (uint32_t x : p.prefixes)
          if (std::find(q.prefixes.begin(), q.prefixes.end(), x) == q.prefixes.end()) q.prefixes.push_back(x);
      };
      for (const RankFinder& f : own[i]) add(f.pass());
      for (int m = 0; m < src[i].maps; ++m) add(all_pass[size_t(src[i].logits ? 1 + m : 0)]);
      std::vector<uint64_t> counts;
      s.backend().outlier_counts(src[i].layer, src[i].logits, q, counts);
      for (int m = 0; m < src[i].maps; ++m) {
        RankFinder& f = own[i][size_t(m)];
        f.take(slice(counts, q, m, f.pass()));
        const size_t k = size_t(src[i].logits ? 1 + m : 0);
        std::vector<uint64_t> part = slice(counts, q, m, all_pass[k]);
        if (all_counts[k].empty()) all_counts[k].assign(part.size(), 0);
        for (size_t j = 0; j < part.size(); ++j) all_counts[k][j] += part[j];
      }
    }
    for (size_t k = 0; k < 3; ++k)
      if (total[k] > 0) all[k].take(all_counts[k]);
  }
  // The 100 largest of each set: every value at or above its 100th largest, sorted.
  std::vector<float> pool[3];
  for (size_t i = 0; i < src.size(); ++i) {
    std::vector<float> thr;
    for (int m = 0; m < src[i].maps; ++m) thr.push_back(own[i][size_t(m)].value(0));
    // Ties at the threshold can bring more than 100; a set of equal values brings them all (cap: the whole set).
    const size_t cap = size_t(std::min<uint64_t>(src[i].count, uint64_t(1) << 22));
    std::vector<std::vector<float>> v = s.backend().outlier_values(src[i].layer, src[i].logits, thr, cap);
    LayerOutliers* lo = nullptr;
    if (out.layers.empty() || out.layers.back().layer != src[i].layer) out.layers.push_back({src[i].layer});
    lo = &out.layers.back();
    for (int m = 0; m < src[i].maps; ++m) {
      std::vector<float>& x = v[size_t(m)];
      std::sort(x.begin(), x.end(), std::greater<float>());
      if (x.size() > 100) x.resize(100);
      const RankFinder& f = own[i][size_t(m)];
      const float median = float((double(f.value(1)) + double(f.value(2))) / 2);
      OutlierSet set{top_median_of(x, src[i].count, median), x};
      pool[src[i].logits ? 1 + m : 0].insert(pool[src[i].logits ? 1 + m : 0].end(), x.begin(), x.end());
      if (!src[i].logits) lo->hidden = set;
      else if (m == 0) lo->logit1 = set, lo->has_logits = true;
      else lo->logit2 = set;
    }
  }
  OutlierSet* model[3] = {&out.hidden, &out.logit1, &out.logit2};
  for (size_t k = 0; k < 3; ++k) {
    if (total[k] == 0) continue;
    std::vector<float>& x = pool[k];
    std::sort(x.begin(), x.end(), std::greater<float>());
    if (x.size() > 100) x.resize(100);
    *model[k] = {top_median_of(x, total[k], float((double(all[k].value(0)) + double(all[k].value(1))) / 2)), x};
  }
  return out;
}

Outliers merge_outliers(const std::vector<const Outliers*>& prompts) {
  Outliers out;
  if (prompts.empty()) return out;
  out.differential = prompts[0]->differential;
  out.logits = prompts[0]->logits;
  auto merge = [](const std::vector<const OutlierSet*>& sets) {
    std::vector<float> top, med;
    uint64_t count = 0;
    for (const OutlierSet* s : sets) {
      top.insert(top.end(), s->top100.begin(), s->top100.end());
      med.push_back(s->s.median);
      count += s->s.count;
    }
    std::sort(top.begin(), top.end(), std::greater<float>());
    if (top.size() > 100) top.resize(100);
    std::sort(med.begin(), med.end());
    const size_t k = med.size();
    const float m = k == 0 ? 0.f : float((double(med[(k - 1) / 2]) + double(med[k / 2])) / 2);
    return OutlierSet{top_median_of(top, count, m), top};
  };
  for (size_t li = 0; li < prompts[0]->layers.size(); ++li) {
    LayerOutliers lo;
    lo.layer = prompts[0]->layers[li].layer;
    lo.has_logits = prompts[0]->layers[li].has_logits;
    std::vector<const OutlierSet*> h, a, b;
    for (const Outliers* p : prompts) {
      if (p->layers.size() != prompts[0]->layers.size()) throw Error("internal: merging outliers of other models");
      h.push_back(&p->layers[li].hidden), a.push_back(&p->layers[li].logit1), b.push_back(&p->layers[li].logit2);
    }
    lo.hidden = merge(h);
    if (lo.has_logits) lo.logit1 = merge(a), lo.logit2 = merge(b);
    out.layers.push_back(std::move(lo));
  }
  std::vector<const OutlierSet*> h, a, b;
  for (const Outliers* p : prompts) h.push_back(&p->hidden), a.push_back(&p->logit1), b.push_back(&p->logit2);
  out.hidden = merge(h), out.logit1 = merge(a), out.logit2 = merge(b);
  return out;
}

namespace {
nlohmann::json num(float x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }
void put(nlohmann::json& j, const char* top, const char* median, const OutlierSet& o) {
  nlohmann::json t = nlohmann::json::array();
  for (float x : o.s.top) t.push_back(num(x));
  j[top] = t;
  j[median] = num(o.s.median);
}
}  // namespace

std::string outliers_json(const Outliers& o) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerOutliers& l : o.layers) {
    nlohmann::json j{{"layer", l.layer}};
    put(j, "hidden_top", "hidden_median", l.hidden);
    if (l.has_logits) {
      put(j, "logit_top1", "logit_median1", l.logit1);
      if (o.differential) put(j, "logit_top2", "logit_median2", l.logit2);
    }
    layers.push_back(j);
  }
  nlohmann::json m = nlohmann::json::object();
  put(m, "hidden_top", "hidden_median", o.hidden);
  if (o.logits && o.logit1.s.count > 0) {
    put(m, "logit_top1", "logit_median1", o.logit1);
    if (o.differential) put(m, "logit_top2", "logit_median2", o.logit2);
  }
  nlohmann::json j{{"layers", layers}, {"model", m}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ds
