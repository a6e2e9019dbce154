// The CUDA backend (backend_cuda_impl.h), its memory, caches and runs: weights on the device in bf16, the activations
// and caches sized per prompt, the f32 residual stream kept per layer so that a lambda change re-runs only from the
// first changed layer, run() and forward() driving the one forward (engine/core/forward.h) through the ops of
// backend_cuda_ops.cpp, and the profile. Its other rooms: backend_cuda_ops.cpp (the forward's operations, prompt and
// decoding step), backend_cuda_decode.cpp (the decoding step and its CUDA graph), backend_cuda_maps.cpp (the map
// queries), backend_cuda_gemm.cpp (cuBLASLt plans and autotuning), backend_cuda_upload.cpp (weights to the device).
// Attention takes the kernel kernels/attn_dispatch.h chooses for this device and shape: on Hopper the fused wgmma
// kernel for differential and plain heads alike (head_dim 64 or 128), elsewhere the mma.sync kernel for
// differential heads, and the generic kernel for everything else.
#include "engine/cuda/detail/backend_cuda_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "engine/core/env.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/layernorm.h"
#include "kernels/mamba_scan.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "engine/core/rope.h"

namespace ds {
namespace cuda {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kLogitsBudget = size_t(64) << 20;   // device bytes for one chunk of logits
constexpr size_t kReserve = size_t(768) << 20;       // cuBLAS workspace, maps, logits chunks, fragmentation
constexpr size_t kLtWorkspace = size_t(32) << 20;    // cuBLASLt workspace: room for its split-K kernels
constexpr int64_t kDecodeSpare = 512;  // positions a batch-1 run leaves room for, so that decoding rarely regrows

}  // namespace

// The overrides of the attention kernel choice (README, "Choosing the attention kernel"), read once here.
kern::AttnOptions attn_options_from_env() {
  kern::AttnOptions o;
  if (const char* e = std::getenv("DS_ATTN_KERNEL"); e && *e && !kern::parse_attn_impl(e, &o.impl))
    throw Error(std::string("DS_ATTN_KERNEL=") + e +
                ": unknown attention kernel; HINT: use auto, wgmma, mma-both, mma-vsplit, mma-lockstep or generic");
  if (const char* e = std::getenv("DS_ATTN_BN"); e && *e) {
    if (std::strcmp(e, "64") && std::strcmp(e, "128"))
      throw Error(std::string("DS_ATTN_BN=") + e + ": keys per tile must be 64 or 128");
    o.block_n = std::atoi(e);
  }
  if (const char* e = std::getenv("DS_ATTN_ORDER"); e && *e) {
    if (!std::strcmp(e, "head")) o.order = kern::CtaOrder::HeadMajor;
    else if (!std::strcmp(e, "tile")) o.order = kern::CtaOrder::TileMajor;
    else throw Error(std::string("DS_ATTN_ORDER=") + e + ": CTA order must be head or tile");
  }
  if (const char* e = std::getenv("DS_ATTN_FIXMAX"); e && *e) {
    if (std::strcmp(e, "0") && std::strcmp(e, "1"))
      throw Error(std::string("DS_ATTN_FIXMAX=") + e + ": must be 0 (the exact pass alone) or 1 (the default)");
    o.fixed_max = e[0] == '1';
  }
  o.quant_row_kernel = !env_switch("DS_ATTN_QUANT_ONE_KERNEL", false);
  return o;
}

CudaBackend::CudaBackend(int device) : device_(device) {
  int count = 0;
  DS_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) throw Error("CUDA: no CUDA device found");
  if (device < 0 || device >= count)
    throw Error("CUDA: device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                " device(s) found); HINT: pick a device index from 0 to " + std::to_string(count - 1));
  const DeviceGuard on(device_);
  cudaDeviceProp prop{};
  DS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  cudaStream_t st = nullptr;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  stream_.reset(st);
  cublasHandle_t bh = nullptr;
  DS_CUBLAS_CHECK(cublasCreate(&bh));
  blas_.reset(bh);
  DS_CUBLAS_CHECK(cublasSetStream(blas_.get(), stream()));
  cublasLtHandle_t lh = nullptr;
  DS_CUBLAS_CHECK(cublasLtCreate(&lh));
  lt_.reset(lh);
  lt_ws_ = DeviceBuffer(kLtWorkspace, "cuBLASLt workspace");
  autotune_ = env_switch("DS_GEMM_AUTOTUNE", true);
  decode_gemv_ = env_switch("DS_DECODE_GEMV", true);
  fused_swiglu_ = env_switch("DS_SWIGLU_FUSED", true);
  device_select_ = env_switch("DS_OUTLIER_DEVICE_SELECT", true);
  select_compact_ = env_switch("DS_OUTLIER_COMPACT", true);
  logit_pass_fused_ = env_switch("DS_OUTLIER_LOGITS_FUSED", true);
  initcheck_mark_ = env_switch("DS_CUDA_INITCHECK_MARK_GEMM", false);
  if (std::getenv("DS_HOST_CACHES")) host_caches_mode_ = env_switch("DS_HOST_CACHES", false) ? 1 : 0;
  attn_opt_ = attn_options_from_env();
  attn_dev_ = kern::query_attn_device(device_);
}

CudaBackend::~CudaBackend() {
  try {
    const DeviceGuard on(device_);
    if (stream_) cudaStreamSynchronize(stream());
    if (hc_.copy) cudaStreamSynchronize(hc_.copy.get());  // (the host caches' write-backs, before their memory goes)
    reset_model();
    act_ = Activations{};
    gemm_plans_.clear();
    lt_ws_.reset();
    events_.clear();
    lt_.reset();
    blas_.reset();
    stream_.reset();
  } catch (...) {  // a destructor must not throw; the owners below still release what they hold
  }
}

kern::AttnChoice CudaBackend::attn_choice(const kern::AttnParams& p) const {
  kern::AttnChoice c = kern::select_attn(attn_dev_, kern::attn_shape(p), attn_opt_);
  if (c.impl == kern::AttnImpl::None) throw Error("CUDA backend: " + c.why);
  return c;
}

std::string CudaBackend::name() const {
  std::string n = "CUDA: " + device_name_;
  if (attn_dev_.sm90a && attn_dev_.tma) n += " (sm_90a kernels)";
  if (act_.host) n += ", the layers' rows in host memory";  // (host caches: the last prompt did not fit the GPU)
  return n;
}

void CudaBackend::sync() {
  const DeviceGuard on(device_);
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaBackend::reset_model() {
  dec_.reset();
  mamba_state_.reset();
  layers_.clear();
  embed_.reset();
  lm_head_.reset();
  final_norm_.reset();
  final_norm_b_.reset();
  inv_freq_.reset();
  qkv_slot_.clear();
  lm_head_ptr_ = nullptr;
  weight_bytes_ = 0;
  loaded_ = false;
  has_run_ = false;
  if (hc_.copy) cudaStreamSynchronize(hc_.copy.get());  // (host caches: no write-back in flight)
  act_ = Activations{};
  logits_.reset();
  xf_.reset();
  map_buf_.reset();
  map_stats_.reset();
  view_buf_.reset();
  stats_sum_.reset();
  head_ns_.reset();
}

// ---------------------------------------------------------------------------------------------------------------
// loading

namespace {

// Refuses, before any upload, a model that no attention kernel (or a forced one) can run on this device.
void check_supported(const ModelConfig& c, const kern::AttnDevice& dev, const kern::AttnOptions& opt) {
  kern::AttnShape shape;
  shape.d = int(c.head_dim);
  shape.heads = int(c.heads);
  shape.kv_heads = int(c.kv_heads);
  shape.diff = c.is_diff();
  shape.n = 1;
  const kern::AttnChoice choice = kern::select_attn(dev, shape, opt);
  if (choice.impl == kern::AttnImpl::None) throw Error("CUDA backend: " + choice.why + "; HINT: run with --backend cpu");
}

void upload_f32(const std::vector<float>& v, DeviceBuffer& dst, const char* what, cudaStream_t s) {
  dst = DeviceBuffer(v.size() * sizeof(float), what);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  DS_CUDA_CHECK(cudaStreamSynchronize(s));  // v may die after return
}

// dst = src (f32 on the device) rounded to bf16, through the bias kernel on zeros; nothing for an empty src.
void bf16_copy(const DeviceBuffer& src, DeviceBuffer& dst, cudaStream_t s) {
  if (!src.get()) return;
  const int64_t count = int64_t(src.bytes() / sizeof(float));
  dst = DeviceBuffer(size_t(count) * 2, "weights");
  DS_CUDA_CHECK(cudaMemsetAsync(dst.get(), 0, dst.bytes(), s));
  DS_CUDA_CHECK(kern::launch_add_bias(dst.as<bf16>(), count, src.as<float>(), 1, int(count), s));
}

}  // namespace

void CudaBackend::load(const Model& model, const ProgressFn& progress) {
  const DeviceGuard on(device_);
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  reset_model();
  const ModelConfig& c = model.cfg;
  check_supported(c, attn_dev_, attn_opt_);
  const int64_t E = c.hidden, d = c.head_dim, H = c.heads, Hkv = c.kv_heads, I = c.intermediate;
  // bf16 bytes of everything we keep (norms are f32 but tiny)
  // bf16 bytes of the parameters (the f32 norms, biases and Mamba vectors are a rounding error of this)
  cfg_ = c;  // (end_layer() reads the layer count)
  const int first = first_, end = end_layer();
  if (first >= end || end > int(c.layers)) throw Error("internal: layer range " + std::to_string(first) + ".." + std::to_string(end));
  // A block of a layer split holds its share (ModelConfig::block_params).
  size_t need = size_t(2 * c.block_params(first, end));
  size_t free_b = 0, total_b = 0;
  DS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (mem_limit_ > 0 && need + kReserve > mem_limit_)
    throw Error("CUDA: " + std::string(c.layers == end - first ? "the model" : "this block of layers") + " needs " +
                gib(need) + " of GPU memory as bf16, more than the " + gib(mem_limit_) +
                " --gpu-mem-limit allows on " + device_name_ + "; HINT: more devices (--backend cuda:all) or a higher limit");
  if (need + kReserve > free_b)
    throw Error("CUDA: the model needs " + gib(need) + " of GPU memory as bf16 but only " + gib(free_b) + " of " +
                gib(total_b) + " are free on " + device_name_ + "; HINT: run with --backend cpu or close other GPU programs");
  const size_t free_before = free_b;
  WeightUploader up(stream(), progress, need);
  cfg_ = c;
  layers_.resize(size_t(c.layers));
  auto bf16_of = [&](const TensorInfo* t, DeviceBuffer& dst) {  // as stored, or absent
    if (!t) return;
    dst = DeviceBuffer(size_t(t->numel()) * 2, "weights");
    up.to_bf16(*t, dst.as<bf16>());
  };
  // The engine is a bf16 model: SambaY's small parameters (norms, biases, conv, dt bias, D), kept f32 on the
  // device, carry bf16 values as the published model's do when it runs in bf16 (docs/models/phi4flash.md section
  // 8); the other families' norm weights stay as stored. A_log and the lambda vectors stay f32 (the shards' dtype).
  const bool bf16_values = c.spec().schedule == Schedule::SambaY;
  auto rounded = [&](std::vector<float> v) {
    if (bf16_values)
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
  };
  auto f32_of = [&](const TensorInfo* t, DeviceBuffer& dst) {
    if (t) upload_f32(rounded(tensor_to_f32(*t)), dst, "weights", stream());
  };
  for (int64_t l = first; l < end; ++l) {
    const LayerTensors& t = model.layers[size_t(l)];
    LayerWeights& w = layers_[size_t(l)];
    if (c.has_maps(l)) {
      const bool cross = c.kind(l) == LayerKind::CrossAttention;  // q rows only: K and V are kv_source's
      w.qkv = DeviceBuffer(size_t((cross ? H : H + 2 * Hkv) * d * E) * 2, "weights");
      w.o = DeviceBuffer(size_t(E * H * d) * 2, "weights");
      std::vector<float> bias;  // [q | k | v] biases in the kernels' layout, where the family has them
      // q/k/v/o in the layout the kernels compute with (arch.h): streamed as stored, or transformed on the host
      for (auto [which, dst] : {std::pair{LayerWeight::Q, w.qkv.as<bf16>()}, std::pair{LayerWeight::K, w.qkv.as<bf16>() + H * d * E},
                                std::pair{LayerWeight::V, w.qkv.as<bf16>() + (H + Hkv) * d * E},
                                std::pair{LayerWeight::O, w.o.as<bf16>()}}) {
        if (cross && (which == LayerWeight::K || which == LayerWeight::V)) continue;
        const TensorInfo& ti = *model.layer_tensor(l, which);
        if (model.weight_transformed(which)) {
          up.to_bf16(model.layer_weight_f32(l, which), dst, ti.name);
        } else {
          up.to_bf16(ti, dst);
        }
        const std::vector<float> b = rounded(model.layer_bias_f32(l, which));
        if (which == LayerWeight::O) {
          if (!b.empty()) upload_f32(b, w.o_b, "weights", stream());
        } else {
          bias.insert(bias.end(), b.begin(), b.end());
        }
      }
      if (!bias.empty()) upload_f32(bias, w.qkv_b, "weights", stream());
      bf16_copy(w.qkv_b, w.qkv_b16, stream());
    }
    if (t.act_w) {
      std::vector<float> wb = tensor_to_f32(*t.act_w);
      wb.push_back(tensor_to_f32(*t.act_b).at(0));
      upload_f32(wb, w.act, "weights", stream());
    }
    if (t.gate_up) {  // stored fused, gate rows first: the layout the kernels use
      bf16_of(t.gate_up, w.gate_up);
    } else {
      w.gate_up = DeviceBuffer(size_t(2 * I * E) * 2, "weights");
      up.to_bf16(*t.gate, w.gate_up.as<bf16>());
      up.to_bf16(*t.up, w.gate_up.as<bf16>() + I * E);
    }
    bf16_of(t.down, w.down);
    f32_of(t.ln1, w.ln1);
    f32_of(t.ln2, w.ln2);
    f32_of(t.ln1_b, w.ln1_b);
    f32_of(t.ln2_b, w.ln2_b);
    bf16_of(t.in_proj, w.in_proj);
    bf16_of(t.x_proj, w.x_proj);
    bf16_of(t.dt_w, w.dt_w);
    bf16_of(t.out_proj, w.out_proj);
    f32_of(t.conv_w, w.conv_w);
    f32_of(t.conv_b, w.conv_b);
    f32_of(t.dt_b, w.dt_b);
    f32_of(t.d_skip, w.d_skip);
    if (t.a_log) {  // A = -exp(A_log), in f32 as the published code computes it
      std::vector<float> a = tensor_to_f32(*t.a_log);
      for (float& v : a) v = -std::exp(v);
      upload_f32(a, w.a_neg, "weights", stream());
    }
  }
  const bool tied = !model.lm_head || model.lm_head == model.embed;
  if (first == 0 || (tied && end == int(c.layers))) {
    embed_ = DeviceBuffer(size_t(c.vocab * E) * 2, "weights");
    up.to_bf16(*model.embed, embed_.as<bf16>());
  }
  if (end == int(c.layers) && !tied) {
    lm_head_ = DeviceBuffer(size_t(c.vocab * E) * 2, "weights");
    up.to_bf16(*model.lm_head, lm_head_.as<bf16>());
    lm_head_ptr_ = lm_head_.as<bf16>();
  } else {
    lm_head_ptr_ = embed_.as<bf16>();
  }
  if (end == int(c.layers)) {
    f32_of(model.final_norm, final_norm_);
    f32_of(model.final_norm_b, final_norm_b_);
  }
  if (c.spec().rotary) upload_f32(rope_inv_freq(c), inv_freq_, "weights", stream());
  assign_qkv_slots();
  up.finish();
  weight_bytes_ = need;
  {
    size_t f = 0, t = 0;
    DS_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    held_after_load_ = free_before > f ? free_before - f : need;
  }
  loaded_ = true;
}

void CudaBackend::load_random(const ModelConfig& c, uint64_t seed) {
  const DeviceGuard on(device_);
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  reset_model();
  check_supported(c, attn_dev_, attn_opt_);
  cfg_ = c;
  const int64_t E = c.hidden, d = c.head_dim, H = c.heads, Hkv = c.kv_heads, I = c.intermediate;
  const float amp = 0.02f * std::sqrt(3.f);  // uniform with std 0.02, transformers' initializer_range
  auto rnd = [&](DeviceBuffer& b, int64_t count) {
    b = DeviceBuffer(size_t(count) * 2, "weights");
    DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(b.as<bf16>(), count, seed++, amp, stream()));
    weight_bytes_ += size_t(count) * 2;
  };
  auto ones = [&](DeviceBuffer& b, int64_t count) {
    b = DeviceBuffer(size_t(count) * 4, "weights");
    DS_CUDA_CHECK(kern::launch_fill_f32(b.as<float>(), count, 1.f, stream()));
  };
  auto constant = [&](DeviceBuffer& b, int64_t count, float v) {
    b = DeviceBuffer(size_t(count) * 4, "weights");
    DS_CUDA_CHECK(kern::launch_fill_f32(b.as<float>(), count, v, stream()));
  };
  const bool ln = c.spec().norm == NormKind::LayerNorm, bias = c.spec().attn_bias;
  const int64_t di = c.d_inner, R = c.dt_rank, S = c.d_state;
  layers_.resize(size_t(c.layers));
  for (int64_t l = 0; l < c.layers; ++l) {
    LayerWeights& w = layers_[size_t(l)];
    const LayerKind kind = c.kind(l);
    if (c.has_maps(l)) {
      const int64_t rows = (kind == LayerKind::CrossAttention ? H : H + 2 * Hkv) * d;
      rnd(w.qkv, rows * E);
      rnd(w.o, E * H * d);
      if (bias) constant(w.qkv_b, rows, 0.01f), constant(w.o_b, E, 0.01f), bf16_copy(w.qkv_b, w.qkv_b16, stream());
    } else if (kind == LayerKind::Gmu) {
      rnd(w.in_proj, di * E);
      rnd(w.out_proj, E * di);
    } else {  // Mamba-1 with the published initialisation's typical values for its per-channel vectors
      rnd(w.in_proj, 2 * di * E);
      rnd(w.x_proj, (R + 2 * S) * di);
      rnd(w.dt_w, di * R);
      rnd(w.out_proj, E * di);
      constant(w.conv_w, di * c.d_conv, 0.25f);
      constant(w.conv_b, di, 0.f);
      constant(w.dt_b, di, -4.f);  // softplus(-4) = 0.018: dt inside the initialisation's [0.001, 0.1]
      constant(w.a_neg, di * S, -1.f);
      constant(w.d_skip, di, 1.f);
    }
    rnd(w.gate_up, 2 * I * E);
    rnd(w.down, E * I);
    ones(w.ln1, E);
    ones(w.ln2, E);
    if (ln) constant(w.ln1_b, E, 0.f), constant(w.ln2_b, E, 0.f);
    if (c.spec().mlp == MlpAct::PolyNorm) upload_f32({1.f / 3, 1.f / 3, 1.f / 3, 0.f}, w.act, "weights", stream());
  }
  rnd(embed_, c.vocab * E);
  if (c.tie_embeddings) {
    lm_head_ptr_ = embed_.as<bf16>();
  } else {
    rnd(lm_head_, c.vocab * E);
    lm_head_ptr_ = lm_head_.as<bf16>();
  }
  ones(final_norm_, E);
  if (ln) constant(final_norm_b_, E, 0.f);
  if (c.spec().rotary) upload_f32(rope_inv_freq(c), inv_freq_, "weights", stream());
  assign_qkv_slots();
  sync();
  loaded_ = true;
}

// ---------------------------------------------------------------------------------------------------------------
// memory

void CudaBackend::assign_qkv_slots() {
  qkv_slot_.assign(size_t(cfg_.layers), -1);
  mamba_slot_.assign(size_t(cfg_.layers), -1);
  int next = 0, mamba = 0;
  for (int64_t l = first_; l < end_layer(); ++l) {
    if (cfg_.has_maps(l)) qkv_slot_[size_t(l)] = next++;
    const LayerKind k = cfg_.kind(l);
    if (k == LayerKind::Mamba || k == LayerKind::Memory) mamba_slot_[size_t(l)] = mamba++;
  }
  qkv_slots_ = next;
  dec_.reset();
  mamba_state_.reset();
  if (mamba > 0) mamba_state_ = DeviceBuffer(size_t(mamba) * mamba_state_bytes(cfg_), "Mamba layers' decoding state");
}

bf16* CudaBackend::conv_state(int layer) const {
  const int s = mamba_slot_.at(size_t(layer));
  if (s < 0) throw Error("internal: layer " + std::to_string(layer) + " has no Mamba state");
  return reinterpret_cast<bf16*>(mamba_state_.as<char>() + size_t(s) * mamba_state_bytes(cfg_));
}

float* CudaBackend::ssm_state(int layer) const {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(conv_state(layer)) + conv_state_bytes(cfg_));
}

bf16* CudaBackend::qkv_slot(int layer) const {
  const int s = qkv_slot_.at(size_t(layer));
  if (s < 0) throw Error(cfg_.no_attention(layer, "queries or keys"));
  // (host caches: the layer's device slot, which holds its rows while it runs or once page_qkv brought them)
  return act_.qkv_cache.as<bf16>() + size_t(act_.host ? s & 1 : s) * size_t(act_.cap) * size_t(qkv_width());
}

namespace {
// Bytes per token of scratch32: the MLP's gate/up output [2I] bf16 and the down GEMM's timing output [E] f32, and
// SambaY's in_proj output [x | z] (2 di bf16) with dt after it (di bf16).
size_t scratch32_per_token(const ModelConfig& c) {
  return std::max({size_t(c.intermediate) * 4, size_t(c.hidden) * 4, size_t(c.d_inner) * 6});
}
}  // namespace

size_t CudaBackend::bytes_per_token(bool host) const {
  const size_t E = size_t(cfg_.hidden), W = size_t(qkv_width());
  const size_t I = size_t(cfg_.intermediate), Hd = size_t(cfg_.heads * cfg_.head_dim);
  // (host caches: two stream slots and two Q/K/V slots on the device)
  const size_t L = host ? 1 : size_t(end_layer() - first_);
  const size_t attn_layers = host ? std::min<size_t>(2, size_t(qkv_slots_)) : size_t(qkv_slots_), di = size_t(cfg_.d_inner);
  size_t ssm = 0;  // SambaY: ssm and memory [di] bf16, xdbl [R + 2S] bf16, the scan's workspace per token
  if (di) {
    kern::ScanParams sp;
    sp.n = int64_t(1) << 16;
    sp.channels = int(di);
    sp.state = int(cfg_.d_state);
    ssm = di * 2 * 2 + size_t(cfg_.dt_rank + 2 * cfg_.d_state) * 2 + kern::selective_scan_workspace(sp) / size_t(sp.n) + 1;
  }
  return (L + 1) * E * 4 + attn_layers * W * 2 + scratch32_per_token(cfg_) + E * 2 + Hd * 2 + std::max(I, di) * 2 + 4 +
         size_t(cfg_.head_dim / 2) * 8 + ssm;
}

int64_t CudaBackend::device_memory_used() const {
  const DeviceGuard on(device_);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
  return int64_t(total_b - free_b);
}

int64_t CudaBackend::tokens_held(bool host) const {
  const DeviceGuard on(device_);
  if (!loaded_) return 0;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  size_t avail = free_b + act_.bytes() + outlier_compact_.bytes();
  // Under --gpu-mem-limit: what the limit leaves after the load (as a card of that size would)
  if (mem_limit_ > 0) avail = std::min(avail, mem_limit_ > held_after_load_ ? mem_limit_ - held_after_load_ : 0);
  if (avail <= kReserve) return 0;
  const int64_t device = int64_t((avail - kReserve) / bytes_per_token(host));
  return host ? std::min(device, host_tokens()) : device;
}

int64_t CudaBackend::max_tokens() const {
  if (!host_caches_possible()) return tokens_held(false);
  return host_caches_mode_ == 1 ? tokens_held(true) : std::max(tokens_held(false), tokens_held(true));
}

bool CudaBackend::has_spare(size_t bytes) const {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (mem_limit_ > 0 && held_after_load_ + act_.bytes() + bytes + kReserve > mem_limit_) return false;
  return free_b > bytes + kReserve;
}

void CudaBackend::ensure_activations(int64_t T, int64_t n, int64_t spare) {
  if (act_.cap >= T && act_.cap_n >= n) return;
  const int64_t old_cap = act_.cap, old_cap_n = act_.cap_n;
  if (hc_.copy) DS_CUDA_CHECK(cudaStreamSynchronize(hc_.copy.get()));  // (host caches: no write-back in flight)
  act_ = Activations{};  // free first: the new set may need the room
  outlier_compact_ = DeviceBuffer{};
  has_run_ = false;
  ++act_gen_;
  rope_n_ = 0;
  // Host caches where the device alone cannot hold the prompt (or DS_HOST_CACHES=1)
  const bool host = host_caches_possible() && (host_caches_mode_ == 1 || std::max(T, old_cap) > tokens_held(false));
  // Room for `spare` more positions (a single sequence that may be decoded further) where memory allows.
  const int64_t room = std::max<int64_t>(0, std::min(spare, tokens_held(host) - T));
  make_activations(act_, std::max(T + room, old_cap), std::max(n + room, old_cap_n), host);
  hc_.stream_res[0] = hc_.stream_res[1] = hc_.qkv_res[0] = hc_.qkv_res[1] = -1;
}

void CudaBackend::make_activations(Activations& a, int64_t cap, int64_t cap_n, bool host) const {
  const size_t E = size_t(cfg_.hidden), L = size_t(end_layer() - first_), W = size_t(qkv_width());
  const size_t I = size_t(cfg_.intermediate), Hd = size_t(cfg_.heads * cfg_.head_dim), C = size_t(cap);
  const char* what = "activations (hint: the prompt length sets their size)";
  if (host) {  // two device slots of each; every layer's rows in pinned host memory
    a.hidden = DeviceBuffer(2 * C * E * 4, what);
    a.qkv_cache = DeviceBuffer(std::min<size_t>(2, size_t(qkv_slots_)) * C * W * 2, what);
    a.host_hidden = HostCacheBuffer((L + 1) * C * E * 4);
    a.host_qkv = HostCacheBuffer(size_t(qkv_slots_) * C * W * 2);
    a.host = true;
  } else {
    a.hidden = DeviceBuffer((L + 1) * C * E * 4, what);  // Stream(first_) .. Stream(end_layer())
    a.qkv_cache = DeviceBuffer(size_t(qkv_slots_) * C * W * 2, what);
  }
  a.scratch32 = DeviceBuffer(C * scratch32_per_token(cfg_), what);
  if (cfg_.d_inner > 0) {  // SambaY
    const size_t di = size_t(cfg_.d_inner);
    a.ssm = DeviceBuffer(C * di * 2, what);
    a.memory = DeviceBuffer(C * di * 2, what);
    a.xdbl = DeviceBuffer(C * size_t(cfg_.dt_rank + 2 * cfg_.d_state) * 2, what);
    kern::ScanParams sp;
    sp.n = int64_t(C);
    sp.channels = int(cfg_.d_inner);
    sp.state = int(cfg_.d_state);
    a.scan_ws = DeviceBuffer(std::max<size_t>(kern::selective_scan_workspace(sp), 16), what);
  }
  a.x = DeviceBuffer(C * E * 2, what);
  a.attn = DeviceBuffer(C * Hd * 2, what);
  a.act = DeviceBuffer(C * std::max(I, size_t(cfg_.d_inner)) * 2, what);  // SwiGLU's output, or Mamba's u
  a.ids = DeviceBuffer(C * 4, what);
  a.cos_sin = DeviceBuffer(size_t(cap_n) * size_t(cfg_.head_dim / 2) * 8, what);
  a.cap = cap;
  a.cap_n = cap_n;
}

void CudaBackend::ensure_logits(int64_t rows) {
  const size_t need = size_t(rows) * size_t(cfg_.vocab) * 4;
  if (logits_.bytes() < need) logits_ = DeviceBuffer(need, "logits");
  const size_t needx = size_t(rows) * size_t(cfg_.hidden) * 2;
  if (xf_.bytes() < needx) xf_ = DeviceBuffer(needx, "logits");
}

// ---------------------------------------------------------------------------------------------------------------
// forward

size_t CudaBackend::next_event() {
  if (events_used_ == events_.size()) events_.emplace_back();
  return events_used_++;
}

namespace {

// The attention kernels' view of the fused [q | k | v] projection rows of one layer: [batch][n][W], W = (H + 2 Hkv) d.
kern::AttnParams attn_params(const ModelConfig& c, const bf16* qkv, int64_t n, int batch, float lambda) {
  const int64_t H = c.heads, Hkv = c.kv_heads, d = c.head_dim, W = (H + 2 * Hkv) * d;
  kern::AttnParams p;
  p.qkv = qkv;
  p.row_stride = W;
  p.batch_stride = n * W;
  p.q_off = 0;
  p.k_off = H * d;
  p.v_off = (H + Hkv) * d;
  p.n = int(n);
  p.batch = batch;
  p.heads = int(H);
  p.kv_heads = int(Hkv);
  p.d = int(d);
  p.diff = c.is_diff();
  p.scale = float(1.0 / std::sqrt(double(d)));
  p.lambda = lambda;
  return p;
}

}  // namespace

kern::AttnParams CudaBackend::layer_attn(int layer, int64_t n, int batch, float lambda) const {
  kern::AttnParams p = attn_params(cfg_, qkv_slot(layer), n, batch, lambda);
  const int kl = int(cfg_.kv_layer(layer));
  if (kl != layer) p.kv = qkv_slot(kl);  // cross-attention: the keys and values the kv_source layer cached
  p.window = int(cfg_.layer_window(layer));
  if (edits_ && size_t(layer) < edits_->size()) {  // the forward's edits of this layer (forward.h AttnEdit)
    if (p.diff && size_t(layer) < has_coef_.size() && has_coef_[size_t(layer)])
      p.head_coef = head_coef_.as<float2>() + size_t(layer) * size_t(view_heads());
    p.logit_bits = (*edits_)[size_t(layer)].logit_bits;
    const std::vector<fwd::KeySpan>& ko = (*edits_)[size_t(layer)].knockout;
    if (ko.size() > size_t(kern::AttnParams::kMaxKnockouts))
      throw Error("layer " + std::to_string(layer) + ": at most " + std::to_string(kern::AttnParams::kMaxKnockouts) +
                  " knockouts a layer on the CUDA backend (" + std::to_string(ko.size()) + " given)");
    auto pos = [](int64_t x) { return int(std::clamp<int64_t>(x, 0, INT32_MAX)); };
    p.nko = int(ko.size());
    for (size_t i = 0; i < ko.size(); ++i) p.ko[i] = make_int4(pos(ko[i].q0), pos(ko[i].q1), pos(ko[i].k0), pos(ko[i].k1));
  }
  return p;
}

void CudaBackend::upload_head_coefs(const std::vector<float>& lambda) {
  const int L = int(cfg_.layers), Hv = view_heads();
  has_coef_.assign(size_t(L), 0);
  if (!edits_ || !cfg_.is_diff()) return;
  std::vector<float> host(size_t(L) * size_t(Hv) * 2, 0.f);
  bool any = false;
  for (int l = 0; l < L && size_t(l) < edits_->size(); ++l) {
    const std::vector<float> c = fwd::head_coefs(&(*edits_)[size_t(l)], lambda.at(size_t(l)), Hv);
    if (c.empty()) continue;
    std::copy(c.begin(), c.end(), host.begin() + size_t(l) * size_t(Hv) * 2);
    has_coef_[size_t(l)] = 1;
    any = true;
  }
  if (!any || host == head_coef_host_) return;
  if (head_coef_.bytes() < host.size() * 4) head_coef_ = DeviceBuffer(host.size() * 4, "head coefficients");
  // In stream order: the launches of earlier forwards still queued read the old values first, and no wait (the
  // pageable source is staged before the call returns)
  DS_CUDA_CHECK(cudaMemcpyAsync(head_coef_.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream()));
  head_coef_host_ = std::move(host);
}

void CudaBackend::block_norm(const float* x, int64_t x_stride, const DeviceBuffer& w, const DeviceBuffer& b, bf16* y,
                             int64_t rows) {
  const int64_t E = cfg_.hidden;
  const float eps = float(cfg_.norm_eps);
  if (cfg_.spec().norm == NormKind::LayerNorm)
    DS_CUDA_CHECK(kern::launch_layernorm(x, x_stride, w.as<float>(), b.as<float>(), y, E, rows, int(E), eps, stream()));
  else
    DS_CUDA_CHECK(kern::launch_rmsnorm(x, x_stride, w.as<float>(), y, E, rows, int(E), eps, stream()));
}

void CudaBackend::run(const int32_t* ids, int batch, int64_t n, const std::vector<float>& lambda, int from_layer,
                      bool want_logits, bool last_rows_only) {
  const DeviceGuard on(device_);
  if (!loaded_) throw Error("CUDA backend: no model loaded");
  const int L = int(cfg_.layers);
  const int64_t T = int64_t(batch) * n;
  std::vector<float> lam(size_t(L), 0.f);
  if (cfg_.is_diff()) {
    if (lambda.size() != size_t(L))
      throw Error("CUDA backend: " + std::to_string(lambda.size()) + " lambda values for " + std::to_string(L) +
                  " layers");
    lam = lambda;
  }
  const int first = first_, end = end_layer();
  bool reuse = from_layer > first && has_run_ && last_batch_ == batch && last_n_ == n && act_.cap >= T &&
               last_ids_.size() == size_t(T) && std::equal(last_ids_.begin(), last_ids_.end(), ids);
  int from = reuse ? std::min(from_layer, end) : first;
  // A rows-only run left the last layer's output with one row per sequence: a caller wanting every row redoes it.
  // After truncate() the last row's output may be from an older lambda: the last layer runs again.
  if (from == end && end == L && ((partial_last_layer_ && !last_rows_only) || last_row_stale_)) from = L - 1;
  if (first > 0 && from == first && !stream_in_)
    throw Error("internal: layers " + std::to_string(first) + ".. of a layer split run without their input stream");
  ensure_activations(T, n, batch == 1 ? kDecodeSpare : 0);
  if (act_.host) hc_run_start(from, T);
  // A kept attention output holds while its layer's input does (no layer below it runs, the same ids)
  if (kept_.valid && (!reuse || from < kept_.layer || kept_.gen != act_gen_)) kept_.valid = false;
  run_from_ = from;
  if (!head_ns_.get() || head_ns_.bytes() < size_t(L) * size_t(view_heads()) * 8)
    head_ns_ = DeviceBuffer(size_t(L) * size_t(view_heads()) * 8, "profiling counters");
  events_used_ = 0;
  marks_.clear();
  has_run_ = false;  // until this run completes
  if (profiling_) DS_CUDA_CHECK(cudaMemsetAsync(head_ns_.get(), 0, head_ns_.bytes(), stream()));
  if (from == first) {
    DS_CUDA_CHECK(cudaMemcpyAsync(act_.ids.get(), ids, size_t(T) * 4, cudaMemcpyHostToDevice, stream()));
    if (first > 0) {  // the previous block's output: a peer copy from its GPU, or from the host
      timed("handoff", first, [&] { copy_stream_in(stream_ptr(first), size_t(T) * size_t(cfg_.hidden) * 4); });
      // The previous block may run again (bulk re-runs queue forwards without waiting) and rewrite those rows: the
      // copy is done before this call returns.
      DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    if (cfg_.spec().rotary)
      timed("rope_table", -1, [&] {
        DS_CUDA_CHECK(kern::launch_rope_table(inv_freq_.as<float>(), int(n), int(cfg_.head_dim / 2),
                                              act_.cos_sin.as<float2>(), stream()));
      });
    rope_n_ = n;
    last_ids_.assign(ids, ids + T);
  }
  // The readers' slots of the layers that run start over.
  if (hooks_ && !hooks_->empty()) {
    if (!max_abs_.get()) max_abs_ = DeviceBuffer(size_t(L) * 4, "hook readers' slots");
    if (max_abs_read_.size() != size_t(L) || from == first) max_abs_read_.assign(size_t(L), 0);
    if (from < end)
      DS_CUDA_CHECK(cudaMemsetAsync(max_abs_.as<float>() + from, 0, size_t(end - from) * 4, stream()));
    for (int l = from; l < end; ++l) max_abs_read_[size_t(l)] = 0;
  } else {
    max_abs_read_.clear();
  }
  upload_head_coefs(lam);
  const fwd::Plan rows_plan{from, last_rows_only, nullptr, hooks_.get()};
  run_layers(batch, n, lam, from, last_rows_only && end == L, false);
  if (from < end && end == L) partial_last_layer_ = fwd::last_rows_only(rows_plan), last_row_stale_ = false;
  if (want_logits && end == L) final_logits(batch, n);
  last_batch_ = batch;
  last_n_ = n;
  last_lambda_ = lam;
  has_run_ = true;
}

void CudaBackend::run_gemms_only(int batch, int64_t n, bool last_rows_only) {
  const DeviceGuard on(device_);
  const int L = int(cfg_.layers);
  if (!loaded_ || int64_t(batch) * n > act_.cap) throw Error("run_gemms_only: run() this batch and n first");
  has_run_ = false;  // the activations are overwritten with what the GEMMs make of them: no maps from them
  marks_.clear();
  events_used_ = 0;
  run_layers(batch, n, std::vector<float>(size_t(L), 0.f), 0, last_rows_only, true);
  gemm("gemm_lm_head", L, {.out_f = cfg_.vocab, .tokens = batch, .in_f = cfg_.hidden, .w = lm_head_ptr_,
                           .x = xf_.as<bf16>(), .y = logits_.get(), .y_f32 = true});
}

void CudaBackend::forward(const ForwardRequest& req, ForwardResult& out) {
  const DeviceGuard on(device_);
  const auto t0 = Clock::now();
  if (!loaded_) throw Error("CUDA backend: no model loaded");
  const int64_t n = int64_t(req.ids.size());
  const int L = int(cfg_.layers);
  if (n == 0) throw Error("empty prompt: nothing to run");
  hooks_ = req.hooks && !req.hooks->empty() ? req.hooks : nullptr;
  edits_ = req.edits;
  keep_req_ = req.keep_attention;
  stream_in_ = req.stream_in;
  stream_in_device_ = req.stream_in_device;
  const bool has_head = end_layer() == L;  // this backend computes the logits (not an earlier block of a split)
  // (a decoding step checks its new ids only: the others ran already)
  for (size_t i = size_t(std::clamp<int64_t>(req.append_from, 0, n)); i < req.ids.size(); ++i)
    if (req.ids[i] < 0 || req.ids[i] >= cfg_.vocab)
      throw Error("token id " + std::to_string(req.ids[i]) + " at position " + std::to_string(i) +
                  " is outside the vocabulary (size " + std::to_string(cfg_.vocab) + ")");
  if (req.append_from > 0) {  // decoding: the new positions one at a time over the caches
    if (req.from_layer != 0 || !has_run_ || last_batch_ != 1 || req.append_from != last_n_ || n <= req.append_from ||
        !std::equal(last_ids_.begin(), last_ids_.end(), req.ids.begin()))
      throw Error("internal: a decoding step must extend the last forward's tokens");
    try {
      const std::vector<float> lam = cfg_.is_diff() ? req.lambda : last_lambda_;
      if (first_ > 0 && n - req.append_from != 1)
        throw Error("internal: a later block of a layer split decodes one position a call");
      for (int64_t i = req.append_from; i < n; ++i) decode_step(req.ids[size_t(i)], lam);
      out.n = n;
      out.logit_rows = has_head ? 1 : 0;
      out.argmax = -1;
      if (!has_head) {
        out.logits.clear();
      } else if (req.logits_on_demand) {  // the greedy choice made here: 8 bytes come back instead of the vocabulary
        out.logits.clear();
        out.argmax = device_argmax();
      } else {
        out.logits.resize(size_t(cfg_.vocab));
        copy_to_host({{out.logits.data(), logits_.get(), size_t(cfg_.vocab) * 4}});
      }
      out.maps.assign(size_t(L), LayerMaps{});
      out.hidden.clear();
    } catch (...) {
      has_run_ = false;
      cudaStreamSynchronize(stream());
      cudaGetLastError();
      throw;
    }
    out.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    // The profile of a step: its wall time (one CUDA graph; no per-kernel marks inside it).
    profile_ = Profile{};
    profile_.forward_ms = out.ms;
    profile_.tokens = n;
    profile_.peak_tflops = peak_tflops_;
    profile_.kernels.push_back({"decode_step", n - req.append_from, out.ms, out.ms, out.ms});
    return;
  }
  // A forward without a profile: profiling off for its launches, and the last profile kept
  struct ProfileOff {
    bool& on;
    const bool was;
    ~ProfileOff() { on = was; }
  } profile_off{profiling_, profiling_};
  if (!req.profile) profiling_ = false;
  const int64_t limit = max_tokens();
  if (n > limit) {
    const bool host = host_caches_possible();  // (the limit counts the host's memory too)
    throw Error("prompt of " + std::to_string(n) + " tokens is too long for " + device_name_ + ": at most " +
                std::to_string(limit) + " fit in its free memory" +
                (host ? " and the host's (the layers' rows in host memory)" : "") +
                " with this model; HINT: shorten the prompt" + (host ? "" : " or use --backend cpu"));
  }
  try {
    run(req.ids.data(), 1, n, req.lambda, req.from_layer, !req.all_logits,
        !req.all_logits && !req.keep_hidden && !req.all_rows);
    out.n = n;
    const int64_t V = cfg_.vocab;
    if (!has_head) {
      out.logit_rows = 0;
      out.logits.clear();
    } else if (req.all_logits) {
      out.logit_rows = n;
      out.logits.resize(size_t(n * V));
      const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, int64_t(kLogitsBudget / (size_t(V) * 4))));
      for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        const int64_t rows = std::min(chunk, n - r0);
        final_logits_rows(r0, rows);
        DS_CUDA_CHECK(cudaMemcpyAsync(out.logits.data() + r0 * V, logits_.get(), size_t(rows * V) * 4,
                                      cudaMemcpyDeviceToHost, stream()));
      }
    } else {
      out.logit_rows = 1;
      out.argmax = -1;
      if (req.logits_on_demand) {  // left on the device (fetch_logits, queue_logprob)
        out.logits.clear();
      } else {
        out.logits.resize(size_t(V));
        DS_CUDA_CHECK(
            cudaMemcpyAsync(out.logits.data(), logits_.get(), size_t(V) * 4, cudaMemcpyDeviceToHost, stream()));
      }
    }
    out.hidden.clear();
    if (req.keep_hidden) {
      const int64_t E = cfg_.hidden;
      out.hidden.resize(size_t(L + 1));
      if (act_.host) hc_wait_copies();
      for (int l = first_; l <= end_layer(); ++l) {  // a block of a layer split: its streams
        out.hidden[size_t(l)].resize(size_t(n * E));
        if (act_.host)
          std::memcpy(out.hidden[size_t(l)].data(), host_stream(l), size_t(n * E) * 4);
        else
          DS_CUDA_CHECK(cudaMemcpyAsync(out.hidden[size_t(l)].data(), stream_ptr(l), size_t(n * E) * 4,
                                        cudaMemcpyDeviceToHost, stream()));
      }
    }
    // Nothing waits for the work when nothing of it comes back now (logits on demand, no maps, no profile): the
    // next call queues behind it (a device error then surfaces at the next wait)
    const bool wants_maps = std::find(req.want_maps.begin(), req.want_maps.end(), uint8_t(1)) != req.want_maps.end();
    if (!(req.logits_on_demand && !req.all_logits && !req.keep_hidden && !profiling_ && !wants_maps)) sync();
    if (req.profile) build_profile(std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), n, 0, 1, n);
    out.maps.assign(size_t(L), LayerMaps{});
    for (int l = 0; l < L && size_t(l) < req.want_maps.size(); ++l)
      if (req.want_maps[size_t(l)] && owns(l)) compute_maps(l, &out.maps[size_t(l)], nullptr);
  } catch (...) {
    has_run_ = false;
    cudaStreamSynchronize(stream());
    cudaGetLastError();
    throw;
  }
  out.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------------------------
// profiling

void CudaBackend::build_profile(double wall_ms, int64_t tokens, int, int batch, int64_t n) {
  profile_ = Profile{};
  profile_.forward_ms = wall_ms;
  profile_.tokens = tokens;
  profile_.peak_tflops = peak_tflops_;
  if (!profiling_) return;
  std::map<std::string, KernelTiming> by_name;
  std::vector<double> attn_ms(size_t(cfg_.layers), 0.0);
  std::vector<uint8_t> ran(size_t(cfg_.layers), 0);
  for (const Mark& m : marks_) {
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[m.ev0].get(), events_[m.ev1].get()));
    KernelTiming& k = by_name[m.name];
    if (k.count == 0) {
      k.name = m.name;
      k.min_ms = ms;
      k.max_ms = ms;
    }
    k.count++;
    k.total_ms += ms;
    k.min_ms = std::min(k.min_ms, double(ms));
    k.max_ms = std::max(k.max_ms, double(ms));
    const std::string nm = m.name;
    if (m.layer >= 0 && m.layer < cfg_.layers && nm.find("attn") != std::string::npos && nm != "attn_maps") {
      attn_ms[size_t(m.layer)] += ms;
      ran[size_t(m.layer)] = 1;
    }
  }
  for (auto& [name, k] : by_name) profile_.kernels.push_back(k);
  std::sort(profile_.kernels.begin(), profile_.kernels.end(),
            [](const KernelTiming& a, const KernelTiming& b) { return a.total_ms > b.total_ms; });
  // Per head: the layer's measured kernel time shared out by the heads' summed block times (%globaltimer).
  const int Hv = view_heads(), L = int(cfg_.layers);
  std::vector<unsigned long long> ns(size_t(L) * size_t(Hv));
  DS_CUDA_CHECK(cudaMemcpy(ns.data(), head_ns_.get(), ns.size() * 8, cudaMemcpyDeviceToHost));
  for (int l = 0; l < L; ++l) {
    if (!ran[size_t(l)]) continue;
    const double flops = kern::attn_flops(cfg_.is_diff(), 1, cfg_.head_dim, n, batch, cfg_.layer_window(l));  // a head
    double total = 0;
    for (int h = 0; h < Hv; ++h) total += double(ns[size_t(l) * size_t(Hv) + size_t(h)]);
    for (int h = 0; h < Hv; ++h) {
      HeadTiming t;
      t.layer = l;
      t.head = h;
      t.ms = total > 0 ? attn_ms[size_t(l)] * double(ns[size_t(l) * size_t(Hv) + size_t(h)]) / total
                       : attn_ms[size_t(l)] / Hv;
      t.flops = flops;
      profile_.heads.push_back(t);
    }
  }
}

Profile CudaBackend::profile() const {
  Profile p = profile_;
  if (peak_tflops_ <= 0 && loaded_) {
    try {
      peak_tflops_ = const_cast<CudaBackend*>(this)->gemm_peak_tflops();
    } catch (const Error&) {
      peak_tflops_ = 0;
    }
  }
  p.peak_tflops = peak_tflops_;
  return p;
}

CudaBackend& as_cuda(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) throw Error("this operation needs the CUDA backend, not " + b.name());
  return *c;
}

}  // namespace cuda

// ---------------------------------------------------------------------------------------------------------------
// public entry points

bool cuda_backend_available(std::string* why_not, int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why_not) *why_not = std::string("no usable CUDA driver/device (") + cudaGetErrorString(e) + ")";
    return false;
  }
  if (count == 0) {
    if (why_not) *why_not = "no CUDA device found";
    return false;
  }
  if (device < 0 || device >= count) {
    if (why_not)
      *why_not = "there is no CUDA device " + std::to_string(device) + " (" + std::to_string(count) + " found)";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || prop.major < 8) {
    if (why_not)
      *why_not = "the CUDA backend needs compute capability 8.0 or newer; device " + std::to_string(device) + " (" + prop.name +
                 ") has " + std::to_string(prop.major) + "." + std::to_string(prop.minor);
    return false;
  }
  return true;
}

namespace cuda {
// ---------------------------------------------------------------------------------------------------------------
// a layer split's block

bool CudaBackend::set_layer_range(int first, int last) {
  if (loaded_) throw Error("internal: a layer range is set before the model is loaded");
  first_ = first;
  last_ = last;
  return true;
}

void CudaBackend::copy_stream_in(float* dst, size_t bytes) {
  if (stream_in_device_ >= 0 && stream_in_device_ != device_)
    DS_CUDA_CHECK(cudaMemcpyPeerAsync(dst, device_, stream_in_, stream_in_device_, bytes, stream()));
  else
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, stream_in_, bytes, cudaMemcpyDefault, stream()));
}

float* CudaBackend::stream_ptr(int l, int64_t row) const {
  if (l < first_ || l > end_layer()) throw Error("internal: stream " + std::to_string(l) + " is another block's");
  // (host caches: the stream's device slot, which holds it while the forward makes it or once page_stream brought it)
  const size_t at = act_.host ? size_t((l - first_) & 1) : size_t(l - first_);
  return act_.hidden.as<float>() + (at * size_t(act_.cap) + size_t(row)) * size_t(cfg_.hidden);
}

Backend::StreamRows CudaBackend::stream_rows(int l, int64_t r0) const {
  const DeviceGuard on(device_);
  if (act_.host) {  // host caches: the host rows themselves, once written
    hc_wait_copies();
    return {host_stream(l) + r0 * cfg_.hidden, -1};
  }
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));  // the forward that wrote them has finished
  return {stream_ptr(l, r0), device_};
}

void CudaBackend::write_stream(int l, int64_t r0, int64_t rows, const float* in) {
  const DeviceGuard on(device_);
  if (!has_run_ || r0 < 0 || r0 + rows > last_n_) throw Error("internal: write_stream outside the last forward");
  if (act_.host) {  // into the host rows; the slot that held the stream reads them again when asked
    hc_wait_copies();
    DS_CUDA_CHECK(cudaMemcpy(host_stream(l) + r0 * cfg_.hidden, in, size_t(rows) * size_t(cfg_.hidden) * 4, cudaMemcpyDefault));
    if (hc_.stream_res[(l - first_) & 1] == l) hc_.stream_res[(l - first_) & 1] = -1;
    return;
  }
  DS_CUDA_CHECK(cudaMemcpyAsync(stream_ptr(l, r0), in, size_t(rows) * size_t(cfg_.hidden) * 4, cudaMemcpyDefault, stream()));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream()));
}
void CudaBackend::read_stream(int l, int64_t r0, int64_t rows, float* out) {
  const DeviceGuard on(device_);
  if (!has_run_ || r0 < 0 || r0 + rows > last_n_) throw Error("internal: read_stream outside the last forward");
  if (act_.host) {
    hc_wait_copies();
    std::memcpy(out, host_stream(l) + r0 * cfg_.hidden, size_t(rows) * size_t(cfg_.hidden) * 4);
    return;
  }
  copy_to_host({{out, stream_ptr(l, r0), size_t(rows) * size_t(cfg_.hidden) * 4}});
}
}  // namespace cuda

int64_t cuda_free_memory(int device) {
  const cuda::DeviceGuard on(device);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return int64_t(free_b);
}

bool cuda_enable_peer(int a, int b) {
  if (a == b) return true;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
    cudaGetLastError();
    return false;
  }
  const cuda::DeviceGuard on(a);
  const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled || e == cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  cudaGetLastError();
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_backend_available(&why, device))
    throw Error("CUDA backend unavailable: " + why + "; HINT: run with --backend cpu");
  return std::make_unique<cuda::CudaBackend>(device);
}


void cuda_set_profiling(Backend& b, bool on) { cuda::as_cuda(b).set_profiling(on); }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  int usable = 0;
  for (int d = 0; d < count; ++d) usable += cuda_backend_available(nullptr, d);
  return usable;
}

DeviceFloats::~DeviceFloats() {
  if (!data) return;
  int before = 0;
  if (cudaGetDevice(&before) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
    cudaFree(data);
    cudaSetDevice(before);
  }
  cudaGetLastError();  // a failure here (a driver shutting down) has no one to tell
}

std::shared_ptr<DeviceFloats> cuda_device_floats(size_t count, int device) {
  std::string why;
  if (!cuda_backend_available(&why, device)) throw Error("device memory: " + why);
  const cuda::DeviceGuard on(device);
  auto m = std::make_shared<DeviceFloats>();
  m->device = device;
  m->count = count;
  if (cudaMalloc(&m->data, std::max<size_t>(1, count) * sizeof(float)) != cudaSuccess) {
    cudaGetLastError();
    m->data = nullptr;
    throw Error("out of GPU memory: " + std::to_string(count * sizeof(float) >> 20) + " MiB on GPU " +
                std::to_string(device) + " for the result (ask a smaller one, or device=False)");
  }
  return m;
}

}  // namespace ds
