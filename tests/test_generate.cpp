// Generation (engine/session/session.h, ForwardRequest::append_from) checked against the engine's own full forward: every
// cached decoding step's logits equal a forward over the whole sequence so far, on every family (DiffLlama, Llama,
// Motif, Phi-4-mini-flash) and on both backends; cutting back to the prompt and generating again, a lambda change in
// the middle of a generation, rows/statistics of generated positions, stopping (EOS, max, context), and the sampler
// (seeded, top-k, top-p). The float64 references of generation are in test_generate_reference.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <nlohmann/json.hpp>

#include "engine/core/sampling.h"
#include "engine/session/session.h"
#include "test_util.h"

#ifdef DS_HAVE_CUDA
#include "engine/cuda/detail/backend_cuda_impl.h"
#include "kernels/argmax.h"
#include "test_cuda_util.h"
#endif

namespace {

using dstest::fixture;

std::vector<float> last_logits(const ds::Session& s) {
  const ds::ForwardResult& r = s.result();
  const int64_t V = s.config().vocab;
  return std::vector<float>(r.logits.end() - V, r.logits.end());
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Generates `count` greedy tokens and checks each step's logits against a fresh session's full forward over the
// same ids (tol: max abs difference relative to the largest logit). Returns the generated ids.
std::vector<int32_t> check_cached_equals_full(const std::string& dir, ds::BackendChoice b, int count, double tol,
                                              const std::vector<std::pair<int, double>>& lambdas = {}) {
  auto s = ds::Session::open(dir, b);
  auto full = ds::Session::open(dir, b);
  for (auto [l, v] : lambdas) s->set_lambda_override(l, v), full->set_lambda_override(l, v);
  s->set_ids(dstest::Expected(dir).ids());
  ds::GenerateOptions o;
  o.max_new = count;
  o.stop_at_eos = false;
  s->begin_generation(o);
  int steps = 0;
  while (s->generating()) {
    const std::vector<float> before = last_logits(*s);
    full->set_ids(s->ids());
    full->run();
    const std::vector<float> ref = last_logits(*full);
    EXPECT_LE(dstest::max_abs_err(before.data(), ref.data(), ref.size()), tol * max_abs(ref))
        << dir << " step " << steps;
    const int32_t id = s->generate_step();
    if (id < 0) break;
    EXPECT_EQ(id, int32_t(std::max_element(before.begin(), before.end()) - before.begin())) << "greedy, step " << steps;
    ++steps;
  }
  // after the last step: its logits too
  full->set_ids(s->ids());
  full->run();
  const std::vector<float> ref = last_logits(*full), got = last_logits(*s);
  EXPECT_LE(dstest::max_abs_err(got.data(), ref.data(), ref.size()), tol * max_abs(ref)) << dir << " last step";
  EXPECT_EQ(steps, count);
  EXPECT_EQ(s->stop_reason(), ds::StopReason::MaxTokens);
  EXPECT_EQ(int64_t(s->ids().size()), s->prompt_length() + count);
  return s->generated();
}

const char* kFamilies[] = {"diff_mha_d32_f32", "diff_gqa4_d32_sharded_v5", "llama_gqa_d32_f32",
                           "motif_gqa_d64_bf16_tied", "phi4flash_L8_mha_f32", "phi4flash_L12_gqa_sharded_f32"};

TEST(Generate, CachedStepsEqualFullForwardCpu) {
  for (const char* f : kFamilies) check_cached_equals_full(fixture(f), ds::BackendChoice::Cpu, 6, 2e-5);
}

TEST(Generate, LambdaOverridesApplyWhileGenerating) {
  check_cached_equals_full(fixture("diff_mha_d32_f32"), ds::BackendChoice::Cpu, 5, 2e-5, {{1, 0.9}, {2, -0.3}});
  check_cached_equals_full(fixture("phi4flash_L8_mha_f32"), ds::BackendChoice::Cpu, 5, 2e-5, {{3, 0.7}});
}

// A lambda change between two steps: the sequence so far re-runs from that layer, and the next steps are what a
// full forward with the new lambda gives.
void check_lambda_change_midway(const std::string& dir, int layer, ds::BackendChoice b, double tol) {
  auto s = ds::Session::open(dir, b);
  s->set_ids(dstest::Expected(dir).ids());
  ds::GenerateOptions o;
  o.max_new = 6;
  o.stop_at_eos = false;
  s->begin_generation(o);
  for (int i = 0; i < 3; ++i) ASSERT_GE(s->generate_step(), 0);
  s->set_lambda_override(layer, 1.25);
  for (int i = 0; i < 3; ++i) ASSERT_GE(s->generate_step(), 0);
  auto full = ds::Session::open(dir, b);
  full->set_lambda_override(layer, 1.25);
  full->set_ids(s->ids());
  full->run();
  const std::vector<float> ref = last_logits(*full), got = last_logits(*s);
  EXPECT_LE(dstest::max_abs_err(got.data(), ref.data(), ref.size()), tol * max_abs(ref)) << dir;
}

TEST(Generate, LambdaChangeMidwayCpu) {
  check_lambda_change_midway(fixture("diff_gqa4_d32_sharded_v5"), 1, ds::BackendChoice::Cpu, 2e-5);
  check_lambda_change_midway(fixture("phi4flash_L8_mha_f32"), 5, ds::BackendChoice::Cpu, 2e-5);
}

// Generating again from the prompt gives the same greedy tokens, whether the backend cut its caches back
// (attention-only models) or ran the prompt again (Mamba state); after a lambda change it runs under the new one.
TEST(Generate, RegenerateFromPrompt) {
  for (const char* f : {"diff_mha_d32_f32", "phi4flash_L8_mha_f32"}) {
    auto s = ds::Session::open(fixture(f), ds::BackendChoice::Cpu);
    const std::vector<int32_t> prompt = dstest::Expected(fixture(f)).ids();
    s->set_ids(prompt);
    ds::GenerateOptions o;
    o.max_new = 5;
    o.stop_at_eos = false;
    const std::vector<int32_t> a = s->generate(o);
    const std::vector<float> prompt_logits = [&] {
      auto t = ds::Session::open(fixture(f), ds::BackendChoice::Cpu);
      t->set_ids(prompt);
      t->run();
      return last_logits(*t);
    }();
    s->clear_generation();
    EXPECT_EQ(s->ids(), prompt);
    EXPECT_EQ(last_logits(*s), prompt_logits) << f << ": the prompt's logits after cutting back";
    const std::vector<int32_t> b = s->generate(o);
    EXPECT_EQ(a, b) << f;
    ASSERT_EQ(a.size(), 5u);
  }
}

// Rows and statistics of generated positions are those of a forward over the whole sequence.
TEST(Generate, GeneratedPositionsHaveRowsAndStats) {
  const std::string dir = fixture("diff_gqa4_d32_sharded_v5");
  auto s = ds::Session::open(dir, ds::BackendChoice::Cpu);
  s->set_ids(dstest::Expected(dir).ids());
  ds::GenerateOptions o;
  o.max_new = 4;
  o.stop_at_eos = false;
  s->generate(o);
  auto full = ds::Session::open(dir, ds::BackendChoice::Cpu);
  full->set_ids(s->ids());
  full->run();
  const int64_t n = int64_t(s->ids().size());
  const std::vector<int64_t> rows = {n - 1, n - 3, s->prompt_length()};
  for (int layer = 0; layer < int(s->config().layers); ++layer) {
    ds::MapRows a, b;
    s->backend().map_rows(layer, rows, a);
    full->backend().map_rows(layer, rows, b);
    ASSERT_EQ(a.a1.size(), b.a1.size());
    EXPECT_LE(dstest::max_abs_err(a.a1.data(), b.a1.data(), a.a1.size()), 1e-5);
    EXPECT_LE(dstest::max_abs_err(a.a2.data(), b.a2.data(), a.a2.size()), 1e-5);
    const auto sa = s->backend().head_stats(layer), sb = full->backend().head_stats(layer);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t h = 0; h < sa.size(); ++h) EXPECT_NEAR(sa[h].entropy_diff, sb[h].entropy_diff, 1e-4);
  }
  const ds::LayerMaps& m = s->maps(1);
  EXPECT_EQ(m.n, n);
}

// The implicit attention of a Mamba layer (Backend::mamba_view) while generating: views asked for between steps
// leave the generation unchanged (on the GPU they recompute the layer's scan inputs in the forward's scratch
// buffers), and each view covers every position so far, equal to a fresh full forward's view of the same ids.
std::vector<float> implicit_view(ds::Backend& b, int layer, int channel) {
  ds::ViewRequest q;
  q.layer = layer;
  q.head = channel;
  ds::MapView v;
  b.mamba_view(q, v);
  EXPECT_EQ(v.rows, v.q1 - v.q0);
  return v.a1;
}

void check_implicit_views_while_generating(const std::string& dir, ds::BackendChoice bc, double tol) {
  auto s = ds::Session::open(dir, bc);
  s->set_ids(dstest::Expected(dir).ids());
  const int mem = int(s->config().layers / 2);  // the memory layer (SambaY)
  ds::GenerateOptions o;
  o.max_new = 4;
  o.stop_at_eos = false;
  std::vector<std::vector<float>> logits[2];
  std::vector<int32_t> ids[2];
  for (int with_views = 0; with_views < 2; ++with_views) {
    s->generate(o, [&](int32_t) {
      logits[with_views].push_back(last_logits(*s));
      if (with_views) {
        const std::vector<float> a = implicit_view(s->backend(), 0, 3), m = implicit_view(s->backend(), mem, 1);
        EXPECT_EQ(a.size(), s->ids().size() * s->ids().size()) << dir;
        auto full = ds::Session::open(dir, bc);
        full->set_ids(s->ids());
        full->run();
        const std::vector<float> fa = implicit_view(full->backend(), 0, 3), fm = implicit_view(full->backend(), mem, 1);
        EXPECT_LE(dstest::max_abs_err(a.data(), fa.data(), fa.size()), tol * (1 + max_abs(fa))) << dir;
        EXPECT_LE(dstest::max_abs_err(m.data(), fm.data(), fm.size()), tol * (1 + max_abs(fm))) << dir;
      }
      return true;
    });
    ids[with_views] = s->generated();
  }
  EXPECT_EQ(ids[0], ids[1]) << dir;
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_EQ(logits[0][i], logits[1][i]) << dir << " step " << i;
}

TEST(Generate, ImplicitViewsWhileGeneratingCpu) {
  check_implicit_views_while_generating(fixture("phi4flash_L8_mha_f32"), ds::BackendChoice::Cpu, 1e-5);
}

// A copy of a fixture with config.json keys changed.
std::string fixture_with(const dstest::TempDir& t, const std::string& name, const nlohmann::json& patch) {
  const std::filesystem::path src = fixture(name), dst = t.path / name;
  std::filesystem::copy(src, dst, std::filesystem::copy_options::recursive);
  std::ifstream in(dst / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  j.update(patch);
  std::ofstream(dst / "config.json") << j.dump(1);
  return dst.string();
}

TEST(Generate, StopsAtEosMaxAndContext) {
  const std::string name = "diff_mha_d32_f32";
  auto ref = ds::Session::open(fixture(name), ds::BackendChoice::Cpu);
  const std::vector<int32_t> prompt = dstest::Expected(fixture(name)).ids();
  ref->set_ids(prompt);
  ds::GenerateOptions o;
  o.max_new = 6;
  o.stop_at_eos = false;
  const std::vector<int32_t> free_run = ref->generate(o);
  ASSERT_EQ(free_run.size(), 6u);
  EXPECT_EQ(ref->stop_reason(), ds::StopReason::MaxTokens);

  dstest::TempDir t;
  {  // EOS: the third token, given as a list as Llama-3 configs do
    auto s = ds::Session::open(fixture_with(t, name, {{"eos_token_id", {free_run[2], 0}}}), ds::BackendChoice::Cpu);
    s->set_ids(prompt);
    o.stop_at_eos = true;
    const std::vector<int32_t> g = s->generate(o);
    EXPECT_EQ(g, std::vector<int32_t>(free_run.begin(), free_run.begin() + 3));
    EXPECT_EQ(s->stop_reason(), ds::StopReason::Eos);
    EXPECT_TRUE(s->tokens().back().special);
    EXPECT_EQ(s->generate_step(), -1);  // stopped: nothing more
  }
  {  // positions: the model allows 2 more than the prompt
    dstest::TempDir t2;
    auto s = ds::Session::open(
        fixture_with(t2, name, {{"max_position_embeddings", int64_t(prompt.size()) + 2}}), ds::BackendChoice::Cpu);
    s->set_ids(prompt);
    const std::vector<int32_t> g = s->generate(o);
    EXPECT_EQ(g.size(), 2u);
    EXPECT_EQ(s->stop_reason(), ds::StopReason::ContextFull);
  }
  {  // the user stops it from the callback
    auto s = ds::Session::open(fixture(name), ds::BackendChoice::Cpu);
    s->set_ids(prompt);
    int seen = 0;
    const std::vector<int32_t> g = s->generate(o, [&](int32_t) { return ++seen < 2; });
    EXPECT_EQ(g.size(), 2u);
    EXPECT_EQ(s->stop_reason(), ds::StopReason::Stopped);
  }
  {  // stopped after 2, then continued by 3: the first 5 tokens of the free run
    auto s = ds::Session::open(fixture(name), ds::BackendChoice::Cpu);
    s->set_ids(prompt);
    int seen = 0;
    s->generate(o, [&](int32_t) { return ++seen < 2; });
    ASSERT_TRUE(s->continue_generation(3));
    while (s->generate_step() >= 0) {
    }
    EXPECT_EQ(s->generated(), std::vector<int32_t>(free_run.begin(), free_run.begin() + 5));
    EXPECT_EQ(s->stop_reason(), ds::StopReason::MaxTokens);
    EXPECT_TRUE(s->continue_generation(1));  // after max_new too
    EXPECT_FALSE(s->continue_generation(1));  // but not while running
  }
  {  // bad options are refused before anything runs
    auto s = ds::Session::open(fixture(name), ds::BackendChoice::Cpu);
    s->set_ids(prompt);
    ds::GenerateOptions bad = o;
    bad.sampling.temperature = -1;
    EXPECT_THROW(s->begin_generation(bad), ds::Error);
    bad = o;
    bad.sampling.top_p = 0;
    EXPECT_THROW(s->begin_generation(bad), ds::Error);
    bad = o;
    bad.max_new = -1;
    EXPECT_THROW(s->begin_generation(bad), ds::Error);
  }
}

TEST(Generate, SamplingIsSeededAndRespectsTopKTopP) {
  const std::string dir = fixture("llama_gqa_d32_f32");
  auto s = ds::Session::open(dir, ds::BackendChoice::Cpu);
  const std::vector<int32_t> prompt = dstest::Expected(dir).ids();
  ds::GenerateOptions o;
  o.max_new = 8;
  o.stop_at_eos = false;
  s->set_ids(prompt);
  const std::vector<int32_t> greedy = s->generate(o);
  o.sampling = {1.0, 0, 1.0, 42};
  const std::vector<int32_t> a = s->generate(o), b = s->generate(o);
  EXPECT_EQ(a, b) << "the same seed gives the same continuation";
  o.sampling.seed = 43;
  const std::vector<int32_t> c = s->generate(o);
  EXPECT_NE(a, c) << "another seed gives another continuation (8 draws at temperature 1 over 300 tokens)";
  o.sampling = {1.0, 1, 1.0, 7};  // top-k 1 is greedy
  EXPECT_EQ(s->generate(o), greedy);
  o.sampling = {0.7, 0, 1e-9, 7};  // a tiny nucleus is the top token alone
  EXPECT_EQ(s->generate(o), greedy);
}

TEST(Sampler, DrawsFollowTheDistribution) {
  const float logits[4] = {0.f, std::log(2.f), std::log(4.f), -INFINITY};
  auto freq = [&](ds::SamplingOptions o, int draws) {
    ds::Sampler s(o);
    std::vector<double> f(4, 0.0);
    for (int i = 0; i < draws; ++i) f[size_t(s.pick(logits, 4))] += 1.0 / draws;
    return f;
  };
  std::vector<double> f = freq({1.0, 0, 1.0, 1}, 40000);  // 1/7, 2/7, 4/7, never the -inf one
  EXPECT_NEAR(f[0], 1.0 / 7, 0.01);
  EXPECT_NEAR(f[1], 2.0 / 7, 0.01);
  EXPECT_NEAR(f[2], 4.0 / 7, 0.01);
  EXPECT_EQ(f[3], 0.0);
  f = freq({1.0, 2, 1.0, 2}, 30000);  // top-k 2: 1/3, 2/3
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[1], 1.0 / 3, 0.01);
  f = freq({1.0, 0, 0.8, 3}, 30000);  // top-p 0.8: 4/7 < 0.8 <= 6/7, so ids 2 and 1 at 2/3 and 1/3
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[2], 2.0 / 3, 0.01);
  f = freq({0.5, 0, 1.0, 4}, 40000);  // temperature 0.5 squares the odds: 1, 4, 16 over 21
  EXPECT_NEAR(f[2], 16.0 / 21, 0.01);
  const float bad[2] = {NAN, INFINITY};
  ds::Sampler g;
  EXPECT_THROW(g.pick(bad, 2), ds::Error);
  EXPECT_THROW(ds::Sampler({-0.5, 0, 1.0, 0}), ds::Error);
}

#ifdef DS_HAVE_CUDA
// The CUDA backend's decoding steps (one CUDA graph after the first step) against its own full forward, and
// against the CPU's tokens while the CPU's top-2 margin is clear of bf16 noise.
TEST(GenerateCuda, CachedStepsEqualFullForward) {
  SKIP_WITHOUT_DEVICE();
  for (const char* f : kFamilies) check_cached_equals_full(fixture(f), ds::BackendChoice::Cuda, 6, 2e-2);
  check_lambda_change_midway(fixture("diff_gqa4_d32_sharded_v5"), 1, ds::BackendChoice::Cuda, 2e-2);
  check_lambda_change_midway(fixture("phi4flash_L8_mha_f32"), 5, ds::BackendChoice::Cuda, 2e-2);
}

TEST(GenerateCuda, ImplicitViewsWhileGenerating) {
  SKIP_WITHOUT_DEVICE();
  // the full forward's view against the cached steps' inputs: bf16 GEMMs over different row counts
  check_implicit_views_while_generating(fixture("phi4flash_L8_gqa_bf16"), ds::BackendChoice::Cuda, 2e-2);
}

// One backend (so that both runs use the same GEMM algorithms): eager steps, then the same generation again with
// the step captured once and replayed.
TEST(GenerateCuda, GraphReplaysEqualEagerSteps) {
  SKIP_WITHOUT_DEVICE();
  for (const char* f : {"diff_gqa4_d32_sharded_v5", "phi4flash_L8_gqa_bf16"}) {
    auto s = ds::Session::open(fixture(f), ds::BackendChoice::Cuda);
    ds::cuda::CudaBackend& b = ds::cuda::as_cuda(s->backend());
    s->set_ids(dstest::Expected(fixture(f)).ids());
    std::vector<std::vector<float>> logits[2];
    std::vector<int32_t> ids[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      b.set_decode_graphs(graphs == 1);
      const int64_t replays0 = b.decode_graph_replays();
      ds::GenerateOptions o;
      o.max_new = 7;
      o.stop_at_eos = false;
      s->generate(o, [&](int32_t) {
        logits[graphs].push_back(last_logits(*s));
        return true;
      });
      ids[graphs] = s->generated();
      if (graphs == 1) EXPECT_GE(b.decode_graph_replays() - replays0, 4) << f;
      else EXPECT_EQ(b.decode_graph_replays(), replays0) << f;
    }
    EXPECT_EQ(ids[0], ids[1]) << f;
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t i = 0; i < logits[0].size(); ++i) EXPECT_EQ(logits[0][i], logits[1][i]) << f << " step " << i;
  }
}

// Steps queued back to back (no wait between them: the position of each is staged when it is queued) give the
// logits of steps taken one at a time.
TEST(GenerateCuda, QueuedStepsEqualSteppedOnes) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = fixture("diff_gqa4_d32_sharded_v5");
  auto s = ds::Session::open(dir, ds::BackendChoice::Cuda);
  ds::cuda::CudaBackend& b = ds::cuda::as_cuda(s->backend());
  s->set_ids(dstest::Expected(dir).ids());
  ds::GenerateOptions o;
  o.max_new = 9;
  o.stop_at_eos = false;
  const std::vector<int32_t> g = s->generate(o);
  const std::vector<float> stepped = last_logits(*s);
  s->clear_generation();  // back to the prompt (the caches are cut, not recomputed)
  std::vector<float> lam;
  for (int l = 0; l < int(s->config().layers); ++l) lam.push_back(float(s->effective_lambda(l)));
  for (int32_t id : g) b.decode_step(id, lam);
  b.sync();
  std::vector<float> queued(stepped.size());
  ASSERT_EQ(cudaMemcpy(queued.data(), b.logits_dev(), queued.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(queued, stepped);
}

// Greedy steps choose on the device and leave the logits there: the same tokens as choosing on the host from the
// fetched logits every step, and the logits a reader asks for afterwards are the step's (one backend, so that the
// two generations run the same kernels: bit for bit).
TEST(GenerateCuda, DeviceGreedyChoiceEqualsHostChoice) {
  SKIP_WITHOUT_DEVICE();
  for (const char* f : {"diff_gqa4_d32_sharded_v5", "llama_tied_llama3_bf16", "phi4flash_L8_gqa_bf16"}) {
    const std::string dir = fixture(f);
    auto s = ds::Session::open(dir, ds::BackendChoice::Cuda);
    s->set_ids(dstest::Expected(dir).ids());
    ds::GenerateOptions o;
    o.max_new = 12;
    o.stop_at_eos = false;
    const std::vector<int32_t> a = s->generate(o);  // no reader between steps: every choice on the device
    const std::vector<float> last = last_logits(*s);
    std::vector<float> fetched_each_step;
    const std::vector<int32_t> b = s->generate(o, [&](int32_t) {
      fetched_each_step = last_logits(*s);  // fetches the logits: the next choice is made on the host
      return true;
    });
    EXPECT_EQ(a, b) << f;
    EXPECT_EQ(last, fetched_each_step) << f;
  }
}

// The argmax kernel against the host's greedy choice: first index on ties, -inf and NaN never chosen.
TEST(GenerateCuda, ArgmaxKernelMatchesHost) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(5);
  // The first index of the largest entry; -1 when none is larger than -inf (NaN never is).
  const auto first_max = [](const std::vector<float>& x) {
    int32_t best = -1;
    float v = -INFINITY;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] > v) {
        v = x[i];
        best = int32_t(i);
      }
    return best;
  };
  for (int64_t n : {1, 7, 1000, 1024, 1025, 32000, 128256, 151936}) {
    for (int pattern = 0; pattern < 3; ++pattern) {
      std::vector<float> x(static_cast<size_t>(n));
      std::normal_distribution<float> nd(0.f, 3.f);
      for (float& v : x) v = pattern == 1 ? float(int(nd(rng))) : nd(rng);  // pattern 1: many ties
      if (pattern == 2)
        for (size_t i = 0; i < x.size(); i += 3) x[i] = i % 2 ? -INFINITY : NAN;
      if (n > 2 && pattern < 2) x[size_t(n) - 1] = *std::max_element(x.begin(), x.end());  // a tie at the end
      auto d = to_device(x);
      auto out = ds::cuda::DeviceBuffer(8, "argmax");
      DS_CUDA_CHECK(ds::kern::launch_argmax_f32(d.as<float>(), n, out.as<int32_t>(), nullptr));
      const std::vector<int32_t> r = to_host<int32_t>(out, 2);
      EXPECT_EQ(r[0], first_max(x)) << "n " << n << " pattern " << pattern;
    }
  }
  std::vector<float> bad(100, -INFINITY);
  auto d = to_device(bad);
  auto out = ds::cuda::DeviceBuffer(8, "argmax");
  DS_CUDA_CHECK(ds::kern::launch_argmax_f32(d.as<float>(), 100, out.as<int32_t>(), nullptr));
  EXPECT_EQ(to_host<int32_t>(out, 2)[0], -1);
}

// Rows of generated positions, which the decoding steps wrote into the caches, against a full forward's.
TEST(GenerateCuda, GeneratedRowsMatchFullForward) {
  SKIP_WITHOUT_DEVICE();
  for (const char* f : {"diff_gqa4_d32_sharded_v5", "phi4flash_L8_gqa_bf16"}) {
    const std::string dir = fixture(f);
    auto gen = ds::Session::open(dir, ds::BackendChoice::Cuda);
    gen->set_ids(dstest::Expected(dir).ids());
    ds::GenerateOptions o;
    o.max_new = 5;
    o.stop_at_eos = false;
    gen->generate(o);
    auto full = ds::Session::open(dir, ds::BackendChoice::Cuda);
    full->set_ids(gen->ids());
    full->run();
    const int64_t n = int64_t(gen->ids().size());
    for (int64_t layer : gen->config().map_layers()) {
      ds::MapRows a, b;
      gen->backend().map_rows(int(layer), {n - 1, n - 2, gen->prompt_length()}, a);
      full->backend().map_rows(int(layer), {n - 1, n - 2, gen->prompt_length()}, b);
      ASSERT_EQ(a.a1.size(), b.a1.size());
      EXPECT_LE(dstest::max_abs_err(a.a1.data(), b.a1.data(), a.a1.size()), 2e-2) << f << " layer " << layer;
      EXPECT_LE(dstest::max_abs_err(a.a2.data(), b.a2.data(), a.a2.size()), 2e-2) << f << " layer " << layer;
    }
  }
}
#else
TEST(GenerateCuda, NotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#endif

}  // namespace
