#include "backend/cuda/geglu.cuh"
#include "backend/cuda/glu.cuh"

namespace sf::cuda {
namespace {

struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCoef = 0.044715f;
  // tanh(sqrt(2/pi) (g + 0.044715 g^3)) with the accurate tanhf (the CPU twin uses std::tanh).
  __device__ static float inner(float g) { return tanhf(kSqrt2OverPi * fmaf(kCoef * g, g * g, g)); }
  __device__ static float value(float g) { return 0.5f * g * (1.f + inner(g)); }
  // d/dg = 0.5 (1 + t) + 0.5 g (1 - t^2) k (1 + 3 * 0.044715 g^2).
  __device__ static void value_grad(float g, float& v, float& d) {
    const float t = inner(g);
    v = 0.5f * g * (1.f + t);
    d = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kCoef * g * g);
  }
};

}  // namespace

void geglu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L) { glu_forward<GeluTanh>(out, gate, up, L); }

void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L) {
  glu_backward<GeluTanh>(dgate, dup, dout, gate, up, L);
}

}  // namespace sf::cuda
