// The backend factory: names to backends. Links down to both backend libraries (or the CUDA stand-in).
#include "engine/session/backends.h"

#include "engine/cpu/backend_cpu.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/core/error.h"

namespace ds {

BackendChoice parse_backend_choice(const std::string& s) {
  if (s == "auto") return BackendChoice::Auto;
  if (s == "cpu") return BackendChoice::Cpu;
  if (s == "cuda") return BackendChoice::Cuda;
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 && s.size() <= 8 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return {BackendChoice::Kind::Cuda, std::stoi(s.substr(5))};
  throw Error("unknown backend '" + s + "' (use cpu, cuda, cuda:N for GPU N, or auto)");
}

std::unique_ptr<Backend> make_backend(BackendChoice choice, int cpu_threads) {
  std::string why;
  if (choice.kind == BackendChoice::Kind::Cuda ||
      (choice.kind == BackendChoice::Kind::Auto && cuda_backend_available(&why, choice.device)))
    return make_cuda_backend(choice.device);
  return make_cpu_backend(cpu_threads);
}

}  // namespace ds
