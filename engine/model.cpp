// Checkpoint validation against the config: every tensor present, of a float dtype, of the shape the config
// implies; inconsistent head counts and unknown layouts are refused before any backend sees the weights.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "error.h"
#include "kernels/attn_heads.h"

namespace fs = std::filesystem;

namespace ds {

size_t Model::weight_bytes() const { return ckpt ? ckpt->total_bytes() : 0; }

const TensorInfo* Model::layer_tensor(int64_t layer, LayerWeight w) const {
  const LayerTensors& t = layers.at(size_t(layer));
  return w == LayerWeight::Q ? t.wq : w == LayerWeight::K ? t.wk : w == LayerWeight::V ? t.wv : t.wo;
}

bool Model::weight_transformed(LayerWeight w) const {
  const ArchSpec& s = cfg.spec();
  return w == LayerWeight::O ? s.subln_weight : s.pairing == Pairing::Interleaved;
}

std::vector<float> Model::layer_weight_f32(int64_t layer, LayerWeight w) const {
  const TensorInfo& t = *layer_tensor(layer, w);
  std::vector<float> x = tensor_to_f32(t);
  if (!weight_transformed(w)) return x;
  const int64_t d = cfg.head_dim, cols = t.shape.at(1);
  if (w == LayerWeight::O) {  // columns j 2d + i of every differential head j scaled by g[i]
    const std::vector<float> g = tensor_to_f32(*layers.at(size_t(layer)).subln);
    for (int64_t r = 0; r < t.shape[0]; ++r)
      for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] *= g[size_t(c % (2 * d))];
    return x;
  }
  // Interleaved pairs, blocks of d rows: k/v head 2i -> i, 2i + 1 -> heads/2 + i. q: groups of gr signal heads and
  // one noise head (gr = 1: pairs); signal head i = g gr + r (stored g (gr + 1) + r) -> i, and a copy of its group's
  // noise head (stored g (gr + 1) + gr) -> S + i, S = the signal heads.
  const int64_t gr = w == LayerWeight::Q ? cfg.noise_group : 1;
  const int64_t S = w == LayerWeight::Q ? cfg.heads / 2 : t.shape[0] / d / 2;
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
  m->embed = need(ck, "model.embed_tokens.weight", {V, D}, "vocab_size x hidden_size");
  m->final_norm = need(ck, "model.norm.weight", {D});
  if (c.tie_embeddings) {
    m->lm_head = m->embed;
  } else {
    if (!ck.find("lm_head.weight"))
      fail_file(ck.path(), "missing tensor lm_head.weight (config.json says tie_word_embeddings is false)");
    m->lm_head = need(ck, "lm_head.weight", {V, D});
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerTensors t{};
    t.ln1 = need(ck, p + "input_layernorm.weight", {D});
    t.ln2 = need(ck, p + "post_attention_layernorm.weight", {D});
    t.wq = need(ck, p + "self_attn.q_proj.weight", {c.stored_q_heads * d, D}, "num_attention_heads x head_dim rows");
    t.wk = need(ck, p + "self_attn.k_proj.weight", {Hkv * d, D}, "num_key_value_heads x head_dim rows");
    t.wv = need(ck, p + "self_attn.v_proj.weight", {Hkv * d, D}, "num_key_value_heads x head_dim rows");
    t.wo = need(ck, p + "self_attn.o_proj.weight", {D, H * d});
    t.gate = need(ck, p + "mlp.gate_proj.weight", {I, D});
    t.up = need(ck, p + "mlp.up_proj.weight", {I, D});
    t.down = need(ck, p + "mlp.down_proj.weight", {D, I});
    const ArchSpec& s = c.spec();
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
