// Selective recompute (KeptActs, EngineOptions::kept_layers): a layer that keeps its attention
// output and statistics from the forward skips attention in its recompute, and the backward gives
// the same bits as after a whole recompute — in the layer program for every family, and in the
// resident engine's gradients and training steps (f32 and bf16 compute). The planner keeps as many
// layers as the GPU budget has room for, counts their buffers and the FLOPs they save.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/blob_init.h"
#include "engine/planner.h"
#include "engine/resident_engine.h"
#include "engine_state.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/rope.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

const std::string kFamilies[] = {"llama", "qwen2", "qwen3", "gemma3", "qwen3_moe", "mixtral"};

class KeptAttention : public ::testing::TestWithParam<std::string> {};

// The layer program: forward with kept, another input through the workspace, recompute with kept,
// backward with kept == forward, recompute, backward without (input gradient and every parameter
// gradient, bit for bit); and the recompute with kept does not run attention.
TEST_P(KeptAttention, LayerBackwardBitsUnchanged) {
  const ModelSpec s = parse_model_spec(test::tiny_config(GetParam()), "tiny");
  const ModelLayout lay = make_layout(s);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);
  std::vector<float> cos, sin, cos_l, sin_l;
  rope_tables(s, T, cos, sin);
  RopeTables rope{test::view_of(cos, {T, s.head_dim / 2}), test::view_of(sin, {T, s.head_dim / 2}), {}, {}};
  if (s.has_local_rope()) {
    rope_tables_local(s, T, cos_l, sin_l);
    rope.cos_local = test::view_of(cos_l, {T, s.head_dim / 2});
    rope.sin_local = test::view_of(sin_l, {T, s.head_dim / 2});
  }
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

INSTANTIATE_TEST_SUITE_P(Families, KeptAttention, ::testing::ValuesIn(kFamilies), [](const auto& i) { return i.param; });

std::vector<Record> records(int vocab, uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<Record> recs;
  for (int i = 0; i < n; ++i) {
    Record r;
    const int len = 3 + int(rng() % 9);
    for (int t = 0; t < len; ++t) r.ids.push_back(int32_t(rng() % uint64_t(vocab)));
    r.labels = r.ids;
    if (i % 3 == 1) r.labels[1] = kIgnoreIndex;
    recs.push_back(r);
  }
  return recs;
}

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
  const std::vector<Record> recs = records(spec.vocab, 3, 12);
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

TEST_P(KeptAttention, ResidentEngineBitsUnchanged) {
  const ModelSpec spec = parse_model_spec(test::tiny_config(GetParam()), "tiny");
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(GetParam() + (bf16 ? " bf16" : " f32"));
    const Trained base = run(spec, bf16, 0, 0);
    const int L = spec.n_layer;
    for (auto [whole, kept] : {std::pair{0, 1}, std::pair{0, L}, std::pair{1, 0}, std::pair{L, 0}, std::pair{1, L - 1}}) {
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

// Llama-3.2-3B's shapes (28 layers, hidden 3072, 24 heads, 8 KV heads).
ModelSpec llama_3b() {
  nlohmann::json cfg = test::tiny_config("llama");
  cfg["hidden_size"] = 3072;
  cfg["intermediate_size"] = 8192;
  cfg["num_hidden_layers"] = 28;
  cfg["num_attention_heads"] = 24;
  cfg["num_key_value_heads"] = 8;
  cfg["vocab_size"] = 128256;
  cfg["max_position_embeddings"] = 4096;
  cfg["tie_word_embeddings"] = true;
  cfg["attention_bias"] = false;
  return parse_model_spec(cfg, "llama");
}

BackendInfo gpu_like() {  // a GPU backend without needing one (planner tests' stand-in)
  BackendInfo be = backend_info("cpu");
  be.kind = DeviceKind::Cuda;
  be.compute_dtype = DType::BF16;
  return be;
}

size_t device_bytes_named(const Plan& p, const std::string& name) {
  size_t n = 0;
  for (const MemoryItem& m : p.items)
    if (m.place == Place::Device && m.name == name) n += m.bytes * m.count;
  return n;
}

const char* const kKeptName = "kept attention outputs (selective recompute)";
const char* const kWholeName = "layer activations kept whole (selective recompute)";

// The planner keeps as many layers as the budget has room for beside the margin, counts them in the
// engine's list, and takes their attention forward off the predicted FLOPs.
TEST(SelectiveRecomputePlan, KeepsWhatTheGpuBudgetAllows) {
  const ModelSpec s = llama_3b();
  const BackendInfo be = gpu_like();
  PlanRequest r;
  r.batch = 8;
  r.seq = 2048;
  r.offload = OffloadChoice::Off;
  r.host_budget = size_t(64) << 30;
  const size_t per = ResidentEngine::kept_layer_bytes(s, 8, 2048, DType::BF16);
  // [8 x 2048, 3072] bf16 + [8 x 2048 x 24] F32: 96 MiB + 1.5 MiB a layer.
  EXPECT_EQ(per, size_t(8 * 2048) * 3072 * 2 + size_t(8 * 2048) * 24 * 4);

  r.whole_layers = 0;
  r.kept_layers = 0;
  r.gpu_budget = size_t(140) << 30;
  const Plan none = make_plan(s, r, be);
  ASSERT_TRUE(none.fits);
  EXPECT_EQ(none.kept_layers, 0);
  EXPECT_EQ(device_bytes_named(none, kKeptName), 0u);

  r.whole_layers = 0;
  r.kept_layers = -1;  // the planner's choice: all 28 on 140 GiB
  const Plan all = make_plan(s, r, be);
  ASSERT_TRUE(all.fits);
  EXPECT_EQ(all.kept_layers, 28);
  EXPECT_EQ(device_bytes_named(all, kKeptName), 28 * per);
  EXPECT_EQ(all.gpu_bytes, none.gpu_bytes + 28 * per);
  const double tokens = 8.0 * 2048;
  // 2 x T x q_dim a token a causal layer (T/2 keys a query, as the planner counts them): 28 x 2 x 2048 x 3072.
  EXPECT_DOUBLE_EQ(recompute_flops_saved_per_token(s, 2048, 0, 28), 28 * 2.0 * 2048 * 3072);
  EXPECT_DOUBLE_EQ(none.flops - all.flops, recompute_flops_saved_per_token(s, 2048, 0, 28) * tokens);
  EXPECT_LT(all.step_s, none.step_s);

  // A budget with room for some layers beside the margin (max(256 MiB, 1 % of the budget)).
  const size_t budget = none.gpu_bytes + none.gpu_bytes / 50 + 5 * per + per / 2;
  r.gpu_budget = budget;
  const Plan some = make_plan(s, r, be);
  ASSERT_TRUE(some.fits);
  const size_t margin = std::max(size_t(256) << 20, budget / 100);
  EXPECT_EQ(size_t(some.kept_layers), (budget - none.gpu_bytes - margin) / per);
  EXPECT_GE(some.kept_layers, 5);
  EXPECT_LT(some.kept_layers, 28);
  EXPECT_LE(some.gpu_bytes + margin, budget);
  EXPECT_GT(some.gpu_bytes + margin + per, budget);  // one more would not fit
  EXPECT_EQ(device_bytes_named(some, kKeptName), size_t(some.kept_layers) * per);

  // Both the planner's: on 140 GiB every layer kept whole (no recompute at all): the recompute's
  // matrix products (without the down projection) and attention.
  r.whole_layers = -1;
  r.kept_layers = -1;
  r.gpu_budget = size_t(140) << 30;
  const Plan full = make_plan(s, r, be);
  ASSERT_TRUE(full.fits);
  const size_t F = Workspace::forward_bytes_for(s, 8, 2048, DType::BF16);
  EXPECT_EQ(full.whole_layers, 28);
  EXPECT_EQ(full.kept_layers, 0);
  EXPECT_EQ(device_bytes_named(full, kWholeName), 28 * F);
  EXPECT_EQ(full.gpu_bytes, none.gpu_bytes + 28 * F);
  const double recompute_params = 3072.0 * 3072 * 2 + 2 * 3072.0 * 1024 + 2 * 3072.0 * 8192;  // q, o; k, v; gate, up
  EXPECT_DOUBLE_EQ(recompute_flops_saved_per_token(s, 2048, 28, 0),
                   28 * (2 * recompute_params + 2.0 * 2048 * 3072));
  EXPECT_DOUBLE_EQ(none.flops - full.flops, recompute_flops_saved_per_token(s, 2048, 28, 0) * tokens);
  // h1, x2, h2, q, att [N, 3072]; k, v [N, 1024]; gate, up, act [N, 8192] bf16; rstd1, rstd2 [N], lse F32.
  EXPECT_EQ(F, size_t(8 * 2048) * (2 * (5 * 3072 + 2 * 1024 + 3 * 8192) + 4 * (2 + 24)));
  // Room for attention in every layer and a few layers whole: attention first, then upgrades.
  const size_t mid_budget = none.gpu_bytes + none.gpu_bytes / 50 + 28 * per + 3 * F;
  r.gpu_budget = mid_budget;
  const Plan mid = make_plan(s, r, be);
  ASSERT_TRUE(mid.fits);
  const size_t mid_margin = std::max(size_t(256) << 20, mid_budget / 100);
  EXPECT_EQ(mid.whole_layers + mid.kept_layers, 28);
  EXPECT_GE(mid.whole_layers, 3);
  EXPECT_LE(mid.gpu_bytes + mid_margin, mid_budget);
  EXPECT_GT(mid.gpu_bytes + mid_margin + (F - per), mid_budget);  // one more upgrade would not fit
  EXPECT_EQ(mid.gpu_bytes, none.gpu_bytes + size_t(mid.whole_layers) * F + size_t(mid.kept_layers) * per);

  // Forced: that many, and refused when it does not fit.
  r.gpu_budget = budget;
  r.whole_layers = 0;
  r.kept_layers = 28;
  const Plan forced = make_plan(s, r, be);
  EXPECT_EQ(forced.kept_layers, 28);
  EXPECT_FALSE(forced.fits);
  EXPECT_EQ(forced.short_of.memory, Shortfall::Memory::Gpu);

  // Nothing kept without training, on the cpu backend by default, or in the sliding engine.
  r.kept_layers = -1;
  r.whole_layers = -1;
  r.gpu_budget = size_t(140) << 30;
  r.training = false;
  r.optimizer = false;
  EXPECT_EQ(make_plan(s, r, be).kept_layers + make_plan(s, r, be).whole_layers, 0);
  r.training = r.optimizer = true;
  r.offload = OffloadChoice::On;
  EXPECT_EQ(make_plan(s, r, be).kept_layers + make_plan(s, r, be).whole_layers, 0);
  const ModelSpec tiny = parse_model_spec(test::tiny_config("llama"), "tiny");
  PlanRequest c;
  c.batch = 2;
  c.seq = 8;
  c.host_budget = size_t(8) << 30;
  EXPECT_EQ(make_plan(tiny, c, backend_info("cpu")).kept_layers, 0);
  EXPECT_EQ(make_plan(tiny, c, backend_info("cpu")).whole_layers, 0);
  c.kept_layers = 1;
  c.whole_layers = 1;
  EXPECT_EQ(make_plan(tiny, c, backend_info("cpu")).kept_layers, 1);
  EXPECT_EQ(make_plan(tiny, c, backend_info("cpu")).whole_layers, 1);
}

TEST(SelectiveRecomputePlan, RefusesLayerCountsOutOfRange) {
  const ModelSpec s = parse_model_spec(test::tiny_config("llama"), "tiny");
  PlanRequest r;
  r.batch = 1;
  r.seq = 4;
  r.kept_layers = s.n_layer + 1;
  test::expect_setting_error([&] { make_plan(s, r, backend_info("cpu")); }, Setting::KeepAttention);
  r.kept_layers = -2;
  test::expect_setting_error([&] { make_plan(s, r, backend_info("cpu")); }, Setting::KeepAttention);
  r.kept_layers = s.n_layer;  // every layer, and one also whole
  r.whole_layers = 1;
  test::expect_setting_error([&] { make_plan(s, r, backend_info("cpu")); }, Setting::KeepAttention);
  r.kept_layers = -1;
  r.whole_layers = s.n_layer + 1;
  test::expect_setting_error([&] { make_plan(s, r, backend_info("cpu")); }, Setting::KeepLayers);
}

}  // namespace
}  // namespace sf
