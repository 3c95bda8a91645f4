// GeGLU (Gemma): out = gelu_tanh(gate) * up; all [R, I], F32/BF16 any mix (ops.h geglu_*).
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

void geglu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L);
// dup = dout * gelu_tanh(gate); dgate = dout * up * gelu_tanh'(gate).
void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L);

}  // namespace sf::cuda
