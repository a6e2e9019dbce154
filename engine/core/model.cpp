// Checkpoint validation against the config: every tensor present, of a float dtype, of the shape the config
// implies; inconsistent head counts and unknown layouts are refused before any backend sees the weights.
#include "engine/core/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/core/error.h"
#include "kernels/attn_heads.h"

namespace fs = std::filesystem;

namespace ds {

size_t Model::weight_bytes() const { return ckpt ? ckpt->total_bytes() : 0; }

const TensorInfo* Model::layer_tensor(int64_t layer, LayerWeight w) const {
  const LayerTensors& t = layers.at(size_t(layer));
  if (w == LayerWeight::O) return t.wo;
  if (t.qkv) return t.qkv;
  return w == LayerWeight::Q ? t.wq : w == LayerWeight::K ? t.wk : t.wv;
}

bool Model::weight_transformed(LayerWeight w) const {
  const ArchSpec& s = cfg.spec();
  if (w == LayerWeight::O) return s.subln_weight;
  return s.pairing == Pairing::Interleaved || s.qkv_proj != nullptr;
}

namespace {

// Rows [r0, r0 + count) of a [rows, cols] (or [rows]) tensor as f32.
std::vector<float> rows_f32(const TensorInfo& t, int64_t r0, int64_t count) {
  std::vector<float> x = tensor_to_f32(t);
  const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
  return std::vector<float>(x.begin() + r0 * cols, x.begin() + (r0 + count) * cols);
}

}  // namespace

// The rows of q, k or v in the stored tensor: the whole tensor, or its slice of a fused [q|k|v] (cross-attention
// layers store q only: k and v have none).
std::vector<float> Model::layer_qkv_rows(int64_t layer, LayerWeight w, bool bias) const {
  const LayerTensors& t = layers.at(size_t(layer));
  const TensorInfo* src = bias ? (w == LayerWeight::O ? t.o_b : t.qkv_b) : layer_tensor(layer, w);
  if (!src) return {};
  if (w == LayerWeight::O || !t.qkv) return tensor_to_f32(*src);
  const int64_t d = cfg.head_dim, q = cfg.stored_q_heads * d, kv = cfg.kv_heads * d;
  if (w == LayerWeight::Q) return rows_f32(*src, 0, q);
  if (src->shape[0] == q) return {};  // cross-attention: q only
  return rows_f32(*src, w == LayerWeight::K ? q : q + kv, kv);
}

std::vector<float> Model::layer_bias_f32(int64_t layer, LayerWeight w) const {
  std::vector<float> b = layer_qkv_rows(layer, w, true);
  if (b.empty() || w == LayerWeight::O) return b;  // o's bias is added after the folded sub-norm scale
  return pair_layout(std::move(b), w, 1);
}

std::vector<float> Model::layer_weight_f32(int64_t layer, LayerWeight w) const {
  std::vector<float> x = layer_qkv_rows(layer, w, false);
  if (x.empty() || !weight_transformed(w)) return x;
  const int64_t d = cfg.head_dim, cols = layer_tensor(layer, w)->shape.at(1);
  if (w == LayerWeight::O) {  // columns j 2d + i of every differential head j scaled by g[i]
    const std::vector<float> g = tensor_to_f32(*layers.at(size_t(layer)).subln);
    const int64_t rows = int64_t(x.size()) / cols;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] *= g[size_t(c % (2 * d))];
    return x;
  }
  return pair_layout(std::move(x), w, cols);
}

// Interleaved pairs, blocks of d rows of `cols` values: k/v head 2i -> i, 2i + 1 -> heads/2 + i. q: groups of gr
// signal heads and one noise head (gr = 1: pairs); signal head i = g gr + r (stored g (gr + 1) + r) -> i, and a copy
// of its group's noise head (stored g (gr + 1) + gr) -> S + i, S = the signal heads. Chunked pairs: as stored.
std::vector<float> Model::pair_layout(std::vector<float> x, LayerWeight w, int64_t cols) const {
  if (cfg.spec().pairing != Pairing::Interleaved) return x;
  const int64_t d = cfg.head_dim;
  const int64_t gr = w == LayerWeight::Q ? cfg.noise_group : 1;
  const int64_t S = w == LayerWeight::Q ? cfg.heads / 2 : int64_t(x.size()) / cols / d / 2;
  std::vector<float> y(size_t(2 * S * d * cols));
  auto put = [&](int64_t from, int64_t to) { std::copy_n(x.begin() + from * d * cols, d * cols, y.begin() + to * d * cols); };
  for (int64_t i = 0; i < S; ++i) {
    const int64_t g = i / gr, r = i % gr;
    put(g * (gr + 1) + r, i);
    put(g * (gr + 1) + gr, S + i);
  }
  return y;
}

namespace {

const TensorInfo* need(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape,
                       const std::string& why = "") {
  const TensorInfo& t = ck.get(name);
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    fail_file(t.file, "tensor " + name + " has dtype " + dtype_name(t.dtype) + "; weights must be F32, F16 or BF16");
  if (t.shape != shape) {
    TensorInfo want;
    want.shape = shape;
    fail_file(t.file, "tensor " + name + " has shape " + t.shape_str() + " but config.json implies " +
                          want.shape_str() + (why.empty() ? "" : " (" + why + ")"));
  }
  return &t;
}

double dot_f32(const TensorInfo& a, const TensorInfo& b) {
  // transformers: exp(sum(lambda_q * lambda_k, dtype=float32)); the sum here is in double, the inputs f32.
  std::vector<float> x = tensor_to_f32(a), y = tensor_to_f32(b);
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += double(float(x[i] * y[i]));
  return s;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir_in) {
  auto m = std::make_unique<Model>();
  fs::path dir(dir_in);
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail_file(dir_in, "no such folder");
  if (!fs::is_directory(dir, ec)) {
    const std::string ext = dir.extension().string();
    if (ext == ".bin" || ext == ".pt" || ext == ".pth") Checkpoint refuse(dir_in);  // throws the pickle message
    fail_file(dir_in, "not a folder; open the model folder that holds config.json and the safetensors files");
  }
  m->dir = dir_in;
  m->cfg = load_config((dir / "config.json").string());
  const ModelConfig& c = m->cfg;
  m->ckpt = std::make_unique<Checkpoint>(dir_in);
  const Checkpoint& ck = *m->ckpt;

  const int64_t H = c.heads, Hkv = c.kv_heads, d = c.head_dim, D = c.hidden, I = c.intermediate, V = c.vocab;
  const ArchSpec& s = c.spec();
  const bool ln = s.norm == NormKind::LayerNorm;
  m->embed = need(ck, "model.embed_tokens.weight", {V, D}, "vocab_size x hidden_size");
  m->final_norm = need(ck, std::string(s.final_norm) + ".weight", {D});
  if (ln) m->final_norm_b = need(ck, std::string(s.final_norm) + ".bias", {D});
  if (c.tie_embeddings) {
    m->lm_head = m->embed;
  } else {
    if (!ck.find("lm_head.weight"))
      fail_file(ck.path(), "missing tensor lm_head.weight (config.json says tie_word_embeddings is false)");
    m->lm_head = need(ck, "lm_head.weight", {V, D});
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto name = [&](const char* t, const char* suffix = ".weight") { return p + t + suffix; };
    LayerTensors t{};
    t.ln1 = need(ck, p + "input_layernorm.weight", {D});
    t.ln2 = need(ck, p + "post_attention_layernorm.weight", {D});
    if (ln) {
      t.ln1_b = need(ck, p + "input_layernorm.bias", {D});
      t.ln2_b = need(ck, p + "post_attention_layernorm.bias", {D});
    }
    if (s.gate_up_proj) {
      t.gate_up = need(ck, name(s.gate_up_proj), {2 * I, D}, "2 x intermediate_size rows: gate, then up");
    } else {
      t.gate = need(ck, name(s.gate_proj), {I, D});
      t.up = need(ck, name(s.up_proj), {I, D});
    }
    t.down = need(ck, name(s.down_proj), {D, I});
    const LayerKind kind = c.kind(l);
    if (c.has_maps(l)) {
      if (s.qkv_proj) {
        const bool cross = kind == LayerKind::CrossAttention;
        const int64_t rows = (cross ? c.stored_q_heads : c.stored_q_heads + 2 * Hkv) * d;
        const char* why = cross ? "a cross-attention layer projects queries only: num_attention_heads x head_dim rows"
                                : "(num_attention_heads + 2 x num_key_value_heads) x head_dim rows";
        t.qkv = need(ck, name(s.qkv_proj), {rows, D}, why);
        if (s.attn_bias) t.qkv_b = need(ck, name(s.qkv_proj, ".bias"), {rows});
      } else {
        t.wq = need(ck, name(s.q_proj), {c.stored_q_heads * d, D}, "num_attention_heads x head_dim rows");
        t.wk = need(ck, name(s.k_proj), {Hkv * d, D}, "num_key_value_heads x head_dim rows");
        t.wv = need(ck, name(s.v_proj), {Hkv * d, D}, "num_key_value_heads x head_dim rows");
      }
      t.wo = need(ck, name(s.o_proj), {D, H * d});
      if (s.attn_bias) t.o_b = need(ck, name(s.o_proj, ".bias"), {D});
      if (c.is_diff()) {
        t.lq1 = need(ck, p + s.lambda_q1, {d});
        t.lk1 = need(ck, p + s.lambda_k1, {d});
        t.lq2 = need(ck, p + s.lambda_q2, {d});
        t.lk2 = need(ck, p + s.lambda_k2, {d});
        const double lam = std::exp(dot_f32(*t.lq1, *t.lk1)) - std::exp(dot_f32(*t.lq2, *t.lk2)) + c.lambda_init(l);
        if (!std::isfinite(lam)) fail_file(t.lq1->file, "layer " + std::to_string(l) + " lambda is not finite");
        m->model_lambda.push_back(lam);
      } else if (ck.find(p + "self_attn.lambda_q1")) {
        fail_file(ck.path(), std::string("config.json says ") + s.architecture +
                                 " but the weights have lambda vectors (a differential model?)");
      }
      if (s.subln_weight) t.subln = need(ck, p + s.subln, {2 * d}, "the sub-layer norm over 2 x head_dim");
    } else {
      m->model_lambda.push_back(0.0);
      const int64_t di = c.d_inner, R = c.dt_rank, S = c.d_state, K = c.d_conv;
      const std::string mx = p + s.mixer;
      if (kind == LayerKind::Gmu) {
        t.in_proj = need(ck, mx + "in_proj.weight", {di, D}, "a gated memory unit: d_inner rows");
      } else {
        t.in_proj = need(ck, mx + "in_proj.weight", {2 * di, D}, "Mamba: 2 x d_inner rows (x, then z)");
        t.conv_w = need(ck, mx + "conv1d.weight", {di, 1, K}, "d_inner x 1 x mamba_d_conv");
        t.conv_b = need(ck, mx + "conv1d.bias", {di});
        t.x_proj = need(ck, mx + "x_proj.weight", {R + 2 * S, di}, "dt_rank + 2 x mamba_d_state rows");
        t.dt_w = need(ck, mx + "dt_proj.weight", {di, R});
        t.dt_b = need(ck, mx + "dt_proj.bias", {di});
        t.a_log = need(ck, mx + "A_log", {di, S});
        t.d_skip = need(ck, mx + "D", {di});
      }
      t.out_proj = need(ck, mx + "out_proj.weight", {D, di});
    }
    if (s.mlp == MlpAct::PolyNorm) {
      t.act_w = need(ck, p + s.act_weight, {3}, "PolyNorm's weights of x^3, x^2, x");
      t.act_b = need(ck, p + s.act_bias, {1});
    }
    m->layers.push_back(t);
  }
  if (ck.find("model.layers." + std::to_string(c.layers) + ".input_layernorm.weight"))
    fail_file(ck.path(), "the checkpoint has more layers than num_hidden_layers = " + std::to_string(c.layers));
  return m;
}

}  // namespace ds
