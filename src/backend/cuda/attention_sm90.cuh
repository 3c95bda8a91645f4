// Causal GQA attention forward and backward for Hopper (sm_90a): FlashAttention-3 style (attention.cuh says
// when it runs). Compiled for sm_90a alone (CMake target sf_cuda_sm90); the caller checks the
// device's compute capability before calling.
#pragma once
#include "backend/cuda/launch.h"
#include "backend/ops.h"

namespace sf::cuda {

// What the sm_90 kernels take: head_dim 64 or 128 (the forward), 64, 128 or 256 (the backward),
// with or without packed rows and a sliding window (BF16, 16-byte aligned tensors: the caller's
// check).
bool attention_sm90_forward_supported(const AttnDims& d);
bool attention_sm90_backward_supported(const AttnDims& d);
// Whether the backward adds dQ into dq_acc in the permuted layout of attention.cu's
// dq_permuted_pos (16-column groups; hd 256: float4 atomics) rather than the natural one.
bool attention_sm90_dq_permuted(int head_dim);
// out, q [B*T, n_head*hd]; k, v [B*T, n_kv_head*hd]; lse [B, n_head, T] F32 (may be empty).
// Persistent (one CTA an SM): uses 4 bytes of the stream's scratch (L.scratch) as its tile counter.
void attention_forward_sm90(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L);

// The main backward kernel: dK, dV (bf16) and dQ accumulated in fp32 into dq_acc [B*T, n_head*hd]
// (zeroed by the caller, which casts it; 16-byte aligned: hd 64 and 128 add by TMA reduce-add,
// hd 256 by float4 atomics, permuted); D [B, n_head, T] = rowsum(dO * O), lse as the forward's.
void attention_backward_sm90(float* dq_acc, const float* D, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor lse, const AttnDims& d, const Launch& L);

}  // namespace sf::cuda
