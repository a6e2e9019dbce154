// Without a CUDA compiler the CUDA backend does not exist; asking for it says so.
#ifndef DS_HAVE_CUDA
#include "engine/core/backend.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/core/error.h"

namespace ds {

bool cuda_backend_available(std::string* why_not, int) {
  if (why_not) *why_not = "this build has no CUDA backend (no CUDA compiler was found when it was configured)";
  return false;
}

std::unique_ptr<Backend> make_cuda_backend(int) {
  throw Error("CUDA backend unavailable: this build has no CUDA backend (no CUDA compiler at configure time)");
}

void cuda_set_profiling(Backend&, bool) {}

int cuda_device_count() { return 0; }

int64_t cuda_gemm_timings() { return 0; }

int64_t cuda_logit_pass_launches() { return 0; }

int64_t cuda_free_memory(int) { return 0; }

bool cuda_enable_peer(int, int) { return false; }

DeviceFloats::~DeviceFloats() = default;

std::shared_ptr<DeviceFloats> cuda_device_floats(size_t, int) {
  throw Error("device memory: this build has no CUDA backend (no CUDA compiler at configure time)");
}

}  // namespace ds
#endif
