// RoPE, HF half-split ("rotate_half") layout: pair i of a head is (x[i], x[i + hd/2]).
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {

// inverse = false: y1 = x1 c - x2 s, y2 = x2 c + x1 s (HF: x*cos + rotate_half(x)*sin, same
// rounding). inverse = true applies the transpose, which is the gradient of the forward.
void rope_apply(const char* op, Tensor x, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos,
                bool inverse) {
  const int64_t half = head_dim / 2, width = int64_t(n_heads) * head_dim;
  const int64_t R = x.rows();   // x [R = B*T, n_heads*head_dim]; cos, sin [T_max, half]
  const int32_t* pp = nullptr;  // pos [R] I32 (packed rows) or null (position r % T)
  if (!pos.empty()) {
    // The values, which only host memory shows (shapes and dtypes: ops_check.h).
    pp = pos.ptr<int32_t>();
    for (int64_t r = 0; r < R; ++r)
      SF_CHECK(pp[r] >= 0 && pp[r] < T && pp[r] <= r % T,
               std::string(op) + ": pos[" + std::to_string(r) + "] = " + std::to_string(pp[r]) + " out of range");
  }
  const float* cp = cos.ptr<float>();
  const float* sp = sin.ptr<float>();
  visit(x, [&](auto* xp) {
    cpu_pool().parallel_for(
        R,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t p = pp ? pp[r] : r % T;  // position of row r
            const float* c = cp + p * half;
            const float* s = sp + p * half;
            for (int64_t h = 0; h < n_heads; ++h) {
              const int64_t base = r * width + h * head_dim;
              for (int64_t i = 0; i < half; ++i) {
                const float x1 = ld(xp, base + i), x2 = ld(xp, base + i + half);
                if (!inverse) {
                  st(xp, base + i, x1 * c[i] - x2 * s[i]);
                  st(xp, base + i + half, x2 * c[i] + x1 * s[i]);
                } else {
                  st(xp, base + i, x1 * c[i] + x2 * s[i]);
                  st(xp, base + i + half, x2 * c[i] - x1 * s[i]);
                }
              }
            }
          }
        },
        std::max<int64_t>(1, 8192 / std::max<int64_t>(1, width)));
  });
}

}  // namespace

void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos) {
  rope_apply("rope_forward", x, cos, sin, T, n_heads, head_dim, pos, false);
}

void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos) {
  rope_apply("rope_backward", dx, cos, sin, T, n_heads, head_dim, pos, true);
}

}  // namespace sf::cpu
