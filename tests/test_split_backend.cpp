// Layers across devices (engine/session/split_backend.h): two CPU backends stand in for two GPUs (two blocks of the
// same code on the same threads), so every result of the split must equal one CPU backend's bit for bit: logits,
// maps, rows, statistics, row masses, a lambda re-run from a layer of either block, generation, the logit lens,
// outliers, the hidden-state reader and interventions. On a machine with two GPUs the same comparison runs between
// cuda:0 and cuda:0,1 (DS_GEMM_AUTOTUNE=0 pins the GEMM choice per device).
#include <gtest/gtest.h>

#include <cstring>

#include "engine/core/model.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/session/session.h"
#include "engine/session/session_importance.h"
#include "engine/session/session_lens.h"
#include "engine/session/session_outliers.h"
#include "engine/session/split_backend.h"
#include "test_util.h"

namespace {

std::string demo() { return dstest::source_dir() + "/assets/models/diffllama-demo"; }

// The smallest per-device limit (in steps of 1/64 of the model's own need) at which the model splits over `devices`
// blocks and fits: what --gpu-mem-limit does to force a split.
int64_t limit_for_blocks(const ds::ModelConfig& c, const std::vector<ds::BackendChoice>& backends, size_t blocks) {
  ds::SplitOptions o;
  o.backends = backends;
  o.mem_limit = int64_t(1) << 40;
  const size_t whole = ds::place_layers(c, o).need.at(0);
  for (int i = 1; i <= 256; ++i) {
    o.mem_limit = int64_t(whole) * i / 64 + (int64_t(1) << 20) * (backends[0].kind == ds::BackendChoice::Kind::Cpu ? 0 : 768);
    try {
      if (ds::place_layers(c, o).first.size() == blocks) return o.mem_limit;
    } catch (const ds::Error&) {
    }
  }
  return 0;
}

std::vector<int32_t> demo_ids(int64_t n) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t((i * 7919 + 13) % 8000 + 10));
  return ids;
}

void expect_same_floats(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what << ": not bit-identical";
}

void compare_sessions(ds::Session& one, ds::Session& two, const std::string& what) {
  const ds::ModelConfig& c = one.config();
  expect_same_floats(one.result().logits, two.result().logits, what + " logits");
  for (int l = 0; l < int(c.layers); ++l) {
    if (!c.has_maps(l)) continue;
    ds::ViewRequest v;
    v.layer = l;
    v.head = 1;
    v.rows = v.cols = 48;
    ds::MapView a, b;
    one.backend().map_view(v, a);
    two.backend().map_view(v, b);
    expect_same_floats(a.a1, b.a1, what + " view a1 layer " + std::to_string(l));
    expect_same_floats(a.diff, b.diff, what + " view diff layer " + std::to_string(l));
    ds::MapRows ra, rb;
    const int64_t n = int64_t(one.ids().size());
    one.backend().map_rows(l, {n - 1, n / 2}, ra);
    two.backend().map_rows(l, {n - 1, n / 2}, rb);
    expect_same_floats(ra.a1, rb.a1, what + " rows layer " + std::to_string(l));
    const auto sa = one.backend().head_stats(l), sb = two.backend().head_stats(l);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t h = 0; h < sa.size(); ++h) EXPECT_EQ(sa[h].entropy_diff, sb[h].entropy_diff) << what << " stats " << l;
    const auto ma = one.backend().row_mass(l, n - 1, 3, 9), mb = two.backend().row_mass(l, n - 1, 3, 9);
    for (size_t h = 0; h < ma.size(); ++h) EXPECT_EQ(ma[h].answer[0], mb[h].answer[0]) << what << " row mass " << l;
  }
  // Every layer's row masses at once (a scan's prompt), the layers out of order and across the blocks.
  std::vector<int> layers;
  for (int l = 0; l < int(c.layers); ++l)
    if (c.has_maps(l)) layers.insert(layers.begin(), l);
  const int64_t n = int64_t(one.ids().size());
  const auto all = two.backend().row_masses(layers, n - 1, 3, 9);
  ASSERT_EQ(all.size(), layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto m = one.backend().row_mass(layers[i], n - 1, 3, 9);
    ASSERT_EQ(all[i].size(), m.size()) << what;
    for (size_t h = 0; h < m.size(); ++h)
      EXPECT_EQ(all[i][h].context[2], m[h].context[2]) << what << " row masses, layer " << layers[i];
  }
}

}  // namespace

TEST(SplitBackend, TwoCpuBlocksEqualOneBackend) {
  const ds::ModelConfig c = ds::load_model(demo())->cfg;
  const std::vector<ds::BackendChoice> two_cpu{ds::BackendChoice::Cpu, ds::BackendChoice::Cpu};
  const int64_t limit = limit_for_blocks(c, two_cpu, 2);
  ASSERT_GT(limit, 0) << "no limit splits the demo model over two blocks";
  auto one = ds::Session::open(demo(), ds::BackendChoice::Cpu, nullptr, 1);
  auto two = ds::Session::open(demo(), two_cpu, nullptr, 1, limit);
  EXPECT_NE(two->backend().name().find("layer split: layers 0-"), std::string::npos) << two->backend().name();
  const std::vector<int32_t> ids = demo_ids(96);
  one->set_ids(ids);
  two->set_ids(ids);
  one->run();
  two->run();
  compare_sessions(*one, *two, "prompt");
  // A lambda change in each block: the split re-runs from the changed layer's block.
  for (int l : {1, int(c.layers) - 1}) {
    one->set_lambda_override(l, 0.3);
    two->set_lambda_override(l, 0.3);
    EXPECT_EQ(one->run(), two->run());
    compare_sessions(*one, *two, "lambda at layer " + std::to_string(l));
  }
  // Interventions in both blocks: an ablated head, a dropped A2, a knockout.
  for (auto* s : {one.get(), two.get()}) {
    s->set_head_scale(1, 2, 0.f);
    s->set_head_mix(int(c.layers) - 2, 0, false, 0.f);
    s->add_knockout(ds::parse_knockout("all:-1:,5:9", int(c.layers)));
    s->run();
  }
  compare_sessions(*one, *two, "interventions");
  one->clear_interventions();
  two->clear_interventions();
  // The logit lens (another block's rows through the last block's head), outliers, the hidden-state reader.
  const ds::Lens la = ds::logit_lens(*one, ds::LensRequest{{-1, 10}, {}, 5, -1});
  const ds::Lens lb = ds::logit_lens(*two, ds::LensRequest{{-1, 10}, {}, 5, -1});
  ASSERT_EQ(la.layers.size(), lb.layers.size());
  for (size_t i = 0; i < la.layers.size(); ++i)
    for (size_t p = 0; p < la.layers[i].positions.size(); ++p) {
      EXPECT_EQ(la.layers[i].positions[p].target_prob, lb.layers[i].positions[p].target_prob) << "lens layer " << i;
      EXPECT_EQ(la.layers[i].positions[p].top[0].id, lb.layers[i].positions[p].top[0].id);
    }
  EXPECT_EQ(ds::outliers_json(ds::outlier_stats(*one)), ds::outliers_json(ds::outlier_stats(*two)));
  one->set_watch_max_abs_hidden(true);
  two->set_watch_max_abs_hidden(true);
  one->run();
  two->run();
  expect_same_floats(one->max_abs_hidden(), two->max_abs_hidden(), "max |h|");
  // Generation: the same greedy tokens and logits, one row handed between the blocks per step.
  ds::GenerateOptions g;
  g.max_new = 6;
  g.stop_at_eos = false;
  EXPECT_EQ(one->generate(g), two->generate(g));
  compare_sessions(*one, *two, "after generation");
}

TEST(SplitBackend, PlacementRefusesWhatDoesNotFitWithTheNumbers) {
  const ds::ModelConfig c = ds::load_model(demo())->cfg;
  ds::SplitOptions o;
  o.backends = {ds::BackendChoice::Cpu, ds::BackendChoice::Cpu};
  o.mem_limit = 1 << 20;  // 1 MiB each
  const std::string e = dstest::error_of([&] { ds::place_layers(c, o); });
  EXPECT_NE(e.find("does not fit the 2 devices"), std::string::npos) << e;
  EXPECT_NE(e.find("MiB"), std::string::npos) << e;
  EXPECT_NE(e.find("--gpu-mem-limit"), std::string::npos) << e;
  EXPECT_NE(dstest::error_of([&] { ds::Session::open(demo(), o.backends, nullptr, 1, o.mem_limit); }).find("does not fit"),
            std::string::npos);
  // Room for the whole model on the first device: one block, no split.
  o.mem_limit = 0;
  EXPECT_EQ(ds::place_layers(c, o).first.size(), 1u);
}

// The placement plans activations for the requested length (the prompt and what will be generated): a limit that
// holds the model on one device at 4096 tokens needs more at a longer length, and a Session opened for that length
// places it so.
TEST(SplitBackend, PlacementPlansForTheRequestedLength) {
  const ds::ModelConfig c = ds::load_model(demo())->cfg;
  ds::SplitOptions o;
  o.backends = {ds::BackendChoice::Cpu, ds::BackendChoice::Cpu, ds::BackendChoice::Cpu};
  o.mem_limit = limit_for_blocks(c, o.backends, 1);
  ASSERT_GT(o.mem_limit, 0);
  EXPECT_EQ(ds::place_layers(c, o).first.size(), 1u);
  ds::Placement p;
  for (int64_t t = 4096; t < 4 * 4096 && p.first.size() < 2; t += 256) {
    o.plan_tokens = t;
    p = ds::place_layers(c, o);  // (refused before it needs more than the three devices: the loop stops first)
  }
  ASSERT_GT(p.first.size(), 1u);
  EXPECT_LT(o.plan_tokens, 2 * 4096);
  auto s = ds::Session::open(demo(), o.backends, nullptr, 1, o.mem_limit, o.plan_tokens);
  EXPECT_EQ(s->backend().devices_used(), int(p.first.size())) << s->backend().name();
}

TEST(SplitBackendCuda, TwoGpusEqualOne) {
  if (ds::cuda_device_count() < 2) GTEST_SKIP() << "needs two usable CUDA GPUs (" << ds::cuda_device_count() << " here)";
  const ds::ModelConfig c = ds::load_model(demo())->cfg;
  const std::vector<ds::BackendChoice> gpus{{ds::BackendChoice::Kind::Cuda, 0}, {ds::BackendChoice::Kind::Cuda, 1}};
  const int64_t limit = limit_for_blocks(c, gpus, 2);
  ASSERT_GT(limit, 0);
  auto one = ds::Session::open(demo(), ds::BackendChoice::Cuda, nullptr, 0);
  auto two = ds::Session::open(demo(), gpus, nullptr, 0, limit);
  const std::vector<int32_t> ids = demo_ids(300);
  one->set_ids(ids);
  two->set_ids(ids);
  one->run();
  two->run();
  compare_sessions(*one, *two, "prompt");
  one->set_lambda_override(int(c.layers) - 1, 0.2);
  two->set_lambda_override(int(c.layers) - 1, 0.2);
  one->run();
  two->run();
  compare_sessions(*one, *two, "lambda");
  ds::GenerateOptions g;
  g.max_new = 8;
  g.stop_at_eos = false;
  EXPECT_EQ(one->generate(g), two->generate(g));
  compare_sessions(*one, *two, "after generation");
  const ds::Lens la = ds::logit_lens(*one, ds::LensRequest{{-1}, {}, 5, -1});
  const ds::Lens lb = ds::logit_lens(*two, ds::LensRequest{{-1}, {}, 5, -1});
  for (size_t i = 0; i < la.layers.size(); ++i)
    EXPECT_EQ(la.layers[i].positions[0].target_prob, lb.layers[i].positions[0].target_prob) << "lens layer " << i;
}

TEST(SplitBackend, BackendListsAndSizesParse) {
  using K = ds::BackendChoice::Kind;
  const auto two = ds::parse_backend_list("cuda:0,1");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_TRUE(two[0].kind == K::Cuda && two[0].device == 0 && two[1].kind == K::Cuda && two[1].device == 1);
  const auto same = ds::parse_backend_list("cuda:0,0");
  EXPECT_EQ(same.size(), 2u);
  const auto cpus = ds::parse_backend_list("cpu,cpu");
  EXPECT_TRUE(cpus.size() == 2 && cpus[1].kind == K::Cpu);
  EXPECT_EQ(ds::backend_list_text(two), "cuda:0,1");
  EXPECT_EQ(ds::parse_backend_list("cpu").size(), 1u);
  for (const char* bad : {"cpu,1", "cpu,,cpu", "cpu,auto", "gpu:0", ",cpu", "cuda:0,"})
    EXPECT_NE(dstest::error_of([&] { ds::parse_backend_list(bad); }), "") << bad;
  if (ds::cuda_device_count() == 0)
    EXPECT_NE(dstest::error_of([] { ds::parse_backend_list("cuda:all"); }).find("no usable CUDA device"), std::string::npos);
  EXPECT_EQ(ds::parse_size("20G", "--gpu-mem-limit"), int64_t(20) << 30);
  EXPECT_EQ(ds::parse_size("512M", "--gpu-mem-limit"), int64_t(512) << 20);
  EXPECT_EQ(ds::parse_size("1.5G", "--gpu-mem-limit"), int64_t(3) << 29);
  EXPECT_EQ(ds::parse_size("2097152", "--gpu-mem-limit"), int64_t(2) << 20);
  for (const char* bad : {"", "12", "20Q", "G", "-4G", "1e30T"})
    EXPECT_NE(dstest::error_of([&] { ds::parse_size(bad, "--gpu-mem-limit"); }).find("--gpu-mem-limit"), std::string::npos)
        << bad;
}

namespace {
// An environment variable set for a scope (the CUDA backend reads its switches when it is made).
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* v) : name(n), had(std::getenv(n) != nullptr) {
    if (had) old = std::getenv(n);
    setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

// Everything the comparison of two sessions covers, on the same ids: the prompt, a lambda re-run from a middle layer
// and from the last, interventions, the lens, outliers, the hidden-state reader and generation.
void compare_everything(ds::Session& one, ds::Session& two, int64_t n, const std::string& label) {
  SCOPED_TRACE(label);
  const ds::ModelConfig& c = one.config();
  const std::vector<int32_t> ids = demo_ids(n);
  one.set_ids(ids);
  two.set_ids(ids);
  one.run();
  two.run();
  compare_sessions(one, two, "prompt");
  for (int l : {1, int(c.layers) - 1}) {
    one.set_lambda_override(l, 0.3);
    two.set_lambda_override(l, 0.3);
    EXPECT_EQ(one.run(), two.run());
    compare_sessions(one, two, "lambda at layer " + std::to_string(l));
  }
  for (auto* s : {&one, &two}) {
    s->set_head_scale(1, 2, 0.f);
    s->set_head_mix(int(c.layers) - 2, 0, false, 0.f);
    s->add_knockout(ds::parse_knockout("all:-1:,5:9", int(c.layers)));
    s->run();
  }
  compare_sessions(one, two, "interventions");
  one.clear_interventions();
  two.clear_interventions();
  one.run();
  two.run();
  // Head importance: bulk re-runs that keep the ablated layer's attention output (its Q/K/V not written again)
  ds::HeadImportanceRequest hr;
  hr.modes = {"head", "a2"};
  EXPECT_EQ(ds::head_importance_json(ds::run_head_importance(one, hr)),
            ds::head_importance_json(ds::run_head_importance(two, hr)));
  compare_sessions(one, two, "after head importance");
  const ds::Lens la = ds::logit_lens(one, ds::LensRequest{{-1, 10}, {}, 5, -1});
  const ds::Lens lb = ds::logit_lens(two, ds::LensRequest{{-1, 10}, {}, 5, -1});
  ASSERT_EQ(la.layers.size(), lb.layers.size());
  for (size_t i = 0; i < la.layers.size(); ++i)
    for (size_t p = 0; p < la.layers[i].positions.size(); ++p)
      EXPECT_EQ(la.layers[i].positions[p].target_prob, lb.layers[i].positions[p].target_prob) << "lens layer " << i;
  EXPECT_EQ(ds::outliers_json(ds::outlier_stats(one)), ds::outliers_json(ds::outlier_stats(two)));
  one.set_watch_max_abs_hidden(true);
  two.set_watch_max_abs_hidden(true);
  one.run();
  two.run();
  expect_same_floats(one.max_abs_hidden(), two.max_abs_hidden(), "max |h|");
  one.set_watch_max_abs_hidden(false);
  two.set_watch_max_abs_hidden(false);
  ds::GenerateOptions g;
  g.max_new = 8;
  g.stop_at_eos = false;
  EXPECT_EQ(one.generate(g), two.generate(g));
  compare_sessions(one, two, "after generation");
  EXPECT_EQ(ds::outliers_json(ds::outlier_stats(one)), ds::outliers_json(ds::outlier_stats(two)));
}
}  // namespace

// Host caches (engine/cuda/backend_cuda_host_caches.cpp): every layer's stream and Q/K/V rows in host memory, two
// device slots of each, forced here with DS_HOST_CACHES=1 on one GPU and on a split of two blocks over it. Every
// result equals the device-resident backend's bit for bit (the same kernels on the same rows; the GEMM choice pinned).
TEST(SplitBackendCuda, HostCachesEqualDeviceResidentRows) {
  if (ds::cuda_device_count() < 1) GTEST_SKIP() << "needs a usable CUDA GPU (none here)";
  const ScopedEnv pin("DS_GEMM_AUTOTUNE", "0");
  const ds::ModelConfig c = ds::load_model(demo())->cfg;
  std::unique_ptr<ds::Session> host, split;
  {
    const ScopedEnv on("DS_HOST_CACHES", "1");
    host = ds::Session::open(demo(), ds::BackendChoice::Cuda, nullptr, 0);
    const std::vector<ds::BackendChoice> same{{ds::BackendChoice::Kind::Cuda, 0}, {ds::BackendChoice::Kind::Cuda, 0}};
    split = ds::Session::open(demo(), same, nullptr, 0, limit_for_blocks(c, same, 2));
  }
  compare_everything(*ds::Session::open(demo(), ds::BackendChoice::Cuda, nullptr, 0), *host, 300, "one GPU with host caches");
  EXPECT_NE(split->backend().name().find("layer split"), std::string::npos) << split->backend().name();
  compare_everything(*ds::Session::open(demo(), ds::BackendChoice::Cuda, nullptr, 0), *split, 257, "a split over cuda:0,0 with host caches");
  // The same split without them (the hand-off of bulk re-runs: each block's input copied before the previous block
  // runs again)
  const std::vector<ds::BackendChoice> same{{ds::BackendChoice::Kind::Cuda, 0}, {ds::BackendChoice::Kind::Cuda, 0}};
  compare_everything(*ds::Session::open(demo(), ds::BackendChoice::Cuda, nullptr, 0),
                     *ds::Session::open(demo(), same, nullptr, 0, limit_for_blocks(c, same, 2)), 257, "a split over cuda:0,0");
}

// A plan for more tokens than the device can hold every layer's rows of: the placement keeps them in host memory,
// says so, and the model runs.
TEST(SplitBackendCuda, PlacementWithHostCaches) {
  if (ds::cuda_device_count() < 1) GTEST_SKIP() << "needs a usable CUDA GPU (none here)";
  const ds::ModelConfig c = ds::load_model(demo())->cfg;
  ds::SplitOptions o;
  o.backends = {{ds::BackendChoice::Kind::Cuda, 0}};
  o.plan_tokens = 1 << 17;
  o.mem_limit = int64_t(1) << 40;
  const ds::Placement whole = ds::place_layers(c, o);
  ASSERT_FALSE(whole.host_caches);
  // A limit a third of the layers' rows below the device-resident need: the host-cached need (two slots of rows,
  // a third of six layers' rows) is below it.
  const size_t E = size_t(c.hidden), W = size_t((c.heads + 2 * c.kv_heads) * c.head_dim);
  const int64_t rows = int64_t(o.plan_tokens) * int64_t(E * 4 + W * 2) * c.layers;
  o.mem_limit = int64_t(whole.need.at(0)) - rows / 3 + (int64_t(768) << 20);
  ds::Placement p;
  try {
    p = ds::place_layers(c, o);
  } catch (const ds::Error& e) {
    GTEST_SKIP() << "this machine's host memory does not hold the plan: " << e.what();
  }
  EXPECT_TRUE(p.host_caches);
  EXPECT_NE(ds::placement_text(p, o.backends).find("in host memory"), std::string::npos) << ds::placement_text(p, o.backends);
  auto s = ds::Session::open(demo(), o.backends, nullptr, 0, o.mem_limit, o.plan_tokens);
  s->set_ids(demo_ids(100));
  s->run();
  EXPECT_EQ(s->result().logits.size(), size_t(c.vocab));
}

// Which models the host caches (and a split's plan for them) take: those whose every layer attends over its own keys
// and values. Phi-4-mini-flash (Mamba, GMU and cross-layer attention) is not one of them.
TEST(SplitBackend, HostCachesTakeSelfAttentionModelsOnly) {
  EXPECT_TRUE(ds::load_model(demo())->cfg.self_attention_only());
  EXPECT_TRUE(ds::load_model(dstest::fixture("motif_gda_d16_sharded_f32"))->cfg.self_attention_only());
  EXPECT_FALSE(ds::load_model(dstest::fixture("phi4flash_L8_gqa_bf16"))->cfg.self_attention_only());
}
