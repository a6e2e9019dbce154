// Corpus scans (engine/session/session_scan.h): the row masses against sums of the transformers fixtures' maps (float64),
// the CUDA device reduction against the same backend's rows, the corpus reader's line errors, the answer span's
// mapping from characters to tokens, the greedy-answer check, interruption, and the report's shape.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/session/session.h"
#include "engine/session/session_scan.h"
#include "engine/session/session_scan_queue.h"
#include "test_util.h"

#ifdef DS_HAVE_CUDA
#include "test_cuda_util.h"
#endif

namespace {

using ds::scan::Fractions;

// Float64 row masses from a fixture's reference maps (transformers, tests/gen_fixtures.py): [heads, n, n].
ds::RowMass reference_mass(const std::vector<float>& a1, const std::vector<float>* a2, int64_t n, int64_t h, int64_t q,
                           double lambda, int64_t s0, int64_t s1) {
  ds::RowMass m;
  const float* r1 = a1.data() + (size_t(h) * size_t(n) + size_t(q)) * size_t(n);
  const float* r2 = a2 ? a2->data() + (size_t(h) * size_t(n) + size_t(q)) * size_t(n) : nullptr;
  for (int64_t k = 0; k <= q; ++k) {
    const double x1 = r1[k], x2 = r2 ? r2[k] : 0.0, d = x1 - lambda * x2;
    const double v[4] = {x1, x2, d, std::fabs(d)};
    double* part = k >= s0 && k < s1 ? m.answer : k == 0 ? m.sink : m.context;
    for (int i = 0; i < 4; ++i) part[i] += v[i];
  }
  return m;
}

void expect_mass_near(const ds::RowMass& got, const ds::RowMass& want, double tol, const std::string& what) {
  for (int i = 0; i < ds::MASS_NMAPS; ++i) {
    EXPECT_NEAR(got.answer[i], want.answer[i], tol) << what << " answer map " << i;
    EXPECT_NEAR(got.sink[i], want.sink[i], tol) << what << " sink map " << i;
    EXPECT_NEAR(got.context[i], want.context[i], tol) << what << " context map " << i;
  }
}

class ScanRowMassCpu : public ::testing::TestWithParam<std::string> {};

// CPU row masses equal the transformers maps' sums, for the last row and a middle one, with spans that hold key 0,
// that end at the row's own key, and that lie in between.
TEST_P(ScanRowMassCpu, MatchesTransformersMaps) {
  auto s = ds::Session::open(dstest::fixture(GetParam()), ds::BackendChoice::Cpu, nullptr, 2);
  dstest::Expected ex(dstest::fixture(GetParam()));
  s->set_ids(ex.ids());
  s->run();
  const ds::ModelConfig& c = s->config();
  const int64_t n = int64_t(ex.ids().size());
  int checked = 0;
  for (int64_t l : c.map_layers()) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const bool diff = c.is_diff();
    const std::vector<float> a1 = ex.get(p + (diff ? "attn1" : "attn"));
    const std::vector<float> a2 = diff ? ex.get(p + "attn2") : std::vector<float>{};
    const double lam = diff ? double(ex.get(p + "lambda").at(0)) : 0.0;
    for (int64_t q : {n - 1, n / 2})
      for (auto [s0, s1] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {q / 3, q / 3 + 3}, {q, q + 1}}) {
        if (s1 > q + 1 || s0 >= s1) continue;
        const std::vector<ds::RowMass> got = s->backend().row_mass(int(l), q, s0, s1);
        ASSERT_EQ(int64_t(got.size()), c.view_heads());
        for (int64_t h = 0; h < c.view_heads(); ++h) {
          const ds::RowMass want = reference_mass(a1, diff ? &a2 : nullptr, n, h, q, lam, s0, s1);
          expect_mass_near(got[size_t(h)], want, 1e-4,
                           GetParam() + " layer " + std::to_string(l) + " head " + std::to_string(h) + " row " +
                               std::to_string(q) + " span [" + std::to_string(s0) + "," + std::to_string(s1) + ")");
          ++checked;
        }
      }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ScanRowMassCpu,
                         ::testing::Values("diff_mha_d32_f32", "diff_gqa4_d32_sharded_v5", "llama_gqa_d32_f32",
                                           "phi4flash_L8_gqa_bf16"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(ScanRowMass, BadRowsAndSpansAreErrors) {
  auto s = ds::Session::open(dstest::fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, nullptr, 1);
  dstest::Expected ex(dstest::fixture("diff_mha_d32_f32"));
  s->set_ids(ex.ids());
  s->run();
  const int64_t n = int64_t(ex.ids().size());
  EXPECT_THROW(s->backend().row_mass(0, n, 0, 1), ds::Error);          // row outside
  EXPECT_THROW(s->backend().row_mass(0, 5, 3, 7), ds::Error);          // span past the row's keys
  EXPECT_THROW(s->backend().row_mass(0, 5, 3, 3), ds::Error);          // empty span
  EXPECT_THROW(s->backend().row_mass(99, n - 1, 0, 1), ds::Error);     // no such layer
  EXPECT_NO_THROW(s->backend().row_mass(0, 5, 0, 6));                  // the whole row
}

#ifdef DS_HAVE_CUDA
// The device reduction equals the same backend's rows summed on the host, and the CPU backend within bf16.
TEST(ScanRowMassCuda, MatchesRowsAndCpu) {
  SKIP_WITHOUT_DEVICE();
  for (const char* fx : {"diff_mha_d32_f32", "llama_gqa_d32_f32", "phi4flash_L8_gqa_bf16", "diff_long_gen"}) {
    auto g = ds::Session::open(dstest::fixture(fx), ds::BackendChoice::Cuda);
    auto cpu = ds::Session::open(dstest::fixture(fx), ds::BackendChoice::Cpu, nullptr, 2);
    // A long prompt (random ids) for the fixture without transformers maps; the others' own prompts.
    std::vector<int32_t> ids;
    if (std::filesystem::exists(dstest::fixture(fx) + "/expected.safetensors")) {
      ids = dstest::Expected(dstest::fixture(fx)).ids();
    } else {
      std::mt19937 rng(3);
      ids.resize(1500);
      for (auto& t : ids) t = int32_t(rng() % uint32_t(g->config().vocab));
    }
    g->set_ids(ids);
    cpu->set_ids(ids);
    g->run();
    cpu->run();
    const ds::ModelConfig& c = g->config();
    const int64_t n = int64_t(ids.size());
    for (int64_t l : c.map_layers()) {
      const float lam = float(g->effective_lambda(int(l)));
      for (int64_t q : {n - 1, n / 3}) {
        const int64_t s0 = q / 2, s1 = std::min(q + 1, q / 2 + 4);
        const std::vector<ds::RowMass> got = g->backend().row_mass(int(l), q, s0, s1);
        ds::MapRows rows;
        g->backend().map_rows(int(l), {q}, rows);
        const std::vector<ds::RowMass> ref = cpu->backend().row_mass(int(l), q, s0, s1);
        for (int64_t h = 0; h < c.view_heads(); ++h) {
          const float* r1 = rows.a1.data() + size_t(h) * size_t(n);
          const float* r2 = c.is_diff() ? rows.a2.data() + size_t(h) * size_t(n) : nullptr;
          const std::string what = std::string(fx) + " layer " + std::to_string(l) + " head " + std::to_string(h);
          expect_mass_near(got[size_t(h)], ds::row_mass_of(r1, r2, q, c.is_diff() ? lam : 0.f, s0, s1), 1e-5, what);
          expect_mass_near(got[size_t(h)], ref[size_t(h)], 3e-2, what + " vs CPU");
        }
      }
    }
    // Every layer's with one wait (a scan's prompt): the same values as layer by layer, in the order asked.
    std::vector<int> layers;
    for (int64_t l : c.map_layers()) layers.insert(layers.begin(), int(l));
    const int64_t q = n - 1, s0 = q / 2, s1 = std::min(q + 1, q / 2 + 4);
    const std::vector<std::vector<ds::RowMass>> all = g->backend().row_masses(layers, q, s0, s1);
    ASSERT_EQ(all.size(), layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::vector<ds::RowMass> one = g->backend().row_mass(layers[i], q, s0, s1);
      ASSERT_EQ(all[i].size(), one.size());
      for (size_t h = 0; h < one.size(); ++h)
        expect_mass_near(all[i][h], one[h], 0.0, std::string(fx) + " layer " + std::to_string(layers[i]) + " batched");
    }
  }
}
#endif

// ---------------------------------------------------------------------------------------------------------------
// the corpus reader

TEST(ScanCorpus, ParsesLines) {
  ds::scan::Prompt p = ds::scan::parse_line(R"({"text": "ab c", "answer": [1, 3], "target": " x", "depth": 0.5})", 4);
  EXPECT_TRUE(p.is_text);
  EXPECT_EQ(p.line, 4);
  EXPECT_EQ(p.answer_begin, 1);
  EXPECT_EQ(p.answer_end, 3);
  EXPECT_TRUE(p.has_target && p.target_is_text);
  EXPECT_EQ(p.tags["depth"], 0.5);
  EXPECT_FALSE(p.tags.contains("text"));
  p = ds::scan::parse_line(R"({"ids": [5, 6, 7], "answer": [0, 1], "target": [3, 4]})", 1);
  EXPECT_FALSE(p.is_text);
  EXPECT_EQ(p.ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(p.target_ids, (std::vector<int32_t>{3, 4}));
}

TEST(ScanCorpus, BadLinesSayWhy) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"answer": [0, 1]})", "neither"},
      {R"({"text": "a", "ids": [1], "answer": [0, 1]})", "both"},
      {R"({"text": 3, "answer": [0, 1]})", "not a string"},
      {R"({"text": "", "answer": [0, 1]})", "empty"},
      {R"({"text": "abc"})", "no \"answer\""},
      {R"({"text": "abc", "answer": [2, 1]})", "is empty"},
      {R"({"text": "abc", "answer": [0.5, 1]})", "not an integer"},
      {R"({"text": "abc", "answer": [-1, 1]})", "outside"},
      {R"({"text": "abc", "answer": [0]})", "pair"},
      {R"({"ids": [1, -2], "answer": [0, 1]})", "outside"},
      {R"({"ids": [1, "x"], "answer": [0, 1]})", "not an integer"},
      {R"({"ids": [1], "answer": [0, 1], "target": ""})", "empty"},
      {R"({"ids": [1], "answer": [0, 1], "target": 7})", "not a list"},
  };
  for (const auto& [line, why] : bad) {
    try {
      ds::scan::parse_line(line, 1);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << line << " -> " << e.what();
    }
  }
}

TEST(ScanCorpus, FileKeepsGoodLinesAndNumbersBadOnes) {
  const std::string path = ::testing::TempDir() + "/scan_corpus.jsonl";
  {
    std::ofstream f(path);
    f << R"({"ids": [1, 2, 3], "answer": [0, 1]})" << "\n\n"
      << "garbage\n"
      << R"({"ids": [4], "answer": [0, 1]})" << "\r\n";
  }
  const ds::scan::Corpus c = ds::scan::read_corpus(path);
  ASSERT_EQ(c.prompts.size(), 2u);
  EXPECT_EQ(c.prompts[0].line, 1);
  EXPECT_EQ(c.prompts[1].line, 4);
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_EQ(c.errors[0].line, 3);
  try {
    ds::scan::read_corpus(path + ".missing");
    ADD_FAILURE();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ".missing: cannot open"), std::string::npos) << e.what();
  }
  { std::ofstream f(path); f << "\n  \n"; }
  EXPECT_THROW(ds::scan::read_corpus(path), ds::Error);
}

// ---------------------------------------------------------------------------------------------------------------
// runs

std::string demo(const char* name) { return dstest::source_dir() + "/assets/models/" + name; }

// What a layer split of a scan plans for: the corpus's longest prompt in tokens (ids as given, text through the model's
// tokenizer, +2 for the specials it may add) plus the answer tokens; without a tokenizer a byte counts a token.
TEST(ScanCorpus, PlanTokensAreTheLongestPromptAndTheAnswer) {
  const std::string path = ::testing::TempDir() + "/scan_plan.jsonl";
  const std::string text = "The secret word of the red door is walrus, and of the blue door it is heron.";
  {
    std::ofstream f(path);
    f << R"({"ids": [1, 2, 3, 4, 5, 6, 7], "answer": [0, 1]})" << "\n"
      << R"({"text": ")" << text << R"(", "answer": [0, 3]})" << "\n"
      << R"({"text": "short", "answer": [0, 1]})" << "\n";
  }
  const ds::scan::Corpus c = ds::scan::read_corpus(path);
  const std::unique_ptr<ds::Tokenizer> tok = ds::find_tokenizer(demo("diffllama-demo"));
  ASSERT_TRUE(tok);
  const int64_t n = std::max<int64_t>(7, int64_t(tok->encode(text).size()) + 2);
  EXPECT_EQ(ds::scan::corpus_plan_tokens(c, demo("diffllama-demo"), 32), n + 32);
  EXPECT_EQ(ds::scan::corpus_plan_tokens(c, ::testing::TempDir() + "/no_model_here", 0), int64_t(text.size()) + 2);
  ds::scan::Corpus ids_only;
  ids_only.prompts.push_back(c.prompts[0]);
  EXPECT_EQ(ds::scan::corpus_plan_tokens(ids_only, demo("diffllama-demo"), 5), 12);
}

// A text prompt's character span maps to the tokens that carry it (a non-ASCII prefix shifts bytes from
// characters); fractions are distributions; a target equal to the model's own greedy continuation is correct and
// another is not.
TEST(ScanRun, TextSpanFractionsAndAccuracy) {
  auto s = ds::Session::open(demo("diffllama-demo"), ds::BackendChoice::Cpu, nullptr, 2);
  ASSERT_NE(s->tokenizer(), nullptr);
  const std::string text = "Caf\xC3\xA9 \xE2\x80\x94 the secret word of the red door is walrus. The sky is blue. "
                           "Question: what is the secret word of the red door? Answer:";
  const std::string word = "walrus";
  const size_t byte_at = text.find(word);
  // Characters before the word: bytes minus the continuation bytes (two in this prefix: é is 2 bytes, — is 3).
  int64_t chars = 0;
  for (size_t i = 0; i < byte_at; ++i) chars += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  ASSERT_EQ(int64_t(byte_at) - chars, 3);
  // The model's own greedy continuation, as the target.
  s->set_prompt(text);
  s->run();
  ds::GenerateOptions g;
  g.max_new = 3;
  const std::string own = s->tokenizer()->decode(s->generate(g));
  ASSERT_FALSE(own.empty());

  ds::scan::Run run(*s, {});
  EXPECT_EQ(run.options().label, "diffllama-demo");
  ds::scan::Prompt p;
  p.line = 7;
  p.is_text = true;
  p.text = text;
  p.answer_begin = chars;
  p.answer_end = chars + int64_t(word.size());
  p.has_target = p.target_is_text = true;
  p.target_text = own;
  const ds::scan::PromptResult& r = run.scan(p);
  // The span's tokens decode to text holding the word, and the token before does not.
  std::vector<int32_t> ids = s->tokenizer()->encode(text);
  ASSERT_EQ(r.tokens, int64_t(ids.size()));
  const std::string span_text = s->tokenizer()->decode(std::vector<int32_t>(ids.begin() + r.answer_begin,
                                                                            ids.begin() + r.answer_end));
  EXPECT_NE(span_text.find(word), std::string::npos) << span_text;
  EXPECT_LE(span_text.size(), word.size() + 2) << span_text;
  EXPECT_TRUE(r.correct) << r.output << " vs " << own;
  ASSERT_EQ(r.heads.size(), run.layers().size());
  for (const auto& layer : r.heads)
    for (const Fractions& f : layer) {
      EXPECT_NEAR(f.answer1 + f.sink1 + f.context1, 1.0, 1e-9);
      EXPECT_NEAR(f.answer2 + f.sink2 + f.context2, 1.0, 1e-9);
      EXPECT_NEAR(f.answer_diff + f.sink_diff + f.context_diff, 1.0, 1e-9);
      EXPECT_NEAR(f.answer_diff_abs + f.sink_diff_abs + f.context_diff_abs, 1.0, 1e-9);
      EXPECT_GE(f.answer_diff_abs, 0.0);
    }
  // A wrong target, and a span outside the text.
  p.target_text = own + " and more";
  EXPECT_FALSE(run.scan(p).correct);
  p.answer_end = 10000;
  EXPECT_THROW(run.scan(p), ds::Error);
  EXPECT_EQ(run.results().size(), 2u);
}

// Interruption adds nothing; a prompt too long for the model is an error that adds nothing; ids prompts with id
// targets compare ids.
TEST(ScanRun, CancelTooLongAndIdTargets) {
  auto s = ds::Session::open(dstest::fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, nullptr, 1);
  dstest::Expected ex(dstest::fixture("diff_mha_d32_f32"));
  ds::scan::Run run(*s, {"fixture", 1.0, 4});
  ds::scan::Prompt p;
  p.ids = ex.ids();
  p.answer_begin = 1;
  p.answer_end = 3;
  EXPECT_THROW(run.scan(p, [] { return true; }), ds::Cancelled);
  EXPECT_TRUE(run.results().empty());
  // Ids target: the greedy tokens themselves.
  s->set_ids(p.ids);
  s->run();
  ds::GenerateOptions g;
  g.max_new = 2;
  g.stop_at_eos = false;
  const std::vector<int32_t> own = s->generate(g);
  ASSERT_EQ(own.size(), 2u);
  p.has_target = true;
  p.target_ids = own;
  EXPECT_TRUE(run.scan(p).correct);
  p.target_ids = {own[0], (own[1] + 1) % int32_t(s->config().vocab)};
  EXPECT_FALSE(run.scan(p).correct);
  p.ids.assign(size_t(s->config().max_positions) + 1, 1);
  EXPECT_THROW(run.scan(p), ds::Error);
  EXPECT_EQ(run.results().size(), 2u);
}

// The report: the first run's keys at the top, the second's under "compare", a plain model without the "2" and
// "diff" keys, groups in order, written atomically, and the CSV's rows.
TEST(ScanReport, ShapeGroupsCompareAndFiles) {
  auto d = ds::Session::open(dstest::fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, nullptr, 1);
  auto l = ds::Session::open(dstest::fixture("llama_gqa_d32_f32"), ds::BackendChoice::Cpu, nullptr, 1);
  dstest::Expected ex(dstest::fixture("diff_mha_d32_f32"));
  ds::scan::Run rd(*d, {"diff", 1.0, 4}), rl(*l, {"plain", 1.0, 4});
  const std::vector<int32_t> ids = ex.ids();
  for (int i = 0; i < 4; ++i) {
    ds::scan::Prompt p;
    p.line = i + 1;
    p.ids.assign(ids.begin(), ids.begin() + 10 + i);
    p.answer_begin = 2;
    p.answer_end = 4 + i;
    p.tags = {{"depth", i % 2 ? 0.75 : 0.25}, {"length", 10 + i}};
    rd.scan(p);
    rl.scan(p);
  }
  const ds::scan::Report rep = ds::scan::make_report({&rd, &rl}, "in.jsonl", {{9, "not valid JSON"}}, true, 1.5);
  // The typed report and its JSON (the file boundary) say the same.
  EXPECT_EQ(rep.run.prompts, 4);
  ASSERT_TRUE(rep.compare.has_value());
  EXPECT_FALSE(rep.compare->differential);
  EXPECT_EQ(rep.run.per_prompt.size(), 4u);
  EXPECT_TRUE(rep.run.per_prompt[0].heads.empty()) << "the report leaves the per-head fractions out";
  const nlohmann::json r = ds::scan::report_json(rep);
  EXPECT_EQ(r["tool"], "diffscope-scan");
  EXPECT_EQ(r["prompts"], 4);
  EXPECT_EQ(r["label"], "diff");
  EXPECT_TRUE(r["accuracy"].is_null());
  EXPECT_EQ(r["skipped"][0]["line"], 9);
  ASSERT_EQ(r["layers"].size(), size_t(d->config().layers));
  const nlohmann::json& h0 = r["layers"][0]["heads"][0];
  for (const char* k : ds::scan::kFractionKeys) EXPECT_TRUE(h0.contains(k)) << k;
  // The layer mean is the mean over prompts of the per-prompt values.
  double sum = 0;
  for (const auto& pr : rd.results()) sum += pr.heads[0][0].answer_diff;
  EXPECT_NEAR(h0["answer_diff"].get<double>(), sum / 4, 1e-12);
  const nlohmann::json& cmp = r["compare"];
  EXPECT_EQ(cmp["label"], "plain");
  EXPECT_FALSE(cmp["differential"].get<bool>());
  EXPECT_TRUE(cmp["mean"].contains("answer1"));
  EXPECT_FALSE(cmp["mean"].contains("answer2"));
  EXPECT_FALSE(cmp["mean"].contains("answer_diff"));
  ASSERT_EQ(r["groups"]["depth"].size(), 2u);
  EXPECT_EQ(r["groups"]["depth"][0]["value"], 0.25);
  EXPECT_EQ(r["groups"]["depth"][0]["prompts"], 2);
  EXPECT_EQ(r["groups"]["length"].size(), 4u);
  EXPECT_EQ(r["per_prompt"][3]["answer"], nlohmann::json({2, 7}));

  const std::string dir = ::testing::TempDir();
  ds::scan::write_json_atomic(rep, dir + "/scan_report.json");
  EXPECT_FALSE(std::filesystem::exists(dir + "/scan_report.json.partial"));
  std::ifstream in(dir + "/scan_report.json");
  EXPECT_EQ(nlohmann::json::parse(in), r);
  ds::scan::write_csv(rep, dir + "/scan_report.csv");
  std::ifstream csv(dir + "/scan_report.csv");
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 1 + int(d->config().layers * d->config().view_heads() + l->config().layers * l->config().view_heads()));
  EXPECT_THROW(ds::scan::write_json_atomic(rep, dir + "/no/such/dir/r.json"), ds::Error);
}

}  // namespace

// The means of a scan are sums of fractions over prompts; a sharded or multi-GPU scan adds them in another order.
// ExactSum's value is the exact sum rounded once: the same bits in every order, and equal to a quad-precision sum
// (exact here: terms of one binade, 2000 of them, need 64 bits) rounded to double. Its partials carried to another
// sum (a shard's totals merged) give the same value too.
TEST(ScanExactSum, EveryOrderGivesTheCorrectlyRoundedSum) {
  std::mt19937_64 rng(20261128);
  std::uniform_real_distribution<double> mag(0.5, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> v(2000);
    for (double& x : v) x = (rng() & 1 ? 1.0 : -1.0) * mag(rng) * (trial % 2 ? 1e-3 : 1.0);
    __float128 exact = 0;
    for (double x : v) exact += __float128(x);
    const double want = double(exact);
    for (int order = 0; order < 4; ++order) {
      std::shuffle(v.begin(), v.end(), rng);
      ds::scan::ExactSum s, a, b;
      for (size_t i = 0; i < v.size(); ++i) {
        s.add(v[i]);
        (i % 3 ? a : b).add(v[i]);
      }
      EXPECT_EQ(s.value(), want) << "trial " << trial << " order " << order;
      a.add(b);
      EXPECT_EQ(a.value(), want) << "merged partials, trial " << trial;
    }
    double naive = 0;  // what a plain loop gives: it may differ (and does for some trials), which is the point
    for (double x : v) naive += x;
    EXPECT_NEAR(naive, want, 1e-9);
  }
  ds::scan::ExactSum e;
  EXPECT_EQ(e.value(), 0.0);
  e.add(1e16), e.add(1.0), e.add(-1e16);
  EXPECT_EQ(e.value(), 1.0);  // a plain sum loses the 1
}

// The replicas' prompt order (session_scan_queue.h): input order, except that a prompt whose length bucket another
// replica is starting is passed over (within the look-ahead) for one whose bucket is timed or not yet started; every
// prompt is taken exactly once.
TEST(ScanQueue, PassesOverBucketsBeingStartedAndTakesEveryPromptOnce) {
  const std::vector<int64_t> g = {7, 7, 9, 9, 7, 11, -1, 9};
  int asked = 0;
  ds::scan::PromptQueue q(g.size(), [&](size_t i) { return ++asked, g[i]; });
  EXPECT_EQ(q.take(), 0u);  // bucket 7 starts
  EXPECT_EQ(q.take(), 2u);  // 1 is in bucket 7, being started elsewhere: 9 starts instead
  EXPECT_EQ(q.take(), 5u);  // 1, 3, 4 wait on buckets 7 and 9; 11 is new
  EXPECT_EQ(q.take(), 6u);  // no bucket: never passed over
  q.done(2);                // bucket 9 is timed
  EXPECT_EQ(q.take(), 3u);
  EXPECT_EQ(q.take(), 7u);  // ahead of 1 and 4, whose bucket 7 is still being started
  // Every bucket left is being started: the first prompt left, as plain input order would give
  EXPECT_EQ(q.take(), 1u);
  q.done(0);
  EXPECT_EQ(q.take(), 4u);
  EXPECT_EQ(q.take(), std::nullopt);
  EXPECT_EQ(q.taken(), g.size());
  EXPECT_EQ(asked, int(g.size()));  // each prompt's bucket asked once

  // One replica (each prompt done before the next is taken): exactly input order.
  ds::scan::PromptQueue one(g.size(), [&](size_t i) { return g[i]; });
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(one.take(), i);
    one.done(i);
  }
  EXPECT_EQ(one.take(), std::nullopt);

  // The look-ahead bounds the search: with it at 2, prompt 3 (bucket 8) is out of reach and 1 is taken.
  const std::vector<int64_t> h = {5, 5, 5, 8};
  ds::scan::PromptQueue near(h.size(), [&](size_t i) { return h[i]; }, 2);
  EXPECT_EQ(near.take(), 0u);
  EXPECT_EQ(near.take(), 1u);
  EXPECT_EQ(near.take(), 3u);  // 2 (bucket 5 still starting) is passed over now that 3 is within reach
  EXPECT_EQ(near.take(), 2u);
}
