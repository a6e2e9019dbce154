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
    std::vector<Backend::OutlierQuery> queries(src.size());  // every source's pass at once
    for (size_t i = 0; i < src.size(); ++i) {
      RadixPass& q = queries[i].pass;
      q = own[i][0].pass();  // the union of this source's and the model's prefixes
      auto add = [&](const RadixPass& p) {
        for (uint32_t x : p.prefixes)
          if (std::find(q.prefixes.begin(), q.prefixes.end(), x) == q.prefixes.end()) q.prefixes.push_back(x);
      };
      for (const RankFinder& f : own[i]) add(f.pass());
      for (int m = 0; m < src[i].maps; ++m) add(all_pass[size_t(src[i].logits ? 1 + m : 0)]);
      queries[i].layer = src[i].layer;
      queries[i].logits = src[i].logits;
    }
    std::vector<std::vector<uint64_t>> counts_of;
    s.backend().outlier_counts_many(queries, counts_of);
    for (size_t i = 0; i < src.size(); ++i) {
      const RadixPass& q = queries[i].pass;
      const std::vector<uint64_t>& counts = counts_of.at(i);
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
  std::vector<Backend::OutlierQuery> vq(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    for (int m = 0; m < src[i].maps; ++m) vq[i].at_least.push_back(own[i][size_t(m)].value(0));
    // Ties at the threshold can bring more than 100; a set of equal values brings them all (cap: the whole set).
    vq[i].cap = size_t(std::min<uint64_t>(src[i].count, uint64_t(1) << 22));
    vq[i].layer = src[i].layer;
    vq[i].logits = src[i].logits;
  }
  std::vector<std::vector<std::vector<float>>> values = s.backend().outlier_values_many(vq);
  for (size_t i = 0; i < src.size(); ++i) {
    std::vector<std::vector<float>>& v = values.at(i);
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

namespace {
void merge_part(OutlierPart& a, const OutlierPart& b) {
  a.top100.insert(a.top100.end(), b.top100.begin(), b.top100.end());
  std::sort(a.top100.begin(), a.top100.end(), std::greater<float>());
  if (a.top100.size() > 100) a.top100.resize(100);
  a.count += b.count;
  a.medians.insert(a.medians.end(), b.medians.begin(), b.medians.end());
  std::sort(a.medians.begin(), a.medians.end());
}
OutlierPart part_of(const OutlierSet& s) { return OutlierPart{s.top100, s.s.count, {s.s.median}}; }
OutlierSet set_of(const OutlierPart& p) {
  const size_t k = p.medians.size();
  const float m = k == 0 ? 0.f : float((double(p.medians[(k - 1) / 2]) + double(p.medians[k / 2])) / 2);
  return OutlierSet{top_median_of(p.top100, p.count, m), p.top100};
}
}  // namespace

OutlierParts outlier_parts(const std::vector<const Outliers*>& prompts) {
  OutlierParts out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outliers& o = *prompts[i];
    OutlierParts one;
    one.differential = o.differential;
    one.logits = o.logits;
    for (const LayerOutliers& l : o.layers)
      one.layers.push_back({l.layer, l.has_logits, part_of(l.hidden), part_of(l.logit1), part_of(l.logit2)});
    one.hidden = part_of(o.hidden), one.logit1 = part_of(o.logit1), one.logit2 = part_of(o.logit2);
    if (i == 0) out = std::move(one);
    else merge_parts(out, one);
  }
  return out;
}

void merge_parts(OutlierParts& a, const OutlierParts& b) {
  if (b.layers.empty() && b.hidden.count == 0) return;  // nothing on that side
  if (a.layers.empty() && a.hidden.count == 0) {
    a = b;
    return;
  }
  if (a.layers.size() != b.layers.size() || a.differential != b.differential || a.logits != b.logits)
    throw Error("the outliers describe different models (layers or maps differ)");
  for (size_t li = 0; li < a.layers.size(); ++li) {
    OutlierParts::Layer &x = a.layers[li];
    const OutlierParts::Layer& y = b.layers[li];
    if (x.layer != y.layer || x.has_logits != y.has_logits) throw Error("the outliers describe different models (layers differ)");
    merge_part(x.hidden, y.hidden), merge_part(x.logit1, y.logit1), merge_part(x.logit2, y.logit2);
  }
  merge_part(a.hidden, b.hidden), merge_part(a.logit1, b.logit1), merge_part(a.logit2, b.logit2);
}

Outliers outliers_of(const OutlierParts& p) {
  Outliers out;
  out.differential = p.differential;
  out.logits = p.logits;
  for (const OutlierParts::Layer& l : p.layers) {
    LayerOutliers lo;
    lo.layer = l.layer;
    lo.has_logits = l.has_logits;
    lo.hidden = set_of(l.hidden);
    if (lo.has_logits) lo.logit1 = set_of(l.logit1), lo.logit2 = set_of(l.logit2);
    out.layers.push_back(std::move(lo));
  }
  out.hidden = set_of(p.hidden), out.logit1 = set_of(p.logit1), out.logit2 = set_of(p.logit2);
  return out;
}

Outliers merge_outliers(const std::vector<const Outliers*>& prompts) {
  if (prompts.empty()) return Outliers{};
  for (const Outliers* p : prompts)
    if (p->layers.size() != prompts[0]->layers.size()) throw Error("internal: merging outliers of other models");
  return outliers_of(outlier_parts(prompts));
}

namespace {
nlohmann::json part_json(const OutlierPart& p) {
  return {{"top100", p.top100}, {"count", p.count}, {"medians", p.medians}};
}
std::vector<float> floats(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array()) throw Error(what + " is not a list of numbers");
  std::vector<float> v;
  for (const auto& x : j) {
    if (!x.is_number()) throw Error(what + " holds something that is not a number");
    v.push_back(x.get<float>());
  }
  return v;
}
OutlierPart part_from(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("count") || !j["count"].is_number_unsigned())
    throw Error(what + " is not an outlier part (top100, count, medians)");
  OutlierPart p{floats(j.value("top100", nlohmann::json()), what + ".top100"), j["count"].get<uint64_t>(),
                floats(j.value("medians", nlohmann::json()), what + ".medians")};
  if (p.top100.size() > 100 || !std::is_sorted(p.top100.begin(), p.top100.end(), std::greater<float>()) ||
      !std::is_sorted(p.medians.begin(), p.medians.end()))
    throw Error(what + ": top100 is not 100 values at most, largest first, or medians not ascending");
  return p;
}
}  // namespace

nlohmann::json outlier_parts_json(const OutlierParts& p) {
  nlohmann::json layers = nlohmann::json::array();
  for (const OutlierParts::Layer& l : p.layers)
    layers.push_back({{"layer", l.layer}, {"has_logits", l.has_logits}, {"hidden", part_json(l.hidden)},
                      {"logit1", part_json(l.logit1)}, {"logit2", part_json(l.logit2)}});
  return {{"differential", p.differential}, {"logits", p.logits}, {"layers", layers}, {"hidden", part_json(p.hidden)},
          {"logit1", part_json(p.logit1)}, {"logit2", part_json(p.logit2)}};
}

OutlierParts outlier_parts_from_json(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array())
    throw Error(what + " is not the outliers' merge state");
  OutlierParts p;
  p.differential = j.value("differential", false);
  p.logits = j.value("logits", false);
  for (const auto& l : j["layers"]) {
    if (!l.is_object() || !l.contains("layer") || !l["layer"].is_number_integer())
      throw Error(what + ".layers holds an entry without a layer");
    p.layers.push_back({l["layer"].get<int>(), l.value("has_logits", false), part_from(l.value("hidden", nlohmann::json()), what + ".hidden"),
                        part_from(l.value("logit1", nlohmann::json()), what + ".logit1"),
                        part_from(l.value("logit2", nlohmann::json()), what + ".logit2")});
  }
  p.hidden = part_from(j.value("hidden", nlohmann::json()), what + ".hidden");
  p.logit1 = part_from(j.value("logit1", nlohmann::json()), what + ".logit1");
  p.logit2 = part_from(j.value("logit2", nlohmann::json()), what + ".logit2");
  return p;
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
