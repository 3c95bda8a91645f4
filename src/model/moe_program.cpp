// The MLP half of a mixture-of-experts decoder layer (qwen3_moe, mixtral, olmoe), against the
// kernel table: router -> softmax top-k -> tokens sorted by expert -> grouped SwiGLU experts ->
// weighted combine. transformers' semantics: softmax in fp32, top-k, renormalise when
// norm_topk_prob (mixtral always), expert outputs times routing weight summed per token.
//
// Load-balancing loss (transformers' load_balancing_loss_func, on with output_router_logits):
// over the L MoE layers' router logits of one forward call concatenated, N tokens each,
//   aux = E * sum_e f_e P_e,  f_e = counts_e / (L N)  (top-k picks of expert e, all k ranks),
//                             P_e = sum of softmax probs of expert e / (L N),
// and the loss is CE_mean + coef * aux. counts are not differentiable, so
//   d(coef aux)/d(probs[n, e]) = coef * E * counts_e / (L N)^2,
// the same for every row of every MoE layer: moe_route_backward adds it before the softmax's
// backward. The counts must be those of the whole forward, hence BatchDims::moe_stats.
#include "model/program.h"

namespace sf {

float Program::moe_aux_grad_scale(const BatchDims& d) const {
  if (!s_.moe.aux_loss || d.moe_aux_weight == 0.f || d.moe_stats.empty()) return 0.f;
  const double LN = double(s_.moe.moe_layers()) * double(d.N());
  return float(double(d.moe_aux_weight) * s_.moe.n_expert / (LN * LN));
}

void Program::moe_forward(const LayerParams& p, Tensor h2, Tensor y, const LayerBuffers& w, const BatchDims& d,
                          Stream& st) const {
  using P = LayerParam;
  const int64_t N = d.N(), E = s_.moe.n_expert, k = s_.moe.top_k, S = N * k, H = s_.hidden, Ie = s_.moe.intermediate;
  Tensor logits = w.logits.view({N, E}), probs = w.probs.view({N, E});
  Tensor idx = w.topk_idx.view({N, k}), wt = w.topk_w.view({N, k});
  Tensor sorted_slot = w.sorted_slot.view({S}), slot_pos = w.slot_pos.view({S});
  Tensor xs = w.xs.view({S, H}), eg = w.egate.view({S, Ie}), eu = w.eup.view({S, Ie}), ea = w.eact.view({S, Ie});
  Tensor ys = w.ys.view({S, H});
  ops_.matmul(logits, h2, p[P::Router], false, true, 1.f, 0.f, st);
  const bool collect = d.moe_collect && moe_aux_grad_scale(d) != 0.f;
  ops_.moe_route(probs, idx, wt, collect ? d.moe_stats : Tensor(), logits, s_.moe.norm_topk, st);
  ops_.moe_permute(w.offsets, sorted_slot, slot_pos, idx, st);
  ops_.moe_gather(xs, h2, sorted_slot, int(k), st);
  ops_.moe_grouped_matmul(eg, xs, p[P::ExpGate], w.offsets, true, 0.f, st);
  ops_.moe_grouped_matmul(eu, xs, p[P::ExpUp], w.offsets, true, 0.f, st);
  ops_.swiglu_forward(ea, eg, eu, st);
  ops_.moe_grouped_matmul(ys, ea, p[P::ExpDown], w.offsets, true, 0.f, st);
  ops_.moe_combine(y, ys, wt, slot_pos, st);
}

void Program::moe_backward(const LayerParams& p, const LayerParams& g, Tensor h2, Tensor dy, Tensor dh,
                           const LayerBuffers& w, const BatchDims& d, Stream& st) const {
  using P = LayerParam;
  const int64_t N = d.N(), E = s_.moe.n_expert, k = s_.moe.top_k, S = N * k, H = s_.hidden, Ie = s_.moe.intermediate;
  Tensor dlogits = w.logits.view({N, E}), probs = w.probs.view({N, E});
  Tensor idx = w.topk_idx.view({N, k}), wt = w.topk_w.view({N, k}), dwt = w.dtopk_w.view({N, k});
  Tensor slot_pos = w.slot_pos.view({S});
  Tensor xs = w.xs.view({S, H}), eg = w.egate.view({S, Ie}), eu = w.eup.view({S, Ie}), ea = w.eact.view({S, Ie});
  Tensor ys = w.ys.view({S, H}), dys = w.dys.view({S, H});
  Tensor deg = eg, deu = eu;  // in place: egate and eup are not read again
  // y = sum_j w_j * expert_j(x): the expert outputs' and the routing weights' gradients.
  ops_.moe_combine_backward(dys, dwt, dy, ys, wt, slot_pos, st);
  ops_.moe_grouped_matmul_wgrad(g[P::ExpDown], dys, ea, w.offsets, st);
  Tensor dact = ea;  // eact is no longer needed
  ops_.moe_grouped_matmul(dact, dys, p[P::ExpDown], w.offsets, false, 0.f, st);
  ops_.swiglu_backward(deg, deu, dact, eg, eu, st);
  ops_.moe_grouped_matmul_wgrad(g[P::ExpGate], deg, xs, w.offsets, st);
  ops_.moe_grouped_matmul_wgrad(g[P::ExpUp], deu, xs, w.offsets, st);
  Tensor dxs = ys;  // ys is no longer needed
  ops_.moe_grouped_matmul(dxs, deg, p[P::ExpGate], w.offsets, false, 0.f, st);
  ops_.moe_grouped_matmul(dxs, deu, p[P::ExpUp], w.offsets, false, 1.f, st);
  ops_.moe_gather_backward(dh, dxs, slot_pos, int(k), st);
  // Router: through the top-k weights and the softmax (plus the load-balancing loss), then the
  // linear layer.
  const float aux = moe_aux_grad_scale(d);
  const Tensor counts = aux != 0.f ? Tensor(d.moe_stats.data, DType::F32, {E}) : Tensor();  // row 0 of [2, E]
  ops_.moe_route_backward(dlogits, dwt, probs, idx, s_.moe.norm_topk, counts, aux, st);
  ops_.matmul(dh, dlogits, p[P::Router], false, false, 1.f, 1.f, st);
  ops_.matmul(g[P::Router], dlogits, h2, true, false, 1.f, 1.f, st);
}

}  // namespace sf
