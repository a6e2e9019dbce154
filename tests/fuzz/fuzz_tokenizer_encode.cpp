// Fuzz encoding arbitrary bytes (invalid UTF-8 included) with the test tokenizers of both styles.
#include <string>
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/tokenizer.h"

#ifndef DS_SOURCE_DIR
#define DS_SOURCE_DIR "."
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::vector<std::unique_ptr<ds::Tokenizer>> toks = [] {
    std::vector<std::unique_ptr<ds::Tokenizer>> v;
    const char* dir = getenv("DS_FUZZ_TOKENIZER_DIR");
    const std::string base = dir ? dir : std::string(DS_SOURCE_DIR) + "/tests/tokenizers";
    for (const char* f : {"/llama3.json", "/gpt2.json"}) {
      try {
        v.push_back(ds::load_tokenizer(base + f));
      } catch (const ds::Error& e) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s\n", e.what());
        abort();
      }
    }
    return v;
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& t : toks) {
    auto spans = t->encode_spans(text, true);
    std::vector<int32_t> ids;
    for (const auto& s : spans) {
      if (s.end < s.begin || s.end > text.size()) abort();  // spans must lie inside the prompt
      ids.push_back(s.id);
    }
    (void)t->decode(ids);
  }
  return 0;
}
