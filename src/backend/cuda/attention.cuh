// Causal GQA attention (ops.h attention_forward / attention_backward).
//
// Fast path (q, k, v, out, dq, dk, dv, dout all BF16, head_dim 64 or 128, 16-byte aligned):
// FlashAttention-2 with mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix from XOR-swizzled
// shared memory, cp.async double buffering, online softmax in the exp2 domain, fp32 lse saved.
//   forward : block = 128 query rows of one (head, sequence), 4 warps x 32 rows (two m16 tiles
//             per warp share every K/V fragment); K/V tiles of 32 (hd 128) or 64 (hd 64) rows.
//   backward: block = 128 key rows of one (kv head, sequence), 8 warps x 16 key rows; loops over
//             the query heads of the GQA group and the causal query tiles (64 rows); dK, dV stay
//             in registers (no atomics; the GQA reduction is the loop); dQ is accumulated in fp32
//             in the workspace with float2 atomics and cast at the end. D = rowsum(dO * O) first.
//   Both launch their blocks longest-first (the causal tiles with the most work on every head
//   first, the light ones fill the tail).
//   Other tile shapes are kept as selectable variants (attention.cu; measured in bench_kernels).
// Any other case (F32, other head dims, unaligned views) runs simple, exact-softmax warp-per-row
// kernels (slow, O(T^2 * hd) per head, meant for tests and odd shapes).
#pragma once
#include "backend/cuda/launch.h"
#include "backend/cuda/workspace_sizes.h"
#include "backend/ops.h"

namespace sf::cuda {

// attention_workspace_bytes: backend/cuda/workspace_sizes.h.
// out, q [B*T, n_head*hd]; k, v [B*T, n_kv_head*hd]; lse [B, n_head, T] F32 (may be empty).
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttnDims& d, Tensor ws, const Launch& L);

// For tests and benchmarks: route everything to the simple kernels.
void attention_force_simple(bool on);
// For tests and benchmarks: pick the flash kernel variants (-1: the default per head dim, the
// fastest measured; see attention.cu). SF_ATTN_FWD / SF_ATTN_BWD in the environment set them too.
void attention_set_variant(int fwd, int bwd);
int attention_fwd_variants();
// For tests and benchmarks: block launch order of the flash kernels, longest-first (default) or
// head by head (SF_ATTN_LPT=0).
void attention_set_longest_first(bool on);
int attention_bwd_variants();

}  // namespace sf::cuda
