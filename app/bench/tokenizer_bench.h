// Tokenizer speed benchmark for diffscope-bench --tokenizer FILE: encodes ~1 MiB of generated mixed text (ASCII
// prose, code, accented words, CJK, emoji with modifiers, digit runs, whitespace runs) on one thread and reports
// the best of three runs. The text comes from a fixed-seed generator, so runs are comparable across machines.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/tokenizer.h"

// ~`bytes` bytes of mixed text, the same for every call.
inline std::string make_tokenizer_bench_text(size_t bytes) {
  static const char* const kWords[] = {"the", "attention", "of", "differential", "model", "and", "layer", "to",
                                       "softmax", "a", "head", "in", "is", "query", "key", "value", "lambda",
                                       "It's", "WE'LL", "tokenizer", "Transformer", "we've", "don't", "noise"};
  static const char* const kOther[] = {
      "café", "naïve", "Ångström", "straße", "jalapeño", "注意力机制", "東京都の天気", "한국어 문장", "深度学习模型",
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🧑🏿‍💻", "1234567", "3.14159", "2024-06-01", "    ", "\n\n", "\t",
      "\r\n", "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}\n", "def f(x):\n    return x ** 2\n",
      "std::vector<float> v(n, 0.0f);", "{\"key\": [1, 2, 3]}", "...", "!!", " -- ", "\u00a0", "\u200b"};
  std::string out;
  out.reserve(bytes + 256);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  const auto next = [&s](uint64_t n) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s % n;
  };
  while (out.size() < bytes) {
    const uint64_t r = next(100);
    if (r < 70) {
      out += kWords[next(sizeof kWords / sizeof *kWords)];
    } else {
      out += kOther[next(sizeof kOther / sizeof *kOther)];
    }
    out += next(10) == 0 ? ", " : next(25) == 0 ? ".\n" : " ";
  }
  return out;
}

// Fills `out` with {tokenizer, kind, bytes, tokens, ms, mb_per_s, runs}. Throws ds::Error when the file does not
// load.
inline void run_tokenizer_bench(const std::string& tokenizer_path, nlohmann::json& out) {
  const auto tok = ds::load_tokenizer(tokenizer_path);
  const std::string text = make_tokenizer_bench_text(size_t{1} << 20);
  (void)tok->encode(text.substr(0, 1 << 16), false);  // warm-up: page in code, vocab and merge tables
  constexpr int kRuns = 3;
  double best_ms = 1e300;
  size_t tokens = 0;
  for (int r = 0; r < kRuns; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok->encode(text, false);
    const auto t1 = std::chrono::steady_clock::now();
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
    tokens = ids.size();
  }
  out["tokenizer"] = tokenizer_path;
  out["kind"] = tok->kind();
  out["bytes"] = text.size();
  out["tokens"] = tokens;
  out["ms"] = best_ms;
  out["mb_per_s"] = static_cast<double>(text.size()) / 1e6 / (best_ms / 1e3);
  out["runs"] = kRuns;
}
