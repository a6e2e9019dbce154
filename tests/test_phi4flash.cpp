// Phi-4-mini-flash (SambaY) beyond the fixture comparison of test_fixtures_cpu.cpp: the layer schedule read from
// the published config.json, its refusals, layers without maps in the session and the CLI's --dump, and lambda
// re-runs that start after the memory layer (the GMU layers must read the memory of the earlier run).
#include <gtest/gtest.h>

#include <map>

#include "engine/core/config.h"
#include "engine/session/session.h"
#include "map_reference.h"
#include "test_util.h"

namespace {

using ds::LayerKind;

// microsoft/Phi-4-mini-flash-reasoning's config.json as published (docs/models/phi4flash.md section 1).
const char* kRealConfig = R"({"architectures": ["Phi4FlashForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "hidden_act": "silu", "hidden_size": 2560,
  "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05, "lm_head_bias": false,
  "max_position_embeddings": 262144, "mb_per_layer": 2, "mlp_bias": false, "model_type": "phi4flash",
  "num_attention_heads": 40, "num_hidden_layers": 32, "num_key_value_heads": 20, "pad_token_id": 199999,
  "resid_pdrop": 0.0, "sliding_window": 512, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.46.1", "use_cache": true, "vocab_size": 200064})";

TEST(Phi4FlashConfig, RealScheduleAndSizes) {
  const ds::ModelConfig c = ds::parse_config_json(kRealConfig, "config.json");
  EXPECT_STREQ(c.family(), "Phi4Flash");
  ASSERT_EQ(c.kinds.size(), 32u);
  std::map<LayerKind, std::vector<int64_t>> by;
  for (int64_t l = 0; l < 32; ++l) by[c.kind(l)].push_back(l);
  EXPECT_EQ(by[LayerKind::Mamba], (std::vector<int64_t>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(by[LayerKind::SlidingAttention], (std::vector<int64_t>{1, 3, 5, 7, 9, 11, 13, 15}));
  EXPECT_EQ(by[LayerKind::Memory], (std::vector<int64_t>{16}));
  EXPECT_EQ(by[LayerKind::Attention], (std::vector<int64_t>{17}));
  EXPECT_EQ(by[LayerKind::Gmu], (std::vector<int64_t>{18, 20, 22, 24, 26, 28, 30}));
  EXPECT_EQ(by[LayerKind::CrossAttention], (std::vector<int64_t>{19, 21, 23, 25, 27, 29, 31}));
  EXPECT_EQ(c.kv_source, 17);
  EXPECT_EQ(c.kv_layer(19), 17);
  EXPECT_EQ(c.kv_layer(17), 17);
  EXPECT_EQ(c.layer_window(15), 512);
  EXPECT_EQ(c.layer_window(17), 0);
  EXPECT_EQ(c.layer_window(19), 0);
  EXPECT_EQ(c.map_layers().size(), 16u);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.view_heads(), 20);
  EXPECT_EQ(c.d_inner, 5120);
  EXPECT_EQ(c.dt_rank, 160);
  EXPECT_EQ(c.d_state, 16);
  EXPECT_EQ(c.d_conv, 4);
  EXPECT_DOUBLE_EQ(c.subln_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  // The published model.safetensors.index.json's total_size: every tensor in bf16 except A_log (9 layers x 5120
  // x 16) and the lambda vectors (16 layers x 4 x 64), stored as F32.
  const int64_t f32_extra = 9 * 5120 * 16 + 16 * 4 * 64;
  EXPECT_EQ(2 * c.params() + 2 * f32_extra, 7706608640LL);
}

TEST(Phi4FlashConfig, RefusesWhatThePublishedCodeCannotRun) {
  auto with = [](const std::string& key, const std::string& value) {
    std::string t = kRealConfig;
    const size_t at = t.find("\"" + key + "\"");
    const size_t colon = t.find(':', at), end = t.find_first_of(",}", colon);
    return t.substr(0, colon + 1) + " " + value + t.substr(end);
  };
  auto message = [](const std::string& text) {
    try {
      ds::parse_config_json(text, "config.json");
    } catch (const ds::Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message(with("num_hidden_layers", "30")).find("multiple of 4"), std::string::npos);
  EXPECT_NE(message(with("mb_per_layer", "3")).find("mb_per_layer"), std::string::npos);
  EXPECT_NE(message(with("sliding_window", "0")).find("sliding_window"), std::string::npos);
  EXPECT_NE(message(with("sliding_window", "[1, 2]")).find("sliding_window"), std::string::npos);
  EXPECT_NE(message(with("hidden_act", "\"gelu\"")).find("hidden_act"), std::string::npos);
  // a re-saved config holds the per-layer list the configuration class makes
  std::string list = "[";
  for (int l = 0; l < 32; ++l) list += std::string(l ? "," : "") + (l < 16 && l % 2 ? "512" : "null");
  const ds::ModelConfig c = ds::parse_config_json(with("sliding_window", list + "]"), "config.json");
  EXPECT_EQ(c.window, 512);
}

TEST(Phi4FlashSession, LayersWithoutAttentionHaveNoMapsOrLambda) {
  const std::string dir = dstest::fixture("phi4flash_L8_mha_f32");
  dstest::Expected ex(dir);
  auto s = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  s->set_ids(ex.ids());
  s->run();
  for (int l : {0, 2, 4, 6}) {
    EXPECT_THROW(s->maps(l), ds::Error) << l;
    EXPECT_THROW(s->set_lambda_override(l, 0.5), ds::Error) << l;
    EXPECT_THROW(s->backend().head_stats(l), ds::Error) << l;
    ds::MapView v;
    ds::ViewRequest q;
    q.layer = l;
    EXPECT_THROW(s->backend().map_view(q, v), ds::Error) << l;
    EXPECT_EQ(s->effective_lambda(l), 0.0);
  }
  try {
    s->maps(4);
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory layer"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->backend().head_stats(7).size(), 2u);
}

// The implicit attention of the Mamba layers' scans (Backend::mamba_view) against the float64 reference's maps,
// which it forms from explicit products of the per-step decays and checks against the scan's own output
// (tools/phi4flash_reference.py); the layers and channels the fixtures store. Bad requests get one-line errors.
TEST(Phi4FlashSession, MambaImplicitAttentionMatchesReference) {
  for (const char* name : {"phi4flash_L8_mha_f32", "phi4flash_L8_gqa_bf16", "phi4flash_L12_gqa_sharded_f32"}) {
    const std::string dir = dstest::fixture(name);
    dstest::Expected ex(dir);
    auto s = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
    s->set_ids(ex.ids());
    s->run();
    const ds::ModelConfig& c = s->config();
    const int64_t n = int64_t(ex.ids().size());
    int layers = 0, views = 0;
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".implicit";
      const bool mamba = c.kind(l) == LayerKind::Mamba || c.kind(l) == LayerKind::Memory;
      ASSERT_EQ(ex.has(p), mamba) << name << " layer " << l;
      if (!mamba) {
        ds::MapView v;
        ds::ViewRequest q;
        q.layer = l;
        try {
          s->backend().mamba_view(q, v);
          ADD_FAILURE() << name << " layer " << l << ": a view of a layer without a scan";
        } catch (const ds::Error& e) {
          EXPECT_NE(std::string(e.what()).find("implicit attention maps are for Mamba layers"), std::string::npos)
              << e.what();
        }
        std::vector<float> row;
        EXPECT_THROW(s->backend().mamba_row(l, 0, 0, row), ds::Error) << name << " layer " << l;
        continue;
      }
      views += dstest::expect_implicit_views(s->backend(), l, ex.get(p + "_channels"), ex.get(p), n, 1e-4, name);
      ++layers;
    }
    EXPECT_GE(layers, 3) << name;
    EXPECT_GT(views, 0) << name;
    ds::MapView v;
    ds::ViewRequest q;
    q.layer = 0;
    q.head = int(c.d_inner);
    try {
      s->backend().mamba_view(q, v);
      ADD_FAILURE() << "channel d_inner accepted";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find("channel " + std::to_string(c.d_inner) + " does not exist"),
                std::string::npos)
          << e.what();
    }
    std::vector<float> row;
    for (const int64_t bad : {int64_t(-1), n}) {
      try {
        s->backend().mamba_row(0, 0, bad, row);
        ADD_FAILURE() << "row " << bad << " accepted";
      } catch (const ds::Error& e) {
        EXPECT_NE(std::string(e.what()).find("position " + std::to_string(bad) + " is outside the prompt"),
                  std::string::npos)
            << e.what();
      }
    }
    EXPECT_THROW(s->backend().mamba_row(0, int(c.d_inner), 0, row), ds::Error) << "channel d_inner accepted";
  }
}

// A lambda change in a cross-attention layer (after the memory layer) re-runs from there: the GMU layers after it
// read the memory the first run left, and the result equals a fresh run.
TEST(Phi4FlashSession, RerunAfterTheMemoryLayerEqualsFullRun) {
  const std::string dir = dstest::fixture("phi4flash_L12_gqa_sharded_f32");
  dstest::Expected ex(dir);
  auto a = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  a->set_ids(ex.ids());
  EXPECT_EQ(a->run(), 0);
  a->set_lambda_override(9, -0.4);  // L = 12: memory 6, full 7, gmu 8, cross 9
  EXPECT_EQ(a->run(), 9);
  a->set_lambda_scale(0.5);
  EXPECT_EQ(a->run(), 1) << "layer 0 is Mamba: the first lambda is layer 1's";
  auto b = ds::Session::open(dir, ds::BackendChoice::Cpu, nullptr, 2);
  b->set_ids(ex.ids());
  b->set_lambda_scale(0.5);
  b->set_lambda_override(9, -0.4);
  b->run();
  const auto& la = a->result().logits;
  const auto& lb = b->result().logits;
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(dstest::max_abs_err(la.data(), lb.data(), la.size()), 0.0);
  const std::vector<float> plain = ex.get("logits");
  const int64_t V = a->config().vocab, n = int64_t(a->ids().size());
  EXPECT_GT(dstest::max_abs_err(la.data(), plain.data() + (n - 1) * V, size_t(V)), 1e-3) << "the override had no effect";
}

// diffscope-run --dump writes layers.L.attn1 / attn2 / lambda for the attention layers only, equal to the
// reference's maps.
TEST(Phi4FlashCli, DumpHasOnlyAttentionLayers) {
  const std::string dir = dstest::fixture("phi4flash_L8_gqa_bf16");
  dstest::Expected ex(dir);
  dstest::TempDir tmp;
  std::string ids;
  for (int32_t id : ex.ids()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string out = tmp.str() + "/dump.safetensors";
  std::string log;
  ASSERT_EQ(dstest::run_cmd(dstest::binary_dir() + "/diffscope-run --backend cpu --threads 2 --model '" + dir +
                                "' --token-ids " + ids + " --dump '" + out + "'",
                            &log),
            0)
      << log;
  EXPECT_NE(log.find("4 with attention"), std::string::npos) << log;
  ds::SafetensorsFile f(out);
  for (int l = 0; l < 8; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    if (l % 2 == 0) {
      EXPECT_EQ(f.find(p + "attn1"), nullptr) << p;
      EXPECT_EQ(f.find(p + "lambda"), nullptr) << p;
      continue;
    }
    for (const char* m : {"attn1", "attn2"}) {
      const ds::TensorInfo* t = f.find(p + m);
      ASSERT_NE(t, nullptr) << p << m;
      const std::vector<float> got = ds::tensor_to_f32(*t), want = ex.get(p + m);
      ASSERT_EQ(got.size(), want.size()) << p << m;
      EXPECT_LT(dstest::rel_err(got.data(), want.data(), want.size()), 1e-4) << p << m;
    }
    ASSERT_NE(f.find(p + "lambda"), nullptr) << p;
    EXPECT_NEAR(ds::tensor_to_f32(*f.find(p + "lambda"))[0], ex.get(p + "lambda")[0], 1e-5) << p;
  }
  // a lambda for a Mamba layer is an argument error
  EXPECT_EQ(dstest::run_cmd(dstest::binary_dir() + "/diffscope-run --backend cpu --model '" + dir + "' --token-ids " +
                                ids + " --lambda 2=0.5",
                            &log),
            2);
  EXPECT_NE(log.find("mamba layer"), std::string::npos) << log;
}

}  // namespace
