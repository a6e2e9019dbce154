// The model families diffscope opens, as rows of one table. Every family is one decoder (embedding; per layer a
// pre-norm mixer -- attention, plain or differential, full, sliding-window or cross-layer; Mamba-1; a gated memory
// unit -- and a pre-norm gated MLP; final norm; LM head) written once in engine/core/forward.cpp, plus the options below;
// a row names its config.json identity, its tensor names, and those options. The config parser, the checkpoint
// validator, the forward's blocks and ops, the GUI's labels, the CLI and export read the row instead of testing for a
// family; each option is read in one block or one op (forward.h says which).
//
// Adding a family: add a row to kArchTable (arch.cpp) and an Arch value; if it needs an op the options below do not
// describe, add the option here, its block or op in engine/core/forward.cpp, the op on both backends (backend_cpu.cpp,
// backend_cuda_ops.cpp with its kernel in kernels/), a float64 reference in tools/ and fixtures in tests/fixtures/
// (CONTRIBUTING.md, "A new model family").
#pragma once
#include <string>
#include <vector>

namespace ds {

enum class Arch { DiffLlama, Llama, Motif, Phi4Flash };

// How a differential checkpoint lays out the two maps' query/key/value heads. Chunked (transformers' DiffLlama):
// map 1 of differential head j is query head j, map 2 is j + H/2 (keys and values likewise in halves). Interleaved
// (the unilm Differential Transformer code, Motif): maps 1 and 2 are query heads 2j and 2j + 1. Loaders permute
// interleaved q/k/v rows into the chunked order (exact: a permutation), so that the kernels see one layout.
enum class Pairing { None, Chunked, Interleaved };

// The MLP's gate activation: down(act(gate(x)) * up(x)).
enum class MlpAct {
  Silu,      // silu(g)
  PolyNorm,  // w0 N(g^3) + w1 N(g^2) + w2 N(g) + b, N(z) = z / sqrt(mean(z^2) + eps) over the row (Motif)
};

// Which mixer each layer has. Uniform: every layer is self-attention. SambaY (Phi-4-mini-flash, docs/models/
// phi4flash.md section 2): with half = L/2, even layers below half are Mamba-1, odd ones sliding-window differential
// attention; layer half is the memory Mamba (its ungated scan output feeds the gated memory units), half + 1 full
// differential attention whose K and V every cross-attention layer reuses (YOCO); above it even layers are gated
// memory units and odd ones differential cross-attention. ModelConfig::kinds holds the result per layer.
enum class Schedule { Uniform, SambaY };

// The block norms (input, post-attention, final): RMSNorm with a weight, or LayerNorm with a weight and a bias.
enum class NormKind { Rms, LayerNorm };

struct ArchSpec {
  Arch arch;
  const char* family;        // label in the GUI, the CLI and exports
  const char* architecture;  // config.json "architectures"[0]
  const char* model_type;    // config.json "model_type"
  bool differential;
  Pairing pairing;
  // lambda_init(l) = 0.8 - 0.6 exp(-0.3 (l + lambda_layer_offset)): 0 in the paper and DiffLlama, -1 in Motif.
  int lambda_layer_offset;
  // The differential heads' sub-layer RMSNorm over 2d: its eps's config key, and whether it has a learned scale
  // (a [2d] vector shared by the heads; loaders fold it into o_proj's columns, exact up to rounding).
  const char* subln_eps_key;
  bool subln_weight;
  MlpAct mlp;
  // Grouped differential attention (Motif-2-12.7B): config key of the noise-head count N. With it, q_proj's Hq
  // heads form N groups of Hq/N: Hq/N - 1 signal heads and one noise head whose map (A2) the group's signal heads
  // share; the loader gives every signal head a copy of its noise head's query rows, which makes it an ordinary
  // differential head (without the key, or with N = Hq/2, every group is one pair).
  const char* noise_heads_key;
  const char* hidden_act;    // the hidden_act value config.json must carry (or leave out)
  double act_eps;            // PolyNorm's eps (fixed in the published code, not in config.json)
  // Tensor names inside model.layers.{l}. (nullptr: the family has none)
  const char* lambda_q1;
  const char* lambda_k1;
  const char* lambda_q2;
  const char* lambda_k2;
  const char* subln;         // [2d]
  const char* act_weight;    // PolyNorm [3]
  const char* act_bias;      // PolyNorm [1]
  // config.json keys that mark a variant under the same architecture name that the engine does not run, and what
  // it is (Motif-3 reuses MotifForCausalLM for latent attention and experts).
  std::vector<std::string> refuse_keys;
  const char* refused_variant;
  // --- options of the hybrid families; the defaults are the Llama-style decoder's
  Schedule schedule = Schedule::Uniform;
  NormKind norm = NormKind::Rms;
  const char* norm_eps_key = "rms_norm_eps";
  bool rotary = true;             // RoPE on q and k (SambaY's attention has no position encoding)
  double subln_eps_fixed = 0;     // > 0: the sub-layer norm's eps is this constant, not subln_eps_key's value
  // Tensor names inside model.layers.{l}. Separate q/k/v/o projections without bias, or one fused [q|k|v]
  // projection (qkv) whose and o's biases are stored when attn_bias.
  const char* q_proj = "self_attn.q_proj";
  const char* k_proj = "self_attn.k_proj";
  const char* v_proj = "self_attn.v_proj";
  const char* qkv_proj = nullptr;
  const char* o_proj = "self_attn.o_proj";
  bool attn_bias = false;
  // The MLP's gate and up projections as two tensors, or fused (gate_up: gate rows first, then up rows).
  const char* gate_proj = "mlp.gate_proj";
  const char* up_proj = "mlp.up_proj";
  const char* gate_up_proj = nullptr;
  const char* down_proj = "mlp.down_proj";
  const char* mixer = "self_attn.";  // prefix of the Mamba / GMU tensors (SambaY: "attn.")
  const char* final_norm = "model.norm";
};

const std::vector<ArchSpec>& arch_table();
const ArchSpec& arch_spec(Arch a);
// The row whose architecture (or, when config.json names none, whose model_type) matches; nullptr if none.
const ArchSpec* find_arch(const std::string& architecture, const std::string& model_type);
// "DiffLlamaForCausalLM, LlamaForCausalLM, MotifForCausalLM, Phi4FlashForCausalLM": for the unsupported-architecture message.
std::string supported_architectures();

}  // namespace ds
