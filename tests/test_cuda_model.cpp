// The CUDA backend against the transformers fixtures (tests/gen_fixtures.py): logits, every layer's input, every
// map, and the lambda-override run, through ds::load_model and the Backend interface directly. Also: a lambda
// change re-run from a middle layer equals a full run, next-token-only runs (the last layer on the last row alone)
// agree with all-rows runs, on-demand maps equal the forward's, GPU head statistics
// agree with statistics of the returned maps, and user errors (bad ids, too-long prompts) are ds::Error.
//
// Tolerances: the backend keeps weights and GEMM inputs in bf16 (relative rounding 2^-9 per value) while
// the fixtures are f32 computations, so logits and hidden states are held to 2e-2 relative (||a-b||/||b||) and
// the post-softmax maps to 1e-2 absolute for checkpoints stored in bf16 (no weight rounding). Checkpoints stored in
// f32 also lose their weights' low bits; with these fixtures' deliberately sharp maps (logits up to ~10) that
// adds ~2^-9 x |logit| to a logit, i.e. up to ~1e-2 on a probability (0.0107 measured on diff_mha_d32_f32 on an
// H200, 2026-11-21), so those maps are held to 1.5e-2.
#include <gtest/gtest.h>

#ifndef DS_HAVE_CUDA
TEST(CudaModel, NotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#else

#include <cuda_runtime.h>

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <random>

#include "app/bench/synthetic_model.h"
#include "engine/core/backend.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/cuda/detail/backend_cuda_impl.h"
#include "engine/core/env.h"
#include "engine/core/error.h"
#include "engine/core/model.h"
#include "kernels/gemm_swiglu_sm90.h"
#include "kernels/attn_fwd_sm90.h"
#include "map_reference.h"
#include "engine/session/session.h"
#include "engine/session/session_outliers.h"
#include "test_util.h"
#include "test_cuda_util.h"

namespace {

constexpr double kLogitsRel = 2e-2, kMapsAbsBf16 = 1e-2, kMapsAbsF32 = 1.5e-2;
double kMapsAbs = kMapsAbsBf16;  // set per fixture from the checkpoint's dtype

using dstest::Expected;

void expect_maps(const ds::LayerMaps& m, const Expected& ex, const ds::ModelConfig& c, const std::string& prefix,
                 int l, const std::string& what) {
  const std::string p = prefix + "layers." + std::to_string(l) + ".";
  if (c.is_diff()) {
    const std::vector<float> a1 = ex.get(p + "attn1"), a2 = ex.get(p + "attn2");
    ASSERT_EQ(m.a1.size(), a1.size()) << what;
    ASSERT_EQ(m.a2.size(), a2.size()) << what;
    // Against a bf16 emulation ("bf16." keys), two bf16 computations differ as much as bf16 rounding moves this
    // fixture's maps: up to twice the emulation's own distance from float64 in this layer (each of the two is that
    // far from float64, in its own direction), when that exceeds kMapsAbs.
    double tol = kMapsAbs;
    if (prefix.rfind("bf16.", 0) == 0) {
      const std::string p64 = prefix.substr(5) + "layers." + std::to_string(l) + ".";
      for (const char* k : {"attn1", "attn2"}) {
        const std::vector<float> e = ex.get(p + k), f = ex.get(p64 + k);
        tol = std::max(tol, 2 * dstest::max_abs_err(e.data(), f.data(), e.size()));
      }
    }
    EXPECT_LT(dstest::max_abs_err(m.a1.data(), a1.data(), a1.size()), tol) << what << " " << p << "attn1";
    EXPECT_LT(dstest::max_abs_err(m.a2.data(), a2.data(), a2.size()), tol) << what << " " << p << "attn2";
  } else {
    const std::vector<float> a = ex.get(p + "attn");
    ASSERT_EQ(m.a1.size(), a.size()) << what;
    EXPECT_TRUE(m.a2.empty());
    EXPECT_LT(dstest::max_abs_err(m.a1.data(), a.data(), a.size()), kMapsAbs) << what << " " << p << "attn";
  }
}

// Relative tolerance of a logits or hidden-state tensor `key`: kLogitsRel, or against a bf16 emulation ("bf16."
// keys) twice the emulation's own distance from float64 when that is larger -- as expect_maps does for maps: two
// bf16 computations of a deep, deliberately sensitive fixture are each about that far from float64.
// (phi4flash_L12, 12 layers: the emulation is 0.038 from float64 in its logits, the GPU 0.026 from the emulation.)
double rel_tol(const Expected& ex, const std::string& bf, const std::string& key) {
  if (bf.empty()) return kLogitsRel;
  const std::vector<float> e = ex.get(bf + key), f = ex.get(key);
  return std::max(kLogitsRel, 2 * dstest::rel_err(e.data(), f.data(), e.size()));
}

class FixtureCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureCuda, MatchesTransformers) {
  SKIP_WITHOUT_DEVICE();
  const std::string dir = dstest::fixture(GetParam());
  Expected ex(dir);
  std::unique_ptr<ds::Model> model = ds::load_model(dir);
  const ds::ModelConfig c = model->cfg;
  const int L = int(c.layers);
  kMapsAbs = model->embed->dtype == ds::DType::BF16 ? kMapsAbsBf16 : kMapsAbsF32;
  auto be = ds::make_cuda_backend();
  EXPECT_EQ(be->kind(), "cuda");
  be->load(*model, nullptr);
  std::vector<float> model_lambda;
  for (int l = 0; l < L; ++l) model_lambda.push_back(c.is_diff() ? float(model->model_lambda[size_t(l)]) : 0.f);
  model.reset();  // the backend owns its copy of the weights

  ds::ForwardRequest req;
  req.ids = ex.ids();
  req.lambda = model_lambda;
  req.all_logits = true;
  req.keep_hidden = true;
  for (int l = 0; l < L; ++l) req.want_maps.push_back(c.has_maps(l));  // hybrids: attention layers only
  ds::ForwardResult r;
  be->forward(req, r);
  const std::vector<int64_t> map_layers = c.map_layers();
  // Fixtures from a float64 reference (Motif) also hold its bf16-engine emulation ("bf16." keys): with weights
  // perturbed to expose wrong formulas, bf16 rounding alone moves their maps past the tolerance, so a bf16 backend
  // is held to the emulation (logits and hidden states at the DiffLlama tolerance, maps as expect_maps says) and
  // its logits to float64 at twice the tolerance.
  const std::string bf = ex.has("bf16.logits") ? "bf16." : "";
  if (!bf.empty()) {
    const std::vector<float> l64 = ex.get("logits");
    EXPECT_LT(dstest::rel_err(r.logits.data(), l64.data(), l64.size()), 2 * kLogitsRel) << "logits (float64)";
  }
  const std::vector<float> logits = ex.get(bf + "logits");
  ASSERT_EQ(r.logits.size(), logits.size());
  EXPECT_EQ(r.logit_rows, int64_t(req.ids.size()));
  EXPECT_LT(dstest::rel_err(r.logits.data(), logits.data(), logits.size()), rel_tol(ex, bf, "logits")) << "logits";
  ASSERT_EQ(r.hidden.size(), size_t(L + 1));
  for (int l = 0; l <= L; ++l) {
    const std::vector<float> h = ex.get(bf + "hidden." + std::to_string(l));
    ASSERT_EQ(r.hidden[size_t(l)].size(), h.size());
    EXPECT_LT(dstest::rel_err(r.hidden[size_t(l)].data(), h.data(), h.size()),
              rel_tol(ex, bf, "hidden." + std::to_string(l)))
        << "hidden." << l;
  }
  for (int64_t l : map_layers) expect_maps(r.maps[size_t(l)], ex, c, bf, int(l), "forward maps");

  // Maps on demand equal the forward's; the profile covers every layer and head. Layers without attention have none.
  for (int l = 0; l < L; ++l)
    if (!c.has_maps(l)) {
      ds::LayerMaps m;
      EXPECT_THROW(be->layer_maps(l, m), ds::Error) << l;
      EXPECT_TRUE(r.maps[size_t(l)].empty()) << l;
    }
  for (int64_t l64 : map_layers) {
    const int l = int(l64);
    ds::LayerMaps m;
    be->layer_maps(l, m);
    ASSERT_EQ(m.a1.size(), r.maps[size_t(l)].a1.size());
    EXPECT_EQ(dstest::max_abs_err(m.a1.data(), r.maps[size_t(l)].a1.data(), m.a1.size()), 0.0) << "on-demand " << l;
  }
  if (!std::getenv("DS_CUDA_TEST_SMALL")) {  // the peak measurement (8192^3 GEMMs) is too slow under a sanitizer
    const ds::Profile prof = be->profile();
    EXPECT_EQ(prof.heads.size(), map_layers.size() * size_t(c.view_heads()));
    EXPECT_FALSE(prof.kernels.empty());
    EXPECT_GT(prof.peak_tflops, 0.0);
  }

  // GPU statistics agree with statistics of the returned maps (f64 on the host).
  const int mid = int(c.nearest_map_layer(L / 2));
  const std::vector<ds::HeadStats> st = be->head_stats(mid);
  ASSERT_EQ(st.size(), size_t(c.view_heads()));
  const ds::LayerMaps& mm = r.maps[size_t(mid)];
  const int64_t n = mm.n;
  for (int h = 0; h < int(mm.heads); ++h) {
    double ent = 0, first = 0, neg = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* a1 = mm.a1.data() + (size_t(h) * n + i) * n;
      const float* a2 = c.is_diff() ? mm.a2.data() + (size_t(h) * n + i) * n : nullptr;
      for (int64_t k = 0; k <= i; ++k) {
        if (a1[k] > 0) ent -= a1[k] * std::log(double(a1[k]));
        const double dd = a1[k] - (a2 ? double(model_lambda[size_t(mid)]) * a2[k] : 0.0);
        neg += std::max(0.0, -dd);
      }
      first += a1[0];
    }
    EXPECT_NEAR(st[size_t(h)].entropy1, ent / n, 1e-3) << "head " << h;
    EXPECT_NEAR(st[size_t(h)].first1, first / n, 1e-4) << "head " << h;
    EXPECT_NEAR(st[size_t(h)].neg_mass, neg / n, 1e-4) << "head " << h;
  }

  if (c.is_diff() && ex.has("override.lambda")) {
    // lambda forced into every layer (layer 0 gets 0: plain softmax attention); hybrids' fixtures give one value
    // per attention layer
    const std::vector<float> given = ex.get("override.lambda");
    std::vector<float> ov(size_t(L), 0.f);
    ASSERT_EQ(given.size(), map_layers.size());
    for (size_t i = 0; i < given.size(); ++i) ov[size_t(map_layers[i])] = given[i];
    req.lambda = ov;
    req.keep_hidden = false;
    be->forward(req, r);
    const std::vector<float> ol = ex.get(bf + "override.logits");
    EXPECT_LT(dstest::rel_err(r.logits.data(), ol.data(), ol.size()), rel_tol(ex, bf, "override.logits"))
        << "override.logits";
    for (int64_t l : map_layers) expect_maps(r.maps[size_t(l)], ex, c, bf + "override.", int(l), "override maps");

    // A lambda change in the last layer re-run from there equals the full run with the same lambda.
    std::vector<float> lam2 = ov;
    lam2[size_t(L - 1)] += 0.37f;
    ds::ForwardRequest q;
    q.ids = req.ids;
    q.lambda = lam2;
    q.all_logits = true;
    q.from_layer = L - 1;
    ds::ForwardResult partial, full;
    be->forward(q, partial);
    q.from_layer = 0;
    be->forward(q, full);
    ASSERT_EQ(partial.logits.size(), full.logits.size());
    EXPECT_EQ(dstest::max_abs_err(partial.logits.data(), full.logits.data(), full.logits.size()), 0.0)
        << "re-run from layer " << L - 1;
    if (req.ids.size() > 1)  // one token: O1 = O2 = v_0, and the inner RMS norm removes (1 - lambda)
      EXPECT_GT(dstest::max_abs_err(partial.logits.data(), r.logits.data(), full.logits.size()), 0.0)
          << "the lambda change must change the logits";

    // Next-token logits only: the last layer carries on with the last row alone after attention. Same logits as
    // the last row of the all-rows run (GEMMs of one row may pick other algorithms: rounding-level differences).
    q.all_logits = false;
    ds::ForwardResult last;
    be->forward(q, last);
    const int64_t V = c.vocab, n = int64_t(q.ids.size());
    ASSERT_EQ(last.logits.size(), size_t(V));
    EXPECT_LT(dstest::rel_err(last.logits.data(), full.logits.data() + (n - 1) * V, size_t(V)), 2e-3)
        << "rows-only last layer";
    // ... and a following request for every row re-runs the last layer in full, even when asked to start past it.
    q.all_logits = true;
    q.from_layer = L;
    ds::ForwardResult again;
    be->forward(q, again);
    ASSERT_EQ(again.logits.size(), full.logits.size());
    EXPECT_EQ(dstest::max_abs_err(again.logits.data(), full.logits.data(), full.logits.size()), 0.0)
        << "all rows after a rows-only run";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureCuda, ::testing::ValuesIn(dstest::all_fixtures()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Every attention kernel the dispatcher grants for a fixture's shape (forced through the backend's options, as
// DS_ATTN_KERNEL does) gives transformers' logits; the default choice is the first. The head_dim 64 fixtures reach
// the fused kernels (on Hopper the wgmma one for the DiffLlama and the Llama alike), the others the generic one.
TEST(CudaModel, EveryGrantedAttentionKernelMatchesTransformers) {
  SKIP_WITHOUT_DEVICE();
  int fused_runs = 0;
  for (const char* name : {"diff_gqa_d64_llama3_bf16_tied", "llama_tied_llama3_bf16", "diff_mha_d32_f32"}) {
    const std::string dir = dstest::fixture(name);
    Expected ex(dir);
    std::unique_ptr<ds::Model> model = ds::load_model(dir);
    const ds::ModelConfig c = model->cfg;
    auto be = ds::make_cuda_backend();
    ds::cuda::CudaBackend& cb = ds::cuda::as_cuda(*be);
    be->load(*model, nullptr);
    ds::ForwardRequest req;
    req.ids = ex.ids();
    for (int l = 0; l < int(c.layers); ++l) req.lambda.push_back(c.is_diff() ? float(model->model_lambda[size_t(l)]) : 0.f);
    req.all_logits = true;
    const std::vector<float> logits = ex.get("logits");
    for (ds::kern::AttnImpl impl : {ds::kern::AttnImpl::Auto, ds::kern::AttnImpl::Sm90, ds::kern::AttnImpl::MmaBoth,
                                    ds::kern::AttnImpl::MmaVsplit, ds::kern::AttnImpl::MmaLockstep,
                                    ds::kern::AttnImpl::Generic}) {
      ds::kern::AttnShape shape;
      shape.d = int(c.head_dim), shape.heads = int(c.heads), shape.kv_heads = int(c.kv_heads), shape.diff = c.is_diff();
      shape.n = int(req.ids.size());
      const ds::kern::AttnChoice choice = ds::kern::select_attn(cb.attn_device(), shape, {impl});
      if (choice.impl == ds::kern::AttnImpl::None) continue;
      cb.set_attn_options({impl});
      ds::ForwardResult r;
      be->forward(req, r);
      const std::string what = std::string(name) + " with " + ds::kern::attn_impl_name(choice.impl);
      ASSERT_EQ(r.logits.size(), logits.size()) << what;
      EXPECT_LT(dstest::rel_err(r.logits.data(), logits.data(), logits.size()), kLogitsRel) << what;
      if (impl == ds::kern::AttnImpl::Auto)
        std::printf("[   NOTE   ] %s: default attention kernel %s (%s)\n", name, ds::kern::attn_impl_name(choice.impl),
                    choice.why.c_str());
      fused_runs += choice.impl != ds::kern::AttnImpl::Generic;
    }
  }
  EXPECT_GT(fused_runs, 0) << "no fused kernel ran on this device";
}

// A prompt long enough for the fused gate/up + SwiGLU GEMM (Hopper only) through a random DiffLlama whose MLP has a
// multiple of 128 outputs: the fused path must have run and must match the two-kernel path (DS_SWIGLU_FUSED=0)
// in every layer's hidden states and the logits, up to the GEMMs' summation order.
TEST(CudaModel, FusedSwigluMatchesTheTwoKernelPath) {
  SKIP_WITHOUT_DEVICE();
  const auto* aligned = reinterpret_cast<const __nv_bfloat16*>(256);
  if (!ds::kern::gemm_swiglu_sm90_supported(aligned, 64, aligned, 128, 64, 128))
    GTEST_SKIP() << "the fused gate/up + SwiGLU GEMM needs an sm_90 device, this build's sm_90a code and the driver's "
                    "TMA encoder";
  const dstest::TempDir tmp;
  const std::string dir = tmp.str();
  ds::SyntheticShape shape;
  shape.layers = 3, shape.intermediate = 768, shape.vocab = 1024;
  ds::write_synthetic_model(dir, shape, 7);
  std::unique_ptr<ds::Model> model = ds::load_model(dir);
  ds::ForwardRequest req;
  std::mt19937 rng(5);
  for (int i = 0; i < 1500; ++i) req.ids.push_back(int32_t(rng() % uint32_t(shape.vocab)));
  for (int l = 0; l < int(shape.layers); ++l) req.lambda.push_back(float(model->model_lambda[size_t(l)]));
  req.keep_hidden = true;
  // The backend reads DS_SWIGLU_FUSED when it starts: one backend per setting.
  const char* outer = std::getenv("DS_SWIGLU_FUSED");
  const std::string saved = outer ? outer : "";
  const auto run = [&](const char* fused, ds::ForwardResult& r) {
    setenv("DS_SWIGLU_FUSED", fused, 1);
    auto be = ds::make_cuda_backend();
    if (outer) setenv("DS_SWIGLU_FUSED", saved.c_str(), 1);
    else unsetenv("DS_SWIGLU_FUSED");
    be->load(*model, nullptr);
    ds::cuda_set_profiling(*be, true);
    be->forward(req, r);
    bool ran = false;
    for (const ds::KernelTiming& k : be->profile().kernels) ran |= k.name == "gemm_gate_up_swiglu" && k.count > 0;
    return ran;
  };
  ds::ForwardResult two, fused;
  EXPECT_FALSE(run("0", two)) << "DS_SWIGLU_FUSED=0 must keep the two kernels";
  EXPECT_TRUE(run("1", fused)) << "the fused GEMM did not run";
  ASSERT_EQ(two.hidden.size(), size_t(shape.layers + 1));
  ASSERT_EQ(fused.hidden.size(), two.hidden.size());
  for (size_t l = 1; l < two.hidden.size(); ++l) {  // hidden[l]: the output of layer l - 1
    ASSERT_EQ(fused.hidden[l].size(), two.hidden[l].size());
    EXPECT_LT(dstest::rel_err(fused.hidden[l].data(), two.hidden[l].data(), two.hidden[l].size()), 1e-2)
        << "layer " << l - 1;
  }
  ASSERT_EQ(two.logits.size(), fused.logits.size());
  EXPECT_LT(dstest::rel_err(fused.logits.data(), two.logits.data(), two.logits.size()), kLogitsRel);
}

// The GEMM autotuner times a shape once per length bucket (core/length_bucket.h): every other length of the bucket
// takes the bucket's choice without timing (a corpus of mixed lengths timed the GEMMs of nearly every prompt when the
// choice was taken only where cuBLASLt's heuristic offered it again), and computes what the heuristic's choice does.
// A model shape no other test uses, so that nothing of it is timed before.
TEST(CudaModel, GemmTimingsOncePerLengthBucket) {
  SKIP_WITHOUT_DEVICE();
  if (!ds::env_switch("DS_GEMM_AUTOTUNE", true)) GTEST_SKIP() << "DS_GEMM_AUTOTUNE=0: nothing is timed";
  const dstest::TempDir tmp;
  const std::string dir = tmp.str();
  ds::SyntheticShape shape;
  shape.hidden = 320, shape.heads = 8, shape.kv_heads = 4, shape.layers = 2, shape.intermediate = 880;
  shape.vocab = 2000;
  ds::write_synthetic_model(dir, shape, 11);
  std::unique_ptr<ds::Model> model = ds::load_model(dir);
  ds::ForwardRequest req;
  for (int l = 0; l < int(shape.layers); ++l) req.lambda.push_back(float(model->model_lambda[size_t(l)]));
  std::mt19937 rng(3);
  const auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& x : v) x = int32_t(rng() % uint32_t(shape.vocab));
    return v;
  };
  auto be = ds::make_cuda_backend();
  be->load(*model, nullptr);
  ds::ForwardResult r;
  const auto run = [&](const std::vector<int32_t>& v) {
    req.ids = v;
    be->forward(req, r);
    return ds::cuda_gemm_timings();
  };
  const int64_t t0 = ds::cuda_gemm_timings();
  const int64_t t1 = run(ids(1100));  // the bucket of 1025..1152 tokens
  ASSERT_GT(t1, t0) << "the first length of a bucket times its GEMMs";
  const std::vector<int32_t> in_bucket = ids(1123);
  for (int n : {1030, 1077, 1152}) EXPECT_EQ(run(ids(n)), t1) << n << " tokens, in the bucket of 1100, timed again";
  EXPECT_EQ(run(in_bucket), t1);
  const std::vector<float> bucket_logits = r.logits;
  EXPECT_GT(run(ids(1200)), t1) << "1200 tokens: the next bucket";

  // The bucket's choice computes what the heuristic's first choice does (another summation order at most).
  const char* outer = std::getenv("DS_GEMM_AUTOTUNE");
  const std::string saved = outer ? outer : "";
  setenv("DS_GEMM_AUTOTUNE", "0", 1);
  auto plain = ds::make_cuda_backend();
  if (outer) setenv("DS_GEMM_AUTOTUNE", saved.c_str(), 1);
  else unsetenv("DS_GEMM_AUTOTUNE");
  plain->load(*model, nullptr);
  req.ids = in_bucket;
  ds::ForwardResult want;
  plain->forward(req, want);
  ASSERT_EQ(bucket_logits.size(), want.logits.size());
  EXPECT_LT(dstest::rel_err(bucket_logits.data(), want.logits.data(), want.logits.size()), 1e-2);
}

// The same on a Phi-4-mini-flash-shaped model (random weights, 1100 tokens): there the fused GEMMs also form the
// GMU layers' gate in in_proj's epilogue. Every layer's output of both paths, and the logits.
TEST(CudaModel, FusedGmuGateAndSwigluMatchTheTwoKernelPathOnSambaY) {
  SKIP_WITHOUT_DEVICE();
  const auto* aligned = reinterpret_cast<const __nv_bfloat16*>(256);
  if (!ds::kern::gemm_swiglu_sm90_supported(aligned, 64, aligned, 128, 64, 128))
    GTEST_SKIP() << "the fused GEMMs need an sm_90 device, this build's sm_90a code and the driver's TMA encoder";
  const ds::ModelConfig cfg = ds::parse_config_json(R"({"architectures": ["Phi4FlashForCausalLM"],
    "model_type": "phi4flash", "hidden_act": "silu", "hidden_size": 256, "intermediate_size": 512,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 4096, "mb_per_layer": 2, "num_attention_heads": 8,
    "num_hidden_layers": 8, "num_key_value_heads": 4, "sliding_window": 128, "tie_word_embeddings": true,
    "vocab_size": 512, "torch_dtype": "bfloat16"})", "test config");
  ds::ForwardRequest req;
  std::mt19937 rng(9);
  for (int i = 0; i < 1100; ++i) req.ids.push_back(int32_t(rng() % 512u));
  for (int l = 0; l < int(cfg.layers); ++l) req.lambda.push_back(float(cfg.lambda_init(l) + 0.05));
  req.keep_hidden = true;
  const char* outer = std::getenv("DS_SWIGLU_FUSED");
  const std::string saved = outer ? outer : "";
  const auto run = [&](const char* fused, ds::ForwardResult& r) {
    setenv("DS_SWIGLU_FUSED", fused, 1);
    ds::cuda::CudaBackend be;
    if (outer) setenv("DS_SWIGLU_FUSED", saved.c_str(), 1);
    else unsetenv("DS_SWIGLU_FUSED");
    be.load_random(cfg, 3);
    ds::cuda_set_profiling(be, true);
    be.forward(req, r);
    int fused_gemms = 0;
    for (const ds::KernelTiming& k : be.profile().kernels)
      fused_gemms += (k.name == "gemm_gate_up_swiglu" || k.name == "gemm_in_proj_gate") && k.count > 0;
    return fused_gemms;
  };
  ds::ForwardResult two, fused;
  EXPECT_EQ(run("0", two), 0) << "DS_SWIGLU_FUSED=0 must keep the two kernels";
  EXPECT_EQ(run("1", fused), 2) << "the fused MLP and GMU GEMMs did not both run";
  ASSERT_EQ(two.hidden.size(), size_t(cfg.layers + 1));
  ASSERT_EQ(fused.hidden.size(), two.hidden.size());
  for (size_t l = 1; l < two.hidden.size(); ++l) {
    ASSERT_EQ(fused.hidden[l].size(), two.hidden[l].size());
    EXPECT_LT(dstest::rel_err(fused.hidden[l].data(), two.hidden[l].data(), two.hidden[l].size()), 1e-2)
        << "layer " << l - 1 << " (" << ds::layer_kind_name(cfg.kind(int64_t(l - 1))) << ")";
  }
  ASSERT_EQ(two.logits.size(), fused.logits.size());
  EXPECT_LT(dstest::rel_err(fused.logits.data(), two.logits.data(), two.logits.size()), kLogitsRel);
}

// Map queries on the GPU (views pooled on the device, rows, statistics) against float64 references from the same
// backend's full maps (f32 arithmetic on both sides: 1e-5, as on the CPU), and against the CPU backend's queries
// on the same prompt (bf16 weights and Q/K here: the maps' tolerance).
TEST(CudaModel, MapQueriesMatchFloat64AndTheCpuBackend) {
  SKIP_WITHOUT_DEVICE();
  for (const char* name : {"diff_gqa_d64_llama3_bf16_tied", "llama_tied_llama3_bf16", "diff_mha_d32_f32", "diff_n1",
                           "motif_gqa_d64_bf16_tied", "motif_gda_kvrep2_bf16_tied", "phi4flash_L8_gqa_bf16"}) {
    const std::string dir = dstest::fixture(name);
    Expected ex(dir);
    auto gpu = ds::Session::open(dir, ds::BackendChoice::Cuda);
    auto cpu = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
    const ds::ModelConfig& c = gpu->config();
    const int first = int(c.nearest_map_layer(0));
    for (auto* s : {gpu.get(), cpu.get()}) {
      s->set_ids(ex.ids());
      if (c.is_diff()) s->set_lambda_override(first, 0.35);
      s->run();
    }
    std::vector<float> lam;
    for (int l = 0; l < c.layers; ++l) lam.push_back(float(gpu->effective_lambda(l)));
    double tol = c.layers && dstest::fixture(name).find("f32") != std::string::npos ? kMapsAbsF32 : kMapsAbsBf16;
    if (ex.has("bf16.logits"))  // the CPU computes the checkpoint's maps, the GPU a bf16 engine's: allow their gap
      for (int64_t l : c.map_layers())
        for (const char* m : {".attn1", ".attn2"}) {
          const std::vector<float> a = ex.get("layers." + std::to_string(l) + m),
                                   b = ex.get("bf16.layers." + std::to_string(l) + m);
          tol = std::max(tol, 2 * dstest::max_abs_err(a.data(), b.data(), a.size()));
        }
    for (bool fused : {true, false}) {  // views by the fused two-pass kernel (where it runs) and by the map kernels
      ds::cuda::as_cuda(gpu->backend()).set_fused_views(fused);
      const std::string what = std::string(name) + (fused ? " (CUDA, fused views)" : " (CUDA, chunked views)");
      dstest::expect_queries_match_maps(gpu->backend(), c, lam, 1e-5, what);
      for (int64_t l : c.map_layers())
        for (ds::Pool pool : {ds::Pool::Mean, ds::Pool::Max}) {
          ds::ViewRequest q;
          q.layer = l, q.rows = 7, q.cols = 5, q.pool = pool;
          ds::MapView a, b;
          gpu->backend().map_view(q, a);
          cpu->backend().map_view(q, b);
          ASSERT_EQ(a.a1.size(), b.a1.size());
          for (size_t i = 0; i < a.a1.size(); ++i) {
            EXPECT_NEAR(a.a1[i], b.a1[i], tol) << what << " layer " << l;
            // max pooling keeps D's entry of largest magnitude with its sign: on a near tie of opposite signs the
            // two backends may keep different entries, so the magnitude is what must agree
            const float da = pool == ds::Pool::Max ? std::fabs(a.diff[i]) : a.diff[i];
            const float db = pool == ds::Pool::Max ? std::fabs(b.diff[i]) : b.diff[i];
            EXPECT_NEAR(da, db, tol * (1 + std::fabs(a.lambda))) << what << " layer " << l;
          }
        }
    }
    ds::cuda::as_cuda(gpu->backend()).set_fused_views(true);
    for (int64_t l64 : c.map_layers()) {
      const int l = int(l64);
      const std::vector<ds::HeadStats> sa = gpu->backend().head_stats(l), sb = cpu->backend().head_stats(l);
      for (size_t h = 0; h < sa.size(); ++h) {
        EXPECT_NEAR(sa[h].max_logit1, sb[h].max_logit1, 2e-2 * (1 + std::fabs(sb[h].max_logit1))) << name;
        EXPECT_NEAR(sa[h].first1, sb[h].first1, tol) << name;
      }
    }
  }
}

// The implicit attention of the Mamba layers (Backend::mamba_view) on the GPU against the reference's bf16-engine
// emulation of the same maps ("bf16." keys; f32 fixtures too, whose weights the GPU holds in bf16), within twice the
// emulation's own distance from float64 or 3 % of the channel's largest |M|, whichever is larger. (M exponentiates
// sums of the scan's steps: the bf16 engines' small differences in a layer's input move it more than they move the
// attention maps; measured on the H100: up to 2.0 % of the largest |M| from the emulation.)
TEST(CudaModel, MambaImplicitAttentionMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  for (const char* name : {"phi4flash_L8_mha_f32", "phi4flash_L8_gqa_bf16", "phi4flash_L12_gqa_sharded_f32"}) {
    const std::string dir = dstest::fixture(name);
    Expected ex(dir);
    auto s = ds::Session::open(dir, ds::BackendChoice::Cuda);
    s->set_ids(ex.ids());
    s->run();
    const ds::ModelConfig& c = s->config();
    int views = 0;
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".implicit";
      if (!ex.has(p)) continue;
      const std::vector<float> f64 = ex.get(p), emu = ex.get("bf16." + p), channels = ex.get(p + "_channels");
      const size_t nn = f64.size() / channels.size();
      for (size_t ci = 0; ci < channels.size(); ++ci) {  // each channel against its own scale and emulation gap
        const std::vector<float> e(emu.begin() + ci * nn, emu.begin() + (ci + 1) * nn);
        double scale = 0;
        for (size_t i = ci * nn; i < (ci + 1) * nn; ++i) scale = std::max(scale, double(std::fabs(f64[i])));
        const double rel = std::max(3e-2, 2 * dstest::max_abs_err(f64.data() + ci * nn, e.data(), nn) / scale);
        views += dstest::expect_implicit_views(s->backend(), l, {channels[ci]}, e, int64_t(ex.ids().size()), rel,
                                               std::string(name) + " (CUDA)");
      }
    }
    EXPECT_GT(views, 0) << name;
  }
}

TEST(CudaModel, UnknownAttentionOverrideIsAnError) {
  SKIP_WITHOUT_DEVICE();
  for (auto [var, value] : {std::pair{"DS_ATTN_KERNEL", "fastest"}, std::pair{"DS_ATTN_FIXMAX", "2"}}) {
    const char* old = std::getenv(var);
    const std::string saved = old ? old : "";
    setenv(var, value, 1);
    try {
      ds::make_cuda_backend();
      ADD_FAILURE() << "an unknown " << var << " was accepted";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(var) + "=" + value), std::string::npos) << e.what();
    }
    if (old) setenv(var, saved.c_str(), 1);
    else unsetenv(var);
  }
}

TEST(CudaModel, UserErrorsAreErrors) {
  SKIP_WITHOUT_DEVICE();
  std::unique_ptr<ds::Model> model = ds::load_model(dstest::fixture("diff_mha_d32_f32"));
  auto be = ds::make_cuda_backend();
  be->load(*model, nullptr);
  ds::ForwardRequest req;
  req.lambda.assign(size_t(model->cfg.layers), 0.5f);
  ds::ForwardResult r;
  EXPECT_THROW(be->forward(req, r), ds::Error) << "empty prompt";
  req.ids = {1, 2, int32_t(model->cfg.vocab)};
  EXPECT_THROW(be->forward(req, r), ds::Error) << "id outside the vocabulary";
  const int64_t limit = be->max_tokens();
  ASSERT_GT(limit, 1000);
  req.ids.assign(size_t(limit) + 1, 1);
  try {
    be->forward(req, r);
    ADD_FAILURE() << "a prompt longer than max_tokens() must be refused";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("too long"), std::string::npos) << e.what();
  }
  req.ids = {1, 5, 9};
  req.lambda.assign(1, 0.5f);  // wrong count
  EXPECT_THROW(be->forward(req, r), ds::Error);
  ds::LayerMaps m;
  EXPECT_THROW(be->layer_maps(99, m), ds::Error);
  // the backend still works after the errors
  req.lambda.assign(size_t(model->cfg.layers), 0.5f);
  be->forward(req, r);
  EXPECT_EQ(r.logits.size(), size_t(model->cfg.vocab));
  for (float x : r.logits) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
// The hidden states' outlier statistics with the selection on the device (every pass and RankFinder step queued, one
// wait) equal, float for float, the host's RankFinder over the same backend's counts (a round trip a pass), on
// prompts of a few tokens to a few hundred, on families with and without differential heads and with Mamba layers.
TEST(CudaModel, OutlierSelectionOnTheDeviceEqualsTheHosts) {
  SKIP_WITHOUT_DEVICE();
  for (const char* name : {"diff_gqa_d64_llama3_bf16_tied", "llama_tied_llama3_bf16", "phi4flash_L8_gqa_bf16"}) {
    const std::string dir = dstest::fixture(name);
    auto s = ds::Session::open(dir, ds::BackendChoice::Cuda);
    std::mt19937 g(7);
    for (int n : {1, 3, 40, 200}) {  // (the fixtures allow 256 positions)
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int32_t& x : ids) x = int32_t(g() % uint32_t(std::min<int64_t>(s->config().vocab, 200)));
      s->set_ids(ids);
      s->run();
      ds::OutlierRequest dev, host;
      dev.logits = host.logits = false;
      host.device_select = false;
      const ds::Outliers a = ds::outlier_stats(*s, dev), b = ds::outlier_stats(*s, host);
      EXPECT_EQ(ds::outliers_json(a), ds::outliers_json(b)) << name << " n " << n;
      ASSERT_EQ(a.layers.size(), size_t(s->config().layers));
      for (size_t l = 0; l < a.layers.size(); ++l) EXPECT_EQ(a.layers[l].hidden.top100, b.layers[l].hidden.top100);
      EXPECT_EQ(a.hidden.top100, b.hidden.top100);
      EXPECT_EQ(a.layers[0].hidden.top100.size(), size_t(std::min<int64_t>(100, n * s->config().hidden)));
    }
  }
}

// The logits' outlier passes on the fused Hopper kernel (kern::launch_logit_pass_sm90, the default where it runs)
// against the batched GEMM's rows (DS_OUTLIER_LOGITS_FUSED=0): the same products summed in another order, so every
// statistic agrees to f32 rounding; the hidden states' are the same floats. Differential and plain heads, d = 64 and
// 128, prompts of one query block and of several with a partial last one.
TEST(CudaModel, OutlierLogitPassesFusedEqualTheGemmRows) {
  SKIP_WITHOUT_DEVICE();
  struct Model {
    std::string dir;
    int n;
  };
  std::vector<Model> models;
  for (const char* name : {"diff_gqa_d64_llama3_bf16_tied", "llama_tied_llama3_bf16", "motif_gqa_d64_bf16_tied"})
    models.push_back({dstest::fixture(name), 200});
  for (bool diff : {true, false}) {
    ds::SyntheticShape shape;
    shape.diff = diff, shape.hidden = diff ? 512 : 256, shape.layers = 2, shape.heads = 4, shape.kv_heads = 2;
    shape.head_dim = diff ? 128 : 64, shape.intermediate = 256, shape.vocab = 512, shape.max_positions = 1024;
    const std::string dir = ::testing::TempDir() + "/logit_pass_model_" + (diff ? "diff" : "plain");
    ds::write_synthetic_model(dir, shape);
    models.push_back({dir, 700});
  }
  const int64_t launches0 = ds::cuda_logit_pass_launches();
  for (const Model& mdl : models) {
    auto s = ds::Session::open(mdl.dir, ds::BackendChoice::Cuda);
    setenv("DS_OUTLIER_LOGITS_FUSED", "0", 1);
    auto w = ds::Session::open(mdl.dir, ds::BackendChoice::Cuda);
    unsetenv("DS_OUTLIER_LOGITS_FUSED");
    std::mt19937 g(3);
    std::vector<int32_t> ids(static_cast<size_t>(mdl.n));
    for (int32_t& x : ids) x = int32_t(g() % uint32_t(std::min<int64_t>(s->config().vocab, 200)));
    s->set_ids(ids);
    s->run();
    w->set_ids(ids);
    w->run();
    const ds::Outliers a = ds::outlier_stats(*s), b = ds::outlier_stats(*w);
    ASSERT_EQ(a.layers.size(), b.layers.size());
    auto near = [&](const ds::OutlierSet& x, const ds::OutlierSet& y, const std::string& what) {
      ASSERT_EQ(x.top100.size(), y.top100.size()) << what;
      EXPECT_EQ(x.s.count, y.s.count) << what;
      for (size_t i = 0; i < x.top100.size(); ++i)
        EXPECT_NEAR(x.top100[i], y.top100[i], 2e-5 * (1 + std::fabs(y.top100[i]))) << what << " rank " << i;
      EXPECT_NEAR(x.s.median, y.s.median, 2e-5 * (1 + std::fabs(y.s.median))) << what;
    };
    for (size_t l = 0; l < a.layers.size(); ++l) {
      const std::string what = mdl.dir + " layer " + std::to_string(l);
      EXPECT_EQ(a.layers[l].hidden.top100, b.layers[l].hidden.top100) << what;
      ASSERT_EQ(a.layers[l].has_logits, b.layers[l].has_logits) << what;
      if (!a.layers[l].has_logits) continue;
      near(a.layers[l].logit1, b.layers[l].logit1, what + " map 1");
      if (a.differential) near(a.layers[l].logit2, b.layers[l].logit2, what + " map 2");
    }
    near(a.logit1, b.logit1, mdl.dir + " model map 1");
    if (a.differential) near(a.logit2, b.logit2, mdl.dir + " model map 2");
  }
  if (ds::kern::attn_fwd_sm90_code_runs() && ds::kern::attn_tma_encoder_available())
    EXPECT_GT(ds::cuda_logit_pass_launches(), launches0) << "the fused logit pass did not run on this Hopper GPU";
  else
    EXPECT_EQ(ds::cuda_logit_pass_launches(), launches0);
}

// Where the hidden states' outlier statistics spend their time (DS_OUTLIER_PERF=1; skipped otherwise): a random
// checkpoint of kajuma's hidden size and depth at 4096 tokens, the whole call (session to summary) with the selection
// on the device and on the host, against the forward, medians of 21; and the whole call with the logits in steps of
// several layers (OutlierRequest::min_step_ms, the default) and of one.
TEST(CudaModel, OutlierSelectionTimes) {
  SKIP_WITHOUT_DEVICE();
  if (!std::getenv("DS_OUTLIER_PERF")) GTEST_SKIP() << "set DS_OUTLIER_PERF=1 to time the outlier statistics";
  const std::string dir = ::testing::TempDir() + "/outlier_perf_model";
  ds::SyntheticShape shape;
  shape.hidden = 2048, shape.layers = 16, shape.heads = 32, shape.kv_heads = 8, shape.head_dim = 64;
  shape.intermediate = 1024, shape.vocab = 4096, shape.max_positions = 4096;
  ds::write_synthetic_model(dir, shape);
  auto s = ds::Session::open(dir, ds::BackendChoice::Cuda);
  setenv("DS_OUTLIER_COMPACT", "0", 1);  // a second session whose later passes read the whole hidden states
  auto w = ds::Session::open(dir, ds::BackendChoice::Cuda);
  unsetenv("DS_OUTLIER_COMPACT");
  std::vector<int32_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 2654435761u) % 4096u);
  s->set_ids(ids);
  s->run();
  w->set_ids(ids);
  w->run();
  auto median_ms = [](auto&& f) {
    std::vector<double> t;
    for (int k = 0; k < 21; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  ds::OutlierRequest dev, host;
  dev.logits = host.logits = false;
  host.device_select = false;
  ds::outlier_stats(*s, dev);
  ds::outlier_stats(*w, dev);
  EXPECT_EQ(ds::outliers_json(ds::outlier_stats(*s, dev)), ds::outliers_json(ds::outlier_stats(*w, dev)));
  const double d = median_ms([&] { ds::outlier_stats(*s, dev); });
  const double dw = median_ms([&] { ds::outlier_stats(*w, dev); });
  ds::Backend::HiddenSelection hs;
  const double b = median_ms([&] { s->backend().outlier_hidden_select(hs); });
  const double h = median_ms([&] { ds::outlier_stats(*s, host); });
  const double j = median_ms([&] { (void)ds::outliers_json(ds::outlier_stats(*s, dev)); });
  float lam = 1.f;
  const double f = median_ms([&] {
    lam = lam == 1.f ? 1.001f : 1.f;
    s->set_lambda_scale(lam);
    s->run();
  });
  std::printf("[ outliers(hidden) at 4096 x 2048 x 16 layers: device selection %.3f ms (the backend's call %.3f; with "
              "JSON %.3f; every pass over the whole states %.3f), host %.3f ms; a next-token forward of this checkpoint "
              "%.2f ms ]\n", d, b, j, dw, h, f);
  // With the logits: steps of several layers while they are quick (the default), and one layer a step, in turn.
  ds::OutlierRequest lg, one;
  one.min_step_ms = 0;
  EXPECT_EQ(ds::outliers_json(ds::outlier_stats(*s, lg)), ds::outliers_json(ds::outlier_stats(*s, one)));
  std::vector<double> tl, t1;
  for (int k = 0; k < 11; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    ds::outlier_stats(*s, lg);
    tl.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    t0 = std::chrono::steady_clock::now();
    ds::outlier_stats(*s, one);
    t1.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(tl.begin(), tl.end());
  std::sort(t1.begin(), t1.end());
  std::printf("[ outliers(logits) at 4096 tokens: %.2f ms in steps of several layers, %.2f ms a layer a step; medians "
              "of 11 in turn ]\n", tl[5], t1[5]);
  SUCCEED();
}

#endif
