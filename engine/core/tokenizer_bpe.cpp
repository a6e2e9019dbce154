// Hugging Face tokenizer.json with a BPE model, token-exact with the Python `tokenizers` package.
//
// The pipeline is the package's, step for step (tokenizers/src/tokenizer/mod.rs, added_vocabulary.rs):
//   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest, single_word / lstrip /
//      rstrip as the package applies them);
//   2. each remaining segment is normalized (Prepend / Replace, as Llama-2 files use), and added tokens with
//      normalized=true are cut out of the normalized text;
//   3. the pre-tokenizers split each piece (Split with a regex, ByteLevel with the GPT-2 regex, Metaspace);
//   4. the BPE model merges each pre-token ("word") by merge rank with a priority queue over a linked list of
//      symbols, with a per-call cache of words already merged;
//   5. the post-processor adds its special tokens (TemplateProcessing, Roberta/Bert, Sequence of them).
// Regexes run in PCRE2 with UTF + UCP (Unicode classes like \p{L}, \p{N}, look-ahead) and its JIT. Every piece
// carries, for each of its bytes, the byte range of the prompt it came from, so each token gets a byte span.
// ByteLevel's byte -> character mapping is not materialised: a byte-level BPE runs directly on raw bytes, with
// the vocabulary and merges translated to ids at load time.
#define PCRE2_CODE_UNIT_WIDTH 8  // UTF-8 subjects
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tokenizer.h"
#include "engine/core/input_limits.h"

namespace ds {

namespace {

using json = nlohmann::json;

// [SECTION] UTF-8 ------------------------------------------------------------------------------------------------

// Byte length of the (possibly invalid) UTF-8 character at s[i]; invalid bytes count as one character each.
size_t char_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

// Value of two hex digits (already checked with isxdigit), as in "<0x0A>".
uint8_t hex_byte(char hi, char lo) {
  const auto v = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  return static_cast<uint8_t>(v(hi) * 16 + v(lo));
}

uint32_t decode_char(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  switch (n) {
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    case 4: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    default: return b(0);
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// [SECTION] GPT-2 byte <-> character table ---------------------------------------------------------------------
// Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100.. in order (space -> 'Ġ' U+0120).

struct ByteLevelTable {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_str;
  std::array<int16_t, 512> cp_to_byte{};  // -1 where no byte maps to the code point
  ByteLevelTable() {
    cp_to_byte.fill(-1);
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) byte_to_cp[b] = printable[b] ? b : 256 + n++;
    for (int b = 0; b < 256; ++b) {
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
      append_utf8(byte_to_str[b], byte_to_cp[b]);
    }
  }
  // The raw bytes a byte-level token string stands for; nullopt when a character is outside the table.
  std::optional<std::string> to_bytes(std::string_view s) const {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const size_t n = char_len(s, i);
      const uint32_t cp = decode_char(s, i, n);
      if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return std::nullopt;
      out += static_cast<char>(cp_to_byte[cp]);
      i += n;
    }
    return out;
  }
};

const ByteLevelTable& byte_level() {
  static const ByteLevelTable t;
  return t;
}

// [SECTION] PCRE2 regex ------------------------------------------------------------------------------------------

// The package compiles its regexes with Oniguruma, whose Unicode classes differ from PCRE2's in a few places:
// \s is White_Space (PCRE2's also has U+180E), \w is Unicode's word class (PCRE2's is letters, numbers, '_'),
// \h is a hex digit (PCRE2's is horizontal space). Rewrite those escapes into explicit properties.
std::string onig_to_pcre2(const std::string& p) {
  // Oniguruma's \w is Unicode's "word" (Alphabetic, marks, decimal digits, connector punctuation); outside
  // brackets its Latin-1 ctype table also counts the superscript digits and vulgar fractions (checked against
  // the package, see tools/tokenizer_parity.py).
  static constexpr const char* kWordInClass = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
  static constexpr const char* kLatin1Word = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
  std::string out;
  out.reserve(p.size() + 16);
  int in_class = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      switch (e) {
        case 's': out += "\\p{White_Space}"; break;  // both in and out of brackets
        case 'S': out += "\\P{White_Space}"; break;
        case 'w': out += in_class ? kWordInClass : "[" + std::string(kWordInClass) + kLatin1Word + "]"; break;
        case 'W': out += in_class ? "\\W" : "[^" + std::string(kWordInClass) + kLatin1Word + "]"; break;
        case 'h': out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
        case 'H': out += in_class ? "\\H" : "[^0-9a-fA-F]"; break;
        default: out += c; out += e;
      }
      continue;
    }
    if (c == '[') {
      ++in_class;
      out += c;
      // a ']' right after '[' or '[^' is a literal
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) --in_class;
    out += c;
  }
  return out;
}

class Regex {
 public:
  // `pattern` in the package's (Oniguruma's) dialect; `pcre_native` skips the translation.
  Regex(const std::string& pattern, const std::string& file, bool pcre_native = false) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string pcre = pcre_native ? pattern : onig_to_pcre2(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail_file(file, "regex /" + pattern + "/ does not compile at offset " + std::to_string(off) + ": " +
                          reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // when the JIT is unavailable, matching interprets
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for each non-empty match, left to right, without overlap (an empty match skips a char).
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    MatchData& md = match_data();
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = match(s, pos, md.md);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(std::string("tokenizer regex /") + pattern_ + "/ failed: " + reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.md);
      const size_t b = ov[0], e = ov[1];
      if (e > b) {
        f(b, e);
        pos = e;
      } else {
        if (b >= s.size()) break;
        pos = b + char_len(s, b);
      }
    }
  }
  // Whether the whole of `s` is one match.
  bool full_match(std::string_view s) const {
    bool ok = false;
    for_each_match(s, [&](size_t b, size_t e) { ok = ok || (b == 0 && e == s.size()); });
    return ok;
  }

 private:
  struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(md); }
  };
  static MatchData& match_data() {
    thread_local MatchData md;  // one whole-match vector per thread: codes are shared, match data is not
    return md;
  }
  int match(std::string_view s, size_t pos, pcre2_match_data* md) const {
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    int rc = pcre2_match(code_, subj, s.size(), pos, 0, md, nullptr);  // runs the JIT code when there is one
    // The JIT's default 32 KiB stack can run out on pathological input; the interpreter uses the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(code_, subj, s.size(), pos, PCRE2_NO_JIT, md, nullptr);
    return rc;
  }

  std::string pattern_;
  pcre2_code* code_ = nullptr;
};

// Unicode classes the package's added-token rules use (Rust regex \w and \s), by PCRE2 property names.
bool is_word_char(std::string_view ch) {
  static const Regex re("^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]$", "<builtin>", true);
  return re.full_match(ch);
}
bool is_space_char(std::string_view ch) {
  static const Regex re("^\\p{White_Space}$", "<builtin>", true);
  return re.full_match(ch);
}
size_t last_char_begin(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    --i;
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) break;
  }
  return i;
}

// [SECTION] Pieces of text with their origin ---------------------------------------------------------------------

struct Range32 {
  uint32_t b, e;
};

// A piece of (normalized) text; each byte remembers the byte range of the prompt it came from.
struct Piece {
  std::string s;
  std::vector<Range32> al;  // [s.size()] origin of each byte; empty: byte i came from prompt byte base + i
  size_t base = 0;

  size_t orig_begin(size_t i) const { return al.empty() ? base + i : al[i].b; }
  size_t orig_end(size_t i) const { return al.empty() ? base + i + 1 : al[i].e; }
  std::pair<size_t, size_t> orig_range(size_t b, size_t e) const {
    if (e <= b) {
      const size_t p = b < s.size() ? orig_begin(b) : s.empty() ? base : orig_end(s.size() - 1);
      return {p, p};
    }
    const size_t ob = orig_begin(b), oe = orig_end(e - 1);
    return {ob, std::max(ob, oe)};
  }
  Piece slice(size_t b, size_t e) const {
    Piece p;
    p.s = s.substr(b, e - b);
    if (al.empty()) {
      p.base = base + b;
    } else {
      p.al.assign(al.begin() + b, al.begin() + e);
    }
    return p;
  }
  void ensure_alignment() {
    if (!al.empty() || s.empty()) return;
    al.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) al[i] = {static_cast<uint32_t>(base + i), static_cast<uint32_t>(base + i + 1)};
  }
  void prepend(std::string_view t) {
    if (s.empty()) return;
    ensure_alignment();
    const Range32 at{al[0].b, al[0].b};
    s.insert(0, t);
    al.insert(al.begin(), t.size(), at);
  }
  // Replaces the byte ranges `matches` (sorted, disjoint) with `content`.
  void replace(const std::vector<std::pair<size_t, size_t>>& matches, std::string_view content) {
    if (matches.empty()) return;
    ensure_alignment();
    std::string ns;
    std::vector<Range32> nal;
    size_t prev = 0;
    for (auto [b, e] : matches) {
      ns.append(s, prev, b - prev);
      nal.insert(nal.end(), al.begin() + prev, al.begin() + b);
      ns.append(content);
      nal.insert(nal.end(), content.size(), Range32{al[b].b, al[e - 1].e});
      prev = e;
    }
    ns.append(s, prev, std::string::npos);
    nal.insert(nal.end(), al.begin() + prev, al.end());
    s = std::move(ns);
    al = std::move(nal);
  }
};

std::vector<std::pair<size_t, size_t>> find_literal(std::string_view s, std::string_view lit) {
  std::vector<std::pair<size_t, size_t>> out;
  if (lit.empty()) return out;
  for (size_t p = s.find(lit); p != std::string_view::npos; p = s.find(lit, p + lit.size())) out.push_back({p, p + lit.size()});
  return out;
}

// [SECTION] Normalizers, pre-tokenizers, decoders as loaded ------------------------------------------------------

// A pattern as the package's JSON gives it: {"String": literal} or {"Regex": pattern}.
struct Pattern {
  std::string literal;
  std::shared_ptr<Regex> re;
  std::vector<std::pair<size_t, size_t>> find(std::string_view s) const {
    if (!re) return find_literal(s, literal);
    std::vector<std::pair<size_t, size_t>> out;
    re->for_each_match(s, [&](size_t b, size_t e) { out.push_back({b, e}); });
    return out;
  }
};

struct NormalizerStep {
  enum Kind { Prepend, Replace } kind;
  std::string text;  // Prepend: what; Replace: the content
  Pattern pattern;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizerStep {
  enum Kind { Split, ByteLevel, Metaspace } kind;
  Pattern pattern;  // Split (ByteLevel with use_regex: the GPT-2 regex)
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = true;          // ByteLevel
  std::string replacement;        // Metaspace
  enum Prepend { Always, First, Never } prepend = Always;
  bool split = true;  // Metaspace
};

struct DecoderStep {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind;
  Pattern pattern;
  std::string content;  // Replace: the content; Strip: the character; Metaspace: the replacement
  size_t start = 0, stop = 0;
  bool prepend = true;  // Metaspace: prepend_scheme != never
};

// The package's NormalizedString::split: the pieces between and around the matches, combined per behavior.
void split_piece(const Piece& p, const Pattern& pat, Behavior behavior, bool invert, std::vector<Piece>& out) {
  if (p.s.empty()) return;
  struct M {
    size_t b, e;
    bool match;
  };
  std::vector<M> ms;
  size_t prev = 0;
  const auto add = [&](size_t b, size_t e) {
    if (prev != b) ms.push_back({prev, b, invert});
    ms.push_back({b, e, !invert});
    prev = e;
  };
  if (pat.re) {
    pat.re->for_each_match(p.s, add);
  } else {
    for (auto [b, e] : find_literal(p.s, pat.literal)) add(b, e);
  }
  if (prev != p.s.size()) ms.push_back({prev, p.s.size(), invert});

  std::vector<M> sp;  // match flag reused as "remove"
  sp.reserve(ms.size());
  switch (behavior) {
    case Behavior::Isolated:
      for (auto m : ms) sp.push_back({m.b, m.e, false});
      break;
    case Behavior::Removed:
      sp = ms;
      break;
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (auto m : ms) {
        if (m.match == prev_match && !sp.empty()) sp.back().e = m.e;
        else sp.push_back({m.b, m.e, false});
        prev_match = m.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto m : ms) {
        if (m.match && !prev_match && !sp.empty()) sp.back().e = m.e;
        else sp.push_back({m.b, m.e, false});
        prev_match = m.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t i = ms.size(); i-- > 0;) {
        const auto m = ms[i];
        if (m.match && !prev_match && !sp.empty()) sp.back().b = m.b;
        else sp.push_back({m.b, m.e, false});
        prev_match = m.match;
      }
      std::reverse(sp.begin(), sp.end());
      break;
    }
  }
  for (auto m : sp)
    if (!m.match && m.e > m.b) out.push_back(p.slice(m.b, m.e));
}

// [SECTION] The tokenizer ----------------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

struct RawToken {
  int32_t id;
  uint32_t b, e;  // byte span of the prompt
  bool added;     // an added token (from the text or the post-processor)
};

// Leftmost-longest search for added tokens (the package uses Aho-Corasick with LeftmostLongest).
class AddedMatcher {
 public:
  void add(const AddedToken* t) {
    if (t->content.empty()) return;
    auto& bucket = by_first_[static_cast<unsigned char>(t->content[0])];
    for (const AddedToken* o : bucket)
      if (o->content == t->content) return;
    bucket.push_back(t);
    any_ = true;
  }
  bool empty() const { return !any_; }

  struct Split {
    size_t b, e;
    const AddedToken* tok;  // nullptr: plain text
  };
  // The package's AddedVocabulary::find_matches: plain and token pieces covering `s` (empty ones dropped).
  std::vector<Split> split(std::string_view s) const {
    std::vector<Split> out;
    size_t start_offset = 0, pos = 0;
    while (pos < s.size()) {
      const AddedToken* best = nullptr;
      size_t at = pos;
      for (; at < s.size(); ++at) {
        for (const AddedToken* t : by_first_[static_cast<unsigned char>(s[at])])
          if ((!best || t->content.size() > best->content.size()) && s.compare(at, t->content.size(), t->content) == 0)
            best = t;
        if (best) break;
      }
      if (!best) break;
      size_t start = at, stop = at + best->content.size();
      pos = stop;  // a discarded match still consumes its text, as Aho-Corasick's find_iter does
      if (best->single_word) {
        const size_t cb = last_char_begin(s.substr(0, start));
        const bool start_space = start == 0 || !is_word_char(s.substr(cb, start - cb));
        const bool stop_space = stop == s.size() || !is_word_char(s.substr(stop, char_len(s, stop)));
        if (!start_space || !stop_space) continue;
      }
      if (best->lstrip) {
        size_t ns = start;
        while (ns > 0) {
          const size_t cb = last_char_begin(s.substr(0, ns));
          if (!is_space_char(s.substr(cb, ns - cb))) break;
          ns = cb;
        }
        start = std::max(ns, start_offset);
      }
      if (best->rstrip) {
        while (stop < s.size()) {
          const size_t n = char_len(s, stop);
          if (!is_space_char(s.substr(stop, n))) break;
          stop += n;
        }
      }
      if (start_offset < start) out.push_back({start_offset, start, nullptr});
      out.push_back({start, stop, best});
      start_offset = stop;
      pos = std::max(pos, stop);
    }
    if (start_offset < s.size()) out.push_back({start_offset, s.size(), nullptr});
    return out;
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_;
  bool any_ = false;
};

// Words already merged during one encode call: word bytes -> (offset, count) into a flat list of (id, length).
struct WordCache {
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> index;
  std::vector<std::pair<int32_t, uint32_t>> tokens;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const std::string& path, const json& j);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<RawToken> raw;
    encode_raw(text, add_special, raw);
    std::vector<int32_t> ids(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) ids[i] = raw[i].id;
    return ids;
  }

  std::vector<TokenSpan> encode_spans(std::string_view text, bool add_special) const override {
    std::vector<RawToken> raw;
    encode_raw(text, add_special, raw);
    std::vector<TokenSpan> out(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      out[i].id = raw[i].id;
      out[i].text = token_text(raw[i].id);
      out[i].begin = raw[i].b;
      out[i].end = raw[i].e;
      const auto it = added_by_id_.find(raw[i].id);
      out[i].special = raw[i].added && it != added_by_id_.end() && it->second->special;
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override;

  std::string token_text(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= display_.size() || !has_token_[id])
      return "<unknown id " + std::to_string(id) + ">";
    return display_[id];
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  std::string kind() const override { return "BPE (tokenizer.json)"; }

 private:
  void load_model(const json& m);
  void load_added(const json& arr);
  // `depth` bounds the nesting of Sequence steps (a hostile file must not overflow the stack)
  void load_normalizer(const json& n, int depth = 0);
  void load_pre_tokenizer(const json& p, int depth = 0);
  void load_post_processor(const json& p, int depth = 0);
  void load_decoder(const json& d, int depth = 0);
  void check_depth(int depth) const {
    if (depth > 32) fail_file(path_, "Sequence steps nested more than 32 deep");
  }
  Pattern load_pattern(const json& p) const;
  void build_display();

  void encode_raw(std::string_view text, bool add_special, std::vector<RawToken>& out) const;
  void encode_segment(Piece seg, std::vector<RawToken>& out, WordCache& cache) const;
  void pre_tokenize(std::vector<Piece>& pieces) const;
  void model_word(const Piece& p, std::vector<RawToken>& out, WordCache& cache) const;
  void merge_word(std::string_view w, std::vector<std::pair<int32_t, uint32_t>>& out) const;
  int32_t vocab_find(const std::string& s) const {
    const auto it = vocab_.find(s);
    return it == vocab_.end() ? -1 : it->second;
  }

  std::string path_;
  // model
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges_;  // (left id, right id) -> (rank, new id)
  std::vector<std::string> id_to_token_;                              // [vocab_size] token strings ("" = hole)
  std::vector<char> has_token_;
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  // byte-level
  bool byte_level_ = false;
  std::array<std::array<int32_t, 256>, 4> byte_unit_id_{};  // [first? 0:1 | last? 2:0][byte] id of one byte
  std::unordered_map<std::string, int32_t> raw_vocab_;      // raw bytes -> id, for ignore_merges
  // added tokens
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  AddedMatcher raw_matcher_, norm_matcher_;
  // pipeline
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<DecoderStep> decoder_;
  bool has_decoder_ = false;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // what the post-processor adds around one sequence
  // display
  std::vector<std::string> display_;
  std::string space_marker_;  // '▁' in sentencepiece-style files, shown as a space
};

// [SECTION] Loading ----------------------------------------------------------------------------------------------

// Token ids above this are refused: real vocabularies stay below 1M, and the id table is dense.
constexpr int64_t kMaxId = int64_t{1} << 24;

std::string jstr(const json& j, const char* key, const std::string& dflt = "") {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? dflt : it->get<std::string>();
}
bool jbool(const json& j, const char* key, bool dflt) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? dflt : it->get<bool>();
}

BpeTokenizer::BpeTokenizer(const std::string& path, const json& j) : path_(path) {
  if (!j.is_object()) fail_file(path, "not a tokenizer.json (the top level is not a JSON object)");
  const auto m = j.find("model");
  if (m == j.end() || !m->is_object()) fail_file(path, "no \"model\" object (is this a tokenizer.json?)");
  load_model(*m);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) load_added(j["added_tokens"]);
  if (j.contains("normalizer")) load_normalizer(j["normalizer"]);
  if (j.contains("pre_tokenizer")) load_pre_tokenizer(j["pre_tokenizer"]);
  if (j.contains("post_processor")) load_post_processor(j["post_processor"]);
  if (j.contains("decoder")) load_decoder(j["decoder"]);
  build_display();
}

void BpeTokenizer::load_model(const json& m) {
  const std::string type = jstr(m, "type", m.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    fail_file(path_, "model type '" + type + "' is not supported (only BPE models in tokenizer.json; "
                         "sentencepiece models load from tokenizer.model)");
  const auto v = m.find("vocab");
  if (v == m.end() || !v->is_object() || v->empty()) fail_file(path_, "the BPE model has no vocab");
  int64_t max_id = -1;
  for (const auto& [tok, id] : v->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId)
      fail_file(path_, "vocab entry '" + tok + "' has no valid id (0 .. " + std::to_string(kMaxId - 1) + ")");
    vocab_[tok] = id.get<int32_t>();
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  id_to_token_.assign(max_id + 1, "");
  has_token_.assign(max_id + 1, 0);
  for (const auto& [tok, id] : vocab_) {
    id_to_token_[id] = tok;
    has_token_[id] = 1;
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) unk_token_ = m["unk_token"].get<std::string>();
  prefix_ = jstr(m, "continuing_subword_prefix");
  suffix_ = jstr(m, "end_of_word_suffix");
  fuse_unk_ = jbool(m, "fuse_unk", false);
  byte_fallback_ = jbool(m, "byte_fallback", false);
  ignore_merges_ = jbool(m, "ignore_merges", false);
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() > 0.0)
    fail_file(path_, "BPE dropout is not supported (it makes encoding random)");

  const auto mg = m.find("merges");
  if (mg == m.end() || mg->is_null()) return;
  if (!mg->is_array()) fail_file(path_, "model.merges is not a list");
  merges_.reserve(mg->size() * 2);
  uint32_t rank = 0;
  for (const auto& e : *mg) {
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail_file(path_, "merge #" + std::to_string(rank + 1) + " '" + s + "' is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail_file(path_, "merge #" + std::to_string(rank + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto name = [&] { return "merge #" + std::to_string(rank + 1) + " ('" + a + "' '" + b + "')"; };
    const int32_t ia = vocab_find(a), ib = vocab_find(b);
    if (ia < 0) fail_file(path_, name() + " names token '" + a + "', which is not in the vocab");
    if (ib < 0) fail_file(path_, name() + " names token '" + b + "', which is not in the vocab");
    if (b.size() < prefix_.size()) fail_file(path_, name() + " is shorter than the continuing_subword_prefix");
    const std::string merged = a + b.substr(prefix_.size());
    const int32_t in = vocab_find(merged);
    if (in < 0) fail_file(path_, name() + " makes '" + merged + "', which is not in the vocab");
    // Later duplicates win, as in the package (its merge map is collected from the list in order).
    merges_[(static_cast<uint64_t>(ia) << 32) | static_cast<uint32_t>(ib)] = {rank, in};
    ++rank;
  }
}

void BpeTokenizer::load_added(const json& arr) {
  if (!arr.is_array()) fail_file(path_, "added_tokens is not a list");
  added_.reserve(arr.size());
  for (const auto& t : arr) {
    AddedToken a;
    if (!t.is_object() || !t.contains("content") || !t.contains("id"))
      fail_file(path_, "an added token has no content or id");
    a.content = t["content"].get<std::string>();
    a.id = t["id"].get<int32_t>();
    if (a.id < 0 || a.id >= kMaxId) fail_file(path_, "added token '" + a.content + "' has an id out of range");
    // The package gives an added token that is also a vocab entry the vocab's id, whatever the file says.
    if (const int32_t vid = vocab_find(a.content); vid >= 0) a.id = vid;
    a.single_word = jbool(t, "single_word", false);
    a.lstrip = jbool(t, "lstrip", false);
    a.rstrip = jbool(t, "rstrip", false);
    a.special = jbool(t, "special", false);
    a.normalized = jbool(t, "normalized", !a.special);
    added_.push_back(std::move(a));
  }
  // Special tokens first, as the package builds its matcher; it only matters for duplicated contents.
  std::stable_partition(added_.begin(), added_.end(), [](const AddedToken& a) { return a.special; });
  for (const auto& a : added_) {
    added_by_id_[a.id] = &a;
    if (static_cast<size_t>(a.id) >= id_to_token_.size()) {
      id_to_token_.resize(a.id + 1);
      has_token_.resize(a.id + 1, 0);
    }
    id_to_token_[a.id] = a.content;
    has_token_[a.id] = 1;
    (a.normalized ? norm_matcher_ : raw_matcher_).add(&a);
  }
}

Pattern BpeTokenizer::load_pattern(const json& p) const {
  Pattern pat;
  if (p.is_object() && p.contains("Regex")) {
    pat.re = std::make_shared<Regex>(p["Regex"].get<std::string>(), path_);
  } else if (p.is_object() && p.contains("String")) {
    pat.literal = p["String"].get<std::string>();
  } else if (p.is_string()) {
    pat.literal = p.get<std::string>();
  } else {
    fail_file(path_, "a pattern is neither {\"String\": ...} nor {\"Regex\": ...}");
  }
  return pat;
}

void BpeTokenizer::load_normalizer(const json& n, int depth) {
  if (n.is_null()) return;
  check_depth(depth);
  const std::string type = jstr(n, "type");
  if (type == "Sequence") {
    for (const auto& s : n.at("normalizers")) load_normalizer(s, depth + 1);
  } else if (type == "Prepend") {
    normalizer_.push_back({NormalizerStep::Prepend, n.at("prepend").get<std::string>(), {}});
  } else if (type == "Replace") {
    normalizer_.push_back({NormalizerStep::Replace, n.at("content").get<std::string>(), load_pattern(n.at("pattern"))});
    if (!normalizer_.back().pattern.re && normalizer_.back().pattern.literal == " ")
      space_marker_ = normalizer_.back().text;
  } else {
    fail_file(path_, "normalizer '" + type + "' is not supported (supported: Sequence, Prepend, Replace)");
  }
}

void BpeTokenizer::load_pre_tokenizer(const json& p, int depth) {
  if (p.is_null()) return;
  check_depth(depth);
  if (byte_level_) fail_file(path_, "a pre-tokenizer after ByteLevel is not supported");
  const std::string type = jstr(p, "type");
  PreTokenizerStep s{};
  if (type == "Sequence") {
    for (const auto& q : p.at("pretokenizers")) load_pre_tokenizer(q, depth + 1);
    return;
  } else if (type == "Split") {
    s.kind = PreTokenizerStep::Split;
    s.pattern = load_pattern(p.at("pattern"));
    const std::string b = jstr(p, "behavior", "Isolated");
    static const std::pair<const char*, Behavior> kBehaviors[] = {
        {"Removed", Behavior::Removed}, {"Isolated", Behavior::Isolated},
        {"MergedWithPrevious", Behavior::MergedWithPrevious}, {"MergedWithNext", Behavior::MergedWithNext},
        {"Contiguous", Behavior::Contiguous}};
    bool found = false;
    for (auto [name, beh] : kBehaviors)
      if (b == name) s.behavior = beh, found = true;
    if (!found) fail_file(path_, "Split behavior '" + b + "' is unknown");
    s.invert = jbool(p, "invert", false);
  } else if (type == "ByteLevel") {
    s.kind = PreTokenizerStep::ByteLevel;
    s.add_prefix_space = jbool(p, "add_prefix_space", true);
    s.use_regex = jbool(p, "use_regex", true);
    if (s.use_regex)
      s.pattern.re = std::make_shared<Regex>(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", path_);
    byte_level_ = true;
  } else if (type == "Metaspace") {
    s.kind = PreTokenizerStep::Metaspace;
    s.replacement = jstr(p, "replacement", "\xE2\x96\x81");
    const std::string scheme = jstr(p, "prepend_scheme", jbool(p, "add_prefix_space", true) ? "always" : "never");
    s.prepend = scheme == "first" ? PreTokenizerStep::First
                : scheme == "never" ? PreTokenizerStep::Never
                                    : PreTokenizerStep::Always;
    s.split = jbool(p, "split", true);
    space_marker_ = s.replacement;
  } else {
    fail_file(path_, "pre_tokenizer '" + type + "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace)");
  }
  pre_tokenizer_.push_back(std::move(s));
}

void BpeTokenizer::load_post_processor(const json& p, int depth) {
  if (p.is_null()) return;
  check_depth(depth);
  const std::string type = jstr(p, "type");
  const auto token_id = [&](const json& pair) {  // ["</s>", 2]
    if (!pair.is_array() || pair.size() != 2) fail_file(path_, type + " post-processor: a token is not [text, id]");
    return pair[1].get<int32_t>();
  };
  if (type == "Sequence") {
    for (const auto& q : p.at("processors")) load_post_processor(q, depth + 1);
  } else if (type == "ByteLevel") {
    // only trims offsets; adds no token
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    prefix_ids_.insert(prefix_ids_.begin(), token_id(p.at("cls")));
    suffix_ids_.push_back(token_id(p.at("sep")));
  } else if (type == "TemplateProcessing") {
    std::vector<int32_t> before, after;
    bool seen_a = false;
    for (const auto& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        seen_a = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = piece["SpecialToken"].at("id").get<std::string>();
        const auto st = p.at("special_tokens").find(name);
        if (st == p["special_tokens"].end())
          fail_file(path_, "TemplateProcessing names special token '" + name + "' but does not define it");
        for (const auto& id : st->at("ids")) (seen_a ? after : before).push_back(id.get<int32_t>());
      }
    }
    prefix_ids_.insert(prefix_ids_.begin(), before.begin(), before.end());
    suffix_ids_.insert(suffix_ids_.end(), after.begin(), after.end());
  } else {
    fail_file(path_, "post_processor '" + type +
                         "' is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
                         "BertProcessing, Sequence)");
  }
}

void BpeTokenizer::load_decoder(const json& d, int depth) {
  if (d.is_null()) return;
  check_depth(depth);
  has_decoder_ = true;
  const std::string type = jstr(d, "type");
  DecoderStep s{};
  if (type == "Sequence") {
    for (const auto& q : d.at("decoders")) load_decoder(q, depth + 1);
    return;
  } else if (type == "ByteLevel") {
    s.kind = DecoderStep::ByteLevel;
  } else if (type == "Replace") {
    s.kind = DecoderStep::Replace;
    s.pattern = load_pattern(d.at("pattern"));
    s.content = d.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    s.kind = DecoderStep::ByteFallback;
  } else if (type == "Fuse") {
    s.kind = DecoderStep::Fuse;
  } else if (type == "Strip") {
    s.kind = DecoderStep::Strip;
    s.content = d.at("content").get<std::string>();
    s.start = d.value("start", 0);
    s.stop = d.value("stop", 0);
  } else if (type == "Metaspace") {
    s.kind = DecoderStep::Metaspace;
    s.content = jstr(d, "replacement", "\xE2\x96\x81");
    s.prepend = jstr(d, "prepend_scheme", jbool(d, "add_prefix_space", true) ? "always" : "never") != "never";
  } else {
    fail_file(path_, "decoder '" + type +
                         "' is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, "
                         "Sequence)");
  }
  decoder_.push_back(std::move(s));
}

void BpeTokenizer::build_display() {
  const auto& bl = byte_level();
  if (byte_level_) {
    for (auto& row : byte_unit_id_) row.fill(-1);
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 4; ++k)
        byte_unit_id_[k][b] = vocab_find(((k & 1) ? prefix_ : std::string()) + bl.byte_to_str[b] + ((k & 2) ? suffix_ : ""));
    if (ignore_merges_)
      for (const auto& [tok, id] : vocab_)
        if (auto raw = bl.to_bytes(tok)) raw_vocab_.emplace(std::move(*raw), id);
  }
  display_.assign(id_to_token_.size(), "");
  for (size_t id = 0; id < id_to_token_.size(); ++id) {
    if (!has_token_[id]) continue;
    const std::string& t = id_to_token_[id];
    if (added_by_id_.count(static_cast<int32_t>(id))) {
      display_[id] = display_bytes(t);
      continue;
    }
    std::string shown = t;
    if (byte_level_) {
      if (auto raw = bl.to_bytes(t)) shown = std::move(*raw);
    } else if (byte_fallback_ && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
               std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
      shown = std::string(1, static_cast<char>(hex_byte(t[3], t[4])));
    } else if (!space_marker_.empty()) {
      std::string r;
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, space_marker_.size(), space_marker_) == 0) {
          r += ' ';
          i += space_marker_.size();
        } else {
          r += t[i++];
        }
      }
      shown = std::move(r);
    }
    display_[id] = display_bytes(shown);
  }
}

// [SECTION] Encoding ---------------------------------------------------------------------------------------------

void BpeTokenizer::encode_raw(std::string_view text, bool add_special, std::vector<RawToken>& out) const {
  out.clear();
  if (add_special)
    for (int32_t id : prefix_ids_) out.push_back({id, 0, 0, true});
  WordCache cache;
  const auto plain = [&](size_t b, size_t e) {
    Piece p;
    p.s.assign(text.substr(b, e - b));
    p.base = b;
    encode_segment(std::move(p), out, cache);
  };
  if (raw_matcher_.empty()) {
    if (!text.empty()) plain(0, text.size());
  } else {
    for (const auto& sp : raw_matcher_.split(text)) {
      if (sp.tok) out.push_back({sp.tok->id, static_cast<uint32_t>(sp.b), static_cast<uint32_t>(sp.e), true});
      else plain(sp.b, sp.e);
    }
  }
  if (add_special)
    for (int32_t id : suffix_ids_) out.push_back({id, static_cast<uint32_t>(text.size()), static_cast<uint32_t>(text.size()), true});
}

void BpeTokenizer::encode_segment(Piece seg, std::vector<RawToken>& out, WordCache& cache) const {
  for (const auto& n : normalizer_) {
    if (n.kind == NormalizerStep::Prepend) seg.prepend(n.text);
    else seg.replace(n.pattern.find(seg.s), n.text);
  }
  std::vector<Piece> pieces;
  const auto run = [&](Piece p) {
    pieces.clear();
    pieces.push_back(std::move(p));
    pre_tokenize(pieces);
    for (const auto& w : pieces) model_word(w, out, cache);
  };
  if (norm_matcher_.empty()) {
    if (!seg.s.empty()) run(std::move(seg));
    return;
  }
  for (const auto& sp : norm_matcher_.split(seg.s)) {
    if (sp.tok) {
      const auto [ob, oe] = seg.orig_range(sp.b, sp.e);
      out.push_back({sp.tok->id, static_cast<uint32_t>(ob), static_cast<uint32_t>(oe), true});
    } else {
      run(seg.slice(sp.b, sp.e));
    }
  }
}

void BpeTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  std::vector<Piece> next;
  for (const auto& step : pre_tokenizer_) {
    next.clear();
    next.reserve(pieces.size());
    for (auto& p : pieces) {
      switch (step.kind) {
        case PreTokenizerStep::Split:
          split_piece(p, step.pattern, step.behavior, step.invert, next);
          break;
        case PreTokenizerStep::ByteLevel:
          if (step.add_prefix_space && (p.s.empty() || p.s[0] != ' ')) p.prepend(" ");
          if (step.use_regex) split_piece(p, step.pattern, Behavior::Isolated, false, next);
          else if (!p.s.empty()) next.push_back(std::move(p));
          break;
        case PreTokenizerStep::Metaspace: {
          p.replace(find_literal(p.s, " "), step.replacement);
          const bool starts = p.s.compare(0, step.replacement.size(), step.replacement) == 0;
          if (!starts && (step.prepend == PreTokenizerStep::Always ||
                          (step.prepend == PreTokenizerStep::First && !p.s.empty() && p.orig_begin(0) == 0)))
            p.prepend(step.replacement);
          if (step.split) {
            Pattern lit;
            lit.literal = step.replacement;
            split_piece(p, lit, Behavior::MergedWithNext, false, next);
          } else if (!p.s.empty()) {
            next.push_back(std::move(p));
          }
          break;
        }
      }
    }
    pieces.swap(next);
  }
}

void BpeTokenizer::model_word(const Piece& p, std::vector<RawToken>& out, WordCache& cache) const {
  const std::string& w = p.s;
  if (w.empty()) return;
  const auto emit = [&](const std::pair<int32_t, uint32_t>* toks, size_t n) {
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      const auto [ob, oe] = p.orig_range(off, off + toks[i].second);
      out.push_back({toks[i].first, static_cast<uint32_t>(ob), static_cast<uint32_t>(oe), false});
      off += toks[i].second;
    }
  };
  if (ignore_merges_) {
    const auto& table = byte_level_ ? raw_vocab_ : vocab_;
    const auto it = table.find(w);
    if (it != table.end()) {
      const std::pair<int32_t, uint32_t> one{it->second, static_cast<uint32_t>(w.size())};
      emit(&one, 1);
      return;
    }
  }
  const auto hit = cache.index.find(w);
  if (hit != cache.index.end()) {
    emit(cache.tokens.data() + hit->second.first, hit->second.second);
    return;
  }
  const size_t at = cache.tokens.size();
  merge_word(w, cache.tokens);
  const size_t n = cache.tokens.size() - at;
  if (w.size() <= 256) cache.index.emplace(w, std::make_pair(static_cast<uint32_t>(at), static_cast<uint32_t>(n)));
  emit(cache.tokens.data() + at, n);
  if (w.size() > 256) cache.tokens.resize(at);
}

// The package's BPE::merge_word + Word::merge_all: initial symbols per character (per byte for byte-level),
// unknowns through byte_fallback / unk_token, then the lowest-rank pair merges first (leftmost on ties).
void BpeTokenizer::merge_word(std::string_view w, std::vector<std::pair<int32_t, uint32_t>>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // bytes of w
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  const auto add = [&](int32_t id, uint32_t len) {
    const int32_t i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, -1, len, true});
    if (i > 0) syms[i - 1].next = i;
  };
  int32_t unk_id = -1;  // pending unknown token (fused with following unknowns when fuse_unk)
  uint32_t unk_len = 0;
  for (size_t i = 0; i < w.size();) {
    const size_t n = byte_level_ ? 1 : char_len(w, i);
    const bool first = i == 0, last = i + n == w.size();
    int32_t id = -1;
    std::string key;
    if (byte_level_) {
      id = byte_unit_id_[(first ? 0 : 1) | (last ? 2 : 0)][static_cast<unsigned char>(w[i])];
      if (id < 0)
        key = (first ? "" : prefix_) + byte_level().byte_to_str[static_cast<unsigned char>(w[i])] + (last ? suffix_ : "");
    } else {
      key.assign(first ? "" : prefix_);
      key.append(w.substr(i, n));
      if (last) key += suffix_;
      id = vocab_find(key);
    }
    if (id >= 0) {
      if (unk_id >= 0) add(unk_id, unk_len), unk_id = -1;
      add(id, static_cast<uint32_t>(n));
      i += n;
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> ids;
      for (unsigned char c : key) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", c);
        const int32_t b = vocab_find(buf);
        if (b < 0) break;
        ids.push_back(b);
      }
      if (ids.size() == key.size()) {
        for (size_t k = 0; k < ids.size(); ++k)
          add(ids[k], key.size() == n ? 1 : (k == 0 ? static_cast<uint32_t>(n) : 0));
        i += n;
        continue;
      }
    }
    if (unk_token_) {
      const int32_t uid = vocab_find(*unk_token_);
      if (uid < 0) throw Error(path_ + ": unk_token '" + *unk_token_ + "' is not in the vocab");
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += static_cast<uint32_t>(n);
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = uid;
        unk_len = static_cast<uint32_t>(n);
      }
    }
    // no unk_token: the package drops the character
    i += n;
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  struct Merge {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Merge& o) const {  // priority_queue pops the largest: make it lowest rank, then pos
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const auto lookup = [&](int32_t a, int32_t b) -> const std::pair<uint32_t, int32_t>* {
    const auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::vector<Merge> heap_storage;
  heap_storage.reserve(syms.size());
  std::priority_queue<Merge> queue(std::less<Merge>(), std::move(heap_storage));
  for (size_t i = 0; i + 1 < syms.size(); ++i)
    if (const auto* m = lookup(syms[i].id, syms[i + 1].id)) queue.push({m->first, static_cast<int32_t>(i), m->second});
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Sym& cur = syms[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    Sym& right = syms[cur.next];
    const auto* m = lookup(cur.id, right.id);
    if (!m || m->second != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    right.alive = false;
    if (cur.next >= 0) syms[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* pm = lookup(syms[cur.prev].id, cur.id)) queue.push({pm->first, cur.prev, pm->second});
    if (cur.next >= 0)
      if (const auto* nm = lookup(cur.id, syms[cur.next].id)) queue.push({nm->first, top.pos, nm->second});
  }
  for (const auto& s : syms)
    if (s.alive) out.push_back({s.id, s.len});
}

// [SECTION] Decoding ---------------------------------------------------------------------------------------------

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && static_cast<size_t>(id) < id_to_token_.size() && has_token_[id]) toks.push_back(id_to_token_[id]);
  if (!has_decoder_) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  const auto& bl = byte_level();
  for (const auto& d : decoder_) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecoderStep::ByteLevel: {
        std::string bytes;
        for (const auto& t : toks) {
          if (auto raw = bl.to_bytes(t)) bytes += *raw;
          else bytes += t;
        }
        next.push_back(utf8_lossy(bytes));
        break;
      }
      case DecoderStep::Replace:
        for (auto& t : toks) {
          Piece p;
          p.s = t;
          p.replace(d.pattern.find(t), d.content);
          next.push_back(std::move(p.s));
        }
        break;
      case DecoderStep::ByteFallback: {
        std::string run;
        size_t run_len = 0;
        const auto flush = [&] {
          if (!run_len) return;
          if (utf8_lossy(run) == run) {
            next.push_back(run);
          } else {
            for (size_t k = 0; k < run_len; ++k) next.push_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_len = 0;
        };
        for (auto& t : toks) {
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
            run += static_cast<char>(hex_byte(t[3], t[4]));
            ++run_len;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        break;
      }
      case DecoderStep::Fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecoderStep::Strip:
        for (auto& t : toks) {
          const std::string& c = d.content;
          size_t b = 0, e = t.size();
          for (size_t k = 0; k < d.start && !c.empty() && t.compare(b, c.size(), c) == 0; ++k) b += c.size();
          for (size_t k = 0; k < d.stop && !c.empty() && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k)
            e -= c.size();
          next.push_back(t.substr(b, e - b));
        }
        break;
      case DecoderStep::Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          Piece p;
          p.s = toks[i];
          // As the package does: in the first token every replacement goes, not only a leading one.
          p.replace(find_literal(p.s, d.content), i == 0 && d.prepend ? "" : " ");
          next.push_back(std::move(p.s));
        }
        break;
    }
    toks.swap(next);
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  const std::string text = read_text_file(path, 512u << 20, "tokenizer file");
  json j;
  try {
    j = parse_json(text, path);
  } catch (const json::exception& e) {
    fail_file(path, std::string("not valid JSON: ") + e.what());
  }
  try {
    return std::make_unique<BpeTokenizer>(path, j);
  } catch (const json::exception& e) {
    fail_file(path, std::string("unexpected tokenizer.json structure: ") + e.what());
  }
}

}  // namespace ds
