// sentencepiece tokenizer.model files (Llama-2 style) through Debian's libsentencepiece. The library does the
// segmentation; this file adds what the Hugging Face Llama tokenizer adds (BOS in front), byte spans per piece,
// and the display form of pieces ('▁' shown as a space, <0xNN> byte pieces as their byte).
#include <sentencepiece_processor.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tokenizer.h"

namespace ds {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const auto st = sp_.Load(path);
    if (!st.ok()) fail_file(path, "not a readable sentencepiece model: " + st.ToString());
    const int n = sp_.GetPieceSize();
    if (n <= 0) fail_file(path, "sentencepiece model has an empty vocabulary");
    display_.resize(n);
    for (int id = 0; id < n; ++id) display_[id] = make_display(id);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(std::string(text), &ids);
    if (!st.ok()) throw Error(path_ + ": sentencepiece could not encode the text: " + st.ToString());
    std::vector<int32_t> out;
    out.reserve(ids.size() + 1);
    if (add_special && sp_.bos_id() >= 0) out.push_back(sp_.bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::vector<TokenSpan> encode_spans(std::string_view text, bool add_special) const override {
    std::vector<TokenSpan> out;
    if (add_special && sp_.bos_id() >= 0) out.push_back({sp_.bos_id(), display_[sp_.bos_id()], 0, 0, true});
    const auto spt = sp_.EncodeAsImmutableProto(std::string(text));
    for (const auto& p : spt.pieces()) {
      const auto id = static_cast<int32_t>(p.id());
      TokenSpan t;
      t.id = id;
      t.text = token_text(id);
      t.begin = std::min<size_t>(p.begin(), text.size());
      t.end = std::min<size_t>(std::max(p.begin(), p.end()), text.size());
      t.special = sp_.IsControl(id);
      out.push_back(std::move(t));
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (int32_t id : ids)
      if (id >= 0 && id < static_cast<int32_t>(display_.size())) v.push_back(id);
    std::string out;
    const auto st = sp_.Decode(v, &out);
    if (!st.ok()) throw Error(path_ + ": sentencepiece could not decode: " + st.ToString());
    return utf8_lossy(out);
  }

  std::string token_text(int32_t id) const override {
    if (id < 0 || id >= static_cast<int32_t>(display_.size())) return "<unknown id " + std::to_string(id) + ">";
    return display_[id];
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(display_.size()); }
  std::string kind() const override { return "sentencepiece"; }

 private:
  std::string make_display(int id) const {
    const std::string& piece = sp_.IdToPiece(id);
    if (sp_.IsByte(id) && piece.size() == 6 && std::isxdigit(static_cast<unsigned char>(piece[3])) &&
        std::isxdigit(static_cast<unsigned char>(piece[4]))) {  // "<0xNN>"
      const auto b = static_cast<char>(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16));
      return display_bytes(std::string_view(&b, 1));
    }
    if (sp_.IsControl(id) || sp_.IsUnknown(id)) return piece;
    std::string out;
    static const std::string kSpace = "\xE2\x96\x81";  // U+2581 '▁', sentencepiece's space
    for (size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += piece[i++];
      }
    }
    return display_bytes(out);
  }

  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::string> display_;  // [vocab] display form of each piece
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace ds
