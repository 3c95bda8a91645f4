// Fused head: loss / dx / dw of cross-entropy(x @ w^T, labels), chunked over tokens so that
// the N x V logits never exist at once (ops.h linear_cross_entropy).
//
// Per chunk of Nc tokens:
//   1. logits [Nc, V] F32 = x_c @ w^T                         (cuBLASLt, into the workspace)
//   2. one block per row: max / sum-exp (online), loss_row = lse - logit[label] into a [Nc] F32
//      buffer in the stream's kernel scratch (one block then adds them, in order, to loss_sum); then g = grad_scale *
//      (softmax - onehot) (0 on ignored rows) written IN PLACE: for BF16 x/w, g is BF16 with row stride 2V elements
//      (the first half of each F32 row); the in-place narrowing is race-free because each block converts its row front
//      to back in tiles with a barrier between a tile's reads and its writes.
//   3. dw [V, H] += g^T @ x_c (cuBLASLt, beta = 1), then dx_c [Nc, H] = g @ w (dx may alias x).
// A BF16 dw is read-added-rounded once per chunk (the CPU twin keeps an fp32 copy and rounds once).
// The workspace is exactly the chunk's F32 logits: Nc*V*4 bytes, chosen so that for large N it plus
// the stream's 32 MiB cuBLASLt workspace stays within 1/8 of the BF16 N x V logits (at N = 16384,
// V = 128256: Nc = 896, 438 MiB + 32 MiB = 0.117 of the logits). Every stream also has a 32 MiB
// kernel scratch (the per-row losses live there).
#pragma once
#include "backend/cuda/launch.h"
#include "backend/cuda/workspace_sizes.h"

namespace sf::cuda {

// linear_ce_chunk_rows, linear_ce_workspace_bytes: backend/cuda/workspace_sizes.h.
// softcap > 0: Gemma 4's final_logit_softcapping, the loss on c tanh(logits / c) (step 2 caps the
// row in place first and scales its gradient by 1 - tanh^2); 0: none.
void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float grad_scale,
                          Tensor ws, const Launch& L, float softcap = 0.f);

}  // namespace sf::cuda
