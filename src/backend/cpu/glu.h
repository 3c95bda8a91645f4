// Gated linear units out = act(gate) * up and their backward, for an activation Act with
// static float value(float g) and static float grad(float g) (d act / d g): swiglu.cpp (SiLU),
// geglu.cpp (gelu_tanh). All [R, I], F32/BF16 any mix; element i is fully read before it is written,
// so dgate may alias gate and dup may alias up.
#pragma once
#include "backend/cpu/cpu_common.h"
#include "core/thread_pool.h"

namespace sf::cpu::detail {

constexpr int64_t kGluGrain = 1 << 14;

template <class Act>
void glu_forward(Tensor out, Tensor gate, Tensor up) {
  const int64_t n = gate.numel();  // out, gate, up [R, I]
  visit_all(
      [&](auto* o, auto* g, auto* u) {
        cpu_pool().parallel_for(
            n,
            [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) st(o, i, Act::value(ld(g, i)) * ld(u, i));
            },
            kGluGrain);
      },
      out, gate, up);
}

// dgate = (dout * up) * act'(gate), dup = dout * act(gate).
template <class Act>
void glu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  const int64_t n = gate.numel();  // all [R, I]
  visit_all(
      [&](auto* dg, auto* du, auto* d, auto* g, auto* u) {
        cpu_pool().parallel_for(
            n,
            [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) {
                const float gv = ld(g, i), uv = ld(u, i), dv = ld(d, i);
                const float grad = Act::grad(gv), act = Act::value(gv);
                st(dg, i, (dv * uv) * grad);
                st(du, i, dv * act);
              }
            },
            kGluGrain);
      },
      dgate, dup, dout, gate, up);
}

}  // namespace sf::cpu::detail
