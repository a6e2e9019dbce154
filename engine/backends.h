// Choosing a backend by name (session layer, library diffscope_engine): the one place that knows every backend,
// so that the core and the backends never refer to each other or upwards.
#pragma once
#include <memory>
#include <string>

#include "backend.h"

namespace ds {

enum class BackendChoice { Auto, Cpu, Cuda };
BackendChoice parse_backend_choice(const std::string& s);  // "cpu" | "cuda" | "auto"; throws on anything else

// Auto: CUDA when a usable device is present in a build with CUDA, else the CPU. Cuda: throws ds::Error saying
// why when that cannot be had. cpu_threads: 0 = all cores.
std::unique_ptr<Backend> make_backend(BackendChoice choice, int cpu_threads = 0);

}  // namespace ds
