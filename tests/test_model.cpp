// Whole-model checks on the CPU backend: gradients of every parameter of a tiny model of each
// architecture against finite differences, the head's fused loss against explicit logits, and
// gradient accumulation against one large batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/cpu/cpu_device.h"
#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "engine_state.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

using HostParams = test::NamedTensors;

std::vector<Record> tiny_records(int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Record> recs;
  for (int len : {11, 7, 4, 9}) {
    Record r;
    for (int t = 0; t < len; ++t) r.ids.push_back(int32_t(rng() % vocab));
    r.labels = r.ids;
    recs.push_back(r);
  }
  recs[1].labels[2] = recs[1].labels[3] = kIgnoreIndex;  // a masked span
  recs[3].labels[0] = recs[3].labels[1] = kIgnoreIndex;
  return recs;
}

// Non-trivial norms and biases (init gives 1 and 0, which would hide mistakes). Norm weights
// scatter around the identity: 1, or 0 for Gemma's (1 + w) norms.
void perturb_norms_and_biases(ResidentEngine& e, uint64_t seed) {
  const float center = e.spec().gemma_norm ? 0.f : 1.f;
  HostParams p = test::export_params(e);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& t : p) {
    bool norm = t.name.find("norm") != std::string::npos;
    bool bias = t.name.find(".bias") != std::string::npos;
    for (float& x : t.data) {
      if (norm) x = center + 0.3f * n(rng);
      if (bias) x = 0.2f * n(rng);
    }
  }
  test::import_params(e, p);
}

double loss_of(ResidentEngine& e, const Batch& b) {
  e.forward_backward(b, 1.f, false);
  return e.take_loss_sum() / double(b.trained);
}

// A tiny engine of `family` (batches up to 4 x 11), randomly initialised with `seed`.
std::unique_ptr<ResidentEngine> tiny_engine(Device& dev, const std::string& family, uint64_t seed, bool training = true,
                                            bool optimizer = false) {
  EngineOptions eo;
  eo.max_batch = 4;
  eo.max_seq = 11;
  eo.training = training;
  eo.optimizer = optimizer;
  auto e = std::make_unique<ResidentEngine>(dev, parse_model_spec(test::tiny_config(family), "tiny"), eo);
  e->init_random(seed);
  return e;
}

class ModelGrad : public ::testing::TestWithParam<std::string> {};

// Directional finite differences per tensor: along the analytic gradient (checks its size and
// direction) and along a random direction. fp32 forward: loss noise ~1e-6; eps 1e-2 with
// Richardson extrapolation (truncation ~eps^4): agreement ~1e-4..1e-3 relative; tolerances 5e-3.
TEST_P(ModelGrad, EveryParameterMatchesFiniteDifferences) {
  auto dev = make_cpu_device();
  auto engine = tiny_engine(*dev, GetParam(), 7);
  ResidentEngine& e = *engine;
  const ModelSpec& s = e.spec();
  perturb_norms_and_biases(e, 8);
  auto recs = tiny_records(int(s.vocab), 9);
  std::vector<const Record*> group;
  for (const auto& r : recs) group.push_back(&r);
  Batch b = make_batch(group, 11);
  ASSERT_GT(b.trained, 10);

  e.zero_grads();
  e.forward_backward(b, float(1.0 / b.trained), true);
  e.take_loss_sum();
  HostParams grads = test::export_grads(e);
  HostParams base = test::export_params(e);
  ASSERT_EQ(grads.size(), base.size());

  std::mt19937_64 rng(10);
  std::normal_distribution<float> n(0.f, 1.f);
  // Gemma 4 (softmax scale 1, four layers with per-layer inputs) is curved enough that eps 1e-2
  // leaves up to 10 % truncation after the extrapolation on layer 0 and the embedding (measured);
  // 2e-3 agrees everywhere, 5e-4 is fp32 noise on the small random-direction derivatives.
  const double eps = GetParam() == "gemma4_ple" ? 2e-3 : 1e-2;
  for (size_t i = 0; i < base.size(); ++i) {
    const auto& g = grads[i].data;
    double gnorm = 0;
    for (float x : g) gnorm += double(x) * x;
    gnorm = std::sqrt(gnorm);
    ASSERT_GT(gnorm, 0) << grads[i].name << " has a zero gradient";
    std::vector<float> rnd(g.size());
    double rn = 0;
    for (float& x : rnd) {
      x = n(rng);
      rn += double(x) * x;
    }
    for (int dir = 0; dir < 2; ++dir) {
      std::vector<double> d(g.size());
      for (size_t k = 0; k < g.size(); ++k) d[k] = dir == 0 ? g[k] / gnorm : rnd[k] / std::sqrt(rn);
      double analytic = 0;
      for (size_t k = 0; k < g.size(); ++k) analytic += double(g[k]) * d[k];
      // Central difference at eps and eps/2, Richardson-extrapolated: the eps^2 term cancels.
      auto central = [&](double h) {
        HostParams p = base;
        for (size_t k = 0; k < g.size(); ++k) p[i].data[k] = float(base[i].data[k] + h * d[k]);
        test::import_params(e, p);
        double lp = loss_of(e, b);
        for (size_t k = 0; k < g.size(); ++k) p[i].data[k] = float(base[i].data[k] - h * d[k]);
        test::import_params(e, p);
        double lm = loss_of(e, b);
        return (lp - lm) / (2 * h);
      };
      double fd = (4 * central(eps / 2) - central(eps)) / 3;
      double tol = dir == 0 ? 5e-3 * std::fabs(analytic) + 2e-5 : 2e-2 * gnorm * 0.1 + 5e-5;
      EXPECT_NEAR(fd, analytic, tol) << GetParam() << " " << grads[i].name
                                     << (dir == 0 ? " (gradient direction)" : " (random direction)");
    }
    test::import_params(e, base);
  }
}

// Several micro-batches in one step (Engine::compute_grads, as `slideformer grad` runs a file):
// every parameter's gradient is the sum of the micro-batches' gradients taken one at a time, in
// both engines. Tied models defer the embedding backwards to the end of the step (resident) or run
// them layer-major (sliding); Gemma's sqrt(hidden) embedding scale must enter each micro-batch's
// contribution exactly once.
void expect_micro_batches_sum_their_gradients(const std::string& family) {
  const ModelSpec spec = parse_model_spec(test::tiny_config(family), "tiny");
  auto recs = tiny_records(int(spec.vocab), 19);
  const std::vector<Batch> mbs = {make_batch({&recs[0]}, 11), make_batch({&recs[1], &recs[2]}, 11),
                                  make_batch({&recs[3]}, 11)};
  int64_t trained = 0;
  for (const Batch& b : mbs) trained += b.trained;
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 11;
  eo.max_micro = int(mbs.size());
  eo.optimizer = false;

  auto dev = make_cpu_device();
  ResidentEngine r(*dev, spec, eo);
  r.init_random(3);
  // Reference: one micro-batch at a time (no deferral), summed into the gradients.
  r.zero_grads();
  for (const Batch& b : mbs) r.forward_backward(b, float(1.0 / double(trained)), true);
  const double ref_loss = r.take_loss_sum() / double(trained);
  const HostParams ref = test::export_grads(r);

  EXPECT_NEAR(r.compute_grads(mbs), ref_loss, 1e-6 * ref_loss);
  const HostParams gr = test::export_grads(r);

  auto dev_s = make_cpu_device();
  SlidingOptions so;
  so.base = eo;
  so.slots = 2;
  so.keep_grads = true;
  SlidingEngine s(*dev_s, spec, so);
  s.init_random(3);
  EXPECT_NEAR(s.compute_grads(mbs), ref_loss, 1e-6 * ref_loss);
  const HostParams gs = test::export_grads(s);

  ASSERT_EQ(ref.size(), gr.size());
  ASSERT_EQ(ref.size(), gs.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LT(test::rel_err(gr[i].data, ref[i].data), 1e-5) << family << " resident " << ref[i].name;
    EXPECT_LT(test::rel_err(gs[i].data, ref[i].data), 1e-5) << family << " sliding " << ref[i].name;
    EXPECT_EQ(gr[i].data, gs[i].data) << family << " resident vs sliding " << ref[i].name;
  }
}

TEST_P(ModelGrad, SeveralMicroBatchesSumTheirGradients) { expect_micro_batches_sum_their_gradients(GetParam()); }

// Gemma 4 with the MoE block as well (gemma4_ple's structure, all 3 experts of each layer's block):
// both engines and the micro-batch sums. Its block's gradients against finite differences are
// tests/test_gemma4_moe.cpp's (one layer, L = <y, R>): through the whole model this file's central
// differences do not resolve them (measured: at eps 2e-3, gemma4_ple's step, the large gradients
// agree but the router scales' small directional derivatives, ~0.004, differ by up to 1e-4, the
// fp32 loss noise at that step; at 5e-3 / 1e-2 the curvature puts the embedding 3.7 % / more off).
TEST(Gemma4MoeModel, SeveralMicroBatchesSumTheirGradients) { expect_micro_batches_sum_their_gradients("gemma4_moe"); }

INSTANTIATE_TEST_SUITE_P(Families, ModelGrad, ::testing::ValuesIn(test::families()));
// Gemma 4 with per-layer inputs and shared K/V (the E-models' structure): the model-level inputs,
// every layer's block and the embedding's two consumers (model/gemma4_ple.*, engine/ple_store.*)
// through both engines.
INSTANTIATE_TEST_SUITE_P(Gemma4, ModelGrad, ::testing::Values("gemma4_ple"));

// transformers builds the embedding as nn.Embedding(padding_idx=pad_token_id) (Gemma3TextConfig's
// default 0), initialised to a zero row that the lookup gives no gradient. A zero embedding stays
// zero through every Gemma layer, and the gradient it receives is multiplied by 1/sqrt(eps) at each
// (1 + w) RMSNorm: without padding_idx that row's gradient was ~1e20 in the parity models. Tied:
// the pad row gets only the head's gradient, so the tied gradient is the untied model's embedding
// gradient (pad row 0) plus its head's. Three micro-batches, the pad id first in two records,
// through both engines.
TEST(Gemma3Embedding, PadRowGetsNoLookupGradient) {
  nlohmann::json tied_cfg = test::tiny_config("gemma3"), untied_cfg = tied_cfg;
  untied_cfg["tie_word_embeddings"] = false;
  const ModelSpec tied = parse_model_spec(tied_cfg, "tiny"), untied = parse_model_spec(untied_cfg, "tiny");
  ASSERT_EQ(tied.pad_token_id, 0);  // Gemma3TextConfig's default
  nlohmann::json none_cfg = tied_cfg;
  none_cfg["pad_token_id"] = nullptr;
  EXPECT_EQ(parse_model_spec(none_cfg, "tiny").pad_token_id, -1);
  auto recs = tiny_records(int(tied.vocab), 23);
  recs[0].ids[0] = 0;
  recs[2].ids[0] = 0;
  recs[2].ids[2] = 0;
  const std::vector<Batch> mbs = {make_batch({&recs[0]}, 11), make_batch({&recs[1], &recs[2]}, 11),
                                  make_batch({&recs[3]}, 11)};
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 11;
  eo.max_micro = int(mbs.size());
  eo.optimizer = false;
  const int64_t H = tied.hidden;

  auto dev = make_cpu_device();
  ResidentEngine t(*dev, tied, eo);
  t.init_random(4);
  HostParams p = test::export_params(t);
  ASSERT_EQ(p[0].name, "model.embed_tokens.weight");
  std::fill(p[0].data.begin(), p[0].data.begin() + H, 0.f);  // HF's padding_idx row
  test::import_params(t, p);
  t.compute_grads(mbs);
  const HostParams gt = test::export_grads(t);

  ResidentEngine u(*dev, untied, eo);
  HostParams pu = p;
  pu.push_back({"lm_head.weight", p[0].shape, p[0].data});
  test::import_params(u, pu);
  u.compute_grads(mbs);
  const HostParams gu = test::export_grads(u);
  const auto head = std::find_if(gu.begin(), gu.end(), [](const auto& x) { return x.name == "lm_head.weight"; });
  ASSERT_NE(head, gu.end());
  ASSERT_EQ(gu[0].name, "model.embed_tokens.weight");
  for (int64_t c = 0; c < H; ++c) EXPECT_EQ(gu[0].data[size_t(c)], 0.f) << "untied pad row, column " << c;
  std::vector<float> sum(gu[0].data.size());
  for (size_t k = 0; k < sum.size(); ++k) sum[k] = gu[0].data[k] + head->data[k];
  EXPECT_LT(test::rel_err(gt[0].data, sum), 1e-5);
  double pad_row = 0, rest = 0;
  for (size_t k = 0; k < sum.size(); ++k) (k < size_t(H) ? pad_row : rest) += double(gt[0].data[k]) * gt[0].data[k];
  EXPECT_LT(pad_row, rest);  // the head's share only

  // The sliding engine: the same bits as the resident one.
  for (const ModelSpec* spec : {&tied, &untied}) {
    auto dev_s = make_cpu_device();
    SlidingOptions so;
    so.base = eo;
    so.slots = 2;
    so.keep_grads = true;
    SlidingEngine s(*dev_s, *spec, so);
    test::import_params(s, spec == &tied ? p : pu);
    s.compute_grads(mbs);
    const HostParams gs = test::export_grads(s), &gr = spec == &tied ? gt : gu;
    ASSERT_EQ(gs.size(), gr.size());
    for (size_t i = 0; i < gs.size(); ++i) EXPECT_EQ(gs[i].data, gr[i].data) << "sliding " << gs[i].name;
  }
}


// The fused chunked linear-cross-entropy loss equals the loss from explicit logits.
TEST(Model, FusedHeadLossMatchesExplicitLogits) {
  auto dev = make_cpu_device();
  auto engine = tiny_engine(*dev, "qwen3", 3, false);
  ResidentEngine& e = *engine;
  const ModelSpec& s = e.spec();
  auto recs = tiny_records(int(s.vocab), 4);
  std::vector<const Record*> group;
  for (const auto& r : recs) group.push_back(&r);
  Batch b = make_batch(group, 11);
  double fused = loss_of(e, b);
  std::vector<float> logits = e.logits(b);
  double sum = 0;
  for (int64_t i = 0; i < int64_t(b.B) * b.T; ++i) {
    int32_t t = b.targets[size_t(i)];
    if (t == kIgnoreIndex) continue;
    const float* row = logits.data() + i * s.vocab;
    double mx = row[0], z = 0;
    for (int v = 0; v < s.vocab; ++v) mx = std::max(mx, double(row[v]));
    for (int v = 0; v < s.vocab; ++v) z += std::exp(row[v] - mx);
    sum += std::log(z) + mx - row[t];
  }
  EXPECT_NEAR(fused, sum / double(b.trained), 1e-5 * fused);
}

// Two micro-batches of 2 scaled by the step's token count = one batch of 4.
TEST(Model, GradientAccumulationEqualsOneLargeBatch) {
  auto dev = make_cpu_device();
  auto engine = tiny_engine(*dev, "llama", 5);
  ResidentEngine& e = *engine;
  const ModelSpec& s = e.spec();
  auto recs = tiny_records(int(s.vocab), 6);
  Batch all = make_batch({&recs[0], &recs[1], &recs[2], &recs[3]}, 11);
  Batch h1 = make_batch({&recs[0], &recs[1]}, 11), h2 = make_batch({&recs[2], &recs[3]}, 11);
  ASSERT_EQ(all.trained, h1.trained + h2.trained);
  e.zero_grads();
  e.forward_backward(all, float(1.0 / all.trained), true);
  double l_all = e.take_loss_sum();
  HostParams g_all = test::export_grads(e);
  e.zero_grads();
  e.forward_backward(h1, float(1.0 / all.trained), true);
  e.forward_backward(h2, float(1.0 / all.trained), true);
  double l_acc = e.take_loss_sum();
  HostParams g_acc = test::export_grads(e);
  EXPECT_NEAR(l_all, l_acc, 1e-5 * l_all);
  for (size_t i = 0; i < g_all.size(); ++i)
    EXPECT_LT(test::rel_err(g_acc[i].data, g_all[i].data), 1e-5) << g_all[i].name;
}

// Same seed, same result, bit for bit; and the same again with random delays injected into every
// stream (token uploads run on their own stream: a missing event dependency shows up here).
TEST(Model, TrainingIsDeterministicUnderStreamDelays) {
  auto run = [](int delay_us, uint64_t seed = 1) {
    CpuDeviceOptions o;
    o.max_delay_us = delay_us;
    o.delay_seed = seed;
    auto dev = make_cpu_device(o);
    auto engine = tiny_engine(*dev, "qwen2", 11, true, true);
    ResidentEngine& e = *engine;
    const ModelSpec& s = e.spec();
    auto recs = tiny_records(int(s.vocab), 12);
    // Four micro-batches a step (token slots reused within the step), one record each, in a
    // different order every step, so that stale or overwritten tokens in a slot would show.
    const int order[3][4] = {{0, 1, 2, 3}, {1, 2, 3, 0}, {2, 0, 3, 1}};
    for (int step = 1; step <= 3; ++step) {
      std::vector<Batch> mbs;
      int64_t trained = 0;
      for (int j = 0; j < 4; ++j) {
        mbs.push_back(make_batch({&recs[order[step - 1][j]]}, 11));
        trained += mbs.back().trained;
      }
      e.zero_grads();
      for (const Batch& mb : mbs) e.forward_backward(mb, float(1.0 / double(trained)), true);
      e.take_loss_sum();
      AdamWParams p;
      p.lr = 1e-2f;
      p.weight_decay = 0.1f;
      p.step = step;
      e.adamw_step(p);
    }
    return test::export_params(e);
  };
  HostParams a = run(0), b = run(0);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].data, b[i].data) << a[i].name;
  for (uint64_t seed : {1, 2, 3, 4}) {  // a missing dependency shows in most of these
    HostParams c = run(300, seed);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(a[i].data, c[i].data) << a[i].name << " (delay seed " << seed << ")";
  }
}

}  // namespace
}  // namespace sf
