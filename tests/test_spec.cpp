// ModelSpec parsing from config.json and the parameter layout.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/option_names.h"
#include "core/error.h"
#include "model/layout.h"
#include "model/rope.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

using nlohmann::json;

TEST(Spec, ParsesEachFamily) {
  ModelSpec l = parse_model_spec(test::tiny_config("llama"), "c.json");
  EXPECT_EQ(l.arch, Arch::Llama);
  EXPECT_EQ(l.head_dim, 8);
  EXPECT_EQ(l.n_kv_head, 2);
  EXPECT_TRUE(l.qkv_bias);
  EXPECT_TRUE(l.o_bias);
  EXPECT_FALSE(l.tie_embeddings);
  EXPECT_EQ(l.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(l.rope.factor, 8.0);
  EXPECT_EQ(l.rope.original_max_position, 16);

  ModelSpec m = parse_model_spec(test::tiny_config("mistral"), "c.json");
  EXPECT_EQ(m.arch, Arch::Mistral);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.sliding_window, 0);  // null window = full attention

  ModelSpec q2 = parse_model_spec(test::tiny_config("qwen2"), "c.json");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
  EXPECT_EQ(q2.sliding_window, 0);  // use_sliding_window false

  ModelSpec q3 = parse_model_spec(test::tiny_config("qwen3"), "c.json");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_dim, 16);
  EXPECT_EQ(q3.q_dim(), 64);
  EXPECT_DOUBLE_EQ(q3.rope.theta, 1e6);  // from rope_parameters
}

TEST(Spec, LegacyRopeScalingTypeAlias) {
  json c = test::tiny_config("llama");
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelSpec s = parse_model_spec(c, "c.json");
  EXPECT_EQ(s.rope.type, "linear");
  auto inv = rope_inv_freq(s);
  c["rope_scaling"] = nullptr;
  auto base = rope_inv_freq(parse_model_spec(c, "c.json"));
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_FLOAT_EQ(inv[i], base[i] / 2.f);
}

TEST(Spec, Llama3ScalingKeepsHighAndDividesLowFrequencies) {
  json c = test::tiny_config("llama");
  ModelSpec s = parse_model_spec(c, "c.json");
  c["rope_scaling"] = nullptr;
  ModelSpec plain = parse_model_spec(c, "c.json");
  auto a = rope_inv_freq(s), b = rope_inv_freq(plain);
  // wavelen = 2*pi/f. old context 16: high-frequency band wavelen < 16/4 = 4, low band > 16.
  for (size_t i = 0; i < a.size(); ++i) {
    double wavelen = 2 * M_PI / b[i];
    if (wavelen < 4) {
      EXPECT_FLOAT_EQ(a[i], b[i]);
    }
    if (wavelen > 16) {
      EXPECT_FLOAT_EQ(a[i], b[i] / 8.f);
    }
    if (wavelen >= 4 && wavelen <= 16) {
      EXPECT_LT(a[i], b[i]);
      EXPECT_GT(a[i], b[i] / 8.f);
    }
  }
}

TEST(Spec, RejectsBadConfigsWithTheFileName) {
  auto expect_error = [](json c, const std::string& needle) {
    try {
      parse_model_spec(c, "/x/config.json");
      ADD_FAILURE() << "accepted a bad config; expected: " << needle;
    } catch (const InputError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("/x/config.json"), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  json c = test::tiny_config("llama");
  c["architectures"] = {"GPT2LMHeadModel"};
  expect_error(c, "unsupported architecture");
  c = test::tiny_config("llama");
  c.erase("hidden_size");
  expect_error(c, "hidden_size");
  c = test::tiny_config("llama");
  c["num_key_value_heads"] = 3;
  expect_error(c, "num_key_value_heads");
  c = test::tiny_config("llama");
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error(c, "yarn");
  c = test::tiny_config("llama");
  c["hidden_act"] = "gelu";
  expect_error(c, "gelu");
  c = test::tiny_config("llama");
  c["vocab_size"] = "many";
  expect_error(c, "vocab_size");
  expect_error(json::array(), "object");
}

TEST(Spec, SlidingWindowShorterThanSequenceIsRefused) {
  json c = test::tiny_config("mistral");
  c["sliding_window"] = 16;
  ModelSpec s = parse_model_spec(c, "c.json");
  EXPECT_NO_THROW(s.check_seq_len(16, "c.json"));
  const InputError e = test::expect_setting_error([&] { s.check_seq_len(17, "c.json"); }, Setting::SeqLen);
  EXPECT_EQ(std::string(e.what()),
            "c.json: the model uses sliding-window attention (window 16) shorter than sequence length 17; sliding "
            "windows are not supported: use sequence length <= 16");
  EXPECT_EQ(e.message(option_name),
            "c.json: the model uses sliding-window attention (window 16) shorter than --seq-len 17; sliding windows "
            "are not supported: use --seq-len <= 16");
  json q = test::tiny_config("qwen2");
  q["use_sliding_window"] = true;
  q["max_window_layers"] = 1;
  EXPECT_THROW(parse_model_spec(q, "c.json").check_seq_len(33, "c.json"), InputError);
  q["max_window_layers"] = 2;  // every layer below max_window_layers uses full attention
  EXPECT_NO_THROW(parse_model_spec(q, "c.json").check_seq_len(33, "c.json"));
}

TEST(Layout, BlobsAreAlignedAndCoverEveryParameter) {
  for (const auto& fam : test::families()) {
    ModelSpec s = parse_model_spec(test::tiny_config(fam), "c.json");
    ModelLayout m = make_layout(s);
    ASSERT_EQ(int(m.blobs.size()), s.n_layer + 2);
    int64_t params = 0;
    for (const auto& b : m.blobs) {
      int64_t end = 0;
      for (const auto& e : b.entries) {
        EXPECT_EQ(e.offset % 128, 0) << e.name;  // 256-byte aligned in bf16, 512 in fp32
        EXPECT_GE(e.offset, end) << e.name;
        end = e.offset + e.numel;
        params += e.numel;
      }
      EXPECT_LE(end, b.numel);
    }
    EXPECT_EQ(params, s.total_params()) << fam;
    EXPECT_EQ(m.head().entries.size(), s.tie_embeddings ? 1u : 2u);
    const BlobLayout& l0 = m.layer(0);
    EXPECT_EQ(l0.entry(LayerParam::QNorm) != nullptr, s.qk_norm);
    EXPECT_EQ(l0.entry(LayerParam::Bq) != nullptr, s.qkv_bias);
    EXPECT_EQ(l0.entry(LayerParam::Wq)->name, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(l0.entry(LayerParam::Wq)->shape, (std::vector<int64_t>{s.q_dim(), s.hidden}));
  }
}

}  // namespace
}  // namespace sf
