// CPU backend: the reference forward pass. Weights are converted to f32 on load; matrix products go through
// OpenBLAS; everything else is plain loops in f32 with sums in double where it matters. It computes exactly what
// transformers' DiffLlama / Llama eager forward computes (the head mapping: kernels/attn_heads.h), and for the
// families of the architecture table (arch.h) what their published code computes: Motif's PolyNorm MLP, and
// SambaY's layers (Phi-4-mini-flash: LayerNorm with bias, Mamba-1, gated memory units, sliding-window and
// cross-layer differential attention without RoPE; docs/models/phi4flash.md).
//
// Activations kept between calls (so a lambda change re-runs only from the first changed layer, and decoding runs
// only the new positions: ForwardRequest::append_from):
//   layer_in_[l]  [n, D]   input of layer l (l = 0..L); layer_in_[L] is the last layer's output.
//   kv_k_/kv_v_[l] [n, Hkv, d]  K (after RoPE) and V of each attention layer that projects its own (the KV cache;
//                  cross-attention layers read their kv_source's).
//   memory_       [n, di]  SambaY: the memory layer's scan output, read by the GMU layers after it.
//   conv_state_[l] [K-1, di], ssm_state_[l] [di, S] (double): each Mamba layer's state after the last position.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <tuple>
#include <thread>
#include <unistd.h>

#include "engine/cpu/backend_cpu.h"
#include "engine/cpu/detail/backend_cpu_attention.h"
#include "engine/core/error.h"
#include "engine/core/forward.h"
#include "engine/core/input_limits.h"
#include "kernels/attn_heads.h"
#include "engine/core/rope.h"

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);

namespace ds {
namespace {

constexpr const char* kNoDeviceMemory = "results on a GPU (device=True) need the CUDA backend; this one runs on the CPU";
using Clock = std::chrono::steady_clock;
// Memory the kernel says can be given to a new allocation without swapping (MemAvailable), in bytes.
double available_memory() {
  if (const uint64_t b = available_memory_bytes()) return double(b);
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) * 0.5;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct LayerW {
  std::vector<float> ln1, ln2, ln1_b, ln2_b;  // [D] (biases: LayerNorm families)
  std::vector<float> wq, wk, wv, wo;          // [H*d, D] [Hkv*d, D] [Hkv*d, D] [D, H*d] (cross layers: no wk, wv)
  std::vector<float> bq, bk, bv, bo;          // their biases, where stored
  std::vector<float> gate, up, down;          // [I, D] [I, D] [D, I]
  std::vector<float> act;                     // PolyNorm: w0, w1, w2, b
  // Mamba-1 / GMU (model.h names the shapes); a_neg = -exp(A_log)
  std::vector<float> in_proj, conv_w, conv_b, x_proj, dt_w, dt_b, a_neg, d_skip, out_proj;
};

// y[m, n] += b[n] for every row (b empty: nothing)
void add_bias(float* y, const std::vector<float>& b, int64_t m) {
  const int64_t n = int64_t(b.size());
  for (int64_t i = 0; i < m && n; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] += b[size_t(j)];
}

float silu(float v) { return v / (1.f + std::exp(-v)); }
double softplus(double v) { return v <= 20.0 ? std::log1p(std::exp(v)) : v; }  // as F.softplus and the scan kernel

// PolyNorm (arch.h) of each row of g [n, I], in place: w0 N(g^3) + w1 N(g^2) + w2 N(g) + b.
void polynorm(float* g, int64_t n, int64_t I, const float* wb, double eps) {
  for (int64_t r = 0; r < n; ++r) {
    float* x = g + r * I;
    double s2 = 0, s4 = 0, s6 = 0;
    for (int64_t c = 0; c < I; ++c) {
      const double v = x[c], v2 = v * v;
      s2 += v2, s4 += v2 * v2, s6 += v2 * v2 * v2;
    }
    const double f1 = wb[2] / std::sqrt(s2 / double(I) + eps), f2 = wb[1] / std::sqrt(s4 / double(I) + eps),
                 f3 = wb[0] / std::sqrt(s6 / double(I) + eps);
    for (int64_t c = 0; c < I; ++c) {
      const double v = x[c];
      x[c] = float(f3 * v * v * v + f2 * v * v + f1 * v + wb[3]);
    }
  }
}

// LayerNorm with weight and bias over rows of D (biased variance, as torch).
void layernorm(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t D, double eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * D;
    double s = 0, ss = 0;
    for (int64_t j = 0; j < D; ++j) s += xi[j];
    const double mean = s / double(D);
    for (int64_t j = 0; j < D; ++j) ss += (xi[j] - mean) * (xi[j] - mean);
    const double r = 1.0 / std::sqrt(ss / double(D) + eps);
    float* yi = y + i * D;
    for (int64_t j = 0; j < D; ++j) yi[j] = float((xi[j] - mean) * r * w[j] + b[j]);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int64_t n, int64_t D, double eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * D;
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(xi[j]) * xi[j];
    const float r = float(1.0 / std::sqrt(ss / double(D) + eps));
    float* yi = y + i * D;
    for (int64_t j = 0; j < D; ++j) yi[j] = (w ? w[j] : 1.f) * (xi[j] * r);
  }
}

// NeoX rotate_half RoPE in place on x [m, heads, d], rows at positions p0 .. p0 + m - 1
void apply_rope(float* x, int64_t p0, int64_t m, int64_t heads, int64_t d, const std::vector<float>& c,
                const std::vector<float>& s) {
  const int64_t h2 = d / 2;
  for (int64_t p = 0; p < m; ++p)
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (p * heads + h) * d;
      const float* cp = c.data() + (p0 + p) * h2;
      const float* sp = s.data() + (p0 + p) * h2;
      for (int64_t i = 0; i < h2; ++i) {
        const float a = v[i], b = v[i + h2];
        v[i] = a * cp[i] - b * sp[i];
        v[i + h2] = b * cp[i] + a * sp[i];
      }
    }
}

struct KernelStat {
  int64_t count = 0;
  double total = 0, mn = 1e300, mx = 0;
  void add(double ms) {
    ++count;
    total += ms;
    mn = std::min(mn, ms);
    mx = std::max(mx, ms);
  }
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()))), pool_(threads_) {
    openblas_set_num_threads(threads_);
  }
  std::string name() const override {
    return "CPU (OpenBLAS, " + std::to_string(threads_) + " threads, attention " + cpu_attn::isa() + ")";
  }
  std::string kind() const override { return "cpu"; }

  // A layer split's block (engine/session/split_backend.h; two CPU backends stand in for two GPUs in the tests).
  bool set_layer_range(int first, int last) override {
    first_ = first;
    last_ = last;
    return true;
  }
  int end_layer() const { return last_ < 0 ? int(cfg_.layers) : last_; }
  StreamRows stream_rows(int l, int64_t r0) const override {
    if (l < first_ || l > end_layer() || size_t(l) >= layer_in_.size()) throw Error("internal: stream of another block");
    return {layer_in_[size_t(l)].data() + r0 * cfg_.hidden, -1};
  }
  void write_stream(int l, int64_t r0, int64_t rows, const float* in) override {
    if (l < first_ || l > end_layer() || size_t(l) >= layer_in_.size() ||
        layer_in_[size_t(l)].size() < size_t((r0 + rows) * cfg_.hidden))
      throw Error("internal: write_stream outside the last forward");
    std::copy(in, in + rows * cfg_.hidden, layer_in_[size_t(l)].begin() + r0 * cfg_.hidden);
  }

  void read_stream(int l, int64_t r0, int64_t rows, float* out) override {
    if (l < first_ || l > end_layer() || size_t(l) >= layer_in_.size() ||
        layer_in_[size_t(l)].size() < size_t((r0 + rows) * cfg_.hidden))
      throw Error("internal: read_stream outside the last forward");
    std::copy_n(layer_in_[size_t(l)].begin() + r0 * cfg_.hidden, rows * cfg_.hidden, out);
  }

  void load(const Model& m, const ProgressFn& progress) override {
    const int first = first_, end = last_ < 0 ? int(m.cfg.layers) : last_;
    const bool tied = m.lm_head == m.embed;
    // Weights become f32 here: refuse before allocating when they cannot fit (a block of a split: its share).
    const double need = 4.0 * m.cfg.block_params(first, end), have = available_memory();
    if (need > have * 0.9)
      fail_file(m.dir, "the CPU backend needs " + std::to_string(int64_t(need / 1e6)) + " MB for the weights as f32 but only " +
                           std::to_string(int64_t(have / 1e6)) + " MB of memory is available");
    cfg_ = m.cfg;
    const size_t total = m.weight_bytes();
    size_t done = 0;
    auto conv = [&](const TensorInfo* t, std::vector<float>& dst) {
      dst.resize(size_t(t->numel()));
      tensor_to_f32(*t, dst.data());
      done += t->nbytes;
      if (progress) progress(total ? double(done) / double(total) : 1.0, t->name);
    };
    if (first == 0 || (tied && end == cfg_.layers)) conv(m.embed, embed_);
    if (end == cfg_.layers) {
      conv(m.final_norm, final_norm_);
      if (m.final_norm_b) conv(m.final_norm_b, final_norm_b_);
      if (!tied) conv(m.lm_head, lm_head_);
    }
    layers_.assign(size_t(cfg_.layers), {});
    for (size_t l = size_t(first); l < size_t(end); ++l) {
      const LayerTensors& t = m.layers[l];
      LayerW& w = layers_[l];
      conv(t.ln1, w.ln1);
      conv(t.ln2, w.ln2);
      if (t.ln1_b) conv(t.ln1_b, w.ln1_b);
      if (t.ln2_b) conv(t.ln2_b, w.ln2_b);
      if (m.cfg.has_maps(int64_t(l))) {
        for (auto [which, dst, bias] :
             {std::tuple{LayerWeight::Q, &w.wq, &w.bq}, std::tuple{LayerWeight::K, &w.wk, &w.bk},
              std::tuple{LayerWeight::V, &w.wv, &w.bv}, std::tuple{LayerWeight::O, &w.wo, &w.bo}}) {
          *dst = m.layer_weight_f32(int64_t(l), which);  // the family's layout (arch.h)
          *bias = m.layer_bias_f32(int64_t(l), which);
          const TensorInfo* ti = m.layer_tensor(int64_t(l), which);
          if (which == LayerWeight::Q || which == LayerWeight::O || !t.qkv) done += ti->nbytes;  // fused: once
          if (progress) progress(total ? double(done) / double(total) : 1.0, ti->name);
        }
      }
      for (auto [src, dst] : {std::pair{t.in_proj, &w.in_proj}, std::pair{t.conv_w, &w.conv_w},
                              std::pair{t.conv_b, &w.conv_b}, std::pair{t.x_proj, &w.x_proj}, std::pair{t.dt_w, &w.dt_w},
                              std::pair{t.dt_b, &w.dt_b}, std::pair{t.a_log, &w.a_neg}, std::pair{t.d_skip, &w.d_skip},
                              std::pair{t.out_proj, &w.out_proj}})
        if (src) conv(src, *dst);
      for (float& a : w.a_neg) a = -std::exp(a);  // A = -exp(A_log), computed in f32 as the published code does
      if (t.act_w) {
        w.act = tensor_to_f32(*t.act_w);
        w.act.push_back(tensor_to_f32(*t.act_b).at(0));
      }
      if (t.gate_up) {  // fused: gate rows, then up rows
        std::vector<float> gu;
        conv(t.gate_up, gu);
        const size_t half = gu.size() / 2;
        w.gate.assign(gu.begin(), gu.begin() + ptrdiff_t(half));
        w.up.assign(gu.begin() + ptrdiff_t(half), gu.end());
      } else {
        conv(t.gate, w.gate);
        conv(t.up, w.up);
      }
      conv(t.down, w.down);
    }
    if (cfg_.spec().rotary) inv_freq_ = rope_inv_freq(cfg_);
  }

  int64_t max_tokens() const override {
    // Bytes per token held by a forward: L+1 layer inputs, q/k/v/attn/mlp scratch and the KV cache. Attention is
    // tiled (no n x n buffer) and map queries work in chunks of rows, so memory grows linearly with n. Keep it
    // within 80% of the available memory.
    const double mem = available_memory() * 0.8;
    const double per_tok = 4.0 * (double(cfg_.layers + 1) * cfg_.hidden + 4.0 * cfg_.heads * cfg_.head_dim +
                                  3.0 * cfg_.intermediate + 4.0 * cfg_.hidden + 6.0 * cfg_.d_inner +
                                  2.0 * double(cfg_.map_layers().size() * cfg_.kv_heads * cfg_.head_dim));
    return int64_t(mem / per_tok);
  }

  void forward(const ForwardRequest& req, ForwardResult& out) override {
    const auto t0 = Clock::now();
    const int64_t n = int64_t(req.ids.size()), L = cfg_.layers;
    const int64_t s = req.append_from;  // first position to run
    int from = req.from_layer;
    if (s > 0) {
      if (from != 0 || s != int64_t(ids_.size()) || s >= n || int64_t(layer_in_.size()) != L + 1 ||
          !std::equal(ids_.begin(), ids_.end(), req.ids.begin()))
        throw Error("internal: a decoding step must extend the last forward's tokens");
      for (int64_t l = first_; l < end_layer(); ++l)  // (a layer split's block: its own layers)
        if (cfg_.is_diff() && req.lambda.at(size_t(l)) != layer_lambda_[size_t(l)])
          throw Error("internal: a decoding step must use the lambda its cached positions ran with");
    }
    const int first = first_, end = end_layer();
    if (from > first && (ids_ != req.ids || int64_t(layer_in_.size()) != L + 1)) from = first;  // nothing to reuse
    from = int(std::clamp<int64_t>(from, first, end));
    if (first > 0 && from == first && (!req.stream_in || req.stream_in_device >= 0))
      throw Error("internal: layers " + std::to_string(first) + ".. of a layer split run without their input on the host");
    for (int64_t i = s; i < n; ++i) {
      const int64_t id = req.ids[size_t(i)];
      if (id < 0 || id >= cfg_.vocab) throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
    }
    stats_.clear();
    head_times_.clear();
    qk_layer_ = -1;
    implicit_layer_ = -1;
    if (from == first) {
      if (s == 0) {
        layer_in_.assign(size_t(L + 1), {});
        layer_lambda_.assign(size_t(L), 0.f);
        kv_k_.assign(size_t(L), {});
        kv_v_.assign(size_t(L), {});
        conv_state_.assign(size_t(L), {});
        ssm_state_.assign(size_t(L), {});
        memory_.clear();
      }
      ids_ = req.ids;
      if (cfg_.spec().rotary) rope_tables(inv_freq_, n, cos_, sin_);
      if (first > 0) {  // the previous block's output rows of this call
        std::vector<float>& in = layer_in_[size_t(first)];
        in.resize(size_t(n * cfg_.hidden));
        const Clock::time_point t = Clock::now();
        std::copy(req.stream_in, req.stream_in + (n - s) * cfg_.hidden, in.begin() + s * cfg_.hidden);
        stats_["handoff"].add(ms_since(t));  // (the profiler's name for a block's incoming residual stream)
      }
    }
    // The readers' slots: layers that run start over (a prompt), a decoding step adds its rows to what they hold.
    if (req.hooks && !req.hooks->empty()) {
      if (max_abs_.size() != size_t(L) || (s == 0 && from == first)) max_abs_.assign(size_t(L), -1.f);
      for (int64_t l = from; l < end && s == 0; ++l) max_abs_[size_t(l)] = -1.f;
    } else {
      max_abs_.clear();
    }
    out.maps.assign(size_t(L), {});
    // ForwardRequest::cancel, polled before each layer, between its blocks and by the attention's work items.
    struct CancelScope {
      CpuBackend& b;
      ~CancelScope() { b.cancel_ = nullptr; }
    } scope{*this};
    cancel_ = s == 0 && req.cancel ? &req.cancel : nullptr;
    cancel_hit_ = false;
    for (int64_t l = from; l < end; ++l) layer_lambda_[size_t(l)] = cfg_.is_diff() ? req.lambda.at(size_t(l)) : 0.f;
    bool any_maps = false;
    for (int64_t l = 0; l < L && s == 0 && size_t(l) < req.want_maps.size(); ++l) any_maps |= req.want_maps[size_t(l)] != 0;
    // The last layer of a forward that keeps only the last position's logits needs the others' keys and values
    // (the cache) but not their attention or MLP: its output rows before n - 1 are then not computed (layer_in_[L]
    // holds the last row only; nothing reads the others).
    fwd::Plan plan;
    plan.from_layer = from;
    plan.to_layer = end;
    plan.last_rows_only = !req.all_logits && !req.keep_hidden && !any_maps && !req.all_rows && end == L;
    plan.lambda = layer_lambda_.data();
    plan.hooks = req.hooks.get();
    edits_ = req.edits;
    plan.edits = edits_.get();
    Ops ops(*this, s, n);
    fwd::run_layers(cfg_, ops, plan);
    for (int64_t l = 0; l < L && s == 0 && size_t(l) < req.want_maps.size(); ++l)
      if (req.want_maps[size_t(l)] && l >= first && l < end) full_maps(int(l), out.maps[size_t(l)]);
    const int64_t rows = end < L ? 0 : req.all_logits && s == 0 ? n : 1;  // an earlier block of a split: no logits
    out.logits.resize(size_t(rows * cfg_.vocab));
    ops.logits = out.logits.data();
    if (rows > 0) fwd::logits(cfg_, ops, rows == 1 ? fwd::Rows::Last : fwd::Rows::New);
    out.n = n;
    out.logit_rows = rows;
    if (req.keep_hidden) out.hidden = layer_in_;
    else out.hidden.clear();
    out.ms = ms_since(t0);
    if (!req.profile) return;  // (bulk re-runs: the profile stays the last profiled forward's)
    forward_ms_ = out.ms;
    tokens_ = n;  // the sequence (a decoding step ran its last position only)
  }

  std::vector<float> layer_max_abs() const override {
    std::vector<float> v = max_abs_;
    for (float& x : v)
      if (x < 0) x = std::numeric_limits<float>::quiet_NaN();  // no reader filled it
    return v;
  }

  // The final norm and the LM head over one row of the stream leaving `layer` (fwd::lens's ops, on that row alone:
  // the forward's Ops view whole row ranges of the stream).
  void lens_logits(int layer, int64_t position, float* out) override {
    require_run();
    const int64_t n = int64_t(ids_.size()), D = cfg_.hidden;
    // (layer L - 1: a layer split's lens, whose row was written into Stream(L) here for the LM head)
    if (layer < first_ - 1 || layer >= end_layer() || end_layer() != cfg_.layers || position < 0 || position >= n)
      throw Error("internal: lens of layer " + std::to_string(layer) + " at position " + std::to_string(position));
    const float* x = layer_in_.at(size_t(layer + 1)).data() + position * D;
    std::vector<float> y(static_cast<size_t>(D));
    if (cfg_.spec().norm == NormKind::LayerNorm) layernorm(x, final_norm_.data(), final_norm_b_.data(), y.data(), 1, D, cfg_.norm_eps);
    else rmsnorm(x, final_norm_.data(), y.data(), 1, D, cfg_.norm_eps);
    const std::vector<float>& w = lm_head_.empty() ? embed_ : lm_head_;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, int(cfg_.vocab), int(D), 1.f, y.data(), int(D), w.data(),
                int(D), 0.f, out, int(cfg_.vocab));
  }

  void outlier_counts(int layer, bool logits, const RadixPass& pass, std::vector<uint64_t>& counts) override {
    const size_t per = size_t(pass.histograms()) * size_t(pass.bins());
    if (!logits) {
      const std::vector<float>& h = outlier_stream(layer);
      counts.assign(per, 0);
      radix_count(h.data(), int64_t(h.size()), pass, counts.data());
      return;
    }
    const int nmaps = cfg_.is_diff() ? 2 : 1;
    std::vector<std::vector<uint64_t>> part(size_t(pool_.threads()), std::vector<uint64_t>(size_t(nmaps) * per, 0));
    logit_rows(layer, [&](int th, int m, const float* row, int64_t lo, int64_t hi) {
      radix_count(row + lo, hi - lo, pass, part[size_t(th)].data() + size_t(m) * per);
    });
    counts.assign(size_t(nmaps) * per, 0);
    for (const auto& p : part)
      for (size_t i = 0; i < counts.size(); ++i) counts[i] += p[i];
  }

  std::vector<std::vector<float>> outlier_values(int layer, bool logits, const std::vector<float>& at_least,
                                                 size_t cap) override {
    const int nmaps = logits ? (cfg_.is_diff() ? 2 : 1) : 1;
    std::vector<std::vector<std::vector<float>>> part(size_t(pool_.threads()), std::vector<std::vector<float>>(size_t(nmaps)));
    auto take = [&](int th, int m, const float* x, int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        if (std::fabs(x[i]) >= at_least.at(size_t(m))) part[size_t(th)][size_t(m)].push_back(std::fabs(x[i]));
    };
    if (!logits) {
      const std::vector<float>& h = outlier_stream(layer);
      take(0, 0, h.data(), 0, int64_t(h.size()));
    } else {
      logit_rows(layer, take);
    }
    std::vector<std::vector<float>> out(static_cast<size_t>(nmaps));
    for (const auto& p : part)
      for (int m = 0; m < nmaps; ++m) out[size_t(m)].insert(out[size_t(m)].end(), p[size_t(m)].begin(), p[size_t(m)].end());
    for (const auto& v : out)
      if (v.size() > cap) throw Error("internal: more outlier values than asked for");
    return out;
  }

  void layer_maps(int layer, LayerMaps& out) override {
    if (layer < 0 || layer >= cfg_.layers || layer_in_.empty()) throw Error("no maps: run the model first");
    check_layer(layer);
    if (out.device_out1) throw Error(kNoDeviceMemory);
    full_maps(layer, out);
  }

  bool truncate(int64_t n) override {
    if (n <= 0 || n > int64_t(ids_.size()) || int64_t(layer_in_.size()) != cfg_.layers + 1) return false;
    for (int64_t l = 0; l < cfg_.layers; ++l)
      if (!cfg_.has_maps(l)) return false;  // Mamba / GMU layers: the recurrent state cannot be cut
    ids_.resize(size_t(n));
    for (auto& x : layer_in_) x.resize(size_t(n * cfg_.hidden));
    const size_t kv = size_t(n * cfg_.kv_heads * cfg_.head_dim);
    for (auto* c : {&kv_k_, &kv_v_})
      for (auto& x : *c)
        if (!x.empty()) x.resize(kv);
    qk_layer_ = -1;
    implicit_layer_ = -1;
    return true;
  }

  void map_view(const ViewRequest& req, MapView& out) override {
    require_run();
    if (req.device_out) throw Error(kNoDeviceMemory);
    const int64_t n = int64_t(ids_.size());
    const bool layer_ok = req.layer >= 0 && req.layer < cfg_.layers;
    if (layer_ok) check_layer(req.layer);  // a layer without maps
    prepare_view(req, int(cfg_.layers), int(cfg_.view_heads()), n, cfg_.is_diff(),
                 layer_ok ? lambda_of(req.layer, req.head) : 0.f, out);
    // Parts of whole grid rows: every cell is written by one part only.
    const int64_t E_r = out.q1 - out.q0, R = out.rows, P = std::max<int64_t>(1, std::min<int64_t>(R, 4 * pool_.threads()));
    std::vector<int64_t> parts;
    for (int64_t i = 0; i <= P; ++i) parts.push_back(out.q0 + view_block_start(int(R * i / P), E_r, int(R)));
    head_rows(
        out.layer, out.head, out.q0, out.q1,
        [&](int, int64_t q, const float* a1, const float* a2, float, float) { view_add_row(out, q, a1, a2); }, parts);
    view_finish(out);
  }

  // Channel c of Mamba layer l for the last forward (mamba_view, mamba_row): the layer's scan inputs again from its
  // cached input and a zero conv state (kept for the next query of the same layer), then the channel's steps.
  MambaChannel implicit_channel(int l, int c) {
    const int64_t n = int64_t(ids_.size()), S = cfg_.d_state, XD = cfg_.dt_rank + 2 * S;
    if (implicit_layer_ != l) {
      implicit_layer_ = -1;
      mamba_inputs(l, implicit_in_);
      std::vector<float>().swap(implicit_in_.xz);  // only dt, B and C are read below
      std::vector<float>().swap(implicit_in_.u);
      implicit_layer_ = l;
    }
    const LayerW& w = layers_[size_t(l)];
    MambaChannel ch;
    ch.S = int(S);
    ch.delta.resize(size_t(n));
    ch.cum.resize(size_t(n));
    double run = 0;
    for (int64_t t = 0; t < n; ++t) {
      ch.delta[size_t(t)] = softplus(double(implicit_in_.dt[size_t(t * cfg_.d_inner + c)]) + w.dt_b[size_t(c)]);
      ch.cum[size_t(t)] = run += ch.delta[size_t(t)];
    }
    ch.A.assign(w.a_neg.begin() + c * S, w.a_neg.begin() + (c + 1) * S);
    ch.B = implicit_in_.xdbl.data() + cfg_.dt_rank;
    ch.C = ch.B + S;
    ch.ld = XD;
    return ch;
  }

  void mamba_view(const ViewRequest& req, MapView& out) override {
    require_run();
    if (req.device_out) throw Error(kNoDeviceMemory);
    const int64_t n = int64_t(ids_.size());
    prepare_mamba_view(req, cfg_, n, out);
    const MambaChannel ch = implicit_channel(out.layer, out.head);
    std::vector<float> row(size_t(n), 0.f);
    for (int64_t q = out.q0; q < out.q1; ++q) {
      mamba_implicit_row(ch, q, out.k0, out.k1, row.data());
      view_add_row(out, q, row.data(), nullptr);
    }
    view_finish(out);
    out.a1 = out.diff;
  }

  void mamba_row(int layer, int channel, int64_t q, std::vector<float>& row) override {
    require_run();
    check_mamba_row(layer, channel, q, cfg_, int64_t(ids_.size()));
    const MambaChannel ch = implicit_channel(layer, channel);
    row.assign(size_t(q + 1), 0.f);
    mamba_implicit_row(ch, q, 0, q + 1, row.data());
  }

  void map_rows(int layer, const std::vector<int64_t>& positions, MapRows& out) override {
    require_run();
    check_layer(layer);
    const int64_t n = int64_t(ids_.size()), Hv = cfg_.view_heads();
    if (out.on_device()) throw Error(kNoDeviceMemory);
    prepare_rows(layer, Hv, n, cfg_.is_diff(), positions, out);
    const size_t P = out.positions.size();
    float* const r1 = out.rows1();
    float* const r2 = out.rows2();
    for (int64_t h = 0; h < Hv; ++h)
      for (size_t i = 0; i < P; ++i) {
        const int64_t q = out.positions[i];
        head_rows(layer, int(h), q, q + 1, [&](int, int64_t, const float* a1, const float* a2, float, float) {
          std::copy_n(a1, n, r1 + (size_t(h) * P + i) * size_t(n));
          if (a2) std::copy_n(a2, n, r2 + (size_t(h) * P + i) * size_t(n));
        });
      }
  }

  std::vector<RowMass> row_mass(int layer, int64_t q, int64_t a0, int64_t a1) override {
    require_run();
    check_layer(layer);
    check_row_mass(q, int64_t(ids_.size()), a0, a1);
    std::vector<RowMass> out(size_t(cfg_.view_heads()));
    for (int64_t h = 0; h < cfg_.view_heads(); ++h)
      head_rows(layer, int(h), q, q + 1, [&](int, int64_t, const float* r1, const float* r2, float, float) {
        out[size_t(h)] = row_mass_of(r1, r2, q, lambda_of(layer, int(h)), a0, a1);
      });
    return out;
  }

  std::vector<HeadStats> head_stats(int layer, std::optional<float> lambda = std::nullopt) override {
    require_run();
    check_layer(layer);
    const int64_t n = int64_t(ids_.size());
    std::vector<HeadStats> out;
    for (int64_t h = 0; h < cfg_.view_heads(); ++h) {
      const float lam = cfg_.is_diff() && lambda ? *lambda : lambda_of(layer, int(h));
      std::vector<StatsAccumulator> acc(size_t(pool_.threads()));  // one a thread, then added up
      head_rows(
          layer, int(h), 0, n,
          [&](int th, int64_t q, const float* a1, const float* a2, float ml1, float ml2) {
            add_row_terms(acc[size_t(th)], q, a1, a2, lam, ml1, ml2);
          },
          even_parts(0, n));
      for (size_t t = 1; t < acc.size(); ++t) {
        const StatsAccumulator& a = acc[t];
        acc[0].add_sums(a.entropy1, a.entropy2, a.entropy_diff, a.first1, a.first2, a.first_diff, a.neg_mass, a.diff_min,
                        a.diff_max, a.max_logit1, a.max_logit2, a.rows);
      }
      out.push_back(acc[0].finish(cfg_.is_diff()));
    }
    return out;
  }

  std::vector<double> entropy_sweep(int layer, int head, const std::vector<float>& lambdas) override {
    require_run();
    check_layer(layer);
    if (head < 0 || head >= cfg_.view_heads())
      throw Error("head " + std::to_string(head) + " does not exist (layers have " + std::to_string(cfg_.view_heads()) +
                  " view heads)");
    const int64_t n = int64_t(ids_.size());
    std::vector<std::vector<double>> part(size_t(pool_.threads()), std::vector<double>(lambdas.size(), 0.0));
    head_rows(
        layer, head, 0, n,
        [&](int th, int64_t q, const float* a1, const float* a2, float, float) {
          for (size_t i = 0; i < lambdas.size(); ++i) {
            cpu_attn::RowTerms t;
            cpu_attn::row_terms(a1, a2, q + 1, lambdas[i], t);
            part[size_t(th)][i] += t.absd > 0 ? std::log(t.absd) - t.dlogd / t.absd : 0.0;
          }
        },
        even_parts(0, n));
    std::vector<double> sum(lambdas.size(), 0.0);
    for (const auto& p : part)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
    for (double& s : sum) s = double(float(s / double(n)));  // as HeadStats (a float mean of the rows)
    return sum;
  }

  Profile profile() const override {
    Profile p;
    p.heads = head_times_;
    for (const auto& [name, s] : stats_) p.kernels.push_back({name, s.count, s.total, s.mn, s.mx});
    p.forward_ms = forward_ms_;
    p.tokens = tokens_;
    if (peak_tflops_ <= 0) measure_peak();  // once, when a profile is first asked for (not every session needs it)
    p.peak_tflops = peak_tflops_;
    return p;
  }

 private:
  void measure_peak() const {
    // A 1024^3 SGEMM, best of 6: the CPU's matrix rate, the profiler's "peak" on this backend. Large enough that the
    // small per-head products of a forward stay below it (a 384^3 probe read ~10% low); six tries because the GUI
    // loads a model while its window is drawn on the same cores (best of three at 768^3 read half the rate there,
    // and the tiled attention then showed 116% of "peak").
    const int N = 1024;
    std::vector<float> a(size_t(N) * N, 0.5f), b(size_t(N) * N, 0.25f), c(size_t(N) * N);
    double best = 1e30;
    for (int r = 0; r < 6; ++r) {
      auto t = Clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.f, a.data(), N, b.data(), N, 0.f, c.data(), N);
      best = std::min(best, ms_since(t));
    }
    peak_tflops_ = 2.0 * N * N * N / (best * 1e-3) / 1e12;
  }

  void require_run() const {
    if (layer_in_.empty() || ids_.empty()) throw Error("no maps: run a prompt first");
  }
  void check_layer(int layer) const {
    if (layer < 0 || layer >= cfg_.layers)
      throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg_.layers) +
                  " layers)");
    if (!cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "attention maps"));
  }

  // The KV cache layer l reads (its own, or its kv_source's for cross-attention); checked to cover every position.
  const std::vector<float>& keys_of(int l) const { return kv_of(l, kv_k_); }
  const std::vector<float>& values_of(int l) const { return kv_of(l, kv_v_); }
  const std::vector<float>& kv_of(int l, const std::vector<std::vector<float>>& c) const {
    const std::vector<float>& x = c.at(size_t(cfg_.kv_layer(l)));
    if (x.size() != ids_.size() * size_t(cfg_.kv_heads * cfg_.head_dim))
      throw Error("internal: the keys and values of layer " + std::to_string(cfg_.kv_layer(l)) + " are not cached");
    return x;
  }

  // StatsAccumulator::add_row's terms of row q, with the vectorised logarithms (cpu_attn::row_terms).
  static void add_row_terms(StatsAccumulator& acc, int64_t q, const float* a1, const float* a2, float lam, float ml1,
                            float ml2) {
    cpu_attn::RowTerms t;
    cpu_attn::row_terms(a1, a2, q + 1, lam, t);
    const double f2 = a2 ? a2[0] : 0.0;
    acc.add_terms(t.e1, t.e2, t.absd > 0 ? std::log(t.absd) - t.dlogd / t.absd : 0.0, a1[0], f2,
                  a1[0] - double(lam) * f2, t.neg, t.dmin, t.dmax, ml1, ml2);
  }

  // The first key query q of layer l sees (sliding windows; 0 otherwise).
  int64_t first_key(int l, int64_t q) const {
    const int64_t w = cfg_.layer_window(l);
    return w > 0 ? std::max<int64_t>(0, q - w + 1) : 0;
  }
  float lambda_of(int layer) const { return cfg_.is_diff() ? layer_lambda_.at(size_t(layer)) : 0.f; }
  // The lambda head `head` of the layer ran with (an edit's per-head lambda, else the layer's).
  float lambda_of(int layer, int head) const {
    const float lam = lambda_of(layer);
    if (!edits_ || head < 0 || head >= cfg_.view_heads()) return lam;
    const std::vector<float> c = fwd::head_coefs(&edits_->at(size_t(layer)), lam, int(cfg_.view_heads()));
    return c.empty() ? lam : c[size_t(2 * head + 1)];
  }

  // Post-RoPE Q [n][H][d] of a layer for the last forward, recomputed from the layer's cached input; the last
  // layer asked for is kept until the next forward. Its keys are in the KV cache.
  void layer_q(int layer) {
    if (qk_layer_ == layer) return;
    Ops ops(*this, 0, int64_t(ids_.size()), true);
    fwd::queries(cfg_, ops, layer);
    qk_q_ = std::move(ops.q);
    qk_layer_ = layer;
  }

  // Calls f(thread, q, a1, a2, max|logit1|, max|logit2|) for query rows [q0, q1) of view head `head` (a2 nullptr for
  // plain heads; each row holds n values, 0 outside the keys the row sees). The rows are cut into parts (sorted
  // boundaries from q0 to q1; empty: one part) that run side by side on the pool, the last (longest) rows first: f
  // may touch only state of its thread or of its own part. Within a part the rows come in order, computed in chunks
  // (cpu_attn::score_rows from the first key the chunk sees to its last row, then the vector softmax): O(chunk x n)
  // memory per thread.
  template <class F>
  void head_rows(int layer, int head, int64_t q0, int64_t q1, F&& f, std::vector<int64_t> parts = {}) {
    layer_q(layer);
    const float* keys = keys_of(layer).data();
    const int64_t n = int64_t(ids_.size()), H = cfg_.heads, Hkv = cfg_.kv_heads, d = cfg_.head_dim;
    const bool diff = cfg_.is_diff();
    const kern::ViewHeadMap hm = kern::view_head_map(diff, head, int(H), int(Hkv));
    const float scale = float(1.0 / std::sqrt(double(d)));
    if (parts.empty()) parts = {q0, q1};
    static const std::vector<fwd::KeySpan> none;
    const std::vector<fwd::KeySpan>& knockout = edits_ ? edits_->at(size_t(layer)).knockout : none;
    const int bits = edits_ ? edits_->at(size_t(layer)).logit_bits : 0;
    const int64_t chunk = std::max<int64_t>(16, std::min<int64_t>(q1 - q0, (int64_t(1) << 20) / n));
    row_bufs_.resize(size_t(pool_.threads()));
    const int64_t P = int64_t(parts.size()) - 1;
    pool_.run(P, [&](int64_t item, int th) {
      RowBuffers& b = row_bufs_[size_t(th)];
      b.ws.resize(size_t(cpu_attn::scratch_floats(d, d)));
      const int64_t p = P - 1 - item;
      for (int64_t r0 = parts[size_t(p)]; r0 < parts[size_t(p) + 1]; r0 += chunk) {
        const int64_t rows = std::min(chunk, parts[size_t(p) + 1] - r0), klo = first_key(layer, r0), khi = r0 + rows;
        for (int m = 0; m < (diff ? 2 : 1); ++m) {
          b.s[m].resize(size_t(rows * n));
          b.ml[m].resize(size_t(rows));
          cpu_attn::score_rows(qk_q_.data() + (r0 * H + hm.q[m]) * d, H * d, keys + hm.k[m] * d, Hkv * d, d, scale,
                               rows, klo, khi, b.s[m].data(), n, b.ws.data());
          for (const fwd::KeySpan& k : knockout)  // the forward's knockouts hide these keys from these rows
            for (int64_t q = std::max(k.q0, r0); q < std::min(k.q1, r0 + rows); ++q)
              std::fill(b.s[m].data() + (q - r0) * n + std::min(k.k0, n), b.s[m].data() + (q - r0) * n + std::min(k.k1, n),
                        -std::numeric_limits<float>::infinity());
          for (int64_t i = 0; i < rows && bits > 0; ++i) {  // quantised logits, as the forward's (run_block)
            float* row = b.s[m].data() + i * n;
            const int64_t lo = first_key(layer, r0 + i), hi = r0 + i;
            float amax = 0.f;
            for (int64_t k = lo; k <= hi; ++k)
              if (row[k] != -std::numeric_limits<float>::infinity()) amax = std::max(amax, std::fabs(row[k]));
            for (int64_t k = lo; k <= hi; ++k)
              if (row[k] != -std::numeric_limits<float>::infinity()) row[k] = cpu_attn::quantize_logit(row[k], amax, bits);
          }
          for (int64_t i = 0; i < rows; ++i)
            b.ml[m][size_t(i)] = cpu_attn::softmax_row(b.s[m].data() + i * n, n, first_key(layer, r0 + i), r0 + i);
        }
        for (int64_t i = 0; i < rows; ++i)
          f(th, r0 + i, b.s[0].data() + i * n, diff ? b.s[1].data() + i * n : nullptr, b.ml[0][size_t(i)],
            diff ? b.ml[1][size_t(i)] : 0.f);
      }
    });
  }
  // The stream leaving `layer` for the outlier statistics: every row of the last forward.
  const std::vector<float>& outlier_stream(int layer) const {
    require_run();
    if (layer < 0 || layer >= cfg_.layers) throw Error("internal: outlier statistics of layer " + std::to_string(layer));
    const std::vector<float>& h = layer_in_.at(size_t(layer + 1));
    if (h.size() != ids_.size() * size_t(cfg_.hidden)) throw Error("internal: the layer's output rows are not all kept");
    return h;
  }
  // Every causal logit row of every view head of layer l (scaled q.k, no softmax), in chunks on the pool:
  // f(thread, map, scores, lo, hi) with the row's keys [lo, hi) at scores[lo, hi).
  template <class F>
  void logit_rows(int layer, F&& f) {
    require_run();
    check_layer(layer);
    layer_q(layer);
    const float* keys = keys_of(layer).data();
    const int64_t n = int64_t(ids_.size()), H = cfg_.heads, Hkv = cfg_.kv_heads, d = cfg_.head_dim, Hv = cfg_.view_heads();
    const bool diff = cfg_.is_diff();
    const float scale = float(1.0 / std::sqrt(double(d)));
    const int64_t chunk = std::max<int64_t>(16, (int64_t(1) << 20) / n);
    const int64_t blocks = (n + chunk - 1) / chunk;
    row_bufs_.resize(size_t(pool_.threads()));
    pool_.run(Hv * blocks, [&](int64_t item, int th) {
      const int64_t h = item % Hv, r0 = (item / Hv) * chunk, rows = std::min(chunk, n - r0);
      const kern::ViewHeadMap hm = kern::view_head_map(diff, int(h), int(H), int(Hkv));
      RowBuffers& b = row_bufs_[size_t(th)];
      b.ws.resize(size_t(cpu_attn::scratch_floats(d, d)));
      for (int m = 0; m < (diff ? 2 : 1); ++m) {
        b.s[m].resize(size_t(rows * n));
        cpu_attn::score_rows(qk_q_.data() + (r0 * H + hm.q[m]) * d, H * d, keys + hm.k[m] * d, Hkv * d, d, scale, rows,
                             first_key(layer, r0), r0 + rows, b.s[m].data(), n, b.ws.data());
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t q = r0 + i;
          f(th, m, b.s[m].data() + i * n, first_key(layer, q), q + 1);
        }
      }
    });
  }
  // Boundaries of about four parts a thread over rows [q0, q1) (head_rows).
  std::vector<int64_t> even_parts(int64_t q0, int64_t q1) const {
    const int64_t P = std::max<int64_t>(1, std::min<int64_t>(q1 - q0, 4 * pool_.threads()));
    std::vector<int64_t> b;
    for (int64_t i = 0; i <= P; ++i) b.push_back(q0 + (q1 - q0) * i / P);
    return b;
  }
  struct RowBuffers {
    std::vector<float> s[2], ml[2], ws;
  };

  // The forward's operations (forward.h) on this backend's host arrays, for positions [s, n) of the sequence. In
  // recompute mode (the map queries: fwd::queries, fwd::mamba_inputs) it writes neither the caches nor the Mamba
  // states nor the profile, and the conv starts from zeros.
  class Ops final : public fwd::Ops {
   public:
    Ops(CpuBackend& b, int64_t s, int64_t n, bool recompute = false)
        : b_(b), c_(b.cfg_), s_(s), n_(n), recompute_(recompute) {}
    float* logits = nullptr;  // [rows, vocab]: where fwd::logits leaves them
    // The activations this forward made (the map queries take them).
    std::vector<float> q, normed, attn, mlp, xz, u, xdbl, dt, mixed;

    void embed() override {
      const auto t = Clock::now();
      const int64_t D = c_.hidden;
      std::vector<float>& x = b_.layer_in_[0];
      x.resize(size_t(n_ * D));
      for (int64_t i = s_; i < n_; ++i) std::copy_n(b_.embed_.data() + b_.ids_[size_t(i)] * D, D, x.data() + i * D);
      stat("embedding", t);
    }

    void norm(int l, fwd::Norm which, fwd::Ref in, fwd::Ref out) override {
      const auto t = Clock::now();
      const View x = view(in), y = view(out);
      const bool fin = which == fwd::Norm::Final;
      const LayerW* w = fin ? nullptr : &b_.layers_[size_t(l)];
      const std::vector<float>& nw = fin ? b_.final_norm_ : which == fwd::Norm::Input ? w->ln1 : w->ln2;
      const std::vector<float>& nb = fin ? b_.final_norm_b_ : which == fwd::Norm::Input ? w->ln1_b : w->ln2_b;
      const bool ln = c_.spec().norm == NormKind::LayerNorm;
      if (ln) layernorm(x.p, nw.data(), nb.data(), y.p, x.rows, c_.hidden, c_.norm_eps);
      else rmsnorm(x.p, nw.data(), y.p, x.rows, c_.hidden, c_.norm_eps);
      stat(ln ? "layernorm" : "rmsnorm", t);
    }

    void linear(const fwd::Linear& op) override {
      const auto t = Clock::now();
      const int64_t D = c_.hidden, H = c_.heads, Hkv = c_.kv_heads, d = c_.head_dim, I = c_.intermediate;
      const View x = view(op.in);
      const int64_t m = x.rows;
      const LayerW* w = op.layer >= 0 ? &b_.layers_[size_t(op.layer)] : nullptr;
      switch (op.w) {
        case fwd::Weight::Qkv:
        case fwd::Weight::Q: {  // Q of the rows; K and V of the new rows straight into the layer's cache
          q.resize(size_t(m * H * d));
          gemm(x, w->wq.data(), H * d, D, {q.data(), m, H * d});
          add_bias(q.data(), w->bq, m);
          k_new_ = op.w == fwd::Weight::Qkv && !recompute_;
          if (k_new_) {
            std::vector<float>&k = b_.kv_k_[size_t(op.layer)], &v = b_.kv_v_[size_t(op.layer)];
            k.resize(size_t(n_ * Hkv * d));
            v.resize(size_t(n_ * Hkv * d));
            float* ks = k.data() + s_ * Hkv * d;
            float* vs = v.data() + s_ * Hkv * d;
            gemm(x, w->wk.data(), Hkv * d, D, {ks, m, Hkv * d});
            add_bias(ks, w->bk, m);
            gemm(x, w->wv.data(), Hkv * d, D, {vs, m, Hkv * d});
            add_bias(vs, w->bv, m);
          }
          break;
        }
        case fwd::Weight::GateUp: {  // the family's activation (arch.h MlpAct) of gate, times up
          const View y = view(op.out);
          std::vector<float> up(size_t(m * I));
          gemm(x, w->gate.data(), I, D, y);
          gemm(x, w->up.data(), I, D, {up.data(), m, I});
          if (c_.spec().mlp == MlpAct::PolyNorm) {
            polynorm(y.p, m, I, w->act.data(), c_.spec().act_eps);
            for (size_t i = 0; i < up.size(); ++i) y.p[i] *= up[i];
          } else {
            for (size_t i = 0; i < up.size(); ++i) y.p[i] = silu(y.p[i]) * up[i];
          }
          break;
        }
        default: {
          const std::vector<float>* wt = nullptr;
          const std::vector<float>* bias = nullptr;
          int64_t in_f = 0;
          switch (op.w) {
            case fwd::Weight::O: wt = &w->wo, bias = &w->bo, in_f = H * d; break;
            case fwd::Weight::Down: wt = &w->down, in_f = I; break;
            case fwd::Weight::InProj: wt = &w->in_proj, in_f = D; break;
            case fwd::Weight::XProj: wt = &w->x_proj, in_f = c_.d_inner; break;
            case fwd::Weight::DtProj: wt = &w->dt_w, in_f = c_.dt_rank; break;
            case fwd::Weight::OutProj: wt = &w->out_proj, in_f = c_.d_inner; break;
            default: wt = b_.lm_head_.empty() ? &b_.embed_ : &b_.lm_head_, in_f = D;
          }
          const int64_t out_f = int64_t(wt->size()) / in_f;
          const View y = view(op.out, out_f);
          float beta = 0.f;
          if (op.epi == fwd::Epilogue::Residual) {
            const View r = view(op.res);
            if (r.p != y.p)
              for (int64_t i = 0; i < m; ++i) std::copy_n(r.p + i * r.ld, out_f, y.p + i * y.ld);
            beta = 1.f;
          }
          gemm(x, wt->data(), out_f, in_f, y, beta);
          if (bias) add_bias(y.p, *bias, m);
          if (op.epi == fwd::Epilogue::SiluMemory) {
            if (b_.memory_.size() != size_t(n_ * out_f)) throw Error("internal: the memory layer has not run for this prompt");
            const float* mem = b_.memory_.data() + s_ * out_f;
            for (int64_t i = 0; i < m * out_f; ++i) y.p[i] = silu(y.p[i]) * mem[i];
          }
        }
      }
      if (!recompute_) b_.stats_[fwd::gemm_name(op.w)].add(ms_since(t));
    }

    void rope(int l) override {
      if (!c_.spec().rotary) return;
      const auto t = Clock::now();
      const int64_t m = n_ - s_, H = c_.heads, Hkv = c_.kv_heads, d = c_.head_dim;
      apply_rope(q.data(), s_, m, H, d, b_.cos_, b_.sin_);
      if (k_new_) apply_rope(b_.kv_k_[size_t(l)].data() + s_ * Hkv * d, s_, m, Hkv, d, b_.cos_, b_.sin_);
      stat("rope", t);
    }

    // Query rows [q0, n) (q0 = s, or n - 1 for the last row alone) against keys [0, n) (cpu_attn: tiled, the (head,
    // query block) items on the pool, the rows nearest the end first since they see the most keys).
    void attention(int l, float lam, fwd::Rows rows, const fwd::AttnEdit* edit) override {
      const int64_t q0 = rows == fwd::Rows::Last ? n_ - 1 : s_, m = n_ - q0;
      const int64_t H = c_.heads, Hkv = c_.kv_heads, d = c_.head_dim, Hv = c_.view_heads();
      const float* qp = q.data() + (q0 - s_) * H * d;
      const float* k = b_.keys_of(l).data();
      const float* v = b_.values_of(l).data();
      const bool diff = c_.is_diff();
      const int64_t vw = diff ? 2 * d : d;  // value width per view head
      attn.assign(size_t(m * Hv * vw), 0.f);  // [m, Hv, vw]
      const int64_t blocks = (m + cpu_attn::kBlockQ - 1) / cpu_attn::kBlockQ;
      const int T = b_.pool_.threads();
      b_.scratch_.resize(size_t(T));
      for (auto& sc : b_.scratch_) sc.resize(size_t(cpu_attn::scratch_floats(d, vw)));
      std::vector<double> head_ms(size_t(T * Hv), 0.0);  // thread time of each head's items, per thread
      const std::vector<float> coef = fwd::head_coefs(edit, lam, int(Hv));
      std::vector<cpu_attn::Block::Knock> ko;
      if (edit)
        for (const fwd::KeySpan& k : edit->knockout) ko.push_back({k.q0, k.q1, k.k0, k.k1});
      const auto ta = Clock::now();
      b_.pool_.run(blocks * Hv, [&](int64_t item, int thread) {
        if (b_.poll_cancel()) return;  // the layer will be thrown away: skip the rest of its items
        const auto t0 = Clock::now();
        const int64_t j = item % Hv, bi = blocks - 1 - item / Hv;
        const kern::ViewHeadMap hm = kern::view_head_map(diff, int(j), int(H), int(Hkv));
        cpu_attn::Block bl;
        bl.p0 = q0 + bi * cpu_attn::kBlockQ;
        bl.p1 = std::min(n_, bl.p0 + cpu_attn::kBlockQ);
        bl.s = q0;
        bl.window = c_.layer_window(l);
        bl.d = d;
        bl.vw = vw;
        bl.scale = float(1.0 / std::sqrt(double(d)));
        bl.maps = diff ? 2 : 1;
        bl.c1 = coef.empty() ? 1.f : coef[size_t(2 * j)];
        bl.c2 = coef.empty() ? lam : coef[size_t(2 * j + 1)];
        bl.ko = ko.data();
        bl.nko = int(ko.size());
        bl.bits = edit ? edit->logit_bits : 0;
        for (int i = 0; i < bl.maps; ++i) {
          bl.q[i] = qp + hm.q[i] * d;
          bl.k[i] = k + hm.k[i] * d;
        }
        bl.ldq = H * d;
        bl.ldk = Hkv * d;
        bl.v[0] = v + hm.v[0] * d;
        bl.v[1] = diff ? v + hm.v[1] * d : nullptr;
        bl.ldv = Hkv * d;
        bl.out = attn.data() + j * vw;
        bl.ldo = Hv * vw;
        cpu_attn::run_block(bl, b_.scratch_[size_t(thread)].data());
        head_ms[size_t(thread * Hv + j)] += ms_since(t0);
      });
      if (b_.cancel_hit_) return;  // stopped: the forward throws ForwardCancelled for this layer
      if (diff) {  // inner RMS norm over 2d (a learned scale is folded into wo), then the fixed (1 - lambda_init)
        const float f = float(1.0 - c_.lambda_init(l));
        for (int64_t r = 0; r < m * Hv; ++r) {
          float* dst = attn.data() + r * vw;
          double ss = 0;
          for (int64_t i = 0; i < vw; ++i) ss += double(dst[i]) * dst[i];
          const float rn = float(1.0 / std::sqrt(ss / double(vw) + c_.subln_eps));
          for (int64_t i = 0; i < vw; ++i) dst[i] = f * (dst[i] * rn);
        }
      }
      const double wall = ms_since(ta);
      b_.stats_["attention"].add(wall);
      const int64_t win = c_.layer_window(l);  // the rows [q0, n): the triangle to n less the one to q0
      const double flops = kern::attn_flops(diff, 1, d, n_, 1, win) - kern::attn_flops(diff, 1, d, q0, 1, win);
      // Heads run side by side: each head's share of the layer's wall time is its share of the thread time, so the
      // heads add up to the layer's attention time and their TFLOP/s are those of the whole machine.
      std::vector<double> per_head(size_t(Hv), 0.0);
      double busy = 0;
      for (int th = 0; th < T; ++th)
        for (int64_t j = 0; j < Hv; ++j) per_head[size_t(j)] += head_ms[size_t(th * Hv + j)];
      for (double x : per_head) busy += x;
      for (int64_t j = 0; j < Hv; ++j)
        b_.head_times_.push_back({l, int(j), busy > 0 ? wall * per_head[size_t(j)] / busy : wall / double(Hv), flops});
    }

    // The causal depthwise conv over x (Xz's first di columns) + SiLU, continuing from the layer's state (the K - 1
    // conv inputs before these positions; zeros at the start), which it leaves K - 1 positions on.
    void conv(int l) override {
      const auto t = Clock::now();
      const LayerW& w = b_.layers_[size_t(l)];
      const int64_t m = n_ - s_, di = c_.d_inner, K = c_.d_conv;
      std::vector<float> zero;
      std::vector<float>* st = &zero;
      if (recompute_ || s_ == 0) {
        zero.assign(size_t((K - 1) * di), 0.f);
      } else {
        st = &b_.conv_state_[size_t(l)];
        if (st->size() != size_t((K - 1) * di) || b_.ssm_state_[size_t(l)].size() != size_t(di * c_.d_state))
          throw Error("internal: Mamba layer " + std::to_string(l) + " has no state to continue from");
      }
      const std::vector<float>& cs = *st;
      // the conv input at chunk row r (r < 0: the state's rows)
      auto conv_in = [&](int64_t r, int64_t ch) {
        return r >= 0 ? xz[size_t(r * 2 * di + ch)] : cs[size_t((K - 1 + r) * di + ch)];
      };
      u.assign(size_t(m * di), 0.f);
      for (int64_t tok = 0; tok < m; ++tok)
        for (int64_t ch = 0; ch < di; ++ch) {
          double acc = w.conv_b[size_t(ch)];
          for (int64_t j = 0; j < K; ++j) acc += double(w.conv_w[size_t(ch * K + j)]) * conv_in(tok - (K - 1) + j, ch);
          u[size_t(tok * di + ch)] = silu(float(acc));
        }
      if (!recompute_) {
        std::vector<float> next(size_t((K - 1) * di), 0.f);
        for (int64_t r = 0; r < K - 1; ++r)
          for (int64_t ch = 0; ch < di; ++ch) next[size_t(r * di + ch)] = conv_in(m - (K - 1) + r, ch);
        b_.conv_state_[size_t(l)] = std::move(next);
      }
      stat("mamba_conv", t);
    }

    // The selective scan (docs/models/phi4flash.md section 4) over the new positions from the layer's state, one
    // channel at a time, the state in double; then the gate silu(z).
    void scan(int l, bool memory) override {
      const auto t = Clock::now();
      const LayerW& w = b_.layers_[size_t(l)];
      const int64_t m = n_ - s_, di = c_.d_inner, R = c_.dt_rank, S = c_.d_state, XD = R + 2 * S;
      std::vector<double>& ssm = b_.ssm_state_[size_t(l)];
      if (s_ == 0) ssm.assign(size_t(di * S), 0.0);
      mixed.assign(size_t(m * di), 0.f);
      for (int64_t ch = 0; ch < di; ++ch) {
        double* st = ssm.data() + ch * S;
        const float* a = w.a_neg.data() + ch * S;
        for (int64_t tok = 0; tok < m; ++tok) {
          const double delta = softplus(double(dt[size_t(tok * di + ch)]) + w.dt_b[size_t(ch)]);
          const double uu = u[size_t(tok * di + ch)];
          const float* B = xdbl.data() + tok * XD + R;
          const float* C = B + S;
          double acc = 0;
          for (int64_t j = 0; j < S; ++j) {
            st[j] = std::exp(delta * a[j]) * st[j] + delta * B[j] * uu;
            acc += st[j] * C[j];
          }
          mixed[size_t(tok * di + ch)] = float(acc + double(w.d_skip[size_t(ch)]) * uu);
        }
      }
      if (memory) {
        b_.memory_.resize(size_t(n_ * di));
        std::copy(mixed.begin(), mixed.end(), b_.memory_.begin() + s_ * di);
      }
      for (int64_t tok = 0; tok < m; ++tok)
        for (int64_t ch = 0; ch < di; ++ch) mixed[size_t(tok * di + ch)] *= silu(xz[size_t(tok * 2 * di + di + ch)]);
      stat("mamba_scan", t);
    }

    void max_abs(fwd::Ref in, int slot) override {
      const View x = view(in);
      float mx = 0.f;
      for (int64_t r = 0; r < x.rows; ++r)
        for (int64_t i = 0; i < x.cols; ++i) {
          const float a = std::fabs(x.p[r * x.ld + i]);
          mx = std::isnan(a) || std::isnan(mx) ? std::numeric_limits<float>::quiet_NaN() : std::max(mx, a);
        }
      float& v = b_.max_abs_.at(size_t(slot));  // -1: no value yet; a NaN from the stream stays
      v = std::isnan(v) || std::isnan(mx) ? std::numeric_limits<float>::quiet_NaN() : std::max(v, mx);
    }

    void scale_columns(fwd::Ref t, int64_t c0, int64_t c1, float f) override {
      const View x = view(t);
      for (int64_t r = 0; r < x.rows; ++r)
        for (int64_t i = c0; i < c1; ++i) x.p[r * x.ld + i] *= f;
    }

    void mean_columns(fwd::Ref t, int64_t c0, int64_t c1, int slot) override {
      const View x = view(t);
      if (b_.mean_slots_.size() <= size_t(slot)) b_.mean_slots_.resize(size_t(slot) + 1);
      std::vector<float>& m = b_.mean_slots_[size_t(slot)];
      if (s_ == 0) {  // a prompt: every position's row is here
        std::vector<double> sum(size_t(c1 - c0), 0.0);
        for (int64_t r = 0; r < x.rows; ++r)
          for (int64_t i = c0; i < c1; ++i) sum[size_t(i - c0)] += x.p[r * x.ld + i];
        m.resize(sum.size());
        for (size_t i = 0; i < sum.size(); ++i) m[i] = float(sum[i] / double(std::max<int64_t>(1, x.rows)));
      } else if (m.size() != size_t(c1 - c0)) {
        throw Error("internal: a decoding step's mean ablation before its prompt's");
      }
      for (int64_t r = 0; r < x.rows; ++r) std::copy(m.begin(), m.end(), x.p + r * x.ld + c0);
    }

    bool cancelled() override { return !recompute_ && b_.poll_cancel(); }

   private:
    struct View {
      float* p;
      int64_t rows, ld, cols = 0;
    };
    // y[rows, out_f] (+)= x[rows, in_f] W[out_f, in_f]^T (a torch Linear), with the views' row strides.
    static void gemm(const View& x, const float* w, int64_t out_f, int64_t in_f, const View& y, float beta = 0.f) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(x.rows), int(out_f), int(in_f), 1.f, x.p, int(x.ld), w,
                  int(in_f), beta, y.p, int(y.ld));
    }
    void stat(const char* name, Clock::time_point t) {
      if (!recompute_) b_.stats_[name].add(ms_since(t));
    }
    int64_t rows_of(fwd::Ref r) const { return r.rows == fwd::Rows::Last ? 1 : n_ - s_; }
    // An activation's rows (sized here for the rows of r; `cols`: the width where the op decides it).
    View view(fwd::Ref r, int64_t cols = 0) {
      const int64_t m = rows_of(r), D = c_.hidden, di = c_.d_inner;
      auto own = [&](std::vector<float>& v, int64_t w) {
        if (v.size() < size_t(m * w)) v.resize(size_t(m * w));
        return View{v.data(), m, w, w};
      };
      switch (r.t) {
        case fwd::Act::Stream: {
          std::vector<float>& v = b_.layer_in_[size_t(r.layer)];
          if (v.size() != size_t(n_ * D)) v.resize(size_t(n_ * D));
          return View{v.data() + (n_ - m) * D, m, D, D};
        }
        case fwd::Act::Normed: return own(normed, D);
        case fwd::Act::Attn: return View{attn.data(), m, c_.heads * c_.head_dim, c_.heads * c_.head_dim};
        case fwd::Act::Mlp: return own(mlp, c_.intermediate);
        case fwd::Act::Xz: return own(xz, 2 * di);
        case fwd::Act::U: return View{u.data(), m, di, di};
        case fwd::Act::Xdbl: return own(xdbl, c_.dt_rank + 2 * c_.d_state);
        case fwd::Act::Dt: return own(dt, di);
        case fwd::Act::Mixed: return cols ? own(mixed, cols) : View{mixed.data(), m, di, di};
        case fwd::Act::Logits: return View{logits, m, c_.vocab, c_.vocab};
        default: throw Error("internal: the CPU backend has no view of this activation");
      }
    }
    // (DtProj reads Xdbl's first R columns: its in_f, with Xdbl's row stride.)

    CpuBackend& b_;
    const ModelConfig& c_;
    int64_t s_, n_;
    bool recompute_;
    bool k_new_ = false;  // the last Qkv projection wrote new K rows (which rope() rotates)
  };

  // Every row of every view head of layer l (the last forward's), as [Hv, n, n]: O(n^2), for small prompts only.
  void full_maps(int l, LayerMaps& out) {
    const int64_t n = int64_t(ids_.size()), Hv = cfg_.view_heads();
    const bool diff = cfg_.is_diff();
    out.heads = Hv;
    out.n = n;
    out.a1.assign(size_t(Hv * n * n), 0.f);
    out.a2.assign(diff ? size_t(Hv * n * n) : 0, 0.f);
    for (int64_t j = 0; j < Hv; ++j)
      head_rows(
          l, int(j), 0, n,
          [&](int, int64_t q, const float* a1, const float* a2, float, float) {
            std::copy_n(a1, n, out.a1.begin() + (j * n + q) * n);
            if (a2) std::copy_n(a2, n, out.a2.begin() + (j * n + q) * n);
          },
          even_parts(0, n));
  }

  // The scan's inputs of Mamba layer l for the last forward (fwd::mamba_inputs over its cached input, from a zero
  // conv state): the map queries of a Mamba channel.
  struct MambaInputs {
    std::vector<float> xz, u, xdbl, dt;  // [n, 2 di] [n, di] [n, R + 2S] [n, di]
  };
  void mamba_inputs(int l, MambaInputs& in) {
    Ops ops(*this, 0, int64_t(ids_.size()), true);
    fwd::mamba_inputs(cfg_, ops, l);
    in.xz = std::move(ops.xz), in.u = std::move(ops.u), in.xdbl = std::move(ops.xdbl), in.dt = std::move(ops.dt);
  }

  // The running forward's cancel predicate (nullptr: none) and whether it has fired; poll_cancel() may be called from
  // the pool's threads.
  bool poll_cancel() {
    if (cancel_hit_.load(std::memory_order_relaxed)) return true;
    if (cancel_ && (*cancel_)()) cancel_hit_ = true;
    return cancel_hit_.load(std::memory_order_relaxed);
  }
  const std::function<bool()>* cancel_ = nullptr;
  std::atomic<bool> cancel_hit_{false};

  int threads_;
  int first_ = 0, last_ = -1;  // set_layer_range (-1: to the last layer)
  cpu_attn::Pool pool_;
  std::vector<std::vector<float>> scratch_;  // [threads]: each pool thread's attention work space
  std::vector<RowBuffers> row_bufs_;         // [threads]: each pool thread's rows in head_rows
  ModelConfig cfg_;
  std::vector<float> embed_, final_norm_, final_norm_b_, lm_head_;
  std::vector<float> memory_;  // SambaY: the memory layer's ungated scan output [n, di]
  std::vector<std::vector<float>> kv_k_, kv_v_;  // [L]: the KV cache, [n, Hkv, d] per attention layer with its own
  std::vector<std::vector<float>> conv_state_;   // [L]: Mamba layers' last K - 1 conv inputs [K - 1, di]
  std::vector<std::vector<double>> ssm_state_;   // [L]: Mamba layers' scan state [di, S] after the last position
  std::vector<LayerW> layers_;
  std::vector<float> inv_freq_, cos_, sin_;
  std::vector<int32_t> ids_;
  std::vector<std::vector<float>> layer_in_;
  std::vector<float> layer_lambda_;
  std::shared_ptr<const std::vector<fwd::AttnEdit>> edits_;  // the last forward's attention edits (null: none)
  std::vector<std::vector<float>> mean_slots_;  // the mean ablations' means (Ops::mean_columns), per slot
  std::vector<float> max_abs_;  // [L] the max_abs readers' slots (-1: no value), empty when the last forward had no hooks
  int qk_layer_ = -1;  // layer whose Q qk_q_ holds (-1: none; reset by every forward)
  int implicit_layer_ = -1;  // Mamba layer whose scan inputs implicit_in_ holds (-1: none; reset by every forward)
  MambaInputs implicit_in_;
  std::vector<float> qk_q_;
  std::map<std::string, KernelStat> stats_;
  std::vector<HeadTiming> head_times_;
  double forward_ms_ = 0;
  mutable double peak_tflops_ = 0;  // measured by the first profile()
  int64_t tokens_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace ds
