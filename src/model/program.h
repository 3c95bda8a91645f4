// The forward / recompute / backward programs of a decoder layer, the embedding and the head,
// written once against the kernel table (backend/ops.h). Where memory lives is the caller's
// business: parameters, gradients and activations arrive as views.
#pragma once
#include <memory>

#include "backend/device.h"
#include "model/gemma4_ple.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {

struct BatchDims {
  int B = 0, T = 0;
  // Packed rows: pos [B*T] I32 on the device, each token's position inside its record (RoPE
  // position; attention stays inside the record, ops.h AttnDims::pos). Empty: one record a row.
  Tensor pos;
  // Mixture of experts with the load-balancing loss on (ModelSpec::moe.aux_loss): stats F32 [2, E]
  // on the device, this micro-batch's per-expert token counts and router-probability sums over all
  // MoE layers. layer_forward adds to them when moe_collect (the first forward, not the
  // recompute); layer_backward reads the counts; the head adds the loss. moe_aux_weight: the
  // loss's weight in the step loss (router_aux_loss_coef / micro-batches); 0 = off.
  Tensor moe_stats{};
  bool moe_collect = false;
  float moe_aux_weight = 0.f;
  int64_t N() const { return int64_t(B) * T; }
};

// Activation buffers of one layer's forward (kept for its backward) and backward scratch, for
// up to max_B x max_T tokens, in one device allocation made at start-up.
// Gemma 4's MoE block beside the dense MLP (Gemma4Spec::moe_block; model/gemma4_moe.cpp). The
// routing and expert buffers are LayerBuffers' MoE ones; these are the block's own.
struct Gemma4MoeBuffers {
  Tensor m;      // [N, H] norm_1(mlp_o) + norm_2(m2): post_feedforward_layernorm's input
  Tensor m2;     // [N, H] the experts' combined output (backward: d(xe), then d(mlp_o))
  Tensor hr;     // [N, H] the router's input norm(x2) * router.scale
  Tensor xe;     // [N, H] the experts' input norm(x2) (then norm_2(m2); backward: d(m2), then d(hr))
  Tensor w_raw;  // [N, k] F32 the renormalised top-k weights before router.per_expert_scale
  Tensor rstd_m1, rstd_r, rstd_xe, rstd_m2;  // [N] F32 each
};

struct LayerBuffers {
  Tensor h1;              // [N, H]    input norm output
  Tensor rstd1;           // [N]       F32
  Tensor q_raw, k_raw;    // [N, Q], [N, KV] projections before q/k-norm (qk_norm only)
  Tensor q_rstd, k_rstd;  // [N*n_head], [N*n_kv_head] F32 (qk_norm only)
  Tensor q, k, v;         // [N, Q], [N, KV], [N, KV] after norm + RoPE
  Tensor att;             // [N, Q]    attention output (reused as d(att) in backward)
  Tensor lse;             // [B, n_head, T] F32
  Tensor x2;              // [N, H]    residual after attention
  Tensor h2;              // [N, H]    post-attention norm output
  Tensor rstd2;           // [N]       F32
  Tensor gate, up, act;   // [N, I]    (backward: act reused as d(act), gate and up as their gradients)
  Tensor dh;              // [N, H]
  Tensor dq, dk, dv;      // [N, Q], [N, KV], [N, KV]
  Tensor datt;            // [N, Q]
  Tensor dq_raw, dk_raw;  // [N, Q], [N, KV] (qk_norm only)
  Tensor attn_ws;         // attention backward scratch
  // Gemma 3 (sandwich_norm only): the attention and MLP outputs before their output norms.
  Tensor attn_o, mlp_o;     // [N, H]
  Tensor rstd_ao, rstd_mo;  // [N] F32
  // Gemma 4 (Arch::Gemma4): the value norm's input and statistics (its input is k_raw on global
  // layers with attention_k_eq_v), its gradient, and a zero weight [max head dim] that turns the
  // (1 + w) norm into the weightless one. The attention buffers above are sized for the widest layer.
  Tensor v_raw, dv_raw;  // [N, KV]
  Tensor v_rstd;         // [N * max KV heads] F32
  Tensor v_zero;         // [max head dim]
  // Gemma 4 K/V sharing (Gemma4Spec::kv_source), set by the caller for a source layer (its own) and
  // for the layers sharing its K/V (the source's): the source's forward copies its normed, rotated
  // k, v there and sharing layers attend to them; sharing layers' backward adds d(k), d(v) to the
  // accumulators (zeroed by the caller before the step's backward), the source's backward adds them
  // to its own. Empty for every other layer.
  Tensor kv_k, kv_v;    // [N, KV] of the source layer
  Tensor kv_dk, kv_dv;  // [N, KV]
  // MoE layers: S = N * top_k token slots, sorted by expert (ops.h). Whatever the routing, the
  // sorted rows number exactly S (each token picks top_k distinct experts), so these are sized
  // for the worst case (every token on one expert) by construction: no capacity, no drop.
  Tensor logits;                 // [N, E]    router logits (reused as d(logits))
  Tensor probs;                  // [N, E]    F32 softmax
  Tensor topk_idx;               // [N, k]    I32
  Tensor topk_w, dtopk_w;        // [N, k]    F32 routing weights and their gradient
  Tensor offsets;                // [E+1]     I32 first sorted row of each expert
  Tensor sorted_slot, slot_pos;  // [S]       I32 sorted row -> slot, slot -> sorted row
  Tensor xs;                     // [S, H]    gathered expert inputs
  Tensor egate, eup, eact;       // [S, Ie]   (backward: eact reused as d(eact), egate and eup as their gradients)
  Tensor ys;                     // [S, H]    expert outputs (reused as d(xs))
  Tensor dys;                    // [S, H]
  // Gemma 4 per-layer inputs (Gemma4Spec::ple_dim P > 0): the layer's slice of the model-level
  // inputs and of their gradient, set by the caller (rows [l*N, (l+1)*N) of PleProgram's
  // layer-major [L*N, P] tensors; the backward overwrites dpli_l), and the block's own buffers.
  Tensor pli_l, dpli_l;  // [N, P]
  PleLayerBuffers ple;
  Gemma4MoeBuffers moe4;
};

// Selective recompute: what a layer keeps of its forward for its backward besides its input. With
// att and lse given, the forward writes attention's output and softmax statistics there instead of
// into the workspace, the recompute skips attention (the layer's costliest op to redo; q, k and v
// are still recomputed: the attention backward needs them) and the backward reads them there.
// Empty: the whole layer is recomputed from its input. The same bits either way (deterministic ops).
struct KeptActs {
  Tensor att;  // [N, Q]           attention output
  Tensor lse;  // [B * n_head * T] F32 its log-sum-exp per query row
  bool empty() const { return att.empty(); }
};

struct HeadBuffers {
  Tensor hf;      // [N, H] final norm output
  Tensor rstd;    // [N] F32
  Tensor dhf;     // [N, H]
  Tensor lce_ws;  // fused linear-cross-entropy scratch
};

// The attention dims of a batch of this model (layer >= 0: with that layer's window, if local).
AttnDims attn_dims(const ModelSpec& s, const BatchDims& d, int layer = -1);
// Columns of the widest layer's attention output [N, n_head * head_dim]: q_dim(), except Gemma 4's
// global layers' own head dim.
int64_t max_q_dim(const ModelSpec& s);

class Workspace {
 public:
  Workspace(Device& dev, const ModelSpec& s, int max_B, int max_T, DType act);
  // Views for a batch of B x T tokens (B <= max_B, T <= max_T).
  LayerBuffers layer(const BatchDims& d) const;
  // Selective recompute, a layer kept whole (its backward without a recompute): the views of
  // layer(d), but what the forward writes and the backward reads in `block` (forward_bytes_for
  // bytes of device memory, the layer's own).
  LayerBuffers layer_kept(const BatchDims& d, void* block) const;
  static size_t forward_bytes_for(const ModelSpec& s, int max_B, int max_T, DType act);
  HeadBuffers head(const BatchDims& d) const;
  size_t bytes() const { return buf_.size(); }
  // What the constructor allocates (the planner sizes engines without allocating).
  // attn_ws / lce_ws: the backend's attention_workspace_bytes / linear_ce_workspace_bytes at
  // max_B x max_T.
  static size_t bytes_for(const ModelSpec& s, int max_B, int max_T, DType act, size_t attn_ws, size_t lce_ws);

 private:
  const ModelSpec& s_;
  Ops& ops_;
  DType act_;
  int max_B_, max_T_;
  size_t attn_ws_, lce_ws_;
  DeviceBuffer buf_;
};

// RoPE tables on the device: [max_T, head_dim/2] F32 each; *_local: the local (sliding-window)
// layers' tables (ModelSpec::has_local_rope only). Gemma 4: cos/sin are the global layers' own
// (their head dim, proportional RoPE: rope_inv_freq_proportional), the local ones over head_dim.
struct RopeTables {
  Tensor cos, sin;
  Tensor cos_local, sin_local;
};

class Program {
 public:
  Program(const ModelSpec& s, Ops& ops, DType act) : s_(s), ops_(ops), act_(act) {}

  // x0 [N, H] = embedding rows of ids [N] (times sqrt(H) in the compute dtype when embed_scale).
  // embed_backward scales dx0 in place when embed_scale; dtable [V, H] F32 += the rows of dx0, except
  // that row pad_token_id keeps its value (torch's padding_idx: no gradient from the lookup).
  // scratch: at least 4 * H bytes of device memory, free on st (holds that row meanwhile).
  void embed_forward(Tensor x0, Tensor ids, Tensor table, Stream& st) const;
  void embed_backward(Tensor dtable, Tensor dx0, Tensor ids, Tensor scratch, Stream& st) const;

  // y [N, H] = layer(x). Fills w (and kept, when given) with what backward needs.
  // A layer whose params have a Router is a MoE layer (layout.h), else its MLP is dense.
  void layer_forward(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                     const RopeTables& rope, Stream& st, const KeptActs& kept = {}) const;
  // The backward's recompute: fills w as layer_forward(x) does. The output itself is not needed:
  // a dense Llama layer skips its down projection and residual (a ninth of the layer's FLOPs);
  // other layers write it into scratch [N, H]. With kept (as the forward had it) attention is
  // skipped: its output is still in kept.
  void layer_recompute(const LayerParams& p, Tensor x, Tensor scratch, const LayerBuffers& w, const BatchDims& d,
                       const RopeTables& rope, Stream& st, const KeptActs& kept = {}) const;
  // After layer_forward(x) into the same w (and kept): dx [N, H] from dy [N, H]; parameter grads
  // g += . dx may not alias dy.
  void layer_backward(const LayerParams& p, const LayerParams& g, Tensor x, Tensor dy, Tensor dx, const LayerBuffers& w,
                      const BatchDims& d, const RopeTables& rope, Stream& st, const KeptActs& kept = {}) const;

  // The head's tensors: its input and weights, the targets, the loss it adds to, and (with the
  // backward) where its gradients go.
  struct HeadArgs {
    Tensor x;                // [N, H] the last layer's output
    Tensor norm_w;           // [H] the final norm's weight
    Tensor w_head;           // [V, H] (the embedding's table when tied)
    Tensor targets;          // [N] I32, already shifted; -100 ignored
    Tensor loss_sum;         // [1] F32 += summed CE
    float grad_scale = 0.f;  // the loss's scale in the gradients (1 / the step's trained tokens)
    // If dx is given: dx [N, H] = grad_scale * dloss/dx_L, dnorm [H] += , dw_head [V, H] += (the
    // embedding's gradient when tied).
    Tensor dx{}, dnorm{}, dw_head{};
  };
  // Final norm + fused linear cross-entropy.
  void head_forward_backward(const HeadArgs& a, const HeadBuffers& w, const BatchDims& d, Stream& st) const;
  // logits [N, V] = final_norm(x) @ w_head^T (evaluation and tests only: the training path never
  // materialises logits).
  void head_logits(Tensor x, Tensor norm_w, Tensor w_head, Tensor logits, const HeadBuffers& w, Stream& st) const;

 private:
  // layer_forward into w; attention_kept: w.att and w.lse already hold attention's output (the
  // recompute of a layer with KeptActs), attention is not run again.
  void layer_forward_into(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                          const RopeTables& rope, Stream& st, bool attention_kept) const;
  // Gemma 3's layer (sandwich norms, GeGLU; program_gemma3.cpp), called by layer_forward /
  // layer_backward when s_.sandwich_norm.
  void gemma_layer_forward(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                           const RopeTables& rope, Stream& st, bool attention_kept) const;
  void gemma_layer_backward(const LayerParams& p, const LayerParams& g, Tensor x, Tensor dy, Tensor dx,
                            const LayerBuffers& w, const BatchDims& d, const RopeTables& rope, Stream& st) const;
  // Gemma 4's layer (program_gemma4.cpp; docs/GEMMA4.md section 2): per-layer head dim and KV
  // heads, value norm, k = v on global layers, softmax scale 1. Dense layers with their own K/V.
  void gemma4_layer_forward(const LayerParams& p, Tensor x, Tensor y, const LayerBuffers& w, const BatchDims& d,
                            const RopeTables& rope, Stream& st, bool attention_kept) const;
  void gemma4_layer_backward(const LayerParams& p, const LayerParams& g, Tensor x, Tensor dy, Tensor dx,
                             const LayerBuffers& w, const BatchDims& d, const RopeTables& rope, Stream& st) const;
  void gemma4_attention_forward(const LayerParams& p, Tensor h1, const LayerBuffers& w, const BatchDims& d,
                                const RopeTables& rope, Stream& st, bool attention_kept) const;
  // Gemma 4's MoE block (model/gemma4_moe.cpp): from w.x2 and the dense MLP's w.mlp_o to
  // w.moe4.m; its backward from d(m) in w.dh: d(x2) added to dx, d(mlp_o) into w.moe4.m2.
  void gemma4_moe_forward(const LayerParams& p, const LayerBuffers& w, const BatchDims& d, Stream& st) const;
  void gemma4_moe_backward(const LayerParams& p, const LayerParams& g, Tensor dx, const LayerBuffers& w,
                           const BatchDims& d, Stream& st) const;
  void gemma4_attention_backward(const LayerParams& p, const LayerParams& g, Tensor h1, const LayerBuffers& w,
                                 const BatchDims& d, const RopeTables& rope, Stream& st) const;
  // The attention block shared by every family: h1 [N, H] -> w.att (q/k/v projections, q/k norms,
  // RoPE, attention; attention itself not when attention_kept), and its backward from w.datt
  // (= d att) to w.dh (= d h1, overwritten).
  void attention_block_forward(const LayerParams& p, Tensor h1, const LayerBuffers& w, const BatchDims& d,
                               const RopeTables& rope, Stream& st, bool attention_kept) const;
  void attention_block_backward(const LayerParams& p, const LayerParams& g, Tensor h1, const LayerBuffers& w,
                                const BatchDims& d, const RopeTables& rope, Stream& st) const;
  // RMSNorm of the family: Gemma's (1 + w) one when s_.gemma_norm.
  void norm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, Stream& st) const;
  void norm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                     Stream& st) const;
  // The MLP half of a MoE layer: y = MoE(h2) (overwritten; the caller adds the residual), and its
  // backward from dy into dh (overwritten) and the parameter grads (model/moe_program.cpp).
  void moe_forward(const LayerParams& p, Tensor h2, Tensor y, const LayerBuffers& w, const BatchDims& d,
                   Stream& st) const;
  void moe_backward(const LayerParams& p, const LayerParams& g, Tensor h2, Tensor dy, Tensor dh, const LayerBuffers& w,
                    const BatchDims& d, Stream& st) const;
  // d(aux loss)/d(probs[n, e]) = this * counts[e] (0 when the loss is off for this batch).
  float moe_aux_grad_scale(const BatchDims& d) const;
  void linear(Tensor out, Tensor x, Tensor W, Tensor b, Stream& st) const;
  // out = linear(x) + r: the residual in the GEMM's epilogue when there is no bias (Ops::matmul_add).
  void linear_residual(Tensor out, Tensor x, Tensor W, Tensor b, Tensor r, Stream& st) const;
  void linear_backward(Tensor dx, Tensor dW, Tensor db, Tensor dy, Tensor x, Tensor W, bool accumulate_dx,
                       Stream& st) const;
  const ModelSpec& s_;
  Ops& ops_;
  DType act_;
};

}  // namespace sf
