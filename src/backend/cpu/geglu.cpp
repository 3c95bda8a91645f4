// GeGLU (Gemma): out = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(k (g + 0.044715 g^3))),
// k = sqrt(2/pi) (PyTorch's gelu(approximate="tanh"), HF's gelu_pytorch_tanh).
#include <cmath>

#include "backend/cpu/glu.h"
#include "backend/cpu/kernels.h"

namespace sf::cpu {

namespace {
struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCoef = 0.044715f;
  static float value(float g) { return 0.5f * g * (1.f + std::tanh(kSqrt2OverPi * (g + kCoef * g * g * g))); }
  // 0.5 (1 + t) + 0.5 g (1 - t^2) k (1 + 3 * 0.044715 g^2), t = tanh(k (g + 0.044715 g^3)).
  static float grad(float g) {
    const float t = std::tanh(kSqrt2OverPi * (g + kCoef * g * g * g));
    return 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kCoef * g * g);
  }
};
}  // namespace

void geglu_forward(Tensor out, Tensor gate, Tensor up) { detail::glu_forward<GeluTanh>(out, gate, up); }

void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  detail::glu_backward<GeluTanh>(dgate, dup, dout, gate, up);
}

}  // namespace sf::cpu
