// Corpus scans (session_scan.h): reading the JSONL corpus, one prompt's row masses and greedy answer, the averages
// over prompts, and the report in JSON and CSV.
#include "engine/session/session_scan.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "engine/core/arch.h"
#include "engine/core/error.h"
#include "engine/core/input_limits.h"
#include "engine/core/safe_write.h"
#include "engine/session/session_importance.h"

namespace ds::scan {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A JSON integer (not a float, not a bool) in [lo, hi]; throws with `what` in the message.
int64_t as_int(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw Error(what + " is not an integer");
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) throw Error(what + " is too large");
    x = int64_t(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) throw Error(what + " = " + std::to_string(x) + " is outside " + std::to_string(lo) + ".." +
                                    std::to_string(hi));
  return x;
}

std::vector<int32_t> as_ids(const nlohmann::json& v, const std::string& what) {
  if (!v.is_array()) throw Error(what + " is not a list of token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(int32_t(as_int(v[i], what + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int32_t>::max())));
  return ids;
}

// Byte offset of each code point of UTF-8 `s` (and s.size() at the end): characters -> bytes. Invalid bytes count
// as one character each (Python would have refused the file; here a span through them still maps).
std::vector<size_t> char_to_byte(const std::string& s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    at.push_back(i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + len > s.size()) len = 1;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) len = 1;
    i += len;
  }
  at.push_back(s.size());
  return at;
}

double ratio(double part, double total) { return total != 0.0 && std::isfinite(total) ? part / total : kNaN; }

}  // namespace

Fractions fractions_of(const RowMass& m, bool differential) {
  Fractions f;
  const auto total = [&](int i) { return m.answer[i] + m.sink[i] + m.context[i]; };
  const double t1 = total(MASS_A1);
  f.answer1 = ratio(m.answer[MASS_A1], t1);
  f.sink1 = ratio(m.sink[MASS_A1], t1);
  f.context1 = ratio(m.context[MASS_A1], t1);
  if (!differential) {
    f.answer2 = f.sink2 = f.context2 = kNaN;
    f.answer_diff = f.sink_diff = f.context_diff = kNaN;
    f.answer_diff_abs = f.sink_diff_abs = f.context_diff_abs = kNaN;
    return f;
  }
  const double t2 = total(MASS_A2), td = total(MASS_D), ta = total(MASS_ABS_D);
  f.answer2 = ratio(m.answer[MASS_A2], t2);
  f.sink2 = ratio(m.sink[MASS_A2], t2);
  f.context2 = ratio(m.context[MASS_A2], t2);
  // A row whose difference sums to (almost) nothing has no meaningful normalisation by its sum.
  const double tds = std::fabs(td) > 1e-6 * std::max(1.0, ta) ? td : 0.0;
  f.answer_diff = ratio(m.answer[MASS_D], tds);
  f.sink_diff = ratio(m.sink[MASS_D], tds);
  f.context_diff = ratio(m.context[MASS_D], tds);
  f.answer_diff_abs = ratio(m.answer[MASS_ABS_D], ta);
  f.sink_diff_abs = ratio(m.sink[MASS_ABS_D], ta);
  f.context_diff_abs = ratio(m.context[MASS_ABS_D], ta);
  return f;
}

void ExactSum::add(double x) {
  size_t i = 0;
  for (size_t j = 0; j < p_.size(); ++j) {
    double y = p_[j];
    if (std::fabs(x) < std::fabs(y)) std::swap(x, y);
    const double hi = x + y, lo = y - (hi - x);
    if (lo != 0.0) p_[i++] = lo;
    x = hi;
  }
  p_.resize(i);
  p_.push_back(x);
}

double ExactSum::value() const {
  // The partials sum to the exact total; add them from the largest down until the rest cannot change the rounding,
  // then correct a half-way case (as math.fsum).
  size_t n = p_.size();
  if (n == 0) return 0.0;
  double hi = p_[--n], lo = 0.0;
  while (n > 0) {
    const double x = hi, y = p_[--n];
    hi = x + y;
    lo = y - (hi - x);
    if (lo != 0.0) break;
  }
  if (n > 0 && ((lo < 0 && p_[n - 1] < 0) || (lo > 0 && p_[n - 1] > 0))) {
    const double y = lo * 2, x = hi + y;
    if (y == x - hi) hi = x;
  }
  return hi;
}

void FractionSums::add(const Fractions& f) {
  for (int i = 0; i < kNumFractions; ++i) {
    const double v = fraction(f, i);
    if (std::isfinite(v)) {
      sum[i].add(v);
      count[i]++;
    }
  }
}

void FractionSums::add(const FractionSums& o) {
  for (int i = 0; i < kNumFractions; ++i) {
    sum[i].add(o.sum[i]);
    count[i] += o.count[i];
  }
}

Fractions FractionSums::mean() const {
  Fractions f;
  for (int i = 0; i < kNumFractions; ++i) fraction(f, i) = count[i] ? sum[i].value() / double(count[i]) : kNaN;
  return f;
}

namespace {
nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json sums_json(const FractionSums& f) {
  nlohmann::json p = nlohmann::json::array(), c = nlohmann::json::array();
  for (int i = 0; i < kNumFractions; ++i) p.push_back(f.sum[i].partials()), c.push_back(f.count[i]);
  return {{"partials", p}, {"count", c}};
}

nlohmann::json totals_json(const RunTotals& t) {
  nlohmann::json heads = nlohmann::json::array();
  for (const auto& l : t.heads) {
    nlohmann::json hl = nlohmann::json::array();
    for (const FractionSums& h : l) hl.push_back(sums_json(h));
    heads.push_back(std::move(hl));
  }
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [key, arr] : t.groups) {
    nlohmann::json a = nlohmann::json::array();
    for (const GroupTotals& g : arr)
      a.push_back({{"value", g.value}, {"prompts", g.prompts}, {"with_target", g.with_target}, {"correct", g.correct},
                   {"mean", sums_json(g.mean)}});
    groups.push_back({key, a});
  }
  nlohmann::json o{{"prompts", t.prompts}, {"tokens", t.tokens}, {"with_target", t.with_target}, {"correct", t.correct},
                   {"mean", sums_json(t.mean)}, {"heads", heads}, {"groups", groups}};
  if (t.outliers) o["outliers"] = outlier_parts_json(*t.outliers);
  return o;
}

nlohmann::json fractions_json(const Fractions& f, bool differential) {
  nlohmann::json o = nlohmann::json::object();
  for (int i = 0; i < kNumFractions; ++i)
    if (fraction_applies(i, differential)) o[kFractionKeys[i]] = num(fraction(f, i));
  return o;
}

void trim_left(std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  s.erase(0, i);
}
void trim_right(std::string& s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace

const char* const kFractionKeys[kNumFractions] = {
    "answer1", "answer2", "answer_diff", "answer_diff_abs", "sink1",    "sink2",
    "sink_diff", "sink_diff_abs", "context1", "context2", "context_diff", "context_diff_abs"};

double& fraction(Fractions& f, int i) {
  double* const v[kNumFractions] = {&f.answer1,  &f.answer2,  &f.answer_diff,  &f.answer_diff_abs,
                                    &f.sink1,    &f.sink2,    &f.sink_diff,    &f.sink_diff_abs,
                                    &f.context1, &f.context2, &f.context_diff, &f.context_diff_abs};
  return *v[i];
}
double fraction(const Fractions& f, int i) { return fraction(const_cast<Fractions&>(f), i); }

bool fraction_applies(int i, bool differential) { return differential || i % 4 == 0; }

// ---------------------------------------------------------------------------------------------------------------
// input

Prompt parse_line(const std::string& line, int line_no) {
  nlohmann::json j;
  try {
    j = parse_json(line, "");
  } catch (const nlohmann::json::exception&) {
    throw Error("not valid JSON");
  }
  if (!j.is_object()) throw Error("not a JSON object");
  Prompt p;
  p.line = line_no;
  const bool has_text = j.contains("text"), has_ids = j.contains("ids");
  if (has_text == has_ids) throw Error(has_text ? "has both \"text\" and \"ids\"" : "has neither \"text\" nor \"ids\"");
  if (has_text) {
    if (!j["text"].is_string()) throw Error("\"text\" is not a string");
    p.is_text = true;
    p.text = j["text"].get<std::string>();
    if (p.text.empty()) throw Error("\"text\" is empty");
  } else {
    p.ids = as_ids(j["ids"], "\"ids\"");
    if (p.ids.empty()) throw Error("\"ids\" is empty");
  }
  if (!j.contains("answer")) throw Error("has no \"answer\": [begin, end)");
  const nlohmann::json& a = j["answer"];
  if (!a.is_array() || a.size() != 2) throw Error("\"answer\" is not a pair [begin, end)");
  const int64_t big = std::numeric_limits<int32_t>::max();
  p.answer_begin = as_int(a[0], "\"answer\" begin", 0, big);
  p.answer_end = as_int(a[1], "\"answer\" end", 0, big);
  if (p.answer_end <= p.answer_begin)
    throw Error("\"answer\" [" + std::to_string(p.answer_begin) + ", " + std::to_string(p.answer_end) +
                ") is empty");
  if (j.contains("target")) {
    const nlohmann::json& t = j["target"];
    p.has_target = true;
    if (t.is_string()) {
      p.target_is_text = true;
      p.target_text = t.get<std::string>();
      std::string trimmed = p.target_text;
      trim_left(trimmed);
      if (trimmed.empty()) throw Error("\"target\" is empty");
    } else {
      p.target_ids = as_ids(t, "\"target\"");
      if (p.target_ids.empty()) throw Error("\"target\" is empty");
    }
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "text" && it.key() != "ids" && it.key() != "answer" && it.key() != "target")
      p.tags[it.key()] = it.value();
  return p;
}

namespace {
// std::getline that keeps at most max + 1 bytes of a line (the rest is read past, not stored): a line longer than
// max comes back with size max + 1.
bool read_line_bounded(std::istream& in, std::string& line, size_t max) {
  line.clear();
  std::streambuf* sb = in.rdbuf();
  bool any = false;
  for (;;) {
    const int ch = sb->sbumpc();
    if (ch == std::char_traits<char>::eof()) {
      if (!any) in.setstate(std::ios::eofbit);
      return any;
    }
    any = true;
    if (ch == '\n') return true;
    if (line.size() <= max) line.push_back(char(ch));
  }
}
}  // namespace

int64_t corpus_plan_tokens(const Corpus& c, const std::string& model_dir, int max_answer_tokens) {
  int64_t longest = 0;
  std::vector<const Prompt*> texts;
  for (const Prompt& p : c.prompts) {
    if (p.is_text) texts.push_back(&p);
    else longest = std::max<int64_t>(longest, int64_t(p.ids.size()));
  }
  if (!texts.empty()) {
    // the longest few texts by bytes (token counts follow bytes closely enough to find the longest among them)
    const size_t k = std::min<size_t>(texts.size(), 4);
    std::partial_sort(texts.begin(), texts.begin() + ptrdiff_t(k), texts.end(),
                      [](const Prompt* a, const Prompt* b) { return a->text.size() > b->text.size(); });
    for (size_t i = 0; i < k; ++i)
      longest = std::max<int64_t>(longest, count_tokens_before_load(model_dir, texts[i]->text) + 2);
  }
  return longest + std::max(0, max_answer_tokens);
}

Corpus read_corpus(const std::string& path) {
  check_regular_file(path, "corpus");  // a directory, FIFO or device is refused by name, at once
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_file(path, "cannot open");
  Corpus c;
  c.path = path;
  std::string line;
  int no = 0, nonblank = 0;
  while (read_line_bounded(in, line, kMaxCorpusLineBytes)) {
    ++no;
    if (line.size() > kMaxCorpusLineBytes) {  // the rest of the line was skipped, not kept
      c.errors.push_back({no, "longer than " + format_bytes(kMaxCorpusLineBytes) + ": skipped"});
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++nonblank;
    try {
      c.prompts.push_back(parse_line(line, no));
    } catch (const Error& e) {
      c.errors.push_back({no, e.what()});
    }
  }
  if (in.bad()) fail_file(path, "read error after line " + std::to_string(no));
  if (nonblank == 0) fail_file(path, "holds no prompt (one JSON object per line: {\"text\" or \"ids\", \"answer\"})");
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// a run

Run::Run(Session& session, RunOptions opt) : s_(session), opt_(std::move(opt)) {
  const ModelConfig& c = s_.config();
  for (int l = 0; l < int(c.layers); ++l)
    if (c.has_maps(l)) layers_.push_back(l);
  if (layers_.empty()) throw Error(s_.model_dir() + ": the model has no attention layer to scan");
  if (opt_.label.empty()) {
    std::string dir = s_.model_dir();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    opt_.label = std::filesystem::path(dir).filename().string();
    if (opt_.label.empty()) opt_.label = dir;
    if (opt_.lambda_scale != 1.0 && c.is_diff()) {
      char buf[48];
      std::snprintf(buf, sizeof buf, " (lambda x%g)", opt_.lambda_scale);
      opt_.label += buf;
    }
  }
  if (opt_.max_answer_tokens < 1) throw Error("the answer length limit must be at least 1 token");
}

bool Run::differential() const { return s_.config().is_diff(); }
int64_t Run::heads() const { return s_.config().view_heads(); }

const PromptResult& Run::scan(const Prompt& p, const std::function<bool()>& cancelled) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto check = [&] {
    if (cancelled && cancelled()) throw Cancelled();
  };
  const Tokenizer* tok = s_.tokenizer();
  PromptResult r;
  r.line = p.line;
  r.tags = p.tags;
  std::vector<int32_t> ids;
  if (p.is_text) {
    if (!tok) throw Error("a text prompt needs a tokenizer, and the model has none (" + s_.tokenizer_error() + ")");
    const std::vector<size_t> at = char_to_byte(p.text);
    const int64_t chars = int64_t(at.size()) - 1;
    if (p.answer_end > chars)
      throw Error("\"answer\" [" + std::to_string(p.answer_begin) + ", " + std::to_string(p.answer_end) +
                  ") is outside the text's " + std::to_string(chars) + " characters");
    const size_t b0 = at[size_t(p.answer_begin)], b1 = at[size_t(p.answer_end)];
    const std::vector<TokenSpan> spans = tok->encode_spans(p.text, true);
    int64_t a0 = -1, a1 = -1;
    for (size_t i = 0; i < spans.size(); ++i) {
      ids.push_back(spans[i].id);
      if (spans[i].begin < spans[i].end && spans[i].begin < b1 && spans[i].end > b0) {
        if (a0 < 0) a0 = int64_t(i);
        a1 = int64_t(i) + 1;
      }
    }
    if (a0 < 0) throw Error("\"answer\" covers no token of the text");
    r.answer_begin = a0;
    r.answer_end = a1;
  } else {
    ids = p.ids;
    if (p.answer_end > int64_t(ids.size()))
      throw Error("\"answer\" [" + std::to_string(p.answer_begin) + ", " + std::to_string(p.answer_end) +
                  ") is outside the prompt's " + std::to_string(ids.size()) + " tokens");
    r.answer_begin = p.answer_begin;
    r.answer_end = p.answer_end;
  }
  r.tokens = int64_t(ids.size());
  // No per-kernel profile of a scan's prompts (the report has none; the session's own profiling is back after).
  struct Unprofiled {
    Session& s;
    bool was;
    ~Unprofiled() { s.set_profiled(was); }
  } unprofiled{s_, s_.profiled()};
  s_.set_profiled(false);
  // The run's lambda scale and logit bits for the prompt; the session's own are back after it (a scan of a Python
  // Session leaves the session's settings as it found them).
  struct Settings {
    Session& s;
    double scale;
    int bits;
    ~Settings() {
      s.set_lambda_scale(scale);
      s.set_logit_bits(bits);
    }
  } settings{s_, s_.lambda_control().scale, s_.logit_bits()};
  s_.set_ids(ids);  // checks the vocabulary, the positions and the backend's memory
  s_.set_lambda_scale(opt_.lambda_scale);
  s_.set_logit_bits(opt_.logit_bits);
  check();
  s_.run();
  check();
  const int64_t q = r.tokens - 1;
  FractionSums all;
  for (const std::vector<RowMass>& m : s_.backend().row_masses(layers_, q, r.answer_begin, r.answer_end)) {
    std::vector<Fractions> hf;
    hf.reserve(m.size());
    for (const RowMass& x : m) {
      hf.push_back(fractions_of(x, differential()));
      all.add(hf.back());
    }
    r.heads.push_back(std::move(hf));
  }
  r.mean = all.mean();
  if (opt_.outliers) {  // before any answer token is generated: the prompt's own values
    OutlierRequest oq;
    oq.cancel = cancelled;  // (between layers: a long prompt's logits take seconds)
    r.outliers = std::make_shared<const Outliers>(outlier_stats(s_, oq));
    check();
  }
  if (p.has_target) {
    std::vector<int32_t> want = p.target_ids;
    std::string want_text = p.target_text;
    if (p.target_is_text) {
      if (!tok) throw Error("a text target needs a tokenizer, and the model has none");
      want = tok->encode(p.target_text, false);
    }
    GenerateOptions g;
    g.max_new = int(std::min<size_t>(size_t(opt_.max_answer_tokens), std::max<size_t>(want.size(), 1) + 2));
    if (!p.target_is_text) g.max_new = int(std::min<size_t>(size_t(opt_.max_answer_tokens), want.size()));
    check();
    r.output_ids = s_.generate(g, [&](int32_t) { return !(cancelled && cancelled()); });
    check();
    if (p.target_is_text) {
      // Text targets compare as text: the continuation, leading space dropped, starts with the target.
      r.target = p.target_text;
      r.output = tok->decode(r.output_ids);
      std::string out = r.output, tgt = p.target_text;
      trim_left(out);
      trim_left(tgt);
      trim_right(tgt);
      r.correct = !tgt.empty() && out.compare(0, tgt.size(), tgt) == 0;
    } else {
      r.target = ids_text(p.target_ids);
      r.output = tok ? tok->decode(r.output_ids) : ids_text(r.output_ids);
      r.correct = r.output_ids.size() >= p.target_ids.size() &&
                  std::equal(p.target_ids.begin(), p.target_ids.end(), r.output_ids.begin());
    }
    r.has_target = true;
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  results_.push_back(std::move(r));
  return results_.back();
}

RunTotals totals_of(const std::vector<PromptResult>& results, size_t layers, int64_t heads, bool outliers) {
  RunTotals t;
  t.heads.assign(layers, std::vector<FractionSums>(size_t(heads)));
  for (const PromptResult& r : results) {
    ++t.prompts;
    t.tokens += r.tokens;
    t.with_target += r.has_target;
    t.correct += r.has_target && r.correct;
    t.mean.add(r.mean);
    if (r.heads.size() != layers) throw Error("internal: a prompt's result without its per-head fractions");
    for (size_t li = 0; li < layers; ++li)
      for (int64_t h = 0; h < heads; ++h) t.heads[li][size_t(h)].add(r.heads[li][size_t(h)]);
  }
  for (const char* key : {"length", "depth"}) {  // groups by the tags "length" and "depth"
    std::vector<GroupTotals> arr;
    for (const PromptResult& r : results) {
      if (!r.tags.contains(key)) continue;
      auto it = std::find_if(arr.begin(), arr.end(), [&](const GroupTotals& g) { return g.value == r.tags[key]; });
      if (it == arr.end()) {
        it = arr.insert(arr.end(), GroupTotals{});
        it->value = r.tags[key];
      }
      ++it->prompts;
      it->mean.add(r.mean);
      it->with_target += r.has_target;
      it->correct += r.has_target && r.correct;
    }
    if (arr.empty()) continue;
    std::sort(arr.begin(), arr.end(), [](const GroupTotals& a, const GroupTotals& b) { return a.value < b.value; });
    t.groups.emplace_back(key, std::move(arr));  // numbers before strings, each in order
  }
  if (outliers) {
    std::vector<const Outliers*> per;
    for (const PromptResult& r : results)
      if (r.outliers) per.push_back(r.outliers.get());
    t.outliers = outlier_parts(per);
  }
  return t;
}

void merge_totals(RunTotals& a, const RunTotals& b) {
  if (a.heads.size() != b.heads.size() || (!a.heads.empty() && a.heads[0].size() != b.heads[0].size()))
    throw Error("the runs have different layers or heads");
  a.prompts += b.prompts, a.tokens += b.tokens, a.with_target += b.with_target, a.correct += b.correct;
  a.mean.add(b.mean);
  for (size_t li = 0; li < a.heads.size(); ++li)
    for (size_t h = 0; h < a.heads[li].size(); ++h) a.heads[li][h].add(b.heads[li][h]);
  for (const auto& gb : b.groups) {  // (no structured binding: clang 14 cannot capture one in a lambda)
    const std::string& key = gb.first;
    const std::vector<GroupTotals>& arr = gb.second;
    auto g = std::find_if(a.groups.begin(), a.groups.end(), [&](const auto& x) { return x.first == key; });
    if (g == a.groups.end()) {
      a.groups.emplace_back(key, std::vector<GroupTotals>{});
      g = a.groups.end() - 1;
    }
    for (const GroupTotals& y : arr) {
      auto it = std::find_if(g->second.begin(), g->second.end(), [&](const GroupTotals& x) { return x.value == y.value; });
      if (it == g->second.end()) {
        g->second.push_back(y);
        continue;
      }
      it->prompts += y.prompts, it->with_target += y.with_target, it->correct += y.correct;
      it->mean.add(y.mean);
    }
    std::sort(g->second.begin(), g->second.end(), [](const GroupTotals& x, const GroupTotals& y) { return x.value < y.value; });
  }
  std::stable_sort(a.groups.begin(), a.groups.end(), [](const auto& x, const auto& y) {
    return (x.first == "length" ? 0 : 1) < (y.first == "length" ? 0 : 1);  // "length" before "depth", as one run
  });
  if (b.outliers) {
    if (!a.outliers) a.outliers = OutlierParts{};
    merge_parts(*a.outliers, *b.outliers);
  }
}

void finish_report(RunReport& o) {
  const RunTotals& t = o.totals;
  o.prompts = t.prompts;
  o.tokens = t.tokens;
  o.with_target = t.with_target;
  o.correct = t.correct;
  o.accuracy = o.with_target ? double(o.correct) / double(o.with_target) : kNaN;
  o.mean = t.mean.mean();
  if (t.heads.size() != o.layers.size()) throw Error("internal: totals of other layers");
  for (size_t li = 0; li < o.layers.size(); ++li) {  // per layer and head: means over prompts
    o.layers[li].heads.clear();
    for (const FractionSums& h : t.heads[li]) o.layers[li].heads.push_back(h.mean());
  }
  o.groups.clear();
  for (const auto& [key, arr] : t.groups) {
    std::vector<GroupReport> g;
    for (const GroupTotals& x : arr)
      g.push_back({x.value, x.prompts, x.with_target ? double(x.correct) / double(x.with_target) : kNaN, x.mean.mean()});
    o.groups.emplace_back(key, std::move(g));
  }
  if (t.outliers) o.outliers = outliers_of(*t.outliers);
  else o.outliers.reset();
}

RunReport Run::report() const { return report_for(results_); }

RunReport Run::report_for(const std::vector<PromptResult>& results) const {
  const ModelConfig& c = s_.config();
  RunReport o;
  o.label = opt_.label;
  o.model = s_.model_dir();
  o.architecture = arch_spec(c.arch).architecture;
  o.differential = differential();
  o.backend = s_.backend().name();
  o.lambda_scale = opt_.lambda_scale;
  o.logit_bits = opt_.logit_bits;
  o.interventions = nlohmann::json::parse(interventions_json(s_));
  for (int l : layers_) o.layers.push_back(LayerReport{l, layer_kind_name(c.kind(l)), {}});
  o.totals = totals_of(results, layers_.size(), Run::heads(), opt_.outliers);
  finish_report(o);
  for (const PromptResult& r : results) {
    PromptResult p = r;
    p.heads.clear();
    p.outliers = nullptr;
    o.per_prompt.push_back(std::move(p));
  }
  std::stable_sort(o.per_prompt.begin(), o.per_prompt.end(),
                   [](const PromptResult& x, const PromptResult& y) { return x.line < y.line; });  // input order
  return o;
}

nlohmann::json run_report_json(const RunReport& r, bool with_totals) {
  const bool diff = r.differential;
  nlohmann::json o;
  o["label"] = r.label;
  o["model"] = r.model;
  o["architecture"] = r.architecture;
  o["differential"] = diff;
  o["backend"] = r.backend;
  o["lambda_scale"] = r.lambda_scale;
  o["logit_bits"] = r.logit_bits;
  o["interventions"] = r.interventions;
  o["prompts"] = r.prompts;
  o["tokens"] = r.tokens;
  o["with_target"] = r.with_target;
  o["correct"] = r.correct;
  o["accuracy"] = num(r.accuracy);
  o["mean"] = fractions_json(r.mean, diff);
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerReport& l : r.layers) {
    nlohmann::json heads = nlohmann::json::array();
    for (size_t h = 0; h < l.heads.size(); ++h) {
      nlohmann::json hj = fractions_json(l.heads[h], diff);
      hj["head"] = h;
      heads.push_back(std::move(hj));
    }
    layers.push_back({{"layer", l.layer}, {"kind", l.kind}, {"heads", heads}});
  }
  o["layers"] = std::move(layers);
  if (r.outliers) {
    nlohmann::json x = nlohmann::json::parse(outliers_json(*r.outliers));
    x["medians"] = "median of the prompts' medians";
    o["outliers"] = std::move(x);
  }
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [key, arr] : r.groups) {
    nlohmann::json a = nlohmann::json::array();
    for (const GroupReport& g : arr)
      a.push_back({{"value", g.value}, {"prompts", g.prompts}, {"accuracy", num(g.accuracy)},
                   {"mean", fractions_json(g.mean, diff)}});
    groups[key] = std::move(a);
  }
  o["groups"] = std::move(groups);
  nlohmann::json per = nlohmann::json::array();
  for (const PromptResult& p : r.per_prompt) {
    nlohmann::json pj{{"line", p.line},
                      {"tokens", p.tokens},
                      {"answer", {p.answer_begin, p.answer_end}},
                      {"tags", p.tags},
                      {"mean", fractions_json(p.mean, diff)},
                      {"ms", p.ms}};
    if (p.has_target) {
      pj["target"] = p.target;
      pj["output"] = p.output;
      pj["correct"] = p.correct;
    }
    per.push_back(std::move(pj));
  }
  o["per_prompt"] = std::move(per);
  if (with_totals) o["totals"] = totals_json(r.totals);
  if (with_totals && !r.model_fingerprint.empty()) o["model_fingerprint"] = r.model_fingerprint;
  return o;
}

void scan_all(const std::vector<std::unique_ptr<Run>>& runs, const Prompt& p, const std::function<bool()>& cancelled) {
  size_t ran = 0;
  try {
    for (const auto& r : runs) {
      r->scan(p, cancelled);
      ++ran;
    }
  } catch (...) {
    for (size_t i = 0; i < ran; ++i) runs[i]->drop_last();
    throw;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// the report

Report make_report(const std::vector<const Run*>& runs, const std::string& input, const std::vector<LineError>& skipped,
                   bool complete, double elapsed_s) {
  if (runs.empty() || runs.size() > 2) throw Error("a report holds one run, or two to compare");
  Report r{input, complete, elapsed_s, skipped, runs[0]->report(), std::nullopt, std::nullopt};
  if (runs.size() == 2) r.compare = runs[1]->report();
  // Bad lines in line order, whether the corpus reader or the model refused them (a sharded or multi-GPU scan
  // finds them in another order).
  std::stable_sort(r.skipped.begin(), r.skipped.end(), [](const LineError& a, const LineError& b) { return a.line < b.line; });
  return r;
}

Report make_report(const std::vector<const Run*>& runs, const std::vector<std::vector<PromptResult>>& results,
                   const std::string& input, const std::vector<LineError>& skipped, bool complete, double elapsed_s) {
  if (runs.empty() || runs.size() > 2 || results.size() != runs.size())
    throw Error("a report holds one run, or two to compare");
  Report r{input, complete, elapsed_s, skipped, runs[0]->report_for(results[0]), std::nullopt, std::nullopt};
  if (runs.size() == 2) r.compare = runs[1]->report_for(results[1]);
  std::stable_sort(r.skipped.begin(), r.skipped.end(), [](const LineError& a, const LineError& b) { return a.line < b.line; });
  return r;
}

namespace {
struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};
void add_file(Fnv& f, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be read (its fingerprint)");
  std::vector<char> buf(size_t(1) << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    f.add(buf.data(), size_t(in.gcount()));
  }
  if (in.bad()) throw Error(path + ": a read failed (its fingerprint)");
}
}  // namespace

std::string file_fingerprint(const std::string& path) {
  Fnv f;
  add_file(f, path);
  return f.hex();
}

std::string model_fingerprint(const std::string& dir) {
  namespace fs = std::filesystem;
  Fnv f;
  add_file(f, (fs::path(dir) / "config.json").string());
  std::vector<std::pair<std::string, uintmax_t>> weights;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
      weights.push_back({name, fs::file_size(e.path(), ec)});
  }
  if (ec) throw Error(dir + ": cannot be listed (its fingerprint)");
  std::sort(weights.begin(), weights.end());
  for (const auto& [name, size] : weights) {
    f.add(name.data(), name.size());
    f.add(&size, sizeof size);
  }
  return f.hex();
}

nlohmann::json report_json(const Report& r) {
  nlohmann::json o{{"tool", "diffscope-scan"}, {"input", r.input}, {"complete", r.complete}, {"elapsed_s", r.elapsed_s}};
  nlohmann::json sk = nlohmann::json::array();
  for (const LineError& e : r.skipped) sk.push_back({{"line", e.line}, {"error", e.error}});
  o["skipped"] = std::move(sk);
  const bool shard = r.shard.has_value();
  if (shard) o["shard"] = {{"index", r.shard->first}, {"count", r.shard->second}};
  if (shard && !r.input_fingerprint.empty()) o["shard"]["input_fingerprint"] = r.input_fingerprint;
  o.update(run_report_json(r.run, shard));
  if (r.compare) o["compare"] = run_report_json(*r.compare, shard);
  return o;
}

void write_json_atomic(const Report& report, const std::string& path) {
  write_file_safely(path, report_json(report).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                    "the report", {report.input});  // never over the corpus it reports on
}

void write_csv(const Report& report, const std::string& path) {
  std::ostringstream s;
  s << "label,layer,head";
  for (int i = 0; i < kNumFractions; ++i) s << ',' << kFractionKeys[i];
  s << '\n';
  const auto run_rows = [&](const RunReport& run) {
    std::string quoted = "\"";
    for (char ch : run.label) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    quoted += '"';
    for (const LayerReport& l : run.layers)
      for (size_t h = 0; h < l.heads.size(); ++h) {
        s << quoted << ',' << l.layer << ',' << h;
        for (int i = 0; i < kNumFractions; ++i) {
          s << ',';
          const double v = fraction(l.heads[h], i);
          if (fraction_applies(i, run.differential) && std::isfinite(v)) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.9g", v);
            s << buf;
          }
        }
        s << '\n';
      }
  };
  run_rows(report.run);
  if (report.compare) run_rows(*report.compare);
  write_file_safely(path, s.str(), "the CSV", {report.input});
}

// ---------------------------------------------------------------------------------------------------------------
// shards: a report read back, and the reports of the N slices of one input merged

namespace {

// The readers name what they read: "FILE: compare.per_prompt[3].tokens is not an integer".
struct Reader {
  std::string where;
  const nlohmann::json& at(const nlohmann::json& j, const char* key) const {
    if (!j.is_object() || !j.contains(key)) throw Error(where + ": no \"" + key + "\"");
    return j[key];
  }
  int64_t integer(const nlohmann::json& j, const char* key, int64_t lo = 0) const {
    return as_int(at(j, key), where + ": \"" + key + "\"", lo, std::numeric_limits<int64_t>::max());
  }
  double number(const nlohmann::json& j, const char* key) const {
    const nlohmann::json& v = at(j, key);
    if (v.is_null()) return kNaN;
    if (!v.is_number()) throw Error(where + ": \"" + key + "\" is not a number");
    return v.get<double>();
  }
  std::string text(const nlohmann::json& j, const char* key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_string()) throw Error(where + ": \"" + key + "\" is not a string");
    return v.get<std::string>();
  }
  bool flag(const nlohmann::json& j, const char* key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_boolean()) throw Error(where + ": \"" + key + "\" is not true or false");
    return v.get<bool>();
  }
  const nlohmann::json& array(const nlohmann::json& j, const char* key) const {
    const nlohmann::json& v = at(j, key);
    if (!v.is_array()) throw Error(where + ": \"" + key + "\" is not a list");
    return v;
  }
  Reader in(const std::string& sub) const { return Reader{where + "." + sub}; }
};

Fractions fractions_from(const Reader& rd, const nlohmann::json& j) {
  if (!j.is_object()) throw Error(rd.where + " is not an object of fractions");
  Fractions f;
  for (int i = 0; i < kNumFractions; ++i)
    fraction(f, i) = j.contains(kFractionKeys[i]) ? rd.number(j, kFractionKeys[i]) : kNaN;
  return f;
}

FractionSums sums_from(const Reader& rd, const nlohmann::json& j) {
  const nlohmann::json& p = rd.array(j, "partials");
  const nlohmann::json& c = rd.array(j, "count");
  if (p.size() != size_t(kNumFractions) || c.size() != size_t(kNumFractions))
    throw Error(rd.where + ": partials and count need " + std::to_string(kNumFractions) + " entries");
  FractionSums s;
  for (int i = 0; i < kNumFractions; ++i) {
    if (!p[size_t(i)].is_array()) throw Error(rd.where + ": partials[" + std::to_string(i) + "] is not a list");
    for (const auto& x : p[size_t(i)]) {
      if (!x.is_number() || !std::isfinite(x.get<double>())) throw Error(rd.where + ": a partial sum is not a finite number");
      s.sum[i].add(x.get<double>());
    }
    s.count[i] = as_int(c[size_t(i)], rd.where + ": count", 0, std::numeric_limits<int64_t>::max());
  }
  return s;
}

RunTotals totals_from(const Reader& rd, const nlohmann::json& j) {
  RunTotals t;
  t.prompts = rd.integer(j, "prompts");
  t.tokens = rd.integer(j, "tokens");
  t.with_target = rd.integer(j, "with_target");
  t.correct = rd.integer(j, "correct");
  t.mean = sums_from(rd.in("mean"), rd.at(j, "mean"));
  const nlohmann::json& heads = rd.array(j, "heads");
  for (size_t l = 0; l < heads.size(); ++l) {
    if (!heads[l].is_array()) throw Error(rd.where + ": heads[" + std::to_string(l) + "] is not a list");
    std::vector<FractionSums> hl;
    for (const auto& h : heads[l]) hl.push_back(sums_from(rd.in("heads"), h));
    t.heads.push_back(std::move(hl));
  }
  const nlohmann::json& groups = rd.at(j, "groups");
  if (!groups.is_object()) throw Error(rd.where + ": \"groups\" is not an object");
  for (const char* key : {"length", "depth"}) {
    if (!groups.contains(key)) continue;
    const Reader g = rd.in(std::string("groups.") + key);
    std::vector<GroupTotals> arr;
    for (const auto& x : g.array(groups, key)) {
      GroupTotals gt;
      gt.value = g.at(x, "value");
      gt.prompts = g.integer(x, "prompts");
      gt.with_target = g.integer(x, "with_target");
      gt.correct = g.integer(x, "correct");
      gt.mean = sums_from(g.in("mean"), g.at(x, "mean"));
      arr.push_back(std::move(gt));
    }
    t.groups.emplace_back(key, std::move(arr));
  }
  if (j.contains("outliers")) t.outliers = outlier_parts_from_json(j["outliers"], rd.where + ".outliers");
  return t;
}

RunReport run_from(const Reader& rd, const nlohmann::json& j) {
  RunReport r;
  r.label = rd.text(j, "label");
  r.model = rd.text(j, "model");
  r.architecture = rd.text(j, "architecture");
  r.differential = rd.flag(j, "differential");
  r.backend = rd.text(j, "backend");
  r.lambda_scale = rd.number(j, "lambda_scale");
  r.logit_bits = int(as_int(rd.at(j, "logit_bits"), rd.where + ": \"logit_bits\"", 0, 16));
  if (j.contains("interventions")) r.interventions = rd.array(j, "interventions");
  for (const auto& l : rd.array(j, "layers"))
    r.layers.push_back(LayerReport{int(as_int(rd.at(l, "layer"), rd.where + ": a layer", 0, 1 << 20)), rd.text(l, "kind"), {}});
  const Reader pr = rd.in("per_prompt");
  for (const auto& p : rd.array(j, "per_prompt")) {
    PromptResult x;
    x.line = int(as_int(pr.at(p, "line"), pr.where + ": \"line\"", 1, std::numeric_limits<int>::max()));
    x.tokens = pr.integer(p, "tokens", 1);
    const nlohmann::json& ans = pr.array(p, "answer");
    if (ans.size() != 2) throw Error(pr.where + ": \"answer\" is not [begin, end]");
    x.answer_begin = as_int(ans[0], pr.where + ": answer", 0, std::numeric_limits<int64_t>::max());
    x.answer_end = as_int(ans[1], pr.where + ": answer", 0, std::numeric_limits<int64_t>::max());
    x.tags = pr.at(p, "tags");
    x.mean = fractions_from(pr.in("mean"), pr.at(p, "mean"));
    x.ms = pr.number(p, "ms");
    if (p.contains("target")) {
      x.has_target = true;
      x.target = pr.text(p, "target");
      x.output = pr.text(p, "output");
      x.correct = pr.flag(p, "correct");
    }
    r.per_prompt.push_back(std::move(x));
  }
  r.totals = totals_from(rd.in("totals"), rd.at(j, "totals"));
  if (j.contains("model_fingerprint")) r.model_fingerprint = rd.text(j, "model_fingerprint");
  if (r.totals.heads.size() != r.layers.size()) throw Error(rd.where + ": totals for other layers than \"layers\"");
  if (r.totals.prompts != int64_t(r.per_prompt.size())) throw Error(rd.where + ": totals and per_prompt count other prompts");
  finish_report(r);
  return r;
}

// Two runs of the shards of one scan: the same model, settings and layers, or a one-line error naming the file.
void check_same_run(const RunReport& a, const RunReport& b, const std::string& file, const char* which) {
  auto differ = [&](const char* key) {
    throw Error(file + ": its " + which + " run has another \"" + key + "\" than the first shard's: not a shard of the same scan");
  };
  if (a.label != b.label) differ("label");
  // The model: by its content where both shards know it (paths spelled differently on two machines are one model),
  // else by its path
  if (!a.model_fingerprint.empty() && !b.model_fingerprint.empty() ? a.model_fingerprint != b.model_fingerprint
                                                                    : a.model != b.model)
    differ("model");
  if (a.architecture != b.architecture) differ("architecture");
  if (a.differential != b.differential) differ("differential");
  if (a.lambda_scale != b.lambda_scale) differ("lambda_scale");
  if (a.logit_bits != b.logit_bits) differ("logit_bits");
  if (a.interventions != b.interventions) differ("interventions");
  if (a.layers.size() != b.layers.size()) differ("layers");
  for (size_t i = 0; i < a.layers.size(); ++i)
    if (a.layers[i].layer != b.layers[i].layer) differ("layers");
  if (a.totals.outliers.has_value() != b.totals.outliers.has_value()) differ("outliers");
}

void merge_run(RunReport& a, const RunReport& b) {
  merge_totals(a.totals, b.totals);
  a.per_prompt.insert(a.per_prompt.end(), b.per_prompt.begin(), b.per_prompt.end());
  if (a.backend != b.backend && a.backend.find(b.backend) == std::string::npos) a.backend += " + " + b.backend;
}

void finish_merged(RunReport& r) {
  std::stable_sort(r.per_prompt.begin(), r.per_prompt.end(),
                   [](const PromptResult& x, const PromptResult& y) { return x.line < y.line; });
  finish_report(r);
}

}  // namespace

Report shard_report_from_json(const nlohmann::json& j, const std::string& file) {
  const Reader rd{file};
  if (!j.is_object() || j.value("tool", "") != "diffscope-scan") throw Error(file + ": not a diffscope-scan report");
  if (!j.contains("shard"))
    throw Error(file + ": a report without \"shard\": only the reports of diffscope-scan --shard I/N can be merged");
  const nlohmann::json& sh = j["shard"];
  const int count = int(as_int(rd.at(sh, "count"), file + ": shard count", 1, 1 << 20));
  const int index = int(as_int(rd.at(sh, "index"), file + ": shard index", 0, count - 1));
  Report r;
  r.shard = std::pair(index, count);
  if (sh.contains("input_fingerprint")) r.input_fingerprint = Reader{file + ": shard"}.text(sh, "input_fingerprint");
  r.input = rd.text(j, "input");
  r.complete = rd.flag(j, "complete");
  r.elapsed_s = rd.number(j, "elapsed_s");
  for (const auto& e : rd.array(j, "skipped"))
    r.skipped.push_back({int(as_int(rd.at(e, "line"), file + ": a skipped line", 1, std::numeric_limits<int>::max())),
                         rd.text(e, "error")});
  r.run = run_from(rd, j);
  if (j.contains("compare")) r.compare = run_from(rd.in("compare"), j["compare"]);
  // What a shard's own scan writes: its lines in its slice, each once; no more right answers than targets, nor
  // targets than prompts.
  auto not_shard = [&](const std::string& why) { throw Error(file + ": " + why + ": not a shard's report as scanned"); };
  auto in_slice = [&](int line) {
    if ((line - 1) % count != index)
      not_shard("line " + std::to_string(line) + " is not in the slice of shard " + std::to_string(index) + "/" +
                std::to_string(count));
  };
  for (const LineError& e : r.skipped) in_slice(e.line);
  for (const RunReport* run : {&r.run, r.compare ? &*r.compare : nullptr}) {
    if (!run) continue;
    std::vector<int> lines;
    for (const PromptResult& p : run->per_prompt) in_slice(p.line), lines.push_back(p.line);
    std::sort(lines.begin(), lines.end());
    if (std::adjacent_find(lines.begin(), lines.end()) != lines.end()) not_shard("a line is listed twice");
    const RunTotals& t = run->totals;
    if (t.correct < 0 || t.correct > t.with_target || t.with_target > t.prompts)
      not_shard("its totals count " + std::to_string(t.correct) + " right of " + std::to_string(t.with_target) +
                " targets in " + std::to_string(t.prompts) + " prompts");
  }
  return r;
}

Report merge_shard_reports(const std::vector<std::pair<std::string, Report>>& shards) {
  if (shards.empty()) throw Error("--merge: no shard reports given");
  const auto& [file0, first] = shards[0];
  const int count = first.shard->second;
  std::vector<std::string> seen(static_cast<size_t>(count));
  for (const auto& [file, r] : shards) {
    if (r.shard->second != count)
      throw Error(file + ": shard " + std::to_string(r.shard->first) + "/" + std::to_string(r.shard->second) + ", but " +
                  file0 + " is one of " + std::to_string(count));
    if (!seen[size_t(r.shard->first)].empty())
      throw Error(file + ": shard " + std::to_string(r.shard->first) + "/" + std::to_string(count) + " is also " +
                  seen[size_t(r.shard->first)]);
    seen[size_t(r.shard->first)] = file;
    if (!r.input_fingerprint.empty() && !first.input_fingerprint.empty()) {  // by content
      if (r.input_fingerprint != first.input_fingerprint)
        throw Error(file + ": a shard of " + r.input + ", whose content differs from that of " + file0 + "'s input " +
                    first.input);
    } else if (r.input != first.input) {
      throw Error(file + ": a shard of " + r.input + ", but " + file0 + " is one of " + first.input);
    }
    if (r.compare.has_value() != first.compare.has_value())
      throw Error(file + ": " + (r.compare ? "has" : "has no") + " compare run, unlike " + file0);
    check_same_run(first.run, r.run, file, "first");
    if (r.compare) check_same_run(*first.compare, *r.compare, file, "compare");
  }
  std::string missing;
  for (int i = 0; i < count; ++i)
    if (seen[size_t(i)].empty()) missing += std::string(missing.empty() ? "" : ", ") + std::to_string(i);
  if (!missing.empty())
    throw Error("--merge: shard" + std::string(missing.find(',') != std::string::npos ? "s " : " ") + missing + " of " +
                std::to_string(count) + " missing (run diffscope-scan --shard I/" + std::to_string(count) + " for each)");
  Report m = first;
  m.shard.reset();
  for (size_t i = 1; i < shards.size(); ++i) {
    const Report& r = shards[i].second;
    m.complete = m.complete && r.complete;
    m.elapsed_s = std::max(m.elapsed_s, r.elapsed_s);
    m.skipped.insert(m.skipped.end(), r.skipped.begin(), r.skipped.end());
    merge_run(m.run, r.run);
    if (m.compare) merge_run(*m.compare, *r.compare);
  }
  std::stable_sort(m.skipped.begin(), m.skipped.end(), [](const LineError& a, const LineError& b) { return a.line < b.line; });
  finish_merged(m.run);
  if (m.compare) finish_merged(*m.compare);
  return m;
}

}  // namespace ds::scan
