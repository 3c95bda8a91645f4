#include "backend/cuda/glu.cuh"
#include "backend/cuda/swiglu.cuh"

namespace sf::cuda {
namespace {

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }

struct Silu {
  __device__ static float value(float g) { return g * sigmoidf_(g); }
  // d silu / dg = s (1 + g (1 - s)), s = sigmoid(g).
  __device__ static void value_grad(float g, float& v, float& d) {
    const float s = sigmoidf_(g);
    v = g * s;
    d = s * (1.f + g * (1.f - s));
  }
};

}  // namespace

void swiglu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L) { glu_forward<Silu>(out, gate, up, L); }

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L) {
  glu_backward<Silu>(dgate, dup, dout, gate, up, L);
}

}  // namespace sf::cuda
