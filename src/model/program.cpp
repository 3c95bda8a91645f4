#include "model/program.h"

#include <algorithm>
#include <cmath>

#include "core/align.h"
#include "core/dtype.h"
#include "core/error.h"

namespace sf {
namespace {

// Carves aligned tensors out of one block; with base == nullptr it only measures.
struct Carver {
  char* base;
  size_t off = 0;
  Tensor take(DType t, std::initializer_list<int64_t> dims) {
    Tensor x(nullptr, t, dims);
    x.data = base ? base + off : nullptr;
    off += round256(x.bytes());
    return x;
  }
  Tensor take_bytes(size_t n) {
    Tensor x(nullptr, DType::F32, {int64_t((n + 3) / 4)});
    x.data = (base && n) ? base + off : nullptr;
    off += round256(n);
    return x;
  }
};

// The widest layer's attention sizes: Gemma 4's differ per layer (docs/GEMMA4.md), every other
// family's are the model's.
struct Widths {
  int64_t q, kv, kv_heads, head_dim, intermediate;
};
Widths max_widths(const ModelSpec& s) {
  Widths m{s.q_dim(), s.kv_dim(), s.n_kv_head, s.head_dim, s.intermediate};
  if (s.arch != Arch::Gemma4) return m;
  for (int l = 0; l < s.n_layer; ++l) {
    const int64_t hd = s.gemma4.head_dim[size_t(l)], kvh = s.gemma4.kv_heads[size_t(l)];
    m.q = std::max(m.q, int64_t(s.n_head) * hd);
    m.kv = std::max(m.kv, kvh * hd);
    m.kv_heads = std::max(m.kv_heads, kvh);
    m.head_dim = std::max(m.head_dim, hd);
    m.intermediate = std::max(m.intermediate, s.gemma4.mlp_intermediate(l, s.intermediate));
  }
  return m;
}

bool has_dense_mlp(const ModelSpec& s) {
  if (s.arch == Arch::Gemma4) return true;  // its MoE block runs beside the dense MLP
  for (int l = 0; l < s.n_layer; ++l)
    if (!s.moe_layer(l)) return true;
  return false;
}

// What a layer's forward writes and its backward reads (a layer kept whole holds these of its own;
// the backward may reuse some of them as scratch, e.g. act as d(act)).
void carve_forward(Carver& c, const ModelSpec& s, DType a, int B, int T, LayerBuffers& w) {
  const Widths m = max_widths(s);
  const int64_t N = int64_t(B) * T, H = s.hidden, Q = m.q, KV = m.kv, I = m.intermediate;
  w.h1 = c.take(a, {N, H});
  w.rstd1 = c.take(DType::F32, {N});
  if (s.qk_norm) {
    w.q_raw = c.take(a, {N, Q});
    w.k_raw = c.take(a, {N, KV});
    w.q_rstd = c.take(DType::F32, {N * s.n_head});
    w.k_rstd = c.take(DType::F32, {N * m.kv_heads});
  }
  w.q = c.take(a, {N, Q});
  w.k = c.take(a, {N, KV});
  w.v = c.take(a, {N, KV});
  w.att = c.take(a, {N, Q});
  w.lse = c.take(DType::F32, {int64_t(B) * s.n_head * T});
  w.x2 = c.take(a, {N, H});
  w.h2 = c.take(a, {N, H});
  w.rstd2 = c.take(DType::F32, {N});
  if (has_dense_mlp(s)) {
    w.gate = c.take(a, {N, I});
    w.up = c.take(a, {N, I});
    w.act = c.take(a, {N, I});
  }
  if (s.is_moe()) {
    const int64_t E = s.moe.n_expert, k = s.moe.top_k, S = N * k, Ie = s.moe.intermediate;
    w.logits = c.take(a, {N, E});
    w.probs = c.take(DType::F32, {N, E});
    w.topk_idx = c.take(DType::I32, {N, k});
    w.topk_w = c.take(DType::F32, {N, k});
    w.offsets = c.take(DType::I32, {E + 1});
    w.sorted_slot = c.take(DType::I32, {S});
    w.slot_pos = c.take(DType::I32, {S});
    w.xs = c.take(a, {S, H});
    w.egate = c.take(a, {S, Ie});
    w.eup = c.take(a, {S, Ie});
    w.eact = c.take(a, {S, Ie});
    w.ys = c.take(a, {S, H});
  }
  if (s.sandwich_norm) {
    w.attn_o = c.take(a, {N, H});
    w.mlp_o = c.take(a, {N, H});
    w.rstd_ao = c.take(DType::F32, {N});
    w.rstd_mo = c.take(DType::F32, {N});
  }
  if (s.arch == Arch::Gemma4) {
    w.v_raw = c.take(a, {N, KV});
    w.v_rstd = c.take(DType::F32, {N * m.kv_heads});
    w.v_zero = c.take(a, {m.head_dim});
    if (s.gemma4.ple_dim > 0) {
      const int64_t P = s.gemma4.ple_dim;
      w.ple.y_in = c.take(a, {N, H});
      w.ple.gate = c.take(a, {N, P});
      w.ple.act = c.take(a, {N, P});
      w.ple.u = c.take(a, {N, H});
      w.ple.rstd = c.take(DType::F32, {N});
    }
    if (s.gemma4.moe_block) {
      Gemma4MoeBuffers& b = w.moe4;
      b.m = c.take(a, {N, H});
      b.m2 = c.take(a, {N, H});
      b.hr = c.take(a, {N, H});
      b.xe = c.take(a, {N, H});
      b.w_raw = c.take(DType::F32, {N, s.moe.top_k});
      b.rstd_m1 = c.take(DType::F32, {N});
      b.rstd_r = c.take(DType::F32, {N});
      b.rstd_xe = c.take(DType::F32, {N});
      b.rstd_m2 = c.take(DType::F32, {N});
    }
  }
}

// The backward's own scratch.
void carve_scratch(Carver& c, const ModelSpec& s, DType a, int B, int T, size_t attn_ws, LayerBuffers& w) {
  const Widths m = max_widths(s);
  const int64_t N = int64_t(B) * T, H = s.hidden, Q = m.q, KV = m.kv;
  if (s.arch == Arch::Gemma4) w.dv_raw = c.take(a, {N, KV});
  if (s.arch == Arch::Gemma4 && s.gemma4.ple_dim > 0) {
    w.ple.du = c.take(a, {N, H});
    w.ple.dgate = c.take(a, {N, s.gemma4.ple_dim});
  }
  if (s.qk_norm) {
    w.dq_raw = c.take(a, {N, Q});
    w.dk_raw = c.take(a, {N, KV});
  }
  if (s.is_moe()) {
    const int64_t k = s.moe.top_k, S = N * k;
    w.dtopk_w = c.take(DType::F32, {N, k});
    w.dys = c.take(a, {S, H});
  }
  w.dh = c.take(a, {N, H});
  w.dq = c.take(a, {N, Q});
  w.dk = c.take(a, {N, KV});
  w.dv = c.take(a, {N, KV});
  w.datt = c.take(a, {N, Q});
  w.attn_ws = c.take_bytes(attn_ws);
}

LayerBuffers carve_layer(Carver& c, const ModelSpec& s, DType a, int B, int T, size_t attn_ws) {
  LayerBuffers w;
  carve_forward(c, s, a, B, T, w);
  carve_scratch(c, s, a, B, T, attn_ws, w);
  return w;
}

HeadBuffers carve_head(Carver& c, const ModelSpec& s, DType a, int B, int T, size_t lce_ws) {
  const int64_t N = int64_t(B) * T, H = s.hidden;
  HeadBuffers h;
  h.hf = c.take(a, {N, H});
  h.rstd = c.take(DType::F32, {N});
  h.dhf = c.take(a, {N, H});
  h.lce_ws = c.take_bytes(lce_ws);
  return h;
}

}  // namespace

int64_t max_q_dim(const ModelSpec& s) { return max_widths(s).q; }

AttnDims attn_dims(const ModelSpec& s, const BatchDims& d, int layer) {
  AttnDims a;
  a.B = d.B;
  a.T = d.T;
  a.n_head = s.n_head;
  a.n_kv_head = s.n_kv_head;
  a.head_dim = s.head_dim;
  if (s.arch == Arch::Gemma4 && layer >= 0) {  // the layer's own head dim and KV heads
    a.head_dim = s.gemma4.head_dim[size_t(layer)];
    a.n_kv_head = s.gemma4.kv_heads[size_t(layer)];
  }
  a.scale = s.attn_scale > 0 ? float(s.attn_scale) : 1.0f / std::sqrt(float(a.head_dim));
  a.pos = d.pos;
  // A window that covers the whole row masks nothing: left out (the kernels' unwindowed path).
  if (s.is_local(layer) && s.local_window < d.T) a.window = int(s.local_window);
  return a;
}

// The larger of the two views: both start at the block's base (layer(), head()).
size_t Workspace::bytes_for(const ModelSpec& s, int max_B, int max_T, DType act, size_t attn_ws, size_t lce_ws) {
  Carver layer{nullptr}, head{nullptr};
  carve_layer(layer, s, act, max_B, max_T, attn_ws);
  carve_head(head, s, act, max_B, max_T, lce_ws);
  return std::max(layer.off, head.off);
}

Workspace::Workspace(Device& dev, const ModelSpec& s, int max_B, int max_T, DType act)
    : s_(s), ops_(dev.ops()), act_(act), max_B_(max_B), max_T_(max_T) {
  BatchDims d{max_B, max_T, {}};
  attn_ws_ = ops_.attention_workspace_bytes(attn_dims(s, d));
  if (s.arch == Arch::Gemma4)  // the widest layer's scratch
    for (int l = 0; l < s.n_layer; ++l) attn_ws_ = std::max(attn_ws_, ops_.attention_workspace_bytes(attn_dims(s, d, l)));
  lce_ws_ = ops_.linear_ce_workspace_bytes(d.N(), s.hidden, s.vocab);
  buf_ = DeviceBuffer(dev, bytes_for(s, max_B, max_T, act, attn_ws_, lce_ws_));
}

// Both views start at the block's base: the head runs after every layer's forward and before
// any layer's backward, so their buffers never live at the same time.
LayerBuffers Workspace::layer(const BatchDims& d) const {
  SF_CHECK(d.B <= max_B_ && d.T <= max_T_, "batch larger than the workspace");
  Carver c{static_cast<char*>(buf_.data())};
  return carve_layer(c, s_, act_, d.B, d.T, attn_ws_);
}

size_t Workspace::forward_bytes_for(const ModelSpec& s, int max_B, int max_T, DType act) {
  Carver c{nullptr};
  LayerBuffers w;
  carve_forward(c, s, act, max_B, max_T, w);
  return c.off;
}

// The forward's outputs from the layer's own block; the scratch from the workspace, where
// layer(d) has it too (the forward's part comes first there and is as large as this block).
LayerBuffers Workspace::layer_kept(const BatchDims& d, void* block) const {
  SF_CHECK(d.B <= max_B_ && d.T <= max_T_, "batch larger than the workspace");
  LayerBuffers w;
  Carver f{static_cast<char*>(block)};
  carve_forward(f, s_, act_, d.B, d.T, w);
  Carver c{static_cast<char*>(buf_.data()) + forward_bytes_for(s_, max_B_, max_T_, act_)};
  carve_scratch(c, s_, act_, d.B, d.T, attn_ws_, w);
  return w;
}

HeadBuffers Workspace::head(const BatchDims& d) const {
  SF_CHECK(d.B <= max_B_ && d.T <= max_T_, "batch larger than the workspace");
  Carver c{static_cast<char*>(buf_.data())};
  return carve_head(c, s_, act_, d.B, d.T, lce_ws_);
}

void Program::linear(Tensor out, Tensor x, Tensor W, Tensor b, Stream& st) const {
  ops_.matmul(out, x, W, false, true, 1.f, 0.f, st);
  if (!b.empty()) ops_.add_bias(out, b, st);
}

void Program::linear_residual(Tensor out, Tensor x, Tensor W, Tensor b, Tensor r, Stream& st) const {
  if (b.empty()) return ops_.matmul_add(out, x, W, false, true, r, st);
  linear(out, x, W, b, st);  // the bias first, as the unfused order rounds
  ops_.add(out, out, r, st);
}

void Program::linear_backward(Tensor dx, Tensor dW, Tensor db, Tensor dy, Tensor x, Tensor W, bool accumulate_dx,
                              Stream& st) const {
  if (!dx.empty()) ops_.matmul(dx, dy, W, false, false, 1.f, accumulate_dx ? 1.f : 0.f, st);
  ops_.matmul(dW, dy, x, true, false, 1.f, 1.f, st);
  if (!db.empty()) ops_.bias_backward(db, dy, st);
}

// Gemma's sqrt(hidden) as HF applies it: the normalizer cast to the compute dtype first.
static float embed_scale_of(const ModelSpec& s, DType act) {
  const float f = std::sqrt(float(s.hidden));
  return act == DType::BF16 ? bf16_to_float(float_to_bf16(f)) : f;
}

void Program::embed_forward(Tensor x0, Tensor ids, Tensor table, Stream& st) const {
  ops_.embedding_forward(x0, ids, table, st);
  if (s_.embed_scale) ops_.scale(x0, embed_scale_of(s_, act_), st);
}

void Program::embed_backward(Tensor dtable, Tensor dx0, Tensor ids, Tensor scratch, Stream& st) const {
  if (s_.embed_scale) ops_.scale(dx0, embed_scale_of(s_, act_), st);
  if (s_.pad_token_id < 0) {
    ops_.embedding_backward(dtable, dx0, ids, st);
    return;
  }
  // padding_idx: the row is saved and put back around the scatter (exact, whatever it held: a tied
  // head's gradient, earlier micro-batches'). Gemma's pad row is all zeros, and the gradient that a
  // zero embedding receives through each (1 + w) RMSNorm is multiplied by 1/sqrt(eps) per norm.
  SF_CHECK(dtable.dtype == DType::F32, "embed_backward: the embedding gradient is F32");
  SF_CHECK(scratch.bytes() >= size_t(s_.hidden) * 4, "embed_backward: scratch smaller than one F32 row");
  const Tensor row(static_cast<float*>(dtable.data) + s_.pad_token_id * s_.hidden, DType::F32, {s_.hidden});
  const Tensor saved(scratch.data, DType::F32, {s_.hidden});
  ops_.cast(saved, row, st);  // same dtype: a copy
  ops_.embedding_backward(dtable, dx0, ids, st);
  ops_.cast(row, saved, st);
}

void Program::norm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, Stream& st) const {
  if (s_.gemma_norm)
    ops_.rmsnorm_1p_forward(out, rstd, x, w, float(s_.rms_eps), st);
  else
    ops_.rmsnorm_forward(out, rstd, x, w, float(s_.rms_eps), st);
}

void Program::norm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                            Stream& st) const {
  if (s_.gemma_norm)
    ops_.rmsnorm_1p_backward(dx, dw, dout, x, w, rstd, accumulate, st);
  else
    ops_.rmsnorm_backward(dx, dw, dout, x, w, rstd, accumulate, st);
}

// The local layers' RoPE tables for a local layer, else the global ones.
static const Tensor& rope_cos(const ModelSpec& s, const RopeTables& r, int layer) {
  return s.is_local(layer) ? r.cos_local : r.cos;
}
static const Tensor& rope_sin(const ModelSpec& s, const RopeTables& r, int layer) {
  return s.is_local(layer) ? r.sin_local : r.sin;
}

void Program::attention_block_forward(const LayerParams& p, Tensor h1, const LayerBuffers& w, const BatchDims& d,
                                      const RopeTables& rope, Stream& st, bool attention_kept) const {
  using P = LayerParam;
  const int64_t N = d.N();
  if (s_.qk_norm) {
    linear(w.q_raw, h1, p[P::Wq], p[P::Bq], st);
    linear(w.k_raw, h1, p[P::Wk], p[P::Bk], st);
    // Per-head RMSNorm over head_dim: view [N, heads*hd] as [N*heads, hd] (OLMoE: over the whole
    // projection, one row a token).
    const int64_t qh = s_.qk_norm_full ? 1 : s_.n_head, kh = s_.qk_norm_full ? 1 : s_.n_kv_head;
    const int64_t qc = s_.q_dim() / qh, kc = s_.kv_dim() / kh;
    norm_forward(w.q.view({N * qh, qc}), w.q_rstd.view({N * qh}), w.q_raw.view({N * qh, qc}), p[P::QNorm], st);
    norm_forward(w.k.view({N * kh, kc}), w.k_rstd.view({N * kh}), w.k_raw.view({N * kh, kc}), p[P::KNorm], st);
  } else {
    linear(w.q, h1, p[P::Wq], p[P::Bq], st);
    linear(w.k, h1, p[P::Wk], p[P::Bk], st);
  }
  linear(w.v, h1, p[P::Wv], p[P::Bv], st);
  const Tensor &cos = rope_cos(s_, rope, p.layer), &sin = rope_sin(s_, rope, p.layer);
  ops_.rope_forward(w.q, cos, sin, d.T, s_.n_head, s_.head_dim, d.pos, st);
  ops_.rope_forward(w.k, cos, sin, d.T, s_.n_kv_head, s_.head_dim, d.pos, st);
  if (!attention_kept) ops_.attention_forward(w.att, w.lse, w.q, w.k, w.v, attn_dims(s_, d, p.layer), st);
}

namespace {
// w with attention's output and statistics in the kept buffers (KeptActs), viewed at this batch.
LayerBuffers with_kept(LayerBuffers w, const KeptActs& k) {
  if (k.empty()) return w;
  SF_CHECK(k.att.bytes() >= w.att.bytes() && k.lse.bytes() >= w.lse.bytes() && k.att.dtype == w.att.dtype &&
               k.lse.dtype == w.lse.dtype,
           "kept activations smaller than the batch");
  w.att.data = k.att.data;
  w.lse.data = k.lse.data;
  return w;
}
}  // namespace

void Program::layer_forward(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                            const RopeTables& rope, Stream& st, const KeptActs& kept) const {
  layer_forward_into(p, x, y, with_kept(w, kept), d, rope, st, false);
}

void Program::layer_forward_into(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                                 const RopeTables& rope, Stream& st, bool attention_kept) const {
  using P = LayerParam;
  if (s_.arch == Arch::Gemma4) return gemma4_layer_forward(p, x, y, w, d, rope, st, attention_kept);
  if (s_.sandwich_norm) return gemma_layer_forward(p, x, y, w, d, rope, st, attention_kept);
  const float eps = float(s_.rms_eps);
  ops_.rmsnorm_forward(w.h1, w.rstd1, x, p[P::InputNorm], eps, st);
  attention_block_forward(p, w.h1, w, d, rope, st, attention_kept);
  linear_residual(w.x2, w.att, p[P::Wo], p[P::Bo], x, st);
  ops_.rmsnorm_forward(w.h2, w.rstd2, w.x2, p[P::PostNorm], eps, st);
  if (!p[P::Router].empty()) {
    moe_forward(p, w.h2, y, w, d, st);
    ops_.add(y, y, w.x2, st);  // residual
    return;
  }
  linear(w.gate, w.h2, p[P::Wgate], p[P::Bgate], st);
  linear(w.up, w.h2, p[P::Wup], p[P::Bup], st);
  ops_.swiglu_forward(w.act, w.gate, w.up, st);
  if (y.empty()) return;  // layer_recompute: the backward needs act, not y
  linear_residual(y, w.act, p[P::Wdown], p[P::Bdown], w.x2, st);
}

void Program::layer_recompute(const LayerParams& p, Tensor x, Tensor scratch, const LayerBuffers& w, const BatchDims& d,
                              const RopeTables& rope, Stream& st, const KeptActs& kept) const {
  using P = LayerParam;
  const bool dense_llama = !s_.sandwich_norm && p[P::Router].empty();
  layer_forward_into(p, x, dense_llama ? Tensor() : scratch, with_kept(w, kept), d, rope, st, !kept.empty());
}

void Program::layer_backward(const LayerParams& p, const LayerParams& g, Tensor x, Tensor dy, Tensor dx,
                             const LayerBuffers& w_ws, const BatchDims& d, const RopeTables& rope, Stream& st,
                             const KeptActs& kept) const {
  using P = LayerParam;
  const LayerBuffers w = with_kept(w_ws, kept);
  if (s_.arch == Arch::Gemma4) return gemma4_layer_backward(p, g, x, dy, dx, w, d, rope, st);
  if (s_.sandwich_norm) return gemma_layer_backward(p, g, x, dy, dx, w, d, rope, st);
  // y = x2 + down(act): d(x2) starts as dy; dx holds d(x2) until the attention block's
  // contribution and the input norm's are added to it.
  ops_.cast(dx, dy, st);
  if (!p[P::Router].empty()) {
    moe_backward(p, g, w.h2, dy, w.dh, w, d, st);
  } else {
    ops_.matmul(g[P::Wdown], dy, w.act, true, false, 1.f, 1.f, st);
    if (!g[P::Bdown].empty()) ops_.bias_backward(g[P::Bdown], dy, st);
    Tensor dact = w.act;  // act is no longer needed
    ops_.matmul(dact, dy, p[P::Wdown], false, false, 1.f, 0.f, st);
    // In place: gate and up are not read again (the GLU ops allow it), so the workspace holds no
    // [N, I] gradients of its own.
    const Tensor dgate = w.gate, dup = w.up;
    ops_.swiglu_backward(dgate, dup, dact, w.gate, w.up, st);
    linear_backward(w.dh, g[P::Wgate], g[P::Bgate], dgate, w.h2, p[P::Wgate], false, st);
    linear_backward(w.dh, g[P::Wup], g[P::Bup], dup, w.h2, p[P::Wup], true, st);
  }
  ops_.rmsnorm_backward(dx, g[P::PostNorm], w.dh, w.x2, p[P::PostNorm], w.rstd2, true, st);

  // x2 = x + o_proj(att); the attention backward still needs att itself (D = rowsum(dO*O)).
  ops_.matmul(w.datt, dx, p[P::Wo], false, false, 1.f, 0.f, st);
  ops_.matmul(g[P::Wo], dx, w.att, true, false, 1.f, 1.f, st);
  if (!g[P::Bo].empty()) ops_.bias_backward(g[P::Bo], dx, st);
  attention_block_backward(p, g, w.h1, w, d, rope, st);
  ops_.rmsnorm_backward(dx, g[P::InputNorm], w.dh, x, p[P::InputNorm], w.rstd1, true, st);
}

void Program::attention_block_backward(const LayerParams& p, const LayerParams& g, Tensor h1, const LayerBuffers& w,
                                       const BatchDims& d, const RopeTables& rope, Stream& st) const {
  using P = LayerParam;
  const int64_t N = d.N();
  ops_.attention_backward(w.dq, w.dk, w.dv, w.datt, w.q, w.k, w.v, w.att, w.lse, attn_dims(s_, d, p.layer), w.attn_ws,
                          st);
  const Tensor &cos = rope_cos(s_, rope, p.layer), &sin = rope_sin(s_, rope, p.layer);
  ops_.rope_backward(w.dq, cos, sin, d.T, s_.n_head, s_.head_dim, d.pos, st);
  ops_.rope_backward(w.dk, cos, sin, d.T, s_.n_kv_head, s_.head_dim, d.pos, st);
  Tensor dq = w.dq, dk = w.dk;
  if (s_.qk_norm) {
    const int64_t qh = s_.qk_norm_full ? 1 : s_.n_head, kh = s_.qk_norm_full ? 1 : s_.n_kv_head;
    const int64_t qc = s_.q_dim() / qh, kc = s_.kv_dim() / kh;
    norm_backward(w.dq_raw.view({N * qh, qc}), g[P::QNorm], w.dq.view({N * qh, qc}), w.q_raw.view({N * qh, qc}),
                  p[P::QNorm], w.q_rstd.view({N * qh}), false, st);
    norm_backward(w.dk_raw.view({N * kh, kc}), g[P::KNorm], w.dk.view({N * kh, kc}), w.k_raw.view({N * kh, kc}),
                  p[P::KNorm], w.k_rstd.view({N * kh}), false, st);
    dq = w.dq_raw;
    dk = w.dk_raw;
  }
  linear_backward(w.dh, g[P::Wq], g[P::Bq], dq, h1, p[P::Wq], false, st);
  linear_backward(w.dh, g[P::Wk], g[P::Bk], dk, h1, p[P::Wk], true, st);
  linear_backward(w.dh, g[P::Wv], g[P::Bv], w.dv, h1, p[P::Wv], true, st);
}

void Program::head_forward_backward(const HeadArgs& a, const HeadBuffers& w, const BatchDims& d, Stream& st) const {
  const float grad_scale = a.grad_scale;
  norm_forward(w.hf, w.rstd, a.x, a.norm_w, st);
  // Gemma 4's final_logit_softcapping: the capped variant of the fused head.
  const float cap = s_.arch == Arch::Gemma4 ? float(s_.gemma4.final_softcap) : 0.f;
  auto lce = [&](Tensor dx, Tensor dw) {
    if (cap > 0)
      ops_.linear_cross_entropy_capped(a.loss_sum, dx, dw, w.hf, a.w_head, a.targets, grad_scale, cap, w.lce_ws, st);
    else
      ops_.linear_cross_entropy(a.loss_sum, dx, dw, w.hf, a.w_head, a.targets, grad_scale, w.lce_ws, st);
  };
  if (a.dx.empty()) {
    lce(Tensor(), Tensor());
    return;
  }
  lce(w.dhf, a.dw_head);
  norm_backward(a.dx, a.dnorm, w.dhf, a.x, a.norm_w, w.rstd, false, st);
  // The load-balancing loss joins the step loss (loss_sum * grad_scale), as transformers adds
  // coef * aux to its mean cross-entropy. Its gradient enters at each router (moe_backward).
  if (moe_aux_grad_scale(d) != 0.f && grad_scale > 0.f)
    ops_.moe_aux_loss(a.loss_sum, d.moe_stats, moe_aux_grad_scale(d) / grad_scale, st);
}

void Program::head_logits(Tensor x, Tensor norm_w, Tensor w_head, Tensor logits, const HeadBuffers& w,
                          Stream& st) const {
  SF_CHECK(s_.arch != Arch::Gemma4 || s_.gemma4.final_softcap == 0,
           "head_logits: soft-capped logits are not implemented (the training head is)");
  norm_forward(w.hf, w.rstd, x, norm_w, st);
  ops_.matmul(logits, w.hf, w_head, false, true, 1.f, 0.f, st);
}

}  // namespace sf
