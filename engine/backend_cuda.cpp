// The CUDA backend: weights on the device in bf16, cuBLASLt bf16 tensor-op GEMMs with f32 accumulation for every
// projection, the MLP and the lm_head, the kernels of kernels/ for the rest, and the f32 residual stream kept
// per layer on the device so a lambda change re-runs only from the first changed layer. The maps of a layer are
// recomputed on demand from the cached post-RoPE Q/K (never materialised during the forward).
//
// One layer (T tokens):
//   x = RMSNorm(hidden[l]) -> qkv32 = x Wqkv^T (f32) -> RoPE + bf16 -> qkv_cache[l] -> attention -> attn
//   hidden[l+1] = attn Wo^T + hidden[l]   (GEMM with C = hidden[l], D = hidden[l+1]: the residual add is the
//                                          epilogue's beta term, and the stream is never copied)
//   x = RMSNorm(hidden[l+1]) -> gu = x Wgu^T (bf16) -> act = silu(g) * u (bf16)
//   hidden[l+1] += act Wdown^T            (beta = 1, C = D)
// Attention takes the kernel kernels/attn_dispatch.h chooses for this device and shape: on Hopper the fused wgmma
// kernel for differential and plain heads alike (head_dim 64 or 128), elsewhere the mma.sync kernel for
// differential heads, and the generic kernel for everything else.
#include "backend_cuda_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "env.h"
#include "kernels/attn_fwd_generic.h"
#include "kernels/attn_maps.h"
#include "kernels/diff_attn_fwd.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fill.h"
#include "kernels/gemm_swiglu_sm90.h"
#include "kernels/layernorm.h"
#include "kernels/mamba_implicit.h"
#include "kernels/mamba_scan.h"
#include "kernels/polynorm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "rope.h"

namespace ds {
namespace cuda {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMapBudget = size_t(256) << 20;     // device bytes for one chunk of maps
constexpr size_t kLogitsBudget = size_t(64) << 20;   // device bytes for one chunk of logits
constexpr size_t kReserve = size_t(768) << 20;       // cuBLAS workspace, maps, logits chunks, fragmentation
constexpr size_t kLtWorkspace = size_t(32) << 20;    // cuBLASLt workspace: room for its split-K kernels
constexpr int64_t kDecodeSpare = 512;  // positions a batch-1 run leaves room for, so that decoding rarely regrows
constexpr int kGemmCandidates = 8;                   // heuristic candidates timed per GEMM shape

// One query row's statistics as the kernels write them (kernels/attn_maps.h, MAP_*), into the accumulator.
void add_row_stats(StatsAccumulator& acc, const float* st) {
  acc.add_terms(st[kern::MAP_ENTROPY1], st[kern::MAP_ENTROPY2], st[kern::MAP_ENTROPY_DIFF], st[kern::MAP_FIRST1],
                st[kern::MAP_FIRST2], st[kern::MAP_FIRST_DIFF], st[kern::MAP_NEG_MASS], st[kern::MAP_DIFF_MIN],
                st[kern::MAP_DIFF_MAX], st[kern::MAP_MAX_LOGIT1], st[kern::MAP_MAX_LOGIT2]);
}

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
  initcheck_mark_ = env_switch("DS_CUDA_INITCHECK_MARK_GEMM", false);
  attn_opt_ = attn_options_from_env();
  attn_dev_ = kern::query_attn_device(device_);
}

CudaBackend::~CudaBackend() {
  try {
    const DeviceGuard on(device_);
    if (stream_) cudaStreamSynchronize(stream());
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
  size_t need = size_t(c.params()) * 2;
  size_t free_b = 0, total_b = 0;
  DS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need + kReserve > free_b)
    throw Error("CUDA: the model needs " + gib(need) + " of GPU memory as bf16 but only " + gib(free_b) + " of " +
                gib(total_b) + " are free on " + device_name_ + "; HINT: run with --backend cpu or close other GPU programs");
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
  for (int64_t l = 0; l < c.layers; ++l) {
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
  embed_ = DeviceBuffer(size_t(c.vocab * E) * 2, "weights");
  up.to_bf16(*model.embed, embed_.as<bf16>());
  if (model.lm_head && model.lm_head != model.embed) {
    lm_head_ = DeviceBuffer(size_t(c.vocab * E) * 2, "weights");
    up.to_bf16(*model.lm_head, lm_head_.as<bf16>());
    lm_head_ptr_ = lm_head_.as<bf16>();
  } else {
    lm_head_ptr_ = embed_.as<bf16>();
  }
  f32_of(model.final_norm, final_norm_);
  f32_of(model.final_norm_b, final_norm_b_);
  if (c.spec().rotary) upload_f32(rope_inv_freq(c), inv_freq_, "weights", stream());
  assign_qkv_slots();
  up.finish();
  weight_bytes_ = need;
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
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    if (cfg_.has_maps(l)) qkv_slot_[size_t(l)] = next++;
    const LayerKind k = cfg_.kind(l);
    if (k == LayerKind::Mamba || k == LayerKind::Memory) mamba_slot_[size_t(l)] = mamba++;
  }
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
  return act_.qkv_cache.as<bf16>() + size_t(s) * size_t(act_.cap) * size_t(qkv_width());
}

namespace {
// Bytes per token of scratch32: the MLP's gate/up output [2I] bf16 and the down GEMM's timing output [E] f32, and
// SambaY's in_proj output [x | z] (2 di bf16) with dt after it (di bf16).
size_t scratch32_per_token(const ModelConfig& c) {
  return std::max({size_t(c.intermediate) * 4, size_t(c.hidden) * 4, size_t(c.d_inner) * 6});
}
}  // namespace

size_t CudaBackend::bytes_per_token() const {
  const size_t E = size_t(cfg_.hidden), L = size_t(cfg_.layers), W = size_t(qkv_width());
  const size_t I = size_t(cfg_.intermediate), Hd = size_t(cfg_.heads * cfg_.head_dim);
  const size_t attn_layers = cfg_.map_layers().size(), di = size_t(cfg_.d_inner);
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

int64_t CudaBackend::max_tokens() const {
  const DeviceGuard on(device_);
  if (!loaded_) return 0;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  const size_t avail = free_b + act_.bytes();
  if (avail <= kReserve) return 0;
  return int64_t((avail - kReserve) / bytes_per_token());
}

void CudaBackend::ensure_activations(int64_t T, int64_t n, int64_t spare) {
  if (act_.cap >= T && act_.cap_n >= n) return;
  const int64_t old_cap = act_.cap, old_cap_n = act_.cap_n;
  act_ = Activations{};  // free first: the new set may need the room
  has_run_ = false;
  ++act_gen_;
  rope_n_ = 0;
  // Room for `spare` more positions (a single sequence that may be decoded further) where memory allows.
  const int64_t room = std::max<int64_t>(0, std::min(spare, max_tokens() - T));
  make_activations(act_, std::max(T + room, old_cap), std::max(n + room, old_cap_n));
}

void CudaBackend::make_activations(Activations& a, int64_t cap, int64_t cap_n) const {
  const size_t E = size_t(cfg_.hidden), L = size_t(cfg_.layers), W = size_t(qkv_width());
  const size_t I = size_t(cfg_.intermediate), Hd = size_t(cfg_.heads * cfg_.head_dim), C = size_t(cap);
  const char* what = "activations (hint: the prompt length sets their size)";
  a.hidden = DeviceBuffer((L + 1) * C * E * 4, what);
  a.qkv_cache = DeviceBuffer(cfg_.map_layers().size() * C * W * 2, what);
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

GemmPlan::~GemmPlan() {
  if (d) cublasLtMatrixLayoutDestroy(d);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (op) cublasLtMatmulDescDestroy(op);
}

namespace {

// The largest power of two up to 256 that divides the address: what cuBLASLt's MIN_ALIGNMENT preferences mean.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

int64_t ld_x(const GemmArgs& g) { return g.ldx ? g.ldx : g.in_f; }
int64_t ld_y(const GemmArgs& g) { return g.ldy ? g.ldy : g.out_f; }
size_t elem_y(const GemmArgs& g) { return g.y_f32 ? 4 : 2; }
// Bytes from y's first element to one past its last (rows ld_y apart).
size_t gemm_out_bytes(const GemmArgs& g) {
  return (size_t(g.tokens - 1) * size_t(ld_y(g)) + size_t(g.out_f)) * elem_y(g);
}

}  // namespace

// Row-major y[tokens, out] = x[tokens, in] w[out, in]^T is, column-major, y^T = w^T(op T on [in, out]) x^T: A = w
// stored [in, out] (ld in) with transa = T, B = x stored [in, tokens] (ld in), C = D stored [out, tokens] (ld out).
GemmPlan& CudaBackend::gemm_plan(const GemmArgs& g) {
  const void* c = g.c ? g.c : g.y;
  const GemmKey key{g.out_f, g.tokens, g.in_f, ld_x(g), ld_y(g), g.y_f32, g.beta != 0.f, g.bias != nullptr,
                    alignment_of(g.w), alignment_of(g.x), alignment_of(c), alignment_of(g.y)};
  auto it = gemm_plans_.find(key);
  if (it == gemm_plans_.end()) {
    auto plan = std::make_unique<GemmPlan>();
    GemmPlan* p = plan.get();
    const cudaDataType_t dt = g.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g.bias) {  // the bias vector has y's type (cuBLASLt's default); its pointer is set again at every launch
      const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
      DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    }
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, uint64_t(g.in_f), uint64_t(g.out_f), g.in_f));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, uint64_t(g.in_f), uint64_t(g.tokens), ld_x(g)));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, dt, uint64_t(g.out_f), uint64_t(g.tokens), ld_y(g)));
    PreferencePtr pref = make_preference();
    std::vector<cublasLtMatmulHeuristicResult_t> res(kGemmCandidates);
    int count = 0;
    const uint64_t ws = lt_ws_.bytes();
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                         sizeof ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attr, v] : aligns)
      DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &v, sizeof v));
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_.get(), p->op, p->a, p->b, p->d, p->d, pref.get(),
                                                             kGemmCandidates, res.data(), &count);
    // NOT_SUPPORTED: no cuBLASLt kernel for this shape/alignment; cublasGemmEx still runs it (its own fallbacks).
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) DS_CUBLAS_CHECK(st);
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < count; ++i)
      if (res[size_t(i)].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(res[size_t(i)].algo);
    p->lt = !p->candidates.empty();
    if (p->lt) p->algo = p->candidates.front();
    p->tuned = !p->lt || !autotune_ || p->candidates.size() == 1;
    if (p->tuned) p->candidates.clear();
    it = gemm_plans_.emplace(key, std::move(plan)).first;
  }
  GemmPlan& p = *it->second;
  if (!p.tuned) {
    // Where the timing runs may write: y itself when nothing reads it back (beta = 0) or when C is another buffer
    // (every run then writes the same y = xw^T + c); an in-place accumulation needs the caller's spare bytes.
    void* d = g.beta == 0.f || c != g.y ? g.y : (g.spare_bytes >= gemm_out_bytes(g) ? g.spare : nullptr);
    if (d) gemm_tune(p, g, d);
  }
  return p;
}

// Times every candidate on the real operands (2 warm-up + 5 timed runs each, CUDA events on the backend stream)
// and keeps the fastest; ties go to the heuristic's order. It runs before the GEMM's profiler mark, but it does
// synchronise the host with the stream once per candidate: the first forward that meets a shape (a new prompt
// length, say) is slower in wall time by its tuning, up to ~0.1 s for the 8 x 2048-token MLP shapes, once.
void CudaBackend::gemm_tune(GemmPlan& p, const GemmArgs& g, void* d) {
  const float alpha = 1.f;
  const void* c = g.c ? g.c : g.y;  // in place: C stays y, only read; D is the spare
  constexpr int kWarm = 2, kRuns = 5;
  CudaEvent e0, e1;
  float best = INFINITY;
  int runnable = 0;
  set_bias(p, g);
  for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
    auto launch = [&] {
      return cublasLtMatmul(lt_.get(), p.op, &alpha, g.w, p.a, g.x, p.b, &g.beta, c, p.d, d, p.d, &algo, lt_ws_.get(),
                            lt_ws_.bytes(), stream());
    };
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < kWarm && st == CUBLAS_STATUS_SUCCESS; ++i) st = launch();
    if (st != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();  // a candidate that cannot run here must not leave an error for the next kernel's check
      continue;
    }
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), stream()));
    for (int i = 0; i < kRuns; ++i) DS_CUBLAS_CHECK(launch());
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), stream()));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
    ++runnable;
    if (ms < best) {
      best = ms;
      p.algo = algo;
    }
  }
  if (runnable == 0)
    throw Error("cuBLASLt: none of the " + std::to_string(p.candidates.size()) +
                " algorithms its heuristic offered could run the bf16 GEMM " + std::to_string(g.out_f) + " x " +
                std::to_string(g.tokens) + " x " + std::to_string(g.in_f) + "; HINT: DS_GEMM_AUTOTUNE=0 skips timing");
  p.tuned = true;
  p.candidates.clear();
}

void CudaBackend::gemm_launch(const GemmPlan& p, const GemmArgs& g) {
  const float alpha = 1.f;
  const void* c = g.c ? g.c : g.y;
  // compute-sanitizer initcheck does not see cuBLAS's Hopper epilogue stores, so every read of a GEMM output
  // reports as uninitialised. Under DS_CUDA_INITCHECK_MARK_GEMM the output is zeroed first (cuBLAS then
  // overwrites it) whenever the GEMM does not read it back, which leaves initcheck to judge our own kernels.
  // Diagnostics only: off in normal runs.
  if (initcheck_mark_ && (g.beta == 0.f || c != g.y))
    DS_CUDA_CHECK(cudaMemset2DAsync(g.y, size_t(ld_y(g)) * elem_y(g), 0, size_t(g.out_f) * elem_y(g),
                                    size_t(g.tokens), stream()));
  if (p.lt) {
    set_bias(p, g);
    DS_CUBLAS_CHECK(cublasLtMatmul(lt_.get(), p.op, &alpha, g.w, p.a, g.x, p.b, &g.beta, c, p.d, g.y, p.d, &p.algo,
                                   lt_ws_.get(), lt_ws_.bytes(), stream()));
    return;
  }
  // cublasGemmEx has no separate C: bring the beta term into y first.
  if (g.beta != 0.f && c != g.y)
    DS_CUDA_CHECK(cudaMemcpy2DAsync(g.y, size_t(ld_y(g)) * elem_y(g), c, size_t(ld_y(g)) * elem_y(g),
                                    size_t(g.out_f) * elem_y(g), size_t(g.tokens), cudaMemcpyDeviceToDevice, stream()));
  DS_CUBLAS_CHECK(cublasGemmEx(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, int(g.out_f), int(g.tokens), int(g.in_f), &alpha, g.w,
                               CUDA_R_16BF, int(g.in_f), g.x, CUDA_R_16BF, int(ld_x(g)), &g.beta, g.y,
                               g.y_f32 ? CUDA_R_32F : CUDA_R_16BF, int(ld_y(g)), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
  if (g.bias) {
    if (!g.bias_f32) throw Error("CUDA backend: a GEMM with a bias but no f32 copy of it for cublasGemmEx");
    if (g.y_f32)
      DS_CUDA_CHECK(kern::launch_add_bias(static_cast<float*>(g.y), ld_y(g), g.bias_f32, g.tokens, int(g.out_f),
                                          stream()));
    else
      DS_CUDA_CHECK(kern::launch_add_bias(static_cast<bf16*>(g.y), ld_y(g), g.bias_f32, g.tokens, int(g.out_f),
                                          stream()));
  }
}

// The plan's descriptor is shared by every GEMM of its shape; each brings its own bias vector.
void CudaBackend::set_bias(const GemmPlan& p, const GemmArgs& g) {
  if (g.bias)
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
}

void CudaBackend::gemm(const char* name, int layer, const GemmArgs& g) {
  const GemmPlan& p = gemm_plan(g);  // before the mark: a first-seen shape's tuning is not the GEMM's time
  if (name) timed(name, layer, [&] { gemm_launch(p, g); });
  else gemm_launch(p, g);
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
  return p;
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
  bool reuse = from_layer > 0 && has_run_ && last_batch_ == batch && last_n_ == n && act_.cap >= T &&
               last_ids_.size() == size_t(T) && std::equal(last_ids_.begin(), last_ids_.end(), ids);
  int from = reuse ? std::min(from_layer, L) : 0;
  // A rows-only run left the last layer's output with one row per sequence: a caller wanting every row redoes it.
  // After truncate() the last row's output may be from an older lambda: the last layer runs again.
  if (from == L && ((partial_last_layer_ && !last_rows_only) || last_row_stale_)) from = L - 1;
  ensure_activations(T, n, batch == 1 ? kDecodeSpare : 0);
  if (!head_ns_.get() || head_ns_.bytes() < size_t(L) * size_t(view_heads()) * 8)
    head_ns_ = DeviceBuffer(size_t(L) * size_t(view_heads()) * 8, "profiling counters");
  events_used_ = 0;
  marks_.clear();
  has_run_ = false;  // until this run completes
  if (profiling_) DS_CUDA_CHECK(cudaMemsetAsync(head_ns_.get(), 0, head_ns_.bytes(), stream()));
  if (from == 0) {
    DS_CUDA_CHECK(cudaMemcpyAsync(act_.ids.get(), ids, size_t(T) * 4, cudaMemcpyHostToDevice, stream()));
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
    if (max_abs_read_.size() != size_t(L) || from == 0) max_abs_read_.assign(size_t(L), 0);
    if (from < L)
      DS_CUDA_CHECK(cudaMemsetAsync(max_abs_.as<float>() + from, 0, size_t(L - from) * 4, stream()));
    for (int l = from; l < L; ++l) max_abs_read_[size_t(l)] = 0;
  } else {
    max_abs_read_.clear();
  }
  const fwd::Plan rows_plan{from, last_rows_only, nullptr, hooks_.get()};
  run_layers(batch, n, lam, from, last_rows_only, false);
  if (from < L) partial_last_layer_ = fwd::last_rows_only(rows_plan), last_row_stale_ = false;
  if (want_logits) final_logits(batch, n);
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
      for (int64_t i = req.append_from; i < n; ++i) decode_step(req.ids[size_t(i)], lam);
      out.n = n;
      out.logit_rows = 1;
      out.argmax = -1;
      if (req.logits_on_demand) {  // the greedy choice made here: 8 bytes come back instead of the vocabulary
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
  const int64_t limit = max_tokens();
  if (n > limit)
    throw Error("prompt of " + std::to_string(n) + " tokens is too long for " + device_name_ + ": at most " +
                std::to_string(limit) + " fit in its free memory with this model; HINT: shorten the prompt or use "
                "--backend cpu");
  try {
    run(req.ids.data(), 1, n, req.lambda, req.from_layer, !req.all_logits, !req.all_logits && !req.keep_hidden);
    out.n = n;
    const int64_t V = cfg_.vocab;
    if (req.all_logits) {
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
      out.logits.resize(size_t(V));
      DS_CUDA_CHECK(
          cudaMemcpyAsync(out.logits.data(), logits_.get(), size_t(V) * 4, cudaMemcpyDeviceToHost, stream()));
    }
    out.hidden.clear();
    if (req.keep_hidden) {
      const int64_t E = cfg_.hidden;
      out.hidden.resize(size_t(L + 1));
      for (int l = 0; l <= L; ++l) {
        out.hidden[size_t(l)].resize(size_t(n * E));
        DS_CUDA_CHECK(cudaMemcpyAsync(out.hidden[size_t(l)].data(),
                                      act_.hidden.as<float>() + size_t(l) * size_t(act_.cap) * size_t(E),
                                      size_t(n * E) * 4, cudaMemcpyDeviceToHost, stream()));
      }
    }
    sync();
    build_profile(std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), n, 0, 1, n);
    out.maps.assign(size_t(L), LayerMaps{});
    for (int l = 0; l < L && size_t(l) < req.want_maps.size(); ++l)
      if (req.want_maps[size_t(l)]) compute_maps(l, &out.maps[size_t(l)], nullptr);
  } catch (...) {
    has_run_ = false;
    cudaStreamSynchronize(stream());
    cudaGetLastError();
    throw;
  }
  out.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------------------------
// maps and statistics

void CudaBackend::compute_maps(int layer, LayerMaps* out, std::vector<HeadStats>* stats, std::optional<float> lambda) {
  if (!has_run_) throw Error("CUDA backend: no forward has run yet, so there are no maps to show");
  const int L = int(cfg_.layers);
  if (layer < 0 || layer >= L)
    throw Error("layer " + std::to_string(layer) + " out of range (the model has " + std::to_string(L) + ")");
  const int64_t n = last_n_;
  const int Hv = view_heads();
  const int nmaps = cfg_.is_diff() ? 2 : 1;
  kern::AttnParams p = layer_params(layer);
  if (lambda && p.diff) p.lambda = *lambda;
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4;
  const int64_t rpc = std::max<int64_t>(1, std::min<int64_t>(n, int64_t(kMapBudget / row_bytes)));
  if (map_buf_.bytes() < size_t(rpc) * row_bytes) map_buf_ = DeviceBuffer(size_t(rpc) * row_bytes, "attention maps");
  const size_t st_bytes = size_t(Hv) * size_t(rpc) * kern::MAP_NSTAT * 4;
  if (map_stats_.bytes() < st_bytes) map_stats_ = DeviceBuffer(st_bytes, "attention map statistics");
  if (out) {
    out->heads = Hv;
    out->n = n;
    out->a1.resize(size_t(Hv) * size_t(n * n));
    if (nmaps == 2) out->a2.resize(size_t(Hv) * size_t(n * n));
    else out->a2.clear();
  }
  std::vector<StatsAccumulator> acc(static_cast<size_t>(Hv));
  std::vector<float> host_st(size_t(Hv) * size_t(rpc) * kern::MAP_NSTAT);
  float* buf = map_buf_.as<float>();
  for (int64_t r0 = 0; r0 < n; r0 += rpc) {
    const int rows = int(std::min(rpc, n - r0));
    timed("attn_maps", layer, [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_logits(p, int(r0), rows, buf, stream()));
      DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, int(r0), rows, buf, map_stats_.as<float>(), stream()));
    });
    if (out)
      for (int h = 0; h < Hv; ++h) {
        DS_CUDA_CHECK(cudaMemcpyAsync(out->a1.data() + (size_t(h) * size_t(n) + size_t(r0)) * size_t(n),
                                      buf + (size_t(h) * nmaps + 0) * size_t(rows) * size_t(n),
                                      size_t(rows) * size_t(n) * 4, cudaMemcpyDeviceToHost, stream()));
        if (nmaps == 2)
          DS_CUDA_CHECK(cudaMemcpyAsync(out->a2.data() + (size_t(h) * size_t(n) + size_t(r0)) * size_t(n),
                                        buf + (size_t(h) * nmaps + 1) * size_t(rows) * size_t(n),
                                        size_t(rows) * size_t(n) * 4, cudaMemcpyDeviceToHost, stream()));
      }
    if (stats) {
      DS_CUDA_CHECK(cudaMemcpyAsync(host_st.data(), map_stats_.get(), size_t(Hv) * size_t(rows) * kern::MAP_NSTAT * 4,
                                    cudaMemcpyDeviceToHost, stream()));
      sync();
      for (int h = 0; h < Hv; ++h)
        for (int r = 0; r < rows; ++r) {
          const float* st = host_st.data() + (size_t(h) * size_t(rows) + size_t(r)) * kern::MAP_NSTAT;
          add_row_stats(acc[size_t(h)], st);
        }
    }
  }
  sync();
  if (stats) {
    stats->clear();
    for (int h = 0; h < Hv; ++h) stats->push_back(acc[size_t(h)].finish(nmaps == 2));
  }
}

void CudaBackend::layer_maps(int layer, LayerMaps& out) {
  const DeviceGuard on(device_);
  compute_maps(layer, &out, nullptr);
}

// Statistics without maps: the fused two-pass kernel (tensor cores) where it runs, else the map kernels in chunks.
// Either way the per-row terms, [view heads][n][MAP_NSTAT], come to the host and StatsAccumulator reduces them.
std::vector<HeadStats> CudaBackend::head_stats(int layer, std::optional<float> lambda) {
  const DeviceGuard on(device_);
  kern::AttnParams p = layer_params(layer);
  if (lambda && p.diff) p.lambda = *lambda;
  const int Hv = view_heads();
  std::vector<HeadStats> out;
  if (!fused_map_queries(p)) {
    compute_maps(layer, nullptr, &out, lambda);
    return out;
  }
  const int64_t n = last_n_;
  const size_t st_bytes = size_t(Hv) * size_t(n) * kern::MAP_NSTAT * 4;
  if (map_stats_.bytes() < st_bytes) map_stats_ = DeviceBuffer(st_bytes, "attention map statistics");
  if (stats_sum_.bytes() < size_t(Hv) * kern::MAP_NSTAT * 8)
    stats_sum_ = DeviceBuffer(size_t(Hv) * kern::MAP_NSTAT * 8, "attention statistics sums");
  timed("attn_stats", layer, [&] {
    DS_CUDA_CHECK(kern::launch_attn_row_stats(p, map_stats_.as<float>(), stream()));
    DS_CUDA_CHECK(kern::launch_attn_stats_reduce(map_stats_.as<float>(), Hv, int(n), stats_sum_.as<double>(), stream()));
  });
  std::vector<double> sums(size_t(Hv) * kern::MAP_NSTAT);
  DS_CUDA_CHECK(cudaMemcpyAsync(sums.data(), stats_sum_.get(), sums.size() * 8, cudaMemcpyDeviceToHost, stream()));
  sync();
  for (int h = 0; h < Hv; ++h) {
    const double* t = sums.data() + size_t(h) * kern::MAP_NSTAT;
    StatsAccumulator acc;
    acc.add_sums(t[kern::MAP_ENTROPY1], t[kern::MAP_ENTROPY2], t[kern::MAP_ENTROPY_DIFF], t[kern::MAP_FIRST1],
                 t[kern::MAP_FIRST2], t[kern::MAP_FIRST_DIFF], t[kern::MAP_NEG_MASS], float(t[kern::MAP_DIFF_MIN]),
                 float(t[kern::MAP_DIFF_MAX]), float(t[kern::MAP_MAX_LOGIT1]), float(t[kern::MAP_MAX_LOGIT2]), n);
    out.push_back(acc.finish(cfg_.is_diff()));
  }
  return out;
}

// The two-pass tensor-core kernels for statistics and views (kernels/diff_attn_fwd.h): head_dim 64 or 128, H even,
// sm_80+ with room for their shared memory; elsewhere the map kernels run in chunks of rows.
bool CudaBackend::fused_map_queries(const kern::AttnParams& p) const {
  return (p.d == 64 || p.d == 128) && p.heads % 2 == 0 && (!p.diff || p.kv_heads % 2 == 0) && attn_dev_.cc >= 80 &&
         kern::attn_row_stats_smem(p.d) <= attn_dev_.smem_block;
}

kern::AttnParams CudaBackend::layer_params(int layer) const {
  if (!has_run_) throw Error("no maps: run a prompt first");
  if (layer < 0 || layer >= int(cfg_.layers))
    throw Error("layer " + std::to_string(layer) + " does not exist (the model has " + std::to_string(cfg_.layers) +
                " layers)");
  if (!cfg_.has_maps(layer)) throw Error(cfg_.no_attention(layer, "attention maps"));
  return layer_attn(layer, last_n_, 1, last_lambda_.empty() ? 0.f : last_lambda_[size_t(layer)]);  // sequence 0
}

// The view is pooled on the device (the fused two-pass kernel, or the map kernels in chunks) and finished there
// (means, decoded signed maxima): only the grid comes back.
void CudaBackend::map_view(const ViewRequest& req, MapView& out) {
  const DeviceGuard on(device_);
  if (!has_run_) throw Error("no maps: run a prompt first");
  const int L = int(cfg_.layers), Hv = view_heads(), nmaps = cfg_.is_diff() ? 2 : 1;
  const float lam = req.layer >= 0 && req.layer < L && !last_lambda_.empty() ? last_lambda_[size_t(req.layer)] : 0.f;
  prepare_view(req, L, Hv, last_n_, cfg_.is_diff(), lam, out, /*zero=*/false);
  kern::AttnParams p = layer_params(out.layer);
  if (p.diff) p.lambda = out.lambda;  // req.lambda, where given
  const size_t cells = size_t(out.rows) * size_t(out.cols);
  if (view_buf_.bytes() < 3 * cells * 4) view_buf_ = DeviceBuffer(3 * cells * 4, "attention view");
  float* g1 = view_buf_.as<float>();
  float* g2 = g1 + cells;
  float* gd = g2 + cells;
  DS_CUDA_CHECK(cudaMemsetAsync(g1, 0, 3 * cells * 4, stream()));
  const kern::ViewPoolArgs va{out.q0, out.q1, out.k0, out.k1, out.rows, out.cols, out.pool == Pool::Mean, out.lambda};
  // The fused kernel where cells are at least 8 rows tall (its warps fold runs of entries in registers); smaller
  // cells favour the chunked map kernels (H100, 1024 x 1024 grid, bench/results/latest/s15_views_* at commit af6a061: 1.6 vs 1.9 ms
  // at 1K tokens, 2.1 vs 2.5 ms at 4K; 4.8 vs 3.4 ms at 8K, 68 vs 6.9 ms at 32K).
  if (fused_views_ && fused_map_queries(p) && out.q1 - out.q0 >= 8 * int64_t(out.rows)) {
    timed("attn_view", out.layer, [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_view(p, va, out.head, g1, nmaps == 2 ? g2 : nullptr, gd, stream()));
    });
  } else {  // one head's full probability rows in chunks (the softmax needs whole rows), each pooled on the device
    const int64_t n = last_n_;
    const size_t row_bytes = size_t(nmaps) * size_t(n) * 4;
    const int64_t rpc = std::max<int64_t>(1, std::min<int64_t>(out.q1 - out.q0, int64_t(kMapBudget / row_bytes)));
    if (map_buf_.bytes() < size_t(rpc) * row_bytes) map_buf_ = DeviceBuffer(size_t(rpc) * row_bytes, "attention maps");
    const size_t st_bytes = size_t(rpc) * kern::MAP_NSTAT * 4;
    if (map_stats_.bytes() < st_bytes) map_stats_ = DeviceBuffer(st_bytes, "attention map statistics");
    float* buf = map_buf_.as<float>();
    for (int64_t r0 = out.q0; r0 < out.q1; r0 += rpc) {
      const int rows = int(std::min(rpc, out.q1 - r0));
      timed("attn_view", out.layer, [&] {
        DS_CUDA_CHECK(kern::launch_attn_map_logits(p, int(r0), rows, buf, stream(), out.head, 1));
        DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, int(r0), rows, buf, map_stats_.as<float>(), stream(), 1));
        DS_CUDA_CHECK(kern::launch_attn_map_pool(buf, nmaps, rows, int(n), int(r0), va, g1, g2, gd, stream()));
      });
    }
  }
  DS_CUDA_CHECK(kern::launch_attn_view_finish(va, g1, nmaps == 2 ? g2 : nullptr, gd, stream()));
  if (nmaps == 2) {
    copy_to_host({{out.a1.data(), g1, cells * 4}, {out.a2.data(), g2, cells * 4}, {out.diff.data(), gd, cells * 4}});
  } else {
    copy_to_host({{out.a1.data(), g1, cells * 4}, {out.diff.data(), gd, cells * 4}});
  }
}

// Channel c of Mamba layer l: the scan's inputs of the layer again (as mamba_forward makes them, from the layer's
// cached input and a zero conv state, into the forward's scratch buffers), then the channel's steps and their prefix
// sums. The returned pointers stay valid until the next forward or implicit-attention query.
CudaBackend::ImplicitInputs CudaBackend::implicit_inputs(int l, int c) {
  const int64_t n = last_n_, E = cfg_.hidden, di = cfg_.d_inner, R = cfg_.dt_rank, S = cfg_.d_state, XD = R + 2 * S;
  const LayerWeights& w = layers_[size_t(l)];
  const float* h_in = act_.hidden.as<float>() + size_t(l) * size_t(act_.cap) * size_t(E);
  bf16* xz = act_.scratch32.as<bf16>();  // [n][2 di], then dt [n][di]
  bf16* dt = xz + n * 2 * di;
  bf16* u = act_.act.as<bf16>();
  bf16* xdbl = act_.xdbl.as<bf16>();
  const size_t steps_bytes = size_t(n) * (4 + 8);
  if (implicit_buf_.bytes() < steps_bytes) implicit_buf_ = DeviceBuffer(steps_bytes, "implicit attention steps");
  double* cum = implicit_buf_.as<double>();
  float* delta = reinterpret_cast<float*>(cum + n);
  block_norm(h_in, E, w.ln1, w.ln1_b, act_.x.as<bf16>(), n);
  gemm(nullptr, l, {.out_f = 2 * di, .tokens = n, .in_f = E, .w = w.in_proj.as<bf16>(), .x = act_.x.as<bf16>(),
                    .y = xz});
  DS_CUDA_CHECK(kern::launch_causal_conv_silu(xz, 2 * di, w.conv_w.as<float>(), w.conv_b.as<float>(),
                                              int(cfg_.d_conv), u, di, n, int(di), stream()));
  gemm(nullptr, l, {.out_f = XD, .tokens = n, .in_f = di, .w = w.x_proj.as<bf16>(), .x = u, .y = xdbl});
  gemm(nullptr, l, {.out_f = di, .tokens = n, .in_f = R, .w = w.dt_w.as<bf16>(), .x = xdbl, .y = dt, .ldx = XD});
  DS_CUDA_CHECK(kern::launch_mamba_channel_steps(dt, di, c, w.dt_b.as<float>(), n, delta, cum, stream()));
  return {delta, cum, xdbl + R, xdbl + R + S, XD, w.a_neg.as<float>() + size_t(c) * size_t(S), int(S)};
}

void CudaBackend::implicit_grid(const ImplicitInputs& in, const kern::ViewPoolArgs& va, float* grid) {
  DS_CUDA_CHECK(kern::launch_mamba_implicit_view(in.delta, in.cum, in.B, in.C, in.ld_bc, in.A, in.S, va, grid, stream()));
}

// Only the pooled grid comes back.
void CudaBackend::mamba_view(const ViewRequest& req, MapView& out) {
  const DeviceGuard on(device_);
  if (!has_run_) throw Error("no maps: run a prompt first");
  prepare_mamba_view(req, cfg_, last_n_, out, /*zero=*/false);
  if (last_batch_ != 1) throw Error("implicit attention maps need a forward of one sequence");
  const size_t cells = size_t(out.rows) * size_t(out.cols);
  if (view_buf_.bytes() < cells * 4) view_buf_ = DeviceBuffer(cells * 4, "attention view");
  timed("mamba_view", out.layer, [&] {
    const ImplicitInputs in = implicit_inputs(out.layer, out.head);
    implicit_grid(in, {out.q0, out.q1, out.k0, out.k1, out.rows, out.cols, out.pool == Pool::Mean, 0.f},
                  view_buf_.as<float>());
  });
  copy_to_host({{out.diff.data(), view_buf_.get(), cells * 4}});
  out.a1 = out.diff;
}

// The row as one 1 x (q + 1) grid: one cell per key.
void CudaBackend::mamba_row(int layer, int channel, int64_t q, std::vector<float>& row) {
  const DeviceGuard on(device_);
  if (!has_run_) throw Error("no maps: run a prompt first");
  check_mamba_row(layer, channel, q, cfg_, last_n_);
  if (last_batch_ != 1) throw Error("implicit attention maps need a forward of one sequence");
  const size_t cells = size_t(q + 1);
  if (view_buf_.bytes() < cells * 4) view_buf_ = DeviceBuffer(cells * 4, "attention view");
  timed("mamba_view", layer, [&] {
    implicit_grid(implicit_inputs(layer, channel), {q, q + 1, 0, q + 1, 1, int(q + 1), false, 0.f},
                  view_buf_.as<float>());
  });
  row.resize(cells);
  copy_to_host({{row.data(), view_buf_.get(), cells * 4}});
}

// Device -> pageable host memory. cudaMemcpy to pageable memory stages through the driver's buffers at a fraction
// of the link's speed, and one thread's memcpy out of pinned memory is slower than the link: every piece (<= 1 MB)
// is copied into pinned staging at once, each with an event, and up to 4 threads move the pieces into place as
// they land. Rounds of at most 64 MB.
void CudaBackend::copy_to_host(std::initializer_list<HostCopy> copies) {
  constexpr size_t kPiece = size_t(1) << 20, kRound = size_t(64) << 20;
  struct Piece {
    char* dst;
    const char* src;
    size_t bytes;
  };
  std::vector<Piece> pieces;
  for (const HostCopy& c : copies)
    for (size_t o = 0; o < c.bytes; o += kPiece)
      pieces.push_back({static_cast<char*>(c.dst) + o, static_cast<const char*>(c.src) + o, std::min(kPiece, c.bytes - o)});
  for (size_t first = 0; first < pieces.size();) {
    size_t last = first, staged = 0;
    while (last < pieces.size() && staged + pieces[last].bytes <= kRound) staged += pieces[last++].bytes;
    if (host_stage_.bytes() < staged) host_stage_ = PinnedBuffer(staged);
    while (stage_ev_.size() < last - first) stage_ev_.emplace_back();
    std::vector<char*> at(last - first);
    size_t off = 0;
    for (size_t i = first; i < last; ++i) {
      at[i - first] = host_stage_.as<char>() + off;
      off += pieces[i].bytes;
      DS_CUDA_CHECK(cudaMemcpyAsync(at[i - first], pieces[i].src, pieces[i].bytes, cudaMemcpyDeviceToHost, stream()));
      DS_CUDA_CHECK(cudaEventRecord(stage_ev_[i - first].get(), stream()));
    }
    const size_t count = last - first, workers = std::min<size_t>(4, count);
    std::vector<std::string> errors(workers);
    auto work = [&](size_t w) {
      try {
        for (size_t i = w; i < count; i += workers) {
          DS_CUDA_CHECK(cudaEventSynchronize(stage_ev_[i].get()));
          std::memcpy(pieces[first + i].dst, at[i], pieces[first + i].bytes);
        }
      } catch (const std::exception& e) {
        errors[w] = e.what();
      }
    };
    {
      std::vector<std::jthread> threads;
      for (size_t w = 1; w < workers; ++w) threads.emplace_back(work, w);
      work(0);
    }  // joined
    for (const std::string& e : errors)
      if (!e.empty()) throw Error(e);
    first = last;
  }
}

// One launch pair per position, every head at once; each row comes back whole (heads x maps x n floats).
void CudaBackend::map_rows(int layer, const std::vector<int64_t>& positions, MapRows& out) {
  const DeviceGuard on(device_);
  const kern::AttnParams p = layer_params(layer);
  const int64_t n = last_n_, Hv = view_heads();
  const int nmaps = cfg_.is_diff() ? 2 : 1;
  prepare_rows(layer, Hv, n, nmaps == 2, positions, out);
  const size_t P = out.positions.size();
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4;
  if (map_buf_.bytes() < row_bytes) map_buf_ = DeviceBuffer(row_bytes, "attention maps");
  if (map_stats_.bytes() < size_t(Hv) * kern::MAP_NSTAT * 4)
    map_stats_ = DeviceBuffer(size_t(Hv) * kern::MAP_NSTAT * 4, "attention map statistics");
  float* buf = map_buf_.as<float>();
  for (size_t i = 0; i < P; ++i) {
    const int q = int(out.positions[i]);
    timed("attn_rows", layer, [&] {
      DS_CUDA_CHECK(kern::launch_attn_map_logits(p, q, 1, buf, stream()));
      DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, q, 1, buf, map_stats_.as<float>(), stream()));
    });
    for (int64_t h = 0; h < Hv; ++h)
      for (int m = 0; m < nmaps; ++m) {  // synchronous: buf is reused by the next position
        float* dst = (m == 0 ? out.a1.data() : out.a2.data()) + (size_t(h) * P + i) * size_t(n);
        copy_to_host({{dst, buf + (size_t(h) * nmaps + size_t(m)) * size_t(n), size_t(n) * 4}});
      }
  }
}

// The row as map_rows computes it, then reduced per head on the device: 12 f64 per head come back.
std::vector<RowMass> CudaBackend::row_mass(int layer, int64_t q, int64_t a0, int64_t a1) {
  const DeviceGuard on(device_);
  const kern::AttnParams p = layer_params(layer);
  const int64_t n = last_n_, Hv = view_heads();
  check_row_mass(q, n, a0, a1);
  const int nmaps = cfg_.is_diff() ? 2 : 1;
  const size_t row_bytes = size_t(Hv) * size_t(nmaps) * size_t(n) * 4;
  if (map_buf_.bytes() < row_bytes) map_buf_ = DeviceBuffer(row_bytes, "attention maps");
  if (map_stats_.bytes() < size_t(Hv) * kern::MAP_NSTAT * 4)
    map_stats_ = DeviceBuffer(size_t(Hv) * kern::MAP_NSTAT * 4, "attention map statistics");
  if (stats_sum_.bytes() < size_t(Hv) * 12 * 8) stats_sum_ = DeviceBuffer(size_t(Hv) * 12 * 8, "row mass sums");
  float* buf = map_buf_.as<float>();
  timed("attn_row_mass", layer, [&] {
    DS_CUDA_CHECK(kern::launch_attn_map_logits(p, int(q), 1, buf, stream()));
    DS_CUDA_CHECK(kern::launch_attn_map_softmax(p, int(q), 1, buf, map_stats_.as<float>(), stream()));
    DS_CUDA_CHECK(kern::launch_attn_row_mass(buf, int(Hv), nmaps, int(n), int(q), p.diff ? p.lambda : 0.f, int(a0),
                                             int(a1), stats_sum_.as<double>(), stream()));
  });
  std::vector<double> sums(size_t(Hv) * 12);
  DS_CUDA_CHECK(cudaMemcpyAsync(sums.data(), stats_sum_.get(), sums.size() * 8, cudaMemcpyDeviceToHost, stream()));
  sync();
  std::vector<RowMass> out(static_cast<size_t>(Hv));
  for (size_t h = 0; h < size_t(Hv); ++h)
    for (int m = 0; m < MASS_NMAPS; ++m) {
      out[h].answer[m] = sums[h * 12 + size_t(m)];
      out[h].sink[m] = sums[h * 12 + 4 + size_t(m)];
      out[h].context[m] = sums[h * 12 + 8 + size_t(m)];
    }
  return out;
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

double CudaBackend::gemm_peak_tflops() {
  const DeviceGuard on(device_);
  if (peak_tflops_ > 0) return peak_tflops_;
  const int N = 8192;
  DeviceBuffer a(size_t(N) * N * 2, "GEMM peak measurement"), b(size_t(N) * N * 2, "GEMM peak measurement"),
      c(size_t(N) * N * 2, "GEMM peak measurement");
  DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(a.as<bf16>(), int64_t(N) * N, 11, 1.f, stream()));
  DS_CUDA_CHECK(kern::launch_fill_uniform_bf16(b.as<bf16>(), int64_t(N) * N, 12, 1.f, stream()));
  const GemmArgs g{.out_f = N, .tokens = N, .in_f = N, .w = a.as<bf16>(), .x = b.as<bf16>(), .y = c.get()};
  gemm(nullptr, -1, g);  // plans (and tunes) the shape outside the timed runs
  CudaEvent e0, e1;
  std::vector<float> t;
  for (int i = 0; i < 13; ++i) {
    DS_CUDA_CHECK(cudaEventRecord(e0.get(), stream()));
    gemm(nullptr, -1, g);
    DS_CUDA_CHECK(cudaEventRecord(e1.get(), stream()));
    DS_CUDA_CHECK(cudaEventSynchronize(e1.get()));
    float ms = 0;
    DS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  peak_tflops_ = 2.0 * double(N) * N * N / double(t[t.size() / 2]) / 1e9;
  return peak_tflops_;
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

std::unique_ptr<Backend> make_cuda_backend(int device) {
  std::string why;
  if (!cuda_backend_available(&why, device))
    throw Error("CUDA backend unavailable: " + why + "; HINT: run with --backend cpu");
  return std::make_unique<cuda::CudaBackend>(device);
}


void cuda_set_profiling(Backend& b, bool on) { cuda::as_cuda(b).set_profiling(on); }

}  // namespace ds
