// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g); all [R, I], F32/BF16 any mix.
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

void swiglu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L);
// dup = dout * silu(gate); dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))).
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L);

}  // namespace sf::cuda
