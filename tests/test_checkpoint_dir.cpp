// HF checkpoint directories: single/sharded round trips with conversion, index errors, staged output
// directories, JSON file helpers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace sf;

namespace {

using test::expect_input_error;
using test::TempDir;

void write_text(const std::string& path, const std::string& s) {
  std::ofstream out(path, std::ios::binary);
  out << s;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (float(i) - float(n) / 2) * scale;
  return v;
}

size_t entries(const fs::path& p) { return size_t(std::distance(fs::directory_iterator(p), fs::directory_iterator())); }

}  // namespace

TEST(Checkpoint, SingleFileConversionsAndDominantDtype) {
  TempDir d;
  std::vector<float> f32 = {
      1.0f, -2.5f, 1.00390625f /* tie: rounds to even 1.0 in bf16 */, 1.01171875f /* tie up */, 3.14159265f, 1e-20f};
  std::vector<float> big = ramp(64, 0.37f);
  std::vector<bf16> bfv(big.size());
  for (size_t i = 0; i < big.size(); ++i) bfv[i] = float_to_bf16(big[i]);
  std::vector<uint16_t> f16v = {float_to_f16(0.5f), float_to_f16(-3.0f), float_to_f16(1000.0f), float_to_f16(0.0f)};
  std::string dir = d.file("ck");
  write_checkpoint_tensors(dir, {{"a", DType::F32, {2, 3}, f32.data()},
                                 {"b", DType::BF16, {8, 8}, bfv.data()},
                                 {"c", DType::F16, {4}, f16v.data()}});
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));

  CheckpointReader r = CheckpointReader::open(dir);
  EXPECT_FALSE(r.sharded());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(r.total_params(), 6 + 64 + 4);
  EXPECT_EQ(r.dominant_dtype(), DType::BF16);

  std::vector<float> out(6);
  r.read_f32("a", {2, 3}, out.data());
  EXPECT_EQ(out, f32);
  std::vector<bf16> ob(6);
  r.read_bf16("a", {2, 3}, ob.data());
  EXPECT_EQ(ob[0].bits, 0x3f80);
  EXPECT_EQ(ob[2].bits, 0x3f80);  // 1 + 2^-8: tie, mantissa even -> down
  EXPECT_EQ(ob[3].bits, 0x3f82);  // 1 + 3*2^-8: tie, rounds up to even
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(ob[i].bits, float_to_bf16(f32[i]).bits);

  std::vector<float> ofb(64);
  r.read_f32("b", {8, 8}, ofb.data());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(ofb[i], bf16_to_float(bfv[i]));
  std::vector<bf16> obb(64);
  r.read_bf16("b", {8, 8}, obb.data());
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(obb[i].bits, bfv[i].bits);

  std::vector<float> ofh(4);
  r.read_f32("c", {4}, ofh.data());
  EXPECT_EQ(ofh, (std::vector<float>{0.5f, -3.0f, 1000.0f, 0.0f}));
  std::vector<bf16> obh(4);
  r.read_bf16("c", {4}, obh.data());
  EXPECT_EQ(bf16_to_float(obh[1]), -3.0f);
  EXPECT_EQ(bf16_to_float(obh[2]), 1000.0f);

  // Mostly F32 -> F32.
  std::vector<float> many = ramp(1000, 1.0f);
  std::string dir2 = d.file("ck2");
  write_checkpoint_tensors(dir2, {{"x", DType::F32, {1000}, many.data()}, {"y", DType::BF16, {8, 8}, bfv.data()}});
  EXPECT_EQ(CheckpointReader::open(dir2).dominant_dtype(), DType::F32);

  // Large enough for the multi-threaded conversion path.
  const size_t n = 3'000'001;
  std::vector<bf16> large(n);
  for (size_t i = 0; i < n; ++i) large[i] = float_to_bf16(float(i % 256) - 128.f);  // exact in bf16
  std::string dir3 = d.file("ck3");
  write_checkpoint_tensors(dir3, {{"l", DType::BF16, {int64_t(n)}, large.data()}});
  std::vector<float> lf(n);
  CheckpointReader::open(dir3).read_f32("l", {int64_t(n)}, lf.data());
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(lf[i], float(i % 256) - 128.f) << i;
  EXPECT_EQ(lf[n - 1], float((n - 1) % 256) - 128.f);

  // Data area at an odd offset (another writer, no padding): converting reads must not assume alignment.
  std::string dir4 = d.file("ck4");
  fs::create_directories(dir4);
  std::string header = R"({"u":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";  // 55 bytes
  ASSERT_NE(header.size() % 4, 0u);
  std::string raw(8, '\0');
  raw[0] = char(header.size());
  float uv[2] = {6.5f, -0.75f};
  raw += header + std::string(reinterpret_cast<const char*>(uv), 8);
  write_text(dir4 + "/model.safetensors", raw);
  std::vector<bf16> ub(2);
  CheckpointReader::open(dir4).read_bf16("u", {2}, ub.data());
  EXPECT_EQ(bf16_to_float(ub[0]), 6.5f);
  EXPECT_EQ(bf16_to_float(ub[1]), -0.75f);
}

TEST(Checkpoint, ReadErrorsNameFileTensorAndShapesAndMissingDir) {
  TempDir d;
  std::vector<float> v = ramp(6, 1.0f);
  std::string dir = d.file("ck");
  write_checkpoint_tensors(dir, {{"model.embed_tokens.weight", DType::F32, {2, 3}, v.data()}});
  CheckpointReader r = CheckpointReader::open(dir);
  std::vector<float> out(6);
  std::string file = dir + "/model.safetensors";
  std::string msg = expect_input_error([&] { r.read_f32("model.embed_tokens.weight", {3, 2}, out.data()); }, {});
  EXPECT_EQ(msg, file + ": tensor model.embed_tokens.weight has shape [2, 3], config expects [3, 2]");
  msg = expect_input_error([&] { r.read_f32("lm_head.weight", {2, 3}, out.data()); }, {});
  EXPECT_EQ(msg, file + ": tensor lm_head.weight missing");
  std::vector<bf16> ob(6);
  expect_input_error([&] { r.read_bf16("model.embed_tokens.weight", {6}, ob.data()); }, {"config expects [6]"});
  EXPECT_EQ(r.find("lm_head.weight"), nullptr);
  ASSERT_NE(r.find("model.embed_tokens.weight"), nullptr);

  std::string missing = d.file("nope");
  expect_input_error([&] { CheckpointReader::open(missing); }, {missing + ": "});
  std::string empty = d.file("empty");
  fs::create_directories(empty);
  msg = expect_input_error([&] { CheckpointReader::open(empty); }, {});
  EXPECT_EQ(msg, empty + ": no model.safetensors or model.safetensors.index.json");
}

TEST(Checkpoint, ShardedRoundTripWithTinyThreshold) {
  TempDir d;
  // 40 + 40 + 100 + 24 + 16 bytes, threshold 64: [a], [b], [big alone, over the limit], [c, e].
  std::vector<float> a = ramp(10, 0.5f), b = ramp(10, -0.25f), big = ramp(25, 0.125f), c = ramp(6, 2.0f),
                     e = ramp(4, 3.0f);
  std::vector<TensorWrite> tw = {{"a", DType::F32, {10}, a.data()},
                                 {"b", DType::F32, {2, 5}, b.data()},
                                 {"big", DType::F32, {5, 5}, big.data()},
                                 {"c", DType::F32, {6}, c.data()},
                                 {"e", DType::F32, {4}, e.data()}};
  std::string dir = d.file("sharded");
  write_checkpoint_tensors(dir, tw, 64);

  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  for (int i = 1; i <= 4; ++i)
    EXPECT_TRUE(fs::exists(dir + "/model-0000" + std::to_string(i) + "-of-00004.safetensors")) << i;
  EXPECT_EQ(entries(dir), 5u);  // 4 shards + index, no temp files
  nlohmann::json idx = read_json_file(dir + "/model.safetensors.index.json");
  EXPECT_EQ(idx["metadata"]["total_size"], 220);
  nlohmann::json expect_map = {{"a", "model-00001-of-00004.safetensors"},
                               {"b", "model-00002-of-00004.safetensors"},
                               {"big", "model-00003-of-00004.safetensors"},
                               {"c", "model-00004-of-00004.safetensors"},
                               {"e", "model-00004-of-00004.safetensors"}};
  EXPECT_EQ(idx["weight_map"], expect_map);

  CheckpointReader r = CheckpointReader::open(dir);
  EXPECT_TRUE(r.sharded());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "big", "c", "e"}));
  std::vector<float> out(25);
  r.read_f32("big", {5, 5}, out.data());
  EXPECT_EQ(out, big);
  out.resize(10);
  r.read_f32("b", {2, 5}, out.data());
  EXPECT_EQ(out, b);
  EXPECT_EQ(r.find("e")->file, dir + "/model-00004-of-00004.safetensors");

  // Re-saving as a single file over it removes the index that would otherwise shadow the new file.
  write_checkpoint_tensors(dir, {{"a", DType::F32, {10}, a.data()}});
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_EQ(CheckpointReader::open(dir).names(), (std::vector<std::string>{"a"}));
}

TEST(Checkpoint, IndexErrors) {
  TempDir d;
  std::vector<float> a = ramp(4, 1.0f);
  std::string dir = d.file("ck");
  fs::create_directories(dir);
  write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"a", DType::F32, {4}, a.data()}}, {});
  std::string index = dir + "/model.safetensors.index.json";

  write_text(index, R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                       "b": "model-00002-of-00002.safetensors"}})");
  expect_input_error([&] { CheckpointReader::open(dir); },
                     {index + ": ", "model-00002-of-00002.safetensors", "tensor b", "not found"});

  write_text(index, R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                       "ghost": "model-00001-of-00002.safetensors"}})");
  expect_input_error([&] { CheckpointReader::open(dir); },
                     {index + ": ", "tensor ghost", "model-00001-of-00002.safetensors", "does not contain"});

  write_text(index, R"({"metadata": {}})");
  expect_input_error([&] { CheckpointReader::open(dir); }, {index + ": ", "weight_map"});
  write_text(index, R"({"weight_map": {"a": "../x.safetensors"}})");
  expect_input_error([&] { CheckpointReader::open(dir); }, {index + ": ", "tensor a", "not a file name"});
  write_text(index, R"({"weight_map": )");
  expect_input_error([&] { CheckpointReader::open(dir); }, {index + ": invalid JSON at byte"});

  // A shard that exists but is corrupt is reported by the shard's own path.
  write_text(index, R"({"weight_map": {"a": "model-00001-of-00002.safetensors"}})");
  write_text(dir + "/model-00001-of-00002.safetensors", "xx");
  expect_input_error([&] { CheckpointReader::open(dir); }, {dir + "/model-00001-of-00002.safetensors: "});
}

TEST(StagedDir, CommitReplacesOwnOutputKeepingOtherEntries) {
  TempDir d;
  std::string out = d.file("nested/out");
  {
    StagedDir s(out);  // a new directory whose parents do not exist yet
    write_text(s.path() + "/model.safetensors", "old weights");
    write_text(s.path() + "/config.json", "{}");
    s.commit();
  }
  EXPECT_TRUE(fs::exists(out + "/" + kOutputMarker));
  fs::create_directories(out + "/checkpoint-2");
  write_text(out + "/checkpoint-2/model.safetensors", "ck");
  write_text(out + "/checkpoint-2/" + kOutputMarker, "");
  write_text(out + "/model-00001-of-00002.safetensors", "stale shard");
  write_text(out + "/notes.txt", "a user's file");
  {
    StagedDir s(out + "/");  // trailing slash names the same directory
    EXPECT_EQ(s.final_path(), out);
    EXPECT_EQ(fs::path(s.path()).parent_path(), fs::path(out).parent_path());
    EXPECT_NE(s.path().find("out.tmp-"), std::string::npos);
    write_text(s.path() + "/model.safetensors", "new weights");
    EXPECT_EQ(read_text(out + "/model.safetensors"), "old weights");  // untouched until commit
    s.commit();
    EXPECT_TRUE(s.committed());
  }
  EXPECT_EQ(read_text(out + "/model.safetensors"), "new weights");
  EXPECT_EQ(read_text(out + "/config.json"), "{}");  // not replaced: kept
  EXPECT_EQ(read_text(out + "/notes.txt"), "a user's file");
  EXPECT_EQ(read_text(out + "/checkpoint-2/model.safetensors"), "ck");
  EXPECT_FALSE(fs::exists(out + "/model-00001-of-00002.safetensors"));  // old weights never mix
  EXPECT_EQ(entries(d.file("nested")), 1u);                             // no .tmp- leftovers

  write_text(d.file("plainfile"), "x");
  expect_input_error([&] { StagedDir s(d.file("plainfile")); }, {"not a directory"});
}

TEST(StagedDir, RefusesDirectoriesItDidNotWrite) {
  TempDir d;
  // A project folder, a home directory, a typo'd parent: refused, nothing touched.
  std::string proj = d.file("project");
  fs::create_directories(proj + "/src");
  write_text(proj + "/src/main.cpp", "int main() {}");
  write_text(proj + "/config.json", "{}");
  expect_input_error([&] { StagedDir s(proj); }, {proj + ": ", "holds src", "did not write"});
  expect_input_error([&] { claim_output_dir(proj + "/"); }, {"did not write"});
  expect_input_error([&] { ensure_output_dir(proj); }, {"did not write"});
  EXPECT_EQ(read_text(proj + "/src/main.cpp"), "int main() {}");
  EXPECT_EQ(entries(d.path), 1u);  // no temporary directory was even created
  expect_input_error([&] { check_output_dir("."); }, {"not usable"});
  expect_input_error([&] { check_output_dir("/"); }, {"not usable"});

  // An output of a version without the marker (only files slideformer writes) is recognised.
  std::string old = d.file("old_out");
  fs::create_directories(old + "/checkpoint-5");
  write_text(old + "/model.safetensors", "w");
  write_text(old + "/config.json", "{}");
  write_text(old + "/checkpoint-5/model.safetensors", "w");
  check_output_dir(old);
  write_text(old + "/checkpoint-5/thesis.tex", "x");  // but not with someone else's file inside
  expect_input_error([&] { check_output_dir(old); }, {"holds checkpoint-5"});

  // Empty directories are fine and get the marker.
  std::string empty = d.file("empty");
  fs::create_directories(empty);
  ensure_output_dir(empty);
  EXPECT_TRUE(fs::exists(empty + "/" + kOutputMarker));
}

TEST(StagedDir, NextRunRemovesWhatKilledRunsLeft) {
  TempDir d;
  std::string out = d.file("out");
  ensure_output_dir(out);
  // A staged sibling and a temp file of a process that no longer exists (pid 2^22+1 is above
  // Linux's default pid_max of 2^22), one of a live process (ours), and a stranger's look-alike.
  const std::string dead = ".tmp-4194305-0000beef";
  fs::create_directories(out + dead);
  write_text(out + dead + "/" + kOutputMarker, "");
  write_text(out + "/model.safetensors" + dead, "partial");
  fs::create_directories(out + "/checkpoint-3" + dead);
  const std::string live = ".tmp-" + std::to_string(::getpid()) + "-0000cafe";
  fs::create_directories(out + live);
  write_text(out + live + "/" + kOutputMarker, "");
  fs::create_directories(d.file("out.tmp-4194305-00000001"));  // no marker, not empty: not ours
  write_text(d.file("out.tmp-4194305-00000001/data.csv"), "1,2");
  claim_output_dir(out);
  EXPECT_FALSE(fs::exists(out + dead));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors" + dead));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3" + dead));
  EXPECT_TRUE(fs::exists(out + live));
  EXPECT_TRUE(fs::exists(d.file("out.tmp-4194305-00000001")));

  // An old output moved aside by a publish killed before the new one was in place comes back.
  std::string out2 = d.file("out2");
  ensure_output_dir(out2);
  write_text(out2 + "/model.safetensors", "w");
  fs::rename(out2, out2 + ".old-4194305-0000abcd");
  claim_output_dir(out2);
  EXPECT_EQ(read_text(out2 + "/model.safetensors"), "w");
  EXPECT_FALSE(fs::exists(out2 + ".old-4194305-0000abcd"));
}

TEST(StagedDir, UncommittedLeavesNothingBehind) {
  TempDir d;
  std::string out = d.file("out");
  std::string tmp;
  try {
    StagedDir s(out);
    tmp = s.path();
    std::vector<float> v = ramp(8, 1.0f);
    write_checkpoint_tensors(s.path(), {{"w", DType::F32, {8}, v.data()}});
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(tmp.empty());
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(entries(d.path), 0u);

  // An existing output survives an abandoned re-run intact.
  ensure_output_dir(out);
  write_text(out + "/model.safetensors", "1");
  { StagedDir s(out); }
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_EQ(entries(d.path), 1u);
}

TEST(CheckpointFiles, CopyIfExistsAndJsonFiles) {
  TempDir d;
  std::string src = d.file("src"), dst = d.file("dst");
  fs::create_directories(src);
  fs::create_directories(dst);
  write_text(src + "/config.json", R"({"hidden_size": 8})");
  write_text(src + "/tokenizer.json", "{}");
  write_text(dst + "/tokenizer.json", "old");
  auto copied = copy_if_exists(src, dst, {"config.json", "tokenizer.json", "generation_config.json"});
  EXPECT_EQ(copied, (std::vector<std::string>{"config.json", "tokenizer.json"}));
  EXPECT_FALSE(fs::exists(dst + "/generation_config.json"));
  EXPECT_EQ(read_json_file(dst + "/config.json")["hidden_size"], 8);
  EXPECT_EQ(read_json_file(dst + "/tokenizer.json"), nlohmann::json::object());  // overwritten

  std::string p = d.file("state.json");
  write_json_file(p, nlohmann::json{{"step", 3}, {"lr", 0.5}});
  nlohmann::json j = read_json_file(p);
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["lr"], 0.5);
  // Key order preserved through ordered_json.
  nlohmann::ordered_json oj;
  oj["z"] = 1;
  oj["a"] = 2;
  write_json_file(p, oj);
  EXPECT_EQ(read_ordered_json_file(p).begin().key(), "z");

  std::string missing = d.file("none.json");
  EXPECT_EQ(expect_input_error([&] { read_json_file(missing); }, {}), missing + ": not found");
  std::string bad = d.file("bad.json");
  write_text(bad, "{\"a\": 1,,}");
  expect_input_error([&] { read_json_file(bad); }, {bad + ": invalid JSON at byte 9"});
  expect_input_error([&] { read_json_file(src); }, {src + ": cannot read"});  // a directory
}
