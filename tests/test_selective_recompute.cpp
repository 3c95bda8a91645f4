// Selective recompute (KeptActs, EngineOptions::kept_layers): a layer that keeps its attention
// output and statistics from the forward skips attention in its recompute, and the backward gives
// the same bits as after a whole recompute — in the layer program for every family, and in the
// resident engine's gradients and training steps (f32 and bf16 compute). The planner's side is in
// tests/test_planner.cpp (SelectiveRecompute*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/blob_init.h"
#include "engine/resident_engine.h"
#include "engine_state.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "record_fixtures.h"
#include "rope_fixture.h"
#include "test_util.h"

namespace sf {
namespace {

const std::string kFamilies[] = {"llama", "qwen2", "qwen3", "gemma3", "qwen3_moe", "mixtral"};

class SelectiveRecompute : public ::testing::TestWithParam<std::string> {};

// The layer program: forward with kept, another input through the workspace, recompute with kept,
// backward with kept == forward, recompute, backward without (input gradient and every parameter
// gradient, bit for bit); and the recompute with kept does not run attention.
TEST_P(SelectiveRecompute, LayerBackwardBitsUnchanged) {
  const ModelSpec s = parse_model_spec(test::tiny_config(GetParam()), "tiny");
  const ModelLayout lay = make_layout(s);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);
  const test::HostRope host_rope(s, T);
  const RopeTables& rope = host_rope.views;
  BatchDims d{B, T, {}};
  const LayerBuffers w = ws.layer(d);
  for (const int layer : {0, s.n_layer - 1}) {  // Gemma: a local and a global layer; MoE: qwen3_moe's dense/moe
    SCOPED_TRACE(GetParam() + " layer " + std::to_string(layer));
    const BlobLayout& blob = lay.layer(layer);
    std::vector<float> params(size_t(blob.numel));
    random_blob(blob, 1 + layer, 31, 0.3, params.data());
    const LayerParams p = layer_views(blob, params.data(), DType::F32);
    std::vector<float> x = test::randn(size_t(N * H), 5), dy = test::randn(size_t(N * H), 6),
                       other = test::randn(size_t(N * H), 9);
    std::vector<float> y(size_t(N * H)), y_other(size_t(N * H)), scratch(size_t(N * H));
    std::vector<float> att(size_t(N * s.q_dim()), NAN), lse(size_t(N * s.n_head), NAN);
    const KeptActs kept{test::view_of(att, {N, s.q_dim()}), test::view_of(lse, {N * s.n_head})};
    auto v = [&](std::vector<float>& a) { return test::view_of(a, {N, H}); };

    auto backward = [&](const KeptActs& k) {
      std::vector<float> grads(size_t(blob.numel), 0.f), dx(size_t(N * H));
      prog.layer_backward(p, layer_views(blob, grads.data(), DType::F32), v(x), v(dy), v(dx), w, d, rope, *st, k);
      dev->synchronize(*st);
      grads.insert(grads.end(), dx.begin(), dx.end());
      return grads;
    };
    // Whole recompute (today's path).
    prog.layer_forward(p, v(x), v(y), w, d, rope, *st);
    prog.layer_forward(p, v(other), v(y_other), w, d, rope, *st);
    prog.layer_recompute(p, v(x), v(scratch), w, d, rope, *st);
    const auto whole = backward({});

    // Kept: the forward fills att and lse and gives the same output.
    std::vector<float> y_kept(size_t(N * H));
    prog.layer_forward(p, v(x), v(y_kept), w, d, rope, *st, kept);
    dev->synchronize(*st);
    EXPECT_EQ(0, std::memcmp(y.data(), y_kept.data(), y.size() * 4)) << "the forward's output changed";
    for (float a : att) ASSERT_FALSE(std::isnan(a)) << "the forward did not fill the kept attention output";
    for (float a : lse) ASSERT_FALSE(std::isnan(a)) << "the forward did not fill the kept statistics";
    prog.layer_forward(p, v(other), v(y_other), w, d, rope, *st);  // the workspace now holds another input's

    // The recompute with kept leaves att alone: a marked value survives it (attention not rerun).
    const std::vector<float> att0 = att, lse0 = lse;
    att[3] = 1234.5f;
    lse[1] = -777.f;
    prog.layer_recompute(p, v(x), v(scratch), w, d, rope, *st, kept);
    dev->synchronize(*st);
    EXPECT_EQ(att[3], 1234.5f) << "the recompute ran attention again";
    EXPECT_EQ(lse[1], -777.f) << "the recompute ran attention again";
    att = att0;
    lse = lse0;

    prog.layer_forward(p, v(other), v(y_other), w, d, rope, *st);  // and once more, through the workspace
    prog.layer_recompute(p, v(x), v(scratch), w, d, rope, *st, kept);
    const auto with_kept = backward(kept);
    ASSERT_EQ(whole.size(), with_kept.size());
    EXPECT_EQ(0, std::memcmp(whole.data(), with_kept.data(), whole.size() * 4))
        << "the backward after a recompute that skips attention differs";
    double norm = 0;
    for (float g : whole) norm += double(g) * g;
    EXPECT_GT(norm, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, SelectiveRecompute, ::testing::ValuesIn(kFamilies),
                         [](const auto& i) { return i.param; });

struct Trained {
  double grad_loss = 0;
  test::NamedTensors grads;
  std::vector<double> losses, norms;
  test::NamedTensors params;
};

// Gradients of two micro-batches, then 3 steps of 2 micro-batches (batches of different lengths:
// the kept buffers are viewed at each batch's shape).
Trained run(const ModelSpec& spec, bool bf16, int whole_layers, int kept_layers) {
  auto dev = make_cpu_device();
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 12;
  eo.max_micro = 2;
  eo.whole_layers = whole_layers;
  eo.kept_layers = kept_layers;
  if (bf16) eo.compute_dtype = "bf16";
  ResidentEngine e(*dev, spec, eo);
  e.init_random(17);
  const std::vector<Record> recs = test::random_records(spec.vocab, 3, 12);
  auto micro = [&](size_t i) {
    return std::vector<Batch>{make_batch({&recs[i % 12], &recs[(i + 1) % 12]}, 11),
                              make_batch({&recs[(i + 2) % 12], &recs[(i + 3) % 12]}, 11)};
  };
  Trained r;
  r.grad_loss = e.compute_grads(micro(0));
  r.grads = test::export_grads(e);
  for (int s = 1; s <= 3; ++s) {
    Engine::StepParams p;
    p.adamw.lr = 1e-2f;
    p.adamw.step = s;
    p.max_grad_norm = 1.0;
    const Engine::StepResult res = e.step(micro(size_t(4 * s)), p);
    EXPECT_TRUE(res.updated);
    r.losses.push_back(res.loss);
    r.norms.push_back(res.grad_norm);
  }
  r.params = test::export_params(e);
  return r;
}

void expect_same_bits(const test::NamedTensors& a, const test::NamedTensors& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].data.size(), b[i].data.size());
    EXPECT_EQ(0, std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * 4)) << what << " " << a[i].name;
  }
}

TEST_P(SelectiveRecompute, ResidentEngineBitsUnchanged) {
  const ModelSpec spec = parse_model_spec(test::tiny_config(GetParam()), "tiny");
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(GetParam() + (bf16 ? " bf16" : " f32"));
    const Trained base = run(spec, bf16, 0, 0);
    const int L = spec.n_layer;
    for (auto [whole, kept] :
         {std::pair{0, 1}, std::pair{0, L}, std::pair{1, 0}, std::pair{L, 0}, std::pair{1, L - 1}}) {
      SCOPED_TRACE("whole " + std::to_string(whole) + " kept " + std::to_string(kept));
      const Trained k = run(spec, bf16, whole, kept);
      EXPECT_EQ(base.grad_loss, k.grad_loss);
      expect_same_bits(base.grads, k.grads, "gradient");
      EXPECT_EQ(base.losses, k.losses);
      EXPECT_EQ(base.norms, k.norms);
      expect_same_bits(base.params, k.params, "parameter");
    }
  }
}

}  // namespace
}  // namespace sf
