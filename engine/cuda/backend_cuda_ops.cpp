// The forward's operations (forward.h) on the CUDA backend. One class serves a prompt (batch sequences of n tokens:
// every row, or the last row of each sequence after the last layer's mixer) and a decoding step (one row in the
// Decoder's buffers, its position read from device memory so that the whole step is one CUDA graph). Each op picks its
// kernels: inside linear, by rows, the GEMV of kernels/gemv.h for one row (with the block's RMSNorm as its prologue
// where it can: norm() then only records it), the fused sm_90a GEMM + SwiGLU / silu-gate kernels for long prompts,
// cuBLASLt otherwise.
//
// Storage (backend_cuda_impl.h): the stream is hidden [L+1][cap][E] f32 for a prompt and the Decoder's h [L+1][E] for a
// step (its rows reach hidden at the end of the step, decode_launches); Q/K/V live in each attention layer's
// qkv_cache slot; the rest in act_'s scratch buffers (prompt) or the Decoder's one-row buffers (step).
#include <algorithm>
#include <cmath>

#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/error.h"
#include "kernels/attn_decode.h"
#include "kernels/attn_fwd_generic.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm_swiglu_sm90.h"
#include "kernels/gemv.h"
#include "kernels/mamba_scan.h"
#include "kernels/polynorm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace ds::cuda {

namespace {

// Rows from which the fused sm_90a GEMMs (kernels/gemm_swiglu_sm90.h) take over from cuBLASLt and a separate
// element-wise kernel: below, cuBLASLt's small-M kernels are as fast.
constexpr int64_t kFusedSwigluRows = 1024;

// Profiler names of the attention kernels (the profiler sums every mark with "attn" in it, except attn_maps).
const char* attn_mark_name(kern::AttnImpl impl) {
  switch (impl) {
    case kern::AttnImpl::Sm90: return "attn_fwd_sm90";
    case kern::AttnImpl::MmaBoth: return "diff_attn_mma_both";
    case kern::AttnImpl::MmaVsplit: return "diff_attn_mma_vsplit";
    case kern::AttnImpl::MmaLockstep: return "diff_attn_mma_lockstep";
    default: return "attn_fwd_generic";
  }
}

// Profiler names of the one-row products (static strings: the marks keep the pointer).
const char* gemv_name(fwd::Weight w) {
  static const char* const names[] = {"gemv_qkv",     "gemv_q",        "gemv_o",         "gemv_gate_up", "gemv_down",
                                      "gemv_in_proj", "gemv_x_proj",   "gemv_dt_proj",   "gemv_out_proj", "gemv_lm_head"};
  return names[int(w)];
}

}  // namespace

class CudaBackend::ForwardOps final : public fwd::Ops {
 public:
  // A prompt: `batch` sequences of n tokens. recompute: a map query's recomputation of part of a block from a layer's
  // cached input (fwd::mamba_inputs): no state written, nothing profiled.
  ForwardOps(CudaBackend& b, int batch, int64_t n, bool gemms_only, bool recompute = false)
      : b_(b), c_(b.cfg_), decode_(false), recompute_(recompute), batch_(batch), n_(n), T_(int64_t(batch) * n),
        gemms_only_(gemms_only), win_first_(0), win_count_(T_) {}
  // A decoding step (the Decoder's buffers, position and length in its ctl).
  explicit ForwardOps(CudaBackend& b)
      : b_(b), c_(b.cfg_), decode_(true), recompute_(false), batch_(1), n_(1), T_(1), gemms_only_(false), win_first_(0),
        win_count_(1) {}
  // Rows::New of Stream(L), Normed(L) and Logits as `count` rows from token `first` (the all-logits chunks).
  void set_window(int64_t first, int64_t count) { win_first_ = first, win_count_ = count; }

  void embed() override {
    if (decode_)
      return DS_CUDA_CHECK(kern::launch_embedding(b_.dec_->ctl.as<int32_t>(), b_.embed_.as<bf16>(),
                                                  b_.dec_->h.as<float>(), 1, int(c_.hidden), b_.stream()));
    step("embedding", -1, [&] {
      DS_CUDA_CHECK(kern::launch_embedding(b_.act_.ids.as<int32_t>(), b_.embed_.as<bf16>(), b_.act_.hidden.as<float>(),
                                           T_, int(c_.hidden), b_.stream()));
    });
  }

  void norm(int l, fwd::Norm which, fwd::Ref in, fwd::Ref out) override {
    const View x = view(in), y = view(out);
    const bool fin = which == fwd::Norm::Final;
    const LayerWeights* w = fin ? nullptr : &b_.layers_[size_t(l)];
    const DeviceBuffer& nw = fin ? b_.final_norm_ : which == fwd::Norm::Input ? w->ln1 : w->ln2;
    const DeviceBuffer& nb = fin ? b_.final_norm_b_ : which == fwd::Norm::Input ? w->ln1_b : w->ln2_b;
    const bool ln = c_.spec().norm == NormKind::LayerNorm;
    // A step's RMSNorm of the stream waits for its consumer: a GEMV runs it as its prologue (the same bits).
    if (decode_ && !ln && b_.decode_gemv_ && !fin && out.t == fwd::Act::Normed) {
      pending_ = {static_cast<const float*>(x.p), nw.as<float>(), static_cast<bf16*>(y.p)};
      return;
    }
    pending_ = {};
    step(decode_ ? "norm" : ln ? "layernorm" : "rmsnorm", l, [&] {
      b_.block_norm(static_cast<const float*>(x.p), x.ld, nw, nb, static_cast<bf16*>(y.p), x.rows);
    });
  }

  void linear(const fwd::Linear& op) override {
    const int64_t E = c_.hidden, I = c_.intermediate, di = c_.d_inner, XD = c_.dt_rank + 2 * c_.d_state;
    const int64_t H = c_.heads, d = c_.head_dim;
    const LayerWeights* w = op.layer >= 0 ? &b_.layers_[size_t(op.layer)] : nullptr;
    const int l = op.layer >= 0 ? op.layer : int(c_.layers);
    // The weight, its shape and its bias (f32; the qkv GEMM's bf16 epilogue has its own copy).
    const bf16* wt = nullptr;
    int64_t out_f = 0, in_f = E;
    const DeviceBuffer* bias = nullptr;
    const DeviceBuffer* bias16 = nullptr;
    switch (op.w) {
      case fwd::Weight::Qkv:
      case fwd::Weight::Q:
        wt = w->qkv.as<bf16>(), out_f = op.w == fwd::Weight::Q ? H * d : b_.qkv_width(), bias = &w->qkv_b,
        bias16 = &w->qkv_b16;
        break;
      case fwd::Weight::O: wt = w->o.as<bf16>(), out_f = E, in_f = H * d, bias = &w->o_b; break;
      case fwd::Weight::GateUp: wt = w->gate_up.as<bf16>(), out_f = 2 * I; break;
      case fwd::Weight::Down: wt = w->down.as<bf16>(), out_f = E, in_f = I; break;
      case fwd::Weight::InProj: wt = w->in_proj.as<bf16>(), out_f = op.out.t == fwd::Act::Xz ? 2 * di : di; break;
      case fwd::Weight::XProj: wt = w->x_proj.as<bf16>(), out_f = XD, in_f = di; break;
      case fwd::Weight::DtProj: wt = w->dt_w.as<bf16>(), out_f = di, in_f = c_.dt_rank; break;
      case fwd::Weight::OutProj: wt = w->out_proj.as<bf16>(), out_f = E, in_f = di; break;
      case fwd::Weight::LmHead: wt = b_.lm_head_ptr_, out_f = c_.vocab; break;
    }
    const View x = view(op.in), y = view(op.out);
    if (op.out.t == fwd::Act::Qkv && !decode_) b_.hc_.qkv_written = true;  // (host caches: its rows go back after it)
    const bool residual = op.epi == fwd::Epilogue::Residual;
    const View r = residual ? view(op.res) : View{};
    const bool gated = op.epi == fwd::Epilogue::GatedAct, swiglu = gated && c_.spec().mlp == MlpAct::Silu;
    const bool silu_memory = op.epi == fwd::Epilogue::SiluMemory;
    const bf16* memory = silu_memory ? (decode_ ? b_.dec_->mem.as<bf16>() : b_.act_.memory.as<bf16>()) : nullptr;
    // The product's own output where an element-wise kernel follows it (PolyNorm's gate/up rows; the GMU's gate is
    // formed in place).
    bf16* gu = gated && !swiglu ? (decode_ ? b_.dec_->gu.as<bf16>() : b_.act_.scratch32.as<bf16>()) : nullptr;

    // One row: the GEMV, with the pending RMSNorm as its prologue.
    if (decode_ && b_.decode_gemv_) {
      kern::GemvParams g{.w = wt, .x = static_cast<const bf16*>(x.p), .out_f = int(out_f), .in_f = int(in_f),
                         .bias = bias ? bias->as<float>() : nullptr};
      if (pending_.src && x.p == pending_.dst) {
        g.x = nullptr, g.x_f32 = pending_.src, g.norm_w = pending_.w, g.norm_eps = float(c_.norm_eps);
      }
      if (residual) g.y_f32 = static_cast<float*>(y.p), g.c = static_cast<const float*>(r.p);
      else if (y.f32) g.y_f32 = static_cast<float*>(y.p);
      else if (gu) g.y_bf16 = gu;
      else g.y_bf16 = static_cast<bf16*>(y.p), g.swiglu = swiglu;
      cudaError_t e = cudaSuccess;
      const char* name = swiglu ? "gemv_gate_up_swiglu" : gemv_name(op.w);
      b_.timed_if(b_.decode_profile_, name, l, [&] { e = kern::launch_gemv(g, b_.stream()); });
      if (e == cudaSuccess) {
        if (g.x_f32) pending_ = {};
        return after_product(l, gated, swiglu, silu_memory, gu, y, memory, x.rows, out_f);
      }
      if (e != cudaErrorInvalidValue) DS_CUDA_CHECK(e);
    }
    flush_norm(l);
    // Long prompts on sm_90a: the gate/up GEMM forms SwiGLU in its epilogue, the GMU's in_proj its gate (the [R][2I]
    // product never reaches device memory). Same rounding as the two kernels below; DS_SWIGLU_FUSED=0 keeps those.
    if (!decode_ && !gemms_only_ && b_.fused_swiglu_ && x.rows >= kFusedSwigluRows) {
      if (swiglu && kern::gemm_swiglu_sm90_supported(static_cast<const bf16*>(x.p), x.ld, wt, x.rows, int(E), int(I))) {
        return mark("gemm_gate_up_swiglu", l, [&] {
          DS_CUDA_CHECK(kern::launch_gemm_swiglu_sm90(static_cast<const bf16*>(x.p), x.ld, wt, static_cast<bf16*>(y.p),
                                                      x.rows, int(E), int(I), b_.stream()));
        });
      }
      if (silu_memory && out_f % 256 == 0 &&
          kern::gemm_swiglu_sm90_supported(static_cast<const bf16*>(x.p), x.ld, wt, x.rows, int(E), int(out_f / 2))) {
        return mark("gemm_in_proj_gate", l, [&] {
          DS_CUDA_CHECK(kern::launch_gemm_silu_mul_sm90(static_cast<const bf16*>(x.p), x.ld, wt, memory, out_f,
                                                        static_cast<bf16*>(y.p), x.rows, int(E), int(out_f),
                                                        b_.stream()));
        });
      }
    }
    // cuBLASLt. The bias joins the epilogue (the GEMM floor, gemms_only, leaves it out: the products alone); the
    // residual add is its C term (C = res, D = out: the f32 stream is never copied; in place with a spare for the
    // autotuner, which must not add the product into out once per candidate).
    GemmArgs g{.out_f = out_f, .tokens = x.rows, .in_f = in_f, .w = wt, .x = static_cast<const bf16*>(x.p),
               .y = gated ? (swiglu ? b_.act_.scratch32.get() : gu) : y.p, .y_f32 = y.f32};
    if (decode_ && gated && swiglu) g.y = b_.dec_->gu.get();
    if (bias && !gemms_only_) {
      g.bias = y.f32 ? bias->get() : bias16 ? bias16->get() : nullptr;
      g.bias_f32 = bias->as<float>();
      if (!y.f32 && !bias16) throw Error("internal: a bf16 projection with a bias needs its bf16 copy");
    }
    g.ldx = x.ld != in_f ? x.ld : 0;
    g.ldy = !gated && y.ld != out_f ? y.ld : 0;
    if (residual) {
      g.beta = 1.f;
      if (r.p != y.p) {
        g.c = r.p;
      } else {
        DeviceBuffer& spare = decode_ ? b_.dec_->spare : b_.act_.scratch32;
        g.spare = spare.get(), g.spare_bytes = spare.bytes();
      }
    }
    b_.gemm((decode_ && !b_.decode_profile_) || recompute_ ? nullptr : fwd::gemm_name(op.w), l, g);
    if (gemms_only_) return;
    after_product(l, gated, swiglu, silu_memory, swiglu ? static_cast<bf16*>(g.y) : gu, y, memory, x.rows, out_f);
  }

  void rope(int l) override {
    const int64_t H = c_.heads, Hkv = c_.kv_heads, d = c_.head_dim;
    const float2* cs = c_.spec().rotary ? b_.act_.cos_sin.as<float2>() : nullptr;
    if (decode_) {  // rotated at the position, straight into the layer's cache row (one launch)
      return step("rope_store", l, [&] {
        DS_CUDA_CHECK(kern::launch_rope_row_store(b_.dec_->qkv.as<bf16>(), cs, b_.dec_->ctl.as<int32_t>() + 1, int(H),
                                                  int(Hkv), int(d), b_.qkv_slot(l), b_.qkv_width(), b_.stream()));
        if (b_.act_.host) b_.hc_decode_row_kv(l);  // (host caches: the row's K and V beside the kept ones)
      });
    }
    if (!cs) return;
    step("rope", l, [&] {
      DS_CUDA_CHECK(kern::launch_rope_qk_inplace(b_.qkv_slot(l), cs, T_, int(n_), int(H), int(Hkv), int(d), b_.stream()));
    });
  }

  // Every new row's attention; the last row alone of a single sequence when only it is carried on (the last layer of
  // a forward that keeps the next-token logits: the decoding kernel over the layer's cache, one query row), unless
  // the forward is profiled per head.
  void attention(int l, float lambda, fwd::Rows rows, const fwd::AttnEdit* edit) override {
    const int64_t Hd = c_.heads * c_.head_dim;
    const int64_t n = decode_ ? b_.act_.cap : n_;
    kern::AttnParams p = b_.layer_attn(l, n, batch_, lambda);
    p.out_scale = float(1.0 - c_.lambda_init(l));
    p.eps = float(c_.subln_eps);
    if (decode_) {  // (quantised logits: the kernel's row-maximum launch first, attn_decode.h)
      if (b_.act_.host) b_.hc_decode_kv(l, p);  // (host caches: K and V kept on the device, where they are)
      p.out = b_.dec_->attn.as<bf16>();
      p.out_row_stride = p.out_batch_stride = Hd;
      return step("decode_attention", l, [&] {
        DS_CUDA_CHECK(kern::launch_attn_decode(p, b_.dec_->ctl.as<int32_t>() + 2, 1, int(b_.act_.cap),
                                               b_.dec_->attn_ws.get(), b_.stream()));
      });
    }
    if (rows == fwd::Rows::Last && batch_ == 1 && n_ > 1 && !b_.profiling_ && last_row_attention(p, l)) return;
    p.out = b_.act_.attn.as<bf16>();
    p.out_row_stride = Hd;
    p.out_batch_stride = n_ * Hd;
    p.head_ns = b_.profiling_ ? b_.head_ns_.as<unsigned long long>() + size_t(l) * size_t(b_.view_heads()) : nullptr;
    // quantised logits: the kernels with a pass for each row's largest logit (select_attn's rule)
    const kern::AttnChoice choice = b_.attn_choice(p);
    step(p.logit_bits > 0 ? "attention_quantized" : attn_mark_name(choice.impl), l,
         [&] { DS_CUDA_CHECK(kern::launch_attn(choice, p, b_.stream())); });
    if (edit && p.nko > 0 && choice.impl != kern::AttnImpl::Generic) {
      // Knockout (the edit's spans, in p.ko since layer_attn): the fused kernels take no key mask; the generic kernel
      // computes the knocked rows again with it.
      int64_t q0 = n_, q1 = 0;
      for (int i = 0; i < p.nko; ++i) q0 = std::min<int64_t>(q0, p.ko[i].x), q1 = std::max<int64_t>(q1, std::min<int64_t>(p.ko[i].y, n_));
      if (q0 < q1) {
        p.row0 = int(q0), p.row1 = int(q1), p.head_ns = nullptr;
        step("attention_knockout", l, [&] { DS_CUDA_CHECK(kern::launch_attn_fwd_generic(p, b_.stream())); });
      }
    }
  }

  // Host caches (backend_cuda_host_caches.cpp): the layer's slots before it, its rows to the host after it.
  void layer_begin(int l) override {
    if (b_.act_.host && !recompute_) b_.hc_layer_begin(l, decode_);
  }
  void layer_end(int l) override {
    if (!b_.act_.host || recompute_) return;
    flush_max_abs();  // (a reader's pending reduction reads the layer's slot before another layer reuses it)
    b_.hc_layer_end(l, decode_);
  }

  void keep_attention(int l, float lambda, fwd::Rows rows, const fwd::AttnEdit* edit) override {
    if (decode_ || recompute_ || gemms_only_ || batch_ != 1 || rows != fwd::Rows::New || l != b_.keep_req_) return;
    auto& k = b_.kept_;
    if (k.buf.bytes() < attn_bytes()) k.buf = DeviceBuffer(attn_bytes(), "a layer's kept attention output");
    step("keep_attention", l, [&] {
      DS_CUDA_CHECK(
          cudaMemcpyAsync(k.buf.get(), b_.act_.attn.get(), attn_bytes(), cudaMemcpyDeviceToDevice, b_.stream()));
    });
    k.layer = l, k.n = n_, k.gen = b_.act_gen_, k.lambda = lambda, k.edit = edit ? *edit : fwd::AttnEdit{};
    k.valid = true;
  }

  bool attention_kept(int l, float lambda, const fwd::AttnEdit* edit) override {
    const auto& k = b_.kept_;
    if (decode_ || recompute_ || gemms_only_ || batch_ != 1 || !k.valid || k.layer != l || l != b_.run_from_ ||
        k.n != n_ || k.gen != b_.act_gen_ || !(k.lambda == lambda) || !(k.edit == (edit ? *edit : fwd::AttnEdit{})))
      return false;
    step("attention_kept", l, [&] {
      DS_CUDA_CHECK(
          cudaMemcpyAsync(b_.act_.attn.get(), k.buf.get(), attn_bytes(), cudaMemcpyDeviceToDevice, b_.stream()));
    });
    return true;
  }
  size_t attn_bytes() const { return size_t(n_) * size_t(c_.heads * c_.head_dim) * 2; }  // Attn of every row, bf16

  void conv(int l) override {
    const int64_t di = c_.d_inner;
    const LayerWeights& w = b_.layers_[size_t(l)];
    const View xz = view({fwd::Act::Xz, l}), u = view({fwd::Act::U, l});
    if (decode_) {  // continues from the layer's state and leaves it one position on
      return DS_CUDA_CHECK(kern::launch_causal_conv_silu_state(
          static_cast<const bf16*>(xz.p), 2 * di, w.conv_w.as<float>(), w.conv_b.as<float>(), int(c_.d_conv),
          static_cast<bf16*>(u.p), di, 1, int(di), b_.conv_state(l), b_.conv_state(l), b_.stream()));
    }
    for (int bi = 0; bi < batch_; ++bi)
      step("mamba_conv", l, [&] {
        // A single sequence leaves the layer's state for decoding (backend_cuda_decode.cpp).
        DS_CUDA_CHECK(kern::launch_causal_conv_silu_state(
            static_cast<const bf16*>(xz.p) + bi * n_ * 2 * di, 2 * di, w.conv_w.as<float>(), w.conv_b.as<float>(),
            int(c_.d_conv), static_cast<bf16*>(u.p) + bi * n_ * di, di, n_, int(di), nullptr,
            batch_ == 1 && !recompute_ ? b_.conv_state(l) : nullptr, b_.stream()));
      });
  }

  void scan(int l, bool memory) override {
    const int64_t di = c_.d_inner, R = c_.dt_rank, S = c_.d_state, XD = R + 2 * S;
    const LayerWeights& w = b_.layers_[size_t(l)];
    const View xz = view({fwd::Act::Xz, l}), u = view({fwd::Act::U, l}), dt = view({fwd::Act::Dt, l}),
               xdbl = view({fwd::Act::Xdbl, l}), y = view({fwd::Act::Mixed, l});
    for (int bi = 0; bi < batch_; ++bi)
      step("mamba_scan", l, [&] {
        const int64_t o = bi * n_;
        kern::ScanParams sp;
        sp.n = decode_ ? 1 : n_;
        sp.channels = int(di);
        sp.state = int(S);
        sp.u = static_cast<const bf16*>(u.p) + o * di, sp.ld_u = di;
        sp.dt = static_cast<const bf16*>(dt.p) + o * di, sp.ld_dt = di;
        sp.dt_bias = w.dt_b.as<float>();
        sp.A = w.a_neg.as<float>();
        sp.B = static_cast<const bf16*>(xdbl.p) + o * XD + R, sp.C = static_cast<const bf16*>(xdbl.p) + o * XD + R + S;
        sp.ld_bc = XD;
        sp.D = w.d_skip.as<float>();
        sp.z = static_cast<const bf16*>(xz.p) + o * 2 * di + di, sp.ld_z = 2 * di;
        bf16* mem = decode_ ? b_.dec_->mem.as<bf16>() : b_.act_.memory.as<bf16>() + o * di;
        sp.y = memory ? mem : nullptr;
        sp.y_gated = static_cast<bf16*>(y.p) + o * di;
        sp.ld_y = di;
        sp.state_in = decode_ ? b_.ssm_state(l) : nullptr;
        sp.state_out = decode_ || batch_ == 1 ? b_.ssm_state(l) : nullptr;
        DS_CUDA_CHECK(kern::launch_selective_scan(sp, decode_ ? nullptr : b_.act_.scan_ws.get(), b_.stream()));
      });
    if (decode_ && memory)  // the step's memory row into the memory at the position
      DS_CUDA_CHECK(kern::launch_copy_row(b_.dec_->mem.get(), 0, nullptr, b_.act_.memory.get(), di * 2,
                                          b_.dec_->ctl.as<int32_t>() + 1, di * 2, b_.stream()));
  }

  // Readers' reductions wait for the end of the forward (finish()): the stream rows they read are not written again,
  // and consecutive layers' sites (hidden's rows a layer apart, the same shape) then take one launch.
  void max_abs(fwd::Ref in, int slot) override {
    const View x = view(in);
    if (!x.f32) throw Error("internal: max_abs reads f32 activations (the residual stream)");
    if (slot < 0 || slot >= int(c_.layers)) throw Error("internal: max_abs slot " + std::to_string(slot));
    const int cols = int(in.t == fwd::Act::Stream ? c_.hidden : x.ld);
    const float* p = static_cast<const float*>(x.p);
    MaxRun& r = max_run_;
    const bool extends = r.count > 0 && r.ld == x.ld && r.rows == x.rows && r.cols == cols && slot == r.slot + r.count &&
                         (r.count == 1 ? p > r.x : p == r.x + r.count * r.stride);
    if (extends) {
      if (r.count == 1) r.stride = p - r.x;
      ++r.count;
    } else {
      flush_max_abs();
      r = {p, 0, x.ld, x.rows, cols, slot, 1};
    }
    b_.max_abs_read_[size_t(slot)] = 1;
  }

  void scale_columns(fwd::Ref t, int64_t c0, int64_t c1, float f) override {
    const View x = view(t);
    if (x.f32) throw Error("internal: scale_columns writes bf16 activations (a head's output)");
    DS_CUDA_CHECK(kern::launch_scale_columns(static_cast<bf16*>(x.p), x.ld, x.rows, int(c0), int(c1), f, b_.stream()));
  }

  void mean_columns(fwd::Ref t, int64_t c0, int64_t c1, int slot) override {
    const View x = view(t);
    if (x.f32) throw Error("internal: mean_columns writes bf16 activations (a head's output)");
    constexpr int kSlots = 64, kWidth = 1024;
    if (slot < 0 || slot >= kSlots || c1 - c0 > kWidth)
      throw Error("at most " + std::to_string(kSlots) + " heads can be mean-ablated at once on the CUDA backend");
    if (!b_.mean_slots_.get()) b_.mean_slots_ = DeviceBuffer(size_t(kSlots) * kWidth * 4, "mean ablations");
    float* m = b_.mean_slots_.as<float>() + size_t(slot) * kWidth;
    step("mean_columns", t.layer, [&] {
      DS_CUDA_CHECK(kern::launch_mean_columns(static_cast<bf16*>(x.p), x.ld, x.rows, int(c0), int(c1), m, !decode_,
                                              b_.stream()));
    });
  }

  // The readers' pending reductions (call after the last layer, before anything reuses the stream's buffers).
  void finish() { flush_max_abs(); }

 private:
  // Row n - 1 of a prompt's attention by the decoding kernel (its length from device memory, written here); false
  // when the kernel does not take the shape (the caller runs every row).
  bool last_row_attention(kern::AttnParams p, int l) {
    const int64_t Hd = c_.heads * c_.head_dim;
    p.out = b_.act_.attn.as<bf16>() + (n_ - 1) * Hd;
    p.out_row_stride = p.out_batch_stride = Hd;
    p.head_ns = nullptr;
    const size_t ws = kern::attn_decode_workspace(p, 1, int(n_));
    if (ws == 0) return false;
    if (b_.last_row_ws_.bytes() < ws) b_.last_row_ws_ = DeviceBuffer(ws, "the last row's attention workspace");
    if (!b_.last_row_len_.get()) b_.last_row_len_ = DeviceBuffer(4, "the last row's attention length");
    const int32_t len = int32_t(n_);  // (pageable: staged before the call returns)
    DS_CUDA_CHECK(cudaMemcpyAsync(b_.last_row_len_.get(), &len, 4, cudaMemcpyHostToDevice, b_.stream()));
    cudaError_t e = cudaSuccess;
    step("attention_last_row", l, [&] {
      e = kern::launch_attn_decode(p, b_.last_row_len_.as<int32_t>(), 1, int(n_), b_.last_row_ws_.get(), b_.stream());
    });
    if (e == cudaErrorInvalidValue) return (void)cudaGetLastError(), false;
    DS_CUDA_CHECK(e);
    return true;
  }

  struct View {
    void* p = nullptr;
    int64_t rows = 0, ld = 0;
    bool f32 = false;
  };
  struct MaxRun {  // consecutive max_abs sites: count tensors `stride` floats apart into slots slot..slot + count - 1
    const float* x = nullptr;
    int64_t stride = 0, ld = 0, rows = 0;
    int cols = 0, slot = 0, count = 0;
  };
  void flush_max_abs() {
    MaxRun& r = max_run_;
    if (r.count == 0) return;
    step("max_abs", r.slot, [&] {
      DS_CUDA_CHECK(kern::launch_max_abs_many(r.x, r.stride, r.count, r.ld, r.rows, r.cols,
                                              b_.max_abs_.as<float>() + r.slot, b_.stream()));
    });
    r = {};
  }
  struct Pending {
    const float* src = nullptr;  // the f32 stream row
    const float* w = nullptr;    // the norm's weight
    bf16* dst = nullptr;         // where the normed row belongs (Normed)
  };

  // A kernel other than a GEMM: skipped by the GEMM floor (gemms_only); timed on a prompt when profiling, on a step
  // when its launches are profiled.
  template <class F>
  void step(const char* name, int l, F&& f) {
    if (!gemms_only_) mark(name, l, f);
  }
  template <class F>
  void mark(const char* name, int l, F&& f) {
    b_.timed_if(recompute_ ? false : decode_ ? b_.decode_profile_ : b_.profiling_, name, l, f);
  }

  // The pending RMSNorm run as a kernel (its consumer is not a GEMV).
  void flush_norm(int l) {
    if (!pending_.src) return;
    const Pending p = pending_;
    pending_ = {};
    step("norm", l, [&] {
      DS_CUDA_CHECK(kern::launch_rmsnorm(p.src, c_.hidden, p.w, p.dst, c_.hidden, 1, int(c_.hidden),
                                         float(c_.norm_eps), b_.stream()));
    });
  }

  // The element-wise kernel after a product whose epilogue was not fused: SwiGLU or PolyNorm of the gate/up rows,
  // the GMU's silu(gate) * memory.
  void after_product(int l, bool gated, bool swiglu, bool silu_memory, bf16* gu, const View& y, const bf16* memory,
                     int64_t rows, int64_t out_f) {
    if (silu_memory)
      step("gmu_gate", l, [&] {
        DS_CUDA_CHECK(kern::launch_silu_mul(static_cast<const bf16*>(y.p), out_f, memory, out_f, static_cast<bf16*>(y.p),
                                            out_f, rows, int(out_f), b_.stream()));
      });
    if (!gated || !gu) return;
    const int I = int(c_.intermediate);
    if (swiglu)
      step("swiglu", l, [&] { DS_CUDA_CHECK(kern::launch_swiglu(gu, static_cast<bf16*>(y.p), rows, I, b_.stream())); });
    else
      step("polynorm", l, [&] {
        DS_CUDA_CHECK(kern::launch_polynorm_mul(gu, b_.layers_[size_t(l)].act.as<float>(), float(c_.spec().act_eps),
                                                static_cast<bf16*>(y.p), rows, I, b_.stream()));
      });
  }

  View view(fwd::Ref r) const {
    const int64_t E = c_.hidden, L = c_.layers, Hd = c_.heads * c_.head_dim, di = c_.d_inner;
    const int64_t XD = c_.dt_rank + 2 * c_.d_state;
    const bool last = r.rows == fwd::Rows::Last;
    if (decode_) {
      Decoder& d = *b_.dec_;
      switch (r.t) {
        case fwd::Act::Stream: return {d.h.as<float>() + size_t(r.layer) * size_t(E), 1, E, true};
        case fwd::Act::Normed: return {r.layer >= L ? b_.xf_.get() : d.x.get(), 1, E, false};
        case fwd::Act::Qkv: return {d.qkv.get(), 1, b_.qkv_width(), false};
        case fwd::Act::Attn: return {d.attn.get(), 1, Hd, false};
        case fwd::Act::Mlp: return {d.act.get(), 1, c_.intermediate, false};
        case fwd::Act::Xz: return {d.xz.get(), 1, 2 * di, false};
        case fwd::Act::U: return {d.u.get(), 1, di, false};
        case fwd::Act::Xdbl: return {d.xdbl.get(), 1, XD, false};
        case fwd::Act::Dt: return {d.dt.get(), 1, di, false};
        case fwd::Act::Mixed: return {d.yg.get(), 1, di, false};
        case fwd::Act::Logits: return {b_.logits_.get(), 1, c_.vocab, true};
      }
    }
    // A prompt: Rows::New is the window (every token, or a chunk of the logits), Rows::Last each sequence's last row.
    const int64_t first = last ? n_ - 1 : win_first_, rows = last ? batch_ : win_count_, step = last ? n_ : 1;
    const Activations& a = b_.act_;
    switch (r.t) {
      case fwd::Act::Stream: return {b_.stream_ptr(r.layer, first), rows, step * E, true};
      case fwd::Act::Normed: return {r.layer >= L ? b_.xf_.get() : a.x.get(), rows, E, false};
      case fwd::Act::Qkv: return {b_.qkv_slot(r.layer), T_, b_.qkv_width(), false};
      case fwd::Act::Attn: return {a.attn.as<bf16>() + first * Hd, rows, step * Hd, false};
      case fwd::Act::Mlp: return {a.act.get(), rows, c_.intermediate, false};
      case fwd::Act::Xz: return {a.scratch32.get(), T_, 2 * di, false};
      case fwd::Act::Dt: return {a.scratch32.as<bf16>() + T_ * 2 * di, T_, di, false};
      case fwd::Act::U: return {a.act.get(), T_, di, false};
      case fwd::Act::Xdbl: return {a.xdbl.get(), T_, XD, false};
      case fwd::Act::Mixed: return {a.ssm.get(), T_, di, false};
      case fwd::Act::Logits: return {b_.logits_.get(), rows, c_.vocab, true};
    }
    return {};
  }

  CudaBackend& b_;
  const ModelConfig& c_;
  bool decode_, recompute_;
  int batch_;
  int64_t n_, T_;
  bool gemms_only_;
  int64_t win_first_, win_count_;
  Pending pending_;
  MaxRun max_run_;
};

void CudaBackend::run_layers(int batch, int64_t n, const std::vector<float>& lambda, int from, bool last_rows_only,
                             bool gemms_only) {
  ForwardOps ops(*this, batch, n, gemms_only);
  fwd::Plan plan;
  plan.from_layer = from;
  plan.to_layer = end_layer();
  plan.last_rows_only = last_rows_only;
  plan.lambda = lambda.data();
  plan.hooks = gemms_only ? nullptr : hooks_.get();
  plan.edits = gemms_only ? nullptr : edits_.get();
  fwd::run_layers(cfg_, ops, plan);
  ops.finish();
}

void CudaBackend::run_mamba_inputs(int layer) {
  ForwardOps ops(*this, 1, last_n_, false, true);
  fwd::mamba_inputs(cfg_, ops, layer);
}

void CudaBackend::final_logits(int batch, int64_t n) {
  ensure_logits(batch);
  ForwardOps ops(*this, batch, n, false);
  fwd::logits(cfg_, ops, fwd::Rows::Last);
}

void CudaBackend::lens_logits(int layer, int64_t position, float* out) {
  const DeviceGuard on(device_);
  // (layer L - 1: a layer split's lens, whose row was written into Stream(L) here for the LM head)
  if (!has_run_ || last_batch_ != 1 || layer < first_ - 1 || layer >= end_layer() || end_layer() != int(cfg_.layers) ||
      position < 0 || position >= last_n_)
    throw Error("internal: lens of layer " + std::to_string(layer) + " at position " + std::to_string(position));
  ensure_logits(1);
  if (act_.host) page_stream(layer + 1);
  ForwardOps ops(*this, 1, last_n_, false);
  ops.set_window(position, 1);
  fwd::lens(cfg_, ops, layer, fwd::Rows::New);
  copy_to_host({{out, logits_.get(), size_t(cfg_.vocab) * 4}});
}

void CudaBackend::final_logits_rows(int64_t first, int64_t count) {
  ensure_logits(count);
  if (act_.host) page_stream(int(cfg_.layers));
  ForwardOps ops(*this, 1, last_n_, false);
  ops.set_window(first, count);
  fwd::logits(cfg_, ops, fwd::Rows::New);
}

std::vector<float> CudaBackend::layer_max_abs() const {
  const DeviceGuard on(device_);
  if (max_abs_read_.empty() || !max_abs_.get()) return {};
  std::vector<float> v(max_abs_read_.size());
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  DS_CUDA_CHECK(cudaMemcpy(v.data(), max_abs_.get(), v.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t l = 0; l < v.size(); ++l)
    if (!max_abs_read_[l]) v[l] = std::nanf("");
  return v;
}

void CudaBackend::decode_launches() {
  const int L = int(cfg_.layers);
  const int64_t E = cfg_.hidden;
  ForwardOps ops(*this);
  fwd::Plan plan;
  plan.from_layer = first_;  // a later block of a layer split: the step's row of Stream(first_) came from the previous
  plan.to_layer = end_layer();
  plan.lambda = last_lambda_.data();
  plan.hooks = hooks_.get();
  plan.edits = edits_.get();
  fwd::run_layers(cfg_, ops, plan);
  ops.finish();
  // Every layer's input row (and the last output) into hidden at the position, in one launch: rows L+1 of E f32
  // (a layer split's block: its own streams), the step's rows E apart, hidden's cap x E apart.
  const int end = end_layer();
  if (act_.host) {  // (host caches: to the host rows)
    hc_decode_rows(last_n_);
  } else timed_if(decode_profile_, "store_rows", L, [&] {
    DS_CUDA_CHECK(kern::launch_copy_rows(dec_->h.as<float>() + size_t(first_) * size_t(E), E * 4, act_.hidden.get(),
                                         act_.cap * E * 4, dec_->ctl.as<int32_t>() + 1, E * 4, end - first_ + 1, stream()));
  });
  if (end == L) fwd::logits(cfg_, ops, fwd::Rows::New);
}

}  // namespace ds::cuda
