// The one forward's hook points (engine/core/forward.h) through their first reader, the paper's Table 5 statistic: per
// layer the largest |hidden state| of the layer's output over the sequence (Session::max_abs_hidden). Checked on
// every family and both backends against the layer outputs the same backend hands out (ForwardResult::hidden, read
// here in double): after a prompt, after a lambda change that re-runs only the upper layers, and after generated
// positions (against a full forward over the whole sequence). Also: the reader off leaves nothing and is refused, the
// hook point order and sites of one forward, and the device reduction (kernels/elementwise.h launch_max_abs) against
// the host on fresh random inputs with strides, poisoned slots and a NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/core/forward.h"
#include "engine/session/session.h"
#include "test_util.h"

#ifdef DS_HAVE_CUDA
#include "kernels/elementwise.h"
#include "test_cuda_util.h"
#endif

namespace {

using dstest::fixture;

const char* const kFamilies[] = {"diff_llama3_f32", "llama_gqa_d32_f32", "motif_mha_d32_f32", "phi4flash_L8_mha_f32"};

// Per layer, max |h| over every row of the layer's output (hidden[l + 1]) of a full forward of a fresh session (so
// that the session under test keeps its own last forward) over `ids` with the lambda overrides of `like`.
std::vector<double> reference(const std::string& dir, ds::BackendChoice b, const ds::Session& like) {
  auto t = ds::Session::open(dir, b, nullptr, 2);
  const int L = int(t->config().layers);
  ds::ForwardRequest req;
  req.ids = like.ids();
  for (int l = 0; l < L; ++l) req.lambda.push_back(float(like.effective_lambda(l)));
  req.keep_hidden = true;
  ds::ForwardResult r;
  t->backend().forward(req, r);
  std::vector<double> m(size_t(L), 0.0);
  for (int l = 0; l < L; ++l)
    for (float x : r.hidden.at(size_t(l + 1))) m[size_t(l)] = std::max(m[size_t(l)], std::fabs(double(x)));
  return m;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t l = 0; l < want.size(); ++l) {
    EXPECT_TRUE(std::isfinite(got[l])) << what << " layer " << l;
    EXPECT_GT(want[l], 0.0) << what << " layer " << l;
    EXPECT_LE(std::fabs(double(got[l]) - want[l]), rel * want[l]) << what << " layer " << l << ": " << got[l]
                                                                   << " vs " << want[l];
  }
}

// The reader on one fixture and backend: prompt (the same values the backend's own layer outputs hold: exact up to
// `rel`), a lambda change re-running the upper layers, generated positions (against a fresh session's full forward
// over the whole sequence, `gen_rel`: a decoding step's rows round differently from the prompt's).
void check_reader(const std::string& f, ds::BackendChoice b, double rel, double gen_rel) {
  SCOPED_TRACE(f);
  auto s = ds::Session::open(fixture(f), b, nullptr, 2);
  const ds::ModelConfig& c = s->config();
  s->set_ids({1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11, 12});
  EXPECT_THROW(s->max_abs_hidden(), ds::Error);  // off
  s->run();
  EXPECT_TRUE(s->backend().layer_max_abs().empty()) << "a forward without hooks leaves no slots";
  s->set_watch_max_abs_hidden(true);
  EXPECT_EQ(s->stale_from(), 0) << "turning the reader on re-runs every layer";
  EXPECT_THROW(s->max_abs_hidden(), ds::Error);  // on, not run yet
  s->run();
  const std::vector<float> got = s->max_abs_hidden();
  expect_close(got, reference(fixture(f), b, *s), rel, "prompt");

  if (c.is_diff()) {  // a lambda change re-runs from its layer; the slots below keep their values
    const int layer = int(c.map_layers().back());
    s->set_lambda_override(layer, 1.7);
    EXPECT_EQ(s->run(), layer);
    const std::vector<float> after = s->max_abs_hidden();
    for (int l = 0; l < layer; ++l) EXPECT_EQ(after[size_t(l)], got[size_t(l)]) << "layer " << l << " did not run";
    expect_close(after, reference(fixture(f), b, *s), rel, "lambda change");
  }

  ds::GenerateOptions g;
  g.max_new = 5;
  g.stop_at_eos = false;
  s->generate(g);
  ASSERT_GT(s->ids().size(), size_t(12));
  const std::vector<float> gen = s->max_abs_hidden();
  expect_close(gen, reference(fixture(f), b, *s), gen_rel, "after generation");
  // Back to the prompt: the values are the prompt's again, not the cut positions' (a larger max would stay).
  s->clear_generation();
  ASSERT_EQ(s->ids().size(), size_t(12));
  expect_close(s->max_abs_hidden(), reference(fixture(f), b, *s), rel, "after clear_generation");

  s->set_watch_max_abs_hidden(false);
  EXPECT_THROW(s->max_abs_hidden(), ds::Error);
}

TEST(ForwardHooks, MaxAbsHiddenCpu) {
  for (const char* f : kFamilies) check_reader(f, ds::BackendChoice::Cpu, 0.0, 1e-5);
}

// Generation cut back to a short prompt: the slots must forget the cut positions (20 of 23 here; on at least one
// family some layer's largest value came from them, so a stale slot would show).
TEST(ForwardHooks, MaxAbsHiddenForgetsCutPositions) {
  int grew_somewhere = 0;
  for (const char* f : {"diff_llama3_f32", "llama_gqa_d32_f32", "motif_mha_d32_f32", "motif_gqa_d64_bf16_tied"}) {
    SCOPED_TRACE(f);
    auto s = ds::Session::open(fixture(f), ds::BackendChoice::Cpu, nullptr, 2);
    s->set_ids({1, 5, 9});
    s->set_watch_max_abs_hidden(true);
    s->run();
    const std::vector<float> prompt = s->max_abs_hidden();
    ds::GenerateOptions g;
    g.max_new = 20;
    g.stop_at_eos = false;
    s->generate(g);
    const std::vector<float> longer = s->max_abs_hidden();
    for (size_t l = 0; l < prompt.size(); ++l) grew_somewhere += longer[l] > prompt[l];
    s->clear_generation();
    EXPECT_EQ(s->max_abs_hidden(), prompt);
  }
  EXPECT_GT(grew_somewhere, 0) << "no layer's max came from generated positions: a stale slot would not show";
}

// The sites and order of the hook points in one forward, on a recording Ops wrapper around no backend: a layer of
// each kind. The forward's sequence of operations is what this file's other tests run through both backends.
struct Recorder final : ds::fwd::Ops {
  std::vector<std::string> log;
  void embed() override { log.push_back("embed"); }
  void norm(int l, ds::fwd::Norm, ds::fwd::Ref, ds::fwd::Ref) override { log.push_back("norm" + std::to_string(l)); }
  void linear(const ds::fwd::Linear& op) override { log.push_back(std::string(ds::fwd::gemm_name(op.w))); }
  void rope(int) override { log.push_back("rope"); }
  void attention(int, float, ds::fwd::Rows r, const ds::fwd::AttnEdit*) override {
    log.push_back(r == ds::fwd::Rows::Last ? "attention(last)" : "attention");
  }
  void conv(int) override { log.push_back("conv"); }
  void scan(int, bool memory) override { log.push_back(memory ? "scan(memory)" : "scan"); }
  void max_abs(ds::fwd::Ref in, int slot) override {
    log.push_back("max_abs" + std::to_string(slot) + (in.rows == ds::fwd::Rows::Last ? "(last)" : ""));
  }
  void mean_columns(ds::fwd::Ref t, int64_t c0, int64_t c1, int slot) override {
    log.push_back("mean" + std::to_string(t.layer) + ":" + std::to_string(c0) + "-" + std::to_string(c1) + "@" +
                  std::to_string(slot));
  }
  void scale_columns(ds::fwd::Ref t, int64_t c0, int64_t c1, float f) override {
    log.push_back("scale" + std::to_string(t.layer) + ":" + std::to_string(c0) + "-" + std::to_string(c1) + "x" +
                  std::to_string(f));
  }
};

TEST(ForwardHooks, SitesAndOrder) {
  ds::ModelConfig c = ds::load_config(fixture("phi4flash_L8_mha_f32") + "/config.json");
  std::vector<float> lam(size_t(c.layers), 0.5f);
  Recorder plain;
  ds::fwd::Plan p;
  p.lambda = lam.data();
  p.last_rows_only = true;
  ds::fwd::run_layers(c, plain, p);
  // Without hooks: no reader op, and the last layer carries its last row only.
  for (const std::string& e : plain.log) EXPECT_EQ(e.find("max_abs"), std::string::npos);
  EXPECT_NE(std::find(plain.log.begin(), plain.log.end(), "attention(last)"), plain.log.end());
  // With the reader: one max_abs per layer right after the layer's MLP, every row (so no rows-only last layer).
  ds::fwd::Hooks h;
  h.add(ds::fwd::max_abs_hidden_hook());
  p.hooks = &h;
  Recorder read;
  ds::fwd::run_layers(c, read, p);
  int seen = 0;
  for (size_t i = 0; i < read.log.size(); ++i)
    if (read.log[i].rfind("max_abs", 0) == 0) {
      EXPECT_EQ(read.log[i], "max_abs" + std::to_string(seen)) << "slot = layer, all rows";
      EXPECT_EQ(read.log[i - 1], "gemm_down") << "after the MLP's residual add";
      ++seen;
    }
  EXPECT_EQ(seen, int(c.layers));
  EXPECT_EQ(std::find(read.log.begin(), read.log.end(), "attention(last)"), read.log.end());
  EXPECT_EQ(read.log.size(), plain.log.size() + size_t(c.layers));  // nothing else changed
  // Every layer kind's block appears: Mamba (and the memory layer's scan), GMU, attention.
  EXPECT_NE(std::find(read.log.begin(), read.log.end(), "scan(memory)"), read.log.end());
  EXPECT_NE(std::find(read.log.begin(), read.log.end(), "gemm_x_proj"), read.log.end());
  EXPECT_NE(std::find(read.log.begin(), read.log.end(), "gemm_q"), read.log.end());  // cross-attention: queries only
}

#ifdef DS_HAVE_CUDA
TEST(ForwardHooks, MaxAbsHiddenCuda) {
  SKIP_WITHOUT_DEVICE();
  // Another session's forward may pick other GEMM algorithms (autotuned): 1e-2 relative; decoded rows are GEMV
  // products in bf16, a forward's GEMM products: 3e-2.
  for (const char* f : kFamilies) check_reader(f, ds::BackendChoice::Cuda, 1e-2, 3e-2);
}

TEST(ForwardHooks, MaxAbsKernel) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto [rows, cols, ld] : {std::tuple{1, 8, 8}, {7, 100, 128}, {300, 2048, 2048}, {5000, 64, 96}, {3, 4097, 5000}}) {
    std::vector<float> x(size_t(rows) * size_t(ld));
    for (float& v : x) v = nd(rng);
    double want = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) want = std::max(want, std::fabs(double(x[size_t(r) * size_t(ld) + size_t(c)])));
    for (int r = 0; r < rows; ++r)  // outside cols: larger values the kernel must not read
      for (int c = cols; c < ld; ++c) x[size_t(r) * size_t(ld) + size_t(c)] = 1e6f;
    auto dx = to_device(x);
    const float start = float(want) * 0.5f;  // an earlier, smaller value: replaced
    auto slot = to_device(std::vector<float>{start});
    ASSERT_EQ(ds::kern::launch_max_abs(dx.as<float>(), ld, rows, cols, slot.as<float>(), nullptr), cudaSuccess);
    EXPECT_EQ(double(to_host<float>(slot, 1)[0]), want) << rows << "x" << cols;
    auto bigger = to_device(std::vector<float>{float(want) * 2.f});  // an earlier, larger value: kept
    ASSERT_EQ(ds::kern::launch_max_abs(dx.as<float>(), ld, rows, cols, bigger.as<float>(), nullptr), cudaSuccess);
    EXPECT_EQ(double(to_host<float>(bigger, 1)[0]), double(float(want) * 2.f));
  }
  {  // several tensors a stride apart in one launch (the reader's sites of a whole forward), each into its own slot
    const int count = 5, rows = 33, cols = 256, ld = 260;
    const int64_t stride = int64_t(rows) * ld + 12;
    std::vector<float> y(size_t(stride) * count);
    for (float& v : y) v = nd(rng);
    auto dy = to_device(y);
    std::vector<float> start(count, 0.f);
    start[2] = 1e9f;  // an earlier larger value stays
    auto slots = to_device(start);
    ASSERT_EQ(ds::kern::launch_max_abs_many(dy.as<float>(), stride, count, ld, rows, cols, slots.as<float>(), nullptr),
              cudaSuccess);
    const std::vector<float> got = to_host<float>(slots, count);
    for (int t = 0; t < count; ++t) {
      double want = t == 2 ? 1e9 : 0.0;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          want = std::max(want, std::fabs(double(y[size_t(t * stride + int64_t(r) * ld + c)])));
      EXPECT_EQ(double(got[size_t(t)]), want) << "tensor " << t;
    }
  }
  {  // an address that is not 16-byte aligned: the scalar path
    std::vector<float> y(256);
    for (float& v : y) v = nd(rng);
    double want = 0;
    for (int i = 1; i < 1 + 3 * 64; ++i) want = std::max(want, std::fabs(double(y[size_t(i)])));
    auto dy = to_device(y);
    auto slot = to_device(std::vector<float>{0.f});
    ASSERT_EQ(ds::kern::launch_max_abs(dy.as<float>() + 1, 64, 3, 64, slot.as<float>(), nullptr), cudaSuccess);
    EXPECT_EQ(double(to_host<float>(slot, 1)[0]), want) << "unaligned";
  }
  std::vector<float> x(64, 1.f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  auto dx = to_device(x);
  auto slot = to_device(std::vector<float>{0.f});
  ASSERT_EQ(ds::kern::launch_max_abs(dx.as<float>(), 64, 1, 64, slot.as<float>(), nullptr), cudaSuccess);
  EXPECT_TRUE(std::isnan(to_host<float>(slot, 1)[0])) << "a NaN in the stream shows";
  EXPECT_EQ(ds::kern::launch_max_abs(dx.as<float>(), 8, 1, 64, slot.as<float>(), nullptr), cudaErrorInvalidValue);
}
#else
TEST(ForwardHooks, CudaNotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#endif

}  // namespace

// A writer at HeadOut: the head's columns of Attn(l) scaled right after layer l's attention, before o_proj, once.
TEST(ForwardHooks, HeadScaleWriterSite) {
  ds::ModelConfig c = ds::load_config(fixture("phi4flash_L8_mha_f32") + "/config.json");
  std::vector<float> lam(size_t(c.layers), 0.5f);
  const int l = int(c.map_layers().back());
  const auto [c0, c1] = ds::fwd::head_columns(c, 0);
  EXPECT_EQ(c1 - c0, c.heads * c.head_dim / c.view_heads());
  ds::fwd::Hooks h;
  h.add(ds::fwd::scale_head_hook(c, l, 0, 0.f));
  ds::fwd::Plan p;
  p.lambda = lam.data();
  p.hooks = &h;
  Recorder r;
  ds::fwd::run_layers(c, r, p);
  const std::string want = "scale" + std::to_string(l) + ":" + std::to_string(c0) + "-" + std::to_string(c1) + "x" +
                           std::to_string(0.f);
  const auto it = std::find(r.log.begin(), r.log.end(), want);
  ASSERT_NE(it, r.log.end());
  EXPECT_EQ(std::count_if(r.log.begin(), r.log.end(), [](const std::string& e) { return e.rfind("scale", 0) == 0; }), 1);
  EXPECT_EQ(*(it - 1), "attention");
  EXPECT_EQ(*(it + 1), "gemm_o");
  EXPECT_THROW(ds::fwd::scale_head_hook(c, 0, 0, 0.f), ds::Error) << "layer 0 is a Mamba layer";
  EXPECT_THROW(ds::fwd::scale_head_hook(c, l, int(c.view_heads()), 0.f), ds::Error);
}
