// RMSNorm (HF LlamaRMSNorm): rstd = 1/sqrt(mean(x^2) + eps); out = w * (x * rstd); with
// w_offset 1, Gemma's (1 + w) * (x * rstd), 1 + w in fp32.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, float w_offset) {
  const int64_t R = x.rows(), C = x.cols();  // x, out [R, C]; w [C]; rstd [R] F32 or empty
  visit_all(
      [&](auto* o, auto* xp, auto* wp) {
        cpu_pool().parallel_for(
            R,
            [&](int64_t r0, int64_t r1) {
              for (int64_t r = r0; r < r1; ++r) {
                const int64_t base = r * C;
                double ss = 0.0;  // fp64 sum; HF's fp32 mean agrees to ~1 ulp
                for (int64_t c = 0; c < C; ++c) {
                  double v = ld(xp, base + c);
                  ss += v * v;
                }
                const float var = float(ss / double(C));
                const float rs = 1.f / std::sqrt(var + eps);
                // Row read fully above, element c read before written: out may alias x.
                for (int64_t c = 0; c < C; ++c) st(o, base + c, (ld(wp, c) + w_offset) * (ld(xp, base + c) * rs));
                if (!rstd.empty()) rstd.ptr<float>()[r] = rs;
              }
            },
            std::max<int64_t>(1, 4096 / std::max<int64_t>(1, C)));
      },
      out, x, w);
}

// y_c = w_c x_c r with r = (mean(x^2) + eps)^-1/2, so dr/dx_c = -r^3 x_c / C and
// dx_c = r w_c g_c - (r^3 / C) x_c sum_i(w_i g_i x_i);  dw_c = sum_rows g_c (x_c r).
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      float w_offset) {
  const int64_t R = x.rows(), C = x.cols();  // x, dout, dx [R, C]; w, dw [C]; rstd [R]; dx, dw optional
  const float* rs = rstd.ptr<float>();
  visit_all(
      [&](auto* g, auto* xp) {
        // dw first: it reads dout, which dx may alias.
        if (!dw.empty()) {
          visit(dw, [&](auto* dwp) {
            // Threads split the columns; each column sums over rows in order (fp64).
            cpu_pool().parallel_for(
                C,
                [&](int64_t c0, int64_t c1) {
                  std::vector<double> acc(size_t(c1 - c0), 0.0);  // [c1 - c0]
                  for (int64_t r = 0; r < R; ++r) {
                    const int64_t base = r * C;
                    for (int64_t c = c0; c < c1; ++c)
                      acc[size_t(c - c0)] += ld(g, base + c) * (ld(xp, base + c) * rs[r]);
                  }
                  for (int64_t c = c0; c < c1; ++c) st(dwp, c, float(double(ld(dwp, c)) + acc[size_t(c - c0)]));
                },
                64);
          });
        }
        if (dx.empty()) return;
        visit_all(
            [&](auto* wp, auto* dxp) {
              cpu_pool().parallel_for(
                  R,
                  [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const int64_t base = r * C;
                      const double rr = rs[r];
                      double dot = 0.0;  // sum_i w_i g_i x_i
                      for (int64_t c = 0; c < C; ++c)
                        dot += double((ld(wp, c) + w_offset) * ld(g, base + c)) * ld(xp, base + c);
                      const float coef = float(dot * rr * rr * rr / double(C));
                      const float rf = rs[r];
                      for (int64_t c = 0; c < C; ++c) {
                        float v = rf * ((ld(wp, c) + w_offset) * ld(g, base + c)) - coef * ld(xp, base + c);
                        st(dxp, base + c, accumulate ? ld(dxp, base + c) + v : v);
                      }
                    }
                  },
                  std::max<int64_t>(1, 4096 / std::max<int64_t>(1, C)));
            },
            w, dx);
      },
      dout, x);
}

}  // namespace sf::cpu
