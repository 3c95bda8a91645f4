// Squared L2 norm: out [1] F32 += sum(x^2).
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// x: any shape, F32 or BF16. Per-thread fp32 partials, block reduction, one atomicAdd per block
// (so the last bits of the sum depend on block order; the CPU twin sums in fp64).
void sq_norm(Tensor out, Tensor x, const Launch& L);

}  // namespace sf::cuda
