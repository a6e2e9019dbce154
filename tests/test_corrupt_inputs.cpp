// Bad checkpoints, one test each: the library throws ds::Error naming the file and the problem, the CLI exits 3
// with that one line on stderr, nothing crashes, and a session opened before keeps working.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/session/session.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* kSrc = "diff_gqa_d64_llama3_bf16_tied";

// Copy the fixture's model (not the expected outputs) into a temporary folder.
std::string copy_model(const dstest::TempDir& t) {
  const fs::path src = dstest::fixture(kSrc);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src / f, t.path / f);
  return t.str();
}

// Split a safetensors file into header JSON and data, let `edit` change them, write it back.
void rewrite(const std::string& file, const std::function<void(json&, std::string&)>& edit) {
  std::string s = dstest::read_file(file);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(s[size_t(i)]);
  json h = json::parse(s.substr(8, n));
  std::string data = s.substr(8 + n);
  edit(h, data);
  const std::string hs = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((hs.size() >> (8 * i)) & 0xff);
  dstest::write_file(file, out + hs + data);
}

void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  json c = json::parse(dstest::read_file(dir + "/config.json"));
  edit(c);
  dstest::write_file(dir + "/config.json", c.dump());
}

// The library refuses it with a message containing every `needles` entry; the CLI exits 3 with one line.
void expect_refused(const std::string& dir, const std::vector<std::string>& needles) {
  std::string msg;
  try {
    auto s = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 1);
    FAIL() << "opened a bad checkpoint";
  } catch (const ds::Error& e) {
    msg = e.what();
  }
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message lacks '" << n << "': " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;

  std::string out;
  const int rc = dstest::run_cmd(dstest::binary_dir() + "/diffscope-run --backend cpu --model '" + dir +
                                     "' --token-ids 1,5,7",
                                 &out);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  for (const auto& n : needles) EXPECT_NE(out.find(n), std::string::npos) << out;
}

std::string model_file(const std::string& dir) { return dir + "/model.safetensors"; }

TEST(CorruptInput, TruncatedFile) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  fs::resize_file(model_file(d), fs::file_size(model_file(d)) / 2);
  expect_refused(d, {model_file(d), "outside the file"});
}

TEST(CorruptInput, TruncatedInsideHeader) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  fs::resize_file(model_file(d), 100);
  expect_refused(d, {model_file(d), "header length"});
}

TEST(CorruptInput, HeaderLengthPastEnd) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  std::string s = dstest::read_file(model_file(d));
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(0x7f);
  dstest::write_file(model_file(d), s);
  expect_refused(d, {model_file(d), "header length", "past the end"});
}

TEST(CorruptInput, BadJson) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  std::string s = dstest::read_file(model_file(d));
  s[9] = '[';  // header starts {"... -> {[...
  s[10] = ':';
  dstest::write_file(model_file(d), s);
  expect_refused(d, {model_file(d), "not valid JSON"});
}

TEST(CorruptInput, UnknownDtype) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  rewrite(model_file(d), [](json& h, std::string&) { h["model.norm.weight"]["dtype"] = "Q4_K"; });
  expect_refused(d, {model_file(d), "model.norm.weight", "unknown dtype 'Q4_K'"});
}

TEST(CorruptInput, NonFloatWeights) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  rewrite(model_file(d), [](json& h, std::string&) { h["model.norm.weight"]["dtype"] = "I16"; });
  expect_refused(d, {model_file(d), "model.norm.weight", "F32, F16 or BF16"});
}

TEST(CorruptInput, OverlappingOffsets) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  rewrite(model_file(d), [](json& h, std::string&) {
    auto a = h["model.layers.0.input_layernorm.weight"]["data_offsets"];
    h["model.layers.0.post_attention_layernorm.weight"]["data_offsets"] = a;
  });
  expect_refused(d, {model_file(d), "overlap"});
}

TEST(CorruptInput, OffsetsOutsideFile) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  rewrite(model_file(d), [](json& h, std::string& data) {
    const uint64_t sz = data.size();
    h["model.norm.weight"]["data_offsets"] = {sz, sz + 256};  // 128 bf16 = 256 bytes, right after the end
  });
  expect_refused(d, {model_file(d), "model.norm.weight", "outside the file"});
}

TEST(CorruptInput, ShapeTimesDtypeDisagreesWithSpan) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  rewrite(model_file(d), [](json& h, std::string&) { h["model.norm.weight"]["shape"] = {129}; });
  expect_refused(d, {model_file(d), "model.norm.weight", "needs"});
}

TEST(CorruptInput, MissingTensor) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  rewrite(model_file(d), [](json& h, std::string&) { h.erase("model.layers.1.mlp.up_proj.weight"); });
  expect_refused(d, {model_file(d), "missing tensor model.layers.1.mlp.up_proj.weight"});
}

TEST(CorruptInput, ShapeDisagreesWithConfig) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  // Same bytes, other shape: the file itself is consistent, the config is not.
  rewrite(model_file(d), [](json& h, std::string&) {
    auto& e = h["model.layers.0.self_attn.q_proj.weight"];
    const int64_t r = e["shape"][0], c = e["shape"][1];
    e["shape"] = {r / 2, c * 2};
  });
  expect_refused(d, {model_file(d), "model.layers.0.self_attn.q_proj.weight", "config.json implies"});
}

TEST(CorruptInput, InconsistentHeadCounts) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) { c["num_key_value_heads"] = 3; });
  expect_refused(d, {d + "/config.json", "not a multiple of num_key_value_heads"});
}

TEST(CorruptInput, OddKvHeadsForDiffLlama) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) { c["num_key_value_heads"] = 1; });
  expect_refused(d, {d + "/config.json", "even num_key_value_heads"});
}

TEST(CorruptInput, UnknownArchitecture) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) {
    c["architectures"] = {"MistralForCausalLM"};
    c["model_type"] = "mistral";
  });
  expect_refused(d, {d + "/config.json", "unsupported architecture MistralForCausalLM",
                     "DiffLlamaForCausalLM, LlamaForCausalLM, MotifForCausalLM"});
}

// A DiffLlama checkpoint relabelled as Motif: the Motif row's options are checked against the config and the
// tensors, each with its own one-line reason.
TEST(CorruptInput, FamilyOptionsAreChecked) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) {
    c["architectures"] = {"MotifForCausalLM"};
    c["model_type"] = "motif";
  });  // hidden_act silu
  expect_refused(d, {d + "/config.json", "hidden_act 'silu' is not supported for Motif (only poly_norm)"});
  edit_config(d, [](json& c) {
    c["hidden_act"] = "poly_norm";
    c["attn_rms_norm_eps"] = -1;
  });
  expect_refused(d, {d + "/config.json", "attn_rms_norm_eps must be positive"});
  edit_config(d, [](json& c) { c["attn_rms_norm_eps"] = 1e-5; });
  expect_refused(d, {"model.layers.0.self_attn.subln.weight"});  // the tensors a DiffLlama does not have
  edit_config(d, [](json& c) { c["kv_lora_rank"] = 512; });    // Motif-3 under the same architecture name
  expect_refused(d, {d + "/config.json", "kv_lora_rank: a Motif-3 model"});
  edit_config(d, [](json& c) {
    c.erase("kv_lora_rank");
    c["num_noise_heads"] = 3;  // 4 q heads are not groups of 3
  });
  expect_refused(d, {d + "/config.json", "must be a multiple of num_noise_heads (3)"});
  edit_config(d, [](json& c) {
    c["num_noise_heads"] = 1;
    c["k_ratio"] = 2;
  });
  expect_refused(d, {d + "/config.json", "k_ratio = 2 is not supported"});
}

TEST(CorruptInput, AbsurdConfigValues) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) { c["vocab_size"] = 0; });
  expect_refused(d, {d + "/config.json", "vocab_size = 0"});
  edit_config(d, [](json& c) {
    c["vocab_size"] = 288;
    c["hidden_size"] = -128;
  });
  expect_refused(d, {d + "/config.json", "hidden_size"});
}

// Found by fuzz_config: a field of the wrong JSON type escaped as nlohmann's exception, not a one-line error.
TEST(CorruptInput, ConfigFieldsOfTheWrongType) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) { c["model_type"] = 200; });  // architectures still names DiffLlama: loads
  auto s = ds::Session::open(d, ds::BackendChoice::Cpu, nullptr, 1);
  EXPECT_TRUE(s->config().is_diff());
  edit_config(d, [](json& c) { c["tie_word_embeddings"] = "yes"; });
  expect_refused(d, {d + "/config.json", "tie_word_embeddings is not true or false"});
  edit_config(d, [](json& c) {
    c["tie_word_embeddings"] = true;
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", "eight"}};
  });
  expect_refused(d, {d + "/config.json", "factor is not a number"});
}

TEST(CorruptInput, UnknownRopeType) {
  dstest::TempDir t;
  const std::string d = copy_model(t);
  edit_config(d, [](json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
  expect_refused(d, {d + "/config.json", "rope type 'yarn'"});
}

TEST(CorruptInput, PickleCheckpointIsNeverLoaded) {
  dstest::TempDir t;
  fs::copy_file(fs::path(dstest::fixture(kSrc)) / "config.json", t.path / "config.json");
  // A pickle that would run a command if unpickled: it must never be opened as one.
  dstest::write_file(t.str() + "/pytorch_model.bin",
                     "\x80\x02" "cos\nsystem\n(S'touch " + t.str() + "/PWNED'\ntR.");
  expect_refused(t.str(), {t.str() + "/pytorch_model.bin", "pickle", "safetensors"});
  EXPECT_FALSE(fs::exists(t.path / "PWNED"));
}

TEST(CorruptInput, MissingConfig) {
  dstest::TempDir t;
  fs::copy_file(fs::path(dstest::fixture(kSrc)) / "model.safetensors", t.path / "model.safetensors");
  expect_refused(t.str(), {t.str() + "/config.json", "cannot open"});
}

TEST(CorruptInput, ShardIndexNamesMissingFile) {
  dstest::TempDir t;
  const fs::path src = dstest::fixture("diff_gqa4_d32_sharded_v5");
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "expected.safetensors") fs::copy_file(e.path(), t.path / e.path().filename());
  fs::remove(t.path / "model-00003-of-00023.safetensors");
  expect_refused(t.str(), {"model-00003-of-00023.safetensors", "cannot open"});
}

// "./shard" names a file beside the index (it used to be refused as outside the folder); a subfolder or ".." is not.
TEST(CorruptInput, ShardNamesWithDotSlashOpen) {
  dstest::TempDir t;
  const fs::path src = dstest::fixture("diff_gqa4_d32_sharded_v5");
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), t.path / e.path().filename());
  const std::string index = t.str() + "/model.safetensors.index.json";
  json j = json::parse(dstest::read_file(index));
  for (auto& [k, v] : j["weight_map"].items()) v = "./" + v.get<std::string>();
  dstest::write_file(index, j.dump());
  EXPECT_NO_THROW(ds::Session::open(t.str(), ds::BackendChoice::Cpu, nullptr, 1));
  for (auto& [k, v] : j["weight_map"].items()) v = "sub/" + v.get<std::string>().substr(2);
  dstest::write_file(index, j.dump());
  expect_refused(t.str(), {index, "is in a subfolder"});
  for (auto& [k, v] : j["weight_map"].items()) v = "../" + v.get<std::string>().substr(4);
  dstest::write_file(index, j.dump());
  expect_refused(t.str(), {index, "points outside the model folder"});
}

TEST(CorruptInput, PreviousSessionSurvivesAFailedOpen) {
  auto good = ds::Session::open(dstest::fixture(kSrc), ds::BackendChoice::Cpu, nullptr, 1);
  good->set_ids({1, 5, 7, 9});
  good->run();
  const std::vector<float> before = good->result().logits;
  dstest::TempDir t;
  const std::string d = copy_model(t);
  fs::resize_file(model_file(d), fs::file_size(model_file(d)) / 3);
  EXPECT_THROW(ds::Session::open(d, ds::BackendChoice::Cpu, nullptr, 1), ds::Error);
  good->set_ids({1, 5, 7, 9});
  good->run();
  EXPECT_EQ(good->result().logits, before);
}

TEST(CorruptInput, FileTruncatedAfterOpenGivesErrorNotSigbus) {
  // Map a checkpoint, then truncate it under the mapping: reading a tensor must throw, not kill the process.
  dstest::TempDir t;
  const std::string d = copy_model(t);
  ds::Checkpoint ck(d);
  const ds::TensorInfo& w = ck.get("model.layers.1.mlp.down_proj.weight");
  fs::resize_file(model_file(d), 64);
  EXPECT_THROW(ds::tensor_to_f32(w), ds::Error);
}

}  // namespace

// Backend names: cpu, cuda, cuda:N (GPU N), auto; anything else is an error naming the value.
TEST(CorruptInput, BackendNames) {
  EXPECT_EQ(ds::parse_backend_choice("cpu"), ds::BackendChoice::Cpu);
  EXPECT_EQ(ds::parse_backend_choice("auto"), ds::BackendChoice::Auto);
  EXPECT_EQ(ds::parse_backend_choice("cuda"), ds::BackendChoice::Cuda);
  const ds::BackendChoice gpu1 = ds::parse_backend_choice("cuda:1");
  EXPECT_EQ(gpu1.kind, ds::BackendChoice::Kind::Cuda);
  EXPECT_EQ(gpu1.device, 1);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:123456", "CPU", ""}) {
    try {
      ds::parse_backend_choice(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}
