// The backend factory: names to backends. Links down to both backend libraries (or the CUDA stand-in).
#include "backends.h"

#include "backend_cpu.h"
#include "backend_cuda.h"
#include "error.h"

namespace ds {

BackendChoice parse_backend_choice(const std::string& s) {
  if (s == "auto") return BackendChoice::Auto;
  if (s == "cpu") return BackendChoice::Cpu;
  if (s == "cuda") return BackendChoice::Cuda;
  throw Error("unknown backend '" + s + "' (use cpu, cuda or auto)");
}

std::unique_ptr<Backend> make_backend(BackendChoice choice, int cpu_threads) {
  std::string why;
  if (choice == BackendChoice::Cuda || (choice == BackendChoice::Auto && cuda_backend_available(&why)))
    return make_cuda_backend();
  return make_cpu_backend(cpu_threads);
}

}  // namespace ds
