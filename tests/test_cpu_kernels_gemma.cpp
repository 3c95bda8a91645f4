// CPU reference kernels of Gemma 3: the (1 + w) RMSNorm's forward against an fp64 formula (its
// backward against finite differences and GeGLU: test_cpu_kernels.cpp, beside RMSNorm and SwiGLU);
// the device table's new entries and their argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "test_util.h"

namespace sf {
namespace {

using test::max_rel_err;
using test::to_double;

// HF Gemma3RMSNorm in fp64: x * rsqrt(mean(x^2) + eps) * (1 + w).
std::vector<double> ref_rmsnorm_1p(const std::vector<double>& x, const std::vector<double>& w, int R, int C,
                                   double eps) {
  std::vector<double> out(x.size());
  for (int r = 0; r < R; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[size_t(r) * C + c] * x[size_t(r) * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) out[size_t(r) * C + c] = x[size_t(r) * C + c] * rs * (1.0 + w[size_t(c)]);
  }
  return out;
}

TEST(CpuKernelsGemma, RmsNorm1pForward) {
  const int R = 6, C = 11;
  const float eps = 1e-6f;
  // Gemma's weights sit around 0 (the scale is 1 + w).
  auto x = test::randn(size_t(R) * C, 1171, 2.f), w = test::randn(C, 1172, 0.3f);
  std::vector<float> out(x.size()), rstd(R);
  cpu::rmsnorm_forward(test::view_of(out, {R, C}), test::view_of(rstd, {R}), test::view_of(x, {R, C}),
                       test::view_of(w, {C}), eps, 1.f);
  auto xd = to_double(x), wd = to_double(w);
  EXPECT_LE(max_rel_err(out, ref_rmsnorm_1p(xd, wd, R, C, eps), 1e-6), 1e-6);
  // The same as plain RMSNorm with the weight 1 + w formed in fp32.
  std::vector<float> w1(w.size()), out1(x.size());
  for (size_t i = 0; i < w.size(); ++i) w1[i] = 1.f + w[i];
  cpu::rmsnorm_forward(test::view_of(out1, {R, C}), Tensor(), test::view_of(x, {R, C}), test::view_of(w1, {C}), eps);
  EXPECT_EQ(out1, out);

  // The backward against finite differences: test_cpu_kernels.cpp, RmsNormBackwardMatchesFiniteDifferences.
}

// The device's table runs the twins above under the names of ops.h, and its front checks them.
TEST(CpuKernelsGemma, DeviceTableRunsTheTwinsAndChecksArguments) {
  auto dev = make_cpu_device();
  auto s = dev->create_stream();
  const int R = 3, C = 8;
  auto x = test::randn(size_t(R) * C, 1201), w = test::randn(C, 1202, 0.3f);
  std::vector<float> a(x.size()), b(x.size()), rs(R);
  dev->ops().rmsnorm_1p_forward(test::view_of(a, {R, C}), test::view_of(rs, {R}), test::view_of(x, {R, C}),
                                test::view_of(w, {C}), 1e-6f, *s);
  dev->ops().geglu_forward(test::view_of(b, {R, C}), test::view_of(x, {R, C}), test::view_of(x, {R, C}), *s);
  dev->synchronize(*s);
  std::vector<float> ra(x.size()), rb(x.size());
  cpu::rmsnorm_forward(test::view_of(ra, {R, C}), Tensor(), test::view_of(x, {R, C}), test::view_of(w, {C}), 1e-6f,
                       1.f);
  cpu::geglu_forward(test::view_of(rb, {R, C}), test::view_of(x, {R, C}), test::view_of(x, {R, C}));
  EXPECT_EQ(a, ra);
  EXPECT_EQ(b, rb);
  test::expect_check_failure(
      [&] {
        dev->ops().geglu_forward(test::view_of(b, {R, C}), test::view_of(x, {R, C}), test::view_of(w, {C}), *s);
      },
      "ops_check.h", "geglu_forward");
  test::expect_check_failure(
      [&] {
        dev->ops().rmsnorm_1p_forward(test::view_of(a, {R, C}), Tensor(), test::view_of(x, {R, C}),
                                      test::view_of(x, {R, C}), 1e-6f, *s);
      },
      "ops_check.h", "rmsnorm_1p_forward");
}

}  // namespace
}  // namespace sf
