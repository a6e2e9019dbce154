// Model configuration read from a Hugging Face config.json of a family in the architecture table (arch.h:
// DiffLlamaForCausalLM, LlamaForCausalLM, MotifForCausalLM, Phi4FlashForCausalLM), in both the transformers 4.x
// spelling (rope_theta + rope_scaling) and the 5.x one (rope_parameters). Anything else is refused with a message
// naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/core/arch.h"
#include "kernels/attn_heads.h"

namespace ds {

struct RopeConfig {
  enum Type { Default, Llama3 } type = Default;
  double theta = 10000.0;
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

// A layer's mixer (arch.h, Schedule). Attention kinds have maps; the others have none.
enum class LayerKind {
  Attention,         // causal self-attention (differential or plain)
  SlidingAttention,  // differential self-attention inside a sliding window (SambaY)
  CrossAttention,    // differential attention of this layer's queries on kv_source's keys and values (SambaY)
  Mamba,             // Mamba-1, output gated by silu(z)
  Memory,            // Mamba-1 whose ungated output is the memory the GMU layers read
  Gmu,               // gated memory unit: out_proj(silu(in_proj(x)) * memory)
};
const char* layer_kind_name(LayerKind k);  // "attention", "sliding window", "cross", "mamba", "memory", "gmu"

struct ModelConfig {
  Arch arch = Arch::DiffLlama;  // the architecture table's row (arch.h)
  std::string model_type;     // config.json's model_type ("diffllama", "llama", "motif", "phi4flash", ...)
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
  double norm_eps = 1e-6;     // the block norms' eps (the row's norm_eps_key)
  double subln_eps = 1e-6;    // the differential heads' sub-layer norm (the row's subln_eps_key)
  bool tie_embeddings = false;
  RopeConfig rope;
  int64_t bos_token_id = -1, eos_token_id = -1;
  std::vector<int32_t> eos_ids;  // every id that ends generation (eos_token_id may be a list; generation_config.json)
  std::string dtype;          // torch_dtype / dtype as written, informational
  // The layer schedule (arch.h): one kind per layer; sliding-window width (keys per query, itself included) of
  // SlidingAttention layers; the layer whose K and V the CrossAttention layers read (-1: none).
  std::vector<LayerKind> kinds;
  int64_t window = 0;
  int64_t kv_source = -1;
  // Mamba-1 (SambaY): d_inner = expand x hidden, state size, conv width, rank of dt.
  int64_t d_inner = 0, d_state = 0, d_conv = 0, dt_rank = 0;

  const ArchSpec& spec() const { return arch_spec(arch); }
  const char* family() const { return spec().family; }
  bool is_diff() const { return spec().differential; }
  // lambda_init of a layer with the family's layer offset (kern::lambda_init has the formula).
  double lambda_init(int64_t layer) const { return kern::lambda_init(layer + spec().lambda_layer_offset); }
  // Heads the viewer shows per layer: differential heads for DiffLlama, query heads for Llama.
  int64_t view_heads() const { return kern::view_heads(is_diff(), int(heads)); }
  int64_t n_rep() const { return heads / kv_heads; }
  // (a config made in code rather than parsed may leave kinds empty: every layer is then attention)
  LayerKind kind(int64_t layer) const { return kinds.empty() ? LayerKind::Attention : kinds.at(size_t(layer)); }
  // Whether layer l has attention maps (and a lambda, for differential families).
  bool has_maps(int64_t layer) const {
    const LayerKind k = kind(layer);
    return k == LayerKind::Attention || k == LayerKind::SlidingAttention || k == LayerKind::CrossAttention;
  }
  // Whether layer l runs a selective scan (Mamba, memory) and so has an implicit attention map per channel
  // (Backend::mamba_view).
  bool has_scan(int64_t layer) const {
    const LayerKind k = kind(layer);
    return k == LayerKind::Mamba || k == LayerKind::Memory;
  }
  // Keys a query of layer l sees at most (0: every earlier key).
  int64_t layer_window(int64_t layer) const { return kind(layer) == LayerKind::SlidingAttention ? window : 0; }
  // The layer whose K and V layer l's attention reads: itself, or kv_source for cross-attention.
  int64_t kv_layer(int64_t layer) const { return kind(layer) == LayerKind::CrossAttention ? kv_source : layer; }
  // Every layer attends over its own keys and values (no Mamba, GMU or cross-layer layer): what the CUDA backend's
  // host caches (and a layer split's plan for them) take.
  bool self_attention_only() const {
    for (int64_t l = 0; l < layers; ++l)
      if (!has_maps(l) || kv_layer(l) != l) return false;
    return d_inner == 0;
  }
  // Layers with maps, in order.
  std::vector<int64_t> map_layers() const;
  // The layer with maps nearest to l, looking first in direction dir (+1 / -1): what a viewer selects when asked
  // for layer l (l itself when it has maps; l clamped to the model first).
  int64_t nearest_map_layer(int64_t l, int dir = 1) const;
  // The same over layers with maps or a scan: what the head view selects (a GMU layer has neither).
  int64_t nearest_view_layer(int64_t l, int dir = 1) const;
  // One line for the viewer: "sliding window (512 keys)", "cross (keys and values of layer 17)", "mamba", ...
  std::string layer_label(int64_t layer) const;
  // "layer 4 is a memory layer: it has no attention maps" (what = "attention maps", "lambda", ...)
  std::string no_attention(int64_t layer, const char* what) const;
  int64_t params() const;  // parameter count implied by the shapes
  // A layer split's shares (split_backend.h): each layer's even share of the parameters outside the embedding and the
  // LM head, and what a block of layers [first, end) holds: its layers, the embedding with layer 0, the LM head with
  // the last layer (the embedding again there when tied). The whole model: params().
  double layer_share_params() const;
  double block_params(int64_t first, int64_t end) const;
};

ModelConfig parse_config_json(const std::string& json_text, const std::string& file_for_messages);
ModelConfig load_config(const std::string& path);  // config.json path
// The ids in an eos_token_id value (an integer or a list of integers; anything else: none).
std::vector<int32_t> eos_ids_of(const nlohmann::json& v);
// The model folder's generation_config.json eos_token_id, when the file exists and says one; else `fallback`.
// A file that does not parse is ignored (generation then stops at config.json's ids).
std::vector<int32_t> generation_eos_ids(const std::string& model_dir, const std::vector<int32_t>& fallback);

}  // namespace ds
