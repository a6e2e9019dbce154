// The CPU backend against fixtures written by transformers' own DiffLlama / Llama (tests/gen_fixtures.py) and by the
// independent float64 references of Motif (tools/motif_reference.py, tests/gen_motif_fixtures.py) and Phi-4-mini-
// flash (tools/phi4flash_reference.py, tests/gen_phi4flash_fixtures.py): logits, every layer's input, every map,
// lambda, and a run with lambda overridden -- all within 1e-4 relative. Layers without attention (SambaY's Mamba
// and GMU layers) have no maps in the fixtures and none from the engine.
#include <gtest/gtest.h>

#include "engine/core/config.h"
#include "engine/core/rope.h"
#include "engine/session/session.h"
#include "test_util.h"

namespace {

// Fixtures are f32 computations of the same function; 1e-4 relative (||a-b||/||b||) is the bound.
constexpr double kTol = 1e-4;

using dstest::Expected;

class FixtureCpu : public ::testing::TestWithParam<std::string> {};
class DiffFixtureCpu : public ::testing::TestWithParam<std::string> {};
class RopeFixture : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> diff_fixtures() {
  std::vector<std::string> v;
  for (const auto& f : dstest::all_fixtures())  // every differential family's fixtures (DiffLlama, Motif)
    if (ds::load_config(dstest::fixture(f) + "/config.json").is_diff()) v.push_back(f);
  return v;
}

// The fixtures of families with rotary embeddings (SambaY's attention has none, and its fixtures no inv_freq).
std::vector<std::string> rope_fixtures() {
  std::vector<std::string> v;
  for (const auto& f : dstest::all_fixtures())
    if (ds::load_config(dstest::fixture(f) + "/config.json").spec().rotary) v.push_back(f);
  return v;
}

TEST_P(FixtureCpu, MatchesTransformers) {
  const std::string dir = dstest::fixture(GetParam());
  Expected ex(dir);
  auto s = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  const ds::ModelConfig& c = s->config();
  s->set_ids(ex.ids());
  const int L = int(c.layers);

  // Backend directly: all logits, all maps, hidden states.
  ds::ForwardRequest req;
  req.ids = s->ids();
  for (int l = 0; l < L; ++l) req.lambda.push_back(float(s->effective_lambda(l)));
  req.all_logits = true;
  req.keep_hidden = true;
  for (int l = 0; l < L; ++l) req.want_maps.push_back(c.has_maps(l));
  ds::ForwardResult r;
  s->backend().forward(req, r);

  const std::vector<float> logits = ex.get("logits");
  ASSERT_EQ(r.logits.size(), logits.size());
  EXPECT_LT(dstest::rel_err(r.logits.data(), logits.data(), logits.size()), kTol) << "logits";
  ASSERT_EQ(r.hidden.size(), size_t(L + 1));
  for (int l = 0; l <= L; ++l) {
    const std::vector<float> h = ex.get("hidden." + std::to_string(l));
    ASSERT_EQ(r.hidden[size_t(l)].size(), h.size()) << "hidden." << l;
    EXPECT_LT(dstest::rel_err(r.hidden[size_t(l)].data(), h.data(), h.size()), kTol) << "hidden." << l;
  }
  for (int l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const ds::LayerMaps& m = r.maps[size_t(l)];
    if (!c.has_maps(l)) {
      EXPECT_TRUE(m.empty()) << p;
      EXPECT_FALSE(ex.has(p + "attn1")) << p;
      EXPECT_THROW(s->maps(l), ds::Error) << p;
      continue;
    }
    if (c.is_diff()) {
      const std::vector<float> a1 = ex.get(p + "attn1"), a2 = ex.get(p + "attn2");
      ASSERT_EQ(m.a1.size(), a1.size());
      ASSERT_EQ(m.a2.size(), a2.size());
      EXPECT_LT(dstest::rel_err(m.a1.data(), a1.data(), a1.size()), kTol) << p << "attn1";
      EXPECT_LT(dstest::rel_err(m.a2.data(), a2.data(), a2.size()), kTol) << p << "attn2";
      const float lam = ex.get(p + "lambda")[0];
      EXPECT_NEAR(s->model_lambda(l), lam, 1e-5 * std::max(1.f, std::fabs(lam))) << p << "lambda";
    } else {
      const std::vector<float> a = ex.get(p + "attn");
      ASSERT_EQ(m.a1.size(), a.size());
      EXPECT_LT(dstest::rel_err(m.a1.data(), a.data(), a.size()), kTol) << p << "attn";
    }
  }
  // On-demand maps through the session agree with the forward's maps.
  s->run();
  for (int l : c.map_layers()) {
    const ds::LayerMaps& m = s->maps(l);
    EXPECT_LT(dstest::rel_err(m.a1.data(), r.maps[size_t(l)].a1.data(), m.a1.size()), 1e-6) << "on-demand maps " << l;
  }
  // Last-position logits of Session::run equal the last row of the full logits.
  const int64_t V = c.vocab, n = int64_t(s->ids().size());
  EXPECT_LT(dstest::rel_err(s->result().logits.data(), logits.data() + (n - 1) * V, size_t(V)), kTol);
}

TEST_P(DiffFixtureCpu, LambdaOverrideMatchesTransformers) {
  const std::string dir = dstest::fixture(GetParam());
  Expected ex(dir);
  ASSERT_TRUE(ex.has("override.lambda"));
  auto s = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  s->set_ids(ex.ids());
  s->run();  // at the model's lambda first, so that the override run is a re-run
  const std::vector<float> ov = ex.get("override.lambda");  // one value per layer with maps, in order
  const std::vector<int64_t> layers = s->config().map_layers();
  ASSERT_EQ(ov.size(), layers.size());
  for (size_t i = 0; i < ov.size(); ++i) s->set_lambda_override(int(layers[i]), ov[i]);
  s->run(true);
  const std::vector<float> logits = ex.get("override.logits");
  ASSERT_EQ(s->result().logits.size(), logits.size());
  EXPECT_LT(dstest::rel_err(s->result().logits.data(), logits.data(), logits.size()), kTol);
  for (int64_t l : layers) {
    const std::string p = "override.layers." + std::to_string(l) + ".";
    const ds::LayerMaps& m = s->maps(int(l));
    const std::vector<float> a1 = ex.get(p + "attn1"), a2 = ex.get(p + "attn2");
    EXPECT_LT(dstest::rel_err(m.a1.data(), a1.data(), a1.size()), kTol) << p;
    EXPECT_LT(dstest::rel_err(m.a2.data(), a2.data(), a2.size()), kTol) << p;
  }
}

TEST_P(RopeFixture, RopeFrequenciesMatchTransformers) {
  const std::string dir = dstest::fixture(GetParam());
  Expected ex(dir);
  const std::vector<float> want = ex.get("rope.inv_freq");
  const std::vector<float> got = ds::rope_inv_freq(ds::load_config(dir + "/config.json"));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-7 * want[i]) << "inv_freq[" << i << "]";
}

INSTANTIATE_TEST_SUITE_P(All, FixtureCpu, ::testing::ValuesIn(dstest::all_fixtures()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(All, RopeFixture, ::testing::ValuesIn(rope_fixtures()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Diff, DiffFixtureCpu, ::testing::ValuesIn(diff_fixtures()),
                         [](const auto& info) { return info.param; });

// A lambda change re-runs only from the changed layer, and gives exactly what a fresh full run gives.
TEST(LambdaRerun, FromChangedLayerEqualsFullRun) {
  const std::string dir = dstest::fixture("diff_mha_d32_f32");
  Expected ex(dir);
  auto a = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  a->set_ids(ex.ids());
  EXPECT_EQ(a->run(), 0);
  const int L = int(a->config().layers);
  a->set_lambda_override(L - 1, 2.5);
  EXPECT_EQ(a->run(), L - 1) << "only the last layer should re-run";
  EXPECT_EQ(a->run(), L) << "nothing changed: nothing should run";
  a->set_lambda_scale(0.5);  // affects layers without override: 0..L-2
  EXPECT_EQ(a->run(), 0);

  auto b = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  b->set_ids(ex.ids());
  b->set_lambda_scale(0.5);
  b->set_lambda_override(L - 1, 2.5);
  b->run();
  const auto& la = a->result().logits;
  const auto& lb = b->result().logits;
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_LT(dstest::max_abs_err(la.data(), lb.data(), la.size()), 1e-6);

  // And the change is visible: lambda matters for the next-token distribution.
  auto c = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  c->set_ids(ex.ids());
  c->run();
  EXPECT_GT(dstest::max_abs_err(la.data(), c->result().logits.data(), la.size()), 1e-3);
}

TEST(Session, RejectsBadPrompts) {
  const std::string dir = dstest::fixture("diff_n1");
  auto s = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 1);
  EXPECT_THROW(s->set_ids({}), ds::Error);
  EXPECT_THROW(s->set_ids({1, 99999}), ds::Error);
  EXPECT_THROW(s->set_ids({-1}), ds::Error);
  std::vector<int32_t> too_long(size_t(s->config().max_positions + 1), 5);
  try {
    s->set_ids(too_long);
    FAIL() << "a prompt longer than max_position_embeddings was accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s->set_lambda_override(99, 0.5), ds::Error);
  EXPECT_THROW(s->run(), ds::Error) << "no prompt yet";
}

}  // namespace
