// The shipped demo models through the engine (CPU): both load, answer held-out retrieval prompts, short and long
// (1K-2K tokens), and the evaluation's headline holds on a few prompts -- the differential model's last-token
// attention goes to the answer span, the Transformer twin's to the rest of the context. Same definitions as tools/eval_demo.py:
// regions of the query row are answer (tokens overlapping the answer's span in the context), question (from
// question_start on), BOS, and noise (the rest); each row is divided by its sum ("sum1": the difference row sums
// to 1 - lambda, the softmax row to 1; layers with |1 - lambda| < 0.05 are skipped); averaged over heads and
// layers, then prompts.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/session/session.h"
#include "test_util.h"

namespace {

struct Scores {
  double answer = 0, noise = 0, accuracy = 0;
  int best_layer = 0, best_head = 0;
  double best_answer = -1;
};

Scores evaluate(const std::string& model, const std::vector<nlohmann::json>& prompts) {
  auto s = ds::Session::open(model, ds::BackendChoice::Cpu, nullptr, 2);
  const ds::ModelConfig& c = s->config();
  EXPECT_NE(s->tokenizer(), nullptr) << model << ": " << s->tokenizer_error();
  Scores sc;
  std::vector<double> head_answer(size_t(c.layers * c.view_heads()), 0.0);
  for (const auto& p : prompts) {
    const std::string prompt = p["prompt"], answer = p["answer"];
    const size_t a0 = p["span"][0], a1 = p["span"][1], q0 = p["question_start"];
    s->set_prompt(prompt);
    s->run();
    const auto& toks = s->tokens();
    const int64_t n = int64_t(toks.size());
    // Accuracy: the greedy next token is the answer's first token (as the tokenizer splits prompt + answer).
    const std::vector<int32_t> full = s->tokenizer()->encode(prompt + answer, true);
    EXPECT_GT(int64_t(full.size()), n);
    sc.accuracy += (s->top_k(1)[0].id == full[size_t(n)]) ? 1.0 : 0.0;
    double ans = 0, noise = 0;
    int rows = 0;
    for (int l = 0; l < c.layers; ++l) {
      const double lam = s->effective_lambda(l);
      if (c.is_diff() && std::fabs(1 - lam) < 0.05) continue;
      const ds::LayerMaps& m = s->maps(l);
      for (int64_t h = 0; h < m.heads; ++h) {
        const float* r1 = m.a1.data() + (h * n + (n - 1)) * n;
        const float* r2 = c.is_diff() ? m.a2.data() + (h * n + (n - 1)) * n : nullptr;
        double total = 0, a = 0, z = 0;
        for (int64_t k = 0; k < n; ++k) {
          const double v = r1[k] - (r2 ? lam * r2[k] : 0.0);
          total += v;
          const auto& t = toks[size_t(k)];
          if (t.begin == t.end) continue;  // BOS
          if (t.begin >= q0) continue;     // the question / query segment
          if (t.begin < a1 && t.end > a0) a += v;
          else z += v;
        }
        ans += a / total;
        noise += z / total;
        head_answer[size_t(l * m.heads + h)] += a / total;
        ++rows;
      }
    }
    sc.answer += ans / rows;
    sc.noise += noise / rows;
  }
  sc.answer /= double(prompts.size());
  sc.noise /= double(prompts.size());
  sc.accuracy /= double(prompts.size());
  for (size_t i = 0; i < head_answer.size(); ++i)
    if (head_answer[i] / double(prompts.size()) > sc.best_answer) {
      sc.best_answer = head_answer[i] / double(prompts.size());
      sc.best_layer = int(i / size_t(c.view_heads()));
      sc.best_head = int(i % size_t(c.view_heads()));
    }
  return sc;
}

// tests/demo_eval_prompts.jsonl is test_prompts.jsonl of the training run (tools/train_demo.py): 12 held-out short
// prompts (kind "kv" / "needle") and a few long multi-needle ones of tools/make_needle_set.py (kind "long").
std::vector<nlohmann::json> load_prompts(bool long_ones) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dstest::source_dir() + "/tests/demo_eval_prompts.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) {
      nlohmann::json j = nlohmann::json::parse(line);
      if ((j.value("kind", "") == "long") == long_ones) out.push_back(std::move(j));
    }
  return out;
}

TEST(DemoModels, DifferentialAttentionFindsTheAnswerTheTwinDoesNot) {
  const std::string base = dstest::source_dir() + "/assets/models/";
  const std::vector<nlohmann::json> prompts = load_prompts(false);
  ASSERT_GE(prompts.size(), 8u);

  const Scores diff = evaluate(base + "diffllama-demo", prompts);
  const Scores twin = evaluate(base + "llama-demo", prompts);
  std::printf("diffllama-demo: accuracy %.3f  attention to answer %.3f  to noise %.3f  (best head %d.%d: %.3f)\n",
              diff.accuracy, diff.answer, diff.noise, diff.best_layer, diff.best_head, diff.best_answer);
  std::printf("llama-demo:     accuracy %.3f  attention to answer %.3f  to noise %.3f\n", twin.accuracy, twin.answer,
              twin.noise);
  // Both models learned the tasks (the full evaluation: 0.965 / 0.897 on 400 prompts).
  EXPECT_GE(diff.accuracy, 0.75);
  EXPECT_GE(twin.accuracy, 0.75);
  // The headline: more attention to the answer, far less to the noise (full evaluation: 0.146 vs 0.046 and -0.039
  // vs 0.682). Margins are loose for 12 prompts but would fail if maps, lambda or spans were wrong.
  EXPECT_GT(diff.answer, 2.0 * twin.answer);
  EXPECT_LT(diff.noise, 0.3 * twin.noise);
}

// The same at length: multi-needle prompts of 1K and 2K tokens (distractors and other needles in the haystack), as
// the GUI's default prompt. Full evaluation (tools/eval_demo.py, 180 prompts of 1K-4K tokens): accuracy 0.661 / 0.633
// (0.85 / 0.85 at 1K, 0.68 / 0.65 at 2K, 0.45 / 0.40 at 4K), attention to the answer 0.122 vs 0.032, to the noise
// -0.005 vs 0.725: the twin's attention spreads over the haystack, the differential map cancels it.
TEST(DemoModels, LongContextNoiseCancellation) {
  const std::string base = dstest::source_dir() + "/assets/models/";
  const std::vector<nlohmann::json> prompts = load_prompts(true);
  ASSERT_GE(prompts.size(), 2u);
  for (const auto& p : prompts) ASSERT_GE(int(p["length"]), 1024);

  const Scores diff = evaluate(base + "diffllama-demo", prompts);
  const Scores twin = evaluate(base + "llama-demo", prompts);
  std::printf("long, diffllama-demo: accuracy %.3f  attention to answer %.3f  to noise %.3f  (best head %d.%d: %.3f)\n",
              diff.accuracy, diff.answer, diff.noise, diff.best_layer, diff.best_head, diff.best_answer);
  std::printf("long, llama-demo:     accuracy %.3f  attention to answer %.3f  to noise %.3f\n", twin.accuracy,
              twin.answer, twin.noise);
  EXPECT_GE(diff.accuracy, 0.75);
  EXPECT_GE(twin.accuracy, 0.75);
  EXPECT_GT(diff.answer, 2.0 * twin.answer);
  EXPECT_LT(diff.noise, 0.3 * twin.noise);
}

}  // namespace
