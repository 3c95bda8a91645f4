// Bias add and its backward; plus the column-sum finalize shared by reductions over rows.
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// out [M,N] += bias [N] (broadcast over rows).
void add_bias(Tensor out, Tensor bias, const Launch& L);
// dbias [N] += sum over rows of dout [M,N]. Deterministic: per-block partial sums [P,N] in the
// stream's scratch, then one pass adding the P partials of each column into dbias.
void bias_backward(Tensor dbias, Tensor dout, const Launch& L);

// dst [C] (F32 or BF16) += sum_p partial[p*C + c], p < P. partial: F32 device memory.
void colsum_accumulate(Tensor dst, const float* partial, int P, int64_t C, const Launch& L);

}  // namespace sf::cuda
