// Layers across devices (--backend cuda:0,1 or cuda:all): contiguous blocks of layers, one block per device, each a
// backend of its own (Backend::set_layer_range) holding its layers' weights, caches and streams; the residual stream
// is handed from block to block once per boundary (peer to peer between GPUs, ForwardRequest::stream_in), the
// embedding sits with layer 0 and the final norm and LM head with the last layer. Everything the engine asks of a
// backend keeps working: views, rows, statistics, row masses and outlier passes go to the block that holds the layer
// (only their small results cross), a lambda change re-runs from the changed layer's block on, a decoding step runs
// each block's one-row step (a CUDA graph per GPU) with one row between them, hooks and interventions run where their
// layer is. CPU backends stand in for devices in the tests (two CPU blocks give one CPU backend's numbers bit for bit).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/config.h"
#include "engine/session/backends.h"

namespace ds {

struct SplitOptions {
  std::vector<BackendChoice> backends;  // one block each at most (a model that fits fewer uses fewer)
  int cpu_threads = 0;
  int64_t mem_limit = 0;     // bytes each device may hold (--gpu-mem-limit); 0: its free memory
  int64_t plan_tokens = 4096;  // activations planned for this many tokens when placing the layers
};

// Where the layers go: [first, end) per block, in device order, as few devices as hold the model (one when it fits the
// first). Throws ds::Error with the numbers when all of them together cannot hold it.
struct Placement {
  std::vector<int> first, end;  // per block
  std::vector<int> dev;         // per block: its index in SplitOptions::backends (a device too small for a layer is skipped)
  std::vector<size_t> need;     // bytes each block plans for
  std::vector<int64_t> budget;  // bytes each device offers (after the limit and a reserve)
  // The devices cannot hold every layer's rows of plan_tokens tokens: the CUDA backends keep them in host memory
  // (backend_cuda_impl.h, host caches), host_bytes in all; need then counts the device's two slots.
  bool host_caches = false;
  size_t host_bytes = 0;
};
Placement place_layers(const ModelConfig& cfg, const SplitOptions& opt);
std::string placement_text(const Placement& p, const std::vector<BackendChoice>& backends);

// One backend when the placement needs one device, else a split over the devices it uses. The returned backend is
// not loaded; its load() places the layers (place_layers) for the model it is given.
std::unique_ptr<Backend> make_backend_for(const SplitOptions& opt);

}  // namespace ds
