// RMSNorm (HF Llama): out = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps), over the last dim.
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// out [R,C], x [R,C], w [C] (F32/BF16, any mix); rstd [R] F32 or empty.
// One block per row (C/32 threads, the row held in registers in its storage format): sum of
// squares (block reduction), then the scaled write.
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, const Launch& L);
// dx [R,C] = (accumulate ? dx : 0) + rstd*(g*w) - x*rstd^3*mean(g*w*x); dw [C] += sum_r g*x*rstd
// (dw optional). P blocks (as many as fit on the GPU) walk the rows, the next row prefetched into
// registers while the current one is reduced and written; each keeps its dw partial [C] in shared
// memory and writes it to the stream scratch [P,C]; a second kernel adds the P partials into dw
// in a fixed order (deterministic, no atomics).
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      const Launch& L);

}  // namespace sf::cuda
