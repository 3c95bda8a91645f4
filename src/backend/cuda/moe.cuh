// Mixture-of-experts kernels (ops.h documents each; the cpu twins are backend/cpu/moe.cpp).
#pragma once
#include "backend/cuda/launch.h"

namespace sf::cuda {

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm, const Launch& L);
void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                        float aux_scale, const Launch& L);
// Expert indices outside [0, E) (moe_route never writes them) are left out of the sort.
void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, const Launch& L);
void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, const Launch& L);
void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, const Launch& L);
// The grouped GEMMs (moe_gemm.cpp): one cuBLASLt GEMM per expert with rows, on the dtypes the
// dense matmul takes (a, w BF16 with out BF16 or F32; all F32); other dtypes are refused.
void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta, const Launch& L);
void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, const Launch& L);
// For tests and benchmarks only (the program never calls it): true runs every expert's GEMM on
// the caller's stream instead of spreading them over the expert streams (the same bits either
// way; the tests check that, the benchmark times both).
void moe_gemm_force_one_stream(bool one);
void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, const Launch& L);
void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                               const Launch& L);
void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, const Launch& L);
void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                          const Launch& L);
void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, const Launch& L);

}  // namespace sf::cuda
