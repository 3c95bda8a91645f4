// RMSNorm (HF Llama): out = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps), over the last dim.
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// out [R,C], x [R,C], w [C] (F32/BF16, any mix); rstd [R] F32 or empty.
// One block per row (C/32 threads, the row held in registers in its storage format): sum of
// squares (block reduction), then the scaled write.
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, const Launch& L);
// dx [R,C] = (accumulate ? dx : 0) + rstd*(g*w) - x*rstd^3*mean(g*w*x); dw [C] += sum_r g*x*rstd
// (dw optional). Fast path (C % 8 == 0, 16-byte aligned, C <= 24K): P blocks (as many as are
// resident) walk the rows with the next rows' dout / x prefetched into registers while the current
// one is reduced and written; each keeps its dw partial [C] in shared memory and writes it to the
// stream scratch [P,C]; the P partials are added into dw in a fixed order (deterministic, no
// atomics). The variants (rmsnorm_set_backward_variant) differ in how:
//   0: one row prefetched (copied between register buffers at the end of each row); a second
//      kernel sums the partials, one thread per column (colsum_accumulate).
//   1: a ring of 2 register buffers (2 rows in flight while a row is reduced, no copies), rstd
//      prefetched with its row, rows evened out over the blocks; a second kernel sums the partials
//      with 32 slices of P per column quad (rmsnorm_dw_reduce_kernel).
//   2: as 1, but one cooperative launch: grid barrier, then every block sums a slice of the
//      columns over the P partials (no second kernel).
//   3: as 2 with a ring of 3 (bf16 dout and x; 2 otherwise) and at most 2 blocks per SM (fewer
//      partials).
//   4: as 2 with a ring of 3 and as many blocks as are resident.
// Other shapes run one generic kernel for every variant.
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      const Launch& L);

// For tests and benchmarks: the backward variant above (out of range, e.g. -1: the default).
// The environment variable SF_RMSNORM_BWD_VARIANT, read once at start-up, sets the initial one.
void rmsnorm_set_backward_variant(int v);
int rmsnorm_backward_variant();
int rmsnorm_backward_variants();

}  // namespace sf::cuda
