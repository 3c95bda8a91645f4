// CPU reference kernels, part 2: causal GQA attention and the fused linear cross-entropy.
// Forwards against explicit fp64 formulas (a full T x T softmax matrix, full logits);
// backwards against central finite differences of those fp64 formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "cpu_front.h"
#include "test_util.h"

namespace sf {
namespace {

using test::CpuFront;
using test::expect_check_failure;
using test::HostTensor;
using test::kBf16Eps;
using test::kNaN;
using test::max_rel_err;
using test::rel_err;
using test::to_double;

// ---------------------------------------------------------------- attention

// HF eager attention in fp64: P = softmax(scale q k^T + causal mask) as an explicit T x T
// matrix per (b, h), out = P v; query head h reads kv head h / (n_head / n_kv_head). With pos
// (packed rows) the mask is block-diagonal causal: key j visible to query i iff
// i - pos[i] <= j <= i.
void ref_attention(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                   const AttnDims& d, std::vector<double>& out, std::vector<double>* lse,
                   const std::vector<int32_t>* pos = nullptr) {
  const int T = d.T, hd = d.head_dim, qw = d.n_head * hd, kw = d.n_kv_head * hd, grp = d.n_head / d.n_kv_head;
  out.assign(size_t(d.B) * T * qw, 0.0);
  if (lse) lse->assign(size_t(d.B) * d.n_head * T, 0.0);
  std::vector<double> P(size_t(T) * T);  // [T, T]
  for (int b = 0; b < d.B; ++b) {
    for (int h = 0; h < d.n_head; ++h) {
      const int g = h / grp;
      for (int i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < T; ++j) {
          double s = -INFINITY;  // masked
          int lo = pos ? i - (*pos)[size_t(b) * T + i] : 0;
          if (d.window > 0) lo = std::max(lo, i - d.window + 1);  // sliding window
          if (j <= i && j >= lo) {
            s = 0;
            for (int e = 0; e < hd; ++e) {
              s += q[(size_t(b) * T + i) * qw + h * hd + e] * k[(size_t(b) * T + j) * kw + g * hd + e];
            }
            s *= d.scale;
          }
          P[size_t(i) * T + j] = s;
          mx = std::max(mx, s);
        }
        double sum = 0;
        for (int j = 0; j < T; ++j) sum += std::exp(P[size_t(i) * T + j] - mx);
        for (int j = 0; j < T; ++j) P[size_t(i) * T + j] = std::exp(P[size_t(i) * T + j] - mx) / sum;
        if (lse) (*lse)[(size_t(b) * d.n_head + h) * T + i] = mx + std::log(sum);
      }
      for (int i = 0; i < T; ++i) {
        for (int e = 0; e < hd; ++e) {
          double acc = 0;
          for (int j = 0; j < T; ++j) acc += P[size_t(i) * T + j] * v[(size_t(b) * T + j) * kw + g * hd + e];
          out[(size_t(b) * T + i) * qw + h * hd + e] = acc;
        }
      }
    }
  }
}

AttnDims dims(int B, int T, int nh, int nkv, int hd) {
  AttnDims d;
  d.B = B, d.T = T, d.n_head = nh, d.n_kv_head = nkv, d.head_dim = hd;
  d.scale = 1.f / std::sqrt(float(hd));
  return d;
}

// Odd shapes: T = 1, 5, 7, 33; GQA ratios 1, 2, 4 (and 4 with one kv head); head_dim 8, 16.
std::vector<AttnDims> attn_cases() {
  std::vector<AttnDims> c = {dims(1, 1, 2, 2, 8), dims(2, 7, 4, 4, 8), dims(2, 7, 4, 2, 16), dims(1, 33, 8, 2, 16),
                             dims(3, 5, 4, 1, 8)};
  c.back().scale = 0.3f;  // a non-default scale
  return c;
}

std::string name(const AttnDims& d) {
  return "B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) + " nh=" + std::to_string(d.n_head) +
         " nkv=" + std::to_string(d.n_kv_head) + " hd=" + std::to_string(d.head_dim);
}

struct AttnData {
  std::vector<float> q, k, v;
  explicit AttnData(const AttnDims& d, uint64_t seed) {
    const size_t N = size_t(d.B) * d.T;
    // Std 1.5: scores of a few units, so the softmax is neither uniform nor one-hot.
    q = test::randn(N * d.n_head * d.head_dim, seed, 1.5f);
    k = test::randn(N * d.n_kv_head * d.head_dim, seed + 1, 1.5f);
    v = test::randn(N * d.n_kv_head * d.head_dim, seed + 2);
  }
};

TEST(CpuKernels, AttentionForwardMatchesExplicitSoftmax) {
  uint64_t seed = 200;
  for (const AttnDims& d : attn_cases()) {
    SCOPED_TRACE(name(d));
    AttnData a(d, seed += 10);
    const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
    std::vector<float> out(size_t(N) * qw, kNaN), lse(size_t(d.B) * d.n_head * d.T, kNaN);
    cpu::attention_forward(test::view_of(out, {N, qw}), test::view_of(lse, {d.B, d.n_head, d.T}),
                           test::view_of(a.q, {N, qw}), test::view_of(a.k, {N, kw}), test::view_of(a.v, {N, kw}), d);
    std::vector<double> rout, rlse;
    ref_attention(to_double(a.q), to_double(a.k), to_double(a.v), d, rout, &rlse);
    // The kernel works in fp64 on the fp32 inputs: only the final fp32 rounding remains.
    EXPECT_LE(rel_err(out, rout), 1e-6);
    EXPECT_LE(max_rel_err(lse, rlse, 1e-3), 1e-6);
  }
}

TEST(CpuKernels, AttentionBackwardMatchesFiniteDifferences) {
  uint64_t seed = 300;
  for (const AttnDims& d : attn_cases()) {
    SCOPED_TRACE(name(d));
    AttnData a(d, seed += 10);
    const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
    std::vector<float> out(size_t(N) * qw), lse(size_t(d.B) * d.n_head * d.T);
    cpu::attention_forward(test::view_of(out, {N, qw}), test::view_of(lse, {d.B, d.n_head, d.T}),
                           test::view_of(a.q, {N, qw}), test::view_of(a.k, {N, kw}), test::view_of(a.v, {N, kw}), d);
    // L = sum(out * R), so dout = R. Gradients are overwritten: start from garbage.
    auto R = test::randn(out.size(), seed + 5);
    std::vector<float> dq(a.q.size(), kNaN), dk(a.k.size(), kNaN), dv(a.v.size(), kNaN);
    HostTensor ws(DType::F32, {int64_t(cpu::attention_workspace_bytes(d) / 4) + 1});
    cpu::attention_backward(test::view_of(dq, {N, qw}), test::view_of(dk, {N, kw}), test::view_of(dv, {N, kw}),
                            test::view_of(R, {N, qw}), test::view_of(a.q, {N, qw}), test::view_of(a.k, {N, kw}),
                            test::view_of(a.v, {N, kw}), test::view_of(out, {N, qw}),
                            test::view_of(lse, {d.B, d.n_head, d.T}), d, ws.t());
    auto qd = to_double(a.q), kd = to_double(a.k), vd = to_double(a.v);
    auto L = [&] {
      std::vector<double> o;
      ref_attention(qd, kd, vd, d, o, nullptr);
      return test::dot(o, R);
    };
    // fp64 central differences, eps 1e-5: truncation ~1e-10, cancellation ~1e-11 -> the FD is
    // exact to ~1e-9 relative. The kernel reads the fp32-rounded out and lse (D = dO.O and
    // p = exp(s - lse)): ~1e-7 relative error in p, so 1e-5 leaves a wide margin while any
    // formula or indexing mistake gives O(1). Large tensors: a sample of 150 coordinates.
    auto iq = test::sample_indices(qd.size(), 150, 1), ik = test::sample_indices(kd.size(), 150, 2),
         iv = test::sample_indices(vd.size(), 150, 3);
    EXPECT_LE(rel_err(test::gather(dq, iq), test::numeric_grad(qd, iq, 1e-5, L)), 1e-5);
    EXPECT_LE(rel_err(test::gather(dk, ik), test::numeric_grad(kd, ik, 1e-5, L)), 1e-5);
    EXPECT_LE(rel_err(test::gather(dv, iv), test::numeric_grad(vd, iv, 1e-5, L)), 1e-5);
  }
}

TEST(CpuKernels, AttentionBf16Storage) {
  const AttnDims d = dims(2, 9, 4, 2, 16);
  AttnData a(d, 400);
  const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
  auto q = test::round_bf16(a.q), k = test::round_bf16(a.k), v = test::round_bf16(a.v);
  HostTensor qb(q, DType::BF16, {N, qw}), kb(k, DType::BF16, {N, kw}), vb(v, DType::BF16, {N, kw});
  HostTensor ob(DType::BF16, {N, qw});
  std::vector<float> lse_b(size_t(d.B) * d.n_head * d.T), lse(lse_b.size()), out(size_t(N) * qw);
  cpu::attention_forward(ob.t(), test::view_of(lse_b, {d.B, d.n_head, d.T}), qb.t(), kb.t(), vb.t(), d);
  cpu::attention_forward(test::view_of(out, {N, qw}), test::view_of(lse, {d.B, d.n_head, d.T}),
                         test::view_of(q, {N, qw}), test::view_of(k, {N, kw}), test::view_of(v, {N, kw}), d);
  // Exact conversion in, same fp64 math: the same lse bits, and out is one rounding of the F32 out.
  EXPECT_EQ(lse_b, lse);
  for (int i = 0; i < N * qw; ++i) ASSERT_EQ(ob.get(i), test::round_bf16(out[i])) << i;
  // Backward with BF16 everything vs F32 on the same (rounded) values, including the stored out.
  auto dout = test::round_bf16(test::randn(out.size(), 401));
  auto outr = ob.f();
  HostTensor gb(dout, DType::BF16, {N, qw}), dqb(DType::BF16, {N, qw}), dkb(DType::BF16, {N, kw}),
      dvb(DType::BF16, {N, kw});
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  cpu::attention_backward(dqb.t(), dkb.t(), dvb.t(), gb.t(), qb.t(), kb.t(), vb.t(), ob.t(),
                          test::view_of(lse, {d.B, d.n_head, d.T}), d, Tensor());
  cpu::attention_backward(test::view_of(dq, {N, qw}), test::view_of(dk, {N, kw}), test::view_of(dv, {N, kw}),
                          test::view_of(dout, {N, qw}), test::view_of(q, {N, qw}), test::view_of(k, {N, kw}),
                          test::view_of(v, {N, kw}), test::view_of(outr, {N, qw}),
                          test::view_of(lse, {d.B, d.n_head, d.T}), d, Tensor());
  for (size_t i = 0; i < dq.size(); ++i) ASSERT_EQ(dqb.get(int64_t(i)), test::round_bf16(dq[i])) << i;
  for (size_t i = 0; i < dk.size(); ++i) ASSERT_EQ(dkb.get(int64_t(i)), test::round_bf16(dk[i])) << i;
  for (size_t i = 0; i < dv.size(); ++i) ASSERT_EQ(dvb.get(int64_t(i)), test::round_bf16(dv[i])) << i;
}

TEST(CpuKernels, AttentionRejectsBadShapes) {
  AttnDims d = dims(1, 4, 4, 3, 8);  // 4 % 3 != 0
  std::vector<float> q(4 * 32), k(4 * 24), o(4 * 32), lse(16);
  CpuFront f;
  expect_check_failure(
      [&] {
        f.ops().attention_forward(test::view_of(o, {4, 32}), test::view_of(lse, {16}), test::view_of(q, {4, 32}),
                                  test::view_of(k, {4, 24}), test::view_of(k, {4, 24}), d, *f.s);
      },
      "ops_check.h", "bad dims");
  d = dims(1, 4, 4, 2, 8);  // k must be [4, 16]
  expect_check_failure(
      [&] {
        f.ops().attention_forward(test::view_of(o, {4, 32}), test::view_of(lse, {16}), test::view_of(q, {4, 32}),
                                  test::view_of(k, {4, 24}), test::view_of(k, {4, 24}), d, *f.s);
      },
      "ops_check.h", "n_kv_head*head_dim");
}

// ---------------------------------------------------------------- attention over packed rows

// pos [B*T] of rows holding records of the given lengths (each row's lengths sum to T).
// The backward at (q, k, v) of `a`, given its forward's out and lse, against central differences of
// the fp64 reference with the same mask (pos: packed rows or null). With one visible key a query's
// p is 1 and dq, dk are 0 up to rounding (one_key: compared absolutely).
void expect_backward_matches_fd(const AttnDims& d, const AttnData& a, const std::vector<float>& out,
                                const std::vector<float>& lse, const std::vector<int32_t>* pos, uint64_t seed,
                                bool one_key = false) {
  const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
  auto R = test::randn(out.size(), seed);
  std::vector<float> dq(a.q.size(), kNaN), dk(a.k.size(), kNaN), dv(a.v.size(), kNaN);
  auto q = a.q, k = a.k, v = a.v;
  auto o = out, l = lse;
  cpu::attention_backward(test::view_of(dq, {N, qw}), test::view_of(dk, {N, kw}), test::view_of(dv, {N, kw}),
                          test::view_of(R, {N, qw}), test::view_of(q, {N, qw}), test::view_of(k, {N, kw}),
                          test::view_of(v, {N, kw}), test::view_of(o, {N, qw}), test::view_of(l, {d.B, d.n_head, d.T}),
                          d, Tensor());
  auto qd = to_double(a.q), kd = to_double(a.k), vd = to_double(a.v);
  auto L = [&] {
    std::vector<double> ro;
    ref_attention(qd, kd, vd, d, ro, nullptr, pos);
    return test::dot(ro, R);
  };
  auto iq = test::sample_indices(qd.size(), 150, 1), ik = test::sample_indices(kd.size(), 150, 2),
       iv = test::sample_indices(vd.size(), 150, 3);
  if (one_key) {
    for (size_t i : iq) EXPECT_NEAR(dq[i], 0.f, 1e-5f);
    for (size_t i : ik) EXPECT_NEAR(dk[i], 0.f, 1e-5f);
  } else {
    EXPECT_LE(rel_err(test::gather(dq, iq), test::numeric_grad(qd, iq, 1e-5, L)), 1e-5);
    EXPECT_LE(rel_err(test::gather(dk, ik), test::numeric_grad(kd, ik, 1e-5, L)), 1e-5);
  }
  EXPECT_LE(rel_err(test::gather(dv, iv), test::numeric_grad(vd, iv, 1e-5, L)), 1e-5);
}

std::vector<int32_t> positions(const std::vector<std::vector<int>>& rows) {
  std::vector<int32_t> pos;
  for (const auto& row : rows)
    for (int n : row)
      for (int t = 0; t < n; ++t) pos.push_back(t);
  return pos;
}

struct SegCase {
  AttnDims d;
  std::vector<std::vector<int>> rows;  // record lengths per row
};

// Records of 1 token, records at tile-like boundaries, a row that is one record, GQA 1/2/4.
std::vector<SegCase> seg_cases() {
  return {{dims(2, 13, 4, 2, 8), {{5, 1, 7}, {13}}},
          {dims(1, 33, 8, 2, 16), {{10, 16, 7}}},
          {dims(3, 6, 4, 1, 8), {{1, 1, 1, 1, 1, 1}, {2, 4}, {6}}},
          {dims(1, 9, 2, 2, 8), {{3, 3, 3}}}};
}

TEST(CpuKernels, AttentionWithSegmentsMatchesExplicitSoftmax) {
  uint64_t seed = 900;
  for (SegCase c : seg_cases()) {
    const AttnDims& d0 = c.d;
    SCOPED_TRACE(name(d0));
    auto pos = positions(c.rows);
    AttnDims d = d0;
    const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
    ASSERT_EQ(int(pos.size()), N);
    d.pos = test::view_of(pos, {N});
    AttnData a(d, seed += 10);
    std::vector<float> out(size_t(N) * qw, kNaN), lse(size_t(d.B) * d.n_head * d.T, kNaN);
    cpu::attention_forward(test::view_of(out, {N, qw}), test::view_of(lse, {d.B, d.n_head, d.T}),
                           test::view_of(a.q, {N, qw}), test::view_of(a.k, {N, kw}), test::view_of(a.v, {N, kw}), d);
    std::vector<double> rout, rlse;
    ref_attention(to_double(a.q), to_double(a.k), to_double(a.v), d, rout, &rlse, &pos);
    EXPECT_LE(rel_err(out, rout), 1e-6);
    EXPECT_LE(max_rel_err(lse, rlse, 1e-3), 1e-6);
  }
}

// The backward of the block-diagonal attention against central differences of the fp64
// reference with the same mask (the bounds are those of the unpacked test above).
TEST(CpuKernels, AttentionWithSegmentsBackwardMatchesFiniteDifferences) {
  uint64_t seed = 1000;
  for (SegCase c : seg_cases()) {
    SCOPED_TRACE(name(c.d));
    auto pos = positions(c.rows);
    AttnDims d = c.d;
    const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
    d.pos = test::view_of(pos, {N});
    AttnData a(d, seed += 10);
    std::vector<float> out(size_t(N) * qw), lse(size_t(d.B) * d.n_head * d.T);
    cpu::attention_forward(test::view_of(out, {N, qw}), test::view_of(lse, {d.B, d.n_head, d.T}),
                           test::view_of(a.q, {N, qw}), test::view_of(a.k, {N, kw}), test::view_of(a.v, {N, kw}), d);
    expect_backward_matches_fd(d, a, out, lse, &pos, seed + 5);
  }
}

// Sliding-window attention (d.window): windows of 1 (a token sees only itself), shorter than,
// equal to and longer than T, with GQA and with packed rows (both bounds at once); forward against
// the explicit fp64 softmax with the banded mask, backward against its finite differences.
TEST(CpuKernels, AttentionWithWindowMatchesExplicitSoftmaxAndFiniteDifferences) {
  struct WinCase {
    AttnDims d;
    int window;
    std::vector<std::vector<int>> rows;  // record lengths per row; empty: unpacked
  };
  const std::vector<WinCase> cases = {{dims(2, 13, 4, 2, 8), 1, {}},
                                      {dims(1, 33, 8, 2, 16), 5, {}},
                                      {dims(3, 7, 4, 1, 8), 7, {}},
                                      {dims(1, 9, 2, 2, 8), 20, {}},
                                      {dims(2, 13, 4, 2, 8), 4, {{5, 1, 7}, {13}}}};
  uint64_t seed = 1500;
  for (const WinCase& c : cases) {
    AttnDims d = c.d;
    d.window = c.window;
    SCOPED_TRACE(name(d) + " window=" + std::to_string(c.window));
    const int N = d.B * d.T, qw = d.n_head * d.head_dim, kw = d.n_kv_head * d.head_dim;
    std::vector<int32_t> pos = positions(c.rows);
    if (!c.rows.empty()) d.pos = test::view_of(pos, {N});
    const std::vector<int32_t>* pp = c.rows.empty() ? nullptr : &pos;
    AttnData a(d, seed += 10);
    std::vector<float> out(size_t(N) * qw, kNaN), lse(size_t(d.B) * d.n_head * d.T, kNaN);
    cpu::attention_forward(test::view_of(out, {N, qw}), test::view_of(lse, {d.B, d.n_head, d.T}),
                           test::view_of(a.q, {N, qw}), test::view_of(a.k, {N, kw}), test::view_of(a.v, {N, kw}), d);
    std::vector<double> rout, rlse;
    ref_attention(to_double(a.q), to_double(a.k), to_double(a.v), d, rout, &rlse, pp);
    EXPECT_LE(rel_err(out, rout), 1e-6);
    EXPECT_LE(max_rel_err(lse, rlse, 1e-3), 1e-6);
    if (c.window == 1) {  // one visible key: out is v of the query's own kv head
      for (int h = 0; h < d.n_head; ++h)
        EXPECT_EQ(out[size_t(h) * d.head_dim], a.v[size_t(h / (d.n_head / d.n_kv_head)) * d.head_dim]);
    }
    expect_backward_matches_fd(d, a, out, lse, pp, seed + 5, c.window == 1);
  }
}

// A packed row gives, bit for bit, what each record gives alone in a row of its own (the same
// fp64 sums over the same keys in the same order): out, lse, dq, dk, dv.
TEST(CpuKernels, AttentionPackedRowEqualsRecordsAloneBitwise) {
  const std::vector<int> lens = {4, 1, 9, 6};
  const int T = 20, nh = 4, nkv = 2, hd = 8, qw = nh * hd, kw = nkv * hd;
  AttnDims d = dims(1, T, nh, nkv, hd);
  auto pos = positions({lens});
  d.pos = test::view_of(pos, {T});
  AttnData a(d, 1100);
  auto R = test::randn(size_t(T) * qw, 1101);
  std::vector<float> out(size_t(T) * qw), lse(size_t(nh) * T), dq(a.q.size()), dk(a.k.size()), dv(a.v.size());
  cpu::attention_forward(test::view_of(out, {T, qw}), test::view_of(lse, {1, nh, T}), test::view_of(a.q, {T, qw}),
                         test::view_of(a.k, {T, kw}), test::view_of(a.v, {T, kw}), d);
  cpu::attention_backward(test::view_of(dq, {T, qw}), test::view_of(dk, {T, kw}), test::view_of(dv, {T, kw}),
                          test::view_of(R, {T, qw}), test::view_of(a.q, {T, qw}), test::view_of(a.k, {T, kw}),
                          test::view_of(a.v, {T, kw}), test::view_of(out, {T, qw}), test::view_of(lse, {1, nh, T}), d,
                          Tensor());
  int at = 0;
  for (int n : lens) {
    SCOPED_TRACE("record at " + std::to_string(at));
    auto rows = [&](const std::vector<float>& x, int w) {
      return std::vector<float>(x.begin() + int64_t(at) * w, x.begin() + int64_t(at + n) * w);
    };
    auto q = rows(a.q, qw), k = rows(a.k, kw), v = rows(a.v, kw), r = rows(R, qw);
    const AttnDims e = dims(1, n, nh, nkv, hd);
    std::vector<float> o(size_t(n) * qw), l(size_t(nh) * n), gq(q.size()), gk(k.size()), gv(v.size());
    cpu::attention_forward(test::view_of(o, {n, qw}), test::view_of(l, {1, nh, n}), test::view_of(q, {n, qw}),
                           test::view_of(k, {n, kw}), test::view_of(v, {n, kw}), e);
    cpu::attention_backward(test::view_of(gq, {n, qw}), test::view_of(gk, {n, kw}), test::view_of(gv, {n, kw}),
                            test::view_of(r, {n, qw}), test::view_of(q, {n, qw}), test::view_of(k, {n, kw}),
                            test::view_of(v, {n, kw}), test::view_of(o, {n, qw}), test::view_of(l, {1, nh, n}), e,
                            Tensor());
    EXPECT_EQ(o, rows(out, qw));
    EXPECT_EQ(gq, rows(dq, qw));
    EXPECT_EQ(gk, rows(dk, kw));
    EXPECT_EQ(gv, rows(dv, kw));
    for (int h = 0; h < nh; ++h)
      for (int t = 0; t < n; ++t) EXPECT_EQ(l[size_t(h) * n + t], lse[size_t(h) * T + at + t]);
    at += n;
  }
}

TEST(CpuKernels, AttentionRejectsBadPositions) {
  AttnDims d = dims(1, 4, 2, 2, 8);
  std::vector<float> q(4 * 16), o(4 * 16), lse(8);
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{1, 2, 3, 4}, std::vector<int32_t>{0, 1, 3, 0}, std::vector<int32_t>{0, 1, 0, 2}}) {
    auto pos = bad;
    d.pos = test::view_of(pos, {4});
    expect_check_failure(
        [&] {
          cpu::attention_forward(test::view_of(o, {4, 16}), test::view_of(lse, {8}), test::view_of(q, {4, 16}),
                                 test::view_of(q, {4, 16}), test::view_of(q, {4, 16}), d);
        },
        "attention.cpp", "neither starts a record");
  }
}

// ---------------------------------------------------------------- linear cross-entropy

// Full logits in fp64, one row at a time: loss = sum over labelled rows of lse - logit[y];
// analytic dx = gs (softmax - onehot) w, dw = gs (softmax - onehot)^T x (checked by FD below).
struct RefCE {
  double loss = 0;
  std::vector<double> dx, dw;
};
RefCE ref_linear_ce(const std::vector<double>& x, const std::vector<double>& w, const std::vector<int32_t>& y, int N,
                    int H, int V, double gs, bool grads) {
  RefCE r;
  if (grads) r.dx.assign(size_t(N) * H, 0.0), r.dw.assign(size_t(V) * H, 0.0);
  std::vector<double> l(V);
  for (int n = 0; n < N; ++n) {
    if (y[n] == -100) continue;
    double mx = -INFINITY;
    for (int j = 0; j < V; ++j) {
      double s = 0;
      for (int c = 0; c < H; ++c) s += x[size_t(n) * H + c] * w[size_t(j) * H + c];
      l[j] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
    const double lse = mx + std::log(sum);
    r.loss += lse - l[y[n]];
    if (!grads) continue;
    for (int j = 0; j < V; ++j) {
      const double g = gs * (std::exp(l[j] - lse) - (j == y[n] ? 1.0 : 0.0));
      for (int c = 0; c < H; ++c) {
        r.dx[size_t(n) * H + c] += g * w[size_t(j) * H + c];
        r.dw[size_t(j) * H + c] += g * x[size_t(n) * H + c];
      }
    }
  }
  return r;
}

struct CEOut {
  float loss;
  std::vector<float> dx, dw;
};
// Runs the kernel with F32 tensors: loss_sum starts at loss0, dx at NaN, dw at dw0.
CEOut run_ce(const std::vector<float>& x, const std::vector<float>& w, std::vector<int32_t> y, int N, int H, int V,
             float gs, float loss0, const std::vector<float>& dw0) {
  CEOut o{loss0, std::vector<float>(size_t(N) * H, kNaN), dw0};
  HostTensor ws(DType::F32, {int64_t(cpu::linear_ce_workspace_bytes(N, H, V) / 4)});
  auto xv = x, wv = w;
  std::vector<float> loss = {loss0};
  cpu::linear_cross_entropy(test::view_of(loss, {1}), test::view_of(o.dx, {N, H}), test::view_of(o.dw, {V, H}),
                            test::view_of(xv, {N, H}), test::view_of(wv, {V, H}), test::view_of(y, {N}), gs, ws.t());
  o.loss = loss[0];
  return o;
}

TEST(CpuKernels, LinearCrossEntropyBackwardMatchesFiniteDifferences) {
  const int N = 7, H = 6, V = 13;
  const float gs = 0.37f;
  auto x = test::randn(size_t(N) * H, 500), w = test::randn(size_t(V) * H, 501, 0.7f);
  std::vector<int32_t> y = {3, -100, 0, 12, 7, -100, 3};
  auto dw0 = test::randn(w.size(), 502);
  CEOut o = run_ce(x, w, y, N, H, V, gs, 1.25f, dw0);
  auto xd = to_double(x), wd = to_double(w);
  RefCE r = ref_linear_ce(xd, wd, y, N, H, V, gs, true);
  EXPECT_LE(std::fabs(o.loss - (1.25 + r.loss)) / r.loss, 1e-6);  // fp32 logits, fp64 lse/sum
  for (size_t i = 0; i < dw0.size(); ++i) o.dw[i] -= dw0[i];      // dw accumulated onto dw0
  // FD of gs * loss in fp64 (exact to ~1e-9) vs the kernel's fp32 gradients (~1e-6).
  auto L = [&] { return gs * ref_linear_ce(xd, wd, y, N, H, V, 1.0, false).loss; };
  auto ix = test::sample_indices(xd.size(), xd.size(), 0), iw = test::sample_indices(wd.size(), wd.size(), 0);
  EXPECT_LE(rel_err(test::gather(o.dx, ix), test::numeric_grad(xd, ix, 1e-5, L)), 1e-5);
  EXPECT_LE(rel_err(test::gather(o.dw, iw), test::numeric_grad(wd, iw, 1e-5, L)), 1e-5);
  // Ignored rows: exactly zero gradient (the NaN garbage is overwritten).
  for (int c = 0; c < H; ++c) EXPECT_EQ(o.dx[size_t(1) * H + c], 0.f);
}

TEST(CpuKernels, LinearCrossEntropyChunkedMatchesFullLogits) {
  // V + H = 50029 -> chunks of 83 rows: 203 rows = 83 + 83 + 37, V not a multiple of anything.
  const int N = 203, H = 8, V = 50021;
  auto x = test::randn(size_t(N) * H, 600), w = test::randn(size_t(V) * H, 601, 0.5f);
  auto y = test::randint(N, 602, 0, V);
  int active = 0;
  for (int n = 0; n < N; ++n) {
    if (n % 5 == 2 || (n >= 83 && n < 90)) y[n] = -100;  // scattered, and a run at a chunk start
    active += y[n] != -100;
  }
  const float gs = 1.f / float(active);
  auto dw0 = test::randn(w.size(), 603, 1e-3f);
  // The workspace stays a few MB, far below N x V logits.
  EXPECT_LT(cpu::linear_ce_workspace_bytes(N, H, V), size_t(N) * V * 4 / 2);
  EXPECT_LT(cpu::linear_ce_workspace_bytes(65536, 4096, 128256), size_t(64) << 20);
  CEOut o = run_ce(x, w, y, N, H, V, gs, 0.f, dw0);
  RefCE r = ref_linear_ce(to_double(x), to_double(w), y, N, H, V, gs, true);
  for (size_t i = 0; i < dw0.size(); ++i) r.dw[i] += dw0[i];
  // Loss: fp32 logits (H = 8 products) and fp64 sums: ~1e-7.
  EXPECT_LE(std::fabs(o.loss - r.loss) / r.loss, 1e-6);
  // Gradients: fp32 entries of (softmax - onehot) and fp32 GEMM sums over up to 83 rows or V
  // terms of very different size: ~1e-6 norm-wise.
  EXPECT_LE(rel_err(o.dx, r.dx), 1e-5);
  EXPECT_LE(rel_err(o.dw, r.dw), 1e-5);
}

TEST(CpuKernels, LinearCrossEntropyIgnoredRowsAndOptionalOutputs) {
  const int N = 5, H = 4, V = 9;
  auto x = test::randn(size_t(N) * H, 700), w = test::randn(size_t(V) * H, 701);
  auto dw0 = test::randn(w.size(), 702);
  // An all-ignored batch: the loss sum is unchanged, dx all zero, dw unchanged.
  std::vector<int32_t> none(N, -100);
  CEOut o = run_ce(x, w, none, N, H, V, 1.f, 2.5f, dw0);
  EXPECT_EQ(o.loss, 2.5f);
  for (float g : o.dx) EXPECT_EQ(g, 0.f);
  EXPECT_EQ(o.dw, dw0);
  // dx and dw are optional: the loss alone, and dx alone, agree with the full call.
  std::vector<int32_t> y = {1, 8, -100, 0, 4};
  CEOut full = run_ce(x, w, y, N, H, V, 0.5f, 0.f, std::vector<float>(w.size(), 0.f));
  HostTensor ws(DType::F32, {int64_t(cpu::linear_ce_workspace_bytes(N, H, V) / 4)});
  std::vector<float> loss = {0.f}, dx(x.size());
  cpu::linear_cross_entropy(test::view_of(loss, {1}), Tensor(), Tensor(), test::view_of(x, {N, H}),
                            test::view_of(w, {V, H}), test::view_of(y, {N}), 0.5f, ws.t());
  EXPECT_EQ(loss[0], full.loss);
  loss[0] = 0.f;
  cpu::linear_cross_entropy(test::view_of(loss, {1}), test::view_of(dx, {N, H}), Tensor(), test::view_of(x, {N, H}),
                            test::view_of(w, {V, H}), test::view_of(y, {N}), 0.5f, ws.t());
  EXPECT_EQ(loss[0], full.loss);
  EXPECT_EQ(dx, full.dx);
  // dx may overwrite x in place (rows of a chunk are written after they were last read).
  auto xi = x;
  loss[0] = 0.f;
  cpu::linear_cross_entropy(test::view_of(loss, {1}), test::view_of(xi, {N, H}), Tensor(), test::view_of(xi, {N, H}),
                            test::view_of(w, {V, H}), test::view_of(y, {N}), 0.5f, ws.t());
  EXPECT_EQ(xi, full.dx);
  // Bad labels and a short workspace stop with a message.
  std::vector<int32_t> bad = {1, 9, 0, 0, 0};
  expect_check_failure(
      [&] {
        cpu::linear_cross_entropy(test::view_of(loss, {1}), Tensor(), Tensor(), test::view_of(x, {N, H}),
                                  test::view_of(w, {V, H}), test::view_of(bad, {N}), 1.f, ws.t());
      },
      "linear_ce.cpp", "label 9");
  bad[1] = -1;
  expect_check_failure(
      [&] {
        cpu::linear_cross_entropy(test::view_of(loss, {1}), Tensor(), Tensor(), test::view_of(x, {N, H}),
                                  test::view_of(w, {V, H}), test::view_of(bad, {N}), 1.f, ws.t());
      },
      "linear_ce.cpp", "label -1");
  CpuFront f;
  expect_check_failure(
      [&] {
        f.ops().linear_cross_entropy(test::view_of(loss, {1}), Tensor(), Tensor(), test::view_of(x, {N, H}),
                                     test::view_of(w, {V, H}), test::view_of(y, {N}), 1.f, ws.t().view({4}), *f.s);
      },
      "ops_check.h", "workspace");
}

TEST(CpuKernels, LinearCrossEntropyBf16Storage) {
  const int N = 11, H = 16, V = 37;
  auto x = test::round_bf16(test::randn(size_t(N) * H, 800)), w = test::round_bf16(test::randn(size_t(V) * H, 801));
  auto dw0 = test::round_bf16(test::randn(w.size(), 802, 0.1f));
  auto y = test::randint(N, 803, 0, V);
  y[4] = -100;
  HostTensor xb(x, DType::BF16, {N, H}), wb(w, DType::BF16, {V, H}), dxb(DType::BF16, {N, H}),
      dwb(dw0, DType::BF16, {V, H});
  HostTensor ws(DType::F32, {int64_t(cpu::linear_ce_workspace_bytes(N, H, V) / 4)});
  std::vector<float> loss = {0.f};
  cpu::linear_cross_entropy(test::view_of(loss, {1}), dxb.t(), dwb.t(), xb.t(), wb.t(), test::view_of(y, {N}), 0.25f,
                            ws.t());
  CEOut o = run_ce(x, w, y, N, H, V, 0.25f, 0.f, dw0);
  // Exactly converted inputs, same fp32 path: the same loss; gradients are one rounding of the
  // fp32 ones (dw: fp32 accumulation over all chunks, rounded once at the end).
  EXPECT_EQ(loss[0], o.loss);
  for (int i = 0; i < N * H; ++i) ASSERT_EQ(dxb.get(i), test::round_bf16(o.dx[size_t(i)])) << i;
  for (int i = 0; i < V * H; ++i) ASSERT_EQ(dwb.get(i), test::round_bf16(o.dw[size_t(i)])) << i;
}

}  // namespace
}  // namespace sf
