// HF checkpoint directories: single/sharded round trips with conversion, index errors, staged output
// directories, JSON file helpers.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/manifest.h"
#include "io/output_lock.h"
#include "io/written_paths.h"
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
    EXPECT_NE(s.path().find("out.sf-tmp-"), std::string::npos);
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

  // A directory of model files without the marker (save_pretrained's, a downloaded model) is not
  // ours, however much it looks like an output: guessing from file names once deleted a model.
  std::string hf = d.file("Llama-3.2-1B");
  fs::create_directories(hf);
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json", "special_tokens_map.json",
                        "tokenizer.json", "tokenizer_config.json"})
    write_text(hf + "/" + f, "w");
  expect_input_error([&] { check_output_dir(hf); }, {hf + ": exists and holds", "no .slideformer-output marker"});
  expect_input_error([&] { claim_output_dir(hf); }, {"did not write"});
  expect_input_error([&] { StagedDir s(hf); }, {"did not write"});
  EXPECT_EQ(entries(hf), 6u);
  EXPECT_EQ(read_text(hf + "/model.safetensors"), "w");
  // A link named like the marker does not make a directory ours.
  std::string linked = d.file("linked");
  fs::create_directories(linked);
  write_text(d.file("elsewhere"), "");
  fs::create_symlink(d.file("elsewhere"), linked + "/" + kOutputMarker);
  expect_input_error([&] { check_output_dir(linked); }, {"did not write"});

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
  const std::string dead = ".sf-tmp-4194305-0000beef";
  fs::create_directories(out + dead);
  write_text(out + dead + "/" + kOutputMarker, "");
  write_text(out + "/model.safetensors" + dead, "partial");
  fs::create_directories(out + "/checkpoint-3" + dead);
  // A removal a kill interrupted: the marker already gone, files left; and a trash directory.
  fs::create_directories(out + ".sf-tmp-4194305-00000002/checkpoint-1");
  write_text(out + ".sf-tmp-4194305-00000002/checkpoint-1/model.safetensors", "half removed");
  fs::create_directories(out + ".sf-trash-4194305-00000003/x");
  fs::create_directories(out + "/checkpoint-2.sf-trash-4194305-00000004");
  const std::string live = ".sf-tmp-" + std::to_string(::getpid()) + "-0000cafe";
  fs::create_directories(out + live);
  write_text(out + live + "/" + kOutputMarker, "");
  fs::create_directories(d.file("out.tmp-4194305-00000001"));  // an old-style name: never ours
  write_text(d.file("out.tmp-4194305-00000001/data.csv"), "1,2");
  // A user's files whose names look like temporaries of older versions are never removed.
  write_text(out + "/notes.tmp-1-abc", "mine");
  write_text(out + "/draft.tmp-4194305-0000beef", "mine too");
  write_text(d.file("other.sf-tmp-4194305-0000beef"), "another output's, not this one's");
  claim_output_dir(out);
  EXPECT_FALSE(fs::exists(out + dead));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors" + dead));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3" + dead));
  EXPECT_FALSE(fs::exists(out + ".sf-tmp-4194305-00000002"));
  EXPECT_FALSE(fs::exists(out + ".sf-trash-4194305-00000003"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-2.sf-trash-4194305-00000004"));
  EXPECT_TRUE(fs::exists(out + live));
  EXPECT_TRUE(fs::exists(d.file("out.tmp-4194305-00000001/data.csv")));
  EXPECT_EQ(read_text(out + "/notes.tmp-1-abc"), "mine");
  EXPECT_EQ(read_text(out + "/draft.tmp-4194305-0000beef"), "mine too");
  EXPECT_TRUE(fs::exists(d.file("other.sf-tmp-4194305-0000beef")));
  // A commit neither removes nor carries another process's temporaries, and keeps the user's files.
  {
    StagedDir s(out);
    write_text(s.path() + "/model.safetensors", "new");
    s.commit();
  }
  EXPECT_EQ(read_text(out + "/notes.tmp-1-abc"), "mine");
  EXPECT_EQ(read_text(out + "/model.safetensors"), "new");

  // An old output moved aside by a publish killed before the new one was in place comes back.
  std::string out2 = d.file("out2");
  ensure_output_dir(out2);
  write_text(out2 + "/model.safetensors", "w");
  fs::rename(out2, out2 + ".sf-old-4194305-0000abcd");
  claim_output_dir(out2);
  EXPECT_EQ(read_text(out2 + "/model.safetensors"), "w");
  EXPECT_FALSE(fs::exists(out2 + ".sf-old-4194305-0000abcd"));
}

TEST(StagedDir, MarkedTempNamesParseOnlyTheirOwnShape) {
  std::string base;
  long pid = 0;
  EXPECT_TRUE(parse_marked_temp("out.sf-tmp-123-0000abcd", kTempKindTmp, &base, &pid));
  EXPECT_EQ(base, "out");
  EXPECT_EQ(pid, 123);
  EXPECT_TRUE(parse_marked_temp("a.b.sf-trash-9-ffffffff", kTempKindTrash, &base));
  EXPECT_EQ(base, "a.b");
  for (const char* n : {"notes.tmp-1-abc", "out.tmp-123-0000abcd", "out.sf-tmp-123-0000ABCD", "out.sf-tmp--0000abcd",
                        "out.sf-tmp-12a-0000abcd", "out.sf-tmp-123-000abcd", ".sf-tmp", "out.sf-old-1-0000abcd"})
    EXPECT_FALSE(parse_marked_temp(n, kTempKindTmp)) << n;
  EXPECT_EQ(unmarked_name("out.sf-tmp-1-0000abcd.sf-trash-2-0000abcd"), "out");
  const std::string m = marked_temp_name("x", kTempKindTmp);
  EXPECT_TRUE(parse_marked_temp(m, kTempKindTmp, &base, &pid)) << m;
  EXPECT_EQ(pid, long(::getpid()));
  EXPECT_FALSE(process_gone(::getpid()));
  EXPECT_TRUE(process_gone(4194305));
}

// The removal of a directory goes through a marked trash name: a kill at any of its crash points
// leaves the tree whole under its name or a trash name the next claim removes.
TEST(StagedDir, RemovalIsKillSafe) {
  TempDir d;
  std::string out = d.file("out");
  for (int k = 1;; ++k) {
    fs::remove_all(out);
    ensure_output_dir(out);
    fs::create_directories(out + "/a/b");
    write_text(out + "/a/b/f", "x");
    write_text(out + "/a/g", "y");
    std::string victim = out + "/checkpoint-1.sf-tmp-4194305-00000001";
    fs::rename(out + "/a", victim);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      set_crash_point_for_test(k);
      remove_marked_tree(victim);
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    const bool killed = WIFSIGNALED(status);
    claim_output_dir(out);
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(out)) left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    EXPECT_EQ(left, (std::vector<std::string>{kManifestName, kOutputMarker})) << "k=" << k;
    if (!killed) {
      EXPECT_GT(k, 3);  // rename to trash, 2 directories (a part-removed tree before each rmdir)
      break;
    }
    ASSERT_LT(k, 20);
  }
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

// The manifest covers every file of a committed output: a changed byte, size or a missing file
// is refused naming the file; a directory without one is reported as such.
TEST(Manifest, CommitWritesItAndVerifyRefusesAnyChange) {
  TempDir d;
  const std::string out = d.file("out");
  std::vector<float> v = ramp(8, 1.0f);
  {
    StagedDir s(out);
    write_checkpoint_tensors(s.path(), {{"w", DType::F32, {8}, v.data()}});
    write_text(s.path() + "/trainer_state.json", "{\"step\": 2}\n");
    s.commit();
  }
  ASSERT_TRUE(fs::exists(out + "/" + kManifestName));
  EXPECT_TRUE(verify_manifest(out, {"trainer_state.json"}));
  expect_input_error([&] { verify_manifest(out, {"training_state.safetensors"}); }, {"does not list training_state"});
  write_text(out + "/trainer_state.json", "{\"step\": 3}\n");  // same size, one byte changed
  expect_input_error([&] { verify_manifest(out); }, {out + "/trainer_state.json: CRC-32C", "does not match"});
  write_text(out + "/trainer_state.json", "{\"step\": 2}\n");
  EXPECT_TRUE(verify_manifest(out));
  // A safetensors header is covered; its data by the tensors' own checksums.
  std::string raw = read_text(out + "/model.safetensors");
  raw[20] ^= 1;
  write_text(out + "/model.safetensors", raw);
  expect_input_error([&] { verify_manifest(out); }, {out + "/model.safetensors: header CRC-32C"});
  fs::remove(out + "/model.safetensors");
  expect_input_error([&] { verify_manifest(out); }, {out + "/model.safetensors: missing"});
  fs::remove(out + "/" + kManifestName);
  EXPECT_FALSE(verify_manifest(out));
}

TEST(WrittenPaths, SpellingsLinksAndHardLinksOfAnInputAreRefused) {
  TempDir d;
  const std::string model = d.file("m"), data = d.file("d.jsonl");
  fs::create_directories(model);
  write_text(data, "x");
  fs::create_directory_symlink(model, d.file("link"));
  fs::create_hard_link(data, d.file("hard.jsonl"));
  const std::vector<NamedPath> inputs = {{"--model", model}, {"--data", data}, {"--resume", ""}};
  for (const std::string& w : {model, model + "/", model + "/./", d.file("x/../m"), d.file("link"), d.file("link/sub")})
    expect_input_error([&] { check_written_apart({"--output", w}, inputs); }, {"--output", "--model input"});
  expect_input_error([&] { check_written_apart({"--output", d.path.string()}, inputs); }, {"holds the --model input"});
  expect_input_error([&] { check_written_apart({"--metrics", d.file("hard.jsonl")}, inputs); }, {"is the --data input"});
  check_written_apart({"--output", d.file("out")}, inputs);
  check_written_apart({"--output", d.file("m2")}, inputs);  // a name that starts like an input is not in it
  EXPECT_TRUE(path_within("/a/b", "/a"));
  EXPECT_FALSE(path_within("/a/bc", "/a/b"));
  EXPECT_EQ(resolved_path(d.file("link") + "/"), resolved_path(model));
}

TEST(OutputLock, ASecondHolderIsRefusedWithThePid) {
  TempDir d;
  const std::string out = d.file("out");
  {
    OutputLock a(out);
    EXPECT_TRUE(fs::exists(out + ".sf-lock"));
    EXPECT_EQ(read_text(out + ".sf-lock"), std::to_string(::getpid()) + "\n");
    expect_input_error([&] { OutputLock b(out + "/"); }, {"in use by another slideformer run (pid " +
                                                          std::to_string(::getpid())});
    expect_input_error([&] { OutputLock b(d.file("x/../out")); }, {"in use"});
  }
  EXPECT_FALSE(fs::exists(out + ".sf-lock"));
  OutputLock again(out);  // released
  write_text(d.file("file"), "x");
  expect_input_error([&] { OutputLock c(d.file("file")); }, {"not a directory"});
  EXPECT_FALSE(fs::exists(d.file("file.sf-lock")));
}

TEST(JsonText, NulAndOutOfRangeNumbersAreRefused) {
  auto parse = [](const std::string& t) { return parse_json_text("f.json", t.data(), t.data() + t.size()); };
  expect_input_error([&] { parse(std::string("{\"a\": 1}\0garbage", 16)); }, {"f.json: invalid JSON at byte 8", "NUL"});
  expect_input_error([&] { parse("[1e999]"); }, {"number 1e999", "number overflow"});
  expect_input_error([&] { parse("[-1e-400]"); }, {"number -1e-400", "underflow"});
  expect_input_error([&] { parse("{\"a\": 1} x"); }, {"f.json: invalid JSON"});
  EXPECT_EQ(parse("[0e-400, 1e-300, \"1e999\", true, false, 2.5E3]"),
            nlohmann::json::parse("[0, 1e-300, \"1e999\", true, false, 2500]"));
  EXPECT_EQ(parse("[1, 2, 3]"), nlohmann::json::parse("[1, 2, 3]"));  // the fast path (no exponent)
}
