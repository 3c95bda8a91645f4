// Token embedding: out [N,H] = table[ids[n]]; dtable [V,H] += scatter of dout rows by ids.
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

// ids [N] I32. An id outside [0, V) writes a NaN row (so the loss turns NaN: loud, not silent).
void embedding_forward(Tensor out, Tensor ids, Tensor table, const Launch& L);
// Deterministic and atomic-free: the block of the first occurrence of each id sums, in token
// order and in fp32, the dout rows of all tokens with that id, then does one read-add-write of
// the dtable row (one bf16 rounding when dtable is BF16). Cost: an O(N^2) scan of the ids
// (L2-resident, ~0.3 ms at N = 16384), independent of V. Ids outside [0, V) are skipped.
void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, const Launch& L);
// out [N] = ids[n] where 0 <= ids[n] < limit, else 0 (I32; out may alias ids).
void ids_or_zero(Tensor out, Tensor ids, int64_t limit, const Launch& L);

}  // namespace sf::cuda
