// The architecture table (arch.h). Sources of each row's facts: DiffLlama and Llama from transformers'
// modeling_diffllama.py / modeling_llama.py; Motif from its published modeling_motif.py (docs/models/motif.md);
// Phi4Flash from the published modeling_phi4flash.py (docs/models/phi4flash.md).
#include "engine/core/arch.h"

namespace ds {

namespace {

const std::vector<ArchSpec> kArchTable = {
    {.arch = Arch::DiffLlama, .family = "DiffLlama", .architecture = "DiffLlamaForCausalLM",
     .model_type = "diffllama", .differential = true, .pairing = Pairing::Chunked, .lambda_layer_offset = 0,
     .subln_eps_key = "rms_norm_eps", .subln_weight = false, .mlp = MlpAct::Silu, .noise_heads_key = nullptr,
     .hidden_act = "silu", .act_eps = 0.0, .lambda_q1 = "self_attn.lambda_q1", .lambda_k1 = "self_attn.lambda_k1",
     .lambda_q2 = "self_attn.lambda_q2", .lambda_k2 = "self_attn.lambda_k2", .subln = nullptr, .act_weight = nullptr,
     .act_bias = nullptr, .refuse_keys = {}, .refused_variant = nullptr},
    {.arch = Arch::Llama, .family = "Llama", .architecture = "LlamaForCausalLM", .model_type = "llama",
     .differential = false, .pairing = Pairing::None, .lambda_layer_offset = 0, .subln_eps_key = "rms_norm_eps",
     .subln_weight = false, .mlp = MlpAct::Silu, .noise_heads_key = nullptr, .hidden_act = "silu", .act_eps = 0.0,
     .lambda_q1 = nullptr, .lambda_k1 = nullptr, .lambda_q2 = nullptr, .lambda_k2 = nullptr, .subln = nullptr,
     .act_weight = nullptr, .act_bias = nullptr, .refuse_keys = {}, .refused_variant = nullptr},
    {.arch = Arch::Motif, .family = "Motif", .architecture = "MotifForCausalLM", .model_type = "motif",
     .differential = true, .pairing = Pairing::Interleaved, .lambda_layer_offset = -1,
     .subln_eps_key = "attn_rms_norm_eps", .subln_weight = true, .mlp = MlpAct::PolyNorm,
     .noise_heads_key = "num_noise_heads", .hidden_act = "poly_norm", .act_eps = 1e-6,
     .lambda_q1 = "self_attn.lambda_q1", .lambda_k1 = "self_attn.lambda_k1", .lambda_q2 = "self_attn.lambda_q2",
     .lambda_k2 = "self_attn.lambda_k2", .subln = "self_attn.subln.weight", .act_weight = "mlp.act_fn.weight",
     .act_bias = "mlp.act_fn.bias", .refuse_keys = {"kv_lora_rank", "mhc_enabled", "num_experts"},
     .refused_variant = "a Motif-3 model (latent attention, mixture of experts)"},
    {.arch = Arch::Phi4Flash, .family = "Phi4Flash", .architecture = "Phi4FlashForCausalLM", .model_type = "phi4flash",
     .differential = true, .pairing = Pairing::Interleaved, .lambda_layer_offset = 0, .subln_eps_key = nullptr,
     .subln_weight = true, .mlp = MlpAct::Silu, .noise_heads_key = nullptr, .hidden_act = "silu", .act_eps = 0.0,
     .lambda_q1 = "attn.inner_cross_attn.lambda_q1", .lambda_k1 = "attn.inner_cross_attn.lambda_k1",
     .lambda_q2 = "attn.inner_cross_attn.lambda_q2", .lambda_k2 = "attn.inner_cross_attn.lambda_k2",
     .subln = "attn.inner_cross_attn.subln.weight", .act_weight = nullptr, .act_bias = nullptr, .refuse_keys = {},
     .refused_variant = nullptr, .schedule = Schedule::SambaY, .norm = NormKind::LayerNorm,
     .norm_eps_key = "layer_norm_eps", .rotary = false, .subln_eps_fixed = 1e-5, .q_proj = nullptr, .k_proj = nullptr,
     .v_proj = nullptr, .qkv_proj = "attn.Wqkv", .o_proj = "attn.out_proj", .attn_bias = true, .gate_proj = nullptr,
     .up_proj = nullptr, .gate_up_proj = "mlp.fc1", .down_proj = "mlp.fc2", .mixer = "attn.",
     .final_norm = "model.final_layernorm"},
};

}  // namespace

const std::vector<ArchSpec>& arch_table() { return kArchTable; }

const ArchSpec& arch_spec(Arch a) {
  for (const ArchSpec& s : kArchTable)
    if (s.arch == a) return s;
  return kArchTable.front();  // unreachable: every Arch has a row
}

const ArchSpec* find_arch(const std::string& architecture, const std::string& model_type) {
  for (const ArchSpec& s : kArchTable)
    if (!architecture.empty() ? architecture == s.architecture : model_type == s.model_type) return &s;
  return nullptr;
}

std::string supported_architectures() {
  std::string out;
  for (const ArchSpec& s : kArchTable) out += (out.empty() ? "" : ", ") + std::string(s.architecture);
  return out;
}

}  // namespace ds
