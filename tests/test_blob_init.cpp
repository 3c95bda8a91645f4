// engine/blob_init: random_blob draws its chunks on the pool's threads in any order, so its bytes
// must equal those of the one-tensor-after-another loop it replaced (issue 18): a serial twin of
// that generator, written out here, against random_blob on a MoE layer whose experts span several
// chunks, a dense layer, an embedding and a head (norms, biases and padding included). read_blob
// writes only the padding besides the tensors: it reads back what random_blob drew, padding 0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/blob_init.h"
#include "io/checkpoint.h"
#include "model/layout.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

// The generator as documented in blob_init.cpp, serially: padding 0, norms norm_init, biases 0,
// each chunk of 2^20 values of tensor ei of blob b from mt19937_64(seed ^ ... ^ chunk), Box-Muller.
std::vector<float> serial_twin(const BlobLayout& blob, int blob_index, uint64_t seed, double std) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<float> host(size_t(blob.numel), 0.f);
  const uint64_t b = uint64_t(blob_index);
  for (size_t ei = 0; ei < blob.entries.size(); ++ei) {
    const BlobEntry& e = blob.entries[ei];
    float* p = host.data() + e.offset;
    const bool is_norm = e.name.find("norm.weight") != std::string::npos;
    const bool is_bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
    if (is_norm || is_bias) {
      for (int64_t i = 0; i < e.numel; ++i) p[i] = is_norm ? blob.norm_init : 0.f;
      continue;
    }
    for (int64_t c = 0; c * kChunk < e.numel; ++c) {
      std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (b + 1)) ^ (0xC2B2AE3D27D4EB4Full * (ei + 1)) ^
                          (0x165667B19E3779F9ull * uint64_t(c + 1)));
      for (int64_t i = c * kChunk; i < std::min(e.numel, (c + 1) * kChunk); ++i) {
        const double u1 = (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        const double u2 = (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        p[i] = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      }
    }
  }
  return host;
}

void expect_same_bytes(const BlobLayout& blob, int index, uint64_t seed, double std) {
  std::vector<float> got(size_t(blob.numel), 12345.f);  // garbage first: every element must be written
  random_blob(blob, index, seed, std, got.data());
  const std::vector<float> want = serial_twin(blob, index, seed, std);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "blob " << index;
  // and not trivially so: the drawn tensors have about the asked spread
  double sq = 0;
  int64_t drawn = 0;
  for (const BlobEntry& e : blob.entries)
    if (e.name.find("norm.weight") == std::string::npos && e.name.find(".bias") == std::string::npos) {
      for (int64_t i = 0; i < e.numel; ++i) sq += double(got[size_t(e.offset + i)]) * got[size_t(e.offset + i)];
      drawn += e.numel;
    }
  if (drawn > 0) {
    EXPECT_NEAR(std::sqrt(sq / double(drawn)), std, 0.2 * std) << "blob " << index;
  }
}

// OLMoE's layer shape, shrunk: expert matrices of 1.5 * 2^20 values (two chunks of the generator
// each, the second short), q/k norms over the whole projection; one layer.
nlohmann::json multi_chunk_moe_config() {
  nlohmann::json c = test::tiny_config("olmoe");
  c["hidden_size"] = 1024;
  c["intermediate_size"] = 1536;
  c["num_attention_heads"] = 8;
  c["num_key_value_heads"] = 8;
  c["num_experts"] = 3;
  c["num_experts_per_tok"] = 2;
  c["num_hidden_layers"] = 1;
  c["vocab_size"] = 300;
  return c;
}

// Every blob of `lay` drawn by random_blob (seed, std) and written as an fp32 checkpoint `path`;
// returns the drawn values [blobs][numel].
std::vector<std::vector<float>> write_random_checkpoint(const ModelLayout& lay, uint64_t seed, double std,
                                                        const std::string& path) {
  std::vector<std::vector<float>> want;
  std::vector<TensorWrite> tw;
  for (size_t b = 0; b < lay.blobs.size(); ++b) {
    want.emplace_back(size_t(lay.blobs[b].numel));
    random_blob(lay.blobs[b], int(b), seed, std, want.back().data());
  }
  for (size_t b = 0; b < lay.blobs.size(); ++b)
    for (const BlobEntry& e : lay.blobs[b].entries)
      tw.push_back({e.name, DType::F32, e.shape, want[b].data() + e.offset});
  write_checkpoint_tensors(path, tw);
  return want;
}

TEST(BlobInit, MoeLayerWithMultiChunkExpertsMatchesTheSerialGenerator) {
  const nlohmann::json c = multi_chunk_moe_config();
  const ModelSpec s = parse_model_spec(c, "c.json");
  const ModelLayout lay = make_layout(s);
  ASSERT_TRUE(s.moe_layer(0));
  int64_t multi = 0;
  for (const BlobEntry& e : lay.layer(0).entries) multi += e.numel > (int64_t(1) << 20);
  EXPECT_GE(multi, 9);  // gate, up, down of 3 experts
  for (size_t b = 0; b < lay.blobs.size(); ++b) expect_same_bytes(lay.blobs[b], int(b), 7, 0.02);
}

TEST(BlobInit, DenseModelMatchesTheSerialGenerator) {
  // Llama with biases and an untied head, Qwen2 (q/k/v biases), Gemma 3 ((1 + w) norms: norm_init 0).
  for (const char* family : {"llama", "qwen2", "gemma3"}) {
    nlohmann::json c = test::tiny_config(family);
    const ModelSpec s = parse_model_spec(c, "c.json");
    const ModelLayout lay = make_layout(s);
    for (size_t b = 0; b < lay.blobs.size(); ++b) expect_same_bytes(lay.blobs[b], int(b), 99, 0.5);
  }
}

// Gemma 4's MoE block: its three extra norms (post_feedforward_layernorm_1 / _2,
// pre_feedforward_layernorm_2) and the router's scale and per-expert scale start at 1 as in
// transformers' init; the router and expert matrices are drawn.
TEST(BlobInit, Gemma4MoeNormsAndRouterScalesStartAtOne) {
  nlohmann::json c = {{"model_type", "gemma4_text"}, {"vocab_size", 64}, {"hidden_size", 32},
                      {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                      {"num_key_value_heads", 1}, {"head_dim", 16}, {"global_head_dim", 16},
                      {"hidden_size_per_layer_input", 0}, {"enable_moe_block", true}, {"num_experts", 3},
                      {"top_k_experts", 2}, {"moe_intermediate_size", 8}};
  const ModelSpec s = parse_model_spec(c, "c.json");
  const ModelLayout lay = make_layout(s);
  const BlobLayout& blob = lay.layer(0);
  std::vector<float> host(size_t(blob.numel), 12345.f);
  random_blob(blob, 1, 3, 0.1, host.data());
  int ones = 0;
  for (const BlobEntry& e : blob.entries) {
    const bool one = e.shape.size() == 1;  // every 1-D tensor of the layer is a norm or a router scale
    double sq = 0;
    for (int64_t i = 0; i < e.numel; ++i) {
      const float v = host[size_t(e.offset + i)];
      if (one) {
        EXPECT_EQ(v, 1.f) << e.name << " " << i;
      }
      sq += double(v) * v;
    }
    ones += one;
    if (!one) {
      EXPECT_NEAR(std::sqrt(sq / double(e.numel)), 0.1, 0.05) << e.name;
    }
  }
  EXPECT_EQ(ones, 4 + 2 + 3 + 2);  // 4 norms, q/k norms, 3 MoE norms, router.scale and per_expert_scale
}

// Per-expert (olmoe) and llama checkpoints of random_blob's values (fp32) read back into buffers
// full of garbage: the same bytes, padding 0.
TEST(BlobInit, ReadBlobWritesEveryElement) {
  for (const char* family : {"olmoe", "llama", "qwen2"}) {
    SCOPED_TRACE(family);
    const ModelSpec s = parse_model_spec(test::tiny_config(family), "c.json");
    const ModelLayout lay = make_layout(s);
    test::TempDir dir;
    const std::vector<std::vector<float>> want = write_random_checkpoint(lay, 5, 0.1, dir.file("m"));
    const CheckpointReader r = CheckpointReader::open(dir.file("m"));
    for (size_t b = 0; b < lay.blobs.size(); ++b) {
      std::vector<float> got(want[b].size(), -7.f);
      read_blob(r, lay.blobs[b], got.data());
      EXPECT_EQ(std::memcmp(got.data(), want[b].data(), got.size() * 4), 0) << "blob " << b;
    }
  }
}

// The windowed fills (what the sliding engine's set-up runs, a window at a time) give the whole
// blob's bytes: windows of odd sizes that cut entries, padding and the generator's 2^20-value
// chunks, each into a buffer of garbage; and out-of-range windows refused.
TEST(BlobInit, WindowsGiveTheWholeBlobsBytes) {
  const nlohmann::json c = multi_chunk_moe_config();
  for (const nlohmann::json& cfg : {c, test::tiny_config("qwen2")}) {
    const ModelSpec s = parse_model_spec(cfg, "c.json");
    const ModelLayout lay = make_layout(s);
    test::TempDir dir;
    const std::vector<std::vector<float>> want = write_random_checkpoint(lay, 11, 0.3, dir.file("m"));
    const CheckpointReader r = CheckpointReader::open(dir.file("m"));
    for (size_t b = 0; b < lay.blobs.size(); ++b) {
      const BlobLayout& bl = lay.blobs[b];
      // windows across the generator's chunks (the MoE layer's tensors span several), and small odd
      // ones on the small blobs (a window regenerates the chunks it meets from their start)
      for (int64_t win : {int64_t(1), int64_t(7), int64_t(1013), int64_t(999983), (int64_t(1) << 20) + 3, bl.numel}) {
        if (win < 999983 && bl.numel > 200000) continue;
        std::vector<float> got(size_t(bl.numel), 12345.f), read(size_t(bl.numel), -7.f);
        for (int64_t w0 = 0; w0 < bl.numel; w0 += win) {
          const int64_t w1 = std::min(bl.numel, w0 + win);
          random_blob_window(bl, int(b), 11, 0.3, w0, w1, got.data() + w0);
          read_blob_window(r, bl, w0, w1, read.data() + w0);
        }
        EXPECT_EQ(std::memcmp(got.data(), want[b].data(), got.size() * 4), 0) << "blob " << b << " window " << win;
        EXPECT_EQ(std::memcmp(read.data(), want[b].data(), read.size() * 4), 0) << "blob " << b << " window " << win;
      }
    }
    std::vector<float> x(4);
    EXPECT_THROW(random_blob_window(lay.blobs[0], 0, 1, 0.1, lay.blobs[0].numel - 1, lay.blobs[0].numel + 1, x.data()),
                 std::runtime_error);
    EXPECT_THROW(read_blob_window(r, lay.blobs[0], 2, 1, x.data()), std::runtime_error);
  }
}

}  // namespace
}  // namespace sf
