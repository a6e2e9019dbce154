// The CUDA backend (library diffscope_cuda): how to make one, and what it offers beyond the Backend interface
// (backend.h): per-head map statistics computed on the GPU, and the profiling switch. In a build without CUDA the
// session layer's cuda_unavailable.cpp stands in: make_cuda_backend() throws and cuda_backend_available() says why.
// `b` below must come from make_cuda_backend() (ds::Error otherwise).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend.h"

namespace ds {

// The CUDA backend on GPU `device` (0 = the first); every entry point of it runs on that device, whichever thread
// calls it. Throws ds::Error saying why when CUDA is not compiled in or no usable device is present.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
bool cuda_backend_available(std::string* why_not, int device = 0);

// Statistics of one view head of a layer for the last forward, each a mean over query rows q (row q has the q+1
// causal keys 0..q), except the extremes. D = A1 - lambda*A2 (D = A1 for Llama, whose A2 fields are 0).
struct CudaHeadStats {
  float entropy1 = 0, entropy2 = 0;  // nats, of the softmax rows of A1 and A2
  float entropy_diff = 0;            // nats, of |D| renormalised per row
  float first1 = 0, first2 = 0;      // mass on key 0 (the attention sink)
  float first_diff = 0;              // D at key 0
  float neg_mass = 0;                // sum over keys of max(0, -D)
  float diff_min = 0, diff_max = 0;  // extremes of D over the causal cells
  float max_logit1 = 0, max_logit2 = 0;  // largest q.k/sqrt(d) of the layer's rows (max over rows)
};

// Recomputes the maps of `layer` from the cached Q/K on the GPU and reduces them there; nothing n x n is copied.
std::vector<CudaHeadStats> cuda_layer_head_stats(Backend& b, int layer);

// Profiling (CUDA events per kernel, %globaltimer per attention block) is on by default; it costs a few
// microseconds of launch time per kernel. Off: profile() reports only forward_ms.
void cuda_set_profiling(Backend& b, bool on);

}  // namespace ds
