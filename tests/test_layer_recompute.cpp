// Program::layer_recompute against layer_forward: the backward that follows either gives the same
// bits (input gradient and every parameter gradient), for every family; a dense Llama layer leaves
// the scratch output untouched (its down projection and residual are skipped), others fill it
// with the forward's output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/device.h"
#include "engine/blob_init.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/rope.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "rope_fixture.h"
#include "test_util.h"

namespace sf {
namespace {

class LayerRecompute : public ::testing::TestWithParam<std::string> {};

TEST_P(LayerRecompute, BackwardAfterRecomputeEqualsBackwardAfterForward) {
  const ModelSpec s = parse_model_spec(test::tiny_config(GetParam()), "tiny");
  const ModelLayout lay = make_layout(s);
  const int layer = s.n_layer - 1;  // Gemma's last layer is a local one, its first a local too
  const BlobLayout& blob = lay.layer(layer);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);

  std::vector<float> params(size_t(blob.numel));
  random_blob(blob, 1 + layer, 23, 0.3, params.data());
  const test::HostRope host_rope(s, T);
  const RopeTables& rope = host_rope.views;
  const auto x = test::randn(size_t(N * H), 5), dy = test::randn(size_t(N * H), 6);
  BatchDims d{B, T, {}};
  const LayerBuffers w = ws.layer(d);
  const LayerParams p = layer_views(blob, params.data(), DType::F32);
  auto xv = [&](const std::vector<float>& v) { return test::view_of(const_cast<std::vector<float>&>(v), {N, H}); };

  // The backward after `fill` ran into w: {dx, parameter gradients}.
  auto backward_after = [&](auto fill) {
    std::vector<float> grads(size_t(blob.numel), 0.f), dx(size_t(N * H));
    fill();
    prog.layer_backward(p, layer_views(blob, grads.data(), DType::F32), xv(x), xv(dy), test::view_of(dx, {N, H}), w,
                        d, rope, *st);
    dev->synchronize(*st);
    grads.insert(grads.end(), dx.begin(), dx.end());
    return grads;
  };
  std::vector<float> y(size_t(N * H));
  const auto after_forward = backward_after([&] { prog.layer_forward(p, xv(x), test::view_of(y, {N, H}), w, d, rope, *st); });
  // Another input in between, so that the recompute has to refill every buffer the backward reads.
  const auto other = test::randn(size_t(N * H), 9);
  std::vector<float> y_other(size_t(N * H));
  prog.layer_forward(p, xv(other), test::view_of(y_other, {N, H}), w, d, rope, *st);
  std::vector<float> scratch(size_t(N * H), NAN);
  const auto after_recompute =
      backward_after([&] { prog.layer_recompute(p, xv(x), test::view_of(scratch, {N, H}), w, d, rope, *st); });

  ASSERT_EQ(after_forward.size(), after_recompute.size());
  EXPECT_EQ(0, std::memcmp(after_forward.data(), after_recompute.data(), after_forward.size() * sizeof(float)))
      << GetParam() << ": the backward after the recompute differs from the one after the forward";
  double norm = 0;
  for (float v : after_forward) norm += double(v) * v;
  EXPECT_GT(norm, 0.0);
  const bool dense_llama = !s.sandwich_norm && !s.moe_layer(layer);
  size_t untouched = 0;
  for (float v : scratch) untouched += std::isnan(v) ? 1 : 0;
  if (dense_llama)
    EXPECT_EQ(untouched, scratch.size()) << GetParam() << ": the recompute wrote the output it does not need";
  else
    EXPECT_EQ(0, std::memcmp(scratch.data(), y.data(), y.size() * sizeof(float)))
        << GetParam() << ": the recompute's output is not the forward's";
}

INSTANTIATE_TEST_SUITE_P(Families, LayerRecompute,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3_moe", "mixtral"),
                         [](const auto& i) { return i.param; });

}  // namespace
}  // namespace sf
