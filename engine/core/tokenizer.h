// Tokenizers that checkpoints ship: Hugging Face tokenizer.json (byte-level BPE, GPT-2 and Llama-3 styles) and
// sentencepiece tokenizer.model (Llama-2 style). Token-exact with the Python `tokenizers` package.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

struct TokenSpan {
  int32_t id = 0;
  std::string text;   // as a reader would read it: bytes decoded, 'Ġ' shown as space, bad UTF-8 escaped (\xNN)
  size_t begin = 0;   // byte span of the prompt this token came from; begin == end for added tokens like BOS
  size_t end = 0;
  bool special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // ids for `text`; add_special adds what the tokenizer's post-processor adds (e.g. BOS)
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = true) const = 0;
  virtual std::vector<TokenSpan> encode_spans(std::string_view text, bool add_special = true) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::string token_text(int32_t id) const = 0;  // display form of one token
  virtual int64_t vocab_size() const = 0;
  virtual std::string kind() const = 0;  // "BPE (tokenizer.json)", "sentencepiece"
};

// Load tokenizer.json or tokenizer.model; throws ds::Error naming the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The model directory's tokenizer: tokenizer.json, else tokenizer.model; nullptr when there is none.
// A malformed file throws (the caller keeps the model and reports the tokenizer as missing).
std::unique_ptr<Tokenizer> find_tokenizer(const std::string& model_dir);
// How many tokens `text` is with the model directory's tokenizer (its specials included), before the model loads:
// what a layer split plans its activations for. Without a usable tokenizer, its bytes (the prompt cannot run then
// anyway, and the open says why).
int64_t count_tokens_before_load(const std::string& model_dir, std::string_view text);

// Notes on the implementations (tokenizer_bpe.cpp, tokenizer_sentencepiece.cpp):
// - encode() is token-exact with the Python `tokenizers` package (tokenizer.json) and `sentencepiece`
//   (tokenizer.model, plus BOS in front as Hugging Face's Llama tokenizer adds); tools/tokenizer_parity.py checks.
// - decode() keeps special tokens (Python's skip_special_tokens=False) and returns valid UTF-8 (U+FFFD for broken
//   sequences, as Python does).
// - Every method is const and safe to call from several threads at once.

// The two loaders behind load_tokenizer (tokenizer_bpe.cpp, tokenizer_sentencepiece.cpp).
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path);
std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path);

// Display form of raw token bytes: valid UTF-8 kept as is, each byte of an invalid sequence written as \xNN.
std::string display_bytes(std::string_view bytes);
// `bytes` as valid UTF-8, each maximal invalid subsequence replaced by U+FFFD (what Rust's from_utf8_lossy and
// Python's errors="replace" do), so decode() output matches Hugging Face's.
std::string utf8_lossy(std::string_view bytes);

}  // namespace ds
