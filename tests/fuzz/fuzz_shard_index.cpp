// Fuzz model.safetensors.index.json handling: the input is the index; the folder has no shards, so every
// accepted index must name files that then fail cleanly.
#include <filesystem>
#include <fstream>

#include "engine/core/error.h"
#include "engine/core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("diffscope-fuzz-index-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  {
    std::ofstream out(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    ds::Checkpoint ck(dir.string());
  } catch (const ds::Error&) {
  }
  return 0;
}
