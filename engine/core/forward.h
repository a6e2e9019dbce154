// The forward pass, written once: the layer schedule and the blocks of every layer kind (attention: full, sliding
// window, cross-layer; Mamba; gated memory unit; the MLP; the final norm and logits) against a small set of
// operations (fwd::Ops). The backends implement the operations, not the layer: the CPU backend on host f32 arrays
// (the reference the fixtures check), the CUDA backend on its device buffers, for a prompt (every new row of a batch
// of sequences) and for a decoding step (one row whose position is read from device memory, so that the step can be
// captured in a CUDA graph) alike. How an operation is done (which GEMM, which fused epilogue, one row or many) is the
// backend's choice; what is done, in which order, and which family option decides it, is here.
//
// Each architecture-table option (arch.h) is read in exactly one place: the schedule (ModelConfig::kind) in layer(),
// the projection layout (cross-layer queries only) in attention_block(), the norm kind in Ops::norm, rotary in
// Ops::rope, the MLP activation in Ops::linear's GatedAct epilogue, the window and KV source in Ops::attention.
//
// Hook points (HookPoint) are named places in this forward where a caller registers a reader (ops on the tensor at the
// site; today the device reduction Ops::max_abs) or, later, a writer; with none registered the forward tests one empty
// vector per point and launches nothing more.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "engine/core/config.h"

namespace ds::fwd {

// The activations a block names. Each backend maps a name (and a layer, and a row set) to its storage.
enum class Act : uint8_t {
  Stream,  // the residual stream: Stream(l) is layer l's input, Stream(L) the last layer's output (f32)
  Normed,  // the block norm's output, the next projection's input
  Qkv,     // the layer's Q | K | V projections of the new rows (K and V reach the layer's cache)
  Attn,    // the attention output per view head, after the differential heads' sub-layer norm [rows, H d]
  Mlp,     // the MLP's activated gate times up [rows, I]
  Xz,      // Mamba: in_proj's [x | z] [rows, 2 di]
  U,       // Mamba: silu(conv(x)) [rows, di]
  Xdbl,    // Mamba: x_proj's [dt_raw | B | C] [rows, R + 2S]
  Dt,      // Mamba: dt_proj's output [rows, di]
  Mixed,   // Mamba: the scan's output gated by silu(z); GMU: silu(in_proj(x)) * memory [rows, di]
  Logits,  // [rows, vocab]
};

// Which rows of an activation: every row this call runs (the new positions of every sequence), or only the last
// position of each sequence (the last layer of a forward that keeps only the next-token logits).
enum class Rows : uint8_t { New, Last };

struct Ref {
  Act t;
  int layer = 0;  // Stream: which stream row set (0..L); others: the layer they belong to
  Rows rows = Rows::New;
};

// Edits of one attention layer, the attention op's arguments besides lambda (the session's head interventions and
// key knockouts). Differential view head j's output before its sub-layer norm is
//   a1[j] * A1 V - lambda_j * A2 V,   lambda_j = lambda[j] unless NaN (then the layer's lambda),
// so a1[j] = 0 drops A1 and lambda[j] = 0 drops A2; plain heads (Llama) take no head coefficients.
struct KeySpan {
  int64_t q0 = 0, q1 = 0;  // query positions [q0, q1)
  int64_t k0 = 0, k1 = 0;  // do not see keys [k0, k1) (in every map; a row left with no key attends to nothing: 0)
  bool operator==(const KeySpan&) const = default;
};
struct AttnEdit {
  std::vector<float> a1;      // [view heads] or empty (every head 1)
  std::vector<float> lambda;  // [view heads] or empty (every head the layer's); NaN: the layer's
  std::vector<KeySpan> knockout;
  // > 0: the attention logits fake-quantised to this many bits (2..16) before the softmax, symmetric absmax per query
  // row and head (the paper's Figure 8 what-if; cpu_attn::quantize_logit has the formula)
  int logit_bits = 0;
  bool empty() const { return a1.empty() && lambda.empty() && knockout.empty() && logit_bits == 0; }
  bool operator==(const AttnEdit&) const = default;
};
// Per view head (c1, c2) with O = c1 A1 V - c2 A2 V for a layer whose lambda is `lambda`: [2 Hv] (c1, c2 interleaved),
// or empty when the edit leaves every head at (1, lambda).
std::vector<float> head_coefs(const AttnEdit* edit, float lambda, int view_heads);

// The weights a linear op multiplies by (each backend holds them per layer).
enum class Weight : uint8_t { Qkv, Q, O, GateUp, Down, InProj, XProj, DtProj, OutProj, LmHead };
// The profilers' name of a product by this weight: "gemm_qkv", "gemm_q", "gemm_o", "gemm_gate_up", "gemm_down", ...
const char* gemm_name(Weight w);

enum class Norm : uint8_t { Input, PostMixer, Final };

// What the linear op does with its product y = x W^T (+ the stored bias, where the layer has one):
enum class Epilogue : uint8_t {
  None,        // out = y
  Residual,    // out = res + y (res may be out: accumulate in place)
  GatedAct,    // W holds gate rows then up rows: out = act(gate) * up, act the family's MLP activation (arch.h MlpAct)
  SiluMemory,  // out = silu(y) * memory (the GMU's gate; the memory layer's scan output of the same rows)
};

struct Linear {
  int layer = 0;  // -1: not a layer's (the LM head)
  Weight w;
  Ref in, out;
  Epilogue epi = Epilogue::None;
  Ref res{Act::Stream};
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual void embed() = 0;                                     // Stream(0) of the new rows from the token ids
  virtual void norm(int layer, Norm which, Ref in, Ref out) = 0;  // the family's block norm (RMSNorm / LayerNorm)
  virtual void linear(const Linear& op) = 0;
  // RoPE on the new rows' Q and K where the family has it (arch.h rotary); the rows are the layer's cache rows after.
  virtual void rope(int layer) = 0;
  // Qkv(layer) against the keys and values of the layer's KV source (its own, or kv_source's for cross-attention),
  // causal, inside the layer's window: Attn(layer) for `rows` (differential heads: A1 - lambda A2, the sub-layer
  // norm, times 1 - lambda_init). A backend may compute every new row's attention even when asked for the last.
  // edit: the layer's head coefficients and knockouts (null: none).
  virtual void attention(int layer, float lambda, Rows rows, const AttnEdit* edit) = 0;
  virtual void conv(int layer) = 0;               // Mamba: U = silu(causal depthwise conv(x of Xz)), with the state
  virtual void scan(int layer, bool memory) = 0;  // Mamba: Mixed = scan(U, Dt, B, C) gated by silu(z); memory: keep
                                                  // the ungated output for the GMU layers
  // A reader's reduction: slot `slot` (one per layer) = max(slot, max |x| over the rows of `in`), on the device.
  virtual void max_abs(Ref in, int slot) = 0;
  // A writer's op: columns [col0, col1) of every row of `t` times `factor` (0 zeroes them), in place.
  virtual void scale_columns(Ref t, int64_t col0, int64_t col1, float factor) = 0;
  // A writer's op: columns [col0, col1) of every row of `t` replaced by their mean over the prompt's positions. A
  // prompt's forward (every row: the hook asks for them) computes the mean into slot `slot` and writes it; a decoding
  // step writes the slot's mean (the prompt's) into its row.
  virtual void mean_columns(Ref t, int64_t col0, int64_t col1, int slot) = 0;
  // An attention output kept across forwards (bulk re-runs of one layer's head ablations, whose input and attention
  // edits do not change between them): keep_attention, after the attention op and before the HeadOut hooks, lets the
  // backend keep Attn(layer) of `rows` (it may decline); attention_kept, at the start of a later forward's attention
  // block, is true when the backend restored Attn(layer) from what it kept for this input, lambda and edit: the block
  // then skips its norm, projections, RoPE and attention.
  virtual void keep_attention(int layer, float lambda, Rows rows, const AttnEdit* edit) {
    (void)layer, (void)lambda, (void)rows, (void)edit;
  }
  virtual bool attention_kept(int layer, float lambda, const AttnEdit* edit) {
    (void)layer, (void)lambda, (void)edit;
    return false;
  }
  // Polled between layers and between a layer's blocks: true stops the forward (ForwardCancelled).
  virtual bool cancelled() { return false; }
  // Around each layer of run_layers: a backend that keeps the layers' rows elsewhere than where the ops read and write
  // them (the CUDA backend's host caches: two device slots per activation, every layer's rows in host memory) places
  // the layer's slots before it and moves its rows out after it.
  virtual void layer_begin(int layer) { (void)layer; }
  virtual void layer_end(int layer) { (void)layer; }
};

// --- hooks -----------------------------------------------------------------------------------------------------
enum class HookPoint : uint8_t {
  BlockIn,   // the residual stream entering layer l (Stream(l))
  MixerOut,  // the stream after the mixer's residual add, before the MLP (Stream(l + 1), partial)
  BlockOut,  // the stream leaving layer l (Stream(l + 1))
  HeadOut,   // every head's attention output before o_proj (Attn(l))
};
struct HookSite {
  HookPoint at;
  int layer;
  Ref tensor;
};
using HookFn = std::function<void(Ops&, const HookSite&)>;
struct Hook {
  HookPoint at;
  int layer = -1;  // -1: every layer
  HookFn fn;
  bool all_rows = true;  // needs every row of the stream (the last layer then runs its MLP on every row)
};

class Hooks {
 public:
  void add(Hook h) { hooks_.push_back(std::move(h)); }
  bool empty() const { return hooks_.empty(); }
  bool needs_all_rows() const;
  void call(HookPoint at, int layer, Ref tensor, Ops& ops) const;

 private:
  std::vector<Hook> hooks_;
};

// The reader of the paper's Table 5: per layer, the largest |hidden state| of the layer's output (Ops::max_abs into
// slot l at BlockOut).
Hook max_abs_hidden_hook();
// A writer: view head `head` of attention layer `layer` has its output (after the differential heads' sub-layer norm
// and 1 - lambda_init, before o_proj: Attn(layer)'s columns of that head) multiplied by `factor`; 0 ablates the head.
Hook scale_head_hook(const ModelConfig& cfg, int layer, int head, float factor);
// A writer: view head `head`'s output replaced by its mean over the prompt's positions (slot: the backend's place for
// that mean; one per hook).
Hook mean_head_hook(const ModelConfig& cfg, int layer, int head, int slot);
// The columns of view head `head` in Attn(l): [first, second).
std::pair<int64_t, int64_t> head_columns(const ModelConfig& cfg, int head);

// --- the forward ------------------------------------------------------------------------------------------------
struct Plan {
  int from_layer = 0;            // layers below reuse the previous call's outputs; 0 also embeds the ids
  bool last_rows_only = false;   // the last layer carries only each sequence's last position past its mixer
  const float* lambda = nullptr; // [L] (differential families; ignored otherwise)
  const Hooks* hooks = nullptr;
  const std::vector<AttnEdit>* edits = nullptr;  // [L] or null: the attention op's edits per layer
  int to_layer = -1;             // one past the last layer to run (-1: every layer); a layer split's block stops there
};

// Whether the last layer runs its MLP on the last positions only: plan.last_rows_only, unless a hook needs every row.
bool last_rows_only(const Plan& plan);
// Embedding (from_layer 0), then layers from_layer .. to_layer - 1 (L - 1). Throws ForwardCancelled(l) when ops.cancelled() turns
// true before or inside layer l.
void run_layers(const ModelConfig& cfg, Ops& ops, const Plan& plan);
// One layer: its mixer block (attention, Mamba or GMU, with its pre-norm and residual add) and its MLP block.
void layer(const ModelConfig& cfg, Ops& ops, int l, float lambda, bool last_only, const Hooks* hooks,
           const AttnEdit* edit = nullptr);
// Parts of the blocks again, for the map queries, over a layer's cached input (an Ops in a mode that leaves the
// caches and states as they are): the attention block's queries (Qkv(l) holds Q), and a Mamba block's scan inputs
// (Xz, U, Xdbl, Dt) from a zero conv state.
void queries(const ModelConfig& cfg, Ops& ops, int l);
void mamba_inputs(const ModelConfig& cfg, Ops& ops, int l);
// The final norm and the LM head over `rows` of Stream(L): Logits.
void logits(const ModelConfig& cfg, Ops& ops, Rows rows);
// The logit lens: the same over `rows` of Stream(layer + 1), the residual stream leaving layer `layer`.
void lens(const ModelConfig& cfg, Ops& ops, int layer, Rows rows);

}  // namespace ds::fwd
