// Fuzz tokenizer.json loading; whatever loads must also encode and decode a mixed string without trouble.
#include "engine/core/error.h"
#include "engine/core/tokenizer.h"
#include <unistd.h>

#include <fstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/diffscope-fuzz-tokenizer-" + std::to_string(getpid()) + ".json";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    auto tok = ds::load_tokenizer(path);
    if (tok) {
      auto ids = tok->encode("Hello world\xc3\xa9 12345 \xe4\xb8\xad\n\n  <|begin_of_text|>x", true);
      (void)tok->decode(ids);
      (void)tok->encode_spans("it's 3.14", false);
    }
  } catch (const ds::Error&) {
  }
  return 0;
}
