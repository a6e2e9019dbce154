// The architecture table (arch.h). Sources of each row's facts: DiffLlama and Llama from transformers'
// modeling_diffllama.py / modeling_llama.py; Motif from its published modeling_motif.py (docs/models/motif.md).
#include "arch.h"

namespace ds {

namespace {

const std::vector<ArchSpec> kArchTable = {
    {Arch::DiffLlama, "DiffLlama", "DiffLlamaForCausalLM", "diffllama", true, Pairing::Chunked, 0, "rms_norm_eps", false,
     MlpAct::Silu, nullptr, "silu", 0.0, "self_attn.lambda_q1", "self_attn.lambda_k1", "self_attn.lambda_q2", "self_attn.lambda_k2",
     nullptr, nullptr, nullptr, {}, nullptr},
    {Arch::Llama, "Llama", "LlamaForCausalLM", "llama", false, Pairing::None, 0, "rms_norm_eps", false, MlpAct::Silu,
     nullptr, "silu", 0.0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, {}, nullptr},
    {Arch::Motif, "Motif", "MotifForCausalLM", "motif", true, Pairing::Interleaved, -1, "attn_rms_norm_eps", true,
     MlpAct::PolyNorm, "num_noise_heads", "poly_norm", 1e-6, "self_attn.lambda_q1", "self_attn.lambda_k1", "self_attn.lambda_q2",
     "self_attn.lambda_k2", "self_attn.subln.weight", "mlp.act_fn.weight", "mlp.act_fn.bias",
     {"kv_lora_rank", "mhc_enabled", "num_experts"}, "a Motif-3 model (latent attention, mixture of experts)"},
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
