// A dense Gemma 4 model through the command line on the cpu backend (docs/GEMMA4.md): a tiny
// checkpoint written here as transformers' Gemma4ForCausalLM saves one (names, shapes, bf16,
// layer_scalar buffers; the names listed from transformers' rules, not from our layout), trained
// by the resident and the sliding engine to the same bytes, saved back byte-compatible, loaded
// again; layer_scalar read from the file; the configs still refused named by their keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace sf {
namespace {

using nlohmann::json;

constexpr int kLayers = 4;

// Gemma4TextConfig as transformers 5 writes it for a tiny dense model: local (window 4, shorter
// than the sequences) and global layers, k = v on the global ones with their own head dim (16)
// and one KV head, proportional RoPE over a quarter, a soft-capped tied head.
json tiny_dense_config() {
  return json{{"architectures", {"Gemma4ForCausalLM"}},
              {"model_type", "gemma4_text"},
              {"dtype", "bfloat16"},
              {"vocab_size", 64},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", kLayers},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"num_global_key_value_heads", 1},
              {"head_dim", 8},
              {"global_head_dim", 16},
              {"attention_k_eq_v", true},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"hidden_size_per_layer_input", 0},
              {"vocab_size_per_layer_input", 64},
              {"num_kv_shared_layers", 0},
              {"use_double_wide_mlp", false},
              {"enable_moe_block", false},
              {"final_logit_softcapping", 3.0},
              {"sliding_window", 4},
              {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
              {"rope_parameters",
               {{"full_attention",
                 {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}}},
                {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}},
              {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-6},
              {"initializer_range", 0.02},
              {"tie_word_embeddings", true},
              {"pad_token_id", 0},
              {"bos_token_id", 2},
              {"eos_token_id", 1}};
}

// The tensors Gemma4ForCausalLM has for tiny_dense_config() (modeling_gemma4.py): per layer its
// head dim and KV heads, no v_proj where k = v, a [1] layer_scalar; tied head: no lm_head. With
// num_kv_shared_layers = `shared`: the last layers have no k_proj, v_proj, k_norm, and with
// use_double_wide_mlp an MLP twice as wide.
// With per-layer inputs of width `ple` (vocab_size_per_layer_input 64): the model's table,
// projection and norm, each layer's gate, projection and norm. With the MoE block (`experts` > 0
// of width `moe_width`): each layer's router (proj, scale, per_expert_scale), the fused experts
// gate_up_proj [E, 2I, H] and down_proj [E, H, I], and three more norms (transformers 5.17's
// save, bench/results/2026-12-02s11_gpu_1_gemma4_ref.log).
std::map<std::string, std::vector<int64_t>> transformers_tensors(int shared = 0, bool double_wide = false,
                                                                  int64_t ple = 0, int64_t experts = 0,
                                                                  int64_t moe_width = 0) {
  std::map<std::string, std::vector<int64_t>> t;
  t["model.embed_tokens.weight"] = {64, 32};
  t["model.norm.weight"] = {32};
  if (ple > 0) {
    t["model.embed_tokens_per_layer.weight"] = {64, kLayers * ple};
    t["model.per_layer_model_projection.weight"] = {kLayers * ple, 32};
    t["model.per_layer_projection_norm.weight"] = {ple};
  }
  for (int l = 0; l < kLayers; ++l) {
    const bool global = l % 2 == 1;
    const int64_t d = global ? 16 : 8, kv = global ? 1 : 2;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm"})
      t[p + n + ".weight"] = {32};
    const bool sharing = l >= kLayers - shared;
    const int64_t I = sharing && double_wide ? 96 : 48;
    t[p + "self_attn.q_proj.weight"] = {4 * d, 32};
    if (!sharing) t[p + "self_attn.k_proj.weight"] = {kv * d, 32};
    if (!global && !sharing) t[p + "self_attn.v_proj.weight"] = {kv * d, 32};
    t[p + "self_attn.o_proj.weight"] = {32, 4 * d};
    t[p + "self_attn.q_norm.weight"] = {d};
    if (!sharing) t[p + "self_attn.k_norm.weight"] = {d};
    t[p + "mlp.gate_proj.weight"] = {I, 32};
    t[p + "mlp.up_proj.weight"] = {I, 32};
    t[p + "mlp.down_proj.weight"] = {32, I};
    t[p + "layer_scalar"] = {1};
    if (ple > 0) {
      t[p + "per_layer_input_gate.weight"] = {ple, 32};
      t[p + "per_layer_projection.weight"] = {32, ple};
      t[p + "post_per_layer_input_norm.weight"] = {32};
    }
    if (experts > 0) {
      t[p + "router.proj.weight"] = {experts, 32};
      t[p + "router.scale"] = {32};
      t[p + "router.per_expert_scale"] = {experts};
      t[p + "experts.gate_up_proj"] = {experts, 2 * moe_width, 32};
      t[p + "experts.down_proj"] = {experts, 32, moe_width};
      for (const char* n :
           {"post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"})
        t[p + n + ".weight"] = {32};
    }
  }
  return t;
}

class Gemma4Cli : public test::BinaryTest {
 protected:
  // Writes the checkpoint: bf16 weights drawn with `seed` (norm weights near 1, as trained ones
  // are), layer l's layer_scalar = scalars[l]. Returns the directory.
  // `prefix` replaces "model." (a Gemma4ForConditionalGeneration's language model); `extra` are
  // written beside.
  std::string write_model(const std::string& name, const std::vector<float>& scalars, json cfg = tiny_dense_config(),
                          uint32_t seed = 7, const std::string& prefix = "model.",
                          const std::vector<TensorWrite>& extra = {}) {
    const std::string dir = p(name);
    std::filesystem::create_directories(dir);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<std::vector<uint16_t>> store;  // moved into place: each data() stays where it was
    std::vector<TensorWrite> tw;
    const int shared = cfg.value("num_kv_shared_layers", 0);
    const bool moe = cfg.value("enable_moe_block", false);
    for (const auto& [tensor, shape] : transformers_tensors(shared, cfg.value("use_double_wide_mlp", false),
                                                            cfg.value("hidden_size_per_layer_input", int64_t(0)),
                                                            moe ? cfg.value("num_experts", int64_t(0)) : 0,
                                                            cfg.value("moe_intermediate_size", int64_t(0)))) {
      int64_t n = 1;
      for (int64_t x : shape) n *= x;
      std::vector<uint16_t> v(static_cast<size_t>(n));
      const bool scalar = tensor.find("layer_scalar") != std::string::npos;
      const bool norm = shape.size() == 1 && !scalar;
      for (auto& x : v) x = float_to_bf16(norm ? 1.f + 0.1f * nd(rng) : 0.3f * nd(rng)).bits;
      if (scalar) v[0] = float_to_bf16(scalars[size_t(std::stoi(tensor.substr(13)))]).bits;
      store.push_back(std::move(v));
      tw.push_back(TensorWrite{prefix + tensor.substr(6), DType::BF16, shape, store.back().data()});
    }
    tw.insert(tw.end(), extra.begin(), extra.end());
    write_checkpoint_tensors(dir, tw);
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    return dir;
  }
  std::string data() {
    std::ofstream(p("d.jsonl")) << "{\"input_ids\": [2, 5, 9, 3, 7, 12, 11, 4, 8, 6, 40, 63]}\n"
                                << "{\"input_ids\": [2, 3, 8, 1, 0, 22, 36, 4, 17, 9]}\n"
                                << "{\"input_ids\": [2, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 41]}\n";
    return p("d.jsonl");
  }
  // Exit 2 with one line naming `needle` (the CLI's contract for bad input).
  static void expect_input_error(const test::CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  }
  // `train` (a command ending in --output) by the resident engine into a, the sliding one into b:
  // the same bytes.
  void expect_engines_agree(const std::string& train) {
    test::CmdResult a = run(train + p("a"));
    ASSERT_EQ(a.code, 0) << a.err;
    test::CmdResult b = run(train + p("b") + " --offload --slots 2 --gpu-blobs 0");
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_TRUE(test::slurp(p("a") + "/model.safetensors") == test::slurp(p("b") + "/model.safetensors"))
        << "the sliding engine trained other bytes than the resident one";
    // with every layer's activations kept whole, then only attention outputs kept (no recompute paths)
    const std::string all = std::to_string(kLayers);
    for (const std::string& keep : std::vector<std::string>{" --keep-layers " + all, " --keep-attention " + all, " --keep-layers 1"}) {
      std::filesystem::remove_all(p("b"));
      test::CmdResult k = run(train + p("b") + " --offload --slots 2 --gpu-blobs 0" + keep);
      ASSERT_EQ(k.code, 0) << k.err;
      EXPECT_TRUE(test::slurp(p("a") + "/model.safetensors") == test::slurp(p("b") + "/model.safetensors"))
          << "the sliding engine with" << keep << " trained other bytes than the resident one";
    }
  }
  // One step at lr 0 without decay from `src` saves every tensor back byte for byte (dtype too).
  void expect_lr0_round_trip(const std::string& src, const std::string& common) {
    test::CmdResult z =
        run("train --model " + src + common + " --steps 1 --lr 0 --weight-decay 0 --output " + p("z"));
    ASSERT_EQ(z.code, 0) << z.err;
    const SafetensorsFile in = SafetensorsFile::open(src + "/model.safetensors");
    const SafetensorsFile back = SafetensorsFile::open(p("z") + "/model.safetensors");
    EXPECT_EQ(back.tensors().size(), in.tensors().size());
    for (const TensorInfo& t : in.tensors()) {
      const TensorInfo* u = back.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_TRUE(u->dtype == t.dtype && bytes_of(*u) == bytes_of(t)) << t.name << " changed at lr 0";
    }
  }
  // Trained 3 steps at 1 and 2 micro-batches a step (src's checkpoint, `common` options): both
  // engines the same bytes; p("a") then has every tensor of src with its name, shape and dtype,
  // every one changed but the layer_scalar buffers.
  void expect_engines_agree_and_every_tensor_learns(const std::string& src, const std::string& common) {
    for (const char* accum : {"1", "2"}) {
      SCOPED_TRACE(std::string("grad-accum ") + accum);
      std::filesystem::remove_all(p("a"));
      std::filesystem::remove_all(p("b"));
      const std::string train = "train --model " + src + common + " --grad-accum " + accum +
                                " --steps 3 --lr 1e-2 --max-grad-norm 1 --output ";
      ASSERT_NO_FATAL_FAILURE(expect_engines_agree(train));
    }
    const SafetensorsFile in = SafetensorsFile::open(src + "/model.safetensors");
    const SafetensorsFile out = SafetensorsFile::open(p("a") + "/model.safetensors");
    EXPECT_EQ(out.tensors().size(), in.tensors().size());
    for (const TensorInfo& t : in.tensors()) {
      const TensorInfo* u = out.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(u->shape, t.shape) << t.name;
      EXPECT_EQ(u->dtype, t.dtype) << t.name;
      EXPECT_EQ(bytes_of(*u) == bytes_of(t), t.name.find("layer_scalar") != std::string::npos) << t.name;
    }
  }
  static std::string bytes_of(const TensorInfo& t) {
    return std::string(reinterpret_cast<const char*>(t.data), t.bytes);
  }
};

const std::vector<float> kScalars = {0.5f, 1.25f, 0.75f, 1.5f};

// Trained by both engines to the same bytes; saved with transformers' names, shapes and dtypes,
// the layer_scalar buffers unchanged; the saved model loads and trains again; lr 0 saves the
// checkpoint back byte for byte.
TEST_F(Gemma4Cli, DenseModelTrainsOnBothEnginesAndRoundTrips) {
  const std::string src = write_model("src", kScalars), d = data();
  const std::string common = " --data " + d + " --seq-len 12 --batch-size 3 --device cpu";
  const std::string train = "train --model " + src + common + " --steps 3 --lr 1e-2 --max-grad-norm 1 --output ";
  test::CmdResult e0 = run("eval --model " + src + common);
  ASSERT_EQ(e0.code, 0) << e0.err;
  const double loss0 = e0.last()["loss"];
  EXPECT_TRUE(std::isfinite(loss0));
  EXPECT_LT(loss0, 3.0 + std::log(64.0));  // the soft cap bounds every logit by 3

  ASSERT_NO_FATAL_FAILURE(expect_engines_agree(train));
  {  // `grad` (what the transformers parity reads) gives the same gradients on both engines
    const std::string grad = "grad --model " + src + common + " --output ";
    test::CmdResult ga = run(grad + p("ga.safetensors")), gb = run(grad + p("gb.safetensors") + " --offload --slots 2 --gpu-blobs 0");
    ASSERT_EQ(ga.code, 0) << ga.err;
    ASSERT_EQ(gb.code, 0) << gb.err;
    const SafetensorsFile a = SafetensorsFile::open(p("ga.safetensors")), b = SafetensorsFile::open(p("gb.safetensors"));
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const TensorInfo& t : a.tensors()) {
      const TensorInfo* u = b.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_TRUE(bytes_of(*u) == bytes_of(t)) << t.name << ": the sliding engine's gradient differs";
    }
  }

  const SafetensorsFile in = SafetensorsFile::open(src + "/model.safetensors");
  const SafetensorsFile out = SafetensorsFile::open(p("a") + "/model.safetensors");
  const auto expected = transformers_tensors();
  EXPECT_EQ(out.tensors().size(), expected.size());
  int changed = 0;
  for (const auto& [name, shape] : expected) {
    const TensorInfo* t = out.find(name);
    ASSERT_NE(t, nullptr) << name << " not saved";
    EXPECT_EQ(t->dtype, DType::BF16) << name;
    EXPECT_EQ(t->shape, shape) << name;
    const bool same = bytes_of(*t) == bytes_of(*in.find(name));
    if (name.find("layer_scalar") != std::string::npos) {
      EXPECT_TRUE(same) << name << " is a buffer: saved as read";
    } else {
      changed += !same;
    }
  }
  EXPECT_EQ(changed, int(expected.size()) - kLayers) << "every parameter trains";
  const json saved = json::parse(test::slurp(p("a") + "/config.json"));
  EXPECT_EQ(saved["model_type"], "gemma4_text");
  EXPECT_EQ(saved["dtype"], "bfloat16");

  // The saved model loads: its loss is lower on the data it was trained on, and it trains on.
  test::CmdResult e1 = run("eval --model " + p("a") + common);
  ASSERT_EQ(e1.code, 0) << e1.err;
  EXPECT_LT(double(e1.last()["loss"]), loss0);
  test::CmdResult c = run("train --model " + p("a") + common + " --steps 1 --lr 1e-2 --output " + p("c"));
  ASSERT_EQ(c.code, 0) << c.err;

  // Nothing learnt (lr 0, no decay): the checkpoint comes back byte for byte.
  expect_lr0_round_trip(src, common);
}

// layer_scalar is read from the checkpoint: other values give another loss, 1 everywhere the same
// loss as a checkpoint without the buffers (transformers' initial value); a non-finite or
// misshapen one is refused naming the file and tensor.
TEST_F(Gemma4Cli, LayerScalarIsReadFromTheCheckpoint) {
  const std::string d = data(), common = " --data " + d + " --seq-len 12 --batch-size 3 --device cpu";
  auto loss = [&](const std::string& dir) {
    test::CmdResult r = run("eval --model " + dir + common);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? double(r.last()["loss"]) : 0.0;
  };
  const double scaled = loss(write_model("s", kScalars));
  const std::string ones = write_model("ones", {1.f, 1.f, 1.f, 1.f});
  const double unscaled = loss(ones);
  EXPECT_NE(scaled, unscaled);

  // Without the buffers: 1, said once.
  const SafetensorsFile f = SafetensorsFile::open(ones + "/model.safetensors");
  std::vector<TensorWrite> tw;
  for (const TensorInfo& t : f.tensors())
    if (t.name.find("layer_scalar") == std::string::npos) tw.push_back(TensorWrite{t.name, t.dtype, t.shape, t.data});
  write_checkpoint_tensors(p("none"), tw);
  std::filesystem::copy_file(ones + "/config.json", p("none") + "/config.json");
  test::CmdResult r = run("eval --model " + p("none") + common);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(double(r.last()["loss"]), unscaled);
  EXPECT_NE(r.err.find("no layer_scalar for 4 of 4 layers"), std::string::npos) << r.err;

  expect_input_error(run("eval --model " + write_model("nan", {1.f, NAN, 1.f, 1.f}) + common),
                           "model.layers.1.layer_scalar is not finite");
  std::vector<float> two = {0.5f, 2.f};
  tw.push_back(TensorWrite{"model.layers.2.layer_scalar", DType::F32, {2}, two.data()});
  write_checkpoint_tensors(p("wide"), tw);
  std::filesystem::copy_file(ones + "/config.json", p("wide") + "/config.json");
  expect_input_error(run("eval --model " + p("wide") + common), "model.layers.2.layer_scalar");
}

// A Gemma4ForConditionalGeneration checkpoint (transformers 5 names the language model
// model.language_model.*): the language model trains, layer_scalar is read and saved under its
// names, the vision tensors and the multimodal config come back unchanged.
TEST_F(Gemma4Cli, MultimodalCheckpointKeepsTheOtherTowers) {
  json text = tiny_dense_config();
  text.erase("architectures");
  const json cfg = {{"architectures", {"Gemma4ForConditionalGeneration"}},
                    {"model_type", "gemma4"},
                    {"dtype", "bfloat16"},
                    {"tie_word_embeddings", true},
                    {"text_config", text},
                    {"vision_config", {{"model_type", "gemma4_vision"}, {"hidden_size", 8}}}};
  std::vector<uint16_t> vis(6 * 8);
  for (size_t i = 0; i < vis.size(); ++i) vis[i] = uint16_t(0x3f00 + i);
  std::vector<float> proj = {0.5f, -1.f, 2.f};
  const std::vector<TensorWrite> towers = {
      TensorWrite{"model.vision_tower.patch_embedder.weight", DType::BF16, {6, 8}, vis.data()},
      TensorWrite{"model.embed_vision.norm.weight", DType::F32, {3}, proj.data()}};
  const std::string src = write_model("mm", kScalars, cfg, 9, "model.language_model.", towers);
  const std::string d = data();
  test::CmdResult r = run("train --model " + src + " --data " + d +
                          " --seq-len 12 --batch-size 3 --device cpu --steps 2 --lr 1e-2 --output " + p("out"));
  ASSERT_EQ(r.code, 0) << r.err;
  const SafetensorsFile a = SafetensorsFile::open(src + "/model.safetensors");
  const SafetensorsFile b = SafetensorsFile::open(p("out") + "/model.safetensors");
  EXPECT_EQ(a.tensors().size(), b.tensors().size());
  for (const TensorInfo& t : a.tensors()) {
    const TensorInfo* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(u->dtype, t.dtype) << t.name;
    EXPECT_EQ(u->shape, t.shape) << t.name;
    const bool kept =
        t.name.find("language_model") == std::string::npos || t.name.find("layer_scalar") != std::string::npos;
    EXPECT_EQ(bytes_of(*u) == bytes_of(t), kept) << t.name;
  }
  const json saved = json::parse(test::slurp(p("out") + "/config.json"));
  EXPECT_EQ(saved["model_type"], "gemma4");
  EXPECT_TRUE(saved.contains("vision_config"));
  // layer_scalar is read under the multimodal names: other values, another loss.
  const std::string ones = write_model("mm1", {1.f, 1.f, 1.f, 1.f}, cfg, 9, "model.language_model.");
  const std::string common = " --data " + d + " --seq-len 12 --batch-size 3 --device cpu";
  test::CmdResult e0 = run("eval --model " + src + common), e1 = run("eval --model " + ones + common);
  ASSERT_EQ(e0.code, 0) << e0.err;
  ASSERT_EQ(e1.code, 0) << e1.err;
  EXPECT_NE(double(e0.last()["loss"]), double(e1.last()["loss"]));
  EXPECT_EQ(e1.err.find("no layer_scalar"), std::string::npos) << e1.err;
}

// K/V sharing (the E-models' num_kv_shared_layers, with their double-wide MLPs): the last two
// layers (one local, one global) attend to the K/V of the last earlier layer of their type and
// have no k/v projections. Both engines train to the same bytes with two micro-batches a step
// (the sliding engine keeps every micro-batch's shared K/V from its forward to its backward);
// lr 0 saves the checkpoint back byte for byte; the same batch every step gives the same gradient
// norm every step (the accumulators start from zero each backward).
TEST_F(Gemma4Cli, SharedKvModelTrainsOnBothEngines) {
  json cfg = tiny_dense_config();
  cfg["num_kv_shared_layers"] = 2;
  cfg["use_double_wide_mlp"] = true;
  const std::string src = write_model("src", kScalars, cfg), d = data();
  {
    const SafetensorsFile f = SafetensorsFile::open(src + "/model.safetensors");
    EXPECT_EQ(f.find("model.layers.2.self_attn.k_proj.weight"), nullptr);
    EXPECT_NE(f.find("model.layers.1.self_attn.k_proj.weight"), nullptr);
    EXPECT_EQ(f.find("model.layers.3.mlp.up_proj.weight")->shape, (std::vector<int64_t>{96, 32}));
  }
  const std::string common = " --data " + d + " --seq-len 12 --batch-size 2 --device cpu";
  ASSERT_NO_FATAL_FAILURE(expect_engines_agree_and_every_tensor_learns(src, common));
  expect_lr0_round_trip(src, common);

  // One batch (the first two records) every step, nothing learnt: the same gradient norm each step.
  std::ofstream(p("one.jsonl")) << "{\"input_ids\": [2, 5, 9, 3, 7, 12, 11, 4, 8, 6, 40, 63]}\n"
                                << "{\"input_ids\": [2, 3, 8, 1, 0, 22, 36, 4, 17, 9]}\n";
  for (const char* engine : {"", " --offload --slots 2 --gpu-blobs 0"}) {
    SCOPED_TRACE(engine);
    std::filesystem::remove_all(p("n"));
    test::CmdResult n = run("train --model " + src + " --data " + p("one.jsonl") +
                            " --seq-len 12 --batch-size 1 --grad-accum 2 --device cpu --steps 3 --lr 0 "
                            "--weight-decay 0 --no-shuffle --output " +
                            p("n") + engine);
    ASSERT_EQ(n.code, 0) << n.err;
    std::vector<std::string> norms;
    const std::string log = n.out + n.err;
    for (size_t at = log.find("grad_norm "); at != std::string::npos; at = log.find("grad_norm ", at + 1))
      norms.push_back(log.substr(at + 10, log.find(' ', at + 10) - at - 10));
    ASSERT_EQ(norms.size(), 3u) << log;
    EXPECT_NE(norms[0], "0.0000");
    EXPECT_EQ(norms[1], norms[0]);
    EXPECT_EQ(norms[2], norms[0]);
  }
}

// Per-layer input embeddings (the E-models' hidden_size_per_layer_input, here with shared K/V and
// double-wide MLPs as in E2B / E4B): both engines train to the same bytes with two micro-batches a
// step (the sliding engine keeps every micro-batch's inputs from its forward to its backward); every
// tensor is saved with transformers' names and shapes and every parameter learns (the per-layer
// tables' padding row, token 0 of the data, stays); lr 0 saves the checkpoint back byte for byte.
TEST_F(Gemma4Cli, PerLayerInputModelTrainsOnBothEngines) {
  json cfg = tiny_dense_config();
  cfg["hidden_size_per_layer_input"] = 6;
  cfg["num_kv_shared_layers"] = 2;
  cfg["use_double_wide_mlp"] = true;
  const std::string src = write_model("src", kScalars, cfg), d = data();
  const std::string common = " --data " + d + " --seq-len 12 --batch-size 2 --device cpu";
  ASSERT_NO_FATAL_FAILURE(expect_engines_agree_and_every_tensor_learns(src, common));
  const SafetensorsFile in = SafetensorsFile::open(src + "/model.safetensors");
  const SafetensorsFile out = SafetensorsFile::open(p("a") + "/model.safetensors");
  ASSERT_NE(in.find("model.embed_tokens_per_layer.weight"), nullptr);
  {  // the per-layer table's padding row (id 0) keeps its bytes; a used row (id 2) learns
    const TensorInfo& t = *in.find("model.embed_tokens_per_layer.weight");
    const TensorInfo& u = *out.find("model.embed_tokens_per_layer.weight");
    const size_t row = t.bytes / 64;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(u.data), row),
              std::string(reinterpret_cast<const char*>(t.data), row));
    EXPECT_NE(std::string(reinterpret_cast<const char*>(u.data) + 2 * row, row),
              std::string(reinterpret_cast<const char*>(t.data) + 2 * row, row));
  }
  expect_lr0_round_trip(src, common);
}

// The MoE block (26B-A4B's structure: routed GeGLU experts beside the dense MLP, 5 experts top 2,
// with per-layer inputs and shared K/V as well): both engines to the same bytes at 1 and 2
// micro-batches, transformers' fused names and shapes saved back, every parameter learns (the
// router's scales and every expert included), the lr-0 round trip byte for byte.
TEST_F(Gemma4Cli, MoeBlockModelTrainsOnBothEngines) {
  json cfg = tiny_dense_config();
  cfg["enable_moe_block"] = true;
  cfg["num_experts"] = 5;
  cfg["top_k_experts"] = 2;
  cfg["moe_intermediate_size"] = 12;
  cfg["hidden_size_per_layer_input"] = 6;
  cfg["num_kv_shared_layers"] = 2;
  const std::string src = write_model("src", kScalars, cfg), d = data();
  const std::string common = " --data " + d + " --seq-len 12 --batch-size 2 --device cpu";
  ASSERT_NO_FATAL_FAILURE(expect_engines_agree_and_every_tensor_learns(src, common));
  const SafetensorsFile in = SafetensorsFile::open(src + "/model.safetensors");
  const SafetensorsFile out = SafetensorsFile::open(p("a") + "/model.safetensors");
  ASSERT_NE(in.find("model.layers.3.experts.gate_up_proj"), nullptr);
  {  // every expert of layer 0 learned (each is some token's choice in 3 steps of 24 tokens)
    const TensorInfo& t = *in.find("model.layers.0.experts.down_proj");
    const TensorInfo& u = *out.find("model.layers.0.experts.down_proj");
    const size_t per = t.bytes / 5;
    for (size_t e = 0; e < 5; ++e)
      EXPECT_NE(std::string(reinterpret_cast<const char*>(u.data) + e * per, per),
                std::string(reinterpret_cast<const char*>(t.data) + e * per, per))
          << "expert " << e;
  }
  expect_lr0_round_trip(src, common);
}

// A hostile MoE block is refused at load, exit 2, one line naming the file and the key.
TEST_F(Gemma4Cli, HostileMoeBlockIsRefusedNamingTheKey) {
  const std::string d = data();
  json cfg = tiny_dense_config();
  cfg["enable_moe_block"] = true;
  cfg["num_experts"] = 4;
  cfg["top_k_experts"] = 5;
  cfg["moe_intermediate_size"] = 16;
  const std::string dir = write_model("m_moe", kScalars, cfg);
  test::CmdResult r =
      run("train --model " + dir + " --data " + d + " --steps 1 --lr 1e-2 --device cpu --output " + p("o"));
  expect_input_error(r, dir + "/config.json");
  EXPECT_NE(r.err.find("top_k_experts"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(p("o")));
}

}  // namespace
}  // namespace sf
