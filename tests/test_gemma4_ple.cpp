// Gemma 4's per-layer inputs (model/gemma4_ple.*) on the cpu device: the permutations, the model-
// level forward against the formula of docs/GEMMA4.md section 2 computed here in double, and both
// backwards against central differences for every input and parameter (sampled), alone and inside
// the Gemma 4 layer program (with layer_scalar and the recompute).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_device.h"
#include "data/dataset/dataset.h"
#include "engine/resident_engine.h"
#include "engine_state.h"
#include "model/gemma4_ple.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/spec.h"
#include "model/spec_gemma4.h"
#include "model_fixtures.h"
#include "rope_fixture.h"
#include "test_util.h"

namespace sf {
namespace {

using nlohmann::json;

// 3 layers (local, local, global), H 16, P 6, per-layer vocabulary 11 (not the main one's 13).
ModelSpec tiny_ple_spec(int hidden = 16) {
  const json c{{"model_type", "gemma4_text"},
               {"vocab_size", 13},
               {"hidden_size", hidden},
               {"intermediate_size", 24},
               {"num_hidden_layers", 3},
               {"num_attention_heads", 2},
               {"num_key_value_heads", 1},
               {"head_dim", 8},
               {"global_head_dim", 8},
               {"hidden_size_per_layer_input", 6},
               {"vocab_size_per_layer_input", 11},
               {"pad_token_id", 0},
               {"sliding_window", 4},
               {"layer_types", {"sliding_attention", "sliding_attention", "full_attention"}}};
  return read_gemma4_spec(c, "ple.json");
}

// sum_i g_i * (central difference of f along v_i) against the analytic gradient: relative error.
void expect_fd(std::vector<float>& v, const std::vector<float>& g, const std::function<double()>& f,
               const std::string& what, size_t n = 24) {
  const std::vector<size_t> idx = test::sample_indices(v.size(), n, v.size() + 7);
  const std::vector<double> num = test::numeric_grad(v, idx, 1e-2, f);
  EXPECT_LE(test::rel_err(test::gather(g, idx), num), 2e-3) << what;
}

TEST(Gemma4Ple, PermutationsAreInverse) {
  const int64_t N = 5, L = 3;
  std::vector<int32_t> order(N * L), inverse(N * L);
  ple_fill_permutations(order.data(), inverse.data(), N, L);
  for (int64_t r = 0; r < N * L; ++r) {
    EXPECT_EQ(inverse[size_t(order[size_t(r)])], r);
    EXPECT_EQ(order[size_t(r)], (r % N) * L + r / N);  // layer-major row l*N + n is token-major n*L + l
  }
}

struct ModelFixture {
  ModelSpec s = tiny_ple_spec();
  int64_t N = 7, H = s.hidden, P = s.gemma4.ple_dim, L = s.n_layer, LP = L * P, V = s.gemma4.ple_vocab;
  std::vector<int32_t> ids{3, 0, 10, 3, 5, 0, 9};  // the pad id 0 twice, 3 twice
  std::vector<float> e = test::randn(size_t(N * H), 1), table = test::randn(size_t(V * LP), 2, 0.5f),
                     proj = test::randn(size_t(LP * H), 3, 0.3f), norm = test::randn(size_t(P), 4, 0.3f, 1.f);
  std::vector<float> tok = std::vector<float>(size_t(N * LP)), ctx = tok, rstd = std::vector<float>(size_t(N * L)),
                     pad = std::vector<float>(size_t(LP)), pli = tok;
  std::vector<int32_t> order = std::vector<int32_t>(size_t(N * L)), inverse = order;
  PleModelBuffers b;
  ModelFixture() {
    ple_fill_permutations(order.data(), inverse.data(), N, L);
    b = PleModelBuffers{test::view_of(tok, {N, LP}),   test::view_of(ctx, {N, LP}),     test::view_of(rstd, {N * L}),
                        test::view_of(order, {N * L}), test::view_of(inverse, {N * L}), test::view_of(pad, {LP})};
  }
};

TEST(Gemma4Ple, InputsForwardIsTheFormulaLayerMajor) {
  ModelFixture m;
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const PleProgram prog(m.s, dev->ops(), DType::F32);
  prog.inputs_forward(test::view_of(m.pli, {m.L * m.N, m.P}), test::view_of(m.ids, {m.N}),
                      test::view_of(m.e, {m.N, m.H}), test::view_of(m.table, {m.V, m.LP}),
                      test::view_of(m.proj, {m.LP, m.H}), test::view_of(m.norm, {m.P}), m.b, *st);
  dev->synchronize(*st);
  double worst = 0;
  for (int64_t n = 0; n < m.N; ++n)
    for (int64_t l = 0; l < m.L; ++l) {
      std::vector<double> c(size_t(m.P));
      double ms = 0;
      for (int64_t q = 0; q < m.P; ++q) {
        double acc = 0;
        for (int64_t h = 0; h < m.H; ++h)
          acc += double(m.e[size_t(n * m.H + h)]) * m.proj[size_t((l * m.P + q) * m.H + h)];
        c[size_t(q)] = acc / std::sqrt(double(m.H));
        ms += c[size_t(q)] * c[size_t(q)] / double(m.P);
      }
      for (int64_t q = 0; q < m.P; ++q) {
        const double normed = c[size_t(q)] / std::sqrt(ms + m.s.rms_eps) * m.norm[size_t(q)];
        const double tk = double(m.table[size_t(m.ids[size_t(n)] * m.LP + l * m.P + q)]) * std::sqrt(double(m.P));
        const double want = (normed + tk) / std::sqrt(2.0);
        worst = std::max(worst, std::abs(want - m.pli[size_t((l * m.N + n) * m.P + q)]));
      }
    }
  EXPECT_LT(worst, 2e-5);
}

// The projection's scale H^-1/2 is transformers' Python double rounded once to fp32. At H = 96
// (as at the E2B's 1536) 1/sqrt(float(H)) is an ulp off; ctx must be the product times the former,
// bit for bit.
TEST(Gemma4Ple, ProjectionScaleIsTransformersRounding) {
  const ModelSpec s = tiny_ple_spec(96);
  const int64_t N = 5, H = s.hidden, L = s.n_layer, P = s.gemma4.ple_dim, LP = L * P, V = s.gemma4.ple_vocab;
  const float hf = float(std::pow(double(H), -0.5));
  ASSERT_NE(hf, 1.f / std::sqrt(float(H))) << "H = 96 no longer tells the two roundings apart";
  std::vector<int32_t> ids{1, 4, 0, 7, 2}, order(size_t(N * L)), inverse(order.size());
  ple_fill_permutations(order.data(), inverse.data(), N, L);
  std::vector<float> e = test::randn(size_t(N * H), 1), table = test::randn(size_t(V * LP), 2, 0.5f),
                     proj = test::randn(size_t(LP * H), 3, 0.3f), norm = test::randn(size_t(P), 4, 0.3f, 1.f),
                     tok(size_t(N * LP)), ctx(tok.size()), pli(tok.size()), want(tok.size()), rstd(size_t(N * L)),
                     pad = std::vector<float>(size_t(LP));
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const PleModelBuffers b{test::view_of(tok, {N, LP}),   test::view_of(ctx, {N, LP}),     test::view_of(rstd, {N * L}),
                          test::view_of(order, {N * L}), test::view_of(inverse, {N * L}), test::view_of(pad, {LP})};
  PleProgram(s, dev->ops(), DType::F32)
      .inputs_forward(test::view_of(pli, {L * N, P}), test::view_of(ids, {N}), test::view_of(e, {N, H}),
                      test::view_of(table, {V, LP}), test::view_of(proj, {LP, H}), test::view_of(norm, {P}), b, *st);
  dev->ops().matmul(test::view_of(want, {N, LP}), test::view_of(e, {N, H}), test::view_of(proj, {LP, H}), false, true,
                    1.f, 0.f, *st);
  dev->synchronize(*st);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(ctx[i], want[i] * hf) << i;
}

TEST(Gemma4Ple, InputsBackwardMatchesFiniteDifferences) {
  ModelFixture m;
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const PleProgram prog(m.s, dev->ops(), DType::F32);
  const std::vector<float> R = test::randn(m.pli.size(), 9);
  auto forward = [&] {
    prog.inputs_forward(test::view_of(m.pli, {m.L * m.N, m.P}), test::view_of(m.ids, {m.N}),
                        test::view_of(m.e, {m.N, m.H}), test::view_of(m.table, {m.V, m.LP}),
                        test::view_of(m.proj, {m.LP, m.H}), test::view_of(m.norm, {m.P}), m.b, *st);
    dev->synchronize(*st);
    return test::dot(m.pli, R);
  };
  forward();
  std::vector<float> de(m.e.size(), 0.f), dtable(m.table.size(), 0.f), dproj(m.proj.size(), 0.f),
      dnorm(m.norm.size(), 0.f), dpli = R;
  for (int64_t c = 0; c < m.LP; ++c) dtable[size_t(c)] = 0.25f;  // the pad row (id 0) keeps what it held
  prog.inputs_backward(
      test::view_of(de, {m.N, m.H}), test::view_of(dtable, {m.V, m.LP}), test::view_of(dproj, {m.LP, m.H}),
      test::view_of(dnorm, {m.P}), test::view_of(dpli, {m.L * m.N, m.P}), test::view_of(m.ids, {m.N}),
      test::view_of(m.e, {m.N, m.H}), test::view_of(m.proj, {m.LP, m.H}), test::view_of(m.norm, {m.P}), m.b, *st);
  dev->synchronize(*st);
  for (int64_t c = 0; c < m.LP; ++c) ASSERT_EQ(dtable[size_t(c)], 0.25f) << c;
  expect_fd(m.e, de, forward, "de");
  expect_fd(m.proj, dproj, forward, "dproj");
  expect_fd(m.norm, dnorm, forward, "dnorm", m.norm.size());
  // The table: rows 3 (twice), 5, 9 and 10 (the pad row has no lookup gradient; the rest none at all).
  std::vector<size_t> idx;
  for (int32_t id : {3, 5, 9, 10})
    for (size_t c : test::sample_indices(size_t(m.LP), 5, size_t(id))) idx.push_back(size_t(id * m.LP) + c);
  const std::vector<double> num = test::numeric_grad(m.table, idx, 1e-2, forward);
  EXPECT_LE(test::rel_err(test::gather(dtable, idx), num), 2e-3) << "dtable";
  for (int64_t r = 1; r < m.V; ++r) {
    const bool used = r == 3 || r == 5 || r == 9 || r == 10;
    double sum = 0;
    for (int64_t c = 0; c < m.LP; ++c) sum += std::abs(dtable[size_t(r * m.LP + c)]);
    EXPECT_EQ(sum > 0, used) << "row " << r;
  }
}

TEST(Gemma4Ple, LayerBackwardMatchesFiniteDifferences) {
  const ModelSpec s = tiny_ple_spec();
  const ModelLayout lay = make_layout(s);
  const BlobLayout& blob = lay.layer(2);
  ASSERT_NE(blob.entry(LayerParam::PleGate), nullptr);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const PleProgram prog(s, dev->ops(), DType::F32);
  const int64_t N = 9, H = s.hidden, P = s.gemma4.ple_dim;
  std::vector<float> params = test::randn(size_t(blob.numel), 11, 0.4f), grads(size_t(blob.numel), 0.f);
  const BlobEntry& nw = *blob.entry(LayerParam::PleNorm);
  for (int64_t i = 0; i < nw.numel; ++i) params[size_t(nw.offset + i)] += 1.f;  // norm weights around 1
  std::vector<float> x = test::randn(size_t(N * H), 12), pli = test::randn(size_t(N * P), 13), y(x.size());
  std::vector<float> y_in(x.size()), gate(size_t(N * P)), act(gate.size()), u(x.size()), rstd(static_cast<size_t>(N)),
      du(x.size()), dgate(gate.size());
  const PleLayerBuffers b{test::view_of(y_in, {N, H}), test::view_of(gate, {N, P}), test::view_of(act, {N, P}),
                          test::view_of(u, {N, H}),    test::view_of(rstd, {N}),    test::view_of(du, {N, H}),
                          test::view_of(dgate, {N, P})};
  const std::vector<float> R = test::randn(x.size(), 14);
  auto forward = [&] {
    y = x;
    prog.layer_forward(layer_views(blob, params.data(), DType::F32), test::view_of(y, {N, H}),
                       test::view_of(pli, {N, P}), b, *st);
    dev->synchronize(*st);
    return test::dot(y, R);
  };
  forward();
  std::vector<float> dy = R, dpli(pli.size(), 9.f);
  prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, grads.data(), DType::F32),
                      test::view_of(dy, {N, H}), test::view_of(dpli, {N, P}), test::view_of(pli, {N, P}), b, *st);
  dev->synchronize(*st);
  expect_fd(x, dy, forward, "dy");
  expect_fd(pli, dpli, forward, "dpli");
  for (LayerParam k : {LayerParam::PleGate, LayerParam::PleProj, LayerParam::PleNorm}) {
    const BlobEntry& e = *blob.entry(k);
    std::vector<size_t> idx;
    for (size_t i : test::sample_indices(size_t(e.numel), 16, uint64_t(e.offset))) idx.push_back(size_t(e.offset) + i);
    const std::vector<double> num = test::numeric_grad(params, idx, 1e-2, forward);
    EXPECT_LE(test::rel_err(test::gather(grads, idx), num), 2e-3) << e.name;
  }
}

// The whole Gemma 4 decoder layer with its per-layer input (program_gemma4.cpp), local and global,
// layer_scalar 0.8: L = <y, R> against central differences for x, pli_l and every parameter
// (sampled); the recompute gives the same gradients bit for bit.
class Gemma4PleLayerGrad : public ::testing::TestWithParam<int> {};
TEST_P(Gemma4PleLayerGrad, ProgramLayerMatchesFiniteDifferences) {
  ModelSpec s = tiny_ple_spec();
  const int l = GetParam();
  s.gemma4.layer_scalar[size_t(l)] = 0.8f;
  const ModelLayout lay = make_layout(s);
  const BlobLayout& blob = lay.layer(l);
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 5;
  const int64_t N = B * T, H = s.hidden, P = s.gemma4.ple_dim;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);
  std::vector<float> params = test::randn(size_t(blob.numel), 21 + uint64_t(l), 0.3f), grads(size_t(blob.numel), 0.f);
  for (const BlobEntry& e : blob.entries)  // norms around 1
    if (e.name.find("norm") != std::string::npos)
      for (int64_t i = 0; i < e.numel; ++i) params[size_t(e.offset + i)] += 1.f;
  const test::HostRope host_rope(s, T);
  std::vector<float> x = test::randn(size_t(N * H), 22), pli = test::randn(size_t(N * P), 23), y(x.size()),
                     dx(x.size()), dpli(pli.size(), 5.f);
  const std::vector<float> R = test::randn(x.size(), 24);
  const BatchDims d{B, T, {}};
  LayerBuffers w = ws.layer(d);
  w.pli_l = test::view_of(pli, {N, P});
  w.dpli_l = test::view_of(dpli, {N, P});
  auto forward = [&] {
    prog.layer_forward(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}), test::view_of(y, {N, H}),
                       w, d, host_rope.views, *st);
    dev->synchronize(*st);
    return test::dot(y, R);
  };
  // Without per-layer inputs' effect (zero gate weights: gelu(0) = 0, the block adds norm(0) = 0)
  // the layer is the plain one: the block really is inside the layer's output otherwise.
  forward();
  const std::vector<float> y_ple = y;
  std::vector<float> zero_gate = params;
  const BlobEntry& ge = *blob.entry(LayerParam::PleGate);
  std::fill(zero_gate.begin() + ge.offset, zero_gate.begin() + ge.offset + ge.numel, 0.f);
  prog.layer_forward(layer_views(blob, zero_gate.data(), DType::F32), test::view_of(x, {N, H}),
                     test::view_of(y, {N, H}), w, d, host_rope.views, *st);
  dev->synchronize(*st);
  EXPECT_GT(test::max_abs_diff(y, y_ple), 1e-3);
  forward();
  std::vector<float> dy = R;
  prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, grads.data(), DType::F32),
                      test::view_of(x, {N, H}), test::view_of(dy, {N, H}), test::view_of(dx, {N, H}), w, d,
                      host_rope.views, *st);
  dev->synchronize(*st);
  {  // the recompute (into the same buffers, first spoiled) and a second backward: the same bits
    std::vector<float> g2(grads.size(), 0.f), dx2(dx.size()), dpli2(dpli.size()), scratch(x.size());
    std::fill(static_cast<float*>(w.ple.gate.data), static_cast<float*>(w.ple.gate.data) + N * P, 7.f);
    LayerBuffers w2 = w;
    w2.dpli_l = test::view_of(dpli2, {N, P});
    prog.layer_recompute(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}),
                         test::view_of(scratch, {N, H}), w2, d, host_rope.views, *st);
    std::vector<float> dy2 = R;
    prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, g2.data(), DType::F32),
                        test::view_of(x, {N, H}), test::view_of(dy2, {N, H}), test::view_of(dx2, {N, H}), w2, d,
                        host_rope.views, *st);
    dev->synchronize(*st);
    EXPECT_EQ(g2, grads);
    EXPECT_EQ(dx2, dx);
    EXPECT_EQ(dpli2, dpli);
  }
  expect_fd(x, dx, forward, "dx", 30);
  expect_fd(pli, dpli, forward, "dpli", 30);
  for (const BlobEntry& e : blob.entries) {
    std::vector<size_t> idx;
    for (size_t i : test::sample_indices(size_t(e.numel), 8, uint64_t(e.offset))) idx.push_back(size_t(e.offset) + i);
    const std::vector<double> num = test::numeric_grad(params, idx, 1e-2, forward);
    EXPECT_LE(test::rel_err(test::gather(grads, idx), num), 5e-3) << e.name;
  }
}
INSTANTIATE_TEST_SUITE_P(Layers, Gemma4PleLayerGrad, ::testing::Values(1, 2),
                         [](const auto& info) { return info.param == 2 ? "global" : "local"; });

// vocab_size_per_layer_input below vocab_size: transformers looks the ids past the per-layer table
// up as its row 0 (ids_or_zero). Against the same model whose table has every row, the rows past
// 30 copies of row 0: the same loss and gradients bit for bit (the table's rows they share too:
// row 0 is the padding row, which takes no gradient either way).
TEST(Gemma4Ple, IdsPastAShortTableLookUpRowZero) {
  auto dev = make_cpu_device();
  nlohmann::json cs = test::tiny_config("gemma4_ple");
  cs["vocab_size_per_layer_input"] = 30;  // vocab 37
  const nlohmann::json cf = test::tiny_config("gemma4_ple");
  ASSERT_EQ(cf["vocab_size_per_layer_input"], 37);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 9;
  ResidentEngine a(*dev, parse_model_spec(cs, "short.json"), eo), b(*dev, parse_model_spec(cf, "full.json"), eo);
  a.init_random(5);
  test::NamedTensors pa = test::export_params(a), pb = pa;
  const std::string table = "model.embed_tokens_per_layer.weight";
  bool found = false;
  for (auto& t : pb)
    if (t.name == table) {
      found = true;
      ASSERT_EQ(t.shape[0], 30);
      const int64_t LP = t.shape[1];
      for (int64_t r = 30; r < 37; ++r) t.data.insert(t.data.end(), t.data.begin(), t.data.begin() + LP);
      t.shape[0] = 37;
    }
  ASSERT_TRUE(found);
  test::import_params(b, pb);
  std::vector<Record> recs(2);
  recs[0].ids = {1, 31, 36, 5, 30, 29, 0, 33, 2};
  recs[1].ids = {35, 4, 32, 30, 7};
  for (auto& r : recs) r.labels = r.ids;
  const Batch batch = make_batch({&recs[0], &recs[1]}, 9);
  double loss[2];
  test::NamedTensors grads[2];
  for (int k = 0; k < 2; ++k) {
    ResidentEngine& e = k == 0 ? a : b;
    e.zero_grads();
    e.forward_backward(batch, 0.1f, true);
    loss[k] = e.take_loss_sum();
    grads[k] = test::export_grads(e);
  }
  EXPECT_EQ(loss[0], loss[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    SCOPED_TRACE(grads[0][i].name);
    std::vector<float> g1 = grads[1][i].data;
    if (grads[0][i].name == table) g1.resize(grads[0][i].data.size());  // the rows both tables have
    EXPECT_EQ(grads[0][i].data, g1);
  }
}

}  // namespace
}  // namespace sf
