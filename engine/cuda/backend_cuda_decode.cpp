// Decoding on the CUDA backend: one new position of a batch-1 sequence per step, through every layer, over the
// caches the prompt's forward left (backend_cuda_impl.h: hidden, qkv_cache, memory; the Mamba layers' state).
//
// The step works on one-row buffers of its own (Decoder: the residual stream of every layer, the normed row, Q/K/V,
// the attention output, the MLP rows) whose addresses never change, and writes each row the caches keep (every
// layer's input, the post-RoPE Q/K/V, the memory) at the position it reads from device memory (Decoder::ctl). The
// attention kernel (kernels/attn_decode.h) reads the length from there too. So the whole step, GEMMs included, is
// one CUDA graph: the first step after the buffers or lambda change runs eagerly (which also makes the GEMM plans
// for one row), the next is captured, and later steps replay it with a 12-byte copy of {token, position, length}.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/error.h"
#include "kernels/argmax.h"
#include "kernels/attn_decode.h"
#include "kernels/rope.h"

namespace ds::cuda {

bool CudaBackend::truncate(int64_t n) {
  if (!has_run_ || last_batch_ != 1 || n <= 0 || n > last_n_) return false;
  for (int64_t l = 0; l < cfg_.layers; ++l)
    if (mamba_slot_[size_t(l)] >= 0) return false;  // a recurrent state cannot be cut back
  last_n_ = n;
  last_ids_.resize(size_t(n));
  last_row_stale_ = true;
  return true;
}

void CudaBackend::grow_activations(int64_t need) {
  const int64_t limit = max_tokens();
  if (need > limit)
    throw Error("generation needs room for " + std::to_string(need) + " positions but " + device_name_ +
                " has memory for " + std::to_string(limit) + " with this model");
  // Both sets live while the cached rows move across: grow by a quarter at least, so that this is rare.
  const int64_t cap = std::min(limit, std::max(need, act_.cap + std::max<int64_t>(512, act_.cap / 4)));
  Activations a;
  make_activations(a, cap, cap, act_.host);
  const size_t E = size_t(cfg_.hidden), W = size_t(qkv_width()), n = size_t(last_n_);
  const size_t old_cap = size_t(act_.cap), new_cap = size_t(cap);
  if (act_.host) {  // host caches: the host rows move (the device slots are paged in again when read)
    hc_wait_copies();
    for (size_t l = 0; l <= size_t(end_layer() - first_); ++l)
      std::memcpy(a.host_hidden.as<float>() + l * new_cap * E, act_.host_hidden.as<float>() + l * old_cap * E, n * E * 4);
    for (size_t s = 0; s < size_t(qkv_slots_); ++s)
      std::memcpy(a.host_qkv.as<bf16>() + s * new_cap * W, act_.host_qkv.as<bf16>() + s * old_cap * W, n * W * 2);
    hc_.stream_res[0] = hc_.stream_res[1] = hc_.qkv_res[0] = hc_.qkv_res[1] = -1;
  }
  for (size_t l = 0; !act_.host && l <= size_t(end_layer() - first_); ++l)  // the block's streams
    DS_CUDA_CHECK(cudaMemcpyAsync(a.hidden.as<float>() + l * new_cap * E, act_.hidden.as<float>() + l * old_cap * E,
                                  n * E * 4, cudaMemcpyDeviceToDevice, stream()));
  for (size_t s = 0; !act_.host && s < size_t(qkv_slots_); ++s)
    DS_CUDA_CHECK(cudaMemcpyAsync(a.qkv_cache.as<bf16>() + s * new_cap * W, act_.qkv_cache.as<bf16>() + s * old_cap * W,
                                  n * W * 2, cudaMemcpyDeviceToDevice, stream()));
  if (cfg_.d_inner > 0)
    DS_CUDA_CHECK(cudaMemcpyAsync(a.memory.get(), act_.memory.get(), n * size_t(cfg_.d_inner) * 2,
                                  cudaMemcpyDeviceToDevice, stream()));
  DS_CUDA_CHECK(cudaMemcpyAsync(a.ids.get(), act_.ids.get(), n * 4, cudaMemcpyDeviceToDevice, stream()));
  sync();
  act_ = std::move(a);
  ++act_gen_;
  rope_n_ = 0;
}

int32_t CudaBackend::device_argmax() {
  const DeviceGuard on(device_);
  if (!dec_) throw Error("internal: no decoding step ran");
  if (!dec_->pick.get()) {
    dec_->pick = DeviceBuffer(8, "greedy pick");
    dec_->pick_host = PinnedBuffer(8);
  }
  DS_CUDA_CHECK(kern::launch_argmax_f32(logits_.as<float>(), cfg_.vocab, dec_->pick.as<int32_t>(), stream()));
  DS_CUDA_CHECK(cudaMemcpyAsync(dec_->pick_host.as<char>(), dec_->pick.get(), 8, cudaMemcpyDeviceToHost, stream()));
  sync();
  int32_t r[2];
  std::memcpy(r, dec_->pick_host.as<char>(), 8);
  float v;
  std::memcpy(&v, &r[1], 4);
  if (r[0] < 0 || !std::isfinite(v)) throw Error("the model's next-token logits are not finite: nothing to choose from");
  return r[0];
}

void CudaBackend::fetch_logits(ForwardResult& out) {
  const DeviceGuard on(device_);
  if (!has_run_ || !out.logits.empty() || out.logit_rows != 1) return;
  out.logits.resize(size_t(cfg_.vocab));
  copy_to_host({{out.logits.data(), logits_.get(), size_t(cfg_.vocab) * 4}});
}

namespace {
constexpr int kLogprobSlots = 256;
}

bool CudaBackend::queue_logprob(int32_t id, int slot) {
  const DeviceGuard on(device_);
  if (!has_run_ || end_layer() != int(cfg_.layers) || last_batch_ != 1)
    throw Error("internal: queue_logprob needs the last-position logits of a batch-1 forward");
  if (slot < 0 || slot >= kLogprobSlots) throw Error("internal: queue_logprob slot " + std::to_string(slot));
  if (!logprob_slots_.get()) logprob_slots_ = DeviceBuffer(size_t(kLogprobSlots) * 8, "queued log-probabilities");
  DS_CUDA_CHECK(kern::launch_token_logprob_f32(logits_.as<float>(), cfg_.vocab, id, logprob_slots_.as<double>() + slot,
                                               stream()));
  return true;
}

std::vector<double> CudaBackend::take_logprobs(int count) {
  const DeviceGuard on(device_);
  if (count < 0 || count > kLogprobSlots || (count > 0 && !logprob_slots_.get()))
    throw Error("internal: take_logprobs of " + std::to_string(count) + " slots");
  std::vector<double> out(static_cast<size_t>(count), 0.0);
  if (count > 0) copy_to_host({{out.data(), logprob_slots_.get(), size_t(count) * 8}});
  else sync();
  return out;
}

void CudaBackend::decode_step(int32_t id, const std::vector<float>& lambda) {
  kept_.valid = false;  // (the sequence grows: a kept attention output no longer covers it)
  const DeviceGuard on(device_);
  if (!loaded_ || !has_run_ || last_batch_ != 1 || last_n_ <= 0)
    throw Error("internal: decoding continues a batch-1 run of the same backend");
  const int L = int(cfg_.layers);
  // (a layer split's block: its own layers; the others' lambda is another block's)
  if (cfg_.is_diff() && (lambda.size() != last_lambda_.size() ||
                         !std::equal(lambda.begin() + first_, lambda.begin() + end_layer(), last_lambda_.begin() + first_)))
    throw Error("internal: a decoding step must use the lambda its cached positions ran with");
  if (id < 0 || id >= cfg_.vocab) throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
  const int64_t pos = last_n_, n = pos + 1;
  if (n > act_.cap || n > act_.cap_n) grow_activations(n);
  if (cfg_.spec().rotary && n > rope_n_) {
    DS_CUDA_CHECK(kern::launch_rope_table(inv_freq_.as<float>(), int(act_.cap_n), int(cfg_.head_dim / 2),
                                          act_.cos_sin.as<float2>(), stream()));
    rope_n_ = act_.cap_n;
  }
  ensure_logits(1);
  if (!dec_) {
    dec_ = std::make_unique<Decoder>();
    Decoder& d = *dec_;
    const size_t E = size_t(cfg_.hidden), W = size_t(qkv_width()), I = size_t(cfg_.intermediate);
    const size_t Hd = size_t(cfg_.heads * cfg_.head_dim), di = size_t(cfg_.d_inner);
    const size_t XD = size_t(cfg_.dt_rank + 2 * cfg_.d_state);
    const char* what = "the decoding step's buffers";
    d.ctl = DeviceBuffer(16, what);
    d.h = DeviceBuffer(size_t(L + 1) * E * 4, what);
    d.x = DeviceBuffer(E * 2, what);
    d.qkv = DeviceBuffer(W * 2, what);
    d.attn = DeviceBuffer(Hd * 2, what);
    d.gu = DeviceBuffer(2 * I * 2, what);
    d.act = DeviceBuffer(std::max(I, di) * 2, what);
    d.spare = DeviceBuffer(E * 4, what);
    if (di) {
      d.xz = DeviceBuffer(2 * di * 2, what);
      d.u = DeviceBuffer(di * 2, what);
      d.xdbl = DeviceBuffer(XD * 2, what);
      d.dt = DeviceBuffer(di * 2, what);
      d.mem = DeviceBuffer(di * 2, what);
      d.yg = DeviceBuffer(di * 2, what);
    }
  }
  Decoder& d = *dec_;
  int attn_layer = -1;  // the block's first layer with attention (every one has the same heads)
  for (int l = first_; l < end_layer() && attn_layer < 0; ++l)
    if (cfg_.has_maps(l)) attn_layer = l;
  if (attn_layer >= 0 && d.attn_ws_len < size_t(act_.cap)) {
    kern::AttnParams p = layer_attn(attn_layer, act_.cap, 1, 0.f);
    p.out = d.attn.as<bf16>();  // as decode_launches sets it (the plan checks every pointer)
    p.out_row_stride = p.out_batch_stride = cfg_.heads * cfg_.head_dim;
    const size_t ws = kern::attn_decode_workspace(p, 1, int(act_.cap));
    if (ws == 0) throw Error("CUDA backend: the decoding attention kernel does not take this model's heads");
    d.attn_ws = DeviceBuffer(ws, "the decoding step's attention workspace");
    d.attn_ws_len = size_t(act_.cap);
    d.warm = false;
  }
  // A step with readers adds its row to their slots (a prompt without them leaves none: they start here).
  if (hooks_ && !hooks_->empty() && (!max_abs_.get() || max_abs_read_.size() != size_t(L))) {
    if (!max_abs_.get()) max_abs_ = DeviceBuffer(size_t(L) * 4, "hook readers' slots");
    DS_CUDA_CHECK(cudaMemsetAsync(max_abs_.get(), 0, size_t(L) * 4, stream()));
    max_abs_read_.assign(size_t(L), 0);
  }
  const bool graph_ok = d.graph && d.graph_gen == act_gen_ && d.graph_lambda == last_lambda_ &&
                        d.graph_hooks == hooks_.get() && d.graph_edits == edits_.get();
  if (!graph_ok && d.graph) {
    DS_CUDA_CHECK(cudaGraphExecDestroy(d.graph));
    d.graph = nullptr;
  }
  if (d.graph_gen != act_gen_ || d.graph_lambda != last_lambda_ || d.graph_hooks != hooks_.get() ||
      d.graph_edits != edits_.get())
    d.warm = false;
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so steps may be queued back to back
  // without waiting for each other (a pinned buffer would be rewritten before the previous copy ran).
  const int32_t ctl[4] = {id, int32_t(pos), int32_t(n), 0};
  DS_CUDA_CHECK(cudaMemcpyAsync(d.ctl.get(), ctl, sizeof ctl, cudaMemcpyHostToDevice, stream()));
  if (first_ > 0) {  // a later block of a layer split: the previous block's row of the step, outside the graph
    if (!stream_in_) throw Error("internal: a later block of a layer split decodes without its input row");
    copy_stream_in(d.h.as<float>() + size_t(first_) * size_t(cfg_.hidden), size_t(cfg_.hidden) * 4);
  }
  has_run_ = false;  // until the step completes
  if (act_.host) {  // host caches: every step eager (each layer's K and V are paged in), after the write-backs
    hc_wait_copies();
    decode_launches();
  } else if (decode_profile_) {  // eager, every launch between two events (build_profile reads them)
    marks_.clear();
    events_used_ = 0;
    decode_launches();
  } else if (d.graph) {
    DS_CUDA_CHECK(cudaGraphLaunch(d.graph, stream()));
    ++graph_replays_;
  } else if (!decode_graphs_ || !d.warm) {
    decode_launches();
    d.warm = true;
    d.graph_gen = act_gen_;
    d.graph_lambda = last_lambda_;
    d.graph_hooks = hooks_.get();
    d.graph_edits = edits_.get();
  } else {
    cudaGraph_t g = nullptr;
    DS_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    try {
      decode_launches();
    } catch (...) {
      cudaStreamEndCapture(stream(), &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    DS_CUDA_CHECK(cudaStreamEndCapture(stream(), &g));
    const cudaError_t e = cudaGraphInstantiate(&d.graph, g, 0);
    cudaGraphDestroy(g);
    DS_CUDA_CHECK(e);
    DS_CUDA_CHECK(cudaGraphLaunch(d.graph, stream()));
    d.graph_gen = act_gen_;
    d.graph_lambda = last_lambda_;
    d.graph_hooks = hooks_.get();
    d.graph_edits = edits_.get();
  }
  last_ids_.push_back(id);
  last_n_ = n;
  has_run_ = true;
}

}  // namespace ds::cuda
