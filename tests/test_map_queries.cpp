// Map queries on the CPU backend (engine/core/map_query.h): pooled views, rows and statistics against float64
// references built from the full maps, on the transformers fixtures (differential MHA and GQA, Llama, a one-token
// prompt) and with lambda overrides; and the CLI's flags write them.
#include <gtest/gtest.h>

#include <atomic>

#include "engine/session/session.h"
#include "map_reference.h"
#include "test_util.h"

namespace {

// The CPU computes the queries' rows with the same f32 arithmetic as its full maps: 1e-5 absolute.
constexpr double kCpuTol = 1e-5;

class MapQueriesCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(MapQueriesCpu, MatchFloat64ReferenceFromFullMaps) {
  auto s = ds::Session::open(dstest::fixture(GetParam()), ds::BackendChoice::Cpu, nullptr, 2);
  dstest::Expected ex(dstest::fixture(GetParam()));
  s->set_ids(ex.ids());
  const ds::ModelConfig& c = s->config();
  for (int pass = 0; pass < (c.is_diff() ? 2 : 1); ++pass) {
    if (pass == 1) s->set_lambda_override(int(c.layers) - 1, -0.7);  // a negative lambda: D is the sum
    s->run();
    std::vector<float> lam;
    for (int l = 0; l < c.layers; ++l) lam.push_back(float(s->effective_lambda(l)));
    dstest::expect_queries_match_maps(s->backend(), c, lam, kCpuTol, GetParam() + (pass ? " (override)" : ""));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MapQueriesCpu,
                         ::testing::Values("diff_mha_d32_f32", "diff_gqa4_d32_sharded_v5", "llama_gqa_d32_f32",
                                           "diff_n1", "phi4flash_L8_gqa_bf16"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(MapQueriesCpu, NoRunNoMaps) {
  auto s = ds::Session::open(dstest::fixture("diff_n1"), ds::BackendChoice::Cpu, nullptr, 1);
  ds::MapView v;
  EXPECT_THROW(s->backend().map_view({}, v), ds::Error);
  EXPECT_THROW(s->backend().head_stats(0), ds::Error);
}

// A layer's maps do not depend on its own lambda: a view under a new lambda and the sweep's entropies, asked before
// the run, equal what the run with that lambda gives (the GUI shows them before its run ends).
TEST(MapQueriesCpu, ALayersOwnLambdaNeedsNoRun) {
  auto s = ds::Session::open(dstest::fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, nullptr, 2);
  dstest::Expected ex(dstest::fixture("diff_mha_d32_f32"));
  s->set_ids(ex.ids());
  s->run();
  const int layer = int(s->config().layers) - 1, head = 1;
  const std::vector<float> lams{1.3f, -0.2f};
  ds::ViewRequest vr;
  vr.layer = layer;
  vr.head = head;
  vr.rows = vr.cols = 8;
  vr.pool = ds::Pool::Max;
  vr.lambda = lams[0];
  ds::MapView before, after;
  s->set_lambda_override(layer, double(lams[0]));
  ASSERT_EQ(s->stale_from(), layer);
  s->backend().map_view(vr, before);
  EXPECT_FLOAT_EQ(before.lambda, lams[0]);
  const std::vector<double> ent = s->backend().entropy_sweep(layer, head, lams);
  ASSERT_EQ(ent.size(), 2u);
  for (size_t i = 0; i < lams.size(); ++i) {
    s->set_lambda_override(layer, double(lams[i]));
    EXPECT_EQ(s->run(), layer);
    EXPECT_NEAR(ent[i], s->backend().head_stats(layer).at(size_t(head)).entropy_diff, 1e-6) << lams[i];
    if (i == 0) {
      vr.lambda.reset();
      s->backend().map_view(vr, after);
      ASSERT_EQ(before.diff.size(), after.diff.size());
      for (size_t k = 0; k < after.diff.size(); ++k) {
        EXPECT_NEAR(before.a1[k], after.a1[k], 1e-7);
        EXPECT_NEAR(before.diff[k], after.diff[k], 1e-6);
      }
    }
  }
}

// A lambda change's re-run stopped anywhere (between layers, between attention work items, between blocks) leaves
// the session able to go on: the next run starts from the first layer that did not finish and ends where an
// uninterrupted run does. A new prompt's run is never stopped halfway.
TEST(MapQueriesCpu, ACancelledRerunGoesOnFromItsLayer) {
  const std::string fx = "diff_mha_d32_f32";
  dstest::Expected ex(dstest::fixture(fx));
  auto ref = ds::Session::open(dstest::fixture(fx), ds::BackendChoice::Cpu, nullptr, 2);
  ref->set_ids(ex.ids());
  ref->set_lambda_override(0, 0.9);
  ref->set_lambda_override(2, -0.4);
  ref->run();
  const std::vector<float> want = ref->result().logits;
  const int L = int(ref->config().layers);
  int stops = 0;
  for (int after = 0; after < 24; ++after) {
    auto s = ds::Session::open(dstest::fixture(fx), ds::BackendChoice::Cpu, nullptr, 2);
    s->set_ids(ex.ids());
    EXPECT_EQ(s->run(false, [] { return true; }), 0) << "a new prompt's run must not stop";
    s->set_lambda_override(0, 0.9);
    s->set_lambda_override(2, -0.4);
    std::atomic<int> polls{0};
    try {
      s->run(false, [&] { return ++polls > after; });
    } catch (const ds::Cancelled&) {
      ++stops;
      EXPECT_LT(s->stale_from(), L) << after;
    }
    s->run();
    const std::vector<float>& got = s->result().logits;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "stopped after " << after << " polls";
  }
  EXPECT_GT(stops, 5);  // the cases above did stop, at many places
}

// A forward that keeps only the last position's logits skips the last layer's other rows: the same logits.
TEST(MapQueriesCpu, LastRowOnlyForwardKeepsTheLastLogits) {
  auto s = ds::Session::open(dstest::fixture("diff_gqa4_d32_sharded_v5"), ds::BackendChoice::Cpu, nullptr, 2);
  dstest::Expected ex(dstest::fixture("diff_gqa4_d32_sharded_v5"));
  s->set_ids(ex.ids());
  ds::ForwardRequest req;
  req.ids = ex.ids();
  for (int l = 0; l < s->config().layers; ++l) req.lambda.push_back(float(s->effective_lambda(l)));
  ds::ForwardResult last, all;
  s->backend().forward(req, last);
  req.all_logits = true;
  s->backend().forward(req, all);
  const int64_t V = s->config().vocab, n = int64_t(req.ids.size());
  ASSERT_EQ(last.logits.size(), size_t(V));
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(last.logits[size_t(v)], all.logits[size_t((n - 1) * V + v)], 1e-5);
}

}  // namespace
