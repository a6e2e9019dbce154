// See synthetic_model.h.
#include "synthetic_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/safetensors.h"

namespace ds {

int64_t write_synthetic_model(const std::string& dir, const SyntheticShape& s, uint64_t seed) {
  std::filesystem::create_directories(dir);
  nlohmann::json c = {{"architectures", {s.diff ? "DiffLlamaForCausalLM" : "LlamaForCausalLM"}},
                      {"model_type", s.diff ? "diffllama" : "llama"},
                      {"hidden_size", s.hidden},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"intermediate_size", s.intermediate},
                      {"vocab_size", s.vocab},
                      {"max_position_embeddings", s.max_positions},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", true},
                      {"hidden_act", "silu"},
                      {"torch_dtype", "bfloat16"}};
  std::ofstream(dir + "/config.json") << c.dump(2);

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<std::vector<uint16_t>> store;
  std::vector<TensorOut> out;
  int64_t params = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float std) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    params += n;
    std::vector<uint16_t> v(static_cast<size_t>(n));
    std::normal_distribution<float> g(mean, std);
    for (auto& x : v) x = f32_to_bf16(std > 0 ? g(rng) : mean);
    store.push_back(std::move(v));
    out.push_back({name, DType::BF16, shape, nullptr});
  };
  const int64_t D = s.hidden, H = s.heads, K = s.kv_heads, d = s.head_dim, I = s.intermediate;
  add("model.embed_tokens.weight", {s.vocab, D}, 0, 0.02f);
  add("model.norm.weight", {D}, 1, 0);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D}, 1, 0);
    add(p + "post_attention_layernorm.weight", {D}, 1, 0);
    add(p + "self_attn.q_proj.weight", {H * d, D}, 0, 0.02f);
    add(p + "self_attn.k_proj.weight", {K * d, D}, 0, 0.02f);
    add(p + "self_attn.v_proj.weight", {K * d, D}, 0, 0.02f);
    add(p + "self_attn.o_proj.weight", {D, H * d}, 0, 0.02f);
    add(p + "mlp.gate_proj.weight", {I, D}, 0, 0.02f);
    add(p + "mlp.up_proj.weight", {I, D}, 0, 0.02f);
    add(p + "mlp.down_proj.weight", {D, I}, 0, 0.02f);
    if (s.diff)
      for (const char* lam : {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"})
        add(p + "self_attn." + lam, {d}, 0, 0.1f);
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = store[i].data();
  write_safetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
  return params;
}

}  // namespace ds
