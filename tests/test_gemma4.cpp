// Gemma 4 config reading (docs/GEMMA4.md): the published 31B and 26B-A4B shapes read into per-layer
// head dims, KV heads and RoPE, their parameter counts against the published totals (30.7B;
// 25.2B total, 3.8B active), K/V sharing, the multimodal spelling, every refusal of a hostile
// config (file and key named), and parse_model_spec's refusal naming what is still missing.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <functional>
#include <random>
#include <tuple>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/kernels.h"
#include "engine/blob_init.h"
#include "engine/planner.h"
#include "core/error.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/rope.h"
#include "model/spec.h"
#include "model/spec_gemma4.h"
#include "gemma4_fixtures.h"
#include "rope_fixture.h"
#include "test_util.h"

namespace sf {
namespace {

using nlohmann::json;

// Five sliding layers, then a full one (Gemma 4's pattern); the last layer full.
json layer_types(int n) { return test::gemma4_layer_types(n); }

// google/gemma-4-31B's text shape as third-party readers of its config.json record it
// (docs/GEMMA4.md; the next session checks it against the real file).
json config_31b() {
  return json{{"architectures", {"Gemma4ForCausalLM"}},
              {"model_type", "gemma4_text"},
              {"vocab_size", 262144},
              {"hidden_size", 5376},
              {"intermediate_size", 21504},
              {"num_hidden_layers", 60},
              {"num_attention_heads", 32},
              {"num_key_value_heads", 16},
              {"num_global_key_value_heads", 4},
              {"head_dim", 256},
              {"global_head_dim", 512},
              {"attention_k_eq_v", true},
              {"hidden_size_per_layer_input", 0},
              {"num_kv_shared_layers", 0},
              {"sliding_window", 1024},
              {"final_logit_softcapping", 30.0},
              {"layer_types", layer_types(60)},
              {"rope_parameters",
               {{"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}}},
                {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000}}},
                {"rope_theta", nullptr},
                {"rope_type", "default"}}},
              {"tie_word_embeddings", true},
              {"torch_dtype", "bfloat16"}};
}

json config_26b_a4b() {
  json c = config_31b();
  c["hidden_size"] = 2816;
  c["intermediate_size"] = 2112;
  c["num_hidden_layers"] = 30;
  c["num_attention_heads"] = 16;
  c["num_key_value_heads"] = 8;
  c["num_global_key_value_heads"] = 2;
  c["layer_types"] = layer_types(30);
  c["enable_moe_block"] = true;
  c["num_experts"] = 128;
  c["top_k_experts"] = 8;
  c["moe_intermediate_size"] = 704;
  return c;
}

// A tiny dense config for the refusal tests.
json config_tiny() { return test::gemma4_tiny_config(); }

TEST(Gemma4Spec, Published31BShape) {
  const ModelSpec s = read_gemma4_spec(config_31b(), "g4.json");
  EXPECT_EQ(s.arch, Arch::Gemma4);
  EXPECT_EQ(s.model_type, "gemma4_text");
  EXPECT_EQ(s.tensor_prefix, "model.");
  const Gemma4Spec& g = s.gemma4;
  ASSERT_EQ(g.head_dim.size(), 60u);
  for (int l = 0; l < 60; ++l) {
    const bool global = (l + 1) % 6 == 0;
    EXPECT_EQ(s.is_local(l), !global) << l;
    EXPECT_EQ(g.head_dim[size_t(l)], global ? 512 : 256) << l;
    EXPECT_EQ(g.kv_heads[size_t(l)], global ? 4 : 16) << l;
    EXPECT_FALSE(g.kv_shared(l)) << l;
  }
  EXPECT_TRUE(g.k_eq_v);
  EXPECT_DOUBLE_EQ(g.global_rope_fraction, 0.25);
  EXPECT_DOUBLE_EQ(s.rope.theta, 1e6);
  EXPECT_EQ(s.rope.type, "default");
  EXPECT_DOUBLE_EQ(s.rope_local.theta, 1e4);
  EXPECT_EQ(s.local_window, 1024);
  EXPECT_EQ(s.sliding_window, 0);
  EXPECT_DOUBLE_EQ(g.final_softcap, 30.0);
  EXPECT_DOUBLE_EQ(s.attn_scale, 1.0);
  EXPECT_FALSE(s.gemma_norm);  // weight-scaled norms, weights start at 1
  EXPECT_TRUE(s.sandwich_norm && s.gelu_mlp && s.embed_scale && s.qk_norm);
  EXPECT_EQ(g.ple_dim, 0);
  EXPECT_FALSE(g.moe_block);
  EXPECT_EQ(s.pad_token_id, 0);
  // Published: 30.7B parameters.
  EXPECT_EQ(s.total_params(), 30697345280);
}

// The planner's FLOPs per token (MFU, the compute model) on the 31B's own per-layer widths: the
// matrix parameters from the spec's parameter count less its norms, attention over each layer's
// width (512-wide global heads) and the keys its queries see (window 1024 on local layers); with
// the last 10 layers sharing K/V (and double-wide), their k projections drop out.
// QK^T and PV FLOPs a token costs in layer l of a T-token sequence: keys seen on average (local
// layers: at most the window, 1024 in the published configs), 4 n_head d per key.
double attention_flops_of(const ModelSpec& s, int T, int l) {
  double keys = 0.5 * T;
  if (s.is_local(l)) {
    keys = 0;
    for (int i = 0; i < T; ++i) keys += std::min(i + 1, 1024);
    keys /= T;
  }
  return 4.0 * s.n_head * s.gemma4.head_dim[size_t(l)] * keys;
}

TEST(Gemma4Spec, PlannerFlopsUseEachLayersWidths) {
  for (const int shared : {0, 10}) {
    SCOPED_TRACE(shared);
    json c = config_31b();
    c["num_kv_shared_layers"] = shared;
    c["use_double_wide_mlp"] = shared > 0;
    const ModelSpec s = parse_model_spec(c, "g4.json");
    const int T = 4096;
    double Pd = 0, attn = 0;
    for (int l = 0; l < s.n_layer; ++l) {
      const int hd = s.gemma4.head_dim[size_t(l)];
      const bool own_kv = !s.gemma4.kv_shared(l);
      Pd += double(s.layer_params(l) - 4 * s.hidden - hd - (own_kv ? hd : 0));  // less the norms
      attn += attention_flops_of(s, T, l);
    }
    const double head = double(s.vocab) * double(s.hidden);  // tied
    EXPECT_NEAR(train_flops_per_token(s, T, false) / (3 * (2 * Pd + 2 * head + attn)), 1.0, 1e-12);
    EXPECT_NEAR(train_flops_per_token(s, T, true) / (8 * Pd + 6 * head + 4.5 * attn), 1.0, 1e-12);
  }
}

// The 26B-A4B's FLOPs count the MoE block's active parameters (router, top 8 experts) beside the
// dense MLP, and a workspace holds the routing buffers of the worst case (every slot on one
// expert needs no more: the sorted rows are N*k whatever the routing).
TEST(Gemma4Spec, PlannerCountsTheMoeBlock) {
  const ModelSpec s = parse_model_spec(config_26b_a4b(), "g4.json");
  const int T = 4096;
  double Pd = 0, attn = 0;
  for (int l = 0; l < s.n_layer; ++l) {
    const int hd = s.gemma4.head_dim[size_t(l)];
    // less the norms (4 + 3 MoE ones), q/k norms, router.scale and per_expert_scale: not matrices
    Pd += double(s.layer_active_params(l) - 7 * s.hidden - 2 * hd - s.hidden - s.moe.n_expert);
    attn += attention_flops_of(s, T, l);
  }
  const double head = double(s.vocab) * double(s.hidden);
  EXPECT_NEAR(train_flops_per_token(s, T, false) / (3 * (2 * Pd + 2 * head + attn)), 1.0, 1e-12);
  // The routed experts are a small share of the stored ones: 8 of 128.
  EXPECT_LT(Pd, 0.2 * double(s.total_params()));
  const size_t with = Workspace::bytes_for(s, 1, 512, DType::BF16, 0, 0);
  ModelSpec dense = s;
  dense.moe = MoeSpec{};
  dense.gemma4.moe_block = false;
  const size_t without = Workspace::bytes_for(dense, 1, 512, DType::BF16, 0, 0);
  // At least: xs and ys [N*k, H], three [N*k, Ie], logits [N, E] bf16, probs [N, E] F32, the
  // block's four [N, H] buffers.
  const size_t N = 512, k = 8, H = 2816, Ie = 704, E = 128;
  EXPECT_GE(with - without, (2 * N * k * H + 3 * N * k * Ie + N * E + 4 * N * H) * 2 + N * E * 4);
}

TEST(Gemma4Spec, Published26BA4BShape) {
  const ModelSpec s = read_gemma4_spec(config_26b_a4b(), "g4.json");
  const Gemma4Spec& g = s.gemma4;
  EXPECT_TRUE(g.moe_block);
  EXPECT_EQ(g.n_expert, 128);
  EXPECT_EQ(g.top_k, 8);
  EXPECT_EQ(g.moe_intermediate, 704);
  EXPECT_EQ(g.kv_heads[5], 2);
  EXPECT_EQ(g.kv_heads[4], 8);
  // Published: 25.2B total, 3.8B active.
  EXPECT_EQ(s.total_params(), 25233141760);
  int64_t active = s.vocab * s.hidden + s.hidden;
  for (int l = 0; l < s.n_layer; ++l) active += s.layer_active_params(l);
  EXPECT_EQ(active, 3822530560);
}

// Dense models (the 31B: k = v, 512-wide global heads, proportional RoPE, the soft cap; shared K/V),
// per-layer inputs and the MoE block (the 26B-A4B) are accepted.
TEST(Gemma4Spec, ParseModelSpecAcceptsEveryPart) {
  const ModelSpec dense = parse_model_spec(config_31b(), "g4.json");
  EXPECT_EQ(dense.arch, Arch::Gemma4);
  EXPECT_EQ(detail::gemma4_missing(dense), "");
  EXPECT_FALSE(dense.is_moe());
  // The 26B-A4B: its MoE block in the MoE fields the engines size from, in every layer.
  const ModelSpec moe = parse_model_spec(config_26b_a4b(), "g4.json");
  EXPECT_EQ(detail::gemma4_missing(moe), "");
  EXPECT_EQ(moe.moe.n_expert, 128);
  EXPECT_EQ(moe.moe.top_k, 8);
  EXPECT_EQ(moe.moe.intermediate, 704);
  EXPECT_TRUE(moe.moe.norm_topk);
  EXPECT_TRUE(moe.moe.fused_experts);
  EXPECT_FALSE(moe.moe.aux_loss);
  EXPECT_EQ(moe.moe.moe_layers(), moe.n_layer);
  // The published E-models' per-layer input embeddings, shared K/V and double-wide MLPs: accepted.
  json e = config_tiny();
  e["hidden_size_per_layer_input"] = 8;
  e["num_kv_shared_layers"] = 2;
  e["use_double_wide_mlp"] = true;
  e["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                      "sliding_attention", "sliding_attention", "full_attention"};
  const ModelSpec shared = parse_model_spec(e, "g4.json");
  EXPECT_EQ(shared.gemma4.ple_dim, 8);
  EXPECT_EQ(shared.gemma4.n_kv_shared, 2);
  EXPECT_EQ(shared.gemma4.mlp_intermediate(5, shared.intermediate), 2 * shared.intermediate);
  // With the MoE block too: accepted.
  e["enable_moe_block"] = true;
  e["num_experts"] = 4;
  e["top_k_experts"] = 2;
  e["moe_intermediate_size"] = 8;
  EXPECT_EQ(parse_model_spec(e, "g4.json").moe.n_expert, 4);
}

// Gemma4Config with a text_config: the language model's names under model.language_model.; the
// outer model_type, architectures and tying win; without text_config, Gemma4TextConfig's defaults.
TEST(Gemma4Spec, MultimodalConfig) {
  json c = {{"architectures", {"Gemma4ForConditionalGeneration"}},
            {"model_type", "gemma4"},
            {"tie_word_embeddings", true},
            {"text_config", config_tiny()},
            {"vision_config", {{"model_type", "gemma4_vision"}}}};
  c["text_config"]["tie_word_embeddings"] = false;
  const ModelSpec s = read_gemma4_spec(c, "g4.json");
  EXPECT_EQ(s.tensor_prefix, "model.language_model.");
  EXPECT_EQ(s.model_type, "gemma4");
  EXPECT_TRUE(s.tie_embeddings);
  EXPECT_EQ(s.hidden, 32);
  const ModelSpec d = read_gemma4_spec(json{{"model_type", "gemma4"}}, "g4.json");
  EXPECT_EQ(d.hidden, 2304);
  EXPECT_EQ(d.n_layer, 30);
  EXPECT_EQ(d.gemma4.ple_dim, 256);  // Gemma4TextConfig's default
  EXPECT_EQ(d.gemma4.head_dim[29], 512);
  EXPECT_EQ(d.gemma4.kv_heads[29], 4);  // no k_eq_v: global layers keep num_key_value_heads
}

// Without layer_types every 6th layer is global, and transformers forces the last one global.
TEST(Gemma4Spec, DefaultLayerTypesEndGlobal) {
  json c = config_tiny();
  c.erase("layer_types");
  c["num_hidden_layers"] = 4;
  const ModelSpec s = read_gemma4_spec(c, "g4.json");
  EXPECT_EQ(s.local_layer, (std::vector<bool>{true, true, true, false}));
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "sliding_attention"};
  const ModelSpec t = read_gemma4_spec(c, "g4.json");
  EXPECT_EQ(t.local_layer, (std::vector<bool>{true, false, true, false}));
  // Without rope_parameters: transformers' defaults (proportional over a quarter, 1e6; local 1e4).
  EXPECT_DOUBLE_EQ(t.gemma4.global_rope_fraction, 0.25);
  EXPECT_DOUBLE_EQ(t.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(t.rope_local.theta, 1e4);
}

// The last num_kv_shared_layers reuse the K/V of the last earlier layer of their type; with
// use_double_wide_mlp their MLP is twice as wide; they have no k/v projections or norms.
TEST(Gemma4Spec, SharedKvLayers) {
  json c = config_tiny();
  c["num_kv_shared_layers"] = 2;  // layers 4 (sliding) and 5 (full)
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                      "sliding_attention", "sliding_attention", "full_attention"};
  c["use_double_wide_mlp"] = true;
  const ModelSpec s = read_gemma4_spec(c, "g4.json");
  EXPECT_EQ(s.gemma4.kv_source, (std::vector<int>{0, 1, 2, 3, 3, 1}));
  EXPECT_TRUE(s.gemma4.kv_shared(4));
  EXPECT_FALSE(s.gemma4.kv_shared(3));
  EXPECT_EQ(s.gemma4.mlp_intermediate(4, 48), 96);
  EXPECT_EQ(s.gemma4.mlp_intermediate(3, 48), 48);
  // Layer 3 (sliding, own K/V, normal MLP) vs layer 4 (shared, double MLP): k_proj, v_proj and
  // k_norm gone (head dim 8, 2 KV heads), 3 * 32 * 48 more MLP.
  EXPECT_EQ(s.layer_params(4) - s.layer_params(3), 3 * 32 * 48 - (2 * 32 * 16 + 8));
  // A shared full layer with no earlier full layer to take K/V from.
  c["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention",
                      "sliding_attention", "sliding_attention", "full_attention"};
  c["num_kv_shared_layers"] = 1;
  test::expect_input_error([&] { read_gemma4_spec(c, "g4.json"); }, {"g4.json", "layer 5", "no earlier layer"});
  c["num_kv_shared_layers"] = 6;
  test::expect_input_error([&] { read_gemma4_spec(c, "g4.json"); }, {"g4.json", "num_kv_shared_layers"});
}

// Newer transformers write the global layers' head dim and KV heads as per_layer_config.
TEST(Gemma4Spec, PerLayerConfig) {
  json c = config_tiny();
  c.erase("global_head_dim");
  c["per_layer_config"] = {{"5", {{"head_dim", 32}, {"num_key_value_heads", 1}}}};
  c["rope_parameters"] = {{"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.5}}},
                          {"sliding_attention", {{"rope_type", "default"}}}};
  const ModelSpec s = read_gemma4_spec(c, "g4.json");
  EXPECT_EQ(s.gemma4.head_dim[5], 32);
  EXPECT_EQ(s.gemma4.kv_heads[5], 1);
  EXPECT_EQ(s.gemma4.head_dim[4], 8);
  EXPECT_DOUBLE_EQ(s.gemma4.global_rope_fraction, 0.5);
}

// Every hostile value is refused naming the file and the key.
TEST(Gemma4Spec, HostileConfigsNameFileAndKey) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"layer_types length", [](json& c) { c["layer_types"] = {"full_attention"}; }, {"layer_types", "has 1 entries"}},
      {"layer type", [](json& c) { c["layer_types"][0] = "chunked_attention"; }, {"layer_types[0]", "chunked"}},
      {"global head dim odd", [](json& c) { c["global_head_dim"] = 15; }, {"head dim 15 is odd"}},
      {"global head dim huge", [](json& c) { c["global_head_dim"] = 1e9; }, {"global_head_dim", "out of range"}},
      {"global head dim type", [](json& c) { c["global_head_dim"] = "512"; }, {"global_head_dim", "string"}},
      {"global kv heads", [](json& c) { c["num_global_key_value_heads"] = 3; }, {"layer 5", "multiple"}},
      {"global kv heads zero", [](json& c) { c["num_global_key_value_heads"] = 0; },
       {"num_global_key_value_heads", "out of range"}},
      {"rope type", [](json& c) { c["rope_parameters"] = {{"full_attention", {{"rope_type", "yarn"}}},
                                                          {"sliding_attention", json::object()}}; },
       {"full_attention", "yarn"}},
      {"rope fraction", [](json& c) {
         c["rope_parameters"] = {{"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 1.5}}},
                                 {"sliding_attention", json::object()}};
       },
       {"partial_rotary_factor", "out of range"}},
      {"rope fraction zero", [](json& c) {
         c["rope_parameters"] = {{"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0}}},
                                 {"sliding_attention", json::object()}};
       },
       {"partial_rotary_factor must be in (0, 1]"}},
      {"default rope on wide heads", [](json& c) {
         c["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}, {"sliding_attention", json::object()}};
       },
       {"full_attention", "'default'", "proportional"}},
      {"rope entry missing", [](json& c) {
         c["rope_parameters"] = {{"sliding_attention", json::object()}};
       },
       {"rope_parameters", "full_attention"}},
      {"rope theta", [](json& c) {
         c["rope_parameters"] = {{"full_attention", {{"rope_type", "proportional"}, {"rope_theta", -1}}},
                                 {"sliding_attention", json::object()}};
       },
       {"rope_theta", "out of range"}},
      {"partial local rope", [](json& c) {
         c["rope_parameters"] = {{"full_attention", {{"rope_type", "proportional"}}},
                                 {"sliding_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.5}}}};
       },
       {"sliding_attention", "partial rotary"}},
      {"softcap negative", [](json& c) { c["final_logit_softcapping"] = -1.0; },
       {"final_logit_softcapping", "out of range"}},
      {"softcap zero", [](json& c) { c["final_logit_softcapping"] = 0.0; }, {"final_logit_softcapping must be positive"}},
      {"attn softcap", [](json& c) { c["attn_logit_softcapping"] = 50.0; }, {"attn_logit_softcapping"}},
      {"moe without experts", [](json& c) { c["enable_moe_block"] = true; }, {"enable_moe_block needs 'num_experts'"}},
      {"moe top k", [](json& c) {
         c["enable_moe_block"] = true;
         c["num_experts"] = 4;
         c["top_k_experts"] = 5;
         c["moe_intermediate_size"] = 8;
       },
       {"top_k_experts (5) exceeds num_experts (4)"}},
      {"moe experts huge", [](json& c) {
         c["enable_moe_block"] = true;
         c["num_experts"] = 1e7;
         c["top_k_experts"] = 1;
         c["moe_intermediate_size"] = 8;
       },
       {"num_experts", "out of range"}},
      {"bidirectional", [](json& c) { c["use_bidirectional_attention"] = "all"; }, {"use_bidirectional_attention"}},
      {"bias", [](json& c) { c["attention_bias"] = true; }, {"attention_bias"}},
      {"dropout", [](json& c) { c["attention_dropout"] = 0.1; }, {"attention_dropout"}},
      {"activation", [](json& c) { c["hidden_activation"] = "relu"; }, {"hidden_activation 'relu'"}},
      {"ple dim", [](json& c) { c["hidden_size_per_layer_input"] = -1; }, {"hidden_size_per_layer_input"}},
      {"ple vocab", [](json& c) { c["vocab_size_per_layer_input"] = 0; }, {"vocab_size_per_layer_input"}},
      {"per_layer_config index", [](json& c) { c["per_layer_config"] = {{"x", json::object()}}; },
       {"per_layer_config", "not a layer index"}},
      {"per_layer_config range", [](json& c) { c["per_layer_config"] = {{"6", json::object()}}; },
       {"per_layer_config", "not a layer index"}},
      {"per_layer_config mixed", [](json& c) {
         c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention",
                             "sliding_attention", "sliding_attention", "full_attention"};
         c["per_layer_config"] = {{"0", {{"head_dim", 16}}}, {"5", {{"head_dim", 32}}}};
       },
       {"layer 5", "differs from the other full attention layers' (16)"}},
      {"text_config type", [](json& c) { c = json{{"model_type", "gemma4"}, {"text_config", "x"}}; },
       {"text_config"}},
      {"kv heads", [](json& c) { c["num_key_value_heads"] = 3; }, {"num_key_value_heads"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    json c = config_tiny();
    k.edit(c);
    std::vector<std::string> needles = k.needles;
    needles.push_back("g4.json");
    test::expect_input_error([&] { read_gemma4_spec(c, "g4.json"); }, needles);
    test::expect_input_error([&] { parse_model_spec(c, "g4.json"); }, needles);
  }
  // Not a Gemma 4 config.
  test::expect_input_error([&] { read_gemma4_spec(json{{"model_type", "llama"}, {"vocab_size", 8}}, "l.json"); },
                           {"l.json"});
}

// The parameter layout of the dense shapes: per-layer q/k/v/o shapes, no v_proj on k=v global
// layers, no k/v on KV-shared layers, double-wide MLPs there, norms starting at 1; every parameter
// counted once (the entries sum to total_params).
int64_t entries_numel(const ModelLayout& m) {
  int64_t n = 0;
  for (const BlobLayout& b : m.blobs)
    for (const BlobEntry& e : b.entries) n += e.numel;
  return n;
}

std::vector<int64_t> shape_of(const BlobLayout& b, const std::string& suffix) {
  for (const BlobEntry& e : b.entries)
    if (e.name.size() >= suffix.size() && e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return e.shape;
  return {};
}

TEST(Gemma4Layout, DenseShapes) {
  const ModelSpec s = read_gemma4_spec(config_31b(), "g4.json");
  const ModelLayout m = make_layout(s);
  ASSERT_EQ(m.blobs.size(), 62u);
  EXPECT_EQ(entries_numel(m), s.total_params());
  const BlobLayout& local = m.layer(4);
  const BlobLayout& global = m.layer(5);
  EXPECT_EQ(shape_of(local, "layers.4.self_attn.q_proj.weight"), (std::vector<int64_t>{32 * 256, 5376}));
  EXPECT_EQ(shape_of(local, "layers.4.self_attn.v_proj.weight"), (std::vector<int64_t>{16 * 256, 5376}));
  EXPECT_EQ(shape_of(global, "layers.5.self_attn.q_proj.weight"), (std::vector<int64_t>{32 * 512, 5376}));
  EXPECT_EQ(shape_of(global, "layers.5.self_attn.k_proj.weight"), (std::vector<int64_t>{4 * 512, 5376}));
  EXPECT_EQ(shape_of(global, "layers.5.self_attn.o_proj.weight"), (std::vector<int64_t>{5376, 32 * 512}));
  EXPECT_EQ(shape_of(global, "layers.5.self_attn.q_norm.weight"), (std::vector<int64_t>{512}));
  EXPECT_TRUE(shape_of(global, "v_proj.weight").empty());
  EXPECT_EQ(global.entry(LayerParam::Wv), nullptr);
  EXPECT_TRUE(shape_of(global, "v_norm.weight").empty());
  EXPECT_EQ(global.norm_init, 1.f);
  int64_t largest_layer = 0;
  for (int l = 0; l < s.n_layer; ++l) largest_layer = std::max(largest_layer, m.layer(l).numel);
  EXPECT_EQ(largest_layer, global.numel);  // the 512-wide global layers are the largest
  EXPECT_GT(global.numel, local.numel);
  EXPECT_EQ(m.layer(0).entries.front().name, "model.layers.0.input_layernorm.weight");
  // Views of a (tiny) global layer: q [n_head * 16, H], k [1 * 16, H], no v.
  const ModelSpec tv = read_gemma4_spec(config_tiny(), "g4.json");
  const ModelLayout mv = make_layout(tv);
  std::vector<float> blob(size_t(mv.layer(5).numel));
  const LayerParams v = layer_views(mv.layer(5), blob.data(), DType::F32);
  EXPECT_EQ(v[LayerParam::Wq].rows(), 4 * 16);
  EXPECT_EQ(v[LayerParam::Wk].rows(), 16);
  EXPECT_EQ(v[LayerParam::QNorm].numel(), 16);
  EXPECT_TRUE(v[LayerParam::Wv].empty());

  json c = config_tiny();
  c["num_kv_shared_layers"] = 2;
  c["use_double_wide_mlp"] = true;
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                      "sliding_attention", "sliding_attention", "full_attention"};
  const ModelSpec t = read_gemma4_spec(c, "g4.json");
  const ModelLayout mt = make_layout(t);
  EXPECT_EQ(entries_numel(mt), t.total_params());
  const BlobLayout& sh = mt.layer(4);
  EXPECT_EQ(sh.entry(LayerParam::Wk), nullptr);
  EXPECT_EQ(sh.entry(LayerParam::KNorm), nullptr);
  EXPECT_EQ(sh.entry(LayerParam::Wv), nullptr);
  EXPECT_EQ(shape_of(sh, "mlp.gate_proj.weight"), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(shape_of(mt.layer(3), "mlp.gate_proj.weight"), (std::vector<int64_t>{48, 32}));
  // The MoE block: transformers' names, the fused experts stored as two tensors over the
  // per-expert entries (expert e's gate rows, then its up rows), entries summing to the count.
  c["enable_moe_block"] = true;
  c["num_experts"] = 4;
  c["top_k_experts"] = 2;
  c["moe_intermediate_size"] = 8;
  const ModelSpec ms = read_gemma4_spec(c, "g4.json");
  const ModelLayout mm = make_layout(ms);
  EXPECT_EQ(entries_numel(mm), ms.total_params());
  const BlobLayout& b = mm.layer(4);
  EXPECT_EQ(shape_of(b, "router.proj.weight"), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(shape_of(b, "router.scale"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape_of(b, "router.per_expert_scale"), (std::vector<int64_t>{4}));
  for (const char* n : {"pre_feedforward_layernorm_2.weight", "post_feedforward_layernorm_1.weight",
                        "post_feedforward_layernorm_2.weight"})
    EXPECT_EQ(shape_of(b, n), (std::vector<int64_t>{32})) << n;
  ASSERT_NE(b.entry(LayerParam::ExpGate), nullptr);
  EXPECT_EQ(b.entry(LayerParam::ExpGate)->group, 4);
  const StoredTensor* gu = nullptr;
  for (const StoredTensor& t : b.stored)
    if (t.name == "model.layers.4.experts.gate_up_proj") gu = &t;
  ASSERT_NE(gu, nullptr);
  EXPECT_EQ(gu->shape, (std::vector<int64_t>{4, 16, 32}));
  ASSERT_EQ(gu->parts.size(), 8u);
  EXPECT_EQ(b.entries[size_t(gu->parts[2].entry)].name, "model.layers.4.experts.1.gate");
  EXPECT_EQ(gu->parts[3].offset, 3 * 8 * 32);  // expert 1's up rows
  for (const StoredTensor& t : b.stored) EXPECT_EQ(t.name.find("experts.0."), std::string::npos) << t.name;
}

// transformers 5.17's own save of the reference's ple_kvshared variant (tools/gemma4_reference.py
// --names on the GPU machine, bench/results/2026-12-02s11_gpu_1_gemma4_ref.log): its config.json as
// written, and every tensor name and shape but the layer_scalar buffers (not parameters).
const char* kPleKvsharedConfig = R"json({
 "architectures": [
  "Gemma4ForCausalLM"
 ],
 "attention_bias": false,
 "attention_dropout": 0.0,
 "attention_k_eq_v": true,
 "bos_token_id": 2,
 "dtype": "float32",
 "enable_moe_block": false,
 "eos_token_id": 1,
 "final_logit_softcapping": 2.0,
 "head_dim": 16,
 "hidden_activation": "gelu_pytorch_tanh",
 "hidden_size": 64,
 "hidden_size_per_layer_input": 8,
 "initializer_range": 0.1,
 "intermediate_size": 96,
 "layer_types": [
  "sliding_attention",
  "full_attention",
  "sliding_attention",
  "sliding_attention",
  "sliding_attention",
  "full_attention"
 ],
 "max_position_embeddings": 64,
 "model_type": "gemma4_text",
 "moe_intermediate_size": null,
 "num_attention_heads": 4,
 "num_experts": null,
 "num_hidden_layers": 6,
 "num_key_value_heads": 2,
 "num_kv_shared_layers": 2,
 "pad_token_id": 0,
 "per_layer_config": {
  "1": {
   "head_dim": 32,
   "num_key_value_heads": 1
  },
  "5": {
   "head_dim": 32,
   "num_key_value_heads": 1
  }
 },
 "rms_norm_eps": 1e-06,
 "rope_parameters": {
  "full_attention": {
   "partial_rotary_factor": 0.25,
   "rope_theta": 1000000.0,
   "rope_type": "proportional"
  },
  "sliding_attention": {
   "rope_theta": 10000.0,
   "rope_type": "default"
  }
 },
 "sliding_window": 5,
 "tie_word_embeddings": true,
 "top_k_experts": null,
 "transformers_version": "5.17.0",
 "use_bidirectional_attention": null,
 "use_cache": true,
 "use_double_wide_mlp": true,
 "vocab_size": 96,
 "vocab_size_per_layer_input": 96
})json";
const char* kPleKvsharedTensors[] = {
    "model.embed_tokens.weight [96, 64]",
    "model.embed_tokens_per_layer.weight [96, 48]",
    "model.layers.0.input_layernorm.weight [64]",
    "model.layers.0.mlp.down_proj.weight [64, 96]",
    "model.layers.0.mlp.gate_proj.weight [96, 64]",
    "model.layers.0.mlp.up_proj.weight [96, 64]",
    "model.layers.0.per_layer_input_gate.weight [8, 64]",
    "model.layers.0.per_layer_projection.weight [64, 8]",
    "model.layers.0.post_attention_layernorm.weight [64]",
    "model.layers.0.post_feedforward_layernorm.weight [64]",
    "model.layers.0.post_per_layer_input_norm.weight [64]",
    "model.layers.0.pre_feedforward_layernorm.weight [64]",
    "model.layers.0.self_attn.k_norm.weight [16]",
    "model.layers.0.self_attn.k_proj.weight [32, 64]",
    "model.layers.0.self_attn.o_proj.weight [64, 64]",
    "model.layers.0.self_attn.q_norm.weight [16]",
    "model.layers.0.self_attn.q_proj.weight [64, 64]",
    "model.layers.0.self_attn.v_proj.weight [32, 64]",
    "model.layers.1.input_layernorm.weight [64]",
    "model.layers.1.mlp.down_proj.weight [64, 96]",
    "model.layers.1.mlp.gate_proj.weight [96, 64]",
    "model.layers.1.mlp.up_proj.weight [96, 64]",
    "model.layers.1.per_layer_input_gate.weight [8, 64]",
    "model.layers.1.per_layer_projection.weight [64, 8]",
    "model.layers.1.post_attention_layernorm.weight [64]",
    "model.layers.1.post_feedforward_layernorm.weight [64]",
    "model.layers.1.post_per_layer_input_norm.weight [64]",
    "model.layers.1.pre_feedforward_layernorm.weight [64]",
    "model.layers.1.self_attn.k_norm.weight [32]",
    "model.layers.1.self_attn.k_proj.weight [32, 64]",
    "model.layers.1.self_attn.o_proj.weight [64, 128]",
    "model.layers.1.self_attn.q_norm.weight [32]",
    "model.layers.1.self_attn.q_proj.weight [128, 64]",
    "model.layers.2.input_layernorm.weight [64]",
    "model.layers.2.mlp.down_proj.weight [64, 96]",
    "model.layers.2.mlp.gate_proj.weight [96, 64]",
    "model.layers.2.mlp.up_proj.weight [96, 64]",
    "model.layers.2.per_layer_input_gate.weight [8, 64]",
    "model.layers.2.per_layer_projection.weight [64, 8]",
    "model.layers.2.post_attention_layernorm.weight [64]",
    "model.layers.2.post_feedforward_layernorm.weight [64]",
    "model.layers.2.post_per_layer_input_norm.weight [64]",
    "model.layers.2.pre_feedforward_layernorm.weight [64]",
    "model.layers.2.self_attn.k_norm.weight [16]",
    "model.layers.2.self_attn.k_proj.weight [32, 64]",
    "model.layers.2.self_attn.o_proj.weight [64, 64]",
    "model.layers.2.self_attn.q_norm.weight [16]",
    "model.layers.2.self_attn.q_proj.weight [64, 64]",
    "model.layers.2.self_attn.v_proj.weight [32, 64]",
    "model.layers.3.input_layernorm.weight [64]",
    "model.layers.3.mlp.down_proj.weight [64, 96]",
    "model.layers.3.mlp.gate_proj.weight [96, 64]",
    "model.layers.3.mlp.up_proj.weight [96, 64]",
    "model.layers.3.per_layer_input_gate.weight [8, 64]",
    "model.layers.3.per_layer_projection.weight [64, 8]",
    "model.layers.3.post_attention_layernorm.weight [64]",
    "model.layers.3.post_feedforward_layernorm.weight [64]",
    "model.layers.3.post_per_layer_input_norm.weight [64]",
    "model.layers.3.pre_feedforward_layernorm.weight [64]",
    "model.layers.3.self_attn.k_norm.weight [16]",
    "model.layers.3.self_attn.k_proj.weight [32, 64]",
    "model.layers.3.self_attn.o_proj.weight [64, 64]",
    "model.layers.3.self_attn.q_norm.weight [16]",
    "model.layers.3.self_attn.q_proj.weight [64, 64]",
    "model.layers.3.self_attn.v_proj.weight [32, 64]",
    "model.layers.4.input_layernorm.weight [64]",
    "model.layers.4.mlp.down_proj.weight [64, 192]",
    "model.layers.4.mlp.gate_proj.weight [192, 64]",
    "model.layers.4.mlp.up_proj.weight [192, 64]",
    "model.layers.4.per_layer_input_gate.weight [8, 64]",
    "model.layers.4.per_layer_projection.weight [64, 8]",
    "model.layers.4.post_attention_layernorm.weight [64]",
    "model.layers.4.post_feedforward_layernorm.weight [64]",
    "model.layers.4.post_per_layer_input_norm.weight [64]",
    "model.layers.4.pre_feedforward_layernorm.weight [64]",
    "model.layers.4.self_attn.o_proj.weight [64, 64]",
    "model.layers.4.self_attn.q_norm.weight [16]",
    "model.layers.4.self_attn.q_proj.weight [64, 64]",
    "model.layers.5.input_layernorm.weight [64]",
    "model.layers.5.mlp.down_proj.weight [64, 192]",
    "model.layers.5.mlp.gate_proj.weight [192, 64]",
    "model.layers.5.mlp.up_proj.weight [192, 64]",
    "model.layers.5.per_layer_input_gate.weight [8, 64]",
    "model.layers.5.per_layer_projection.weight [64, 8]",
    "model.layers.5.post_attention_layernorm.weight [64]",
    "model.layers.5.post_feedforward_layernorm.weight [64]",
    "model.layers.5.post_per_layer_input_norm.weight [64]",
    "model.layers.5.pre_feedforward_layernorm.weight [64]",
    "model.layers.5.self_attn.o_proj.weight [64, 128]",
    "model.layers.5.self_attn.q_norm.weight [32]",
    "model.layers.5.self_attn.q_proj.weight [128, 64]",
    "model.norm.weight [64]",
    "model.per_layer_model_projection.weight [48, 64]",
    "model.per_layer_projection_norm.weight [8]",
};

// Per-layer inputs are laid out as transformers saves them: the stored names and shapes of the
// layout equal transformers' list exactly, and every parameter is counted once.
TEST(Gemma4Layout, PerLayerInputsNamesAsTransformersSavesThem) {
  const ModelSpec s = read_gemma4_spec(json::parse(kPleKvsharedConfig), "ple.json");
  ASSERT_EQ(s.gemma4.ple_dim, 8);
  const ModelLayout m = make_layout(s);
  EXPECT_EQ(entries_numel(m), s.total_params());
  std::vector<std::string> ours, theirs(std::begin(kPleKvsharedTensors), std::end(kPleKvsharedTensors));
  for (const BlobLayout& b : m.blobs)
    for (const StoredTensor& t : b.stored) {
      std::string line = t.name + " [";
      for (size_t i = 0; i < t.shape.size(); ++i) line += (i ? ", " : "") + std::to_string(t.shape[i]);
      ours.push_back(line + "]");
    }
  std::sort(ours.begin(), ours.end());
  std::sort(theirs.begin(), theirs.end());
  EXPECT_EQ(ours, theirs);
  // The model-level tensors follow the table in the embedding blob (PleEntry); the layer ones have views.
  const BlobLayout& emb = m.embedding();
  ASSERT_EQ(emb.entries.size(), 4u);
  EXPECT_EQ(emb.entries[int(PleEntry::Table)].name, "model.embed_tokens_per_layer.weight");
  EXPECT_EQ(emb.entries[int(PleEntry::Projection)].name, "model.per_layer_model_projection.weight");
  EXPECT_EQ(emb.entries[int(PleEntry::Norm)].name, "model.per_layer_projection_norm.weight");
  std::vector<float> blob(size_t(m.layer(4).numel));
  const LayerParams v = layer_views(m.layer(4), blob.data(), DType::F32);
  EXPECT_EQ(v[LayerParam::PleGate].rows(), 8);
  EXPECT_EQ(v[LayerParam::PleGate].cols(), 64);
  EXPECT_EQ(v[LayerParam::PleProj].rows(), 64);
  EXPECT_EQ(v[LayerParam::PleNorm].numel(), 64);
}

// Central differences (step 1e-2) of forward() along v[i] for each i of idx against the analytic
// gradient g[i]: relative error at most 5e-3 over the sample.
void expect_matches_central_differences(const std::function<double()>& forward, std::vector<float>& v,
                                        const std::vector<size_t>& idx, const std::vector<float>& g,
                                        const std::string& what) {
  const double eps = 1e-2;
  std::vector<double> num, ana;
  for (size_t i : idx) {
    const float v0 = v[i];
    v[i] = v0 + float(eps);
    const double lp = forward();
    v[i] = v0 - float(eps);
    const double lm = forward();
    v[i] = v0;
    num.push_back((lp - lm) / (2 * eps));
    ana.push_back(g[i]);
  }
  EXPECT_LE(test::rel_err(ana, num), 5e-3) << what;
}

// One Gemma 4 decoder layer through Program on the cpu device (program_gemma4.cpp): L = <y, R>
// against central differences of the program's own forward, for the input and a sample of every
// parameter; a local layer (window 4 < T) and a global one (twice the head dim, one KV head,
// proportional RoPE over a quarter), with and without keys reused as values.
struct LayerCase {
  int layer;
  bool k_eq_v;
  float layer_scalar = 1.f;
};
class Gemma4LayerGrad : public ::testing::TestWithParam<LayerCase> {};

TEST_P(Gemma4LayerGrad, ProgramBackwardMatchesFiniteDifferences) {
  json c = config_tiny();
  c["attention_k_eq_v"] = GetParam().k_eq_v;
  ModelSpec s = read_gemma4_spec(c, "tiny");
  EXPECT_EQ(s.gemma4.layer_scalar, std::vector<float>(6, 1.f));
  s.gemma4.layer_scalar[size_t(GetParam().layer)] = GetParam().layer_scalar;
  const ModelLayout lay = make_layout(s);
  const int l = GetParam().layer;
  const BlobLayout& blob = lay.layer(l);
  const bool global = !s.is_local(l);
  EXPECT_EQ(blob.entry(LayerParam::Wv) == nullptr, global && GetParam().k_eq_v);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);

  std::vector<float> params(size_t(blob.numel)), grads(size_t(blob.numel), 0.f);
  random_blob(blob, 1 + l, 17, 0.3, params.data());
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const auto& e : blob.entries)  // norms around their start, 1
    if (e.name.find("norm") != std::string::npos)
      for (int64_t i = 0; i < e.numel; ++i) params[size_t(e.offset + i)] = 1.f + 0.3f * nd(rng);
  // Global layers: proportional RoPE over their own head dim; local: the default table over head_dim.
  const test::HostRope host_rope(s, T);
  const RopeTables& rope = host_rope.views;
  ASSERT_EQ(rope.cos.cols(), 8);        // global head dim 16
  ASSERT_EQ(rope.cos_local.cols(), 4);  // head_dim 8
  EXPECT_NE(host_rope.cos[size_t(3 * 8 + 1)], 1.f);  // position 3: pairs 0, 1 of 8 rotate (a quarter)
  EXPECT_EQ(host_rope.cos[size_t(3 * 8 + 2)], 1.f);  // the rest do not
  ASSERT_EQ(host_rope.cos_l.size(), size_t(T * 4));  // local: the default table over head_dim 8
  EXPECT_FLOAT_EQ(host_rope.cos_l[size_t(3 * 4 + 3)], std::cos(3.f * std::pow(1e4f, -6.f / 8.f)));
  auto x = test::randn(size_t(N * H), 5), R = test::randn(size_t(N * H), 6);
  std::vector<float> y(size_t(N * H)), dx(size_t(N * H));
  const BatchDims d{B, T, {}};
  const LayerBuffers w = ws.layer(d);
  auto forward = [&] {
    prog.layer_forward(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}), test::view_of(y, {N, H}),
                       w, d, rope, *st);
    dev->synchronize(*st);
    return test::dot(y, R);
  };
  if (GetParam().layer_scalar != 1.f) {  // the output is the unscaled layer's times layer_scalar
    ModelSpec s1 = s;
    s1.gemma4.layer_scalar.assign(6, 1.f);
    const Program prog1(s1, dev->ops(), DType::F32);
    prog1.layer_forward(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}), test::view_of(y, {N, H}),
                        w, d, rope, *st);
    dev->synchronize(*st);
    std::vector<float> y1 = y;
    forward();
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], y1[i] * GetParam().layer_scalar) << i;
  }
  forward();
  prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, grads.data(), DType::F32),
                      test::view_of(x, {N, H}), test::view_of(R, {N, H}), test::view_of(dx, {N, H}), w, d, rope, *st);
  dev->synchronize(*st);
  // The backward's recompute (into fresh buffers' worth of garbage) gives the same gradients.
  {
    std::vector<float> g2(size_t(blob.numel), 0.f), dx2(size_t(N * H)), scratch(size_t(N * H));
    std::fill(static_cast<float*>(w.h1.data), static_cast<float*>(w.h1.data) + N * H, 7.f);
    prog.layer_recompute(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}),
                         test::view_of(scratch, {N, H}), w, d, rope, *st);
    prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, g2.data(), DType::F32),
                        test::view_of(x, {N, H}), test::view_of(R, {N, H}), test::view_of(dx2, {N, H}), w, d, rope,
                        *st);
    dev->synchronize(*st);
    EXPECT_EQ(g2, grads);
    EXPECT_EQ(dx2, dx);
  }
  auto fd_check = [&](std::vector<float>& v, const std::vector<size_t>& idx, const std::vector<float>& g,
                      const std::string& what) { expect_matches_central_differences(forward, v, idx, g, what); };
  fd_check(x, test::sample_indices(x.size(), 40, 1), dx, "dx");
  for (const auto& e : blob.entries) {
    std::vector<size_t> idx;
    for (size_t i : test::sample_indices(size_t(e.numel), 8, uint64_t(e.offset))) idx.push_back(size_t(e.offset) + i);
    fd_check(params, idx, grads, e.name);
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Gemma4LayerGrad,
                         ::testing::Values(LayerCase{4, true}, LayerCase{5, true}, LayerCase{4, false},
                                           LayerCase{5, false}, LayerCase{5, true, 0.37f}),
                         [](const auto& info) {
                           return std::string(info.param.layer == 5 ? "Global" : "Local") +
                                  (info.param.k_eq_v ? "KeqV" : "OwnV") +
                                  (info.param.layer_scalar != 1.f ? "Scaled" : "");
                         });

// K/V sharing (num_kv_shared_layers): a source layer and a layer attending to its K/V through
// Program, L = <y_src, R1> + <y_sharing, R2> against central differences for both inputs and a
// sample of both layers' parameters (the sharing layer's d(k), d(v) reach the source's projections
// through LayerBuffers::kv_dk / kv_dv); a local pair and a global one (k = v); the recompute
// (sharing layer first, as the backward runs) gives the same gradients bit for bit.
class Gemma4KvShareGrad : public ::testing::TestWithParam<int> {};

TEST_P(Gemma4KvShareGrad, SourceAndSharingLayerMatchFiniteDifferences) {
  json c = config_tiny();
  c["num_kv_shared_layers"] = 2;
  c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention",
                      "sliding_attention", "sliding_attention", "full_attention"};
  const ModelSpec s = read_gemma4_spec(c, "tiny");
  const int sl = GetParam(), src = s.gemma4.kv_source[size_t(sl)];
  ASSERT_EQ(src, sl == 4 ? 3 : 1);
  const ModelLayout lay = make_layout(s);
  const BlobLayout &bs = lay.layer(src), &bl = lay.layer(sl);
  EXPECT_EQ(bl.entry(LayerParam::Wk), nullptr);
  EXPECT_EQ(bl.entry(LayerParam::KNorm), nullptr);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden;
  const int64_t KV = int64_t(s.gemma4.kv_heads[size_t(src)]) * s.gemma4.head_dim[size_t(src)];
  Workspace ws1(*dev, s, B, T, DType::F32), ws2(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto params_of = [&](const BlobLayout& b, int seed) {
    std::vector<float> v(size_t(b.numel));
    random_blob(b, seed, 17, 0.3, v.data());
    for (const auto& e : b.entries)
      if (e.name.find("norm") != std::string::npos)
        for (int64_t i = 0; i < e.numel; ++i) v[size_t(e.offset + i)] = 1.f + 0.3f * nd(rng);
    return v;
  };
  std::vector<float> ps = params_of(bs, 1), pl = params_of(bl, 2);
  std::vector<float> gs(ps.size(), 0.f), gl(pl.size(), 0.f);
  const test::HostRope host_rope(s, T);
  const RopeTables& rope = host_rope.views;
  auto x1 = test::randn(size_t(N * H), 5), x2 = test::randn(size_t(N * H), 7);
  auto R1 = test::randn(size_t(N * H), 6), R2 = test::randn(size_t(N * H), 8);
  std::vector<float> y1(size_t(N * H)), y2(size_t(N * H)), dx1(size_t(N * H)), dx2(size_t(N * H));
  std::vector<float> kst(size_t(N * KV)), vst(size_t(N * KV)), dkst(size_t(N * KV)), dvst(size_t(N * KV));
  const BatchDims d{B, T, {}};
  LayerBuffers w1 = ws1.layer(d), w2 = ws2.layer(d);
  for (LayerBuffers* w : {&w1, &w2}) {
    w->kv_k = test::view_of(kst, {N, KV});
    w->kv_v = test::view_of(vst, {N, KV});
    w->kv_dk = test::view_of(dkst, {N, KV});
    w->kv_dv = test::view_of(dvst, {N, KV});
  }
  auto forward = [&] {
    prog.layer_forward(layer_views(bs, ps.data(), DType::F32), test::view_of(x1, {N, H}), test::view_of(y1, {N, H}),
                       w1, d, rope, *st);
    prog.layer_forward(layer_views(bl, pl.data(), DType::F32), test::view_of(x2, {N, H}), test::view_of(y2, {N, H}),
                       w2, d, rope, *st);
    dev->synchronize(*st);
    return test::dot(y1, R1) + test::dot(y2, R2);
  };
  auto backward = [&](std::vector<float>& g_src, std::vector<float>& g_sh, bool recompute) {
    std::fill(dkst.begin(), dkst.end(), 0.f);
    std::fill(dvst.begin(), dvst.end(), 0.f);
    std::vector<float> scratch(size_t(N * H));
    if (recompute)
      prog.layer_recompute(layer_views(bl, pl.data(), DType::F32), test::view_of(x2, {N, H}),
                           test::view_of(scratch, {N, H}), w2, d, rope, *st);
    prog.layer_backward(layer_views(bl, pl.data(), DType::F32), layer_views(bl, g_sh.data(), DType::F32),
                        test::view_of(x2, {N, H}), test::view_of(R2, {N, H}), test::view_of(dx2, {N, H}), w2, d, rope,
                        *st);
    if (recompute)
      prog.layer_recompute(layer_views(bs, ps.data(), DType::F32), test::view_of(x1, {N, H}),
                           test::view_of(scratch, {N, H}), w1, d, rope, *st);
    prog.layer_backward(layer_views(bs, ps.data(), DType::F32), layer_views(bs, g_src.data(), DType::F32),
                        test::view_of(x1, {N, H}), test::view_of(R1, {N, H}), test::view_of(dx1, {N, H}), w1, d, rope,
                        *st);
    dev->synchronize(*st);
  };
  forward();
  backward(gs, gl, false);
  EXPECT_GT(test::dot(dkst, dkst), 0.0);  // the sharing layer's gradient reached the store
  {
    std::vector<float> gs2(gs.size(), 0.f), gl2(gl.size(), 0.f);
    const std::vector<float> dx1a = dx1, dx2a = dx2;
    std::fill(static_cast<float*>(w1.h1.data), static_cast<float*>(w1.h1.data) + N * H, 7.f);
    std::fill(static_cast<float*>(w2.q.data), static_cast<float*>(w2.q.data) + N * 8, 7.f);
    backward(gs2, gl2, true);
    EXPECT_EQ(gs2, gs);
    EXPECT_EQ(gl2, gl);
    EXPECT_EQ(dx1, dx1a);
    EXPECT_EQ(dx2, dx2a);
  }
  auto fd_check = [&](std::vector<float>& v, const std::vector<size_t>& idx, const std::vector<float>& g,
                      const std::string& what) { expect_matches_central_differences(forward, v, idx, g, what); };
  fd_check(x1, test::sample_indices(x1.size(), 30, 1), dx1, "dx of the source");
  fd_check(x2, test::sample_indices(x2.size(), 30, 2), dx2, "dx of the sharing layer");
  for (auto [b, v, g] : {std::tuple{&bs, &ps, &gs}, std::tuple{&bl, &pl, &gl}})
    for (const auto& e : b->entries) {
      std::vector<size_t> idx;
      for (size_t i : test::sample_indices(size_t(e.numel), 8, uint64_t(e.offset))) idx.push_back(size_t(e.offset) + i);
      fd_check(*v, idx, *g, e.name);
    }
}

INSTANTIATE_TEST_SUITE_P(Pairs, Gemma4KvShareGrad, ::testing::Values(4, 5),
                         [](const auto& info) { return std::string(info.param == 4 ? "Local" : "Global"); });

// Proportional RoPE (Gemma 4's global layers): the first quarter of the frequency pairs rotate with
// theta^(-2i / head_dim), the rest have frequency 0; through the ordinary RoPE kernel those dims
// come out unchanged, the others as an fp64 rotation; the backward against finite differences.
TEST(Gemma4Rope, ProportionalTableAndKernel) {
  RopeSpec r;
  r.theta = 1e6;
  const int hd = 512, half = hd / 2;
  const std::vector<float> inv = rope_inv_freq_proportional(r, hd, 0.25);
  ASSERT_EQ(inv.size(), size_t(half));
  for (int i = 0; i < half; ++i) {
    const double want = i < 64 ? std::pow(1e6, -2.0 * i / hd) : 0.0;
    EXPECT_NEAR(inv[size_t(i)], want, 1e-6 * want + 0.0) << i;
  }
  // With a factor (rope_type "linear" here): every rotated frequency divided by it.
  RopeSpec lin = r;
  lin.type = "linear";
  lin.factor = 8.0;
  const std::vector<float> inv8 = rope_inv_freq_proportional(lin, hd, 0.25);
  for (int i = 0; i < half; ++i) EXPECT_FLOAT_EQ(inv8[size_t(i)], inv[size_t(i)] / 8.f) << i;
  // fraction 1: the plain table of rope_inv_freq over the whole head.
  ModelSpec plain;
  plain.head_dim = hd;
  plain.rope = r;
  EXPECT_EQ(rope_inv_freq_proportional(r, hd, 1.0), rope_inv_freq(plain));
  // A fraction that is not a multiple of the pairs: int(0.3 * 10 / 2) = 1 rotated pair of 5.
  const std::vector<float> odd = rope_inv_freq_proportional(r, 10, 0.3);
  EXPECT_GT(odd[0], 0.f);
  for (size_t i = 1; i < odd.size(); ++i) EXPECT_EQ(odd[i], 0.f);

  // The kernel with the table: T positions, 2 heads of a small head dim (16, a quarter rotated).
  const int T = 7, H = 2, d = 16, dh = d / 2;
  std::vector<float> cos, sin;
  rope_tables_from(rope_inv_freq_proportional(r, d, 0.25), T, cos, sin);
  auto x = test::randn(size_t(T) * H * d, 4401);
  std::vector<float> y = x;
  cpu::rope_forward(test::view_of(y, {T, H * d}), test::view_of(cos, {T, dh}), test::view_of(sin, {T, dh}), T, H, d);
  const int rot = 2;  // int(0.25 * 16 / 2)
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < dh; ++i) {
        const size_t a = size_t(t) * H * d + size_t(h) * d + size_t(i), b = a + size_t(dh);
        if (i >= rot) {
          EXPECT_EQ(y[a], x[a]);
          EXPECT_EQ(y[b], x[b]);
          continue;
        }
        const double ang = double(t) * std::pow(1e6, -2.0 * i / d);
        EXPECT_NEAR(y[a], x[a] * std::cos(ang) - x[b] * std::sin(ang), 1e-5);
        EXPECT_NEAR(y[b], x[b] * std::cos(ang) + x[a] * std::sin(ang), 1e-5);
      }
  // Backward: d/dx of L = sum(g * rope(x)) is rope_backward(g); central differences in fp32 on
  // a linear map are exact up to rounding.
  auto g = test::randn(x.size(), 4402);
  std::vector<float> dx = g;
  cpu::rope_backward(test::view_of(dx, {T, H * d}), test::view_of(cos, {T, dh}), test::view_of(sin, {T, dh}), T, H,
                     d);
  auto loss = [&](const std::vector<float>& xin) {
    std::vector<float> yy = xin;
    cpu::rope_forward(test::view_of(yy, {T, H * d}), test::view_of(cos, {T, dh}), test::view_of(sin, {T, dh}), T, H,
                      d);
    double l = 0;
    for (size_t k = 0; k < yy.size(); ++k) l += double(g[k]) * yy[k];
    return l;
  };
  const float step = 1e-2f;
  for (size_t k = 0; k < x.size(); k += 5) {
    std::vector<float> xp = x, xm = x;
    xp[k] += step;
    xm[k] -= step;
    const double fd = (loss(xp) - loss(xm)) / (double(xp[k]) - double(xm[k]));
    EXPECT_NEAR(dx[k], fd, 2e-4 * (1 + std::abs(fd))) << k;
  }
}

// Gemma 4's value norm has no weight: the RMSNorm kernel with a weight of ones and no weight
// gradient, forward against fp64 and backward against finite differences.
TEST(Gemma4Norm, WeightlessValueNorm) {
  const int R = 5, C = 16;
  const float eps = 1e-6f;
  auto x = test::randn(size_t(R) * C, 4501, 1.5f);
  std::vector<float> ones(C, 1.f), out(x.size()), rstd(R);
  cpu::rmsnorm_forward(test::view_of(out, {R, C}), test::view_of(rstd, {R}), test::view_of(x, {R, C}),
                       test::view_of(ones, {C}), eps);
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[size_t(r) * C + c]) * x[size_t(r) * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[size_t(r) * C + c], x[size_t(r) * C + c] * rs, 1e-5);
  }
  auto g = test::randn(x.size(), 4502);
  std::vector<float> dx(x.size());
  cpu::rmsnorm_backward(test::view_of(dx, {R, C}), Tensor(), test::view_of(g, {R, C}), test::view_of(x, {R, C}),
                        test::view_of(ones, {C}), test::view_of(rstd, {R}), false);
  auto loss = [&](const std::vector<float>& xin) {
    std::vector<float> o(xin.size());
    std::vector<float> xx = xin;
    cpu::rmsnorm_forward(test::view_of(o, {R, C}), Tensor(), test::view_of(xx, {R, C}), test::view_of(ones, {C}),
                         eps);
    double l = 0;
    for (size_t k = 0; k < o.size(); ++k) l += double(g[k]) * o[k];
    return l;
  };
  for (size_t k = 0; k < x.size(); k += 3) {
    std::vector<float> xp = x, xm = x;
    xp[k] += 1e-2f;
    xm[k] -= 1e-2f;
    const double fd = (loss(xp) - loss(xm)) / (double(xp[k]) - double(xm[k]));
    EXPECT_NEAR(dx[k], fd, 2e-3 * (1 + std::abs(fd))) << k;
  }
}

// Gemma 4's head: cross-entropy on c * tanh(logits / c). The CPU kernel's loss against an fp64
// formula, its dx and dw against finite differences of that formula; softcap 0 is the plain
// kernel bit for bit; a large cap approaches the plain loss.
double ref_capped_ce(const std::vector<double>& x, const std::vector<double>& w, const std::vector<int32_t>& y, int N,
                     int H, int V, double cap) {
  double total = 0;
  std::vector<double> s(static_cast<size_t>(V));
  for (int n = 0; n < N; ++n) {
    if (y[size_t(n)] == -100) continue;
    double mx = -1e300;
    for (int j = 0; j < V; ++j) {
      double z = 0;
      for (int c = 0; c < H; ++c) z += x[size_t(n) * H + c] * w[size_t(j) * H + c];
      s[size_t(j)] = cap > 0 ? cap * std::tanh(z / cap) : z;
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(s[size_t(j)] - mx);
    total += mx + std::log(sum) - s[size_t(y[size_t(n)])];
  }
  return total;
}

TEST(Gemma4Head, SoftcappedLinearCrossEntropy) {
  const int N = 6, H = 5, V = 11;
  const float gs = 0.6f, cap = 1.5f;  // logits of a few units: the cap bends them
  auto x = test::randn(size_t(N) * H, 4601, 1.2f), w = test::randn(size_t(V) * H, 4602, 1.1f);
  std::vector<int32_t> y = {4, -100, 0, 10, 7, 4};
  auto run = [&](float c, std::vector<float>& dx, std::vector<float>& dw) {
    test::HostTensor ws(DType::F32, {int64_t(cpu::linear_ce_workspace_bytes(N, H, V) / 4) + 1});
    std::vector<float> loss = {0.f}, xv = x, wv = w;
    std::vector<int32_t> yv = y;
    dx.assign(x.size(), 0.f);
    dw.assign(w.size(), 0.f);
    cpu::linear_cross_entropy(test::view_of(loss, {1}), test::view_of(dx, {N, H}), test::view_of(dw, {V, H}),
                              test::view_of(xv, {N, H}), test::view_of(wv, {V, H}), test::view_of(yv, {N}), gs,
                              ws.view, c);
    return loss[0];
  };
  std::vector<float> dx, dw;
  const float loss = run(cap, dx, dw);
  auto xd = test::to_double(x), wd = test::to_double(w);
  const double want = ref_capped_ce(xd, wd, y, N, H, V, cap);
  EXPECT_NEAR(loss, want, 1e-5 * want);
  EXPECT_GT(std::abs(want - ref_capped_ce(xd, wd, y, N, H, V, 0)), 0.1);  // the cap matters here
  auto L = [&] { return double(gs) * ref_capped_ce(xd, wd, y, N, H, V, cap); };
  auto ix = test::sample_indices(xd.size(), xd.size(), 0), iw = test::sample_indices(wd.size(), wd.size(), 0);
  EXPECT_LE(test::rel_err(test::gather(dx, ix), test::numeric_grad(xd, ix, 1e-5, L)), 1e-5);
  EXPECT_LE(test::rel_err(test::gather(dw, iw), test::numeric_grad(wd, iw, 1e-5, L)), 1e-5);
  for (int c = 0; c < H; ++c) EXPECT_EQ(dx[size_t(H) + c], 0.f);  // the ignored row
  // softcap 0: the plain kernel (its default argument), bit for bit.
  std::vector<float> dx0, dw0, dx1, dw1;
  const float l0 = run(0.f, dx0, dw0);
  {
    test::HostTensor ws(DType::F32, {int64_t(cpu::linear_ce_workspace_bytes(N, H, V) / 4) + 1});
    std::vector<float> lossv = {0.f}, xv = x, wv = w;
    std::vector<int32_t> yv = y;
    dx1.assign(x.size(), 0.f);
    dw1.assign(w.size(), 0.f);
    cpu::linear_cross_entropy(test::view_of(lossv, {1}), test::view_of(dx1, {N, H}), test::view_of(dw1, {V, H}),
                              test::view_of(xv, {N, H}), test::view_of(wv, {V, H}), test::view_of(yv, {N}), gs,
                              ws.view);
    EXPECT_EQ(lossv[0], l0);
  }
  EXPECT_EQ(dx0, dx1);
  EXPECT_EQ(dw0, dw1);
  // A cap far above the logits: the plain loss within the cap's bend (z^3 / (3 c^2)).
  std::vector<float> dxb, dwb;
  EXPECT_NEAR(run(1e4f, dxb, dwb), l0, 1e-4 * l0);
}

// The head through Program with Gemma 4's soft-cap: the loss equals the capped kernel's on the
// final norm's output, and dx, d(norm) and d(head) match central differences of the program's own
// loss; the device front refuses a cap <= 0.
TEST(Gemma4Head, ProgramHeadWithSoftcap) {
  json c = config_tiny();
  c["final_logit_softcapping"] = 1.5;
  const ModelSpec s = read_gemma4_spec(c, "tiny");
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 5;
  const int64_t N = B * T, H = s.hidden, V = s.vocab;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);
  const BatchDims d{B, T, {}};
  const HeadBuffers hb = ws.head(d);
  auto x = test::randn(size_t(N * H), 71), nw = test::randn(size_t(H), 72, 0.2f, 1.f);
  auto wh = test::randn(size_t(V * H), 73, 0.6f);
  std::vector<int32_t> y = test::randint(size_t(N), 74, 0, int32_t(V));
  y[3] = -100;
  const float gs = 0.25f;
  std::vector<float> loss(1), dx(static_cast<size_t>(N * H)), dn(static_cast<size_t>(H)), dw(static_cast<size_t>(V * H));
  auto run = [&](bool grads) {
    loss[0] = 0.f;
    Program::HeadArgs a;
    a.x = test::view_of(x, {N, H});
    a.norm_w = test::view_of(nw, {H});
    a.w_head = test::view_of(wh, {V, H});
    a.targets = test::view_of(y, {N});
    a.loss_sum = test::view_of(loss, {1});
    a.grad_scale = gs;
    if (grads) {
      std::fill(dn.begin(), dn.end(), 0.f);
      std::fill(dw.begin(), dw.end(), 0.f);
      a.dx = test::view_of(dx, {N, H});
      a.dnorm = test::view_of(dn, {H});
      a.dw_head = test::view_of(dw, {V, H});
    }
    prog.head_forward_backward(a, hb, d, *st);
    dev->synchronize(*st);
    return double(loss[0]);
  };
  const double l = run(true);
  // The loss: the capped formula on the normed rows.
  std::vector<double> hn(size_t(N * H));
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t k = 0; k < H; ++k) ss += double(x[size_t(n * H + k)]) * x[size_t(n * H + k)];
    const double rs = 1.0 / std::sqrt(ss / double(H) + s.rms_eps);
    for (int64_t k = 0; k < H; ++k) hn[size_t(n * H + k)] = x[size_t(n * H + k)] * rs * nw[size_t(k)];
  }
  const double want = ref_capped_ce(hn, test::to_double(wh), y, int(N), int(H), int(V), 1.5);
  EXPECT_NEAR(l, want, 1e-5 * want);
  auto L = [&] { return double(gs) * run(false); };
  auto ix = test::sample_indices(x.size(), 30, 3), in = test::sample_indices(nw.size(), nw.size(), 4),
       iw = test::sample_indices(wh.size(), 30, 5);
  EXPECT_LE(test::rel_err(test::gather(dx, ix), test::numeric_grad(x, ix, 1e-2, L)), 5e-3);
  EXPECT_LE(test::rel_err(test::gather(dn, in), test::numeric_grad(nw, in, 1e-2, L)), 5e-3);
  EXPECT_LE(test::rel_err(test::gather(dw, iw), test::numeric_grad(wh, iw, 1e-2, L)), 5e-3);
  // The front checks the cap.
  std::vector<float> l2(1);
  EXPECT_THROW(dev->ops().linear_cross_entropy_capped(test::view_of(l2, {1}), Tensor(), Tensor(), hb.hf, test::view_of(wh, {V, H}),
                                                      test::view_of(y, {N}), 1.f, 0.f, hb.lce_ws, *st),
               std::runtime_error);
}

}  // namespace
}  // namespace sf
