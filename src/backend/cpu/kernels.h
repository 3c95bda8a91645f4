// CPU reference kernels: plain synchronous functions, one per operation of the kernel table
// (backend/ops.h documents each). They are the twin every other backend is tested against.
// Storage F32 or BF16; math in fp32 (fp64 where a reduction would otherwise lose accuracy).
// They may use cpu_pool() internally; they are not reentrant from inside a pool task.
// Arguments: as the front of the kernel table (backend/ops_check.h) checks them; the kernels check
// only values in memory (token ids, labels, positions). A direct caller that builds its own
// tensors can run the front's check first (opcheck::adamw, opcheck::cast, ...).
#pragma once
#include "backend/ops.h"
#include "core/split_master.h"

namespace sf::cpu {

void matmul(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta);
// out = op(a) @ op(b) + c (ops.h): the product rounded to out's dtype, then the add, as the two ops.
void matmul_add(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, Tensor c);
void add_bias(Tensor out, Tensor bias);
void bias_backward(Tensor dbias, Tensor dout);
// w_offset: the weight is w + w_offset in fp32 (1 for Gemma's rmsnorm_1p_*).
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, float w_offset = 0.f);
void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      float w_offset = 0.f);
// pos [B*T] I32 or empty (ops.h).
void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos = Tensor());
void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos = Tensor());
void swiglu_forward(Tensor out, Tensor gate, Tensor up);
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);
void geglu_forward(Tensor out, Tensor gate, Tensor up);
void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);
// Mixture of experts (moe.cpp).
void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm);
void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                        float aux_scale);
void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx);
void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k);
void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k);
void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta);
void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets);
void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos);
void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos);
void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale);
void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale);
void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale);
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttnDims& d, Tensor ws);
size_t attention_workspace_bytes(const AttnDims& d);
// Checks the values of d.pos (the precondition of ops.h: 0 or previous + 1 within a row); its dtype
// and size are the front's (ops_check.h).
void check_positions(const AttnDims& d);
// softcap > 0 (Gemma 4's final_logit_softcapping c): the loss is taken on c * tanh(logits / c), its
// gradient through the cap (1 - tanh^2); 0: plain logits (every other model; the ops.h entry).
void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float grad_scale,
                          Tensor ws, float softcap = 0.f);
size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V);
void embedding_forward(Tensor out, Tensor ids, Tensor table);
void ids_or_zero(Tensor out, Tensor ids, int64_t limit);
void embedding_backward(Tensor dtable, Tensor dout, Tensor ids);
void add(Tensor out, Tensor a, Tensor b);
void scale(Tensor x, float alpha);
void cast(Tensor out, Tensor in);
void zero(Tensor x);
// out[0] += sum x^2: fixed blocks of kSqNormBlock elements, each summed by sq_sum in fp64, then
// the block sums in order (the bits do not depend on the thread count; the sliding engine rebuilds
// the same sum from per-blob pieces).
void sq_norm(Tensor out, Tensor x);
constexpr int64_t kSqNormBlock = int64_t(1) << 14;
double sq_sum(const float* x, int64_t n);
// Which states one AdamW pass writes. The sliding engine with clipping splits a step's update in
// two passes of the same arithmetic (so the same bits as All): `Params` (reads p, g, m, v; writes
// p and the copy) as soon as the clip factor is known, and `Moments` (reads g, m, v; writes m, v)
// later, when the host memory bus has slack; `Moments` does not read p.
enum class AdamWPart { All, Params, Moments };
// Rows of a blob that one AdamW call updates (the sliding engine's embedding, updated in two
// parts a step): element i of the call, index p.first + i in its blob, is updated when
// `rows[(p.first + i) / row_len] == want`, and left as it is otherwise.
struct RowSelect {
  const uint8_t* rows = nullptr;  // [blob elements / row_len] 0 or 1
  int64_t row_len = 1;
  uint8_t want = 1;
};
void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& p,
           AdamWPart part = AdamWPart::All, const RowSelect* select = nullptr);
// The same with the parameter a split master (core/split_master.h: the sliding engine's host
// blobs with an upload copy; its `hi` is the copy): the same arithmetic on the same fp32 values,
// so the same bits as adamw on the joined master with a bf16 copy. [n] = grad's.
void adamw_split(const SplitMaster& param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                 AdamWPart part = AdamWPart::All, const RowSelect* select = nullptr);

}  // namespace sf::cpu
