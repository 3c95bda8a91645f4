// Gemma 4's decoder layer (HF Gemma4TextDecoderLayer, docs/GEMMA4.md section 2) against the kernel
// table, for dense layers with their own K/V:
//   x2 = x  + norm_pa(o_proj(attention(norm_in(x))))
//   y  = x2 + norm_ff(down(gelu_tanh(gate(h2)) * up(h2))),  h2 = norm_pf(x2)
// every norm x^ * w (weight from 1, fp32 multiply: rmsnorm_* with offset 0). Attention: q/k norms,
// the weightless value norm (the (1 + w) kernel with a zero weight), on global layers with
// attention_k_eq_v the keys' projection as the values' input, the layer's own head dim, KV heads
// and RoPE table, softmax scale 1; the output times the layer's layer_scalar. K/V sharing
// (num_kv_shared_layers) through LayerBuffers::kv_*, which the engines set (engine/kv_share_store.h).
// Per-layer inputs: model/gemma4_ple.*; the MoE block beside the dense MLP: model/gemma4_moe.cpp.
#include "core/error.h"
#include "model/program.h"

namespace sf {
namespace {

// Layer l's attention sizes.
struct LayerDims {
  int64_t hd, kv_heads, q, kv, intermediate;
  bool k_is_v;  // values from the keys' projection
};

LayerDims dims_of(const ModelSpec& s, int l) {
  const Gemma4Spec& g = s.gemma4;
  LayerDims d;
  d.hd = g.head_dim[size_t(l)];
  d.kv_heads = g.kv_heads[size_t(l)];
  d.q = int64_t(s.n_head) * d.hd;
  d.kv = d.kv_heads * d.hd;
  d.intermediate = g.mlp_intermediate(l, s.intermediate);
  d.k_is_v = g.k_eq_v && !s.is_local(l);
  return d;
}

// x's storage viewed as [rows, cols] (the workspace's buffers are sized for the widest layer).
Tensor as(const Tensor& x, int64_t rows, int64_t cols) { return x.view({rows, cols}); }

}  // namespace

void Program::gemma4_attention_forward(const LayerParams& p, Tensor h1, const LayerBuffers& w, const BatchDims& d,
                                       const RopeTables& rope, Stream& st, bool attention_kept) const {
  using P = LayerParam;
  const int l = p.layer;
  const bool sharing = s_.gemma4.kv_shared(l);
  SF_CHECK(!sharing || !w.kv_k.empty(),
           "gemma4 layer " + std::to_string(l) + " shares K/V: its source's store is needed");
  const LayerDims ld = dims_of(s_, l);
  const int64_t N = d.N(), nq = s_.n_head, hd = ld.hd, kvh = ld.kv_heads;
  const Tensor q_raw = as(w.q_raw, N, ld.q), k_raw = as(w.k_raw, N, ld.kv);
  const Tensor q = as(w.q, N, ld.q);
  // A sharing layer attends to its source's keys and values (normed, rotated) as they are.
  const Tensor k = as(sharing ? w.kv_k : w.k, N, ld.kv), v = as(sharing ? w.kv_v : w.v, N, ld.kv);
  const bool local = s_.is_local(l);
  const Tensor& cos = local ? rope.cos_local : rope.cos;
  const Tensor& sin = local ? rope.sin_local : rope.sin;
  linear(q_raw, h1, p[P::Wq], Tensor(), st);
  norm_forward(q.view({N * nq, hd}), w.q_rstd.view({N * nq}), q_raw.view({N * nq, hd}), p[P::QNorm], st);
  ops_.rope_forward(q, cos, sin, d.T, int(nq), int(hd), d.pos, st);
  if (sharing) {
    if (!attention_kept) ops_.attention_forward(as(w.att, N, ld.q), w.lse, q, k, v, attn_dims(s_, d, l), st);
    return;
  }
  linear(k_raw, h1, p[P::Wk], Tensor(), st);
  const Tensor v_in = ld.k_is_v ? k_raw : as(w.v_raw, N, ld.kv);  // values before their norm
  if (!ld.k_is_v) linear(v_in, h1, p[P::Wv], Tensor(), st);
  norm_forward(k.view({N * kvh, hd}), w.k_rstd.view({N * kvh}), k_raw.view({N * kvh, hd}), p[P::KNorm], st);
  const Tensor zero = w.v_zero.view({hd});
  ops_.zero(zero, st);
  ops_.rmsnorm_1p_forward(v.view({N * kvh, hd}), w.v_rstd.view({N * kvh}), v_in.view({N * kvh, hd}), zero,
                          float(s_.rms_eps), st);
  ops_.rope_forward(k, cos, sin, d.T, int(kvh), int(hd), d.pos, st);
  if (!w.kv_k.empty()) {  // a source of later layers' K/V: kept for them (the recompute writes the same bits)
    ops_.cast(as(w.kv_k, N, ld.kv), k, st);
    ops_.cast(as(w.kv_v, N, ld.kv), v, st);
  }
  if (!attention_kept) ops_.attention_forward(as(w.att, N, ld.q), w.lse, q, k, v, attn_dims(s_, d, l), st);
}

void Program::gemma4_attention_backward(const LayerParams& p, const LayerParams& g, Tensor h1, const LayerBuffers& w,
                                        const BatchDims& d, const RopeTables& rope, Stream& st) const {
  using P = LayerParam;
  const int l = p.layer;
  const LayerDims ld = dims_of(s_, l);
  const int64_t N = d.N(), nq = s_.n_head, hd = ld.hd, kvh = ld.kv_heads;
  const Tensor q_raw = as(w.q_raw, N, ld.q), k_raw = as(w.k_raw, N, ld.kv);
  const Tensor dq = as(w.dq, N, ld.q), dk = as(w.dk, N, ld.kv), dv = as(w.dv, N, ld.kv);
  const Tensor dq_raw = as(w.dq_raw, N, ld.q), dk_raw = as(w.dk_raw, N, ld.kv);
  const bool sharing = s_.gemma4.kv_shared(l);
  const Tensor k = as(sharing ? w.kv_k : w.k, N, ld.kv), v = as(sharing ? w.kv_v : w.v, N, ld.kv);
  ops_.attention_backward(dq, dk, dv, as(w.datt, N, ld.q), as(w.q, N, ld.q), k, v, as(w.att, N, ld.q), w.lse,
                          attn_dims(s_, d, l), w.attn_ws, st);
  // K/V sharing: a sharing layer adds its d(k), d(v) to its source's accumulators; the source
  // (whose backward runs later) adds them to its own before going through RoPE and the norms.
  if (!w.kv_dk.empty()) {
    const Tensor acc_k = as(w.kv_dk, N, ld.kv), acc_v = as(w.kv_dv, N, ld.kv);
    ops_.add(sharing ? acc_k : dk, acc_k, dk, st);
    ops_.add(sharing ? acc_v : dv, acc_v, dv, st);
  }
  const bool local = s_.is_local(l);
  const Tensor& cos = local ? rope.cos_local : rope.cos;
  const Tensor& sin = local ? rope.sin_local : rope.sin;
  ops_.rope_backward(dq, cos, sin, d.T, int(nq), int(hd), d.pos, st);
  norm_backward(dq_raw.view({N * nq, hd}), g[P::QNorm], dq.view({N * nq, hd}), q_raw.view({N * nq, hd}), p[P::QNorm],
                w.q_rstd.view({N * nq}), false, st);
  if (sharing) {
    linear_backward(w.dh, g[P::Wq], Tensor(), dq_raw, h1, p[P::Wq], false, st);
    return;
  }
  ops_.rope_backward(dk, cos, sin, d.T, int(kvh), int(hd), d.pos, st);
  norm_backward(dk_raw.view({N * kvh, hd}), g[P::KNorm], dk.view({N * kvh, hd}), k_raw.view({N * kvh, hd}),
                p[P::KNorm], w.k_rstd.view({N * kvh}), false, st);
  // The value norm's gradient: into the keys' projection gradient when values are keys (added to
  // what the key path gave it), else into its own.
  const Tensor v_in = ld.k_is_v ? k_raw : as(w.v_raw, N, ld.kv);
  const Tensor dv_in = ld.k_is_v ? dk_raw : as(w.dv_raw, N, ld.kv);
  const Tensor zero = w.v_zero.view({hd});  // still zero: written by the forward, read-only since
  ops_.rmsnorm_1p_backward(dv_in.view({N * kvh, hd}), Tensor(), dv.view({N * kvh, hd}), v_in.view({N * kvh, hd}), zero,
                           w.v_rstd.view({N * kvh}), ld.k_is_v, st);
  linear_backward(w.dh, g[P::Wq], Tensor(), dq_raw, h1, p[P::Wq], false, st);
  linear_backward(w.dh, g[P::Wk], Tensor(), dk_raw, h1, p[P::Wk], true, st);
  if (!ld.k_is_v) linear_backward(w.dh, g[P::Wv], Tensor(), dv_in, h1, p[P::Wv], true, st);
}

void Program::gemma4_layer_forward(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                                   const RopeTables& rope, Stream& st, bool attention_kept) const {
  using P = LayerParam;
  const LayerDims ld = dims_of(s_, p.layer);
  const int64_t N = d.N();
  norm_forward(w.h1, w.rstd1, x, p[P::InputNorm], st);
  gemma4_attention_forward(p, w.h1, w, d, rope, st, attention_kept);
  linear(w.attn_o, as(w.att, N, ld.q), p[P::Wo], Tensor(), st);
  norm_forward(w.x2, w.rstd_ao, w.attn_o, p[P::AttnOutNorm], st);
  ops_.add(w.x2, w.x2, x, st);  // residual
  norm_forward(w.h2, w.rstd2, w.x2, p[P::PostNorm], st);
  const Tensor gate = as(w.gate, N, ld.intermediate), up = as(w.up, N, ld.intermediate);
  const Tensor act = as(w.act, N, ld.intermediate);
  linear(gate, w.h2, p[P::Wgate], Tensor(), st);
  linear(up, w.h2, p[P::Wup], Tensor(), st);
  ops_.geglu_forward(act, gate, up, st);
  linear(w.mlp_o, act, p[P::Wdown], Tensor(), st);
  const bool moe = s_.gemma4.moe_block;
  if (moe) gemma4_moe_forward(p, w, d, st);  // the routed experts beside it: m = w.moe4.m
  if (y.empty()) return;
  norm_forward(y, w.rstd_mo, moe ? w.moe4.m : w.mlp_o, p[P::FfnOutNorm], st);
  ops_.add(y, y, w.x2, st);  // residual
  if (s_.gemma4.ple_dim > 0) {  // the per-layer input, before the layer's scale
    SF_CHECK(!w.pli_l.empty(), "Gemma 4 layer with per-layer inputs: LayerBuffers::pli_l not set");
    PleProgram(s_, ops_, act_).layer_forward(p, y, w.pli_l, w.ple, st);
  }
  const float c = s_.gemma4.layer_scalar[size_t(p.layer)];
  if (c != 1.f) ops_.scale(y, c, st);  // hidden_states *= layer_scalar
}

void Program::gemma4_layer_backward(const LayerParams& p, const LayerParams& g, Tensor x, Tensor dy, Tensor dx,
                                    const LayerBuffers& w, const BatchDims& d, const RopeTables& rope,
                                    Stream& st) const {
  using P = LayerParam;
  const LayerDims ld = dims_of(s_, p.layer);
  const int64_t N = d.N(), I = ld.intermediate;
  // As Gemma 3's (program_gemma3.cpp): dx holds d(x2) until the attention branch and the input
  // norm add theirs; w.dh carries d(mlp_o), d(h2), d(attn_o) and d(h1) in turn.
  // y = c * (x2 + norm_ff(mlp_o)): dx starts as d(x2) = c * dy, which is also d(norm_ff's output).
  ops_.cast(dx, dy, st);
  const float c = s_.gemma4.layer_scalar[size_t(p.layer)];
  if (c != 1.f) ops_.scale(dx, c, st);
  if (s_.gemma4.ple_dim > 0) {  // dx: d(the per-layer input block's output) -> d(its input)
    SF_CHECK(!w.dpli_l.empty(), "Gemma 4 layer with per-layer inputs: LayerBuffers::dpli_l not set");
    PleProgram(s_, ops_, act_).layer_backward(p, g, dx, w.dpli_l, w.pli_l, w.ple, st);
  }
  const bool moe = s_.gemma4.moe_block;
  norm_backward(w.dh, g[P::FfnOutNorm], dx, moe ? w.moe4.m : w.mlp_o, p[P::FfnOutNorm], w.rstd_mo, false, st);
  if (moe) gemma4_moe_backward(p, g, dx, w, d, st);  // d(m) in dh -> d(x2) += ..., d(mlp_o) in moe4.m2
  const Tensor dmo = moe ? w.moe4.m2 : w.dh;
  // gate and up take their own gradients (in place, as the dense Llama layer's).
  const Tensor act = as(w.act, N, I), dgate = as(w.gate, N, I), dup = as(w.up, N, I);
  ops_.matmul(g[P::Wdown], dmo, act, true, false, 1.f, 1.f, st);
  const Tensor dact = act;  // act is no longer needed
  ops_.matmul(dact, dmo, p[P::Wdown], false, false, 1.f, 0.f, st);
  ops_.geglu_backward(dgate, dup, dact, dgate, dup, st);
  linear_backward(w.dh, g[P::Wgate], Tensor(), dgate, w.h2, p[P::Wgate], false, st);
  linear_backward(w.dh, g[P::Wup], Tensor(), dup, w.h2, p[P::Wup], true, st);
  norm_backward(dx, g[P::PostNorm], w.dh, w.x2, p[P::PostNorm], w.rstd2, true, st);

  const Tensor dao = w.dh;
  norm_backward(dao, g[P::AttnOutNorm], dx, w.attn_o, p[P::AttnOutNorm], w.rstd_ao, false, st);
  ops_.matmul(as(w.datt, N, ld.q), dao, p[P::Wo], false, false, 1.f, 0.f, st);
  ops_.matmul(g[P::Wo], dao, as(w.att, N, ld.q), true, false, 1.f, 1.f, st);
  gemma4_attention_backward(p, g, w.h1, w, d, rope, st);
  norm_backward(dx, g[P::InputNorm], w.dh, x, p[P::InputNorm], w.rstd1, true, st);
}

}  // namespace sf
