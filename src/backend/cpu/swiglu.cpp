// SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (PyTorch's formula).
#include <cmath>

#include "backend/cpu/glu.h"
#include "backend/cpu/kernels.h"

namespace sf::cpu {

namespace {
struct Silu {
  static float value(float g) { return g / (1.f + std::exp(-g)); }
  // With s = sigmoid(g): dsilu/dg = s (1 + g (1 - s)) (PyTorch's silu_backward).
  static float grad(float g) {
    const float sig = 1.f / (1.f + std::exp(-g));
    return sig * (1.f + g * (1.f - sig));
  }
};
}  // namespace

void swiglu_forward(Tensor out, Tensor gate, Tensor up) { detail::glu_forward<Silu>(out, gate, up); }

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  detail::glu_backward<Silu>(dgate, dup, dout, gate, up);
}

}  // namespace sf::cpu
