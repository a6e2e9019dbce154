// config.json -> ModelConfig. Accepts the transformers 4.x and 5.x spellings; refuses what the engine cannot
// run with a message that names the field.
#include "engine/core/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/input_limits.h"

using nlohmann::json;

namespace ds {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Attention: return "attention";
    case LayerKind::SlidingAttention: return "sliding window";
    case LayerKind::CrossAttention: return "cross";
    case LayerKind::Mamba: return "mamba";
    case LayerKind::Memory: return "memory";
    case LayerKind::Gmu: return "gmu";
  }
  return "?";
}

std::vector<int64_t> ModelConfig::map_layers() const {
  std::vector<int64_t> v;
  for (int64_t l = 0; l < layers; ++l)
    if (has_maps(l)) v.push_back(l);
  return v;
}

namespace {
template <class Has>
int64_t nearest_layer(int64_t l, int dir, int64_t layers, Has has) {
  l = std::clamp<int64_t>(l, 0, std::max<int64_t>(0, layers - 1));
  const int step = dir < 0 ? -1 : 1;
  for (int s : {step, -step})
    for (int64_t x = l; x >= 0 && x < layers; x += s)
      if (has(x)) return x;
  return l;
}
}  // namespace

int64_t ModelConfig::nearest_map_layer(int64_t l, int dir) const {
  return nearest_layer(l, dir, layers, [&](int64_t x) { return has_maps(x); });
}

int64_t ModelConfig::nearest_view_layer(int64_t l, int dir) const {
  return nearest_layer(l, dir, layers, [&](int64_t x) { return has_maps(x) || has_scan(x); });
}

std::string ModelConfig::layer_label(int64_t layer) const {
  switch (kind(layer)) {
    case LayerKind::SlidingAttention: return "sliding window (" + std::to_string(window) + " keys)";
    case LayerKind::CrossAttention: return "cross (keys and values of layer " + std::to_string(kv_source) + ")";
    case LayerKind::Attention:
      return spec().schedule == Schedule::Uniform ? "attention"
                                                  : "full attention (its keys and values serve the cross layers)";
    case LayerKind::Memory: return "mamba (memory of the gated memory units)";
    case LayerKind::Gmu: return "gated memory unit (reads layer " + std::to_string(layers / 2) + "'s memory)";
    case LayerKind::Mamba: return "mamba";
  }
  return "?";
}

std::string ModelConfig::no_attention(int64_t layer, const char* what) const {
  std::string m = "layer ";
  m += std::to_string(layer);
  m += " is a ";
  m += layer_kind_name(kind(layer));
  m += " layer: it has no attention, hence no ";
  m += what;
  return m;
}

namespace {
// SambaY (docs/models/phi4flash.md section 7): the shapes of every tensor of one layer of kind k.
int64_t sambay_layer_params(const ModelConfig& c, LayerKind k) {
  const int64_t E = c.hidden, d = c.head_dim, H = c.heads, Hkv = c.kv_heads, I = c.intermediate, di = c.d_inner;
  int64_t p = 4 * E + 3 * I * E;  // two LayerNorms (weight, bias), fc1 [2I, E], fc2 [E, I]
  switch (k) {
    case LayerKind::Attention:
    case LayerKind::SlidingAttention:
    case LayerKind::CrossAttention: {
      const int64_t rows = (k == LayerKind::CrossAttention ? H : H + 2 * Hkv) * d;
      return p + rows * (E + 1) + E * H * d + E + 4 * d + 2 * d;
    }
    case LayerKind::Mamba:
    case LayerKind::Memory:
      return p + 2 * di * E + di * (c.d_conv + 1) + (c.dt_rank + 2 * c.d_state) * di + di * (c.dt_rank + 1) +
             di * c.d_state + di + E * di;
    case LayerKind::Gmu: return p + 2 * di * E;
  }
  return p;
}
}  // namespace

int64_t ModelConfig::params() const {
  if (spec().schedule == Schedule::SambaY) {
    int64_t p = vocab * hidden * (tie_embeddings ? 1 : 2) + 2 * hidden;
    for (int64_t l = 0; l < layers; ++l) p += sambay_layer_params(*this, kind(l));
    return p;
  }
  const int64_t d = head_dim;
  const int64_t qh = stored_q_heads ? stored_q_heads : heads;
  int64_t per_layer = hidden * (qh + heads) * d + hidden * kv_heads * d * 2 + 3 * hidden * intermediate + 2 * hidden;
  if (is_diff()) per_layer += 4 * d;
  if (spec().subln_weight) per_layer += 2 * d;
  if (spec().mlp == MlpAct::PolyNorm) per_layer += 4;
  int64_t p = layers * per_layer + vocab * hidden + hidden;
  if (!tie_embeddings) p += vocab * hidden;
  return p;
}

double ModelConfig::layer_share_params() const {
  return (double(params()) - double(vocab * hidden) * (tie_embeddings ? 1 : 2)) / double(layers);
}

double ModelConfig::block_params(int64_t first, int64_t end) const {
  if (first == 0 && end == layers) return double(params());
  const double embed = double(vocab * hidden);
  return layer_share_params() * double(end - first) + (first == 0 ? embed : 0) + (end == layers ? embed : 0);
}

namespace {

// Largest size we accept for any one dimension; keeps products of a few of them far from int64 overflow.
constexpr int64_t kMaxDim = int64_t(1) << 24;

int64_t get_int(const json& j, const char* key, const std::string& file, bool required, int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) fail_file(file, std::string("missing field ") + key);
    return fallback;
  }
  const json& v = j[key];
  if (!v.is_number_integer()) fail_file(file, std::string(key) + " is not an integer");
  const int64_t x = v.get<int64_t>();
  if (x <= 0 || x > kMaxDim)
    fail_file(file, std::string(key) + " = " + std::to_string(x) + " is out of range (1.." + std::to_string(kMaxDim) + ")");
  return x;
}

double get_num(const json& j, const char* key, const std::string& file, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) fail_file(file, std::string(key) + " is not a number");
  const double x = j[key].get<double>();
  if (!std::isfinite(x)) fail_file(file, std::string(key) + " is not finite");
  return x;
}

bool get_bool(const json& j, const char* key, const std::string& file, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) fail_file(file, std::string(key) + " is not true or false");
  return j[key].get<bool>();
}

std::string get_string(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

void parse_rope(const json& j, ModelConfig& c, const std::string& file) {
  // 5.x: rope_parameters {rope_theta, rope_type, ...}; 4.x: rope_theta + rope_scaling {rope_type|type, ...}.
  json params = json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    params = j["rope_parameters"];
  } else {
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) params = j["rope_scaling"];
    if (j.contains("rope_theta")) params["rope_theta"] = j["rope_theta"];
  }
  c.rope.theta = get_num(params, "rope_theta", file, 10000.0);
  if (c.rope.theta <= 1.0) fail_file(file, "rope_theta must be greater than 1");
  std::string type = "default";
  if (params.contains("rope_type") && params["rope_type"].is_string()) type = params["rope_type"];
  else if (params.contains("type") && params["type"].is_string()) type = params["type"];
  if (type == "default") {
    c.rope.type = RopeConfig::Default;
  } else if (type == "llama3") {
    c.rope.type = RopeConfig::Llama3;
    c.rope.factor = get_num(params, "factor", file, 8.0);
    c.rope.low_freq_factor = get_num(params, "low_freq_factor", file, 1.0);
    c.rope.high_freq_factor = get_num(params, "high_freq_factor", file, 4.0);
    c.rope.original_max_position_embeddings = get_num(params, "original_max_position_embeddings", file, 8192);
    if (c.rope.factor <= 0 || c.rope.low_freq_factor <= 0 || c.rope.high_freq_factor <= c.rope.low_freq_factor ||
        c.rope.original_max_position_embeddings <= 0)
      fail_file(file, "llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0");
  } else {
    fail_file(file, "rope type '" + type + "' is not supported (supported: default, llama3)");
  }
}

}  // namespace

namespace {
ModelConfig parse_config_object(const json& j, const std::string& file);

// SambaY's schedule and Mamba sizes (docs/models/phi4flash.md sections 1-2). The published code builds Mamba with
// d_state, d_conv and expand from the config but always dt_rank = ceil(hidden / 16), a conv bias and no in/out
// projection biases; it only works with mb_per_layer = 2 and L divisible by 4.
void parse_sambay(const json& j, ModelConfig& c, const std::string& file) {
  const int64_t L = c.layers;
  if (L % 4) fail_file(file, "num_hidden_layers = " + std::to_string(L) + " must be a multiple of 4 (SambaY's schedule)");
  if (get_int(j, "mb_per_layer", file, false, 2) != 2)
    fail_file(file, "mb_per_layer = " + j["mb_per_layer"].dump() + " is not supported (Phi-4-mini-flash uses 2)");
  // sliding_window: a number, or the per-layer list a re-saved config holds (null where the layer has none)
  const json* sw = j.contains("sliding_window") && !j["sliding_window"].is_null() ? &j["sliding_window"] : nullptr;
  if (sw && sw->is_array()) {
    if (int64_t(sw->size()) != L) fail_file(file, "sliding_window is a list but not of num_hidden_layers entries");
    for (const json& e : *sw)
      if (!e.is_null()) {
        if (!e.is_number_integer() || e.get<int64_t>() <= 0 || (c.window && c.window != e.get<int64_t>()))
          fail_file(file, "sliding_window's entries must be one positive integer (or null)");
        c.window = e.get<int64_t>();
      }
  } else if (sw) {
    c.window = get_int(j, "sliding_window", file, true, 0);
  } else {
    c.window = 2047;  // the configuration class's default
  }
  if (c.window <= 0) fail_file(file, "sliding_window must be a positive integer");
  const int64_t expand = get_int(j, "mamba_expand", file, false, 2);
  c.d_state = get_int(j, "mamba_d_state", file, false, 16);
  c.d_conv = get_int(j, "mamba_d_conv", file, false, 4);
  if (c.d_state > 32) fail_file(file, "mamba_d_state = " + std::to_string(c.d_state) + " is more than 32");
  if (c.d_conv > 8) fail_file(file, "mamba_d_conv = " + std::to_string(c.d_conv) + " is more than 8");
  c.d_inner = expand * c.hidden;
  c.dt_rank = (c.hidden + 15) / 16;
  const int64_t half = L / 2;
  for (int64_t l = 0; l < L; ++l) {
    LayerKind k;
    if (l < half) k = l % 2 == 0 ? LayerKind::Mamba : LayerKind::SlidingAttention;
    else if (l == half) k = LayerKind::Memory;
    else if (l == half + 1) k = LayerKind::Attention;
    else k = l % 2 == 0 ? LayerKind::Gmu : LayerKind::CrossAttention;
    c.kinds[size_t(l)] = k;
  }
  c.kv_source = half + 1;
}
}

ModelConfig parse_config_json(const std::string& text, const std::string& file) {
  json j;
  try {
    j = parse_json(text, file);
  } catch (const json::exception& e) {
    fail_file(file, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) fail_file(file, "not a JSON object");
  try {
    return parse_config_object(j, file);
  } catch (const json::exception& e) {  // a field of an unexpected type that no check above names
    fail_file(file, std::string("unexpected value (") + e.what() + ")");
  }
}

namespace {
ModelConfig parse_config_object(const json& j, const std::string& file) {
  ModelConfig c;
  std::string arch_name;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch_name = j["architectures"][0].get<std::string>();
  c.model_type = get_string(j, "model_type");
  const ArchSpec* spec = find_arch(arch_name, c.model_type);
  if (!spec) {
    const std::string what = !arch_name.empty() ? arch_name : (c.model_type.empty() ? "(none given)" : c.model_type);
    fail_file(file, "unsupported architecture " + what + " (diffscope runs " + supported_architectures() + ")");
  }
  c.arch = spec->arch;
  c.hidden = get_int(j, "hidden_size", file, true, 0);
  c.layers = get_int(j, "num_hidden_layers", file, true, 0);
  c.heads = get_int(j, "num_attention_heads", file, true, 0);
  c.kv_heads = get_int(j, "num_key_value_heads", file, false, c.heads);
  c.intermediate = get_int(j, "intermediate_size", file, true, 0);
  c.vocab = get_int(j, "vocab_size", file, true, 0);
  c.max_positions = get_int(j, "max_position_embeddings", file, false, 2048);
  if (c.hidden % c.heads != 0 && !(j.contains("head_dim") && j["head_dim"].is_number_integer()))
    fail_file(file, "hidden_size is not a multiple of num_attention_heads and no head_dim is given");
  c.head_dim = get_int(j, "head_dim", file, false, c.hidden / c.heads);
  c.stored_q_heads = c.heads;
  if (spec->noise_heads_key && j.contains(spec->noise_heads_key) && !j[spec->noise_heads_key].is_null()) {
    const int64_t N = get_int(j, spec->noise_heads_key, file, true, 0), Hq = c.heads;
    const std::string nk = spec->noise_heads_key;
    if (Hq % N || Hq / N < 2)
      fail_file(file, "num_attention_heads (" + std::to_string(Hq) + ") must be a multiple of " + nk + " (" +
                          std::to_string(N) + ") with at least one signal head per group");
    if (j.contains("k_ratio") && !j["k_ratio"].is_null() && get_int(j, "k_ratio", file, false, 1) != 1)
      fail_file(file, "k_ratio = " + j["k_ratio"].dump() + " is not supported (grouped differential attention with "
                      "k_ratio 1 only)");
    if (c.kv_heads % 2 || N % (c.kv_heads / 2))
      fail_file(file, nk + " (" + std::to_string(N) + ") must be a multiple of num_key_value_heads / 2 (" +
                          std::to_string(c.kv_heads / 2) + ")");
    c.noise_group = Hq / N - 1;
    c.heads = 2 * N * c.noise_group;  // every signal head paired with a copy of its group's noise head
  }
  if (c.layers > 4096) fail_file(file, "num_hidden_layers = " + std::to_string(c.layers) + " is absurd");
  if (c.heads > 4096) fail_file(file, "num_attention_heads = " + std::to_string(c.heads) + " is absurd");
  if (c.head_dim % 2) fail_file(file, "head_dim must be even for rotary embeddings");
  if (c.heads % c.kv_heads)
    fail_file(file, "num_attention_heads (" + std::to_string(c.heads) + ") is not a multiple of num_key_value_heads (" +
                        std::to_string(c.kv_heads) + ")");
  if (c.is_diff()) {
    if (c.heads % 2)
      fail_file(file, std::string(spec->family) + " needs an even num_attention_heads (two maps per differential head)");
    if (c.kv_heads % 2) fail_file(file, std::string(spec->family) + " needs an even num_key_value_heads");
  }
  // Products that size buffers: keep them well inside 64 bits (each factor <= 2^24, so two or three are safe).
  if (double(c.heads) * c.head_dim > double(kMaxDim)) fail_file(file, "num_attention_heads x head_dim is too large");
  c.norm_eps = get_num(j, spec->norm_eps_key, file, spec->norm == NormKind::LayerNorm ? 1e-5 : 1e-6);
  if (!(c.norm_eps > 0)) fail_file(file, std::string(spec->norm_eps_key) + " must be positive");
  c.subln_eps = spec->subln_eps_fixed > 0 ? spec->subln_eps_fixed : get_num(j, spec->subln_eps_key, file, c.norm_eps);
  if (!(c.subln_eps > 0)) fail_file(file, std::string(spec->subln_eps_key) + " must be positive");
  c.tie_embeddings = get_bool(j, "tie_word_embeddings", file, false);
  if (j.contains("hidden_act") && j["hidden_act"].is_string() && j["hidden_act"] != spec->hidden_act)
    fail_file(file, "hidden_act '" + j["hidden_act"].get<std::string>() + "' is not supported for " + spec->family +
                        " (only " + spec->hidden_act + ")");
  for (const std::string& k : spec->refuse_keys)
    if (j.contains(k) && !j[k].is_null() && j[k] != false && j[k] != 0)
      fail_file(file, "config.json has " + k + ": " + spec->refused_variant + ", which diffscope does not run");
  if (get_bool(j, "attention_bias", file, false)) fail_file(file, "attention_bias = true is not supported");
  if (get_bool(j, "use_bias", file, false)) fail_file(file, "use_bias = true is not supported");
  if (spec->schedule == Schedule::Uniform && get_bool(j, "use_sliding_window", file, false))
    fail_file(file, "use_sliding_window = true is not supported (full causal attention only)");
  if (get_bool(j, "mlp_bias", file, false)) fail_file(file, "mlp_bias = true is not supported");
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"];
  if (j.contains("eos_token_id")) {
    for (int32_t id : eos_ids_of(j["eos_token_id"]))
      if (id >= 0 && id < c.vocab) c.eos_ids.push_back(id);
    if (!c.eos_ids.empty()) c.eos_token_id = c.eos_ids[0];
  }
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.dtype = j["torch_dtype"];
  if (j.contains("dtype") && j["dtype"].is_string()) c.dtype = j["dtype"];
  if (spec->rotary) parse_rope(j, c, file);
  c.kinds.assign(size_t(c.layers), LayerKind::Attention);
  if (spec->schedule == Schedule::SambaY) parse_sambay(j, c, file);
  return c;
}
}  // namespace

std::vector<int32_t> eos_ids_of(const nlohmann::json& v) {
  std::vector<int32_t> out;
  auto add = [&](const nlohmann::json& x) {
    if (x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX) out.push_back(x.get<int32_t>());
  };
  if (v.is_array())
    for (const auto& x : v) add(x);
  else
    add(v);
  return out;
}

std::vector<int32_t> generation_eos_ids(const std::string& model_dir, const std::vector<int32_t>& fallback) {
  // Optional: anything unreadable, malformed, too large or too deep is as if it were absent.
  nlohmann::json j;
  try {
    j = parse_json(read_text_file(model_dir + "/generation_config.json", 1 << 20, "generation config"), "");
  } catch (const std::exception&) {
    return fallback;
  }
  if (!j.is_object() || !j.contains("eos_token_id")) return fallback;
  std::vector<int32_t> ids = eos_ids_of(j["eos_token_id"]);
  return ids.empty() ? fallback : ids;
}

ModelConfig load_config(const std::string& path) {
  if (!std::filesystem::exists(path)) fail_file(path, "cannot open (is this a Hugging Face model folder?)");
  return parse_config_json(read_text_file(path, 16u << 20, "model config"), path);
}

}  // namespace ds
