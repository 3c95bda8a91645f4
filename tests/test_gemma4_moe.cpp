// Gemma 4's MoE block (model/gemma4_moe.cpp; docs/GEMMA4.md section 2) on the cpu device: one
// decoder layer with the block, through Program, against central differences of the program's own
// forward for the input and a sample of every parameter (the router, its two scales, every expert
// matrix, the three extra norms), local and global layers, every expert chosen (k = E: no choice
// to flip) and top 2 of 5 (a sample whose step changes a routing choice is left out: the loss is
// not differentiable there); the recompute bit-identical; the forward against the formula in fp64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_device.h"
#include "engine/blob_init.h"
#include "gemma4_fixtures.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/spec.h"
#include "model/spec_gemma4.h"
#include "rope_fixture.h"
#include "test_util.h"

namespace sf {
namespace {

using nlohmann::json;

// gemma4_tiny_config (layers 0-4 local, 5 global; H 32) with the MoE block of `experts` experts,
// top `k`, width 12 beside the dense MLP of 48.
ModelSpec moe_spec(int experts, int k) {
  json c = test::gemma4_tiny_config();
  c["enable_moe_block"] = true;
  c["num_experts"] = experts;
  c["top_k_experts"] = k;
  c["moe_intermediate_size"] = 12;
  return read_gemma4_spec(c, "moe.json");
}

struct MoeCase {
  int layer, experts, k;
};

class Gemma4MoeLayerGrad : public ::testing::TestWithParam<MoeCase> {};

TEST_P(Gemma4MoeLayerGrad, ProgramBackwardMatchesFiniteDifferences) {
  const MoeCase c = GetParam();
  const ModelSpec s = moe_spec(c.experts, c.k);
  const ModelLayout lay = make_layout(s);
  const int l = c.layer;
  const BlobLayout& blob = lay.layer(l);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden, k = c.k;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);
  std::vector<float> params(size_t(blob.numel)), grads(size_t(blob.numel), 0.f);
  random_blob(blob, 1 + l, 23, 0.3, params.data());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const auto& e : blob.entries) {  // norms and the router's scales around their start, 1
    const bool around_one = e.name.find("norm") != std::string::npos ||
                            e.name.find("router.scale") != std::string::npos ||
                            e.name.find("per_expert_scale") != std::string::npos;
    if (around_one)
      for (int64_t i = 0; i < e.numel; ++i) params[size_t(e.offset + i)] = 1.f + 0.3f * nd(rng);
  }
  // The router's logits spread wide enough that the top 2 of 5 are mostly clear of ties.
  const BlobEntry* router = blob.entry(LayerParam::Router);
  ASSERT_NE(router, nullptr);
  for (int64_t i = 0; i < router->numel; ++i) params[size_t(router->offset + i)] *= 6.f;
  const test::HostRope host_rope(s, T);
  auto x = test::randn(size_t(N * H), 5), R = test::randn(size_t(N * H), 6);
  std::vector<float> y(size_t(N * H)), dx(size_t(N * H));
  const BatchDims d{B, T, {}};
  const LayerBuffers w = ws.layer(d);
  const int32_t* idx = w.topk_idx.ptr<int32_t>();
  std::vector<int32_t> base;  // the routing at the unperturbed point
  bool flipped = false;
  auto forward = [&] {
    prog.layer_forward(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}), test::view_of(y, {N, H}),
                       w, d, host_rope.views, *st);
    dev->synchronize(*st);
    if (!base.empty() && !std::equal(base.begin(), base.end(), idx)) flipped = true;
    return test::dot(y, R);
  };
  forward();
  base.assign(idx, idx + N * k);
  {  // every expert is somebody's choice (so every expert's gradient is checked below)
    std::vector<int> hits(size_t(c.experts), 0);
    for (int32_t e : base) ++hits[size_t(e)];
    for (int e = 0; e < c.experts; ++e) EXPECT_GT(hits[size_t(e)], 0) << "expert " << e;
  }
  {  // the block's output m from its inputs x2 and mlp_o by docs/GEMMA4.md's formula in fp64
    const LayerParams pv = layer_views(blob, params.data(), DType::F32);
    const int64_t E = c.experts, Ie = s.moe.intermediate, stride = pv[LayerParam::ExpGate].cols();
    const float* x2 = w.x2.ptr<float>();
    const float* mo = w.mlp_o.ptr<float>();
    auto f = [&](LayerParam q) { return pv[q].ptr<float>(); };
    auto norm = [&](const float* v, const float* wt) {  // over H, eps 1e-6, times wt (none: 1)
      double ms = 0;
      for (int64_t h = 0; h < H; ++h) ms += double(v[h]) * v[h] / double(H);
      std::vector<double> o(static_cast<size_t>(H));
      for (int64_t h = 0; h < H; ++h) o[size_t(h)] = v[h] / std::sqrt(ms + 1e-6) * (wt ? wt[h] : 1.0);
      return o;
    };
    auto gelu = [](double g) { return 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))); };
    double worst = 0, scale = 0;
    for (int64_t n = 0; n < N; ++n) {
      const std::vector<double> m1 = norm(mo + n * H, f(LayerParam::MlpOutNorm1)), r = norm(x2 + n * H, nullptr);
      const std::vector<double> xe = norm(x2 + n * H, f(LayerParam::MoeInNorm));
      std::vector<double> z(static_cast<size_t>(E));
      double zmax = -1e300;
      for (int64_t e = 0; e < E; ++e) {
        double acc = 0;
        for (int64_t h = 0; h < H; ++h)
          acc += r[size_t(h)] * f(LayerParam::RouterScale)[h] / std::sqrt(double(H)) * f(LayerParam::Router)[e * H + h];
        z[size_t(e)] = acc;
        zmax = std::max(zmax, acc);
      }
      std::vector<double> pr(static_cast<size_t>(E));
      double zs = 0;
      for (int64_t e = 0; e < E; ++e) zs += pr[size_t(e)] = std::exp(z[size_t(e)] - zmax);
      std::vector<int> order(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) order[size_t(e)] = int(e);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[size_t(a)] > pr[size_t(b)]; });
      double top = 0;
      for (int64_t j = 0; j < k; ++j) top += pr[size_t(order[size_t(j)])];
      std::vector<double> m2(size_t(H), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int e = order[size_t(j)];
        EXPECT_EQ(base[size_t(n * k + j)], e) << "token " << n << " choice " << j;
        const double wj = pr[size_t(e)] / top * f(LayerParam::ExpertScale)[e];
        const float* G = f(LayerParam::ExpGate) + e * stride;  // [Ie, H]
        const float* U = f(LayerParam::ExpUp) + e * stride;
        const float* D = f(LayerParam::ExpDown) + e * stride;  // [H, Ie]
        std::vector<double> a(static_cast<size_t>(Ie));
        for (int64_t i = 0; i < Ie; ++i) {
          double gg = 0, uu = 0;
          for (int64_t h = 0; h < H; ++h) gg += xe[size_t(h)] * G[i * H + h], uu += xe[size_t(h)] * U[i * H + h];
          a[size_t(i)] = gelu(gg) * uu;
        }
        for (int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (int64_t i = 0; i < Ie; ++i) acc += a[size_t(i)] * D[h * Ie + i];
          m2[size_t(h)] += wj * acc;
        }
      }
      std::vector<float> m2f(m2.begin(), m2.end());
      const std::vector<double> m2n = norm(m2f.data(), f(LayerParam::MoeOutNorm));
      for (int64_t h = 0; h < H; ++h) {
        const double want = m1[size_t(h)] + m2n[size_t(h)];
        worst = std::max(worst, std::abs(want - w.moe4.m.ptr<float>()[n * H + h]));
        scale = std::max(scale, std::abs(want));
      }
    }
    EXPECT_LT(worst, 1e-4 * scale) << "the block's output against the formula";
  }
  prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, grads.data(), DType::F32),
                      test::view_of(x, {N, H}), test::view_of(R, {N, H}), test::view_of(dx, {N, H}), w, d,
                      host_rope.views, *st);
  dev->synchronize(*st);
  {  // the backward's recompute gives the same bits
    std::vector<float> g2(size_t(blob.numel), 0.f), dx2(size_t(N * H)), scratch(size_t(N * H));
    std::fill(static_cast<float*>(w.moe4.m.data), static_cast<float*>(w.moe4.m.data) + N * H, 7.f);
    prog.layer_recompute(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}),
                         test::view_of(scratch, {N, H}), w, d, host_rope.views, *st);
    prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, g2.data(), DType::F32),
                        test::view_of(x, {N, H}), test::view_of(R, {N, H}), test::view_of(dx2, {N, H}), w, d,
                        host_rope.views, *st);
    dev->synchronize(*st);
    EXPECT_EQ(g2, grads);
    EXPECT_EQ(dx2, dx);
  }
  int left_out = 0, checked = 0;
  auto fd_check = [&](std::vector<float>& v, const std::vector<size_t>& at, const std::vector<float>& g,
                      const std::string& what) {
    const double eps = 1e-2;
    std::vector<double> num, ana;
    for (size_t i : at) {
      const float v0 = v[i];
      flipped = false;
      v[i] = v0 + float(eps);
      const double lp = forward();
      v[i] = v0 - float(eps);
      const double lm = forward();
      v[i] = v0;
      if (flipped) {
        ++left_out;
        continue;
      }
      ++checked;
      num.push_back((lp - lm) / (2 * eps));
      ana.push_back(g[i]);
    }
    if (!num.empty()) {
      EXPECT_LE(test::rel_err(ana, num), 5e-3) << what;
    }
  };
  fd_check(x, test::sample_indices(x.size(), 40, 1), dx, "dx");
  for (const auto& e : blob.entries) {
    std::vector<size_t> at;
    for (size_t i : test::sample_indices(size_t(e.numel), 8, uint64_t(e.offset))) at.push_back(size_t(e.offset) + i);
    fd_check(params, at, grads, e.name);
  }
  if (c.k == c.experts) {
    EXPECT_EQ(left_out, 0);
  }
  EXPECT_LE(left_out, checked / 10) << "too many samples changed a routing choice";
  // The gradients of the block's own parameters are not zero (they are checked above).
  for (LayerParam pk :
       {LayerParam::Router, LayerParam::RouterScale, LayerParam::ExpertScale, LayerParam::ExpGate, LayerParam::ExpUp,
        LayerParam::ExpDown, LayerParam::MoeInNorm, LayerParam::MlpOutNorm1, LayerParam::MoeOutNorm}) {
    const BlobEntry* e = blob.entry(pk);
    ASSERT_NE(e, nullptr);
    double n2 = 0;
    for (int64_t i = 0; i < e->numel; ++i) n2 += double(grads[size_t(e->offset + i)]) * grads[size_t(e->offset + i)];
    EXPECT_GT(n2, 0.0) << e->name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, Gemma4MoeLayerGrad,
                         ::testing::Values(MoeCase{4, 3, 3}, MoeCase{5, 3, 3}, MoeCase{4, 5, 2}, MoeCase{5, 5, 2}),
                         [](const auto& i) {
                           return std::string(i.param.layer == 5 ? "global" : "local") + "_top" +
                                  std::to_string(i.param.k) + "of" + std::to_string(i.param.experts);
                         });

}  // namespace
}  // namespace sf
