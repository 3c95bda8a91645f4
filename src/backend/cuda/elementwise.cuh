// Element-wise ops of the kernel table: add, scale, cast, zero (ops.h has the semantics).
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// out[n] = a[n] + b[n]; out may alias a or b. Any mix of F32/BF16.
void add(Tensor out, Tensor a, Tensor b, const Launch& L);
// x[n] *= alpha.
void scale(Tensor x, float alpha, const Launch& L);
// out[n] = in[n] converted (round to nearest even for bf16). Same dtype: a device copy.
void cast(Tensor out, Tensor in, const Launch& L);
// x[n] = 0 (a memset: all-zero bits are 0 in F32, BF16 and I32).
void zero(Tensor x, const Launch& L);

}  // namespace sf::cuda
