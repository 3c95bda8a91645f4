// Selective recompute on the CUDA backend (docs/ENGINE.md "Selective recompute"): the resident
// engine with layers kept whole and layers keeping attention's output gives the loss of every
// layer recomputed bit for bit (the forward is the same kernels on the same shapes), and the
// gradients within twice the run-to-run difference of the recompute path itself (the attention
// backward adds dQ with fp32 atomics: its last bits vary between runs), or 1e-2 of each tensor's
// largest value when the two runs agree exactly; a wrong buffer would differ at O(1). The same for
// the sliding engine (its kept activations per micro-batch, blobs on the GPU or sliding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../engine_state.h"
#include "../model_fixtures.h"
#include "../record_fixtures.h"
#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "model/spec.h"

namespace sf {
namespace {

struct Grads {
  double loss = 0;
  test::NamedTensors grads;
};

// Two micro-batches of 2 x 12 at most, gradients only, these layers kept.
EngineOptions kept_options(int whole, int kept) {
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 12;
  eo.max_micro = 2;
  eo.optimizer = false;
  eo.whole_layers = whole;
  eo.kept_layers = kept;
  return eo;
}

Grads grads_of(Engine& e, const std::vector<Batch>& mbs) {
  e.init_random(5);
  Grads g;
  g.loss = e.compute_grads(mbs);
  g.grads = test::export_grads(e);
  return g;
}

Grads run(Device& dev, const ModelSpec& spec, int whole, int kept, const std::vector<Batch>& mbs) {
  ResidentEngine e(dev, spec, kept_options(whole, kept));
  return grads_of(e, mbs);
}

// `grads(whole, kept)` with layers kept against the recompute path (0, 0), run twice for its noise.
template <class Run>
void expect_recomputed_gradients(const Run& grads, int L, const std::string& what) {
  const Grads base = grads(0, 0), again = grads(0, 0);
  const double noise = test::worst_relative(base.grads, again.grads);
  const double bound = std::max(2 * noise, 1e-2);
  for (auto [whole, kept] : {std::pair{L, 0}, std::pair{0, L}, std::pair{1, L - 1}}) {
    SCOPED_TRACE("whole " + std::to_string(whole) + " kept " + std::to_string(kept));
    const Grads k = grads(whole, kept);
    EXPECT_EQ(k.loss, base.loss);
    const double d = test::worst_relative(base.grads, k.grads);
    EXPECT_LE(d, bound) << "run-to-run " << noise;
    std::printf("%s whole %d kept %d: gradients %.3g of the largest (run-to-run %.3g)\n", what.c_str(), whole, kept, d,
                noise);
  }
}

TEST(CudaSelectiveRecompute, KeptLayersGiveTheRecomputedGradients) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(2) << 30);
  for (const std::string family : {"llama", "qwen3", "gemma3", "gemma4_ple", "qwen3_moe"}) {
    SCOPED_TRACE(family);
    const ModelSpec spec = parse_model_spec(test::tiny_config(family), "tiny");
    const std::vector<Record> recs = test::random_records(int(spec.vocab), 7, 4);
    const std::vector<Batch> mbs = {make_batch({&recs[0], &recs[1]}, 11), make_batch({&recs[2], &recs[3]}, 11)};
    expect_recomputed_gradients([&](int whole, int kept) { return run(*dev, spec, whole, kept, mbs); }, spec.n_layer,
                                family);
  }
}

// The sliding engine's gradients of two micro-batches (layer-major: every micro-batch keeps its own
// activations), with none or some blobs kept whole on the GPU.
Grads run_sliding(Device& dev, const ModelSpec& spec, int whole, int kept, const std::vector<int>& gpu_blobs,
                  const std::vector<Batch>& mbs) {
  SlidingOptions so;
  so.base = kept_options(whole, kept);
  so.slots = 2;
  so.gpu_blobs = gpu_blobs;
  so.keep_grads = true;
  SlidingEngine e(dev, spec, so);
  return grads_of(e, mbs);
}

TEST(CudaSelectiveRecompute, SlidingKeptLayersGiveTheRecomputedGradients) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(2) << 30);
  for (const std::string family : {"llama", "qwen3", "gemma3", "gemma4_ple", "qwen3_moe"}) {
    const ModelSpec spec = parse_model_spec(test::tiny_config(family), "tiny");
    const int L = spec.n_layer;
    for (const std::vector<int>& on_gpu : {std::vector<int>{}, std::vector<int>{0, L + 1}}) {
      const std::string what = "sliding " + family + (on_gpu.empty() ? "" : " (embedding and head on the GPU)");
      SCOPED_TRACE(what);
      const std::vector<Record> recs = test::random_records(int(spec.vocab), 7, 4);
      const std::vector<Batch> mbs = {make_batch({&recs[0], &recs[1]}, 11), make_batch({&recs[2], &recs[3]}, 9)};
      expect_recomputed_gradients(
          [&](int whole, int kept) { return run_sliding(*dev, spec, whole, kept, on_gpu, mbs); }, L, what);
    }
  }
}

// The sliding engine against the resident one on the GPU, each family's tiny model (Gemma 4 with
// per-layer inputs, shared K/V and the capped head among them): both run the same kernels on the same
// bf16 working copies, so their gradients differ only in how two micro-batches are summed (the
// resident engine on the GPU, the sliding one into host fp32): bound max(2 x the resident engine's
// run-to-run difference, 1e-2 of each tensor's largest value). The transformers parity cannot tell
// this for Gemma 4: its tiny models' bf16 gradients differ from fp32 by ~100 % in torch itself.
TEST(CudaEngines, SlidingGivesTheResidentGradients) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(2) << 30);
  for (const std::string family : {"llama", "gemma3", "gemma4_ple", "qwen3_moe"}) {
    SCOPED_TRACE(family);
    const ModelSpec spec = parse_model_spec(test::tiny_config(family), "tiny");
    const std::vector<Record> recs = test::random_records(int(spec.vocab), 7, 4);
    const std::vector<Batch> mbs = {make_batch({&recs[0], &recs[1]}, 11), make_batch({&recs[2], &recs[3]}, 9)};
    const Grads a = run(*dev, spec, 0, 0, mbs), again = run(*dev, spec, 0, 0, mbs);
    const double noise = test::worst_relative(a.grads, again.grads), bound = std::max(2 * noise, 1e-2);
    // Kept on the GPU: none; the embedding and the head (fp32 gradients in place); and a layer too
    // (its gradient through a layer accumulator into its bf16 store).
    for (const std::vector<int>& on_gpu :
         {std::vector<int>{}, std::vector<int>{0, spec.n_layer + 1}, std::vector<int>{0, 2, spec.n_layer + 1}}) {
      const Grads b = run_sliding(*dev, spec, 0, 0, on_gpu, mbs);
      EXPECT_NEAR(b.loss, a.loss, 1e-5 * std::fabs(a.loss));
      ASSERT_EQ(b.grads.size(), a.grads.size());
      const double d = test::worst_relative(a.grads, b.grads);
      EXPECT_LE(d, bound) << "run-to-run " << noise;
      std::printf("%s, %zu blobs on the GPU: sliding vs resident gradients %.3g of the largest (run-to-run %.3g)\n",
                  family.c_str(), on_gpu.size(), d, noise);
    }
  }
}

}  // namespace
}  // namespace sf
