// The lambda sweep (engine/session/session_sweep.h), which the GUI's sweep plot, diffscope-run --sweep and the Python module
// share: each point's log-probability equals a fresh session's forward with that lambda on the layer, each entropy
// equals that forward's own head statistics, the session's lambda and result come back unchanged, a stop keeps the
// points done (the range's ends first), and requests the model cannot serve are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/session/session.h"
#include "engine/session/session_sweep.h"
#include "test_util.h"

namespace {

using dstest::fixture;

const std::vector<int32_t> kIds = {1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11};

void check_sweep(const std::string& f, int head) {
  SCOPED_TRACE(f);
  auto s = ds::Session::open(fixture(f), ds::BackendChoice::Cpu, nullptr, 2);
  const ds::ModelConfig& c = s->config();
  const int layer = int(c.map_layers().at(c.map_layers().size() / 2));
  s->set_ids(kIds);
  s->set_lambda_override(int(c.map_layers().front()), 0.3);  // another layer's override stays as it is
  s->run();
  const std::vector<float> before = s->next_token_logprobs();
  ds::LambdaSweepRequest r;
  r.layer = layer;
  r.from = -0.4;
  r.to = 1.3;
  r.steps = 6;
  r.head = head;
  int progress = 0;
  const ds::LambdaSweep sw = ds::run_lambda_sweep(*s, r, {[&](const ds::LambdaSweep&) { ++progress; }, {}, {}});
  EXPECT_EQ(sw.end, ds::LambdaSweep::End::Complete);
  EXPECT_EQ(progress, 1 + r.steps) << "the entropy pass, then one per point";
  ASSERT_EQ(sw.points.size(), size_t(r.steps));
  EXPECT_EQ(sw.token, s->top_k(1).at(0).id);
  EXPECT_FALSE(s->lambda_control().override_.at(size_t(layer)).has_value()) << "the swept layer's lambda restored";
  EXPECT_EQ(s->lambda_control().override_.at(size_t(c.map_layers().front())), 0.3);
  EXPECT_EQ(s->next_token_logprobs(), before) << "the session's result is its own lambda's again";
  const int H = int(c.view_heads());
  for (const ds::LambdaSweepPoint& p : sw.points) {
    auto t = ds::Session::open(fixture(f), ds::BackendChoice::Cpu, nullptr, 2);
    t->set_ids(kIds);
    t->set_lambda_override(int(c.map_layers().front()), 0.3);
    t->set_lambda_override(layer, p.lambda);
    t->run();
    EXPECT_NEAR(p.logprob, double(t->next_token_logprobs().at(size_t(sw.token))), 1e-5) << "lambda " << p.lambda;
    const std::vector<ds::HeadStats> st = t->backend().head_stats(layer);
    ASSERT_EQ(p.entropy.size(), size_t(head < 0 ? H : 1));
    for (size_t i = 0; i < p.entropy.size(); ++i) {
      const double want = st.at(size_t(head < 0 ? int(i) : head)).entropy_diff;
      EXPECT_NEAR(p.entropy[i], want, 1e-5 * std::max(1.0, std::fabs(want))) << "lambda " << p.lambda << " head " << i;
    }
  }
}

TEST(LambdaSweep, MatchesForwardsAtEachLambda) {
  check_sweep("diff_mha_d32_f32", -1);
  check_sweep("motif_mha_d32_f32", 1);
  check_sweep("phi4flash_L8_mha_f32", -1);
}

TEST(LambdaSweep, StopKeepsTheEndsAndRestores) {
  auto s = ds::Session::open(fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, nullptr, 2);
  s->set_ids(kIds);
  s->set_lambda_override(1, 0.42);
  s->run();
  int points = 0;
  ds::LambdaSweepHooks h;
  h.progress = [&](const ds::LambdaSweep&) { ++points; };
  h.stop = [&] { return points >= 3; };  // the entropy pass and two points
  const ds::LambdaSweep sw = ds::run_lambda_sweep(*s, {1, 0.0, 1.0, 9, -1, -1}, h);
  EXPECT_EQ(sw.end, ds::LambdaSweep::End::Stopped);
  EXPECT_TRUE(std::isfinite(sw.points.front().logprob) && std::isfinite(sw.points.back().logprob)) << "ends first";
  int done = 0;
  for (const auto& p : sw.points) done += std::isfinite(p.logprob);
  EXPECT_EQ(done, 2);
  EXPECT_EQ(s->lambda_control().override_.at(1), 0.42);
  EXPECT_EQ(s->stale_from(), int(s->config().layers)) << "run back to the user's lambda";
}

TEST(LambdaSweep, RefusedRequests) {
  auto s = ds::Session::open(fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, nullptr, 2);
  s->set_ids(kIds);
  EXPECT_THROW(ds::run_lambda_sweep(*s, {1, 0, 1, 5, -1, -1}), ds::Error) << "no result yet";
  s->run();
  for (const ds::LambdaSweepRequest& r :
       {ds::LambdaSweepRequest{7, 0, 1, 5, -1, -1}, {-1, 0, 1, 5, -1, -1}, {1, 0, 1, 1, -1, -1}, {1, 0, 1, 5, 4, -1},
        {1, NAN, 1, 5, -1, -1}, {1, 0, 1, 5, -1, 1 << 30}}) {
    EXPECT_THROW(ds::check_lambda_sweep(*s, r), ds::Error);
    EXPECT_THROW(ds::run_lambda_sweep(*s, r), ds::Error);
  }
  auto llama = ds::Session::open(fixture("llama_gqa_d32_f32"), ds::BackendChoice::Cpu, nullptr, 2);
  llama->set_ids(kIds);
  llama->run();
  EXPECT_THROW(ds::run_lambda_sweep(*llama, {1, 0, 1, 5, -1, -1}), ds::Error) << "no lambda";
  auto phi = ds::Session::open(fixture("phi4flash_L8_mha_f32"), ds::BackendChoice::Cpu, nullptr, 2);
  phi->set_ids(kIds);
  phi->run();
  EXPECT_THROW(ds::run_lambda_sweep(*phi, {0, 0, 1, 5, -1, -1}), ds::Error) << "a Mamba layer";
}

}  // namespace
