// See session_outliers.h.
#include "engine/session/session_outliers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "engine/core/env.h"
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

// The 100 largest, largest first (as they are already where the device sorted them).
// (nth_element, then the 100 sorted: a sixth of partial_sort's time over the collections of up to 1024 values, 17 of
// them a call)
void top100(std::vector<float>& x) {
  const size_t k = std::min<size_t>(100, x.size());
  if (k == 0 || (x.size() <= 100 && std::is_sorted(x.begin(), x.end(), std::greater<float>()))) return;
  std::nth_element(x.begin(), x.begin() + long(k - 1), x.end(), std::greater<float>());
  std::sort(x.begin(), x.begin() + long(k), std::greater<float>());
  x.resize(k);
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

namespace {
// A set's summary from its values at or above its 100th largest (sorted here, kept to 100) and its two middles; the
// values join `pool` (the model's set of that kind).
OutlierSet outlier_set(std::vector<float>& top, uint64_t count, float lo, float hi, std::vector<float>& pool) {
  top100(top);
  pool.insert(pool.end(), top.begin(), top.end());
  return {top_median_of(top, count, float((double(lo) + double(hi)) / 2)), top};
}
}  // namespace

Outliers outlier_stats(Session& s, const OutlierRequest& r) {
  if (!s.has_result()) throw Error("outlier statistics: no result yet: run the model first");
  s.run_every_row();
  const ModelConfig& c = s.config();
  const int L = int(c.layers), nmaps = c.is_diff() ? 2 : 1;
  const int64_t n = int64_t(s.ids().size());
  Outliers out;
  out.differential = c.is_diff();
  out.logits = r.logits;
  Backend::HiddenSelection sel;
  if (!r.logits && r.device_select && s.backend().outlier_hidden_select(sel)) {
    std::vector<float> pool;
    const uint64_t count = uint64_t(n) * uint64_t(c.hidden);
    for (int l = 0; l < L; ++l) {
      out.layers.emplace_back().layer = l;
      out.layers.back().hidden = outlier_set(sel.top.at(size_t(l)), count, sel.middle.at(size_t(l)).first,
                                             sel.middle[size_t(l)].second, pool);
    }
    std::vector<float> none;
    out.hidden = outlier_set(pool, count * uint64_t(L), sel.model_middle.first, sel.model_middle.second, none);
    return out;
  }
  std::vector<Source> src;
  for (int l = 0; l < L; ++l) {
    src.push_back({l, false, 1, uint64_t(n) * uint64_t(c.hidden)});
    if (r.logits && c.has_maps(l)) src.push_back({l, true, nmaps, causal_cells(c, l, n)});
  }
  // Finders: per source and map (the 100th largest and the two middles), and per kind and map over all layers (the
  // two middles; the model's top values come from the layers' top 100). The logits' take the first two passes
  // alone: each pass recomputes every layer's Q K^T, and two place a middle within 2^-17 of its value (relatively;
  // RankFinder), which the third would make exact for another third of the time. The top values stay exact (they
  // are collected, not placed), and so does everything of the hidden states, whose passes read memory.
  // DS_OUTLIER_EXACT_MEDIANS=1: the third pass too (README's table; A/B).
  const int logit_passes = env_switch("DS_OUTLIER_EXACT_MEDIANS", false) ? RankFinder::kPasses : 2;
  auto passes_of = [&](bool logits) { return logits ? logit_passes : RankFinder::kPasses; };
  std::vector<std::vector<RankFinder>> own(src.size());
  uint64_t total[3] = {0, 0, 0};  // hidden, logit1, logit2
  for (size_t i = 0; i < src.size(); ++i)
    for (int m = 0; m < src[i].maps; ++m) {
      own[i].emplace_back(top_median_ranks(src[i].count), passes_of(src[i].logits));
      total[src[i].logits ? 1 + m : 0] += src[i].count;
    }
  std::vector<RankFinder> all;
  for (size_t k = 0; k < 3; ++k) {
    const std::vector<uint64_t> rk = top_median_ranks(std::max<uint64_t>(total[k], 1));
    all.emplace_back(std::vector<uint64_t>{rk[1], rk[2]}, passes_of(k > 0));
  }
  // The 100 largest of each set: every value at or above its 100th largest, sorted. A pass collects them as soon as
  // it can: after a pass, the 100th largest's prefix is known, and with it how many values are at or above the
  // prefix's smallest value (RankFinder::below); when that is at most kFoldCap for every map of a source, the next
  // pass collects them and that rank leaves the passes (usually after the first: the top of a set is sparse).
  // Otherwise a collection pass after the last, at the exact 100th value, brings them.
  // (kFoldCap; a layer's logits, kLogitFoldCap: at long prompts the 100th largest logit's prefix holds thousands of
  // values, and without the fold the top takes a collection pass of its own, a fourth recomputation of Q K^T)
  constexpr uint64_t kFoldCap = 1024, kLogitFoldCap = uint64_t(1) << 16;
  Backend::OutlierValues values(src.size());
  std::vector<bool> collected(src.size(), false);
  // The logits' steps layer by layer (the sources of a layer are consecutive), polling r.cancel before each and
  // reporting after each: the passes, then at most one collection; the hidden states alone in one call. A step
  // takes one layer, then twice as many layers as the last when that took under r.min_step_ms (half as many when
  // it took longer): each is a
  // round trip to the backend (a wait and a copy back on a GPU), which at short prompts costs about as much as the
  // layer's passes (the kajuma shape at 4K tokens on an H200: 9.7 ms a call in such steps, 11.0 ms a layer a step).
  const double steps = double(RankFinder::kPasses + 1) * double(L);
  double done = 0;
  size_t group = 1;  // layers a step
  auto by_layer = [&](size_t n, const std::function<int(size_t)>& layer_of,
                      const std::function<void(size_t, size_t)>& step) {
    if (!r.logits) return step(0, n);
    for (size_t i = 0; i < n;) {
      size_t j = i, layers = 0;
      for (; j < n && layers < group; ++layers)
        for (const int l = layer_of(j); j < n && layer_of(j) == l;) ++j;
      if (r.cancel && r.cancel()) throw Cancelled();
      const auto t0 = std::chrono::steady_clock::now();
      step(i, j);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      group = ms < r.min_step_ms ? std::min<size_t>(group * 2, size_t(L)) : std::max<size_t>(group / 2, 1);
      done += double(layers);
      if (r.progress) r.progress(std::min(1.0, done / steps));
      i = j;
    }
  };
  for (int pass = 0; pass < RankFinder::kPasses; ++pass) {
    std::vector<RadixPass> all_pass(3);
    for (size_t k = 0; k < 3; ++k)
      if (!all[k].done()) all_pass[k] = all[k].pass();
    // the sources this pass counts (the logits' are done after logit_passes), each with its query
    std::vector<size_t> act;
    for (size_t i = 0; i < src.size(); ++i)
      if (!own[i][0].done()) act.push_back(i);
    std::vector<Backend::OutlierQuery> queries(src.size());
    std::vector<bool> collects(src.size(), false);
    for (size_t i : act) {
      if (pass > 0 && !collected[i]) {
        bool fold = true;
        const uint64_t cap = src[i].logits ? kLogitFoldCap : kFoldCap;
        for (int m = 0; m < src[i].maps; ++m) fold &= src[i].count - own[i][size_t(m)].below(0) <= cap;
        if (fold) {
          for (int m = 0; m < src[i].maps; ++m) {
            queries[i].at_least.push_back(own[i][size_t(m)].floor_value(0));
            own[i][size_t(m)].retire(0);
          }
          queries[i].cap = size_t(cap);
          collects[i] = collected[i] = true;
        }
      }
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
    std::vector<std::vector<uint64_t>> counts_of(src.size());
    Backend::OutlierValues got(src.size());
    by_layer(act.size(), [&](size_t a) { return src[act[a]].layer; }, [&](size_t a, size_t b) {
      std::vector<Backend::OutlierQuery> part;
      bool any = false;
      for (size_t k = a; k < b; ++k) part.push_back(queries[act[k]]), any |= collects[act[k]];
      std::vector<std::vector<uint64_t>> c;
      Backend::OutlierValues v;
      s.backend().outlier_counts_many(part, c, any ? &v : nullptr);
      for (size_t k = 0; k < part.size(); ++k) {
        counts_of[act[a + k]] = std::move(c.at(k));
        if (any) got[act[a + k]] = std::move(v.at(k));
      }
    });
    // The model's finders add up the sources' histograms of their prefixes.
    std::vector<std::vector<uint64_t>> all_counts(3);
    for (size_t k = 0; k < 3; ++k) all_counts[k].assign(size_t(all_pass[k].histograms()) * size_t(all_pass[k].bins()), 0);
    for (size_t i : act) {
      if (collects[i]) values[i] = std::move(got.at(i));
      const RadixPass& q = queries[i].pass;
      const size_t bins = size_t(q.bins()), H = size_t(q.histograms());
      const std::vector<uint64_t>& counts = counts_of.at(i);
      if (counts.size() != size_t(src[i].maps) * H * bins) throw Error("internal: outlier pass counts of the wrong size");
      for (int m = 0; m < src[i].maps; ++m) {
        const uint64_t* mine = counts.data() + size_t(m) * H * bins;
        own[i][size_t(m)].take(mine, q.prefixes);
        const size_t k = size_t(src[i].logits ? 1 + m : 0);
        const RadixPass& ap = all_pass[k];
        for (int h = 0; h < ap.histograms(); ++h) {
          const size_t at = ap.prefixes.empty() ? 0
                                                : size_t(std::find(q.prefixes.begin(), q.prefixes.end(), ap.prefixes[size_t(h)]) -
                                                         q.prefixes.begin());
          const uint64_t* from = mine + at * bins;
          uint64_t* to = all_counts[k].data() + size_t(h) * bins;
          for (size_t d = 0; d < bins; ++d) to[d] += from[d];
        }
      }
    }
    for (size_t k = 0; k < 3; ++k)
      if (total[k] > 0 && !all[k].done()) all[k].take(all_counts[k].data(), all_pass[k].prefixes);
  }
  std::vector<float> pool[3];
  std::vector<Backend::OutlierQuery> vq;
  std::vector<size_t> vq_src;
  for (size_t i = 0; i < src.size(); ++i) {
    if (collected[i]) continue;
    Backend::OutlierQuery x;
    // every value at or above the 100th largest's prefix floor (its value after kPasses passes)
    for (int m = 0; m < src[i].maps; ++m) x.at_least.push_back(own[i][size_t(m)].floor_value(0));
    // Ties at the threshold can bring more than 100; a set of equal values brings them all (cap: the whole set).
    x.cap = size_t(std::min<uint64_t>(src[i].count, uint64_t(1) << 22));
    x.layer = src[i].layer;
    x.logits = src[i].logits;
    vq.push_back(std::move(x));
    vq_src.push_back(i);
  }
  by_layer(vq.size(), [&](size_t j) { return vq[j].layer; }, [&](size_t i, size_t j) {
    if (i == j) return;
    Backend::OutlierValues more = s.backend().outlier_values_many({vq.begin() + long(i), vq.begin() + long(j)});
    for (size_t k = i; k < j; ++k) values[vq_src[k]] = std::move(more.at(k - i));
  });
  if (r.progress && r.logits) r.progress(1.0);
  for (size_t i = 0; i < src.size(); ++i) {
    std::vector<std::vector<float>>& v = values.at(i);
    LayerOutliers* lo = nullptr;
    if (out.layers.empty() || out.layers.back().layer != src[i].layer) out.layers.emplace_back().layer = src[i].layer;
    lo = &out.layers.back();
    for (int m = 0; m < src[i].maps; ++m) {
      const RankFinder& f = own[i][size_t(m)];
      OutlierSet set = outlier_set(v[size_t(m)], src[i].count, f.value(1), f.value(2), pool[src[i].logits ? 1 + m : 0]);
      if (!src[i].logits) lo->hidden = set;
      else if (m == 0) lo->logit1 = set, lo->has_logits = true;
      else lo->logit2 = set;
    }
  }
  OutlierSet* model[3] = {&out.hidden, &out.logit1, &out.logit2};
  for (size_t k = 0; k < 3; ++k) {
    std::vector<float> none;
    if (total[k] > 0) *model[k] = outlier_set(pool[k], total[k], all[k].value(0), all[k].value(1), none);
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
