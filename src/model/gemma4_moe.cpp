// Gemma 4's MoE block (HF Gemma4TextDecoderLayer with enable_moe_block, the 26B-A4B; docs/GEMMA4.md
// section 2), beside the dense MLP, against the kernel table:
//   m1 = norm_1(mlp_o)                                   post_feedforward_layernorm_1
//   r  = norm(x2) * router.scale * H^-1/2                the router reads x2, not the pre-ff norm
//   (w, idx) = renormalised top-k of softmax(r @ W_router^T);  w *= per_expert_scale[idx]
//   m2 = sum_j w_j * down_e(gelu_tanh(gate_e(xe)) * up_e(xe)),  xe = norm_pre2(x2),  e = idx_j
//   m  = m1 + norm_2(m2)                                 post_feedforward_layernorm_2
// and the layer's post_feedforward_layernorm then reads m where a dense layer reads mlp_o. The
// routing, permutation, grouped GEMMs and combine are the MoE families' ops (moe_program.cpp);
// GeGLU experts, the weighted router input and the per-expert scale are Gemma 4's. No
// load-balancing loss (transformers has none for Gemma 4). Rounding: the router input is one norm
// with the scale as its weight (transformers rounds after the norm and after the scale) and H^-1/2
// rides in the GEMM's alpha; the softmax runs in fp32 (transformers: the activation dtype). In
// fp32 those differ by ulps; in bf16 by bf16 rounding.
#include <cmath>

#include "model/program.h"

namespace sf {
namespace {
float router_alpha(const ModelSpec& s) { return float(1.0 / std::sqrt(double(s.hidden))); }  // H^-1/2 as transformers
}  // namespace

void Program::gemma4_moe_forward(const LayerParams& p, const LayerBuffers& w, const BatchDims& d, Stream& st) const {
  using P = LayerParam;
  const Gemma4MoeBuffers& b = w.moe4;
  const int64_t N = d.N(), E = s_.moe.n_expert, k = s_.moe.top_k, S = N * k, H = s_.hidden, Ie = s_.moe.intermediate;
  const Tensor logits = w.logits.view({N, E}), probs = w.probs.view({N, E});
  const Tensor idx = w.topk_idx.view({N, k}), wt = w.topk_w.view({N, k}), w_raw = b.w_raw.view({N, k});
  const Tensor sorted_slot = w.sorted_slot.view({S}), slot_pos = w.slot_pos.view({S});
  const Tensor xs = w.xs.view({S, H}), eg = w.egate.view({S, Ie}), eu = w.eup.view({S, Ie}), ea = w.eact.view({S, Ie});
  const Tensor ys = w.ys.view({S, H});
  norm_forward(b.m, b.rstd_m1, w.mlp_o, p[P::MlpOutNorm1], st);  // m1 (norm_2(m2) is added below)
  // Router.
  norm_forward(b.hr, b.rstd_r, w.x2, p[P::RouterScale], st);
  ops_.matmul(logits, b.hr, p[P::Router], false, true, router_alpha(s_), 0.f, st);
  ops_.moe_route(probs, idx, w_raw, Tensor(), logits, true, st);
  ops_.moe_expert_scale(wt, w_raw, idx, p[P::ExpertScale], st);
  // Experts.
  norm_forward(b.xe, b.rstd_xe, w.x2, p[P::MoeInNorm], st);
  ops_.moe_permute(w.offsets, sorted_slot, slot_pos, idx, st);
  ops_.moe_gather(xs, b.xe, sorted_slot, int(k), st);
  ops_.moe_grouped_matmul(eg, xs, p[P::ExpGate], w.offsets, true, 0.f, st);
  ops_.moe_grouped_matmul(eu, xs, p[P::ExpUp], w.offsets, true, 0.f, st);
  ops_.geglu_forward(ea, eg, eu, st);
  ops_.moe_grouped_matmul(ys, ea, p[P::ExpDown], w.offsets, true, 0.f, st);
  ops_.moe_combine(b.m2, ys, wt, slot_pos, st);
  norm_forward(b.xe, b.rstd_m2, b.m2, p[P::MoeOutNorm], st);  // xe is gathered: its buffer takes norm_2(m2)
  ops_.add(b.m, b.m, b.xe, st);
}

void Program::gemma4_moe_backward(const LayerParams& p, const LayerParams& g, Tensor dx, const LayerBuffers& w,
                                  const BatchDims& d, Stream& st) const {
  using P = LayerParam;
  const Gemma4MoeBuffers& b = w.moe4;
  const int64_t N = d.N(), E = s_.moe.n_expert, k = s_.moe.top_k, S = N * k, H = s_.hidden, Ie = s_.moe.intermediate;
  const Tensor dlogits = w.logits.view({N, E}), probs = w.probs.view({N, E});
  const Tensor idx = w.topk_idx.view({N, k}), wt = w.topk_w.view({N, k}), dwt = w.dtopk_w.view({N, k});
  const Tensor w_raw = b.w_raw.view({N, k}), slot_pos = w.slot_pos.view({S});
  const Tensor xs = w.xs.view({S, H}), eg = w.egate.view({S, Ie}), eu = w.eup.view({S, Ie}), ea = w.eact.view({S, Ie});
  const Tensor ys = w.ys.view({S, H}), dys = w.dys.view({S, H});
  const Tensor deg = eg, deu = eu;  // in place: egate and eup are not read again
  const Tensor dm = w.dh;           // d(m): both branches' output gradient
  // The experts: d(m2), the combine, the expert MLPs, d(xe) and the norm in front of them.
  const Tensor dm2 = b.xe;
  norm_backward(dm2, g[P::MoeOutNorm], dm, b.m2, p[P::MoeOutNorm], b.rstd_m2, false, st);
  ops_.moe_combine_backward(dys, dwt, dm2, ys, wt, slot_pos, st);
  ops_.moe_grouped_matmul_wgrad(g[P::ExpDown], dys, ea, w.offsets, st);
  const Tensor dact = ea;  // eact is no longer needed
  ops_.moe_grouped_matmul(dact, dys, p[P::ExpDown], w.offsets, false, 0.f, st);
  ops_.geglu_backward(deg, deu, dact, eg, eu, st);
  ops_.moe_grouped_matmul_wgrad(g[P::ExpGate], deg, xs, w.offsets, st);
  ops_.moe_grouped_matmul_wgrad(g[P::ExpUp], deu, xs, w.offsets, st);
  const Tensor dxs = ys;  // ys is no longer needed
  ops_.moe_grouped_matmul(dxs, deg, p[P::ExpGate], w.offsets, false, 0.f, st);
  ops_.moe_grouped_matmul(dxs, deu, p[P::ExpUp], w.offsets, false, 1.f, st);
  const Tensor dxe = b.m2;  // m2 is no longer needed
  ops_.moe_gather_backward(dxe, dxs, slot_pos, int(k), st);
  norm_backward(dx, g[P::MoeInNorm], dxe, w.x2, p[P::MoeInNorm], b.rstd_xe, true, st);
  // The router: the per-expert scale, the top-k and softmax, the projection, the weighted norm.
  ops_.moe_expert_scale_backward(dwt, g[P::ExpertScale], dwt, w_raw, idx, p[P::ExpertScale], st);
  ops_.moe_route_backward(dlogits, dwt, probs, idx, true, Tensor(), 0.f, st);
  const float alpha = router_alpha(s_);
  ops_.matmul(g[P::Router], dlogits, b.hr, true, false, alpha, 1.f, st);
  const Tensor dhr = b.xe;  // d(m2) is no longer needed
  ops_.matmul(dhr, dlogits, p[P::Router], false, false, alpha, 0.f, st);
  norm_backward(dx, g[P::RouterScale], dhr, w.x2, p[P::RouterScale], b.rstd_r, true, st);
  // The dense MLP's output norm: d(mlp_o) for the caller.
  norm_backward(b.m2, g[P::MlpOutNorm1], dm, w.mlp_o, p[P::MlpOutNorm1], b.rstd_m1, false, st);
}

}  // namespace sf
