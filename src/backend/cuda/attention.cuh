// Causal GQA attention (ops.h attention_forward / attention_backward).
//
// Two kernel families, chosen by the device's compute capability (and the shapes), never by the
// environment:
// - sm_90 (Hopper; attention_sm90.cu): FlashAttention-3 style, wgmma + TMA, a producer warp and
//   two consumer warpgroups; forward with the softmax of one tile overlapping the GEMMs of its
//   neighbours, backward with dK, dV in registers and dQ by wgmma, added into an fp32 workspace
//   by TMA reduce-add (hd 128) or fp32 atomics (hd 64, 256). Forward head dim 64 / 128, backward
//   64 / 128 / 256 (hd 256: the consumers split dK / dV's columns and share P^T, dS^T through
//   shared memory); any T, GQA, packed rows, sliding windows; BF16, 16-byte aligned (the
//   workspace too).
// - sm_80 (every other case of BF16 with head_dim 64 / 128 / 256, 16-byte aligned, and every GPU
//   but Hopper): FlashAttention-2 with mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix from
//   XOR-swizzled shared memory, cp.async double buffering, online softmax in the exp2 domain, fp32
//   lse saved. One tile shape per head dim (FwdTraits / BwdTraits in attention.cu, the fastest
//   measured), and a smaller one where that does not fit the device's shared memory a block
//   (FwdTraitsSmall / BwdTraitsSmall: 99 KiB on sm_86 / sm_89, 163 KiB on an A100):
//   forward : block = 128 query rows of one (head, sequence), 4 warps x 32 rows (two m16 tiles
//             per warp share every K/V fragment); K/V tiles of 32 (hd 128) or 64 (hd 64) rows.
//   backward: block = 128 key rows of one (kv head, sequence), 8 warps x 16 key rows; loops over
//             the query heads of the GQA group and the causal query tiles (64 rows); dK, dV stay
//             in registers (no atomics; the GQA reduction is the loop); dQ is accumulated in fp32
//             in the workspace with float4 atomics and cast at the end. D = rowsum(dO * O) first.
//   Both launch their blocks longest-first (the causal tiles with the most work on every head
//   first, the light ones fill the tail).
// Any other case (F32, other head dims, unaligned views) runs simple, exact-softmax warp-per-row
// kernels (slow, O(T^2 * hd) per head, meant for tests and odd shapes). Head dims above 256 (up
// to 512: Gemma 4's global layers) run there too, chosen by the head dim alone: a flash tile's
// fp32 output accumulator of 512 columns does not fit in a thread's registers.
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

// For tests and benchmarks only (the program always runs Auto): Auto picks the family by the
// device (sm_90 kernels on Hopper where they apply); Sm80 keeps the sm_80 flash kernels on any
// device, so they stay tested on Hopper; Sm80Small runs them with the tiles of GPUs with less
// shared memory a block (99 KiB: sm_86, sm_89); Simple routes everything to the simple kernels.
enum class AttnPath { Auto, Sm80, Sm80Small, Simple };
void attention_force_path(AttnPath p);

}  // namespace sf::cuda
