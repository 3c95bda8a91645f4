// The kernel table: every operation the model programs use, as one interface that each
// backend implements (cpu: the reference; cuda: the fast one). Calls are asynchronous on `s`.
//
// Conventions (all backends):
// - Activations are row-major matrices [rows, cols]; rows = B*T tokens. Heads are packed along
//   cols: q is [B*T, n_head*head_dim] = [B, T, n_head, head_dim].
// - Storage dtype is F32 or BF16 (any mix, unless an op says otherwise); math is fp32.
//   Token ids and labels are I32. Saved statistics (rstd, lse) are F32.
// - "+=" outputs accumulate into what is there (weight gradients, loss sums); others overwrite.
// - An empty Tensor (data == nullptr) where an output is optional means "not wanted".
// - Every pointer is in the backend's device memory (host memory for cpu).
// - Devices hand out their table behind a checking front (backend/ops_check.h): a call that breaks
//   what is written here throws there, naming the op and the argument, before any backend sees it.
#pragma once
#include <cstddef>
#include <cstdint>

#include <stdexcept>

#include "core/tensor.h"

namespace sf {

struct Stream;

struct AttnDims {
  int B = 0, T = 0;   // sequences, tokens per sequence
  int n_head = 0;     // query heads
  int n_kv_head = 0;  // key/value heads (n_head % n_kv_head == 0; GQA)
  int head_dim = 0;
  float scale = 0.f;  // softmax scale, usually head_dim^-0.5
  // Packed rows (several records in one row, FlashAttention varlen style): pos [B*T] I32, the
  // position of each token inside its record (0 at a record's first token, then +1 a token). Key
  // j of a row is visible to query i iff i - pos[i] <= j <= i: the causal mask is block-diagonal.
  // Precondition: pos[t] == 0 or pos[t] == pos[t-1] + 1 within a row, pos[0] == 0.
  // Empty: one record per row (pos[t] = t).
  Tensor pos;
  // Sliding-window (local) attention: > 0 = query i sees only keys j > i - window (itself and the
  // window - 1 before it; HF's kv_idx > q_idx - sliding_window), on top of the causal / record
  // mask. 0 = no window.
  int window = 0;
};

struct AdamWParams {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  int64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.f;  // the gradient is multiplied by this first (clipping)
  // BF16 m and v only: their stochastic rounding draws its bits for element i of the call from
  // round_bits(round_key(round_seed, step, blob), first + i) (core/stochastic_round.h): `blob` is
  // the model-layout index of the blob the tensors belong to, `first` the index within that blob
  // of the call's element 0. The engines set them, so chunks and engines draw alike.
  uint64_t round_seed = 0;
  int64_t blob = 0;
  int64_t first = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // out[M,N] = alpha * op(a) @ op(b) + beta * out.
  // op(a) = a [M,K], or a^T when trans_a (a stored [K,M]); op(b) = b [K,N], or b^T when trans_b
  // (b stored [N,K]). Linear layer y = x W^T: matmul(y, x, W, false, true, 1, 0).
  virtual void matmul(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta,
                      Stream& s) = 0;
  // out[M,N] = op(a) @ op(b) + c: a linear layer and the residual added to it, in one pass (the
  // cuda backend adds c in the GEMM's epilogue: one rounding). c [M,N] has out's dtype; it is out
  // itself or does not overlap it.
  virtual void matmul_add(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, Tensor c, Stream& s) = 0;
  // out[M,N] += bias[N] (broadcast over rows).
  virtual void add_bias(Tensor out, Tensor bias, Stream& s) = 0;
  // dbias[N] += sum over rows of dout[M,N].
  virtual void bias_backward(Tensor dbias, Tensor dout, Stream& s) = 0;

  // RMSNorm over the last dim C of x [R, C] with weight w [C] (HF Llama: w * (x * rstd)).
  // rstd [R] F32 (saved for backward; may be empty in a forward-only pass).
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) = 0;
  // dx = (accumulate ? dx : 0) + d/dx; dw [C] += d/dw. x, w as in forward; rstd required. dw may
  // be empty; so may dx on the cpu backend (the cuda kernel always writes dx).
  virtual void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                                Stream& s) = 0;
  // Gemma's RMSNorm: out = (1 + w) * (x * rstd) with 1 + w formed in fp32 (HF Gemma3RMSNorm:
  // one rounding, at the end). Arguments and the backward's contract as rmsnorm_*; dw is the
  // gradient of w (the same sum as rmsnorm's).
  virtual void rmsnorm_1p_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) = 0;
  virtual void rmsnorm_1p_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                                   Stream& s) = 0;

  // RoPE in place, HF half-split layout: x [B*T, n_heads*head_dim]; the token in row r has
  // position pos[r] (pos [B*T] I32, values in [0, T), AttnDims::pos), or r % T when pos is empty.
  // cos, sin: [T_max >= T, head_dim/2] F32 tables (llama3/linear scaling is already in them).
  // backward applies the inverse rotation to a gradient in place.
  virtual void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos,
                            Stream& s) = 0;
  virtual void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int n_heads, int head_dim, Tensor pos,
                             Stream& s) = 0;

  // out = silu(gate) * up, all [R, I].
  virtual void swiglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) = 0;
  virtual void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) = 0;
  // GeGLU (Gemma): out = gelu_tanh(gate) * up, all [R, I]; gelu_tanh(g) = 0.5 g (1 + tanh(
  // sqrt(2/pi) (g + 0.044715 g^3))) (PyTorch's gelu(approximate="tanh")). Backward as swiglu's.
  virtual void geglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) = 0;
  virtual void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) = 0;

  // Causal GQA attention (block-diagonal causal when d.pos is given; banded when d.window > 0). q, out: [B*T,
  // n_head*hd]; k, v: [B*T, n_kv_head*hd]; lse [B, n_head, T] F32 = log-sum-exp of the scaled scores of each query row
  // (natural log). No T x T matrix is kept between forward and backward.
  virtual void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d,
                                 Stream& s) = 0;
  // dq, dk, dv overwritten. ws: scratch of attention_workspace_bytes(d) bytes (may be 0).
  virtual void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                                  Tensor out, Tensor lse, const AttnDims& d, Tensor ws, Stream& s) = 0;
  virtual size_t attention_workspace_bytes(const AttnDims& d) const = 0;

  // Fused head: logits = x [N,H] @ w[V,H]^T, chunked over tokens (never all N x V at once).
  // labels [N] I32, -100 = ignored. loss_sum [1] F32 += sum of cross-entropy over non-ignored rows.
  // If dx is given: dx [N,H] = grad_scale * dCE/dx (overwritten; 0 on ignored rows).
  // If dw is given: dw [V,H] += grad_scale * dCE/dw. ws: linear_ce_workspace_bytes(N, H, V) bytes.
  virtual void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels,
                                    float grad_scale, Tensor ws, Stream& s) = 0;
  virtual size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) const = 0;
  // The same with Gemma 4's final soft-cap c > 0: the loss is taken on c * tanh(logits / c), the
  // gradients through it (ds/dz = 1 - tanh^2), the same workspace. Not a pure virtual: a backend
  // without it refuses the call (cpu and cuda have it).
  // Arguments: loss_sum, dx, dw, x, w, labels, grad_scale, softcap, ws, stream.
  virtual void linear_cross_entropy_capped(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float, float, Tensor,
                                           Stream&) {
    throw std::runtime_error("linear_cross_entropy_capped: logit soft-capping is not implemented on this device");
  }

  // out [N,H] = table[ids[n]]; dtable [V,H] += scatter of dout rows by ids.
  virtual void embedding_forward(Tensor out, Tensor ids, Tensor table, Stream& s) = 0;
  virtual void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, Stream& s) = 0;
  // out [N] = ids[n] where 0 <= ids[n] < limit, else 0 (both I32; out may alias ids): transformers'
  // lookup of a table shorter than the vocabulary (Gemma 4's per-layer inputs: the rest take row 0).
  virtual void ids_or_zero(Tensor out, Tensor ids, int64_t limit, Stream& s) = 0;

  // out = a + b (out may alias a or b), same shapes.
  virtual void add(Tensor out, Tensor a, Tensor b, Stream& s) = 0;
  // x *= alpha.
  virtual void scale(Tensor x, float alpha, Stream& s) = 0;
  // out = in, converting dtype (same numel). bf16 rounding: nearest-even.
  virtual void cast(Tensor out, Tensor in, Stream& s) = 0;
  // x = 0.
  virtual void zero(Tensor x, Stream& s) = 0;
  // out [1] F32 += sum(x^2) (accumulated in at least fp32; cpu uses fp64).
  virtual void sq_norm(Tensor out, Tensor x, Stream& s) = 0;

  // ---- Mixture of experts (model/program.cpp's MoE layer). N tokens, E experts, k = top_k; a
  // "slot" is one (token, choice) pair n*k + j; "sorted" rows are the N*k slots ordered by expert
  // (stable: by slot within an expert). Index tensors are I32.
  //
  // Router: probs [N,E] F32 = softmax(logits [N,E]) in fp32; idx [N,k] = the k largest probs of
  // each row in descending order (ties: the lower expert); weights [N,k] F32 = those probs, divided
  // by their sum when renorm. stats (optional) F32 [2,E] += (row 0) how many tokens chose each
  // expert, (row 1) the sum of probs over the rows: what the load-balancing loss needs.
  virtual void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm,
                         Stream& s) = 0;
  // dlogits [N,E] (overwritten) from dweights [N,k] F32 through the top-k (renorm as forward) and
  // the softmax, plus aux_scale * counts[e] added to d(probs[n,e]) for every row (the load-
  // balancing loss's gradient; counts F32 [E], may be empty).
  virtual void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                                  float aux_scale, Stream& s) = 0;
  // Counting sort of the slots by expert: offsets [E+1] (offsets[e] = first sorted row of expert
  // e, offsets[E] = N*k), sorted_slot [N*k] (sorted row -> slot), slot_pos [N*k] (slot -> sorted
  // row). idx values must be in [0, E).
  virtual void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, Stream& s) = 0;
  // xs [N*k, H] row p = x [N, H] row sorted_slot[p] / k.
  virtual void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, Stream& s) = 0;
  // dx [N, H] (overwritten) row n = sum over j of dxs row slot_pos[n*k + j] (j ascending).
  virtual void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, Stream& s) = 0;
  // Grouped linear over sorted rows: for each expert e, rows r in [offsets[e], offsets[e+1]) of
  // a [M, K]: out[r] = a[r] @ op(W_e) + beta * out[r], W_e the first K*Nout elements of row e of
  // w [E, stride] seen as [Nout, K] (trans_w: a linear layer's weight) or [K, Nout].
  virtual void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta,
                                  Stream& s) = 0;
  // dw_e [Nout, K] (row e of dw [E, stride], F32 or BF16) += dy_e^T @ x_e over expert e's rows of
  // dy [M, Nout] and x [M, K]. Experts with no rows are left as they are.
  virtual void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, Stream& s) = 0;
  // y [N, H] (overwritten) row n = sum over j of weights[n, j] * ys row slot_pos[n*k + j].
  virtual void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, Stream& s) = 0;
  // dys [N*k, H] row slot_pos[n*k+j] = weights[n,j] * dy[n]; dweights [N,k] F32 = dy[n] . that ys row.
  virtual void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                                    Stream& s) = 0;
  // loss_sum [1] F32 += scale * sum_e stats[0,e] * stats[1,e] (the load-balancing loss, scaled).
  virtual void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, Stream& s) = 0;
  // Gemma 4's router.per_expert_scale: out [N,k] F32 = w [N,k] F32 * scale[idx] (scale [E], F32
  // or BF16; idx [N,k] I32 in [0, E); out may alias w).
  virtual void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, Stream& s) = 0;
  // Its backward: dscale [E] (F32 or BF16) += sum over the slots that chose e of dout * w (w the
  // forward's input), then dw [N,k] F32 = dout * scale[idx] (dw may alias dout).
  virtual void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                                         Stream& s) = 0;

  // PyTorch AdamW on fp32 params, m and v both F32 or both BF16 (compact state: the update runs in
  // fp32 and m, v are written back with unbiased stochastic rounding, AdamWParams' stream), grads
  // (F32 or BF16), all of the same numel:
  // g = grad*grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr*wd*p;
  // p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps). If param_copy is given (BF16 or F32),
  // the new parameter is also written there (the upload copy).
  virtual void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& p,
                     Stream& s) = 0;
};

}  // namespace sf
