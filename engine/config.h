// Model configuration read from a Hugging Face config.json of a family in the architecture table (arch.h:
// DiffLlamaForCausalLM, LlamaForCausalLM, MotifForCausalLM), in both the transformers 4.x spelling (rope_theta +
// rope_scaling) and the 5.x one (rope_parameters). Anything else is refused with a message naming it.
#pragma once
#include <cstdint>
#include <string>

#include "arch.h"
#include "kernels/attn_heads.h"

namespace ds {

struct RopeConfig {
  enum Type { Default, Llama3 } type = Default;
  double theta = 10000.0;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Arch arch = Arch::DiffLlama;  // the architecture table's row (arch.h)
  std::string model_type;     // "diffllama" / "llama" / "motif"
  int64_t hidden = 0;         // hidden_size
  int64_t layers = 0;         // num_hidden_layers
  int64_t heads = 0;          // query heads as the kernels see them; differential models have heads/2 differential
                              // heads (num_attention_heads, but for grouped noise heads: 2 x the signal heads)
  int64_t stored_q_heads = 0; // q_proj's heads in the checkpoint (num_attention_heads)
  int64_t noise_group = 1;    // signal heads sharing one noise map (grouped differential attention; 1: pairs)
  int64_t kv_heads = 0;       // num_key_value_heads
  int64_t head_dim = 0;       // d
  int64_t intermediate = 0;   // intermediate_size
  int64_t vocab = 0;          // vocab_size
  int64_t max_positions = 0;  // max_position_embeddings
  double rms_eps = 1e-6;
  double subln_eps = 1e-6;    // the differential heads' sub-layer norm (the row's subln_eps_key)
  bool tie_embeddings = false;
  RopeConfig rope;
  int64_t bos_token_id = -1, eos_token_id = -1;
  std::string dtype;          // torch_dtype / dtype as written, informational

  const ArchSpec& spec() const { return arch_spec(arch); }
  const char* family() const { return spec().family; }
  bool is_diff() const { return spec().differential; }
  // lambda_init of a layer with the family's layer offset (kern::lambda_init has the formula).
  double lambda_init(int64_t layer) const { return kern::lambda_init(layer + spec().lambda_layer_offset); }
  // Heads the viewer shows per layer: differential heads for DiffLlama, query heads for Llama.
  int64_t view_heads() const { return kern::view_heads(is_diff(), int(heads)); }
  int64_t n_rep() const { return heads / kv_heads; }
  int64_t params() const;  // parameter count implied by the shapes
};

ModelConfig parse_config_json(const std::string& json_text, const std::string& file_for_messages);
ModelConfig load_config(const std::string& path);  // config.json path

}  // namespace ds
