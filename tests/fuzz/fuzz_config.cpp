// Fuzz config.json parsing, including the size checks that guard buffer sizes.
#include <string>

#include "engine/core/config.h"
#include "engine/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ds::ModelConfig c = ds::parse_config_json(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    (void)c.params();
  } catch (const ds::Error&) {
  }
  return 0;
}
