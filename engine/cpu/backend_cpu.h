// The CPU backend (library diffscope_cpu): OpenBLAS GEMMs and f32 everywhere; the reference the CUDA backend and
// the transformers fixtures are checked against.
#pragma once
#include <memory>

#include "engine/core/backend.h"

namespace ds {

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);  // 0 = all cores

}  // namespace ds
