// A validated checkpoint: config plus every tensor the forward pass needs, each checked against the shape the
// config implies. Backends read weights from here (CPU: converted to f32; CUDA: streamed to the device) and the
// Model can be dropped once they have, which releases the mapping.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/config.h"
#include "engine/core/safetensors.h"

namespace ds {

// A layer's tensors; nullptr where the family or the layer's kind (config.h) has none.
struct LayerTensors {
  const TensorInfo *ln1 = nullptr, *ln2 = nullptr;      // input_layernorm, post_attention_layernorm [hidden]
  const TensorInfo *ln1_b = nullptr, *ln2_b = nullptr;  // their biases (LayerNorm families)
  // [H*d, hidden], [Hkv*d, hidden], [Hkv*d, hidden], [hidden, H*d]; or the fused [q|k|v] (cross-attention layers:
  // q rows only) with its bias, and o's bias (arch.h: attn_bias)
  const TensorInfo *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const TensorInfo *qkv = nullptr, *qkv_b = nullptr, *o_b = nullptr;
  const TensorInfo *gate = nullptr, *up = nullptr, *down = nullptr;  // [I, hidden], [I, hidden], [hidden, I]
  const TensorInfo* gate_up = nullptr;                               // fused [2I, hidden]: gate rows, then up rows
  const TensorInfo *lq1 = nullptr, *lk1 = nullptr, *lq2 = nullptr, *lk2 = nullptr;  // differential: [d]
  const TensorInfo* subln = nullptr;                                                 // learned sub-norm scale [2d]
  const TensorInfo *act_w = nullptr, *act_b = nullptr;                               // PolyNorm [3], [1]
  // Mamba-1 (Mamba, Memory layers; docs/models/phi4flash.md section 4): in_proj [2 di, hidden], conv [di, 1, K] +
  // bias [di], x_proj [R + 2S, di], dt_proj [di, R] + bias [di], A_log [di, S], D [di], out_proj [hidden, di].
  // GMU layers: in_proj [di, hidden], out_proj [hidden, di].
  const TensorInfo *in_proj = nullptr, *conv_w = nullptr, *conv_b = nullptr, *x_proj = nullptr, *dt_w = nullptr,
                   *dt_b = nullptr, *a_log = nullptr, *d_skip = nullptr, *out_proj = nullptr;
};

enum class LayerWeight { Q, K, V, O };

struct Model {
  std::string dir;                 // the directory (or file) the user opened
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  const TensorInfo* embed = nullptr;       // [vocab, hidden]
  const TensorInfo* final_norm = nullptr;  // [hidden]
  const TensorInfo* final_norm_b = nullptr;  // [hidden] (LayerNorm families)
  const TensorInfo* lm_head = nullptr;     // [vocab, hidden]; == embed when tied
  std::vector<LayerTensors> layers;
  std::vector<double> model_lambda;        // differential: lambda_full of each layer with maps (0 for the others)

  size_t weight_bytes() const;
  // A projection as f32 [rows, cols] in the layout both backends compute with (arch.h): q/k/v rows of interleaved
  // pairs permuted into the chunked order, the sub-layer norm's learned scale folded into o_proj's columns
  // (o_proj(g * s) = (o_proj diag g) s). weight_transformed says whether the family changes w at all (a loader
  // may stream the others as stored).
  // A fused q|k|v projection gives its q, k or v rows (empty: a cross-attention layer's k and v).
  std::vector<float> layer_weight_f32(int64_t layer, LayerWeight w) const;
  // The projection's bias in the same layout (empty: none).
  std::vector<float> layer_bias_f32(int64_t layer, LayerWeight w) const;
  bool weight_transformed(LayerWeight w) const;
  // The stored tensor that holds w (the fused one for q/k/v of a fused projection).
  const TensorInfo* layer_tensor(int64_t layer, LayerWeight w) const;

 private:
  std::vector<float> layer_qkv_rows(int64_t layer, LayerWeight w, bool bias) const;
  std::vector<float> pair_layout(std::vector<float> x, LayerWeight w, int64_t cols) const;
};

// Open DIR (config.json + safetensors) and validate everything; throws ds::Error with a one-line message naming
// the file and the problem. Never returns a partly loaded model.
std::unique_ptr<Model> load_model(const std::string& dir);

}  // namespace ds
