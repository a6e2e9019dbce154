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

#include "backend_cuda_impl.h"
#include "error.h"
#include "kernels/argmax.h"
#include "kernels/attn_decode.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemv.h"
#include "kernels/layernorm.h"
#include "kernels/mamba_scan.h"
#include "kernels/polynorm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

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
  make_activations(a, cap, cap);
  const size_t E = size_t(cfg_.hidden), W = size_t(qkv_width()), n = size_t(last_n_);
  const size_t old_cap = size_t(act_.cap), new_cap = size_t(cap);
  for (size_t l = 0; l <= size_t(cfg_.layers); ++l)
    DS_CUDA_CHECK(cudaMemcpyAsync(a.hidden.as<float>() + l * new_cap * E, act_.hidden.as<float>() + l * old_cap * E,
                                  n * E * 4, cudaMemcpyDeviceToDevice, stream()));
  for (size_t s = 0; s < cfg_.map_layers().size(); ++s)
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

void CudaBackend::decode_step(int32_t id, const std::vector<float>& lambda) {
  const DeviceGuard on(device_);
  if (!loaded_ || !has_run_ || last_batch_ != 1 || last_n_ <= 0)
    throw Error("internal: decoding continues a batch-1 run of the same backend");
  const int L = int(cfg_.layers);
  if (cfg_.is_diff() && lambda != last_lambda_)
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
  if (!cfg_.map_layers().empty() && d.attn_ws_len < size_t(act_.cap)) {
    kern::AttnParams p = layer_attn(int(cfg_.map_layers()[0]), act_.cap, 1, 0.f);
    p.out = d.attn.as<bf16>();  // as decode_launches sets it (the plan checks every pointer)
    p.out_row_stride = p.out_batch_stride = cfg_.heads * cfg_.head_dim;
    const size_t ws = kern::attn_decode_workspace(p, 1, int(act_.cap));
    if (ws == 0) throw Error("CUDA backend: the decoding attention kernel does not take this model's heads");
    d.attn_ws = DeviceBuffer(ws, "the decoding step's attention workspace");
    d.attn_ws_len = size_t(act_.cap);
    d.warm = false;
  }
  const bool graph_ok = d.graph && d.graph_gen == act_gen_ && d.graph_lambda == last_lambda_;
  if (!graph_ok && d.graph) {
    DS_CUDA_CHECK(cudaGraphExecDestroy(d.graph));
    d.graph = nullptr;
  }
  if (d.graph_gen != act_gen_ || d.graph_lambda != last_lambda_) d.warm = false;
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so steps may be queued back to back
  // without waiting for each other (a pinned buffer would be rewritten before the previous copy ran).
  const int32_t ctl[4] = {id, int32_t(pos), int32_t(n), 0};
  DS_CUDA_CHECK(cudaMemcpyAsync(d.ctl.get(), ctl, sizeof ctl, cudaMemcpyHostToDevice, stream()));
  has_run_ = false;  // until the step completes
  if (decode_profile_) {  // eager, every launch between two events (build_profile reads them)
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
  }
  last_ids_.push_back(id);
  last_n_ = n;
  has_run_ = true;
}

void CudaBackend::decode_launches() {
  Decoder& d = *dec_;
  const int L = int(cfg_.layers);
  const int64_t E = cfg_.hidden, W = qkv_width(), I = cfg_.intermediate;
  const int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, hd = cfg_.head_dim;
  const int32_t* pos = d.ctl.as<int32_t>() + 1;
  const int32_t* len = d.ctl.as<int32_t>() + 2;
  const size_t cap = size_t(act_.cap);
  float* h = d.h.as<float>();
  // With decode_profile_, each launch is timed (eager steps only: no events inside a captured graph).
  const auto mark = [&](const char* name, int layer, auto&& f) { timed_if(decode_profile_, name, layer, f); };
  const auto nm = [&](const char* name) { return decode_profile_ ? name : nullptr; };
  // y = W x for the step's row through the GEMV kernel (kernels/gemv.h, with its fused bias, residual and SwiGLU),
  // where decode_gemv_ is on and it takes the shape; false: nothing launched, the caller runs cuBLASLt.
  const auto gemv = [&](const char* name, int layer, const kern::GemvParams& g) {
    if (!decode_gemv_) return false;
    cudaError_t e = cudaSuccess;
    mark(name, layer, [&] { e = kern::launch_gemv(g, stream()); });
    if (e == cudaErrorInvalidValue) return false;
    DS_CUDA_CHECK(e);
    return true;
  };
  bf16* x = d.x.as<bf16>();
  DS_CUDA_CHECK(kern::launch_embedding(d.ctl.as<int32_t>(), embed_.as<bf16>(), h, 1, int(E), stream()));
  for (int l = 0; l < L; ++l) {
    const LayerWeights& w = layers_[size_t(l)];
    const float* h_in = h + size_t(l) * size_t(E);
    float* h_out = h + size_t(l + 1) * size_t(E);
    const LayerKind kind = cfg_.kind(l);
    // RMSNorm families: the block norms run inside the GEMVs that read them (kernels/gemv.h's prologue, the same
    // bits as the norm kernel); LayerNorm and the cuBLASLt fallback norm into x first.
    const bool fused_norm = decode_gemv_ && cfg_.spec().norm == NormKind::Rms;
    const auto norm_x = [&](const float* src, const DeviceBuffer& nw, const DeviceBuffer& nb) {
      mark("norm", l, [&] { block_norm(src, E, nw, nb, x, 1); });
    };
    const auto with_norm = [&](kern::GemvParams g, const float* src, const DeviceBuffer& nw) {
      if (fused_norm) g.x = nullptr, g.x_f32 = src, g.norm_w = nw.as<float>(), g.norm_eps = float(cfg_.norm_eps);
      return g;
    };
    const bool attention = cfg_.has_maps(l);
    if (!attention || !fused_norm) norm_x(h_in, w.ln1, w.ln1_b);
    if (kind == LayerKind::Mamba || kind == LayerKind::Memory) {
      decode_mamba(l, h_in, h_out);
    } else if (kind == LayerKind::Gmu) {
      const int64_t di = cfg_.d_inner;
      bf16* g = d.yg.as<bf16>();
      gemm(nm("gemm_in_proj"), l, {.out_f = di, .tokens = 1, .in_f = E, .w = w.in_proj.as<bf16>(), .x = x, .y = g});
      DS_CUDA_CHECK(kern::launch_silu_mul(g, di, d.mem.as<bf16>(), di, g, di, 1, int(di), stream()));
      gemm(nm("gemm_out_proj"), l, {.out_f = E, .tokens = 1, .in_f = di, .w = w.out_proj.as<bf16>(), .x = g, .y = h_out,
                        .y_f32 = true, .beta = 1.f, .c = h_in});
    } else {
      bf16* qkv = d.qkv.as<bf16>();
      const int64_t rows = kind == LayerKind::CrossAttention ? H * hd : W;
      // The bias joins the f32 product before the one rounding to bf16, as in the prompt's forward (the GEMM's
      // epilogue), so that a decoded position's Q/K/V are the ones a forward over the whole sequence caches.
      if (!gemv("gemv_qkv", l,
                with_norm({.w = w.qkv.as<bf16>(), .x = x, .out_f = int(rows), .in_f = int(E),
                           .bias = w.qkv_b.as<float>(), .y_bf16 = qkv},
                          h_in, w.ln1))) {
        if (fused_norm) norm_x(h_in, w.ln1, w.ln1_b);
        gemm(nm("gemm_qkv"), l, {.out_f = rows, .tokens = 1, .in_f = E, .w = w.qkv.as<bf16>(), .x = x, .y = qkv,
                                 .bias = w.qkv_b16.get(), .bias_f32 = w.qkv_b.as<float>()});
      }
      // RoPE at the position, straight into the layer's cache row (one launch)
      mark("rope_store", l, [&] {
        DS_CUDA_CHECK(kern::launch_rope_row_store(qkv, cfg_.spec().rotary ? act_.cos_sin.as<float2>() : nullptr, pos,
                                                  int(H), int(Hkv), int(hd), qkv_slot(l), W, stream()));
      });
      kern::AttnParams p = layer_attn(l, int64_t(cap), 1, last_lambda_.empty() ? 0.f : last_lambda_[size_t(l)]);
      p.out_scale = float(1.0 - cfg_.lambda_init(l));
      p.eps = float(cfg_.subln_eps);
      p.out = d.attn.as<bf16>();
      p.out_row_stride = H * hd;
      p.out_batch_stride = H * hd;
      mark("decode_attention", l, [&] { DS_CUDA_CHECK(kern::launch_attn_decode(p, len, 1, int(cap), d.attn_ws.get(), stream())); });
      if (!gemv("gemv_o", l, {.w = w.o.as<bf16>(), .x = d.attn.as<bf16>(), .out_f = int(E), .in_f = int(H * hd),
                               .bias = w.o_b.as<float>(), .y_f32 = h_out, .c = h_in})) {
        gemm(nm("gemm_o"), l, {.out_f = E, .tokens = 1, .in_f = H * hd, .w = w.o.as<bf16>(), .x = d.attn.as<bf16>(),
                               .y = h_out, .y_f32 = true, .beta = 1.f, .c = h_in, .bias = w.o_b.get(),
                               .bias_f32 = w.o_b.as<float>()});
      }
    }
    bf16* gu = d.gu.as<bf16>();
    const bool swiglu = cfg_.spec().mlp != MlpAct::PolyNorm;
    if (!swiglu || !fused_norm) norm_x(h_out, w.ln2, w.ln2_b);
    if (!swiglu || !gemv("gemv_gate_up_swiglu", l,
                         with_norm({.w = w.gate_up.as<bf16>(), .x = x, .out_f = int(2 * I), .in_f = int(E),
                                    .y_bf16 = d.act.as<bf16>(), .swiglu = true},
                                   h_out, w.ln2))) {
      if (swiglu && fused_norm) norm_x(h_out, w.ln2, w.ln2_b);
      gemm(nm("gemm_gate_up"), l, {.out_f = 2 * I, .tokens = 1, .in_f = E, .w = w.gate_up.as<bf16>(), .x = x, .y = gu});
      if (!swiglu)
        DS_CUDA_CHECK(kern::launch_polynorm_mul(gu, w.act.as<float>(), float(cfg_.spec().act_eps), d.act.as<bf16>(), 1,
                                                int(I), stream()));
      else
        mark("swiglu", l, [&] { DS_CUDA_CHECK(kern::launch_swiglu(gu, d.act.as<bf16>(), 1, int(I), stream())); });
    }
    if (!gemv("gemv_down", l, {.w = w.down.as<bf16>(), .x = d.act.as<bf16>(), .out_f = int(E), .in_f = int(I),
                               .y_f32 = h_out, .c = h_out}))
      gemm(nm("gemm_down"), l, {.out_f = E, .tokens = 1, .in_f = I, .w = w.down.as<bf16>(), .x = d.act.as<bf16>(),
                                .y = h_out, .y_f32 = true, .beta = 1.f, .spare = d.spare.get(),
                                .spare_bytes = d.spare.bytes()});
  }
  // Every layer's input row (and the last output) into hidden at the position, in one launch: rows L+1 of E f32,
  // the step's rows E apart, hidden's cap x E apart.
  mark("store_rows", L, [&] {
    DS_CUDA_CHECK(kern::launch_copy_rows(h, E * 4, act_.hidden.get(), int64_t(cap) * E * 4, pos, E * 4, L + 1, stream()));
  });
  mark("norm", L, [&] { block_norm(h + size_t(L) * size_t(E), E, final_norm_, final_norm_b_, xf_.as<bf16>(), 1); });
  gemm(nm("gemm_lm_head"), L, {.out_f = cfg_.vocab, .tokens = 1, .in_f = E, .w = lm_head_ptr_, .x = xf_.as<bf16>(),
                    .y = logits_.get(), .y_f32 = true});
}

// Mamba-1 for the step's row (mamba_forward's math, one token): the conv and the scan continue from the layer's
// state and leave it one position on.
void CudaBackend::decode_mamba(int l, const float* h_in, float* h_out) {
  Decoder& d = *dec_;
  const int64_t E = cfg_.hidden, di = cfg_.d_inner, R = cfg_.dt_rank, S = cfg_.d_state, XD = R + 2 * S;
  const LayerWeights& w = layers_[size_t(l)];
  bf16* xz = d.xz.as<bf16>();
  gemm(nullptr, l, {.out_f = 2 * di, .tokens = 1, .in_f = E, .w = w.in_proj.as<bf16>(), .x = d.x.as<bf16>(), .y = xz});
  DS_CUDA_CHECK(kern::launch_causal_conv_silu_state(xz, 2 * di, w.conv_w.as<float>(), w.conv_b.as<float>(),
                                                    int(cfg_.d_conv), d.u.as<bf16>(), di, 1, int(di), conv_state(l),
                                                    conv_state(l), stream()));
  gemm(nullptr, l, {.out_f = XD, .tokens = 1, .in_f = di, .w = w.x_proj.as<bf16>(), .x = d.u.as<bf16>(),
                    .y = d.xdbl.as<bf16>()});
  gemm(nullptr, l, {.out_f = di, .tokens = 1, .in_f = R, .w = w.dt_w.as<bf16>(), .x = d.xdbl.as<bf16>(),
                    .y = d.dt.as<bf16>(), .ldx = XD});
  const bool memory = cfg_.kind(l) == LayerKind::Memory;
  kern::ScanParams sp;
  sp.n = 1;
  sp.channels = int(di);
  sp.state = int(S);
  sp.u = d.u.as<bf16>(), sp.ld_u = di;
  sp.dt = d.dt.as<bf16>(), sp.ld_dt = di;
  sp.dt_bias = w.dt_b.as<float>();
  sp.A = w.a_neg.as<float>();
  sp.B = d.xdbl.as<bf16>() + R, sp.C = d.xdbl.as<bf16>() + R + S, sp.ld_bc = XD;
  sp.D = w.d_skip.as<float>();
  sp.z = xz + di, sp.ld_z = 2 * di;
  sp.y = memory ? d.mem.as<bf16>() : nullptr;
  sp.y_gated = d.yg.as<bf16>();
  sp.ld_y = di;
  sp.state_in = ssm_state(l);
  sp.state_out = ssm_state(l);
  DS_CUDA_CHECK(kern::launch_selective_scan(sp, nullptr, stream()));
  if (memory)
    DS_CUDA_CHECK(kern::launch_copy_row(d.mem.get(), 0, nullptr, act_.memory.get(), di * 2, d.ctl.as<int32_t>() + 1,
                                        di * 2, stream()));
  gemm(nullptr, l, {.out_f = E, .tokens = 1, .in_f = di, .w = w.out_proj.as<bf16>(), .x = d.yg.as<bf16>(),
                    .y = h_out, .y_f32 = true, .beta = 1.f, .c = h_in});
}

}  // namespace ds::cuda
