// CPU reference kernels, mixture of experts: router softmax + top-k, the counting sort by expert,
// grouped GEMMs, combine and the load-balancing loss. Forward against fp64 formulas written here;
// the backward of the whole MoE block (kernels composed as model/moe_program.cpp does) against
// central finite differences of the fp64 block (top-k held: the step never changes a choice).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels.h"
#include "test_util.h"

namespace sf {
namespace {

using test::HostTensor;
using test::rel_err;
using test::view_of;

// ---------------------------------------------------------------- fp64 reference

struct MoeShape {
  int N, H, E, k, I;
  int64_t stride() const { return int64_t(I) * H + 5; }  // padded rows, as the layout's alignment gives
};

struct MoeWeights {
  std::vector<float> x;       // [N, H]
  std::vector<float> wr;      // [E, H]
  std::vector<float> wg, wu;  // [E, stride] each [I, H]
  std::vector<float> wd;      // [E, stride] each [H, I]
};

MoeWeights random_weights(const MoeShape& s, uint64_t seed) {
  MoeWeights w;
  w.x = test::randn(size_t(s.N) * s.H, seed);
  w.wr = test::randn(size_t(s.E) * s.H, seed + 1, 0.7f);
  w.wg = test::randn(size_t(s.E) * s.stride(), seed + 2, 0.4f);
  w.wu = test::randn(size_t(s.E) * s.stride(), seed + 3, 0.4f);
  w.wd = test::randn(size_t(s.E) * s.stride(), seed + 4, 0.4f);
  return w;
}

// Top-k of a row, descending, ties to the lower index.
std::vector<int> topk(const std::vector<double>& p, int k) {
  std::vector<int> idx;
  std::vector<char> taken(p.size(), 0);
  for (int j = 0; j < k; ++j) {
    int best = 0;
    while (taken[size_t(best)]) ++best;
    for (int e = best + 1; e < int(p.size()); ++e)
      if (!taken[size_t(e)] && p[size_t(e)] > p[size_t(best)]) best = e;
    taken[size_t(best)] = 1;
    idx.push_back(best);
  }
  return idx;
}

// The whole block in fp64: y [N, H]; probs [N, E]; counts [E] (top-k picks).
struct MoeRef {
  std::vector<double> y, probs, counts;
  std::vector<int> idx;
};

template <class W>
MoeRef ref_moe(const MoeShape& s, const W& w, bool renorm) {
  MoeRef r;
  r.y.assign(size_t(s.N) * s.H, 0.0);
  r.probs.assign(size_t(s.N) * s.E, 0.0);
  r.counts.assign(size_t(s.E), 0.0);
  const int64_t st = s.stride();
  for (int n = 0; n < s.N; ++n) {
    std::vector<double> p(size_t(s.E));
    double mx = -1e300;
    for (int e = 0; e < s.E; ++e) {
      double z = 0;
      for (int h = 0; h < s.H; ++h) z += double(w.wr[size_t(e) * s.H + h]) * w.x[size_t(n) * s.H + h];
      p[size_t(e)] = z;
      mx = std::max(mx, z);
    }
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - mx));
    for (int e = 0; e < s.E; ++e) r.probs[size_t(n) * s.E + e] = (p[size_t(e)] /= sum);
    const std::vector<int> idx = topk(p, s.k);
    double ws = 0;
    for (int e : idx) ws += p[size_t(e)];
    for (int j = 0; j < s.k; ++j) {
      const int e = idx[size_t(j)];
      r.idx.push_back(e);
      r.counts[size_t(e)] += 1;
      const double wj = renorm ? p[size_t(e)] / ws : p[size_t(e)];
      std::vector<double> act(size_t(s.I));
      for (int i = 0; i < s.I; ++i) {
        double g = 0, u = 0;
        for (int h = 0; h < s.H; ++h) {
          const double xv = w.x[size_t(n) * s.H + h];
          g += double(w.wg[size_t(e * st + int64_t(i) * s.H + h)]) * xv;
          u += double(w.wu[size_t(e * st + int64_t(i) * s.H + h)]) * xv;
        }
        act[size_t(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (int h = 0; h < s.H; ++h) {
        double o = 0;
        for (int i = 0; i < s.I; ++i) o += double(w.wd[size_t(e * st + int64_t(h) * s.I + i)]) * act[size_t(i)];
        r.y[size_t(n) * s.H + h] += wj * o;
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------- the kernels, composed

struct MoeRun {
  std::vector<float> y, probs, wt, stats;
  std::vector<int32_t> idx, offsets, sorted_slot, slot_pos;
  std::vector<float> dx, dwr, dwg, dwu, dwd;
};

// Forward as moe_program.cpp, then (with dy) the backward; aux_scale * counts joins d(probs).
MoeRun run_moe(const MoeShape& s, MoeWeights w, bool renorm, const std::vector<float>& dy, float aux_scale) {
  const int64_t N = s.N, H = s.H, E = s.E, k = s.k, S = N * k, I = s.I, st = s.stride();
  MoeRun r;
  std::vector<float> logits(size_t(N * E));
  r.probs.resize(size_t(N * E));
  r.wt.resize(size_t(N * k));
  r.stats.assign(size_t(2 * E), 0.f);
  r.idx.resize(size_t(N * k));
  r.offsets.resize(size_t(E + 1));
  r.sorted_slot.resize(size_t(S));
  r.slot_pos.resize(size_t(S));
  std::vector<float> xs(size_t(S * H)), eg(size_t(S * I)), eu(size_t(S * I)), ea(size_t(S * I)), ys(size_t(S * H));
  r.y.resize(size_t(N * H));
  Tensor offs = view_of(r.offsets, {E + 1});
  cpu::matmul(view_of(logits, {N, E}), view_of(w.x, {N, H}), view_of(w.wr, {E, H}), false, true, 1.f, 0.f);
  cpu::moe_route(view_of(r.probs, {N, E}), view_of(r.idx, {N, k}), view_of(r.wt, {N, k}), view_of(r.stats, {2 * E}),
                 view_of(logits, {N, E}), renorm);
  cpu::moe_permute(offs, view_of(r.sorted_slot, {S}), view_of(r.slot_pos, {S}), view_of(r.idx, {N, k}));
  cpu::moe_gather(view_of(xs, {S, H}), view_of(w.x, {N, H}), view_of(r.sorted_slot, {S}), int(k));
  cpu::moe_grouped_matmul(view_of(eg, {S, I}), view_of(xs, {S, H}), view_of(w.wg, {E, st}), offs, true, 0.f);
  cpu::moe_grouped_matmul(view_of(eu, {S, I}), view_of(xs, {S, H}), view_of(w.wu, {E, st}), offs, true, 0.f);
  cpu::swiglu_forward(view_of(ea, {S, I}), view_of(eg, {S, I}), view_of(eu, {S, I}));
  cpu::moe_grouped_matmul(view_of(ys, {S, H}), view_of(ea, {S, I}), view_of(w.wd, {E, st}), offs, true, 0.f);
  cpu::moe_combine(view_of(r.y, {N, H}), view_of(ys, {S, H}), view_of(r.wt, {N, k}), view_of(r.slot_pos, {S}));
  if (dy.empty()) return r;

  std::vector<float> g = dy, dys(size_t(S * H)), dwt(size_t(N * k)), dact(size_t(S * I)), deg(size_t(S * I)),
                     deu(size_t(S * I)), dxs(size_t(S * H)), dlogits(size_t(N * E));
  r.dwr.assign(size_t(E * H), 0.f);
  r.dwg.assign(size_t(E * st), 0.f);
  r.dwu.assign(size_t(E * st), 0.f);
  r.dwd.assign(size_t(E * st), 0.f);
  r.dx.resize(size_t(N * H));
  cpu::moe_combine_backward(view_of(dys, {S, H}), view_of(dwt, {N, k}), view_of(g, {N, H}), view_of(ys, {S, H}),
                            view_of(r.wt, {N, k}), view_of(r.slot_pos, {S}));
  cpu::moe_grouped_matmul_wgrad(view_of(r.dwd, {E, st}), view_of(dys, {S, H}), view_of(ea, {S, I}), offs);
  cpu::moe_grouped_matmul(view_of(dact, {S, I}), view_of(dys, {S, H}), view_of(w.wd, {E, st}), offs, false, 0.f);
  cpu::swiglu_backward(view_of(deg, {S, I}), view_of(deu, {S, I}), view_of(dact, {S, I}), view_of(eg, {S, I}),
                       view_of(eu, {S, I}));
  cpu::moe_grouped_matmul_wgrad(view_of(r.dwg, {E, st}), view_of(deg, {S, I}), view_of(xs, {S, H}), offs);
  cpu::moe_grouped_matmul_wgrad(view_of(r.dwu, {E, st}), view_of(deu, {S, I}), view_of(xs, {S, H}), offs);
  cpu::moe_grouped_matmul(view_of(dxs, {S, H}), view_of(deg, {S, I}), view_of(w.wg, {E, st}), offs, false, 0.f);
  cpu::moe_grouped_matmul(view_of(dxs, {S, H}), view_of(deu, {S, I}), view_of(w.wu, {E, st}), offs, false, 1.f);
  cpu::moe_gather_backward(view_of(r.dx, {N, H}), view_of(dxs, {S, H}), view_of(r.slot_pos, {S}), int(k));
  std::vector<float> counts(r.stats.begin(), r.stats.begin() + E);
  cpu::moe_route_backward(view_of(dlogits, {N, E}), view_of(dwt, {N, k}), view_of(r.probs, {N, E}),
                          view_of(r.idx, {N, k}), renorm, aux_scale != 0.f ? view_of(counts, {E}) : Tensor(),
                          aux_scale);
  cpu::matmul(view_of(r.dx, {N, H}), view_of(dlogits, {N, E}), view_of(w.wr, {E, H}), false, false, 1.f, 1.f);
  cpu::matmul(view_of(r.dwr, {E, H}), view_of(dlogits, {N, E}), view_of(w.x, {N, H}), true, false, 1.f, 1.f);
  return r;
}

// ---------------------------------------------------------------- forward

TEST(CpuMoe, RouteMatchesFp64AndPermutationIsAStableCountingSort) {
  for (bool renorm : {false, true}) {
    const MoeShape s{13, 7, 6, 3, 5};
    const MoeWeights w = random_weights(s, 11);
    const MoeRun r = run_moe(s, w, renorm, {}, 0.f);
    const MoeRef ref = ref_moe(s, w, renorm);
    SF_EXPECT_REL_ERR(r.probs, ref.probs, 1e-6);
    SF_EXPECT_REL_ERR(r.y, ref.y, 1e-5);
    ASSERT_EQ(std::vector<int>(r.idx.begin(), r.idx.end()), ref.idx);
    for (int n = 0; n < s.N; ++n) {
      double sum = 0;
      for (int j = 0; j < s.k; ++j) {
        sum += r.wt[size_t(n * s.k + j)];
        if (j > 0) {
          EXPECT_GE(r.wt[size_t(n * s.k + j - 1)], r.wt[size_t(n * s.k + j)]);  // descending
        }
      }
      if (renorm) {
        EXPECT_NEAR(sum, 1.0, 1e-6);
      }
    }
    // stats: counts and column sums of probs.
    for (int e = 0; e < s.E; ++e) {
      EXPECT_EQ(r.stats[size_t(e)], float(ref.counts[size_t(e)]));
      double ps = 0;
      for (int n = 0; n < s.N; ++n) ps += ref.probs[size_t(n * s.E + e)];
      EXPECT_NEAR(r.stats[size_t(s.E + e)], ps, 1e-5);
    }
    // Counting sort: offsets are the running counts; sorted rows of one expert in slot order;
    // slot_pos inverts sorted_slot.
    EXPECT_EQ(r.offsets[0], 0);
    EXPECT_EQ(r.offsets[size_t(s.E)], s.N * s.k);
    for (int e = 0; e < s.E; ++e) {
      EXPECT_EQ(r.offsets[size_t(e + 1)] - r.offsets[size_t(e)], int(ref.counts[size_t(e)]));
      for (int p = r.offsets[size_t(e)]; p < r.offsets[size_t(e + 1)]; ++p) {
        EXPECT_EQ(r.idx[size_t(r.sorted_slot[size_t(p)])], e);
        if (p > r.offsets[size_t(e)]) {
          EXPECT_LT(r.sorted_slot[size_t(p - 1)], r.sorted_slot[size_t(p)]);
        }
      }
    }
    for (int q = 0; q < s.N * s.k; ++q) EXPECT_EQ(r.slot_pos[size_t(r.sorted_slot[size_t(q)])], q);
  }
}

TEST(CpuMoe, TopKTiesPickTheLowerExpertAndNaNKeepsIndicesValid) {
  const int64_t N = 2, E = 5, k = 2;
  std::vector<float> logits = {1.f, 3.f, 2.f, 3.f, 0.f,  // tie between experts 1 and 3
                               NAN, NAN, NAN, NAN, NAN};
  std::vector<float> probs(size_t(N * E)), wt(size_t(N * k));
  std::vector<int32_t> idx(size_t(N * k), -7);
  cpu::moe_route(view_of(probs, {N, E}), view_of(idx, {N, k}), view_of(wt, {N, k}), Tensor(), view_of(logits, {N, E}),
                 true);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  for (int32_t i : idx) EXPECT_TRUE(i >= 0 && i < E);  // NaN row: still experts the permutation accepts
}

// Experts with no rows and one expert with every row: the grouped GEMM equals per-expert plain
// GEMMs, wgrad leaves empty experts' gradients as they were, bf16 storage rounds once.
TEST(CpuMoe, GroupedMatmulSkewedRoutingAndBf16) {
  const int64_t E = 4, K = 9, Nout = 7, stride = K * Nout + 3;
  for (const std::vector<int32_t>& offsets :
       {std::vector<int32_t>{0, 0, 11, 11, 11}, std::vector<int32_t>{0, 3, 3, 8, 11},
        std::vector<int32_t>{0, 0, 0, 0, 0}}) {
    const int64_t M = 11;
    auto a = test::randn(size_t(M * K), 21), w = test::randn(size_t(E * stride), 22);
    auto offs = offsets;
    for (bool trans : {true, false}) {
      std::vector<float> out(size_t(M * Nout), 0.5f), ref(size_t(M * Nout), 0.5f);
      cpu::moe_grouped_matmul(view_of(out, {M, Nout}), view_of(a, {M, K}), view_of(w, {E, stride}),
                              view_of(offs, {E + 1}), trans, 1.f);
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = offs[size_t(e)], r1 = offs[size_t(e + 1)];
        if (r1 == r0) continue;
        std::vector<float> we(w.begin() + e * stride, w.begin() + e * stride + K * Nout);
        std::vector<float> ae(a.begin() + r0 * K, a.begin() + r1 * K),
            oe(ref.begin() + r0 * Nout, ref.begin() + r1 * Nout);
        cpu::matmul(view_of(oe, {r1 - r0, Nout}), view_of(ae, {r1 - r0, K}),
                    trans ? view_of(we, {Nout, K}) : view_of(we, {K, Nout}), false, trans, 1.f, 1.f);
        std::copy(oe.begin(), oe.end(), ref.begin() + r0 * Nout);
      }
      EXPECT_LE(test::max_abs_diff(out, ref), 1e-5);
      for (int64_t r = offs[size_t(E)]; r < M; ++r)  // rows past the last expert are not touched
        for (int64_t c = 0; c < Nout; ++c) EXPECT_EQ(out[size_t(r * Nout + c)], 0.5f);
    }
    // wgrad: dW_e += dy_e^T x_e; experts without rows keep their values (here 0.25).
    auto dy = test::randn(size_t(M * Nout), 23);
    std::vector<float> dw(size_t(E * stride), 0.25f);
    cpu::moe_grouped_matmul_wgrad(view_of(dw, {E, stride}), view_of(dy, {M, Nout}), view_of(a, {M, K}),
                                  view_of(offs, {E + 1}));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t o = 0; o < Nout; ++o) {
        for (int64_t c = 0; c < K; ++c) {
          double v = 0.25;
          for (int64_t r = offs[size_t(e)]; r < offs[size_t(e + 1)]; ++r)
            v += double(dy[size_t(r * Nout + o)]) * a[size_t(r * K + c)];
          ASSERT_NEAR(dw[size_t(e * stride + o * K + c)], v, 1e-4) << e << " " << o << " " << c;
        }
      }
      for (int64_t i = K * Nout; i < stride; ++i) EXPECT_EQ(dw[size_t(e * stride + i)], 0.25f);  // padding
    }
    // BF16 storage of a, w and out: the fp32 result on the rounded inputs, rounded once.
    auto ar = test::round_bf16(a), wr = test::round_bf16(w);
    HostTensor ab(ar, DType::BF16, {M, K}), wb(wr, DType::BF16, {E, stride}), ob(DType::BF16, {M, Nout});
    std::vector<float> of(size_t(M * Nout), 0.f);
    cpu::moe_grouped_matmul(ob.t(), ab.t(), wb.t(), view_of(offs, {E + 1}), true, 0.f);
    cpu::moe_grouped_matmul(view_of(of, {M, Nout}), view_of(ar, {M, K}), view_of(wr, {E, stride}),
                            view_of(offs, {E + 1}), true, 0.f);
    for (int64_t i = 0; i < offs[size_t(E)] * Nout; ++i) ASSERT_EQ(ob.get(i), test::round_bf16(of[size_t(i)])) << i;
  }
}

TEST(CpuMoe, AuxLossIsCoefTimesCountsDotProbSums) {
  std::vector<float> stats = {2.f, 0.f, 4.f, 0.5f, 0.25f, 0.125f}, loss = {1.f};
  cpu::moe_aux_loss(view_of(loss, {1}), view_of(stats, {6}), 3.f);
  EXPECT_FLOAT_EQ(loss[0], 1.f + 3.f * (2 * 0.5f + 0 * 0.25f + 4 * 0.125f));
}

// Gemma 4's per-expert scale: out = w * scale[idx] exactly (F32 and BF16 scales); the backward's
// dscale (+=, every expert incl. one no slot chose) and dw against central differences of
// L = sum R * out, with dw aliasing dout as the program calls it.
TEST(CpuMoe, ExpertScaleForwardAndBackward) {
  const int64_t N = 7, k = 3, E = 5, S = N * k;
  std::vector<int32_t> idx(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) idx[size_t(i)] = int32_t((i * 3 + i / k) % (E - 1));  // expert 4: no slot
  std::vector<float> w = test::randn(size_t(S), 1), sc = test::randn(size_t(E), 2, 0.5f, 1.f),
                     R = test::randn(size_t(S), 3), out = std::vector<float>(size_t(S));
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dt == DType::F32 ? "F32 scale" : "BF16 scale");
    HostTensor scale(dt, {E});
    for (int64_t e = 0; e < E; ++e) scale.set(e, sc[size_t(e)]);
    cpu::moe_expert_scale(view_of(out, {N, k}), view_of(w, {N, k}), view_of(idx, {N, k}), scale.view);
    for (int64_t i = 0; i < S; ++i) ASSERT_EQ(out[size_t(i)], w[size_t(i)] * scale.get(idx[size_t(i)])) << i;
  }
  std::vector<float> dscale(size_t(E), 0.5f), g = R;  // dscale accumulates onto 0.5
  cpu::moe_expert_scale_backward(view_of(g, {N, k}), view_of(dscale, {E}), view_of(g, {N, k}), view_of(w, {N, k}),
                                 view_of(idx, {N, k}), view_of(sc, {E}));
  EXPECT_EQ(dscale[size_t(E - 1)], 0.5f);
  auto loss = [&] {
    double l = 0;
    for (int64_t i = 0; i < S; ++i) l += double(R[size_t(i)]) * w[size_t(i)] * sc[size_t(idx[size_t(i)])];
    return l;
  };
  std::vector<size_t> all_e(static_cast<size_t>(E)), all_s(static_cast<size_t>(S));
  for (size_t e = 0; e < all_e.size(); ++e) all_e[e] = e;
  for (size_t i = 0; i < all_s.size(); ++i) all_s[i] = i;
  std::vector<float> ds(dscale);
  for (float& v : ds) v -= 0.5f;
  EXPECT_LE(rel_err(test::gather(ds, all_e), test::numeric_grad(sc, all_e, 1e-2, loss)), 1e-4);
  EXPECT_LE(rel_err(test::gather(g, all_s), test::numeric_grad(w, all_s, 1e-2, loss)), 1e-4);
}

TEST(CpuMoe, PermuteRejectsAnExpertOutOfRange) {
  std::vector<int32_t> idx = {0, 3}, offs(4), ss(2), sp(2);
  test::expect_check_failure(
      [&] {
        cpu::moe_permute(view_of(offs, {4}), view_of(ss, {2}), view_of(sp, {2}), view_of(idx, {1, 2}));
      },
      "moe.cpp", "out of [0, 3)");
}

// ---------------------------------------------------------------- backward

// L = <y, R> + a * sum_e counts_e * sum_n probs[n, e] (the load-balancing loss's form, counts
// held): every gradient against central differences of the fp64 block.
TEST(CpuMoe, BlockBackwardMatchesFiniteDifferences) {
  struct Case {
    MoeShape s;
    bool renorm;
    float aux;
  };
  for (const Case& c : {Case{{9, 6, 5, 2, 4}, false, 0.f}, Case{{9, 6, 5, 2, 4}, true, 0.f},
                        Case{{7, 5, 4, 3, 3}, true, 0.37f}, Case{{8, 4, 3, 1, 5}, false, 0.21f}}) {
    const MoeShape& s = c.s;
    MoeWeights w = random_weights(s, 31 + uint64_t(s.N));
    const auto R = test::randn(size_t(s.N) * s.H, 99);
    const MoeRun r = run_moe(s, w, c.renorm, R, c.aux);
    const MoeRef base = ref_moe(s, w, c.renorm);
    auto L = [&] {
      const MoeRef f = ref_moe(s, w, c.renorm);
      EXPECT_EQ(f.idx, base.idx) << "a finite-difference step changed the routing";
      double l = test::dot(f.y, R);
      for (int e = 0; e < s.E; ++e) {
        double ps = 0;
        for (int n = 0; n < s.N; ++n) ps += f.probs[size_t(n * s.E + e)];
        l += double(c.aux) * base.counts[size_t(e)] * ps;
      }
      return l;
    };
    const double eps = 1e-3;  // fp32 weights: a step well above their ulp; the block is smooth there
    auto check = [&](std::vector<float>& x, const std::vector<float>& g, const char* what, size_t limit) {
      std::vector<size_t> idx;
      for (size_t i : test::sample_indices(x.size(), limit, 7)) idx.push_back(i);
      const auto fd = test::numeric_grad(x, idx, eps, L);
      EXPECT_LE(rel_err(test::gather(g, idx), fd), 2e-3) << what << " renorm=" << c.renorm << " aux=" << c.aux;
    };
    check(w.x, r.dx, "dx", 60);
    check(w.wr, r.dwr, "d router", 60);
    // Expert matrices: only their [I*H] parts are weights; padding has no gradient.
    std::vector<size_t> wi;
    for (int e = 0; e < s.E; ++e)
      for (int64_t i = 0; i < int64_t(s.I) * s.H; ++i) wi.push_back(size_t(e * s.stride() + i));
    for (auto [x, g, what] : {std::tuple{&w.wg, &r.dwg, "d gate"}, std::tuple{&w.wu, &r.dwu, "d up"},
                              std::tuple{&w.wd, &r.dwd, "d down"}}) {
      const auto fd = test::numeric_grad(*x, wi, eps, L);
      EXPECT_LE(rel_err(test::gather(*g, wi), fd), 2e-3) << what << " renorm=" << c.renorm << " aux=" << c.aux;
    }
  }
}

}  // namespace
}  // namespace sf
