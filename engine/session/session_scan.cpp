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

namespace {

// Mean of each fraction over entries, NaN entries left out (NaN when none is finite).
struct MeanAcc {
  double sum[kNumFractions] = {};
  int64_t count[kNumFractions] = {};
  void add(const Fractions& f) {
    for (int i = 0; i < kNumFractions; ++i) {
      const double v = fraction(f, i);
      if (std::isfinite(v)) {
        sum[i] += v;
        count[i]++;
      }
    }
  }
  Fractions mean() const {
    Fractions f;
    for (int i = 0; i < kNumFractions; ++i) fraction(f, i) = count[i] ? sum[i] / double(count[i]) : kNaN;
    return f;
  }
};

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

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
  s_.set_ids(ids);  // checks the vocabulary, the positions and the backend's memory
  s_.set_lambda_scale(opt_.lambda_scale);
  s_.set_logit_bits(opt_.logit_bits);
  check();
  s_.run();
  check();
  const int64_t q = r.tokens - 1;
  MeanAcc all;
  for (int l : layers_) {
    const std::vector<RowMass> m = s_.backend().row_mass(l, q, r.answer_begin, r.answer_end);
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
    r.outliers = std::make_shared<const Outliers>(outlier_stats(s_));
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

RunReport Run::report() const {
  const ModelConfig& c = s_.config();
  RunReport o;
  o.label = opt_.label;
  o.model = s_.model_dir();
  o.architecture = arch_spec(c.arch).architecture;
  o.differential = differential();
  o.backend = s_.backend().name();
  o.lambda_scale = opt_.lambda_scale;
  o.logit_bits = opt_.logit_bits;
  o.prompts = int64_t(results_.size());
  MeanAcc mean;
  for (const PromptResult& r : results_) {
    o.tokens += r.tokens;
    o.with_target += r.has_target;
    o.correct += r.has_target && r.correct;
    mean.add(r.mean);
  }
  o.accuracy = o.with_target ? double(o.correct) / double(o.with_target) : kNaN;
  o.mean = mean.mean();
  if (opt_.outliers) {
    std::vector<const Outliers*> per;
    for (const PromptResult& r : results_)
      if (r.outliers) per.push_back(r.outliers.get());
    o.outliers = merge_outliers(per);
  }
  for (size_t li = 0; li < layers_.size(); ++li) {  // per layer and head: means over prompts
    LayerReport lr{layers_[li], layer_kind_name(c.kind(layers_[li])), {}};
    for (int64_t h = 0; h < Run::heads(); ++h) {
      MeanAcc acc;
      for (const PromptResult& r : results_) acc.add(r.heads[li][size_t(h)]);
      lr.heads.push_back(acc.mean());
    }
    o.layers.push_back(std::move(lr));
  }
  for (const char* key : {"length", "depth"}) {  // groups by the tags "length" and "depth"
    std::vector<nlohmann::json> values;
    for (const PromptResult& r : results_)
      if (r.tags.contains(key) && std::find(values.begin(), values.end(), r.tags[key]) == values.end())
        values.push_back(r.tags[key]);
    if (values.empty()) continue;
    std::sort(values.begin(), values.end());  // numbers before strings, each in order
    std::vector<GroupReport> arr;
    for (const nlohmann::json& v : values) {
      MeanAcc acc;
      GroupReport g;
      g.value = v;
      int64_t wt = 0, ok = 0;
      for (const PromptResult& r : results_)
        if (r.tags.contains(key) && r.tags[key] == v) {
          ++g.prompts;
          acc.add(r.mean);
          wt += r.has_target;
          ok += r.has_target && r.correct;
        }
      g.accuracy = wt ? double(ok) / double(wt) : kNaN;
      g.mean = acc.mean();
      arr.push_back(std::move(g));
    }
    o.groups.emplace_back(key, std::move(arr));
  }
  for (const PromptResult& r : results_) {
    PromptResult p = r;
    p.heads.clear();
    o.per_prompt.push_back(std::move(p));
  }
  return o;
}

nlohmann::json run_report_json(const RunReport& r) {
  const bool diff = r.differential;
  nlohmann::json o;
  o["label"] = r.label;
  o["model"] = r.model;
  o["architecture"] = r.architecture;
  o["differential"] = diff;
  o["backend"] = r.backend;
  o["lambda_scale"] = r.lambda_scale;
  o["logit_bits"] = r.logit_bits;
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
  Report r{input, complete, elapsed_s, skipped, runs[0]->report(), std::nullopt};
  if (runs.size() == 2) r.compare = runs[1]->report();
  return r;
}

nlohmann::json report_json(const Report& r) {
  nlohmann::json o{{"tool", "diffscope-scan"}, {"input", r.input}, {"complete", r.complete}, {"elapsed_s", r.elapsed_s}};
  nlohmann::json sk = nlohmann::json::array();
  for (const LineError& e : r.skipped) sk.push_back({{"line", e.line}, {"error", e.error}});
  o["skipped"] = std::move(sk);
  o.update(run_report_json(r.run));
  if (r.compare) o["compare"] = run_report_json(*r.compare);
  return o;
}

void write_json_atomic(const Report& report, const std::string& path) {
  write_file_safely(path, report_json(report).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                    "the report");
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
  write_file_safely(path, s.str(), "the CSV");
}

}  // namespace ds::scan
