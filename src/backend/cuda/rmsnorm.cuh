// RMSNorm (HF Llama): out = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps), over the last dim.
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// out [R,C], x [R,C], w [C] (F32/BF16, any mix); rstd [R] F32 or empty.
// One block per row (C/32 threads, the row held in registers in its storage format): sum of
// squares (block reduction), then the scaled write.
// w_offset: the weight is w + w_offset in fp32 (1: Gemma's (1 + w), rmsnorm_1p_*).
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, const Launch& L, float w_offset = 0.f);
// dx [R,C] = (accumulate ? dx : 0) + rstd*(g*w) - x*rstd^3*mean(g*w*x); dw [C] += sum_r g*x*rstd
// (dw optional). Fast path (C % 8 == 0, 16-byte aligned, C <= 24K): P blocks (as many as are
// resident) walk the rows with the next row's dout / x prefetched into registers while the current
// one is reduced and written; each keeps its dw partial [C] in shared memory and writes it to the
// stream scratch [P,C]; a second kernel adds the P partials into dw in a fixed order, one thread
// per column (colsum_accumulate: deterministic, no atomics). Other shapes, or a C whose fast
// kernel does not fit on an SM, run one generic kernel.
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      const Launch& L, float w_offset = 0.f);

}  // namespace sf::cuda
