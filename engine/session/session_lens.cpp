// See session_lens.h.
#include "engine/session/session_lens.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/map_query.h"

namespace ds {

namespace {
// The distribution of one row of logits: the top k, the target's probability and rank.
LensEntry entry(const Session& s, const float* z, int64_t V, int64_t position, int k, int32_t target) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(z[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(z[i]) - mx);
  const double logz = mx + std::log(sum);
  LensEntry e;
  e.position = position;
  std::vector<int32_t> idx(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) idx[size_t(i)] = int32_t(i);
  const size_t kk = size_t(std::min<int64_t>(k, V));
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  });
  for (size_t i = 0; i < kk; ++i) {
    const int32_t id = idx[i];
    e.top.push_back({id, float(std::exp(double(z[id]) - logz)), z[id],
                     s.tokenizer() ? s.tokenizer()->token_text(id) : "#" + std::to_string(id)});
  }
  e.target_prob = float(std::exp(double(z[target]) - logz));
  int64_t above = 0;
  for (int64_t i = 0; i < V; ++i) above += z[i] > z[target];
  e.target_rank = above + 1;
  return e;
}
}  // namespace

void check_lens(const Session& s, const LensRequest& r) {
  if (!s.has_result()) throw Error("logit lens: no result yet: run the model first");
  const ModelConfig& c = s.config();
  for (int l : r.layers)
    if (l < 0 || l >= c.layers)
      throw Error("logit lens: layer " + std::to_string(l) + " does not exist (the model has " +
                  std::to_string(c.layers) + " layers)");
  if (r.positions.empty()) throw Error("logit lens: no position given");
  resolve_positions(r.positions, int64_t(s.ids().size()));  // throws for one outside the sequence
  if (r.top_k < 1 || r.top_k > c.vocab)
    throw Error("logit lens: top-k " + std::to_string(r.top_k) + " is not in 1.." + std::to_string(c.vocab));
  if (r.target < -1 || r.target >= c.vocab)
    throw Error("logit lens: target " + std::to_string(r.target) + " is outside the vocabulary (" +
                std::to_string(c.vocab) + " tokens)");
}

Lens logit_lens(Session& s, const LensRequest& r) {
  check_lens(s, r);
  s.run();
  const ModelConfig& c = s.config();
  const int L = int(c.layers);
  const int64_t n = int64_t(s.ids().size()), V = c.vocab;
  const std::vector<int64_t> pos = resolve_positions(r.positions, n);
  std::vector<int> layers = r.layers;
  if (layers.empty())
    for (int l = 0; l < L; ++l) layers.push_back(l);
  const bool last_layer = std::find(layers.begin(), layers.end(), L - 1) != layers.end();
  const bool other_rows = std::any_of(pos.begin(), pos.end(), [&](int64_t p) { return p != n - 1; });
  if (last_layer && other_rows && s.result().logit_rows != n) s.run(true);  // every row of the last layer
  Lens out;
  out.target = r.target >= 0 ? r.target : s.top_k(1).at(0).id;
  out.target_text = s.tokenizer() ? s.tokenizer()->token_text(out.target) : "#" + std::to_string(out.target);
  // The rows' logits first (the backend, one call each), then their distributions (softmax, top k, rank: passes over
  // the vocabulary on the host, the lens's main cost at 128K tokens) on every core at once. Host memory: one row of
  // the vocabulary per (layer, position) asked for, never n of them.
  const size_t rows = layers.size() * pos.size();
  std::vector<float> z(rows * size_t(V));
  std::vector<const float*> src(rows);
  for (size_t li = 0; li < layers.size(); ++li)
    for (size_t pi = 0; pi < pos.size(); ++pi) {
      const size_t i = li * pos.size() + pi;
      if (layers[li] == L - 1) {  // the model's own logits: the last layer's lens by definition
        const ForwardResult& res = s.result();
        src[i] = res.logits.data() + (res.logit_rows == n ? pos[pi] : 0) * V;
      } else {
        s.backend().lens_logits(layers[li], pos[pi], z.data() + i * size_t(V));
        src[i] = z.data() + i * size_t(V);
      }
    }
  std::vector<LensEntry> entries(rows);
  std::atomic<size_t> next{0};
  std::exception_ptr fault;
  std::mutex fault_mu;
  const auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < rows;) {
      try {
        entries[i] = entry(s, src[i], V, pos[i % pos.size()], r.top_k, out.target);
      } catch (...) {
        std::lock_guard lk(fault_mu);
        fault = std::current_exception();
      }
    }
  };
  const size_t nthreads = std::min<size_t>(rows, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < nthreads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (fault) std::rethrow_exception(fault);
  for (size_t li = 0; li < layers.size(); ++li) {
    LensLayer ll;
    ll.layer = layers[li];
    for (size_t pi = 0; pi < pos.size(); ++pi) ll.positions.push_back(std::move(entries[li * pos.size() + pi]));
    out.layers.push_back(std::move(ll));
  }
  return out;
}

std::string lens_json(const Lens& lens) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LensLayer& l : lens.layers) {
    nlohmann::json ps = nlohmann::json::array();
    for (const LensEntry& e : l.positions) {
      nlohmann::json top = nlohmann::json::array();
      for (const TopToken& t : e.top) top.push_back({{"id", t.id}, {"text", t.text}, {"prob", t.prob}});
      ps.push_back({{"position", e.position}, {"top", top}, {"target_prob", e.target_prob}, {"target_rank", e.target_rank}});
    }
    layers.push_back({{"layer", l.layer}, {"positions", ps}});
  }
  nlohmann::json j{{"target", lens.target}, {"target_text", lens.target_text}, {"layers", layers}};
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ds
