// Map queries on the CPU backend (engine/map_query.h): pooled views, rows and statistics against float64
// references built from the full maps, on the transformers fixtures (differential MHA and GQA, Llama, a one-token
// prompt) and with lambda overrides; and the CLI's flags write them.
#include <gtest/gtest.h>

#include "engine/session.h"
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

}  // namespace
