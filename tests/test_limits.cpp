// Limits tied to the plan (issue 9): a step's grad-accum, batch size and seq-len are refused up front
// (exit 2, one line naming the option, what was asked and what fits) when the plan cannot hold them;
// init checks the model's size before allocating; tokenize reads JSONL with training's line limit.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using test::CmdResult;

class Limits : public test::BinaryTest {
 protected:
  Limits() : BinaryTest("sf_limits_") {}
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(p(name), std::ios::binary) << text;
    return p(name);
  }
  std::string model() {
    write("m.json", test::tiny_config("llama").dump());
    const CmdResult r = run("init --config " + p("m.json") + " --output " + p("m") + " --seed 3");
    EXPECT_EQ(r.code, 0) << r.err;
    return p("m");
  }
  // Records of 20 tokens (every step is cut to --seq-len 16).
  std::string data(int n = 8) {
    std::string text;
    for (int i = 0; i < n; ++i) {
      nlohmann::json ids = nlohmann::json::array();
      for (int t = 0; t < 20; ++t) ids.push_back((i + t) % 37);
      text += nlohmann::json{{"input_ids", ids}}.dump() + "\n";
    }
    return write("d.jsonl", text);
  }
  // Exit 2 with one stderr line holding every needle.
  void expect_refused(const CmdResult& r, const std::vector<std::string>& needles) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "'" << n << "' not in: " << r.err;
  }
  // The N of "at most OPTION N fits" in a refusal.
  static int64_t at_most(const std::string& err, const std::string& option) {
    std::smatch m;
    if (!std::regex_search(err, m, std::regex("at most " + option + " ([0-9]+) fits"))) return -1;
    return std::stoll(m[1]);
  }
  // The host bytes the plan of this model needs for batch x 16 tokens (engine alone).
  size_t engine_host_bytes(const std::string& m, int batch) {
    const CmdResult r = run("plan --model " + m + " --device cpu --seq-len 16 --batch-size " + std::to_string(batch));
    EXPECT_EQ(r.code, 0) << r.err;
    return r.last()["host_bytes"].get<size_t>();
  }
};

TEST_F(Limits, GradAccumIsBoundedByThePlanNotAConstant) {
  const std::string m = model(), d = data();
  // A host budget a little above what the engine itself needs: the step's token buffers decide.
  const size_t budget = engine_host_bytes(m, 2) + 256 * 1024;
  const std::string train = "train --model " + m + " --data " + d + " --output " + p("out") +
                            " --steps 1 --lr 1e-3 --device cpu --no-offload --seq-len 16 --batch-size 2";
  const std::string base = train + " --cpu-memory " + std::to_string(budget) + " --grad-accum ";
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult r = run(base + "100000000");
  // Refused before anything is allocated (fast), naming the option, the request and what fits.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  expect_refused(r, {"--grad-accum: 100000000", "100000000 x 2 x 16 tokens", "available (--cpu-memory)"});
  const int64_t k = at_most(r.err, "--grad-accum");
  ASSERT_GT(k, 1) << r.err;
  EXPECT_LT(k, 1000) << r.err;  // 256 KiB over the engine: tens of micro-batches of 2 x 16
  EXPECT_FALSE(fs::exists(p("out")));
  // The bound is the plan's: one more is refused with the same answer, the bound itself trains.
  r = run(base + std::to_string(k + 1));
  expect_refused(r, {"--grad-accum: " + std::to_string(k + 1)});
  EXPECT_EQ(at_most(r.err, "--grad-accum"), k);
  r = run(base + std::to_string(k));
  EXPECT_EQ(r.code, 0) << r.err;
  // A larger budget holds more: the bound follows it.
  r = run(train + " --cpu-memory " + std::to_string(budget + 1024 * 1024) + " --grad-accum 100000000");
  expect_refused(r, {"--grad-accum: 100000000"});
  EXPECT_GT(at_most(r.err, "--grad-accum"), 3 * k);  // 5x the room over the engine's fixed part
}

TEST_F(Limits, BenchBatchAndSeqLenAreBoundedByThePlan) {
  write("c.json", test::tiny_config("llama").dump());
  const std::string base = "bench --config " + p("c.json") + " --device cpu --no-offload --steps 1 --warmup 0";
  const size_t budget = 64u << 20;
  CmdResult r = run(base + " --seq-len 16 --batch-size 60000 --cpu-memory " + std::to_string(budget));
  expect_refused(r, {"--batch-size: 60000", "at most --batch-size"});
  const int64_t b = at_most(r.err, "--batch-size");
  EXPECT_GT(b, 1);
  EXPECT_LT(b, 60000);
  r = run(base + " --batch-size 1 --seq-len 4000000 --cpu-memory " + std::to_string(budget));
  expect_refused(r, {"--seq-len: 4000000", "at most --seq-len"});
  const int64_t t = at_most(r.err, "--seq-len");
  EXPECT_GT(t, 16);
  EXPECT_LT(t, 4000000);
  // Beyond the outer bounds that stay fixed (no model has a context of 2^22 tokens).
  expect_refused(run(base + " --seq-len 100000000"), {"--seq-len: 100000000 is out of range"});
}

TEST_F(Limits, InitChecksTheModelSizeBeforeAllocating) {
  nlohmann::json c = test::tiny_config("llama");
  c["hidden_size"] = 16384;
  c["intermediate_size"] = 65536;
  c["num_hidden_layers"] = 200;
  c["num_attention_heads"] = 128;
  c["num_key_value_heads"] = 8;
  c["vocab_size"] = 128256;
  write("huge.json", c.dump());
  const auto t0 = std::chrono::steady_clock::now();
  const CmdResult r = run("init --config " + p("huge.json") + " --output " + p("huge"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  // ~0.9T parameters: 3.5 TB of fp32 weights, beyond this machine's memory (or disk).
  expect_refused(r, {"parameters", "needs", "available"});
  EXPECT_FALSE(fs::exists(p("huge")));
}

TEST_F(Limits, TokenizeReadsJsonlWithTheTrainingLineLimit) {
  const std::string tok = std::string(SF_SOURCE_DIR) + "/tests/data/tokenizer/llama3.json";
  const std::string rec = "{\"text\": \"" + std::string(3000, 'a') + "\"}\n";
  const std::string f = write("t.jsonl", "{\"text\": \"hi\"}\n" + rec);
  CmdResult r = run("tokenize --tokenizer " + tok + " --jsonl " + f + " --max-record-bytes 1KiB");
  expect_refused(r, {"t.jsonl:2", "--max-record-bytes"});
  r = run("tokenize --tokenizer " + tok + " --jsonl " + f + " --max-record-bytes 4KiB");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2);
  // The default limit (64 MiB) holds for tokenize as for train: a file without a newline past it is
  // refused without reading it whole (/dev/zero never ends).
  r = run("tokenize --tokenizer " + tok + " --jsonl /dev/zero --max-record-bytes 1MiB");
  expect_refused(r, {"/dev/zero:1", "1048576"});
}

}  // namespace
}  // namespace sf
