// Gemma 3: config parsing (gemma3_text and gemma3 multimodal, Gemma3TextConfig's defaults, both
// RoPE spellings, layer types, refusals), the layout's names and norms, and a gemma3 multimodal
// checkpoint through the CLI: trained, saved with the vision tower byte for byte, in either tensor
// spelling. (Gradients and sliding == resident: test_model.cpp, test_sliding_engine.cpp, with the
// "gemma3" family of model_fixtures.h.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void expect_refused(const json& c, const std::string& needle) {
  try {
    parse_model_spec(c, "g.json");
    ADD_FAILURE() << "accepted; expected a refusal mentioning " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("g.json"), std::string::npos) << e.what();
  }
}

TEST(Gemma3Spec, TinyTextConfig) {
  const ModelSpec s = parse_model_spec(test::tiny_config("gemma3"), "g.json");
  EXPECT_EQ(s.arch, Arch::Gemma3);
  EXPECT_EQ(s.model_type, "gemma3_text");
  EXPECT_TRUE(s.gemma_norm && s.sandwich_norm && s.gelu_mlp && s.embed_scale && s.qk_norm && s.tie_embeddings);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_NEAR(s.attn_scale, 1.0 / std::sqrt(12.0), 1e-12);
  EXPECT_EQ(s.local_window, 4);
  EXPECT_EQ(s.sliding_window, 0);                                    // no seq-len limit
  EXPECT_EQ(s.local_layer, (std::vector<bool>{true, false, true}));  // pattern 2: every 2nd global
  EXPECT_EQ(s.rope.type, "linear");
  EXPECT_EQ(s.rope.factor, 2.0);
  EXPECT_EQ(s.rope.theta, 10000.0);
  EXPECT_EQ(s.rope_local.type, "default");
  EXPECT_EQ(s.rope_local.theta, 100.0);
  // 4 norms, q/k norms, 4 projections, 3 MLP matrices.
  const int64_t H = 32, Q = 64, KV = 32, I = 48;
  EXPECT_EQ(s.layer_params(), 4 * H + 2 * 16 + 2 * H * Q + 2 * H * KV + 3 * H * I);

  const ModelLayout m = make_layout(s);
  const BlobLayout& l0 = m.layer(0);
  ASSERT_NE(l0.entry(LayerParam::AttnOutNorm), nullptr);
  EXPECT_EQ(l0.entry(LayerParam::AttnOutNorm)->name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(l0.entry(LayerParam::PostNorm)->name, "model.layers.0.pre_feedforward_layernorm.weight");
  EXPECT_EQ(l0.entry(LayerParam::FfnOutNorm)->name, "model.layers.0.post_feedforward_layernorm.weight");
  EXPECT_EQ(l0.entry(LayerParam::QNorm)->name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(l0.norm_init, 0.f);
  EXPECT_EQ(m.head().entries.size(), 1u);  // tied

  // The local layers' attention has the window; a window covering the row is left out.
  BatchDims d{2, 9, {}};
  EXPECT_EQ(attn_dims(s, d, 0).window, 4);
  EXPECT_EQ(attn_dims(s, d, 1).window, 0);
  EXPECT_EQ(attn_dims(s, BatchDims{2, 4, {}}, 0).window, 0);
  EXPECT_FLOAT_EQ(attn_dims(s, d, 1).scale, float(1.0 / std::sqrt(12.0)));
}

TEST(Gemma3Spec, LayerTypesAndV5RopeParameters) {
  json c = test::tiny_config("gemma3");
  c.erase("sliding_window_pattern");
  c.erase("rope_scaling");
  c.erase("rope_local_base_freq");
  c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  c["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const ModelSpec s = parse_model_spec(c, "g.json");
  EXPECT_EQ(s.local_layer, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(s.rope.type, "linear");
  EXPECT_EQ(s.rope.factor, 8.0);
  EXPECT_EQ(s.rope.theta, 1e6);
  EXPECT_EQ(s.rope_local.theta, 1e4);
  EXPECT_EQ(s.rope_local.type, "default");

  c["layer_types"] = {"full_attention", "sliding_attention"};
  expect_refused(c, "num_hidden_layers");
  c["layer_types"] = {"full_attention", "chunked_attention", "sliding_attention"};
  expect_refused(c, "chunked_attention");
}

TEST(Gemma3Spec, RefusesWhatIsNotSupported) {
  json c = test::tiny_config("gemma3");
  c["final_logit_softcapping"] = 30.0;
  expect_refused(c, "final_logit_softcapping");
  c = test::tiny_config("gemma3");
  c["attn_logit_softcapping"] = 50.0;
  expect_refused(c, "attn_logit_softcapping");
  c = test::tiny_config("gemma3");
  c["hidden_activation"] = "gelu";
  expect_refused(c, "hidden_activation");
  c = test::tiny_config("gemma3");
  c["use_bidirectional_attention"] = true;
  expect_refused(c, "use_bidirectional_attention");
  json mm = {{"model_type", "gemma3"}, {"architectures", {"Gemma3ForConditionalGeneration"}}};
  expect_refused(mm, "text_config");
}

// Gemma 4 (transformers >= 5.5) is recognised by architecture or model_type alone: its defaults
// (per-layer inputs of width 256, dense) are accepted, and so is the MoE block (session 12).
TEST(Gemma3Spec, Gemma4ConfigsAreReadWithTheirMoeBlock) {
  for (json c : {json{{"architectures", {"Gemma4ForConditionalGeneration"}}, {"model_type", "gemma4"}},
                 json{{"architectures", {"Gemma4ForCausalLM"}}, {"model_type", "gemma4_text"}},
                 json{{"model_type", "gemma4_text"}}}) {
    SCOPED_TRACE(c.dump());
    EXPECT_EQ(parse_model_spec(c, "cfg.json").gemma4.ple_dim, 256);
    json& t = c["model_type"] == "gemma4" ? (c["text_config"] = json::object()) : c;
    t["enable_moe_block"] = true;
    t["num_experts"] = 4;
    t["top_k_experts"] = 2;
    t["moe_intermediate_size"] = 8;
    const ModelSpec s = parse_model_spec(c, "cfg.json");
    EXPECT_TRUE(s.gemma4.moe_block);
    EXPECT_EQ(s.moe.n_expert, 4);
    EXPECT_EQ(s.moe.moe_layers(), s.n_layer);
  }
}

// google/gemma-3-4b-it's config.json as published: text_config carries only what differs from
// Gemma3TextConfig's defaults.
TEST(Gemma3Spec, PublishedMultimodalConfigUsesTheTextDefaults) {
  json c = {{"architectures", {"Gemma3ForConditionalGeneration"}},
            {"model_type", "gemma3"},
            {"torch_dtype", "bfloat16"},
            {"mm_tokens_per_image", 256},
            {"text_config",
             {{"hidden_size", 2560},
              {"intermediate_size", 10240},
              {"model_type", "gemma3_text"},
              {"num_hidden_layers", 34},
              {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
              {"sliding_window", 1024}}},
            {"vision_config", {{"hidden_size", 1152}, {"model_type", "siglip_vision_model"}}}};
  const ModelSpec s = parse_model_spec(c, "g.json");
  EXPECT_EQ(s.arch, Arch::Gemma3);
  EXPECT_EQ(s.model_type, "gemma3");
  EXPECT_EQ(s.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(s.torch_dtype, "bfloat16");
  EXPECT_EQ(s.vocab, 262208);
  EXPECT_EQ(s.n_head, 8);
  EXPECT_EQ(s.n_kv_head, 4);
  EXPECT_EQ(s.head_dim, 256);
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_EQ(s.local_window, 1024);
  int global = 0;
  for (int l = 0; l < s.n_layer; ++l) global += s.is_local(l) ? 0 : 1;
  EXPECT_EQ(global, 5);  // layers 5, 11, 17, 23, 29
  EXPECT_FALSE(s.is_local(5));
  EXPECT_EQ(s.rope.factor, 8.0);
  EXPECT_EQ(s.rope.theta, 1e6);
  EXPECT_EQ(s.rope_local.theta, 1e4);
  EXPECT_EQ(s.tensor_prefix, "language_model.model.");
  const ModelLayout m = make_layout(s);
  EXPECT_EQ(m.embedding().entries[0].name, "language_model.model.embed_tokens.weight");
  EXPECT_EQ(m.layer(3).entries[0].name, "language_model.model.layers.3.input_layernorm.weight");
  // About 3.88 B parameters in the language model (4.3 B with the vision tower).
  EXPECT_NEAR(double(s.total_params()) / 1e9, 3.88, 0.01);
}

class Gemma3Cli : public test::BinaryTest {};

// A gemma3 multimodal checkpoint (language model + vision tensors) is fine-tuned and saved: the
// language model's tensors under their names, the others byte for byte; both tensor spellings.
TEST_F(Gemma3Cli, MultimodalCheckpointRoundTrip) {
  json text = test::tiny_config("gemma3");
  text.erase("architectures");
  json cfg = {{"architectures", {"Gemma3ForConditionalGeneration"}},
              {"model_type", "gemma3"},
              {"torch_dtype", "bfloat16"},
              {"text_config", text},
              {"vision_config", {{"hidden_size", 8}, {"model_type", "siglip_vision_model"}}}};
  std::ofstream(p("mm.json")) << cfg.dump();
  test::CmdResult r = run("init --config " + p("mm.json") + " --output " + p("lm") + " --seed 5 --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  {
    const SafetensorsFile lm = SafetensorsFile::open(p("lm") + "/model.safetensors");
    ASSERT_NE(lm.find("language_model.model.layers.2.post_feedforward_layernorm.weight"), nullptr);
  }
  // Add "vision" tensors (bf16 and f32) under the two spellings of transformers.
  std::vector<uint16_t> vis(6 * 8);
  for (size_t i = 0; i < vis.size(); ++i) vis[i] = uint16_t(0x3f00 + i);
  std::vector<float> proj(8);
  for (size_t i = 0; i < proj.size(); ++i) proj[i] = 0.25f * float(i) - 1.f;
  for (const std::string spelling : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(spelling);
    const std::string src = p("src_" + spelling), out = p("out_" + spelling);
    const SafetensorsFile lm = SafetensorsFile::open(p("lm") + "/model.safetensors");
    std::vector<TensorWrite> tw;
    for (const TensorInfo& t : lm.tensors()) {
      std::string name = t.name;
      if (spelling != "language_model.model.") name = spelling + name.substr(std::strlen("language_model.model."));
      tw.push_back(TensorWrite{name, t.dtype, t.shape, t.data});
    }
    const std::string vision = (spelling == "language_model.model." ? "" : "model.") +
                               std::string("vision_tower.vision_model.embeddings.patch_embedding.weight");
    tw.push_back(TensorWrite{vision, DType::BF16, {6, 8}, vis.data()});
    tw.push_back(TensorWrite{"multi_modal_projector.mm_soft_emb_norm.weight", DType::F32, {8}, proj.data()});
    write_checkpoint_tensors(src, tw, size_t(1) << 30);
    fs::copy_file(p("lm") + "/config.json", src + "/config.json");

    std::ofstream(p("d.jsonl")) << "{\"input_ids\": [1, 5, 9, 3, 7, 2, 11, 4, 8, 6]}\n"
                                << "{\"input_ids\": [3, 3, 8, 1, 0, 2, 36, 4]}\n";
    r = run("train --model " + src + " --data " + p("d.jsonl") + " --output " + out +
            " --steps 2 --lr 1e-2 --seq-len 8 --batch-size 2 --device cpu");
    ASSERT_EQ(r.code, 0) << r.err;
    const SafetensorsFile a = SafetensorsFile::open(src + "/model.safetensors");
    const SafetensorsFile b = SafetensorsFile::open(out + "/model.safetensors");
    EXPECT_EQ(a.tensors().size(), b.tensors().size());
    for (const TensorInfo& t : a.tensors()) {
      const TensorInfo* u = b.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(u->dtype, t.dtype) << t.name;
      EXPECT_EQ(u->shape, t.shape) << t.name;
      const bool trained = t.name.find("language_model") != std::string::npos;
      const bool same = t.bytes == u->bytes && std::memcmp(t.data, u->data, t.bytes) == 0;
      if (!trained) {
        EXPECT_TRUE(same) << t.name << " changed";
      }
    }
    const TensorInfo* e0 = a.find(spelling + "embed_tokens.weight");
    const TensorInfo* e1 = b.find(spelling + "embed_tokens.weight");
    ASSERT_TRUE(e0 && e1);
    EXPECT_NE(std::memcmp(e0->data, e1->data, e0->bytes), 0);  // trained
    const json saved = json::parse(test::slurp(out + "/config.json"));
    EXPECT_EQ(saved["model_type"], "gemma3");
    EXPECT_TRUE(saved.contains("vision_config"));
  }
}

}  // namespace
}  // namespace sf
