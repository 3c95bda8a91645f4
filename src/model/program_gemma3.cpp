// Gemma 3's decoder layer (HF Gemma3DecoderLayer) against the kernel table:
//   x2 = x  + norm_ao(o_proj(attention(norm_in(x))))
//   y  = x2 + norm_mo(down(gelu_tanh(gate(h2)) * up(h2))),  h2 = norm_pre(x2)
// every norm Gemma's (1 + w) RMSNorm; q/k norms, RoPE (local or global tables) and the local
// window in the shared attention block (program.cpp).
#include "model/program.h"

namespace sf {

void Program::gemma_layer_forward(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                                  const RopeTables& rope, Stream& st, bool attention_kept) const {
  using P = LayerParam;
  norm_forward(w.h1, w.rstd1, x, p[P::InputNorm], st);
  attention_block_forward(p, w.h1, w, d, rope, st, attention_kept);
  linear(w.attn_o, w.att, p[P::Wo], p[P::Bo], st);
  norm_forward(w.x2, w.rstd_ao, w.attn_o, p[P::AttnOutNorm], st);
  ops_.add(w.x2, w.x2, x, st);  // residual
  norm_forward(w.h2, w.rstd2, w.x2, p[P::PostNorm], st);
  linear(w.gate, w.h2, p[P::Wgate], p[P::Bgate], st);
  linear(w.up, w.h2, p[P::Wup], p[P::Bup], st);
  ops_.geglu_forward(w.act, w.gate, w.up, st);
  linear(w.mlp_o, w.act, p[P::Wdown], p[P::Bdown], st);
  norm_forward(y, w.rstd_mo, w.mlp_o, p[P::FfnOutNorm], st);
  ops_.add(y, y, w.x2, st);  // residual
}

void Program::gemma_layer_backward(const LayerParams& p, const LayerParams& g, Tensor x, Tensor dy, Tensor dx,
                                   const LayerBuffers& w, const BatchDims& d, const RopeTables& rope,
                                   Stream& st) const {
  using P = LayerParam;
  // dx holds d(x2) (the residual's dy plus the MLP branch's) until the attention branch and the
  // input norm add theirs. w.dh carries, in turn, d(mlp_o), d(h2), d(attn_o) and d(h1): each is
  // consumed before the next overwrites it.
  ops_.cast(dx, dy, st);
  Tensor dmo = w.dh;
  norm_backward(dmo, g[P::FfnOutNorm], dy, w.mlp_o, p[P::FfnOutNorm], w.rstd_mo, false, st);
  ops_.matmul(g[P::Wdown], dmo, w.act, true, false, 1.f, 1.f, st);
  if (!g[P::Bdown].empty()) ops_.bias_backward(g[P::Bdown], dmo, st);
  Tensor dact = w.act;  // act is no longer needed
  ops_.matmul(dact, dmo, p[P::Wdown], false, false, 1.f, 0.f, st);
  const Tensor dgate = w.gate, dup = w.up;  // in place, as the dense Llama layer's
  ops_.geglu_backward(dgate, dup, dact, w.gate, w.up, st);
  linear_backward(w.dh, g[P::Wgate], g[P::Bgate], dgate, w.h2, p[P::Wgate], false, st);
  linear_backward(w.dh, g[P::Wup], g[P::Bup], dup, w.h2, p[P::Wup], true, st);
  norm_backward(dx, g[P::PostNorm], w.dh, w.x2, p[P::PostNorm], w.rstd2, true, st);

  // x2 = x + norm_ao(attn_o): d(attn_o) from d(x2).
  Tensor dao = w.dh;
  norm_backward(dao, g[P::AttnOutNorm], dx, w.attn_o, p[P::AttnOutNorm], w.rstd_ao, false, st);
  ops_.matmul(w.datt, dao, p[P::Wo], false, false, 1.f, 0.f, st);
  ops_.matmul(g[P::Wo], dao, w.att, true, false, 1.f, 1.f, st);
  if (!g[P::Bo].empty()) ops_.bias_backward(g[P::Bo], dao, st);
  attention_block_backward(p, g, w.h1, w, d, rope, st);
  norm_backward(dx, g[P::InputNorm], w.dh, x, p[P::InputNorm], w.rstd1, true, st);
}

}  // namespace sf
