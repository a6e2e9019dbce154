// A validated checkpoint: config plus every tensor the forward pass needs, each checked against the shape the
// config implies. Backends read weights from here (CPU: converted to f32; CUDA: streamed to the device) and the
// Model can be dropped once they have, which releases the mapping.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "safetensors.h"

namespace ds {

struct LayerTensors {
  const TensorInfo *ln1, *ln2;          // input_layernorm, post_attention_layernorm [hidden]
  const TensorInfo *wq, *wk, *wv, *wo;  // [H*d, hidden], [Hkv*d, hidden], [Hkv*d, hidden], [hidden, H*d]
  const TensorInfo *gate, *up, *down;   // [I, hidden], [I, hidden], [hidden, I]
  const TensorInfo *lq1 = nullptr, *lk1 = nullptr, *lq2 = nullptr, *lk2 = nullptr;  // differential: [d]
  const TensorInfo* subln = nullptr;                                                 // learned sub-norm scale [2d]
  const TensorInfo *act_w = nullptr, *act_b = nullptr;                               // PolyNorm [3], [1]
};

enum class LayerWeight { Q, K, V, O };

struct Model {
  std::string dir;                 // the directory (or file) the user opened
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  const TensorInfo* embed = nullptr;       // [vocab, hidden]
  const TensorInfo* final_norm = nullptr;  // [hidden]
  const TensorInfo* lm_head = nullptr;     // [vocab, hidden]; == embed when tied
  std::vector<LayerTensors> layers;
  std::vector<double> model_lambda;        // differential: lambda_full of each layer as the checkpoint defines it

  size_t weight_bytes() const;
  // A projection as f32 [rows, cols] in the layout both backends compute with (arch.h): q/k/v rows of interleaved
  // pairs permuted into the chunked order, the sub-layer norm's learned scale folded into o_proj's columns
  // (o_proj(g * s) = (o_proj diag g) s). weight_transformed says whether the family changes w at all (a loader
  // may stream the others as stored).
  std::vector<float> layer_weight_f32(int64_t layer, LayerWeight w) const;
  bool weight_transformed(LayerWeight w) const;
  const TensorInfo* layer_tensor(int64_t layer, LayerWeight w) const;
};

// Open DIR (config.json + safetensors) and validate everything; throws ds::Error with a one-line message naming
// the file and the problem. Never returns a partly loaded model.
std::unique_ptr<Model> load_model(const std::string& dir);

}  // namespace ds
