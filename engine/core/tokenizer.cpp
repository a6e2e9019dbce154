// The tokenizer factory: picks the loader for a file (tokenizer.json -> byte-level BPE, tokenizer.model ->
// sentencepiece) or for a model directory, plus the UTF-8 helpers both tokenizers use for display and decoding.
#include "engine/core/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "engine/core/error.h"

namespace ds {

namespace {

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 when the bytes there are not one; then `bad` is the
// length of the maximal subpart (the longest prefix of a valid sequence, at least 1), per Unicode ch. 3 "U+FFFD
// substitution of maximal subparts".
size_t utf8_valid_len(std::string_view s, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  bad = 1;
  if (c < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char x = b(k);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) return 0;
    bad = k + 1;
  }
  return need + 1;
}

// Copies valid UTF-8 through and hands each maximal invalid subpart to `on_bad`, which appends its stand-in.
template <class OnBad>
std::string map_invalid_utf8(std::string_view bytes, OnBad on_bad) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t bad = 0;
    const size_t n = utf8_valid_len(bytes, i, bad);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      on_bad(out, bytes.substr(i, bad));
      i += bad;
    }
  }
  return out;
}

}  // namespace

std::string display_bytes(std::string_view bytes) {
  return map_invalid_utf8(bytes, [](std::string& out, std::string_view bad) {
    static const char* hex = "0123456789ABCDEF";
    for (const char ch : bad) {
      const auto c = static_cast<unsigned char>(ch);
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  });
}

std::string utf8_lossy(std::string_view bytes) {
  return map_invalid_utf8(bytes, [](std::string& out, std::string_view) { out += "\xEF\xBF\xBD"; });
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    auto tok = find_tokenizer(path);
    if (!tok) fail_file(path, "no tokenizer.json or tokenizer.model in this directory");
    return tok;
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_file(path, "cannot open the tokenizer file (does it exist and is it readable?)");
  // JSON starts with '{' (after whitespace); a sentencepiece model is a binary protobuf.
  char c = 0;
  while (f.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\xEF' || c == '\xBB' || c == '\xBF')) {
  }
  const bool looks_json = f && c == '{';
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".json" || (ext != ".model" && looks_json)) return load_tokenizer_json(path);
  return load_sentencepiece_model(path);
}

std::unique_ptr<Tokenizer> find_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const fs::path p = fs::path(model_dir) / name;
    if (fs::is_regular_file(p, ec)) return load_tokenizer(p.string());
  }
  return nullptr;
}

int64_t count_tokens_before_load(const std::string& model_dir, std::string_view text) {
  try {
    if (const std::unique_ptr<Tokenizer> tok = find_tokenizer(model_dir)) {
      const std::vector<int32_t> ids = tok->encode(text);
      return int64_t(ids.size());
    }
  } catch (const Error&) {
  }
  return int64_t(text.size());
}

}  // namespace ds
