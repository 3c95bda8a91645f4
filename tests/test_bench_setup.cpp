// `bench` reports its set-up (issue 18): setup_s and the seconds of each phase (plan, device, the
// sliding engine's host state and buffers, random weights) in its JSON, the phases adding up to
// setup_s, and one "set-up:" line on stderr; the same seed gives the same first loss either engine.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

class BenchSetup : public test::BinaryTest {
 protected:
  BenchSetup() : BinaryTest("sf_bench_setup_") {}
  std::string config(const std::string& family) {
    std::ofstream(p(family + ".json"), std::ios::binary) << test::tiny_config(family).dump();
    return p(family + ".json");
  }
};

TEST_F(BenchSetup, PhasesInTheJsonAndOnStderr) {
  for (const char* family : {"olmoe", "llama"}) {
    const std::string base = "bench --config " + config(family) +
                             " --device cpu --steps 1 --warmup 0 --batch-size 2 --seq-len 8 --max-grad-norm 0";
    const test::CmdResult slide = run(base + " --offload --gpu-blobs 0 --slots 2");
    ASSERT_EQ(slide.code, 0) << slide.err;
    const nlohmann::json j = slide.last();
    ASSERT_TRUE(j.contains("setup_s")) << j.dump();
    ASSERT_TRUE(j["setup_phases"].is_object()) << j.dump();
    double sum = 0;
    for (const auto& [name, secs] : j["setup_phases"].items()) {
      EXPECT_GE(secs.get<double>(), 0.0) << name;
      sum += secs.get<double>();
    }
    EXPECT_NEAR(sum, j["setup_s"].get<double>(), 1e-9 + 1e-9 * sum);
    for (const char* phase : {"plan", "device", "host masters allocated (page-locked)",
                              "host masters and AdamW m, v zeroed (first touch)", "device buffers, slots, checkpoint store",
                              "random weights"})
      EXPECT_TRUE(j["setup_phases"].contains(phase)) << phase << ": " << j["setup_phases"].dump();
    EXPECT_NE(slide.err.find("set-up: "), std::string::npos) << slide.err;
    EXPECT_NE(slide.err.find(" in all (plan "), std::string::npos) << slide.err;

    // The resident engine times its constructor as one phase; the same weights for the seed.
    const test::CmdResult res = run(base + " --no-offload");
    ASSERT_EQ(res.code, 0) << res.err;
    const nlohmann::json k = res.last();
    EXPECT_TRUE(k["setup_phases"].contains("engine")) << k["setup_phases"].dump();
    EXPECT_TRUE(k["setup_phases"].contains("random weights")) << k["setup_phases"].dump();
    EXPECT_GT(k["setup_s"].get<double>(), 0.0);
    EXPECT_NEAR(k["first_loss"].get<double>(), j["first_loss"].get<double>(), 1e-5) << family;
  }
}

}  // namespace
}  // namespace sf
