// Layers across devices (split_backend.h).
#include "engine/session/split_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/core/env.h"
#include "engine/core/error.h"
#include "engine/core/input_limits.h"
#include "engine/core/model.h"
#include "engine/cuda/backend_cuda.h"

namespace ds {

namespace {

std::string gib(double bytes) {  // "1.5 GiB", "96 MiB"
  char b[32];
  if (bytes >= double(1u << 30)) std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1u << 30));
  else std::snprintf(b, sizeof b, "%.0f MiB", bytes / double(1u << 20));
  return b;
}

bool is_cuda(const BackendChoice& c) { return c.kind != BackendChoice::Kind::Cpu; }

// "GPU 1", or "CPU 0" for the list's entry `index` (CPU backends have no device number)
std::string device_label(const BackendChoice& c, int index) {
  return is_cuda(c) ? "GPU " + std::to_string(c.device) : "CPU " + std::to_string(index);
}

// What one block of layers [first, end) plans to hold: weights (bf16 on a GPU, f32 on the CPU), the embedding with
// layer 0, the LM head with the last layer, and the activations of plan_tokens tokens (its streams, caches, scratch).
// host: the CUDA backend's host caches (backend_cuda_host_caches.cpp): two slots of stream and Q/K/V rows on the
// device, every layer's rows (host_per_layer) in host memory.
struct Costs {
  double per_param, embed, per_layer, act_fixed, act_per_layer, host_per_layer;
};
Costs costs_of(const ModelConfig& c, bool cuda, int64_t tokens, bool host = false) {
  Costs k;
  k.per_param = cuda ? 2 : 4;
  k.embed = double(c.vocab * c.hidden) * k.per_param;
  k.per_layer = c.layer_share_params() * k.per_param;
  const double W = double((c.heads + 2 * c.kv_heads) * c.head_dim), E = double(c.hidden);
  const double rows = double(tokens) * (E * 4 + W * 2);
  k.act_per_layer = host ? 0 : rows;
  k.host_per_layer = host ? rows : 0;
  k.act_fixed = double(tokens) * (E * 4 + double(c.intermediate) * 6 + E * 6 + double(c.heads * c.head_dim) * 2) +
                (host ? 2 * rows : 0);
  return k;
}

// Whether the CUDA backend can keep this model's layers' rows in host memory (ModelConfig::self_attention_only), and
// DS_HOST_CACHES does not forbid it.
bool host_caches_allowed(const ModelConfig& c) {
  if (std::getenv("DS_HOST_CACHES") && !env_switch("DS_HOST_CACHES", false)) return false;
  return c.self_attention_only();
}

}  // namespace

Placement place_layers(const ModelConfig& cfg, const SplitOptions& opt) {
  if (opt.backends.empty()) throw Error("--backend: no device given");
  const int L = int(cfg.layers), D = int(opt.backends.size());
  Placement p;
  for (const BackendChoice& b : opt.backends) {
    const bool cuda = is_cuda(b);
    std::string why;
    if (cuda && !cuda_backend_available(&why, b.device))
      throw Error("--backend: GPU " + std::to_string(b.device) + " cannot be used: " + why);
    int64_t free_b = cuda ? cuda_free_memory(b.device) : int64_t(available_memory_bytes());
    int64_t budget = opt.mem_limit > 0 ? std::min(free_b > 0 ? free_b : opt.mem_limit, opt.mem_limit) : free_b;
    budget -= cuda ? int64_t(768) << 20 : 0;  // the CUDA backend's reserve (workspaces, maps, logits)
    p.budget.push_back(budget);
  }
  // Greedy in device order: each device takes as many of the remaining layers as fit, so the model uses as few
  // devices (and hand-offs) as it can. Where the devices cannot hold every layer's rows of plan_tokens tokens, GPUs
  // plan again with host caches (the rows in host memory, two slots of them on the device).
  bool all_cuda = true;
  for (const BackendChoice& b : opt.backends) all_cuda &= is_cuda(b);
  const uint64_t host_free = available_memory_bytes(), host_reserve = uint64_t(2) << 30;
  int l = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool host = pass == 1;
    if (host) {
      if (!all_cuda || !host_caches_allowed(cfg)) break;
      const Costs k = costs_of(cfg, true, opt.plan_tokens, true);
      if (k.host_per_layer * L > double(host_free > host_reserve ? host_free - host_reserve : 0)) break;
      p.first.clear(), p.end.clear(), p.dev.clear(), p.need.clear();
      p.host_caches = true;
      p.host_bytes = size_t(k.host_per_layer * L);
      l = 0;
    }
    for (int d = 0; d < D && l < L; ++d) {
      const Costs k = costs_of(cfg, is_cuda(opt.backends[size_t(d)]), opt.plan_tokens, host);
      double need = k.act_fixed + (l == 0 ? k.embed : 0) + k.act_per_layer;  // (the block's first stream)
      int end = l;
      while (end < L) {
        const double tail = end + 1 == L ? k.embed : 0;  // the LM head (the embedding again when tied)
        if (need + k.per_layer + k.act_per_layer + tail > double(p.budget[size_t(d)])) break;
        need += k.per_layer + k.act_per_layer;
        ++end;
      }
      if (end == l) continue;  // this device cannot take one layer: the next
      if (end == L) need += k.embed;
      p.first.push_back(l);
      p.end.push_back(end);
      p.dev.push_back(d);
      p.need.push_back(size_t(need));
      l = end;
    }
    if (l == L) break;
  }
  if (l < L) {
    p.host_caches = false;
    const Costs k = costs_of(cfg, is_cuda(opt.backends[0]), opt.plan_tokens);
    const double total = k.embed * 2 + (k.per_layer + k.act_per_layer) * L + k.act_fixed * D;
    double offered = 0;
    for (int64_t b : p.budget) offered += double(std::max<int64_t>(b, 0));
    throw Error("the model does not fit the " + std::to_string(D) + " device" + (D > 1 ? "s" : "") + " given: it needs about " +
                gib(total) + " (weights " + gib(k.embed * (cfg.tie_embeddings ? 1 : 2) + k.per_layer * L) +
                ", activations for " + std::to_string(opt.plan_tokens) + " tokens " +
                gib((k.act_per_layer * L + k.act_fixed * D)) + ") and they offer " + gib(offered) +
                (opt.mem_limit > 0 ? " under --gpu-mem-limit " + gib(double(opt.mem_limit)) + " each" : "") +
                (all_cuda && host_caches_allowed(cfg)
                     ? " (with the layers' rows in host memory: " +
                           gib(costs_of(cfg, true, opt.plan_tokens, true).host_per_layer * L) + " of " +
                           gib(double(host_free)) + " free)"
                     : "") +
                "; HINT: add devices (--backend cuda:all) or raise --gpu-mem-limit");
  }
  return p;
}

std::string placement_text(const Placement& p, const std::vector<BackendChoice>& backends) {
  std::string t;
  for (size_t i = 0; i < p.first.size(); ++i) {
    const BackendChoice& b = backends[size_t(p.dev[i])];
    t += (i ? ", " : "") +
         (p.end[i] - p.first[i] == 1 ? "layer " + std::to_string(p.first[i])
                                      : "layers " + std::to_string(p.first[i]) + "-" + std::to_string(p.end[i] - 1)) +
         " on " + device_label(b, p.dev[i]) + " (" +
         gib(double(p.need[i])) + " of " + gib(double(p.budget[size_t(p.dev[i])])) + ")";
  }
  if (p.host_caches) t += "; the layers' streams and Q/K/V in host memory (" + gib(double(p.host_bytes)) + ")";
  return t;
}

namespace {

class SplitBackend final : public Backend {
 public:
  explicit SplitBackend(SplitOptions opt) : opt_(std::move(opt)) {}

  std::string name() const override {
    if (subs_.empty()) return "layer split (not loaded)";
    if (subs_.size() == 1) return subs_[0]->name();
    return subs_[0]->name() + ", layer split: " + placement_text(place_, opt_.backends);
  }
  std::string kind() const override {
    return subs_.empty() ? (is_cuda(opt_.backends[0]) ? "cuda" : "cpu") : subs_[0]->kind();
  }

  void load(const Model& model, const ProgressFn& progress) override {
    const ModelConfig& c = model.cfg;
    place_ = place_layers(c, opt_);
    if (place_.first.size() > 1 && c.spec().schedule != Schedule::Uniform)
      throw Error(std::string("a layer split of ") + c.family() + " is not built: its layers read other layers' caches; "
                  "HINT: one device (--backend cuda:N) that holds it");
    for (size_t i = 1; i < opt_.backends.size(); ++i)
      if (is_cuda(opt_.backends[i]) != is_cuda(opt_.backends[0]))
        throw Error("--backend: a layer split runs on GPUs or on CPU backends, not both");
    subs_.clear();
    cfg_ = c;
    const size_t B = place_.first.size();
    const auto device_of = [&](size_t block) { return opt_.backends[size_t(place_.dev[block])]; };
    for (size_t i = 0; i + 1 < B; ++i)  // the hand-offs: peer to peer where the GPUs allow it
      if (is_cuda(device_of(i))) {
        cuda_enable_peer(device_of(i).device, device_of(i + 1).device);
        cuda_enable_peer(device_of(i + 1).device, device_of(i).device);
      }
    for (size_t i = 0; i < B; ++i) {
      std::unique_ptr<Backend> b = make_backend(device_of(i), opt_.cpu_threads);
      if (B > 1 && !b->set_layer_range(place_.first[i], place_.end[i]))
        throw Error("the " + b->kind() + " backend cannot hold a block of layers");
      if (opt_.mem_limit > 0) b->set_memory_limit(opt_.mem_limit);  // prompts then fit as they would on such a card
      const double lo = double(i) / double(B), span = 1.0 / double(B);
      b->load(model, [&](double f, const std::string& what) {
        if (progress) progress(lo + span * f, (B > 1 ? "block " + std::to_string(i + 1) + "/" + std::to_string(B) + ": " : "") + what);
      });
      subs_.push_back(std::move(b));
    }
  }

  void forward(const ForwardRequest& req, ForwardResult& out) override {
    const auto t0 = std::chrono::steady_clock::now();
    const int L = int(cfg_.layers);
    const int64_t n = int64_t(req.ids.size());
    out.maps.assign(size_t(L), LayerMaps{});
    out.hidden.clear();
    if (req.keep_hidden) out.hidden.assign(size_t(L + 1), {});
    if (req.append_from > 0) {  // decoding: each new position through every block, one row between them
      for (int64_t pos = req.append_from; pos < n; ++pos) {
        ForwardRequest r = req;
        r.ids.assign(req.ids.begin(), req.ids.begin() + pos + 1);
        r.append_from = pos;
        run_blocks(r, 0, out, pos, t0);
      }
    } else {
      const int from = std::clamp(req.from_layer, 0, L);
      size_t k0 = 0;  // the block the changed layer is in: the earlier ones keep their results
      while (k0 + 1 < subs_.size() && from >= place_.end[k0]) ++k0;
      run_blocks(req, k0, out, 0, t0);
    }
    out.n = n;
    out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!req.profile) return;  // (bulk re-runs: the profile stays the last profiled forward's)
    forward_ms_ = out.ms;
    tokens_ = n - req.append_from;
  }

  void layer_maps(int layer, LayerMaps& out) override { at(layer).layer_maps(layer, out); }
  void map_view(const ViewRequest& req, MapView& out) override { at(req.layer).map_view(req, out); }
  void map_rows(int layer, const std::vector<int64_t>& positions, MapRows& out) override {
    at(layer).map_rows(layer, positions, out);
  }
  std::vector<HeadStats> head_stats(int layer, std::optional<float> lambda) override {
    return at(layer).head_stats(layer, lambda);
  }
  std::vector<double> entropy_sweep(int layer, int head, const std::vector<float>& lambdas) override {
    return at(layer).entropy_sweep(layer, head, lambdas);
  }
  std::vector<RowMass> row_mass(int layer, int64_t q, int64_t a0, int64_t a1) override {
    return at(layer).row_mass(layer, q, a0, a1);
  }
  // Each block's layers in one call to the block's backend.
  std::vector<std::vector<RowMass>> row_masses(const std::vector<int>& layers, int64_t q, int64_t a0,
                                               int64_t a1) override {
    std::vector<std::vector<RowMass>> out(layers.size());
    for (size_t b = 0; b < subs_.size(); ++b) {
      std::vector<int> mine;
      std::vector<size_t> where;
      for (size_t i = 0; i < layers.size(); ++i)
        if (&at(layers[i]) == subs_[b].get()) mine.push_back(layers[i]), where.push_back(i);
      if (mine.empty()) continue;
      std::vector<std::vector<RowMass>> got = subs_[b]->row_masses(mine, q, a0, a1);
      for (size_t k = 0; k < where.size(); ++k) out[where[k]] = std::move(got[k]);
    }
    return out;
  }
  void mamba_view(const ViewRequest& req, MapView& out) override { at(req.layer).mamba_view(req, out); }
  void mamba_row(int layer, int channel, int64_t q, std::vector<float>& row) override {
    at(layer).mamba_row(layer, channel, q, row);
  }

  Profile profile() const override {
    Profile p;
    for (size_t i = 0; i < subs_.size(); ++i) {
      const Profile s = subs_[i]->profile();
      p.heads.insert(p.heads.end(), s.heads.begin(), s.heads.end());
      DeviceLane lane;
      lane.device = device_label(opt_.backends[size_t(place_.dev[i])], place_.dev[i]);
      lane.first_layer = place_.first[i];
      lane.end_layer = place_.end[i];
      if (i < lane_ms_.size()) lane.start_ms = lane_ms_[i].first, lane.end_ms = lane_ms_[i].second;
      for (KernelTiming k : s.kernels) {  // a lane per device: its kernels under its name
        lane.kernels_ms += k.total_ms;
        if (k.name == "handoff") lane.handoff_ms += k.total_ms;
        if (subs_.size() > 1) k.name = "[" + std::to_string(i) + "] " + k.name;
        p.kernels.push_back(std::move(k));
      }
      if (subs_.size() > 1) p.lanes.push_back(lane);
      if (i == 0) p.peak_tflops = s.peak_tflops;
    }
    p.forward_ms = forward_ms_;
    p.tokens = tokens_;
    return p;
  }

  int64_t max_tokens() const override {
    int64_t m = INT64_MAX;
    for (const auto& s : subs_) m = std::min(m, s->max_tokens());
    return subs_.empty() ? 0 : m;
  }
  bool truncate(int64_t n) override {
    for (const auto& s : subs_)
      if (!s->truncate(n)) return false;  // (only Mamba layers refuse, and hybrids are not split)
    return true;
  }
  void fetch_logits(ForwardResult& out) override { subs_.back()->fetch_logits(out); }
  bool queue_logprob(int32_t id, int slot) override { return subs_.back()->queue_logprob(id, slot); }
  std::vector<double> take_logprobs(int count) override { return subs_.back()->take_logprobs(count); }

  void lens_logits(int layer, int64_t position, float* out) override {
    Backend& last = *subs_.back();
    const int L = int(cfg_.layers);
    if (layer + 1 >= place_.first.back()) return last.lens_logits(layer, position, out);
    // Another block's row through the last block's final norm and LM head: written into the last stream's row for the
    // time of the call, and put back.
    const int64_t E = cfg_.hidden;
    std::vector<float> row(static_cast<size_t>(E)), saved(static_cast<size_t>(E));
    at(layer).read_stream(layer + 1, position, 1, row.data());
    last.read_stream(L, position, 1, saved.data());
    last.write_stream(L, position, 1, row.data());
    try {
      last.lens_logits(L - 1, position, out);
    } catch (...) {
      last.write_stream(L, position, 1, saved.data());
      throw;
    }
    last.write_stream(L, position, 1, saved.data());
  }

  void outlier_counts(int layer, bool logits, const RadixPass& pass, std::vector<uint64_t>& counts) override {
    at(layer).outlier_counts(layer, logits, pass, counts);
  }
  std::vector<std::vector<float>> outlier_values(int layer, bool logits, const std::vector<float>& at_least,
                                                 size_t cap) override {
    return at(layer).outlier_values(layer, logits, at_least, cap);
  }
  // Each block's queries go to it in one call (a GPU's passes launch at once and come back in one copy).
  void outlier_counts_many(const std::vector<OutlierQuery>& q, std::vector<std::vector<uint64_t>>& counts,
                           OutlierValues* values) override {
    using Both = std::pair<std::vector<uint64_t>, std::vector<std::vector<float>>>;
    std::vector<Both> got = by_block<Both>(q, [&](Backend& b, const std::vector<OutlierQuery>& sub) {
      std::vector<std::vector<uint64_t>> c;
      OutlierValues v;
      b.outlier_counts_many(sub, c, values ? &v : nullptr);
      std::vector<Both> r(sub.size());
      for (size_t i = 0; i < sub.size(); ++i) r[i] = {std::move(c[i]), values ? std::move(v[i]) : std::vector<std::vector<float>>{}};
      return r;
    });
    counts.resize(q.size());
    if (values) values->resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      counts[i] = std::move(got[i].first);
      if (values) (*values)[i] = std::move(got[i].second);
    }
  }
  OutlierValues outlier_values_many(const std::vector<OutlierQuery>& q) override {
    return by_block<std::vector<std::vector<float>>>(
        q, [](Backend& b, const std::vector<OutlierQuery>& sub) { return b.outlier_values_many(sub); });
  }
  std::vector<float> layer_max_abs() const override {
    std::vector<float> v;
    for (size_t i = 0; i < subs_.size(); ++i) {
      const std::vector<float> s = subs_[i]->layer_max_abs();
      if (s.empty()) continue;
      if (v.empty()) v.assign(s.size(), std::nanf(""));
      for (int l = place_.first[i]; l < place_.end[i] && size_t(l) < s.size(); ++l) v[size_t(l)] = s[size_t(l)];
    }
    return v;
  }
  int devices_used() const override { return int(subs_.size()); }
  int64_t device_memory_used() const override {
    int64_t m = 0;
    for (const auto& s : subs_) m += std::max<int64_t>(0, s->device_memory_used());
    return subs_.empty() || subs_[0]->device_memory_used() < 0 ? -1 : m;
  }

 private:
  // run(block, its queries) for each block holding some of q's layers, the results put back in q's order.
  template <class R, class F>
  std::vector<R> by_block(const std::vector<OutlierQuery>& q, F&& run) const {
    std::vector<R> out(q.size());
    for (size_t k = 0; k < subs_.size(); ++k) {
      std::vector<size_t> mine;
      std::vector<OutlierQuery> sub;
      for (size_t i = 0; i < q.size(); ++i)
        if (&at(q[i].layer) == subs_[k].get()) mine.push_back(i), sub.push_back(q[i]);
      if (mine.empty()) continue;
      std::vector<R> got = run(*subs_[k], sub);
      for (size_t j = 0; j < mine.size(); ++j) out[mine[j]] = std::move(got.at(j));
    }
    return out;
  }
  Backend& at(int layer) const {
    for (size_t i = 0; i < subs_.size(); ++i)
      if (layer >= place_.first[i] && layer < place_.end[i]) return *subs_[i];
    throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg_.layers) +
                " layers)");
  }

  // Blocks k0.. of one call (a prompt, or one decoding position `pos`), each given the previous block's rows.
  void run_blocks(const ForwardRequest& req, size_t k0, ForwardResult& out, int64_t pos,
                  std::chrono::steady_clock::time_point t0) {
    const int L = int(cfg_.layers);
    const auto since = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    lane_ms_.resize(subs_.size());
    for (size_t k = 0; k < k0; ++k) lane_ms_[k] = {0.0, 0.0};  // kept from before: not re-run
    for (size_t k = k0; k < subs_.size(); ++k) {
      const double start = since();
      ForwardRequest r = req;
      if (k > 0) {
        const StreamRows in = subs_[k - 1]->stream_rows(place_.first[k], pos);
        r.stream_in = in.data;
        r.stream_in_device = in.device;
        if (req.append_from == 0 && (k > k0 || req.from_layer < place_.first[k]))
          r.from_layer = place_.first[k];  // its input changed: the whole block runs
      }
      ForwardResult res;
      subs_[k]->forward(r, res);  // (returns once the block's work is done: its results are read next)
      lane_ms_[k] = {start, since()};
      for (int l = place_.first[k]; l < place_.end[k]; ++l)
        if (size_t(l) < res.maps.size() && !res.maps[size_t(l)].empty()) out.maps[size_t(l)] = std::move(res.maps[size_t(l)]);
      if (req.keep_hidden)
        for (int l = place_.first[k]; l <= place_.end[k] && size_t(l) < res.hidden.size(); ++l)
          if (!res.hidden[size_t(l)].empty()) out.hidden[size_t(l)] = std::move(res.hidden[size_t(l)]);
      if (place_.end[k] == L) {
        out.logits = std::move(res.logits);
        out.logit_rows = res.logit_rows;
        out.argmax = res.argmax;
      }
    }
  }

  SplitOptions opt_;
  Placement place_;
  ModelConfig cfg_;
  std::vector<std::unique_ptr<Backend>> subs_;
  double forward_ms_ = 0;
  int64_t tokens_ = 0;
  std::vector<std::pair<double, double>> lane_ms_;  // per block: [start, end] of its part of the last forward (ms)
};

}  // namespace

std::unique_ptr<Backend> make_backend_for(const SplitOptions& opt) {
  if (opt.backends.size() == 1 && opt.mem_limit == 0) return make_backend(opt.backends[0], opt.cpu_threads);
  return std::make_unique<SplitBackend>(opt);
}

}  // namespace ds
