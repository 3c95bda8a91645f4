// RoPE in place, HF half-split layout (ops.h): for each head, the pair (i, i + hd/2) at position
// p = pos[row] (packed rows; pos [B*T] I32, values in [0, T)) or row % T (pos empty) is rotated by the angle whose
// cos/sin are cos[p, i], sin[p, i] (F32 tables).
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// x [B*T, n_heads*head_dim] (F32/BF16); cos, sin [T_max >= T, head_dim/2] F32.
void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos, const Launch& L);
// The inverse rotation, applied to a gradient in place.
void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos, const Launch& L);

}  // namespace sf::cuda
