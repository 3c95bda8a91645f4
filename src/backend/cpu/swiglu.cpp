// SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (PyTorch's formula).
#include <cmath>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {
constexpr int64_t kGrain = 1 << 14;
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  const int64_t n = gate.numel();  // out, gate, up [R, I]
  visit_all(
      [&](auto* o, auto* g, auto* u) {
        cpu_pool().parallel_for(
            n,
            [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                const float gv = ld(g, i);
                st(o, i, gv / (1.f + std::exp(-gv)) * ld(u, i));
              }
            },
            kGrain);
      },
      out, gate, up);
}

// With s = sigmoid(g): dsilu/dg = s (1 + g (1 - s)) (PyTorch's silu_backward);
// dgate = (dout * up) * dsilu/dg, dup = dout * silu(g). Element i is fully read before it is
// written, so dgate may alias gate and dup may alias up.
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  const int64_t n = gate.numel();  // all [R, I]
  visit_all(
      [&](auto* dg, auto* du, auto* d, auto* g, auto* u) {
        cpu_pool().parallel_for(
            n,
            [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                const float gv = ld(g, i), uv = ld(u, i), dv = ld(d, i);
                const float e1 = 1.f + std::exp(-gv);
                const float sig = 1.f / e1, silu = gv / e1;
                st(dg, i, (dv * uv) * (sig * (1.f + gv * (1.f - sig))));
                st(du, i, dv * silu);
              }
            },
            kGrain);
      },
      dgate, dup, dout, gate, up);
}

}  // namespace sf::cpu
