// Hardware profiles (plan --hardware / --save-hardware), the disk probe, the K table of `plan`, and
// the built-in presets' parameter counts against the published model sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/disk_rate.h"
#include "io/json_file.h"
#include "model/spec.h"
#include "test_util.h"
#include "train/hardware_profile.h"
#include "train/presets.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json builtin_json(const std::string& name) {
  return json::parse(hardware_to_json(load_hardware(name)).dump());
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

void expect_same(const HardwareProfile& a, const HardwareProfile& b) {
  EXPECT_EQ(hardware_to_json(a).dump(), hardware_to_json(b).dump());
}

TEST(Hardware, BuiltinProfilesLoadAndRoundTrip) {
  const std::vector<std::string> names = builtin_hardware_names();
  ASSERT_EQ(names.size(), 2u);
  test::TempDir d;
  for (const std::string& n : names) {
    const HardwareProfile h = load_hardware(n);
    EXPECT_EQ(h.name, n);
    EXPECT_GT(h.gpu_memory_gib, 20);
    EXPECT_EQ(h.sources.size(), hardware_keys().size()) << n << ": every figure says where it comes from";
    // JSON value round trip, then through a file.
    expect_same(h, hardware_from_json(json::parse(hardware_to_json(h).dump()), "x"));
    const std::string path = d.file(n + ".json");
    save_hardware(path, h);
    expect_same(h, load_hardware(path));
    // The rates the planner gets.
    const Rates r = h.rates();
    EXPECT_DOUBLE_EQ(r.model_tflops, h.gemm_tflops * h.model_efficiency);
    EXPECT_GT(h.attention_fwd_tflops, 0) << n << ": the shipped profiles state their attention rates";
    EXPECT_DOUBLE_EQ(r.attn_fwd_tflops, h.attention_fwd_tflops);
    EXPECT_DOUBLE_EQ(r.attn_bwd_tflops, h.attention_bwd_tflops);
    EXPECT_DOUBLE_EQ(r.host_adamw_params_s, h.host_adamw_gparams_s * 1e9);
    EXPECT_DOUBLE_EQ(r.pcie_gbs, h.pcie_gbs);
    EXPECT_DOUBLE_EQ(r.host_bus_gbs, h.host_bus_gbs);
    EXPECT_DOUBLE_EQ(r.disk_read_gbs, h.disk_read_gbs);
    EXPECT_DOUBLE_EQ(r.disk_write_gbs, h.disk_write_gbs);
    EXPECT_EQ(h.gpu_budget_bytes(), size_t(h.gpu_memory_gib * 0.9 * double(1 << 30)));
  }
  const HardwareProfile r = load_hardware("rtx4090");
  EXPECT_DOUBLE_EQ(r.gpu_memory_gib, 23.99);
  EXPECT_DOUBLE_EQ(r.ram_gib, 256);
  // Saving never overwrites: the file written above stays as it was.
  const std::string path = d.file("rtx4090.json");
  const std::string before = test::slurp(path);
  test::expect_input_error([&] { save_hardware(path, load_hardware("a100-80gb")); }, {path, "exists"});
  EXPECT_EQ(test::slurp(path), before);
  test::expect_input_error([] { load_hardware("rtx9090"); }, {"--hardware", "rtx9090", "rtx4090", "a100-80gb"});
}

// Every kind of bad hardware file: exit-2 class error naming the file and the key.
TEST(Hardware, BadFilesNameTheFileAndTheKey) {
  test::TempDir d;
  const json good = builtin_json("rtx4090");
  struct Case {
    std::string what;
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"unknown key", [](json& j) { j["gpu_memroy_gib"] = 24; }, {"$.gpu_memroy_gib", "unknown key"}},
      {"missing key", [](json& j) { j.erase("host_read_gbs"); }, {"$.host_read_gbs", "missing"}},
      {"null", [](json& j) { j["pcie_gbs"] = nullptr; }, {"$.pcie_gbs", "missing"}},
      {"string", [](json& j) { j["pcie_gbs"] = "22"; }, {"$.pcie_gbs", "expected a number"}},
      {"bool", [](json& j) { j["gemm_tflops"] = true; }, {"$.gemm_tflops", "expected a number"}},
      {"negative", [](json& j) { j["disk_read_gbs"] = -7; }, {"$.disk_read_gbs", "out of range"}},
      {"zero", [](json& j) { j["disk_write_gbs"] = 0; }, {"$.disk_write_gbs", "out of range"}},
      {"absurd", [](json& j) { j["gemm_tflops"] = 1e9; }, {"$.gemm_tflops", "out of range"}},
      {"unit slip", [](json& j) { j["host_adamw_gparams_s"] = 1.8e9; }, {"$.host_adamw_gparams_s", "out of range"}},
      {"efficiency > 1", [](json& j) { j["model_efficiency"] = 1.5; }, {"$.model_efficiency", "out of range"}},
      {"disk size negative", [](json& j) { j["disk_gib"] = -1; }, {"$.disk_gib", "out of range"}},
      {"attention negative",
       [](json& j) { j["attention_fwd_tflops"] = -140; },
       {"$.attention_fwd_tflops", "out of range"}},
      {"attention zero", [](json& j) { j["attention_bwd_tflops"] = 0; }, {"$.attention_bwd_tflops", "out of range"}},
      {"attention string",
       [](json& j) { j["attention_fwd_tflops"] = "140"; },
       {"$.attention_fwd_tflops", "expected a number"}},
      {"attention absurd",
       [](json& j) { j["attention_bwd_tflops"] = 1e12; },
       {"$.attention_bwd_tflops", "out of range"}},
      {"attention above the GEMM",
       [](json& j) { j["attention_bwd_tflops"] = 990; },
       {"$.attention_bwd_tflops", "more than gemm_tflops"}},
      {"name not a string", [](json& j) { j["name"] = 4090; }, {"$.name", "expected a string"}},
      {"sources not an object", [](json& j) { j["sources"] = json::array(); }, {"$.sources", "expected an object"}},
      {"unknown source", [](json& j) { j["sources"]["gpu"] = "x"; }, {"$.sources.gpu", "unknown key"}},
      {"source not a string",
       [](json& j) { j["sources"]["pcie_gbs"] = 3; },
       {"$.sources.pcie_gbs", "expected a string"}},
      {"not an object",
       [](json& j) {
         j = json::array({1, 2});
       },
       {"expected an object"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json j = good;
    c.edit(j);
    const std::string path = d.file("bad.json");
    write_text(path, j.dump());
    std::vector<std::string> parts = c.parts;
    parts.push_back(path);
    test::expect_input_error([&] { load_hardware(path); }, parts);
  }
  // Not JSON: NaN and out-of-range literals, truncation; no file at all.
  // NaN for the new keys too (not JSON: refused by the parser, naming the file).
  for (const std::string& text :
       {std::string("{\"attention_fwd_tflops\": NaN}"), std::string("{\"pcie_gbs\": NaN}"),
        std::string("{\"pcie_gbs\": 1e400}"), std::string("{\"pcie_gbs\": "), std::string("")}) {
    SCOPED_TRACE(text);
    const std::string path = d.file("bad.json");
    write_text(path, text);
    test::expect_input_error([&] { load_hardware(path); }, {path, "invalid JSON"});
  }
  test::expect_input_error([&] { load_hardware(d.file("none.json")); }, {d.file("none.json"), "not found"});
}

// Files written before the attention rates existed still load: the planner gets the GEMM rate x
// the H200 machine's ratios, and writing the profile back keeps the keys absent.
TEST(Hardware, AttentionRatesAreOptional) {
  json old = builtin_json("rtx4090");
  old.erase("attention_fwd_tflops");
  old.erase("attention_bwd_tflops");
  old["sources"].erase("attention_fwd_tflops");
  old["sources"].erase("attention_bwd_tflops");
  const HardwareProfile h = hardware_from_json(old, "old.json");
  EXPECT_EQ(h.attention_fwd_tflops, 0);
  const Rates r = h.rates();
  EXPECT_DOUBLE_EQ(r.attn_fwd_tflops, h.gemm_tflops * kAttnFwdPerGemm);
  EXPECT_DOUBLE_EQ(r.attn_bwd_tflops, h.gemm_tflops * kAttnBwdPerGemm);
  EXPECT_FALSE(hardware_to_json(h).contains("attention_fwd_tflops"));
  // The H200's own: its measured GEMM rate gives about its kernels' rates (Rates' defaults).
  EXPECT_NEAR(764 * kAttnFwdPerGemm, Rates{}.attn_fwd_tflops, 1e-9);
  EXPECT_NEAR(764 * kAttnBwdPerGemm, Rates{}.attn_bwd_tflops, 1e-9);
  // One of the two given: that one from the file, the other derived.
  old["attention_fwd_tflops"] = 77;
  const Rates one = hardware_from_json(old, "old.json").rates();
  EXPECT_DOUBLE_EQ(one.attn_fwd_tflops, 77);
  EXPECT_DOUBLE_EQ(one.attn_bwd_tflops, h.gemm_tflops * kAttnBwdPerGemm);
}

// The published sizes: Llama 2 13B, Mistral Small 24B (2501), Llama 3 70B, Mistral Large 2 (2407),
// each model's safetensors total; the older presets against their models too.
TEST(Presets, ParameterCountsAreThePublishedOnes) {
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"llama-1b", 1235814400},     {"llama-3b", 3212749824},     {"llama-8b", 8030261248},
      {"qwen2.5-7b", 7615616512},   {"llama-13b", 13015864320},   {"mistral-24b", 23572403200},
      {"llama-70b", 70553706496},   {"mistral-123b", 122610069504},
      // Gemma 3 4B's language model from the published config's shapes (the card's 4.3 B include the
      // vision tower)
      {"gemma3-4b", 3880263168},
      // the MoE shapes: Qwen3-30B-A3B (30.5 B), Mixtral-8x7B (46.7 B), OLMoE-1B-7B (6.9 B), their
      // safetensors totals (tests/test_moe_model.cpp checks the active counts)
      {"qwen3-30b-a3b", 30532122624}, {"mixtral-8x7b", 46702792704}, {"olmoe-1b-7b", 6919161856}};
  for (const auto& [name, params] : expected) {
    const ModelSpec s = parse_model_spec(preset_config(name), "preset " + name);
    EXPECT_EQ(s.total_params(), params) << name;
  }
  EXPECT_EQ(preset_names().size(), expected.size());
  const ModelSpec m = parse_model_spec(preset_config("mistral-24b"), "x");
  EXPECT_EQ(m.head_dim, 128);  // 32 heads of 128 on a 5120 residual
  EXPECT_EQ(m.q_dim(), 4096);
  EXPECT_EQ(m.architecture, "MistralForCausalLM");
  test::expect_input_error([] { preset_config("llama-7b"); }, {"--preset", "llama-7b", "mistral-123b"});
}

// A directory on a disk that takes O_DIRECT: the test's working directory (the build tree), not
// /tmp, which is tmpfs on some machines.
struct ProbeDir {
  fs::path path = fs::current_path() / ("sf_disk_probe_" + std::to_string(::getpid()));
  ProbeDir() { fs::create_directories(path); }
  ~ProbeDir() { fs::remove_all(path); }
};

TEST(DiskProbe, MeasuresBothWaysAndRemovesItsFile) {
  ProbeDir d;
  DiskProbeOptions o;
  o.max_bytes = size_t(8) << 20;
  o.block_bytes = size_t(1) << 20;
  o.in_flight = 3;
  const DiskRate r = measure_disk(d.path.string(), o);
  EXPECT_GT(r.write_gbs, 0);
  EXPECT_GT(r.read_gbs, 0);
  EXPECT_EQ(r.bytes_written, o.max_bytes);  // 8 MiB take far less than the 2 s bound
  EXPECT_EQ(r.bytes_read, r.bytes_written);
  EXPECT_TRUE(fs::is_empty(d.path));
  // A file of the user's with the probe's name pattern is never touched.
  write_text((d.path / "keep.txt").string(), "mine");
  measure_disk(d.path.string(), o);
  EXPECT_EQ(test::slurp(d.path / "keep.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 1);
}

TEST(DiskProbe, BadDirectoriesAreInputErrors) {
  ProbeDir d;
  DiskProbeOptions o;
  o.max_bytes = size_t(4) << 20;
  o.block_bytes = size_t(1) << 20;
  const std::string none = (d.path / "none").string();
  test::expect_input_error([&] { measure_disk(none, o); }, {none, "No such file"});
  const std::string file = (d.path / "f").string();
  write_text(file, "x");
  test::expect_input_error([&] { measure_disk(file, o); }, {file, "not a directory"});
  o.block_bytes = 1000;  // not a multiple of the 4096-byte alignment
  test::expect_input_error([&] { measure_disk(d.path.string(), o); }, {"4096"});
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 1);
}

class PlanHardware : public test::BinaryTest {
 protected:
  PlanHardware() : test::BinaryTest("sf_hw_") {}
  static constexpr const char* kPlan = "plan --preset llama-8b --batch-size 8 --seq-len 2048";
};

TEST_F(PlanHardware, UsesTheFilesRatesAndMemory) {
  test::CmdResult r = run(std::string(kPlan) + " --hardware rtx4090");
  ASSERT_EQ(r.code, 0) << r.err;
  const json a = r.last();
  const HardwareProfile h = load_hardware("rtx4090");
  EXPECT_EQ(a["backend"], "cuda");
  EXPECT_EQ(a["rates"]["source"], "hardware rtx4090");
  EXPECT_DOUBLE_EQ(a["rates"]["pcie_gbs"].get<double>(), h.pcie_gbs);
  EXPECT_EQ(a["gpu_budget"].get<size_t>(), h.gpu_budget_bytes());
  EXPECT_EQ(a["host_budget"].get<size_t>(), h.host_budget_bytes());
  EXPECT_TRUE(a["fits"].get<bool>()) << r.err;
  EXPECT_EQ(a["engine"], "sliding");  // 8B does not fit 24 GB whole
  EXPECT_GT(a["predicted_tokens_per_second"].get<double>(), 0);
  EXPECT_NE(r.err.find("hardware rtx4090"), std::string::npos) << r.err;

  // Every rate doubled: the same placement, every phase half as long.
  json fast = builtin_json("rtx4090");
  for (const char* k : {"gemm_tflops", "attention_fwd_tflops", "attention_bwd_tflops", "pcie_gbs", "host_bus_gbs",
                        "host_adamw_gparams_s", "host_read_gbs", "disk_read_gbs", "disk_write_gbs"})
    fast[k] = fast[k].get<double>() * 2;
  write_text(p("fast.json"), fast.dump());
  r = run(std::string(kPlan) + " --hardware " + p("fast.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  const json b = r.last();
  EXPECT_EQ(b["slots"], a["slots"]);
  EXPECT_EQ(b["gpu_blobs"], a["gpu_blobs"]);
  EXPECT_NEAR(b["predicted_step_s"].get<double>() * 2, a["predicted_step_s"].get<double>(),
              1e-9 * a["predicted_step_s"].get<double>());
  // Only the GPU faster: the GPU time halves.
  json gpu = builtin_json("rtx4090");
  for (const char* k : {"gemm_tflops", "attention_fwd_tflops", "attention_bwd_tflops"})
    gpu[k] = gpu[k].get<double>() * 2;
  write_text(p("gpu.json"), gpu.dump());
  r = run(std::string(kPlan) + " --hardware " + p("gpu.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NEAR(r.last()["predicted_gpu_s"].get<double>() * 2, a["predicted_gpu_s"].get<double>(), 1e-9);
  // The budgets given on the command line win over the profile's memory.
  r = run(std::string(kPlan) + " --hardware rtx4090 --gpu-memory 12GiB --cpu-memory 100GiB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["gpu_budget"].get<size_t>(), size_t(12) << 30);
  EXPECT_EQ(r.last()["host_budget"].get<size_t>(), size_t(100) << 30);
  // A larger machine: the A100 profile keeps more on the GPU: more bytes and at least as many
  // layers' worth (blobs kept whole, or layers whose activations are kept whole: the planner weighs
  // the two by predicted step — since session 26's cheaper kept layers the 4090 keeps a layer blob
  // and the A100 its layers' activations), without upload copies; with them (the default's choice
  // there) more GPU memory, spent on layers kept whole instead, the copies halving the sliding
  // blobs' uploads.
  r = run(std::string(kPlan) + " --hardware a100-80gb --upload-copies off");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto kept = [](const json& j) { return j["gpu_blobs"].size() + j["whole_layers"].get<size_t>(); };
  EXPECT_GE(kept(r.last()), kept(a));
  EXPECT_GT(r.last()["gpu_bytes"].get<size_t>(), a["gpu_bytes"].get<size_t>());
  r = run(std::string(kPlan) + " --hardware a100-80gb");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GT(r.last()["gpu_bytes"].get<size_t>(), a["gpu_bytes"].get<size_t>());
}

// Issue 17: models past host memory fit with the NVMe tier's levels (docs/ENGINE.md): 123B on the
// 4090 desktop needs the masters and their working copies in the store; the working copies are
// read twice a step (the prediction's disk reads exceed its writes by them); a disk too small
// for it all is refused with the numbers (as train refuses it, exit 2: Cli.OffloadDirMatchesInMemory).
TEST_F(PlanHardware, LargestModelsFitWithTheStore) {
  fs::create_directory(p("off"));
  const std::string off = " --offload-dir " + p("off");
  for (const char* preset : {"mistral-123b", "llama-70b"}) {
    SCOPED_TRACE(preset);
    const std::string plan = std::string("plan --preset ") + preset + " --hardware rtx4090";
    test::CmdResult r = run(plan);  // without the store: host memory is short
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(r.last()["fits"].get<bool>());
    r = run(plan + off);
    ASSERT_EQ(r.code, 0) << r.err;
    const json a = r.last();
    EXPECT_TRUE(a["fits"].get<bool>()) << r.err;
    EXPECT_FALSE(a["disk_blobs"].empty());
    EXPECT_GT(a["predicted_tokens_per_second"].get<double>(), 0);
    EXPECT_GT(a["predicted_disk_s"].get<double>(), 0);
    EXPECT_LE(a["host_bytes"].get<size_t>(), a["host_budget"].get<size_t>());
    EXPECT_NE(r.err.find("offload dir holds"), std::string::npos) << r.err;
    if (std::string(preset) == "mistral-123b") {
      EXPECT_FALSE(a["disk_weights"].empty());
      EXPECT_GT(a["disk_read_bytes_per_step"].get<double>(), a["disk_write_bytes_per_step"].get<double>());
      EXPECT_FALSE(a["disk_grads"].empty());  // clipping's held gradients (228 GiB in bf16) too
      r = run(plan + off + " --max-grad-norm 0");  // without clipping (SlideFormer's setting): none held
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_TRUE(r.last()["fits"].get<bool>()) << r.err;
      EXPECT_TRUE(r.last()["disk_grads"].empty());
    }
    r = run(plan + off + " --disk-memory 100GiB");  // refused with the numbers (train: exit 2)
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(r.last()["fits"].get<bool>());
    EXPECT_NE(r.last()["why"].get<std::string>().find("in the offload directory"), std::string::npos) << r.err;
  }
  // The check: 13B, 8 x 2048, 24 GiB GPU, 100 GiB host: fits with state in the store.
  test::CmdResult r = run("plan --preset llama-13b --batch-size 8 --seq-len 2048 --gpu-memory 24GiB "
                          "--cpu-memory 100GiB --disk-memory 1TiB" + off);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.last()["fits"].get<bool>()) << r.err;
  EXPECT_FALSE(r.last()["disk_blobs"].empty());
}

// `plan --longest-seq`: the longest --seq-len that fits, planned; the line says what stops the next
// token; --seq-len bounds the search; the attention rates are in the JSON.
TEST_F(PlanHardware, LongestSequence) {
  const std::string plan = "plan --preset llama-8b --batch-size 1 --hardware rtx4090 --longest-seq";
  test::CmdResult r = run(plan);
  ASSERT_EQ(r.code, 0) << r.err;
  const json a = r.last();
  const int n = a["longest_seq_len"].get<int>();
  EXPECT_GT(n, 2048);
  EXPECT_LT(n, 131072);  // the 4090's 24 GB stop it before the model's context
  EXPECT_EQ(a["seq_len"].get<int>(), n);
  EXPECT_TRUE(a["fits"].get<bool>()) << r.err;
  EXPECT_NE(r.err.find("longest sequence that fits: " + std::to_string(n) + " tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("at " + std::to_string(n + 1) + " the plan needs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 x " + std::to_string(n) + " tokens"), std::string::npos) << r.err;
  EXPECT_DOUBLE_EQ(a["rates"]["attn_fwd_tflops"].get<double>(), load_hardware("rtx4090").attention_fwd_tflops);
  // The same length planned directly fits; one more does not.
  r = run("plan --preset llama-8b --batch-size 1 --hardware rtx4090 --seq-len " + std::to_string(n + 1));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.last()["fits"].get<bool>());
  // --seq-len bounds the search.
  r = run(plan + " --seq-len 3000");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["longest_seq_len"].get<int>(), 3000);
  // Nothing fits 1 GiB: 0, and the plan for 1 token says why.
  r = run(plan + " --gpu-memory 1GiB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["longest_seq_len"].get<int>(), 0);
  EXPECT_FALSE(r.last()["fits"].get<bool>());
  EXPECT_NE(r.err.find("no sequence fits"), std::string::npos) << r.err;
}

// A hostile attention rate on the command line: exit 2, one line naming the file and the key; a
// file without the attention keys (written before them) plans.
TEST_F(PlanHardware, AttentionRatesFromTheFile) {
  json bad = builtin_json("rtx4090");
  bad["attention_fwd_tflops"] = 1400;  // TFLOP/s slipped by 10x: more than the GEMM
  write_text(p("bad.json"), bad.dump());
  test::CmdResult r = run(std::string(kPlan) + " --hardware " + p("bad.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(p("bad.json")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("$.attention_fwd_tflops"), std::string::npos) << r.err;
  json old = builtin_json("rtx4090");
  old.erase("attention_fwd_tflops");
  old.erase("attention_bwd_tflops");
  old["sources"].erase("attention_fwd_tflops");
  old["sources"].erase("attention_bwd_tflops");
  write_text(p("old.json"), old.dump());
  r = run(std::string(kPlan) + " --hardware " + p("old.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_DOUBLE_EQ(r.last()["rates"]["attn_fwd_tflops"].get<double>(), 150 * kAttnFwdPerGemm);
  EXPECT_NE(r.err.find("not in the file: from the GEMM rate"), std::string::npos) << r.err;
}

TEST_F(PlanHardware, GradAccumTable) {
  // Without kept activations: weights cross PCIe and the host optimizer runs once a step, so
  // tokens/s never drop with K. (With them, the default, they can: kept activations are per
  // micro-batch, so a larger K keeps fewer layers and recomputes more per token.)
  test::CmdResult r0 = run(std::string(kPlan) + " --hardware rtx4090 --keep-layers 0 --keep-attention 0");
  ASSERT_EQ(r0.code, 0) << r0.err;
  test::CmdResult r = run(std::string(kPlan) + " --hardware rtx4090");
  ASSERT_EQ(r.code, 0) << r.err;
  double prev_tps = 0;
  const json t0 = r0.last()["grad_accum_table"];
  ASSERT_EQ(t0.size(), 5u);
  for (size_t i = 0; i < t0.size(); ++i) {
    EXPECT_GE(t0[i]["predicted_tokens_per_second"].get<double>(), prev_tps * (1 - 1e-9));
    prev_tps = t0[i]["predicted_tokens_per_second"].get<double>();
  }
  const json t = r.last()["grad_accum_table"];
  ASSERT_EQ(t.size(), 5u);
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i]["grad_accum"], 1 << i);
    EXPECT_DOUBLE_EQ(t[i]["tokens_per_step"].get<double>(), 8.0 * 2048 * (1 << i));
    EXPECT_NEAR(t[i]["predicted_tokens_per_second"].get<double>() * t[i]["predicted_step_s"].get<double>(),
                t[i]["tokens_per_step"].get<double>(), 1e-6 * t[i]["tokens_per_step"].get<double>());
    // The planner's choice of kept activations is never slower than keeping none, at every K.
    EXPECT_GE(t[i]["predicted_tokens_per_second"].get<double>(),
              t0[i]["predicted_tokens_per_second"].get<double>() * (1 - 1e-9));
  }
  // K = 1 is the plan itself.
  EXPECT_DOUBLE_EQ(t[0]["predicted_step_s"].get<double>(), r.last()["predicted_step_s"].get<double>());
  EXPECT_EQ(t[0]["predicted_phases"], r.last()["predicted_phases"]);
  EXPECT_FALSE(r.last()["predicted_phases"].is_null());  // the sliding engine at the profile's memory
  EXPECT_NE(r.err.find("phases: forward "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("by gradient accumulation"), std::string::npos) << r.err;
}

// A sliding plan bound by the host with fp32 moments names the bf16-moment plan when it predicts
// more (its figures are that plan's own), and names nothing where the moments are bf16 already,
// where the step is not the host's, or in memory.
TEST_F(PlanHardware, NamesBf16MomentsWhenTheHostBounds) {
  const std::string plan = std::string(kPlan) + " --hardware rtx4090 --max-grad-norm 1";
  test::CmdResult r = run(plan);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.last();
  ASSERT_TRUE(j["fits"].get<bool>()) << r.err;
  ASSERT_FALSE(j["predicted_phases"].is_null());
  const json& ph = j["predicted_phases"];
  ASSERT_TRUE(ph["forward_bound"] == "host" || ph["backward_bound"] == "host" || ph["head_bound"] == "host" ||
              ph["step_bound"] == "host")
      << ph.dump();  // the desktop's dual-channel DDR5 against 8B's host AdamW
  const json f = j["faster_with"];
  ASSERT_FALSE(f.is_null()) << r.err;
  EXPECT_EQ(f["setting"], "--optimizer-state");
  EXPECT_EQ(f["value"], "bf16");
  EXPECT_GT(f["predicted_tokens_per_second"].get<double>(), 1.01 * j["predicted_tokens_per_second"].get<double>());
  EXPECT_NE(r.err.find("--optimizer-state bf16 predicts"), std::string::npos) << r.err;
  // The figures are those of the plan with bf16 moments, which names nothing more.
  test::CmdResult b = run(plan + " --optimizer-state bf16");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_DOUBLE_EQ(b.last()["predicted_tokens_per_second"].get<double>(),
                   f["predicted_tokens_per_second"].get<double>());
  EXPECT_DOUBLE_EQ(b.last()["predicted_step_s"].get<double>(), f["predicted_step_s"].get<double>());
  EXPECT_TRUE(b.last()["faster_with"].is_null());
  EXPECT_EQ(b.err.find("faster with"), std::string::npos) << b.err;
  // In GPU memory (a 1B model on the A100's 80 GB): nothing to name.
  test::CmdResult m = run("plan --preset llama-1b --batch-size 8 --seq-len 2048 --hardware a100-80gb");
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_EQ(m.last()["engine"], "resident");
  EXPECT_TRUE(m.last()["faster_with"].is_null());
}

// The NVMe tier on another machine: the profile's disk size is the disk budget and its rates the
// disk's time; with state on disk, the disk's traffic a step does not grow with K, so larger steps
// are cheaper per token (Mistral Small 24B on the 4090 desktop: fp32 state does not fit its RAM).
TEST_F(PlanHardware, OffloadDirOnAProfile) {
  ProbeDir d;
  const std::string plan = "plan --preset mistral-24b --batch-size 8 --seq-len 2048 --hardware rtx4090";
  test::CmdResult r = run(plan);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.last()["fits"].get<bool>());  // 314 GiB of host memory
  r = run(plan + " --offload-dir " + d.path.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.last();
  const HardwareProfile h = load_hardware("rtx4090");
  EXPECT_EQ(j["disk_budget"].get<size_t>(), h.disk_budget_bytes());
  ASSERT_TRUE(j["fits"].get<bool>()) << r.err;
  EXPECT_GT(j["disk_bytes"].get<double>(), 0);
  EXPECT_LE(j["host_bytes"].get<size_t>(), h.host_budget_bytes());
  // The disk moves its bytes once each way a step at the profile's rates.
  EXPECT_GT(j["predicted_disk_s"].get<double>(), 0);
  const json t = j["grad_accum_table"];
  ASSERT_EQ(t.size(), 5u);
  EXPECT_GT(t[3]["predicted_tokens_per_second"].get<double>(), t[0]["predicted_tokens_per_second"].get<double>());
  // A disk twice as fast: the disk's time halves.
  json fast = builtin_json("rtx4090");
  fast["disk_read_gbs"] = fast["disk_read_gbs"].get<double>() * 2;
  fast["disk_write_gbs"] = fast["disk_write_gbs"].get<double>() * 2;
  write_text(p("fast_disk.json"), fast.dump());
  r = run("plan --preset mistral-24b --batch-size 8 --seq-len 2048 --hardware " + p("fast_disk.json") +
          " --offload-dir " + d.path.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["disk_bytes"], j["disk_bytes"]);
  EXPECT_NEAR(r.last()["predicted_disk_s"].get<double>() * 2, j["predicted_disk_s"].get<double>(), 1e-9);
  // --disk-memory wins over the profile's disk.
  r = run(plan + " --offload-dir " + d.path.string() + " --disk-memory 1TiB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["disk_budget"].get<size_t>(), size_t(1) << 40);
}

// Issue 18: Qwen3-30B-A3B (30.5 B parameters, 3.3 B active) on the RTX 4090 desktop profile (24 GB
// GPU, 256 GB RAM, NVMe): fp32 AdamW state with its 12 bytes a parameter does not fit the RAM; bf16
// state without clipping fits it, the NVMe tier fits either, and each plan predicts a speed that
// grows with --grad-accum (the weights cross PCIe once a step whatever the step's tokens).
TEST_F(PlanHardware, Qwen3MoeOnTheDesktopFitsAndPredicts) {
  ProbeDir d;
  const std::string plan = "plan --preset qwen3-30b-a3b --batch-size 8 --seq-len 2048 --hardware rtx4090";
  test::CmdResult r = run(plan);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.last()["fits"].get<bool>());
  EXPECT_NE(r.err.find("DOES NOT FIT: needs"), std::string::npos) << r.err;
  const HardwareProfile h = load_hardware("rtx4090");
  // Each plan of this model is ~100 s of CPU under the sanitizers (its ~18k expert tensors' layout,
  // laid out again for every placement tried): there the store's plan alone, the one with more code.
  std::vector<std::string> extras = {" --optimizer-state bf16 --max-grad-norm 0", " --offload-dir " + d.path.string()};
  if (test::kSanitizerBuild) extras.erase(extras.begin());
  for (const std::string& extra : extras) {
    r = run(plan + extra);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.last();
    ASSERT_TRUE(j["fits"].get<bool>()) << extra << ": " << r.err;
    EXPECT_EQ(j["engine"], "sliding");
    EXPECT_LE(j["host_bytes"].get<size_t>(), h.host_budget_bytes()) << extra;
    EXPECT_LE(j["gpu_bytes"].get<size_t>(), j["gpu_budget"].get<size_t>()) << extra;
    const double tps = j["predicted_tokens_per_second"].get<double>();
    EXPECT_GT(tps, 0) << extra;
    EXPECT_NEAR(tps * j["predicted_step_s"].get<double>(), 8.0 * 2048, 1e-6 * 8 * 2048) << extra;
    const json t = j["grad_accum_table"];
    ASSERT_GE(t.size(), 2u);
    EXPECT_GT(t[1]["predicted_tokens_per_second"].get<double>(), tps) << extra;
  }
}

TEST_F(PlanHardware, BadUseIsExitTwo) {
  json bad = builtin_json("a100-80gb");
  bad["pcie_gbs"] = -3;
  write_text(p("bad.json"), bad.dump());
  test::CmdResult r = run(std::string(kPlan) + " --hardware " + p("bad.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(p("bad.json")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("$.pcie_gbs"), std::string::npos) << r.err;
  r = run(std::string(kPlan) + " --hardware rtx4090 --measure");
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(std::string(kPlan) + " --hardware rtx4090 --device cpu");
  EXPECT_EQ(r.code, 2) << r.err;
  r = run(std::string(kPlan) + " --save-hardware " + p("x.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--measure"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("x.json")));
}

TEST_F(PlanHardware, MeasureSavesThisMachineAndItsDisk) {
  ProbeDir d;
  const std::string plan = "plan --preset llama-1b --batch-size 1 --seq-len 64 --device cpu --measure";
  // The environment shrinks the probe to 8 MiB (run() has no environment of its own).
  const std::string cmd = "env SF_DISK_PROBE_MIB=8 " + std::string(SF_BINARY) + " " + plan + " --offload-dir " +
                          d.path.string() + " --save-hardware " + p("me.json") + " >" + p("o.txt") + " 2>" + p("e.txt");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::slurp(p("e.txt"));
  const std::string err = test::slurp(p("e.txt"));
  EXPECT_NE(err.find("disk ("), std::string::npos) << err;
  const json out = json::parse(test::slurp(p("o.txt")));
  EXPECT_EQ(out["rates"]["source"], "measured");
  EXPECT_GT(out["rates"]["disk_read_gbs"].get<double>(), 0);
  EXPECT_NE(out["rates"]["disk_read_gbs"].get<double>(), Rates{}.disk_read_gbs);
  EXPECT_TRUE(fs::is_empty(d.path));  // the probe's file is gone
  const HardwareProfile h = load_hardware(p("me.json"));
  EXPECT_DOUBLE_EQ(h.disk_read_gbs, out["rates"]["disk_read_gbs"].get<double>());
  EXPECT_DOUBLE_EQ(h.host_adamw_gparams_s * 1e9, out["rates"]["host_adamw_params_s"].get<double>());
  EXPECT_GT(h.ram_gib, 0.5);
  EXPECT_GT(h.disk_gib, 0);  // the directory's free space
  EXPECT_NE(h.sources.at("disk_read_gbs").find("measured"), std::string::npos);
  // The saved file plans another run; a second save never overwrites it.
  const std::string before = test::slurp(p("me.json"));
  test::CmdResult r = run(plan + " --save-hardware " + p("me.json"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
  EXPECT_EQ(test::slurp(p("me.json")), before);
  r = run("plan --preset llama-1b --batch-size 1 --seq-len 64 --hardware " + p("me.json"));
  EXPECT_EQ(r.code, 0) << r.err;
}

}  // namespace
}  // namespace sf
