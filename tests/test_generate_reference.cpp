// Greedy generation against float64 references (tests/gen_generation_fixtures.py writes each fixture's
// generate.safetensors): the reference generates by REPEATED FULL FORWARDS in float64 (transformers' DiffLlama / Llama,
// tools/motif_reference.py, tools/phi4flash_reference.py), the session by cached decoding (a prefill, then one
// position per step through the KV cache and Mamba state, ForwardRequest::append_from). On every fixture, and on
// diff_long_gen (a 1500-token prompt), the session's next-token logits before each choice equal the reference's
// step_logits and its greedy tokens equal the reference's tokens.
//
// Logits: max |engine - reference| / max |reference| over the row, at most 1e-4 on the CPU (f32 against float64).
// On CUDA the weights and GEMM inputs are bf16 (test_cuda_model.cpp): at step g, kCudaTol or kBf16Factor times
// bf16_err[g] when larger, bf16_err being the distance from float64 of the same model computed as a bf16 engine does
// (the generator's emulation, run on the reference's sequence): how far bf16 rounding alone moves that step. Two bf16
// computations are each about that far from float64, in their own directions (test_cuda_model.cpp allows twice the
// emulation's distance); the GPU's cached steps were measured up to 2.2 times it (diff_n1 step 5: emulation 2.5e-2,
// the GPU's full forward of the same ids 2.6e-2, its cached step 5.4e-2; diff_long_gen step 2: 2.8e-2, 4.55e-2,
// 4.75e-2; H100, 2026-11-24), hence 2.5.
// Tokens: each step's token must equal the reference's while the float64 top-1/top-2 margin is clear, i.e. larger
// than the near-tie threshold of the generator (1e-3, recorded in the file's metadata) and than twice the logit
// tolerance in logit units (each of the two logits may move by tol x max |logit|). At a step whose margin is not
// clear either token is accepted: when they agree the sequences are still identical and the comparison goes on; when
// they differ the sequences have diverged and nothing after that step is compared (the test says so on stdout).
// diff_n1 has such a near-tie (step 3, margin 6e-4: the metadata's near_tie_steps); no other fixture has one on the
// CPU. Nothing in the fixtures was changed to avoid it. On CUDA the wider tolerance makes more steps unclear; on an
// H100 (2026-11-24) llama_tied_llama3_bf16 (step 3, margin 5.4e-3) and phi4flash_L12_gqa_sharded_f32 (step 4, margin
// 3.9e-2) diverged at such steps, every other fixture gave all 10 tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/core/safetensors.h"
#include "engine/session/session.h"
#include "test_util.h"

#ifdef DS_HAVE_CUDA
#include "test_cuda_util.h"
#endif

namespace {

constexpr double kNearTie = 1e-3;   // tests/gen_generation_fixtures.py's NEAR_TIE
constexpr double kCpuTol = 1e-4;    // max abs difference / max abs logit, f32 engine against float64
constexpr double kCudaTol = 3e-2;   // the same with bf16 weights and GEMM inputs, at least
constexpr double kBf16Factor = 2.5;  // times the step's bf16 emulation distance (generate.safetensors' bf16_err)

// One fixture's generate.safetensors.
struct GenRef {
  std::vector<int32_t> prompt, generated;
  std::vector<float> logits;  // [G, V]
  std::vector<float> margin;  // [G]
  std::vector<float> bf16_err;  // [G]
  int64_t G = 0, V = 0;
  std::map<std::string, std::string> meta;
  const float* row(int64_t g) const { return logits.data() + g * V; }
};

std::vector<int32_t> to_ids(const std::vector<float>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

GenRef load_ref(const std::string& dir) {
  ds::SafetensorsFile f(dir + "/generate.safetensors");
  auto get = [&](const char* n) {
    const ds::TensorInfo* t = f.find(n);
    if (!t) throw ds::Error(dir + "/generate.safetensors: no tensor " + n);
    return t;
  };
  GenRef r;
  r.prompt = to_ids(ds::tensor_to_f32(*get("prompt_ids")));
  r.generated = to_ids(ds::tensor_to_f32(*get("generated")));
  const ds::TensorInfo* l = get("step_logits");
  r.G = l->shape.at(0);
  r.V = l->shape.at(1);
  r.logits = ds::tensor_to_f32(*l);
  r.margin = ds::tensor_to_f32(*get("margin"));
  r.bf16_err = ds::tensor_to_f32(*get("bf16_err"));
  r.meta = f.metadata();
  return r;
}

std::vector<std::string> gen_fixtures() {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(dstest::source_dir() + "/tests/fixtures"))
    if (std::filesystem::exists(e.path() / "generate.safetensors")) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

double max_abs(const float* p, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::fabs(p[i])));
  return m;
}

// Generates the reference's G tokens greedily on backend `b` and holds every step to the reference (the header
// says how): step g's logits within tol_base, or bf16_factor x the step's bf16_err when larger. Returns the number of
// tokens compared.
int check_against_reference(const std::string& name, ds::BackendChoice b, double tol_base, double bf16_factor) {
  const std::string dir = dstest::fixture(name);
  const GenRef ref = load_ref(dir);
  auto s = ds::Session::open(dir, b, nullptr, 2);
  EXPECT_EQ(s->config().vocab, ref.V) << name;
  if (s->config().vocab != ref.V) return 0;
  s->set_ids(ref.prompt);
  ds::GenerateOptions o;
  o.max_new = int(ref.G);
  o.stop_at_eos = false;
  s->begin_generation(o);  // runs the prompt: result() holds its next-token logits
  double worst = 0, worst_tol = 0;
  int compared = 0;
  std::string note;
  for (int64_t g = 0; g < ref.G; ++g) {
    const ds::ForwardResult& r = s->result();
    const float* got = r.logits.data() + (r.logit_rows - 1) * ref.V;
    const double scale = max_abs(ref.row(g), ref.V);
    const double tol = std::max(tol_base, bf16_factor * double(ref.bf16_err[size_t(g)]));
    const double err = dstest::max_abs_err(got, ref.row(g), size_t(ref.V)) / scale;
    worst = std::max(worst, err);
    worst_tol = std::max(worst_tol, tol);
    EXPECT_LE(err, tol) << name << ": logits before choosing token " << g;
    const int32_t id = s->generate_step();
    EXPECT_GE(id, 0) << name << ": generation stopped at step " << g << " (" << ds::stop_reason_name(s->stop_reason())
                     << ")";
    if (id < 0) break;
    const bool clear = ref.margin[size_t(g)] > std::max(kNearTie, 2 * tol * scale);
    if (!clear && id != ref.generated[size_t(g)]) {
      note = " (diverged at near-tie step " + std::to_string(g) + ", margin " + std::to_string(ref.margin[size_t(g)]) +
             ": later steps not compared)";
      break;
    }
    EXPECT_EQ(id, ref.generated[size_t(g)]) << name << ": token " << g << " (float64 margin " << ref.margin[size_t(g)]
                                            << ", logit tolerance " << tol * scale << ")";
    if (id != ref.generated[size_t(g)]) break;  // the sequences differ from here on: nothing more to compare
    ++compared;
  }
  std::printf("  %-32s %s: %d/%lld tokens equal, worst logits error %.2e (tol up to %.1e)%s\n", name.c_str(),
              s->backend().kind().c_str(), compared, (long long)ref.G, worst, worst_tol, note.c_str());
  return compared;
}

class GenerateReferenceCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateReferenceCpu, GreedyTokensAndLogitsMatchFloat64) {
  const int compared = check_against_reference(GetParam(), ds::BackendChoice::Cpu, kCpuTol, 0.0);
  const GenRef ref = load_ref(dstest::fixture(GetParam()));
  // On the CPU every token is compared up to the fixture's first near-tie (none: all of them).
  const int first_tie = std::stoi(ref.meta.at("first_near_tie"));
  EXPECT_GE(compared, first_tie < 0 ? int(ref.G) : first_tie) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(All, GenerateReferenceCpu, ::testing::ValuesIn(gen_fixtures()),
                         [](const auto& info) { return info.param; });

// Every model fixture has a generation reference, the long-prompt fixture is there, and the files are what the
// tests above assume: G steps, the prompt of expected.safetensors, margins that are top-1 minus top-2 of the stored
// logits, greedy tokens that are their argmax, near-ties recorded in the metadata.
TEST(GenerateReference, FixturesAreComplete) {
  const std::vector<std::string> gen = gen_fixtures();
  for (const std::string& f : dstest::all_fixtures())
    EXPECT_NE(std::find(gen.begin(), gen.end(), f), gen.end()) << f << " has no generate.safetensors";
  ASSERT_NE(std::find(gen.begin(), gen.end(), "diff_long_gen"), gen.end());
  for (const std::string& f : gen) {
    const std::string dir = dstest::fixture(f);
    const GenRef ref = load_ref(dir);
    EXPECT_EQ(ref.G, 10) << f;
    ASSERT_EQ(ref.generated.size(), size_t(ref.G)) << f;
    ASSERT_EQ(ref.margin.size(), size_t(ref.G)) << f;
    ASSERT_EQ(ref.bf16_err.size(), size_t(ref.G)) << f;
    for (float e : ref.bf16_err) EXPECT_TRUE(e > 0 && e < 0.1) << f << ": bf16_err " << e;
    if (f == "diff_long_gen") EXPECT_EQ(ref.prompt.size(), 1500u);
    else EXPECT_EQ(ref.prompt, dstest::Expected(dir).ids()) << f;
    std::string ties;
    for (int64_t g = 0; g < ref.G; ++g) {
      const float* row = ref.row(g);
      const int64_t top = std::max_element(row, row + ref.V) - row;
      EXPECT_EQ(top, ref.generated[size_t(g)]) << f << " step " << g;
      float second = -INFINITY;
      for (int64_t i = 0; i < ref.V; ++i)
        if (i != top) second = std::max(second, row[i]);
      EXPECT_NEAR(ref.margin[size_t(g)], row[top] - second, 1e-5 * std::max(1.f, std::fabs(row[top]))) << f;
      if (ref.margin[size_t(g)] < kNearTie) ties += (ties.empty() ? "" : ",") + std::to_string(g);
    }
    EXPECT_EQ(ref.meta.at("near_tie_steps"), ties) << f;
  }
}

#ifdef DS_HAVE_CUDA
class GenerateReferenceCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateReferenceCuda, GreedyTokensAndLogitsMatchFloat64) {
  SKIP_WITHOUT_DEVICE();
  check_against_reference(GetParam(), ds::BackendChoice::Cuda, kCudaTol, kBf16Factor);
}

INSTANTIATE_TEST_SUITE_P(All, GenerateReferenceCuda, ::testing::ValuesIn(gen_fixtures()),
                         [](const auto& info) { return info.param; });
#else
TEST(GenerateReferenceCuda, NotBuilt) { GTEST_SKIP() << "no CUDA device: this build has no CUDA backend"; }
#endif

}  // namespace
