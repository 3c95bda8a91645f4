// CPU reference kernels, part 1: matmul, element-wise ops, RMSNorm, RoPE, SwiGLU / GeGLU, embedding, AdamW.
// Each forward is checked against a naive fp64 formula written here; each backward against
// central finite differences of that fp64 formula (so the FD itself is accurate to ~1e-9 and
// the tolerance measures only the kernel's fp32 arithmetic); BF16 storage against the F32
// kernel run on the bf16-rounded inputs.
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

// ---------------------------------------------------------------- matmul

// out[M,N] = alpha op(a) op(b) + beta out0, with a [M,K] or [K,M], b [K,N] or [N,K], in fp64.
std::vector<double> ref_matmul(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& out0,
                               int M, int N, int K, bool ta, bool tb, double alpha, double beta) {
  std::vector<double> out(size_t(M) * N);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        double av = ta ? a[size_t(k) * M + i] : a[size_t(i) * K + k];
        double bv = tb ? b[size_t(j) * K + k] : b[size_t(k) * N + j];
        s += av * bv;
      }
      out[size_t(i) * N + j] = alpha * s + (beta == 0 ? 0.0 : beta * out0[size_t(i) * N + j]);
    }
  }
  return out;
}

TEST(CpuKernels, MatmulMatchesFp64AllTransposesAndBeta) {
  struct Shape {
    int M, N, K;
  };
  uint64_t seed = 1;
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 17, 65}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.f, 0.5f}) {
          SCOPED_TRACE(testing::Message()
                       << s.M << "x" << s.N << "x" << s.K << " ta=" << ta << " tb=" << tb << " beta=" << beta);
          auto a = test::randn(size_t(s.M) * s.K, seed++);
          auto b = test::randn(size_t(s.K) * s.N, seed++);
          // beta == 0 must ignore NaN garbage in out, as BLAS does.
          std::vector<float> out0 =
              beta == 0 ? std::vector<float>(size_t(s.M) * s.N, kNaN) : test::randn(size_t(s.M) * s.N, seed++);
          auto out = out0;
          Tensor at = ta ? test::view_of(a, {s.K, s.M}) : test::view_of(a, {s.M, s.K});
          Tensor bt = tb ? test::view_of(b, {s.N, s.K}) : test::view_of(b, {s.K, s.N});
          cpu::matmul(test::view_of(out, {s.M, s.N}), at, bt, ta, tb, 0.75f, beta);
          auto ref = ref_matmul(a, b, out0, s.M, s.N, s.K, ta, tb, 0.75, beta);
          // fp32 sgemm over K <= 65 terms: error ~ sqrt(K) * 6e-8 relative to the result norm.
          EXPECT_LE(rel_err(out, ref), 2e-6);
        }
      }
    }
  }
}

TEST(CpuKernels, MatmulBf16Storage) {
  const int M = 9, N = 11, K = 21;
  auto a = test::round_bf16(test::randn(size_t(M) * K, 11));
  auto w = test::round_bf16(test::randn(size_t(N) * K, 12));  // linear weight [N, K]
  auto o0 = test::round_bf16(test::randn(size_t(M) * N, 13));
  HostTensor ab(a, DType::BF16, {M, K}), wb(w, DType::BF16, {N, K});
  // BF16 inputs, F32 out: the same fp32 math as on the (exactly converted) inputs.
  HostTensor of(DType::F32, {M, N});
  cpu::matmul(of.t(), ab.t(), wb.t(), false, true, 1.f, 0.f);
  EXPECT_LE(rel_err(of.f(), ref_matmul(a, w, o0, M, N, K, false, true, 1, 0)), 2e-6);
  // BF16 out with beta = 1 (accumulate): one rounding of the fp32 result, so within one bf16
  // ulp (2^-7 relative) of the rounded fp64 value; the floor covers cancellation near 0.
  HostTensor ob(o0, DType::BF16, {M, N});
  cpu::matmul(ob.t(), ab.t(), wb.t(), false, true, 0.5f, 1.f);
  auto ref = ref_matmul(a, w, o0, M, N, K, false, true, 0.5, 1);
  EXPECT_LE(max_rel_err(ob.f(), ref, 1e-2), 2 * kBf16Eps);
  // Mixed: F32 a, BF16 b^T... and a^T in BF16.
  HostTensor at(a, DType::BF16, {K, M});  // the same numbers read as a^T [K, M] -> op(a) [M, K]
  std::vector<float> out(size_t(M) * N);
  cpu::matmul(test::view_of(out, {M, N}), at.t(), wb.t(), true, true, 1.f, 0.f);
  EXPECT_LE(rel_err(out, ref_matmul(a, w, o0, M, N, K, true, true, 1, 0)), 2e-6);
}

TEST(CpuKernels, MatmulRejectsBadShapesAndDtypes) {
  std::vector<float> a(6), b(6), o(4);
  std::vector<int32_t> ids(6);
  CpuFront f;
  expect_check_failure(
      [&] {
        f.ops().matmul(test::view_of(o, {2, 2}), test::view_of(a, {2, 3}), test::view_of(b, {2, 3}), false, false, 1, 0,
                       *f.s);
      },
      "ops_check.h", "shapes do not match");
  expect_check_failure(
      [&] {
        f.ops().matmul(test::view_of(o, {2, 2}), test::view_of(ids, {2, 3}), test::view_of(b, {2, 3}), false, true, 1,
                       0, *f.s);
      },
      "ops_check.h", "F32 or BF16");
  // out aliasing an input would be read while written.
  expect_check_failure(
      [&] {
        f.ops().matmul(test::view_of(a, {2, 2}), test::view_of(a, {2, 3}), test::view_of(b, {2, 3}), false, true, 1, 0,
                       *f.s);
      },
      "ops_check.h", "out overlaps a");
}

// ---------------------------------------------------------------- element-wise

TEST(CpuKernels, AddScaleZeroMixedDtypesAndAliasing) {
  const int n = 100003;  // over the parallel grain, odd
  auto a = test::randn(n, 21), b = test::randn(n, 22);
  std::vector<float> out(n);
  cpu::add(test::view_of(out, {n}), test::view_of(a, {n}), test::view_of(b, {n}));
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  // BF16 a, F32 b, BF16 out aliasing a: each element is one rounding of the fp32 sum.
  HostTensor ab(a, DType::BF16, {n});
  auto ar = ab.f();
  cpu::add(ab.t(), ab.t(), test::view_of(b, {n}));
  auto got = ab.f();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], test::round_bf16(ar[i] + b[i])) << i;
  // scale
  auto x = a;
  cpu::scale(test::view_of(x, {n}), -0.3f);
  for (int i = 0; i < n; ++i) ASSERT_EQ(x[i], a[i] * -0.3f);
  HostTensor xb(std::vector<float>(a.begin(), a.begin() + 21), DType::BF16, {7, 3});
  auto xr = xb.f();
  cpu::scale(xb.t(), 3.f);
  for (int i = 0; i < 21; ++i) ASSERT_EQ(xb.get(i), test::round_bf16(xr[i] * 3.f));
  // zero, also for I32
  cpu::zero(test::view_of(x, {n}));
  for (float v : x) ASSERT_EQ(v, 0.f);
  std::vector<int32_t> ids(5, 7);
  cpu::zero(test::view_of(ids, {5}));
  for (int32_t v : ids) ASSERT_EQ(v, 0);
  // shape mismatch
  CpuFront f;
  expect_check_failure(
      [&] { f.ops().add(test::view_of(out, {n}), test::view_of(a, {n}), test::view_of(b, {n - 1}), *f.s); },
      "ops_check.h", "elements");
}

TEST(CpuKernels, CastRoundsToNearestEven) {
  // Halfway cases of bf16 (8 significant bits): 1 + 2^-8 is between 1 and 1 + 2^-7 -> even (1);
  // 1 + 3*2^-8 is between 1 + 2^-7 and 1 + 2^-6 -> even (1 + 2^-6); just above half rounds up.
  std::vector<float> in = {1.f + 0x1p-8f,
                           1.f + 3 * 0x1p-8f,
                           1.f + 0x1p-8f + 0x1p-20f,
                           -1.f - 0x1p-8f,
                           3.14159265f,
                           1e-40f /* subnormal: bits 0x000116c2 -> 0x0001 */,
                           INFINITY,
                           -INFINITY,
                           kNaN,
                           0.f,
                           -0.f};
  std::vector<float> expect = {1.f,      1.f + 0x1p-6f, 1.f + 0x1p-7f, -1.f, 3.140625f, 0x1p-133f,
                               INFINITY, -INFINITY,     kNaN,          0.f,  -0.f};
  const int n = int(in.size());
  HostTensor b(DType::BF16, {n});
  cpu::cast(b.t(), test::view_of(in, {n}));
  for (int i = 0; i < n; ++i) {
    if (std::isnan(expect[i])) {
      EXPECT_TRUE(std::isnan(b.get(i)));
    } else {
      EXPECT_EQ(b.get(i), expect[i]) << i;
      EXPECT_EQ(std::signbit(b.get(i)), std::signbit(expect[i])) << i;
    }
  }
  // BF16 -> F32 is exact; F32 -> F32 and BF16 -> BF16 copy; F16 -> F32 converts.
  std::vector<float> back(n);
  cpu::cast(test::view_of(back, {n}), b.t());
  for (int i = 0; i < n; ++i) {
    if (!std::isnan(back[i])) {
      EXPECT_EQ(back[i], b.get(i));
    }
  }
  HostTensor b2(DType::BF16, {n});
  cpu::cast(b2.t(), b.t());
  EXPECT_EQ(std::memcmp(b2.t().data, b.t().data, b.t().bytes()), 0);
  auto big = test::randn(4099, 31);
  HostTensor h(big, DType::F16, {4099});
  std::vector<float> hf(4099);
  cpu::cast(test::view_of(hf, {4099}), h.t());
  EXPECT_EQ(hf, h.f());
  CpuFront f;
  expect_check_failure([&] { f.ops().cast(test::view_of(back, {n}), test::view_of(in, {n - 1}), *f.s); }, "ops_check.h",
                       "elements");
}

TEST(CpuKernels, SqNormAccumulatesInFp64) {
  // 2^20 + 3 terms of very different size: a fp32 running sum would lose ~1e-4 relative here.
  const int n = (1 << 20) + 3;
  auto x = test::randn(n, 41);
  x[17] = 1000.f;
  double ref = 2.5;
  for (float v : x) ref += double(v) * v;
  std::vector<float> out = {2.5f};
  cpu::sq_norm(test::view_of(out, {1}), test::view_of(x, {n}));
  EXPECT_LE(std::fabs(out[0] - ref) / ref, 1e-7);  // one fp32 rounding of the fp64 total
  // BF16 input: the sum of squares of the exactly converted values.
  auto small = test::randn(4097, 42);
  HostTensor sb(small, DType::BF16, {4097});
  double r2 = 0;
  for (float v : sb.f()) r2 += double(v) * v;
  std::vector<float> o2 = {0.f};
  cpu::sq_norm(test::view_of(o2, {1}), sb.t());
  EXPECT_LE(std::fabs(o2[0] - r2) / r2, 1e-7);
}

TEST(CpuKernels, BiasAddAndBackward) {
  const int M = 37, N = 13;
  auto x = test::randn(size_t(M) * N, 51), bias = test::randn(N, 52), dout = test::randn(size_t(M) * N, 53);
  auto out = x;
  cpu::add_bias(test::view_of(out, {M, N}), test::view_of(bias, {N}));
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) ASSERT_EQ(out[size_t(i) * N + j], x[size_t(i) * N + j] + bias[j]);
  }
  // dbias += column sums of dout (the exact gradient of sum(dout * (x + bias)) over bias).
  auto db0 = test::randn(N, 54);
  auto db = db0;
  cpu::bias_backward(test::view_of(db, {N}), test::view_of(dout, {M, N}));
  std::vector<double> ref(N);
  for (int j = 0; j < N; ++j) {
    ref[j] = db0[j];
    for (int i = 0; i < M; ++i) ref[j] += dout[size_t(i) * N + j];
  }
  EXPECT_LE(max_rel_err(db, ref, 1e-3), 1e-6);
  // Finite differences through the add_bias kernel itself (linear: exact up to fp32 rounding).
  auto idx = test::sample_indices(N, N, 0);
  auto fd = test::numeric_grad(bias, idx, 0.5, [&] {
    auto o = x;
    cpu::add_bias(test::view_of(o, {M, N}), test::view_of(bias, {N}));
    return test::dot(o, dout);
  });
  std::vector<float> g(N, 0.f);
  cpu::bias_backward(test::view_of(g, {N}), test::view_of(dout, {M, N}));
  EXPECT_LE(rel_err(test::gather(g, idx), fd), 1e-5);  // fp32 sums of ~37 terms of size ~1
}

// ---------------------------------------------------------------- RMSNorm

// HF LlamaRMSNorm in fp64: out = w * (x / sqrt(mean(x^2) + eps)).
// w_offset 1: Gemma's (1 + w) (HF Gemma3RMSNorm).
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int R, int C, double eps,
                                std::vector<double>* rstd = nullptr, double w_offset = 0.0) {
  std::vector<double> out(x.size());
  if (rstd) rstd->resize(R);
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[size_t(r) * C + c] * x[size_t(r) * C + c];
    double rs = 1.0 / std::sqrt(ss / C + eps);
    if (rstd) (*rstd)[r] = rs;
    for (int c = 0; c < C; ++c) out[size_t(r) * C + c] = (w[c] + w_offset) * x[size_t(r) * C + c] * rs;
  }
  return out;
}

TEST(CpuKernels, RmsNormForwardMatchesFp64) {
  struct Case {
    int R, C;
    float eps;
  };
  uint64_t seed = 60;
  for (Case cs : {Case{1, 1, 1e-6f}, Case{5, 7, 1e-5f}, Case{3, 4096, 1e-6f}, Case{64, 33, 1e-6f}}) {
    SCOPED_TRACE(testing::Message() << cs.R << "x" << cs.C);
    auto x = test::randn(size_t(cs.R) * cs.C, seed++, 2.f);
    auto w = test::randn(cs.C, seed++, 0.5f, 1.f);
    std::vector<float> out(x.size()), rstd(cs.R);
    cpu::rmsnorm_forward(test::view_of(out, {cs.R, cs.C}), test::view_of(rstd, {cs.R}), test::view_of(x, {cs.R, cs.C}),
                         test::view_of(w, {cs.C}), cs.eps);
    std::vector<double> rref;
    auto ref = ref_rmsnorm(to_double(x), to_double(w), cs.R, cs.C, cs.eps, &rref);
    // fp32 products of an exact-to-1ulp rstd: a few ulps per element.
    EXPECT_LE(max_rel_err(out, ref, 1e-6), 1e-6);
    EXPECT_LE(max_rel_err(rstd, rref, 0), 2e-7);
    // rstd is optional, and out may alias x: same bits.
    auto inplace = x;
    cpu::rmsnorm_forward(test::view_of(inplace, {cs.R, cs.C}), Tensor(), test::view_of(inplace, {cs.R, cs.C}),
                         test::view_of(w, {cs.C}), cs.eps);
    EXPECT_EQ(inplace, out);
  }
}

// w_offset 1: Gemma's rmsnorm_1p (weights around 0).
void rmsnorm_backward_case(float w_offset) {
  SCOPED_TRACE(testing::Message() << "w_offset " << w_offset);
  const int R = 6, C = 11;
  const float eps = 1e-5f;
  auto x = test::randn(size_t(R) * C, 71), w = test::randn(C, 72, 0.5f, 1.f - w_offset),
       Rm = test::randn(size_t(R) * C, 73);
  std::vector<float> out(x.size()), rstd(R);
  cpu::rmsnorm_forward(test::view_of(out, {R, C}), test::view_of(rstd, {R}), test::view_of(x, {R, C}),
                       test::view_of(w, {C}), eps, w_offset);
  // L = sum(out * Rm): dout = Rm. dx overwrites garbage; dw accumulates onto dw0.
  std::vector<float> dx(x.size(), kNaN), dw0 = test::randn(C, 74), dw = dw0;
  cpu::rmsnorm_backward(test::view_of(dx, {R, C}), test::view_of(dw, {C}), test::view_of(Rm, {R, C}),
                        test::view_of(x, {R, C}), test::view_of(w, {C}), test::view_of(rstd, {R}), false, w_offset);
  auto xd = to_double(x), wd = to_double(w);
  auto L = [&] { return test::dot(ref_rmsnorm(xd, wd, R, C, eps, nullptr, w_offset), Rm); };
  auto ix = test::sample_indices(xd.size(), xd.size(), 0), iw = test::sample_indices(C, C, 0);
  auto fdx = test::numeric_grad(xd, ix, 1e-6, L);
  auto fdw = test::numeric_grad(wd, iw, 1e-6, L);
  for (int c = 0; c < C; ++c) dw[c] -= dw0[c];
  // fp64 FD error ~1e-9; the kernel's fp32 gradient is good to ~1e-6 relative.
  EXPECT_LE(rel_err(test::gather(dx, ix), fdx), 1e-5);
  EXPECT_LE(rel_err(test::gather(dw, iw), fdw), 1e-5);
  // accumulate = true adds onto what dx holds.
  auto dx2 = dx;
  cpu::rmsnorm_backward(test::view_of(dx2, {R, C}), Tensor(), test::view_of(Rm, {R, C}), test::view_of(x, {R, C}),
                        test::view_of(w, {C}), test::view_of(rstd, {R}), true, w_offset);
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx2[i], dx[i] + dx[i]);
}

TEST(CpuKernels, RmsNormBackwardMatchesFiniteDifferences) {
  rmsnorm_backward_case(0.f);
  rmsnorm_backward_case(1.f);
  // The backward has no eps: rstd is required.
  const int R = 6, C = 11;
  std::vector<float> x(size_t(R) * C, 1.f), w(C, 1.f), dx(x.size());
  CpuFront f;
  expect_check_failure(
      [&] {
        f.ops().rmsnorm_backward(test::view_of(dx, {R, C}), Tensor(), test::view_of(x, {R, C}),
                                 test::view_of(x, {R, C}), test::view_of(w, {C}), Tensor(), false, *f.s);
      },
      "ops_check.h", "rstd");
}

TEST(CpuKernels, RmsNormBf16Storage) {
  const int R = 17, C = 96;
  auto x = test::round_bf16(test::randn(size_t(R) * C, 81, 3.f));
  auto w = test::round_bf16(test::randn(C, 82, 0.3f, 1.f));
  auto dout = test::round_bf16(test::randn(size_t(R) * C, 83));
  HostTensor xb(x, DType::BF16, {R, C}), wb(w, DType::BF16, {C}), ob(DType::BF16, {R, C}),
      gb(dout, DType::BF16, {R, C});
  std::vector<float> rstd_b(R), rstd(R), out(x.size());
  cpu::rmsnorm_forward(ob.t(), test::view_of(rstd_b, {R}), xb.t(), wb.t(), 1e-6f);
  cpu::rmsnorm_forward(test::view_of(out, {R, C}), test::view_of(rstd, {R}), test::view_of(x, {R, C}),
                       test::view_of(w, {C}), 1e-6f);
  EXPECT_EQ(rstd_b, rstd);  // same fp32 inputs after exact conversion
  for (int i = 0; i < R * C; ++i) ASSERT_EQ(ob.get(i), test::round_bf16(out[i])) << i;  // one rounding
  HostTensor dxb(DType::BF16, {R, C}), dwb(DType::BF16, {C});
  std::vector<float> dx(x.size()), dw(C, 0.f);
  cpu::rmsnorm_backward(dxb.t(), dwb.t(), gb.t(), xb.t(), wb.t(), test::view_of(rstd, {R}), false);
  cpu::rmsnorm_backward(test::view_of(dx, {R, C}), test::view_of(dw, {C}), test::view_of(dout, {R, C}),
                        test::view_of(x, {R, C}), test::view_of(w, {C}), test::view_of(rstd, {R}), false);
  for (int i = 0; i < R * C; ++i) ASSERT_EQ(dxb.get(i), test::round_bf16(dx[i])) << i;
  for (int i = 0; i < C; ++i) ASSERT_EQ(dwb.get(i), test::round_bf16(dw[i])) << i;
}

// ---------------------------------------------------------------- RoPE

// Llama tables: inv_freq_i = theta^(-2i/hd), angle = pos * inv_freq_i. [Tmax, hd/2].
void rope_tables(int Tmax, int hd, std::vector<float>& cos, std::vector<float>& sin) {
  cos.resize(size_t(Tmax) * hd / 2);
  sin.resize(cos.size());
  for (int p = 0; p < Tmax; ++p) {
    for (int i = 0; i < hd / 2; ++i) {
      double ang = p * std::pow(10000.0, -2.0 * i / hd);
      cos[size_t(p) * hd / 2 + i] = float(std::cos(ang));
      sin[size_t(p) * hd / 2 + i] = float(std::sin(ang));
    }
  }
}

// HF apply_rotary_pos_emb in fp64: x * cat(cos, cos) + rotate_half(x) * cat(sin, sin),
// rotate_half(x) = cat(-x2, x1); the token in row r has position r % T.
std::vector<double> ref_rope(const std::vector<double>& x, const std::vector<float>& cos, const std::vector<float>& sin,
                             int rows, int T, int nh, int hd) {
  std::vector<double> out(x.size());
  const int half = hd / 2;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < nh; ++h) {
      const double* xr = &x[(size_t(r) * nh + h) * hd];
      double* o = &out[(size_t(r) * nh + h) * hd];
      for (int d = 0; d < hd; ++d) {
        double c = cos[size_t(r % T) * half + d % half], s = sin[size_t(r % T) * half + d % half];
        double rot = d < half ? -xr[d + half] : xr[d - half];
        o[d] = xr[d] * c + rot * s;
      }
    }
  }
  return out;
}

TEST(CpuKernels, RopeMatchesHfAndBackwardIsTheTranspose) {
  const int B = 2, T = 7, nh = 3, hd = 16, Tmax = 10, rows = B * T;
  std::vector<float> cos, sin;
  rope_tables(Tmax, hd, cos, sin);
  auto x = test::randn(size_t(rows) * nh * hd, 91);
  auto y = x;
  cpu::rope_forward(test::view_of(y, {rows, nh * hd}), test::view_of(cos, {Tmax, hd / 2}),
                    test::view_of(sin, {Tmax, hd / 2}), T, nh, hd);
  // Same two products and one add per element as HF: an ulp or two of the products (|x| ~ 1,
  // hence the floor of 1: the sum itself may cancel to near 0).
  EXPECT_LE(max_rel_err(y, ref_rope(to_double(x), cos, sin, rows, T, nh, hd), 1.0), 3e-7);
  // Backward: L = sum(rope(x) * R) is linear, dL/dx = rope_backward(R); check against FD.
  auto Rm = test::randn(y.size(), 92);
  auto g = Rm;
  cpu::rope_backward(test::view_of(g, {rows, nh * hd}), test::view_of(cos, {Tmax, hd / 2}),
                     test::view_of(sin, {Tmax, hd / 2}), T, nh, hd);
  auto xd = to_double(x);
  auto idx = test::sample_indices(xd.size(), xd.size(), 0);
  auto fd = test::numeric_grad(xd, idx, 1e-3, [&] { return test::dot(ref_rope(xd, cos, sin, rows, T, nh, hd), Rm); });
  EXPECT_LE(rel_err(test::gather(g, idx), fd), 1e-6);
  // The rotation is orthogonal: backward undoes forward.
  cpu::rope_backward(test::view_of(y, {rows, nh * hd}), test::view_of(cos, {Tmax, hd / 2}),
                     test::view_of(sin, {Tmax, hd / 2}), T, nh, hd);
  EXPECT_LE(rel_err(y, x), 1e-6);
  // BF16 storage: one rounding of the fp32 result.
  auto xr = test::round_bf16(x);
  HostTensor xb(xr, DType::BF16, {rows, nh * hd});
  cpu::rope_forward(xb.t(), test::view_of(cos, {Tmax, hd / 2}), test::view_of(sin, {Tmax, hd / 2}), T, nh, hd);
  cpu::rope_forward(test::view_of(xr, {rows, nh * hd}), test::view_of(cos, {Tmax, hd / 2}),
                    test::view_of(sin, {Tmax, hd / 2}), T, nh, hd);
  for (size_t i = 0; i < xr.size(); ++i) ASSERT_EQ(xb.get(int64_t(i)), test::round_bf16(xr[i]));
  // Tables shorter than T are refused.
  CpuFront f;
  expect_check_failure(
      [&] {
        f.ops().rope_forward(test::view_of(y, {rows, nh * hd}), test::view_of(cos, {Tmax, hd / 2}),
                             test::view_of(sin, {Tmax, hd / 2}), 14, nh, hd, Tensor(), *f.s);
      },
      "ops_check.h", "T_max >= T");
}

// ---------------------------------------------------------------- SwiGLU, GeGLU

std::vector<double> ref_swiglu(const std::vector<double>& g, const std::vector<double>& u) {
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) out[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return out;
}

// PyTorch's gelu(approximate="tanh") * up (Gemma's GeGLU).
std::vector<double> ref_geglu(const std::vector<double>& g, const std::vector<double>& u) {
  const double k = std::sqrt(2.0 / M_PI);
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i)
    out[i] = 0.5 * g[i] * (1.0 + std::tanh(k * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) * u[i];
  return out;
}

using GluRef = std::vector<double> (*)(const std::vector<double>&, const std::vector<double>&);
using GluFwd = void (*)(Tensor, Tensor, Tensor);
using GluBwd = void (*)(Tensor, Tensor, Tensor, Tensor, Tensor);

// A gated unit's forward against its fp64 formula, backward against finite differences of it.
// floor: absolute error allowed where the value is ~0 (max_rel_err's floor).
void glu_case(GluRef ref, GluFwd fwd, GluBwd bwd, uint64_t seed, double floor) {
  const int R = 7, I = 29, n = R * I;
  auto g = test::randn(n, seed, 3.f), u = test::randn(n, seed + 1), Rm = test::randn(n, seed + 2);
  g[0] = 30.f, g[1] = -30.f, g[2] = 100.f, g[3] = -100.f, g[4] = 0.f;  // saturation: no NaN/inf
  std::vector<float> out(n);
  fwd(test::view_of(out, {R, I}), test::view_of(g, {R, I}), test::view_of(u, {R, I}));
  EXPECT_LE(max_rel_err(out, ref(to_double(g), to_double(u)), floor), 2e-6);
  std::vector<float> dg(n, kNaN), du(n, kNaN);
  bwd(test::view_of(dg, {R, I}), test::view_of(du, {R, I}), test::view_of(Rm, {R, I}), test::view_of(g, {R, I}),
      test::view_of(u, {R, I}));
  for (int i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << i;
  auto gd = to_double(g), ud = to_double(u);
  auto L = [&] { return test::dot(ref(gd, ud), Rm); };
  auto idx = test::sample_indices(n, n, 0);
  // fp64 FD (error ~1e-9) vs the fp32 kernel (exp / tanh and a few products: ~1e-6).
  EXPECT_LE(rel_err(test::gather(dg, idx), test::numeric_grad(gd, idx, 1e-6, L)), 1e-5);
  EXPECT_LE(rel_err(test::gather(du, idx), test::numeric_grad(ud, idx, 1e-6, L)), 1e-5);
  // In place (dgate = gate, dup = up): same bits.
  auto g2 = g, u2 = u;
  bwd(test::view_of(g2, {R, I}), test::view_of(u2, {R, I}), test::view_of(Rm, {R, I}), test::view_of(g2, {R, I}),
      test::view_of(u2, {R, I}));
  EXPECT_EQ(g2, dg);
  EXPECT_EQ(u2, du);
  // BF16 storage: one rounding of the fp32 results on the rounded inputs.
  auto gr = test::round_bf16(g), ur = test::round_bf16(u);
  HostTensor gb(gr, DType::BF16, {R, I}), ub(ur, DType::BF16, {R, I}), ob(DType::BF16, {R, I});
  fwd(ob.t(), gb.t(), ub.t());
  fwd(test::view_of(out, {R, I}), test::view_of(gr, {R, I}), test::view_of(ur, {R, I}));
  for (int i = 0; i < n; ++i) ASSERT_EQ(ob.get(i), test::round_bf16(out[i])) << i;
}

TEST(CpuKernels, SwigluForwardBackward) { glu_case(ref_swiglu, cpu::swiglu_forward, cpu::swiglu_backward, 101, 1e-30); }

// gelu_tanh(g) = 0.5 g (1 + tanh(..)) cancels in fp32 for g < -4 (PyTorch's formula does the same):
// values of ~1e-7 there carry an absolute error of ~1e-7 (floor 0.1: 2e-7 absolute, outputs are O(1)).
TEST(CpuKernels, GegluForwardBackward) { glu_case(ref_geglu, cpu::geglu_forward, cpu::geglu_backward, 1101, 0.1); }

// ---------------------------------------------------------------- embedding

TEST(CpuKernels, EmbeddingForwardBackward) {
  const int V = 23, H = 9, N = 40;
  auto table = test::randn(size_t(V) * H, 111);
  auto ids = test::randint(N, 112, 0, 6);  // few distinct ids: many duplicates
  ids[0] = V - 1;
  HostTensor idt = HostTensor::i32(ids, {N});
  // Forward from a BF16 table into F32: exact copies of the bf16 values.
  HostTensor tb(table, DType::BF16, {V, H});
  std::vector<float> out(size_t(N) * H);
  cpu::embedding_forward(test::view_of(out, {N, H}), idt.t(), tb.t());
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < H; ++c) ASSERT_EQ(out[size_t(n) * H + c], tb.get(int64_t(ids[n]) * H + c));
  }
  // Backward: dtable += scatter-add (the exact gradient of sum(dout * table[ids])).
  auto dout = test::randn(size_t(N) * H, 113);
  auto dt0 = test::randn(size_t(V) * H, 114);
  auto dt = dt0;
  cpu::embedding_backward(test::view_of(dt, {V, H}), test::view_of(dout, {N, H}), idt.t());
  std::vector<double> ref = to_double(dt0);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < H; ++c) ref[size_t(ids[n]) * H + c] += dout[size_t(n) * H + c];
  }
  EXPECT_LE(max_rel_err(dt, ref, 1e-3), 1e-6);  // fp64 sums, one rounding
  // FD through the forward kernel (linear in the table: exact up to fp32 rounding).
  auto idx = test::sample_indices(table.size(), 60, 5);
  auto fd = test::numeric_grad(table, idx, 0.25, [&] {
    std::vector<float> o(size_t(N) * H);
    cpu::embedding_forward(test::view_of(o, {N, H}), idt.t(), test::view_of(table, {V, H}));
    return test::dot(o, dout);
  });
  std::vector<float> g(table.size(), 0.f);
  cpu::embedding_backward(test::view_of(g, {V, H}), test::view_of(dout, {N, H}), idt.t());
  EXPECT_LE(rel_err(test::gather(g, idx), fd), 1e-6);
  // BF16 dtable: each id's rows summed in fp32+ and added once (one rounding per element).
  HostTensor dtb(dt0, DType::BF16, {V, H});
  auto dtb0 = dtb.f();
  cpu::embedding_backward(dtb.t(), test::view_of(dout, {N, H}), idt.t());
  std::vector<double> refb = to_double(dtb0);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < H; ++c) refb[size_t(ids[n]) * H + c] += dout[size_t(n) * H + c];
  }
  EXPECT_LE(max_rel_err(dtb.f(), refb, 1e-2), kBf16Eps);
  // Out-of-range ids stop with a message.
  for (int bad : {-1, V}) {
    auto bad_ids = ids;
    bad_ids[N - 1] = bad;
    HostTensor bt = HostTensor::i32(bad_ids, {N});
    expect_check_failure(
        [&] {
          cpu::embedding_forward(test::view_of(out, {N, H}), bt.t(), tb.t());
        },
        "embedding.cpp", "outside the vocabulary");
    expect_check_failure(
        [&] {
          cpu::embedding_backward(test::view_of(dt, {V, H}), test::view_of(dout, {N, H}), bt.t());
        },
        "embedding.cpp", "outside the vocabulary");
  }
}

// ---------------------------------------------------------------- AdamW

// torch.optim.AdamW for one scalar in fp64, written from the paper/PyTorch docs.
struct RefAdam {
  double p, m = 0, v = 0;
  void step(double grad, int t, double lr, double b1, double b2, double eps, double wd, double gs) {
    double g = grad * gs;
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

TEST(CpuKernels, AdamWHandComputedSteps) {
  // One parameter p0 = 1, lr = 0.1, grads 0.5, -0.25, 0.125. Worked by hand:
  // step 1: m = 0.05, v = 2.5e-4, m^ = 0.5, sqrt(v^) = 0.5 -> p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002.
  // step 2: m = 0.9*0.05 - 0.1*0.25 = 0.02, v = 0.999*2.5e-4 + 0.001*0.0625 = 3.1225e-4,
  //         m^ = 0.02/0.19, v^ = 3.1225e-4/0.001999 -> p = 0.87336629871.
  // step 3: m = 0.0305, v = 3.2756275e-4 -> p = 0.83932338492.
  // With wd = 0.1 and grad_scale = 0.5 (g halved; p *= 0.99 first): 0.890000004, 0.85446630134, 0.81187872557.
  const double expect_plain[3] = {0.900000002, 0.8733662987078463, 0.8393233849166541};
  const double expect_wd[3] = {0.8900000039999998, 0.8544663013417326, 0.8118787255668519};
  const float grads[3] = {0.5f, -0.25f, 0.125f};
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> p = {1.f}, m = {0.f}, v = {0.f}, g(1);
    AdamWParams a;
    a.lr = 0.1f;
    a.weight_decay = variant ? 0.1f : 0.f;
    a.grad_scale = variant ? 0.5f : 1.f;
    for (int t = 1; t <= 3; ++t) {
      g[0] = grads[t - 1];
      a.step = t;
      cpu::adamw(test::view_of(p, {1}), test::view_of(g, {1}), test::view_of(m, {1}), test::view_of(v, {1}), Tensor(),
                 a);
      const double e = variant ? expect_wd[t - 1] : expect_plain[t - 1];
      // p ~ 1 in fp32 (ulp 6e-8), and the fp32 hyper-parameters (0.9f, 0.999f) differ from the
      // decimal ones by ~1e-8 relative: a few ulps of p.
      EXPECT_NEAR(p[0], e, 3e-7) << "variant " << variant << " step " << t;
    }
  }
}

TEST(CpuKernels, AdamWVectorMatchesFp64AndWritesCopies) {
  const int n = 100003;  // several pool chunks, odd tail
  auto p0 = test::randn(n, 121), g1 = test::randn(n, 122, 1e-2f), g2 = test::randn(n, 123, 1e-2f);
  std::vector<float> p = p0, m(n, 0.f), v(n, 0.f);
  HostTensor copy(DType::BF16, {n});
  std::vector<RefAdam> ref(n);
  for (int i = 0; i < n; ++i) ref[i].p = p0[i];
  AdamWParams a;
  a.lr = 1e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.01f, a.grad_scale = 0.7f;
  for (int t = 1; t <= 2; ++t) {
    auto& g = t == 1 ? g1 : g2;
    a.step = t;
    cpu::adamw(test::view_of(p, {n}), test::view_of(g, {n}), test::view_of(m, {n}), test::view_of(v, {n}), copy.t(), a);
    for (int i = 0; i < n; ++i) ref[i].step(g[i], t, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale);
  }
  double max_dp = 0;
  std::vector<double> rm(n), rv(n);
  for (int i = 0; i < n; ++i) {
    // Updates are ~lr = 1e-3: the fp32 error is that of storing p (|p| ulp) plus ~1e-6 of the update.
    max_dp = std::max(max_dp, std::fabs(p[i] - ref[i].p) / (std::fabs(ref[i].p) * 1.2e-7 + 1e-9));
    rm[i] = ref[i].m;
    rv[i] = ref[i].v;
  }
  EXPECT_LE(max_dp, 4.0);  // in units of fp32 ulps of p (plus a 1e-9 floor)
  // A few fp32 roundings; norm-wise because m = 0.9 m + 0.1 g may cancel to ~0 in an element.
  EXPECT_LE(rel_err(m, rm), 1e-6);
  EXPECT_LE(max_rel_err(v, rv, 0), 1e-6);  // v is a sum of positive terms: no cancellation
  // The BF16 upload copy is the nearest-even rounding of the new fp32 parameter.
  for (int i = 0; i < n; ++i) ASSERT_EQ(copy.get(i), test::round_bf16(p[i])) << i;
  // BF16 gradients give exactly what F32 gradients of the same values give; F32 copy == p.
  auto gr = test::round_bf16(g1);
  HostTensor gb(gr, DType::BF16, {n});
  std::vector<float> pa = p0, ma(n, 0.f), va(n, 0.f), pb = p0, mb(n, 0.f), vb(n, 0.f), cf(n);
  a.step = 1;
  cpu::adamw(test::view_of(pa, {n}), gb.t(), test::view_of(ma, {n}), test::view_of(va, {n}), test::view_of(cf, {n}), a);
  cpu::adamw(test::view_of(pb, {n}), test::view_of(gr, {n}), test::view_of(mb, {n}), test::view_of(vb, {n}), Tensor(),
             a);
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(va, vb);
  EXPECT_EQ(cf, pa);
  // The SIMD body (AVX2 or SSE2) and the scalar tail give the same bits: compare with calls on
  // one element each (scalar only). beta1 = 0.3 also takes lerp's other branch (weight >= 0.5).
  for (float beta1 : {0.9f, 0.3f}) {
    const int k = 37;
    AdamWParams b = a;
    b.beta1 = beta1;
    b.step = 3;
    std::vector<float> pv(p0.begin(), p0.begin() + k), mv(g1.begin(), g1.begin() + k), vv(k),
        gv(g2.begin(), g2.begin() + k);
    for (int i = 0; i < k; ++i) vv[i] = g1[i] * g1[i];
    auto ps = pv, ms = mv, vs = vv;
    HostTensor cv(DType::BF16, {k}), cs(DType::BF16, {k});
    cpu::adamw(test::view_of(pv, {k}), test::view_of(gv, {k}), test::view_of(mv, {k}), test::view_of(vv, {k}), cv.t(),
               b);
    for (int i = 0; i < k; ++i) {
      cpu::adamw(Tensor(&ps[i], DType::F32, {1}), Tensor(&gv[i], DType::F32, {1}), Tensor(&ms[i], DType::F32, {1}),
                 Tensor(&vs[i], DType::F32, {1}), Tensor(cs.t().ptr<bf16>() + i, DType::BF16, {1}), b);
    }
    EXPECT_EQ(pv, ps) << "beta1 " << beta1;
    EXPECT_EQ(mv, ms);
    EXPECT_EQ(vv, vs);
    EXPECT_EQ(std::memcmp(cv.t().data, cs.t().data, k * 2), 0);
    RefAdam r{double(p0[5]), double(g1[5]), double(g1[5]) * g1[5]};
    r.step(gv[5], 3, b.lr, b.beta1, b.beta2, b.eps, b.weight_decay, b.grad_scale);
    EXPECT_NEAR(pv[5], r.p, 4 * 1.2e-7 * std::fabs(r.p));
    EXPECT_NEAR(mv[5], r.m, 1e-6 * std::fabs(r.m));
  }
  // Checks: step is 1-based; m must be F32.
  a.step = 0;
  CpuFront f;
  expect_check_failure(
      [&] {
        f.ops().adamw(test::view_of(pa, {n}), gb.t(), test::view_of(ma, {n}), test::view_of(va, {n}), Tensor(), a,
                      *f.s);
      },
      "ops_check.h", "step");
  a.step = 1;
  expect_check_failure(
      [&] { f.ops().adamw(test::view_of(pa, {n}), gb.t(), gb.t(), test::view_of(va, {n}), Tensor(), a, *f.s); },
      "ops_check.h", "F32");
}

// The split update of the sliding engine (clipping): a Params pass then a Moments pass give the
// bits of one fused pass, for both lerp branches, bf16 and fp32 gradients, SIMD body and tail;
// the Params pass leaves m, v alone and the Moments pass leaves p alone.
TEST(CpuKernels, AdamWSplitPassesEqualTheFusedPass) {
  const int n = 70001;  // several pool chunks, odd tail
  const auto p0 = test::randn(n, 131), m0 = test::randn(n, 132, 1e-3f), g = test::randn(n, 133, 1e-2f);
  std::vector<float> v0(n);
  for (int i = 0; i < n; ++i) v0[i] = m0[i] * m0[i] * 3.f;
  HostTensor gb(test::round_bf16(g), DType::BF16, {n});
  for (float beta1 : {0.9f, 0.3f})
    for (bool bf16_grads : {false, true}) {
      AdamWParams a;
      a.lr = 1e-3f, a.beta1 = beta1, a.beta2 = 0.95f, a.weight_decay = 0.1f, a.grad_scale = 0.37f, a.step = 4;
      std::vector<float> g32 = g;
      const Tensor gt = bf16_grads ? gb.t() : test::view_of(g32, {n});
      std::vector<float> pf = p0, mf = m0, vf = v0, ps = p0, ms = m0, vs = v0;
      HostTensor cf(DType::BF16, {n}), cs(DType::BF16, {n});
      cpu::adamw(test::view_of(pf, {n}), gt, test::view_of(mf, {n}), test::view_of(vf, {n}), cf.t(), a);
      cpu::adamw(test::view_of(ps, {n}), gt, test::view_of(ms, {n}), test::view_of(vs, {n}), cs.t(), a,
                 cpu::AdamWPart::Params);
      EXPECT_EQ(ms, m0);
      EXPECT_EQ(vs, v0);
      EXPECT_EQ(ps, pf);
      EXPECT_EQ(std::memcmp(cf.t().data, cs.t().data, size_t(n) * 2), 0);
      std::vector<float> p_before = ps;
      cpu::adamw(test::view_of(ps, {n}), gt, test::view_of(ms, {n}), test::view_of(vs, {n}), Tensor(), a,
                 cpu::AdamWPart::Moments);
      EXPECT_EQ(ps, p_before);
      EXPECT_EQ(ms, mf) << "beta1 " << beta1 << " bf16 " << bf16_grads;
      EXPECT_EQ(vs, vf);
    }
  std::vector<float> p = p0, m = m0, v = v0;
  HostTensor c(DType::BF16, {n});
  AdamWParams a;
  expect_check_failure(
      [&] {
        cpu::adamw(test::view_of(p, {n}), gb.t(), test::view_of(m, {n}), test::view_of(v, {n}), c.t(), a,
                   cpu::AdamWPart::Moments);
      },
      "adamw.cpp", "copy");
}

}  // namespace
}  // namespace sf
