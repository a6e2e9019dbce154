// Choosing a backend by name (session layer, library diffscope_engine): the one place that knows every backend,
// so that the core and the backends never refer to each other or upwards.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/backend.h"

namespace ds {

// Which backend, and for CUDA which GPU. BackendChoice::Auto / Cpu / Cuda are the choices on device 0.
struct BackendChoice {
  enum class Kind { Auto, Cpu, Cuda };
  Kind kind = Kind::Auto;
  int device = 0;  // CUDA device index (Auto and Cuda)
  static const BackendChoice Auto, Cpu, Cuda;
  bool operator==(const BackendChoice&) const = default;
};
inline constexpr BackendChoice BackendChoice::Auto{BackendChoice::Kind::Auto, 0};
inline constexpr BackendChoice BackendChoice::Cpu{BackendChoice::Kind::Cpu, 0};
inline constexpr BackendChoice BackendChoice::Cuda{BackendChoice::Kind::Cuda, 0};

// "cpu" | "cuda" | "cuda:N" (GPU N) | "auto"; throws ds::Error naming the value on anything else.
BackendChoice parse_backend_choice(const std::string& s);

// Several backends, one per replica of a scan: "cuda:all" (every usable GPU), "cuda:0,1" (a bare number after a CUDA
// entry is another GPU), "cuda:0,0" (two on one GPU), "cpu,cpu" (CPU backends standing in for devices: the tests), or
// one choice as above. Throws ds::Error naming the value (an unknown entry, a GPU that is not there, cuda:all with
// none).
std::vector<BackendChoice> parse_backend_list(const std::string& s);
std::string backend_list_text(const std::vector<BackendChoice>& list);  // "cuda:0,1", "cpu,cpu"
// A size as --gpu-mem-limit takes it: bytes, or a number with K, M, G or T (powers of 1024; "20G", "1.5T"). Throws
// ds::Error naming `flag` for anything else or a size below 1 MiB.
int64_t parse_size(const std::string& s, const std::string& flag);

// Auto: CUDA when a usable device is present in a build with CUDA, else the CPU. Cuda: throws ds::Error saying
// why when that cannot be had. cpu_threads: 0 = all cores.
std::unique_ptr<Backend> make_backend(BackendChoice choice, int cpu_threads = 0);

}  // namespace ds
