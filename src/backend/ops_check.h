// The validating front of the kernel table: CheckedOps holds a backend's Ops, checks each call's
// arguments against the preconditions that ops.h documents (dtypes, shapes, optional outputs,
// aliasing, workspace sizes) and forwards the call. Every Device hands out its Ops through one
// (cpu_device.cpp, cuda_device.cpp), so a backend only ever sees valid calls and keeps checks of
// its own limits only (a head_dim its kernel lacks, a dtype mix cuBLASLt cannot do, token ids
// and positions that only host memory can show).
//
// Each precondition is written once, here. A failure throws through SF_CHECK (core/error.h) with
// "file:line: op: argument ... expected ..."; the message is built only when a check fails, so a
// call costs a few integer comparisons and no allocation.
//
// Header-only: the cuda backend (its own library, linked below `sf`) includes it as well.
#pragma once
#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace sf::opcheck {

inline bool is_real(DType t) { return t == DType::F32 || t == DType::BF16; }

// "name [2, 3] BF16" (error messages only).
inline std::string desc(const char* name, const Tensor& t) {
  if (t.empty()) return std::string(name) + " (empty)";
  return std::string(name) + " " + t.shape_str() + " " + dtype_name(t.dtype);
}
inline std::string not_real(const char* op, const char* name, const Tensor& t) {
  return std::string(op) + ": " + desc(name, t) + " must be a non-empty F32 or BF16 tensor";
}
inline std::string not_dtype(const char* op, const char* name, const Tensor& t, DType dt) {
  return std::string(op) + ": " + desc(name, t) + " must be a non-empty " + dtype_name(dt) + " tensor";
}
// `what` names the expected count ("C", "numel(gate)"); "" when it is a plain number.
inline std::string bad_numel(const char* op, const char* name, const Tensor& t, int64_t n, const char* what) {
  return std::string(op) + ": " + desc(name, t) + " has " + std::to_string(t.numel()) + " elements, expected " + what +
         (*what ? " = " : "") + std::to_string(n);
}
inline std::string bad_shape(const char* op, const char* name, const Tensor& t, const char* expected) {
  return std::string(op) + ": " + desc(name, t) + " is not " + expected;
}
inline std::string aliases(const char* op, const char* out, const char* in) {
  return std::string(op) + ": " + out + " overlaps " + in;
}

// Tensor::rows() with a last dimension of 0 allowed (a malformed argument must be refused, not
// divide by zero).
inline int64_t rows(const Tensor& t) { return t.cols() == 0 ? 0 : t.numel() / t.cols(); }

// Whether the byte ranges of two tensors overlap (empty tensors overlap nothing).
inline bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

}  // namespace sf::opcheck

// The shape / dtype helpers of the SF_CHECK family. `op` is the operation's name, `t` an argument
// (its spelling is the name in the message), `what` how the expected count is called.
#define SF_CHECK_REAL(op, t) \
  SF_CHECK(!(t).empty() && ::sf::opcheck::is_real((t).dtype), ::sf::opcheck::not_real(op, #t, t))
#define SF_CHECK_DTYPE(op, t, dt) SF_CHECK(!(t).empty() && (t).dtype == (dt), ::sf::opcheck::not_dtype(op, #t, t, dt))
#define SF_CHECK_NUMEL(op, t, n, what) SF_CHECK((t).numel() == (n), ::sf::opcheck::bad_numel(op, #t, t, n, what))
#define SF_CHECK_NO_ALIAS(op, out, in) \
  SF_CHECK(!::sf::opcheck::overlaps(out, in), ::sf::opcheck::aliases(op, #out, #in))

namespace sf::opcheck {

// One function per operation of ops.h, in its order: the preconditions of that operation. They are
// also callable on their own (the engine calls some cpu kernels directly).

// op: the name in messages (matmul_add shares these checks).
inline void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                   const char* op = "matmul") {
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, a);
  SF_CHECK_REAL(op, b);
  // op(a) [M,K], op(b) [K,N], out [M,N]; every tensor seen as a matrix [rows, cols].
  const int64_t M = rows(out), N = out.cols();
  const int64_t K = trans_a ? rows(a) : a.cols(), aM = trans_a ? a.cols() : rows(a);
  const int64_t bK = trans_b ? b.cols() : rows(b), bN = trans_b ? rows(b) : b.cols();
  SF_CHECK(aM == M && bK == K && bN == N, std::string(op) + ": shapes do not match: " + desc("out", out) + ", " +
                                              desc("a", a) + (trans_a ? "^T" : "") + ", " + desc("b", b) +
                                              (trans_b ? "^T" : ""));
  SF_CHECK_NO_ALIAS(op, out, a);
  SF_CHECK_NO_ALIAS(op, out, b);
}

inline void matmul_add(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                       const Tensor& c) {
  constexpr const char* op = "matmul_add";
  matmul(out, a, b, trans_a, trans_b, op);
  SF_CHECK_DTYPE(op, c, out.dtype);
  SF_CHECK_NUMEL(op, c, out.numel(), "numel(out)");
  SF_CHECK(c.data == out.data || !overlaps(out, c), aliases(op, "out", "c") + " (other than being out itself)");
  SF_CHECK_NO_ALIAS(op, c, a);
  SF_CHECK_NO_ALIAS(op, c, b);
}

inline void add_bias(const Tensor& out, const Tensor& bias) {
  constexpr const char* op = "add_bias";
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, bias);
  SF_CHECK_NUMEL(op, bias, out.cols(), "N (columns of out)");
}

inline void bias_backward(const Tensor& dbias, const Tensor& dout) {
  constexpr const char* op = "bias_backward";
  SF_CHECK_REAL(op, dbias);
  SF_CHECK_REAL(op, dout);
  SF_CHECK_NUMEL(op, dbias, dout.cols(), "N (columns of dout)");
}

// op: the name in messages (rmsnorm_1p_* share these checks).
inline void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                            const char* op = "rmsnorm_forward") {
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, x);
  SF_CHECK_REAL(op, w);
  const int64_t R = rows(x), C = x.cols();  // x, out [R, C]; w [C]; rstd [R]
  SF_CHECK_NUMEL(op, out, R * C, "R*C (of x)");
  SF_CHECK_NUMEL(op, w, C, "C");
  if (!rstd.empty()) {
    SF_CHECK_DTYPE(op, rstd, DType::F32);
    SF_CHECK_NUMEL(op, rstd, R, "R");
  }
}

inline void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                             const Tensor& rstd, const char* op = "rmsnorm_backward") {
  SF_CHECK_REAL(op, dout);
  SF_CHECK_REAL(op, x);
  SF_CHECK_REAL(op, w);
  // The backward has no eps, so it cannot recompute rstd: the saved one is required.
  SF_CHECK_DTYPE(op, rstd, DType::F32);
  const int64_t R = rows(x), C = x.cols();  // x, dout, dx [R, C]; w, dw [C]; rstd [R]
  SF_CHECK_NUMEL(op, dout, R * C, "R*C (of x)");
  SF_CHECK_NUMEL(op, w, C, "C");
  SF_CHECK_NUMEL(op, rstd, R, "R");
  if (!dx.empty()) {
    SF_CHECK_REAL(op, dx);
    SF_CHECK_NUMEL(op, dx, R * C, "R*C (of x)");
  }
  if (!dw.empty()) {
    SF_CHECK_REAL(op, dw);
    SF_CHECK_NUMEL(op, dw, C, "C");
  }
}

inline void rope(const char* op, const Tensor& x, const Tensor& cos, const Tensor& sin, int T, int n_heads,
                 int head_dim, const Tensor& pos) {
  SF_CHECK_REAL(op, x);
  SF_CHECK_DTYPE(op, cos, DType::F32);
  SF_CHECK_DTYPE(op, sin, DType::F32);
  SF_CHECK(T > 0 && n_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
           std::string(op) + ": T = " + std::to_string(T) + ", n_heads = " + std::to_string(n_heads) +
               ", head_dim = " + std::to_string(head_dim) + ": each must be > 0 and head_dim even");
  const int64_t half = head_dim / 2, width = int64_t(n_heads) * head_dim;
  SF_CHECK(x.cols() == width && rows(x) % T == 0, bad_shape(op, "x", x, "[B*T, n_heads*head_dim]") +
                                                      " (T = " + std::to_string(T) +
                                                      ", n_heads*head_dim = " + std::to_string(width) + ")");
  SF_CHECK(cos.cols() == half && rows(cos) >= T, bad_shape(op, "cos", cos, "[T_max >= T, head_dim/2]"));
  SF_CHECK(sin.cols() == half && rows(sin) >= T, bad_shape(op, "sin", sin, "[T_max >= T, head_dim/2]"));
  if (!pos.empty()) {
    SF_CHECK_DTYPE(op, pos, DType::I32);
    SF_CHECK_NUMEL(op, pos, rows(x), "B*T (rows of x)");
  }
}

// op: the name in messages (geglu_* share these checks).
inline void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, const char* op = "swiglu_forward") {
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, gate);
  SF_CHECK_REAL(op, up);
  const int64_t n = gate.numel();  // out, gate, up [R, I]
  SF_CHECK_NUMEL(op, out, n, "numel(gate)");
  SF_CHECK_NUMEL(op, up, n, "numel(gate)");
}

inline void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                            const Tensor& up, const char* op = "swiglu_backward") {
  SF_CHECK_REAL(op, dgate);
  SF_CHECK_REAL(op, dup);
  SF_CHECK_REAL(op, dout);
  SF_CHECK_REAL(op, gate);
  SF_CHECK_REAL(op, up);
  const int64_t n = gate.numel();  // all [R, I]
  SF_CHECK_NUMEL(op, dgate, n, "numel(gate)");
  SF_CHECK_NUMEL(op, dup, n, "numel(gate)");
  SF_CHECK_NUMEL(op, dout, n, "numel(gate)");
  SF_CHECK_NUMEL(op, up, n, "numel(gate)");
}

// What attention_forward and attention_backward share: the dims and q, k, v, out, lse, d.pos.
inline void attention_common(const char* op, const AttnDims& d, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse) {
  SF_CHECK(d.B > 0 && d.T > 0 && d.n_head > 0 && d.n_kv_head > 0 && d.head_dim > 0 && d.n_head % d.n_kv_head == 0,
           std::string(op) + ": bad dims B=" + std::to_string(d.B) + " T=" + std::to_string(d.T) +
               " n_head=" + std::to_string(d.n_head) + " n_kv_head=" + std::to_string(d.n_kv_head) +
               " head_dim=" + std::to_string(d.head_dim) + " (each > 0, n_head a multiple of n_kv_head)");
  SF_CHECK_REAL(op, q);
  SF_CHECK_REAL(op, k);
  SF_CHECK_REAL(op, v);
  SF_CHECK_REAL(op, out);
  SF_CHECK_DTYPE(op, lse, DType::F32);
  const int64_t N = int64_t(d.B) * d.T, qw = int64_t(d.n_head) * d.head_dim, kw = int64_t(d.n_kv_head) * d.head_dim;
  SF_CHECK(rows(q) == N && q.cols() == qw, bad_shape(op, "q", q, "[B*T, n_head*head_dim]"));
  SF_CHECK(rows(out) == N && out.cols() == qw, bad_shape(op, "out", out, "[B*T, n_head*head_dim]"));
  SF_CHECK(rows(k) == N && k.cols() == kw, bad_shape(op, "k", k, "[B*T, n_kv_head*head_dim]"));
  SF_CHECK(rows(v) == N && v.cols() == kw, bad_shape(op, "v", v, "[B*T, n_kv_head*head_dim]"));
  SF_CHECK_NUMEL(op, lse, int64_t(d.B) * d.n_head * d.T, "B*n_head*T");
  SF_CHECK(d.window >= 0, std::string(op) + ": window = " + std::to_string(d.window) + " must be >= 0 (0 = none)");
  if (!d.pos.empty()) {
    const Tensor& pos = d.pos;
    SF_CHECK_DTYPE(op, pos, DType::I32);
    SF_CHECK_NUMEL(op, pos, N, "B*T");
  }
}

inline void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttnDims& d) {
  constexpr const char* op = "attention_forward";
  attention_common(op, d, q, k, v, out, lse);
  SF_CHECK_NO_ALIAS(op, out, q);
  SF_CHECK_NO_ALIAS(op, out, k);
  SF_CHECK_NO_ALIAS(op, out, v);
}

// ws_need: the backend's attention_workspace_bytes(d).
inline void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                               const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                               const AttnDims& d, const Tensor& ws, size_t ws_need) {
  constexpr const char* op = "attention_backward";
  attention_common(op, d, q, k, v, out, lse);
  SF_CHECK_REAL(op, dq);
  SF_CHECK_REAL(op, dk);
  SF_CHECK_REAL(op, dv);
  SF_CHECK_REAL(op, dout);
  SF_CHECK_NUMEL(op, dq, q.numel(), "numel(q)");
  SF_CHECK_NUMEL(op, dout, q.numel(), "numel(q)");
  SF_CHECK_NUMEL(op, dk, k.numel(), "numel(k)");
  SF_CHECK_NUMEL(op, dv, v.numel(), "numel(v)");
  for (const Tensor* in : {&q, &k, &v, &out, &dout, &lse}) {
    SF_CHECK(!overlaps(dq, *in) && !overlaps(dk, *in) && !overlaps(dv, *in),
             std::string(op) + ": a gradient output (dq, dk, dv) overlaps an input (q, k, v, out, dout, lse)");
  }
  SF_CHECK(ws_need == 0 || (!ws.empty() && ws.bytes() >= ws_need),
           std::string(op) + ": workspace " + desc("ws", ws) +
               " is smaller than attention_workspace_bytes = " + std::to_string(ws_need));
}

// ws_need: the backend's linear_ce_workspace_bytes(N, H, V).
inline void linear_cross_entropy(const Tensor& loss_sum, const Tensor& dx, const Tensor& dw, const Tensor& x,
                                 const Tensor& w, const Tensor& labels, const Tensor& ws, size_t ws_need) {
  constexpr const char* op = "linear_cross_entropy";
  SF_CHECK_DTYPE(op, loss_sum, DType::F32);
  SF_CHECK_NUMEL(op, loss_sum, 1, "");
  SF_CHECK_REAL(op, x);
  SF_CHECK_REAL(op, w);
  SF_CHECK_DTYPE(op, labels, DType::I32);
  const int64_t N = rows(x), H = x.cols(), V = rows(w);  // x [N, H], w [V, H], labels [N]
  SF_CHECK(w.cols() == H, bad_shape(op, "w", w, "[V, H]") + " (H = " + std::to_string(H) + ", the columns of x)");
  SF_CHECK_NUMEL(op, labels, N, "N (rows of x)");
  if (!dx.empty()) {
    SF_CHECK_REAL(op, dx);
    SF_CHECK_NUMEL(op, dx, N * H, "N*H (of x)");
    // dx rows of a chunk are written after that chunk's x rows were last read: an exact alias is fine.
    SF_CHECK(!overlaps(dx, x) || (dx.data == x.data && dx.dtype == x.dtype),
             std::string(op) + ": dx overlaps x (only dx == x, same dtype, is allowed)");
    SF_CHECK_NO_ALIAS(op, dx, w);
  }
  if (!dw.empty()) {
    SF_CHECK_REAL(op, dw);
    SF_CHECK_NUMEL(op, dw, V * H, "V*H (of w)");
    SF_CHECK_NO_ALIAS(op, dw, w);
    SF_CHECK_NO_ALIAS(op, dw, x);
  }
  if (N == 0) return;
  SF_CHECK(V > 0 && H > 0, std::string(op) + ": empty " + desc("w", w));
  SF_CHECK(!ws.empty() && ws.bytes() >= ws_need,
           std::string(op) + ": workspace " + desc("ws", ws) +
               " is smaller than linear_ce_workspace_bytes = " + std::to_string(ws_need));
}

inline void embedding_forward(const Tensor& out, const Tensor& ids, const Tensor& table) {
  constexpr const char* op = "embedding_forward";
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, table);
  SF_CHECK_DTYPE(op, ids, DType::I32);
  // table [V, H], out [N, H], ids [N]
  SF_CHECK(out.cols() == table.cols(),
           bad_shape(op, "out", out, "[N, H]") + " (H = " + std::to_string(table.cols()) + ", the columns of table)");
  SF_CHECK_NUMEL(op, ids, rows(out), "N (rows of out)");
}

inline void ids_or_zero(const Tensor& out, const Tensor& ids, int64_t limit) {
  constexpr const char* op = "ids_or_zero";
  SF_CHECK_DTYPE(op, out, DType::I32);
  SF_CHECK_DTYPE(op, ids, DType::I32);
  SF_CHECK_NUMEL(op, ids, out.numel(), "the elements of out");
  SF_CHECK(limit >= 1, std::string(op) + ": limit " + std::to_string(limit) + " must be at least 1");
}

inline void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  constexpr const char* op = "embedding_backward";
  SF_CHECK_REAL(op, dtable);
  SF_CHECK_REAL(op, dout);
  SF_CHECK_DTYPE(op, ids, DType::I32);
  // dtable [V, H], dout [N, H], ids [N]
  SF_CHECK(dout.cols() == dtable.cols(), bad_shape(op, "dout", dout, "[N, H]") +
                                             " (H = " + std::to_string(dtable.cols()) + ", the columns of dtable)");
  SF_CHECK_NUMEL(op, ids, rows(dout), "N (rows of dout)");
}

inline void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, a);
  SF_CHECK_REAL(op, b);
  SF_CHECK_NUMEL(op, a, out.numel(), "numel(out)");
  SF_CHECK_NUMEL(op, b, out.numel(), "numel(out)");
}

inline void scale(const Tensor& x) { SF_CHECK_REAL("scale", x); }

inline void cast(const Tensor& out, const Tensor& in) {
  constexpr const char* op = "cast";
  SF_CHECK(!out.empty(), std::string(op) + ": " + desc("out", out) + " has no data");
  SF_CHECK(!in.empty(), std::string(op) + ": " + desc("in", in) + " has no data");
  SF_CHECK_NUMEL(op, in, out.numel(), "numel(out)");
  if (out.dtype == in.dtype) return;  // a plain copy (an exact alias is harmless)
  // F16 is accepted too (checkpoints may hold it; a backend may lack it); I32 only copies to I32.
  auto is_float = [](DType t) { return is_real(t) || t == DType::F16; };
  SF_CHECK(is_float(out.dtype) && is_float(in.dtype),
           std::string(op) + ": cannot convert " + desc("in", in) + " to " + desc("out", out));
  SF_CHECK(!overlaps(out, in), std::string(op) +
                                   ": out overlaps in (converting in place between dtypes of "
                                   "different sizes is not supported)");
}

inline void zero(const Tensor& x) { SF_CHECK(x.numel() == 0 || !x.empty(), "zero: " + desc("x", x) + " has no data"); }

inline void sq_norm(const Tensor& out, const Tensor& x) {
  constexpr const char* op = "sq_norm";
  SF_CHECK_DTYPE(op, out, DType::F32);
  SF_CHECK_NUMEL(op, out, 1, "");
  SF_CHECK_REAL(op, x);
}

inline void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& param_copy,
                  const AdamWParams& p) {
  constexpr const char* op = "adamw";
  SF_CHECK_DTYPE(op, param, DType::F32);
  SF_CHECK_REAL(op, m);  // F32, or BF16 (compact state, stochastically rounded)
  SF_CHECK_DTYPE(op, v, m.dtype);
  SF_CHECK_REAL(op, grad);
  const int64_t n = param.numel();  // all [n]
  SF_CHECK_NUMEL(op, grad, n, "numel(param)");
  SF_CHECK_NUMEL(op, m, n, "numel(param)");
  SF_CHECK_NUMEL(op, v, n, "numel(param)");
  if (!param_copy.empty()) {
    SF_CHECK_REAL(op, param_copy);
    SF_CHECK_NUMEL(op, param_copy, n, "numel(param)");
  }
  SF_CHECK(p.step >= 1, std::string(op) + ": step must be >= 1 (1-based), got " + std::to_string(p.step));
}

// ---- mixture of experts

// idx [N, k] I32 with k >= 1; returns N.
inline int64_t moe_idx(const char* op, const Tensor& idx) {
  SF_CHECK_DTYPE(op, idx, DType::I32);
  SF_CHECK(idx.cols() >= 1, bad_shape(op, "idx", idx, "[N, k] with k >= 1"));
  return rows(idx);
}

inline void moe_route(const Tensor& probs, const Tensor& idx, const Tensor& weights, const Tensor& stats,
                      const Tensor& logits) {
  constexpr const char* op = "moe_route";
  SF_CHECK_REAL(op, logits);
  SF_CHECK_DTYPE(op, probs, DType::F32);
  SF_CHECK_DTYPE(op, weights, DType::F32);
  const int64_t N = moe_idx(op, idx), k = idx.cols(), E = logits.cols();  // logits, probs [N,E]; idx, weights [N,k]
  SF_CHECK(rows(logits) == N && E >= k, bad_shape(op, "logits", logits, "[N, E] with E >= k (N, k from idx)"));
  SF_CHECK_NUMEL(op, probs, N * E, "N*E");
  SF_CHECK_NUMEL(op, weights, N * k, "N*k");
  if (!stats.empty()) {
    SF_CHECK_DTYPE(op, stats, DType::F32);
    SF_CHECK_NUMEL(op, stats, 2 * E, "2*E");
  }
}

inline void moe_route_backward(const Tensor& dlogits, const Tensor& dweights, const Tensor& probs, const Tensor& idx,
                               const Tensor& counts) {
  constexpr const char* op = "moe_route_backward";
  SF_CHECK_REAL(op, dlogits);
  SF_CHECK_DTYPE(op, dweights, DType::F32);
  SF_CHECK_DTYPE(op, probs, DType::F32);
  const int64_t N = moe_idx(op, idx), k = idx.cols(), E = probs.cols();
  SF_CHECK(rows(probs) == N && E >= k, bad_shape(op, "probs", probs, "[N, E] with E >= k (N, k from idx)"));
  SF_CHECK_NUMEL(op, dlogits, N * E, "N*E");
  SF_CHECK_NUMEL(op, dweights, N * k, "N*k");
  if (!counts.empty()) {
    SF_CHECK_DTYPE(op, counts, DType::F32);
    SF_CHECK_NUMEL(op, counts, E, "E");
  }
}

inline void moe_permute(const Tensor& offsets, const Tensor& sorted_slot, const Tensor& slot_pos, const Tensor& idx) {
  constexpr const char* op = "moe_permute";
  const int64_t S = moe_idx(op, idx) * idx.cols();
  SF_CHECK_DTYPE(op, offsets, DType::I32);
  SF_CHECK_DTYPE(op, sorted_slot, DType::I32);
  SF_CHECK_DTYPE(op, slot_pos, DType::I32);
  SF_CHECK(offsets.numel() >= 2, bad_shape(op, "offsets", offsets, "[E+1] with E >= 1"));
  SF_CHECK_NUMEL(op, sorted_slot, S, "N*k");
  SF_CHECK_NUMEL(op, slot_pos, S, "N*k");
  SF_CHECK(S < (int64_t(1) << 31), std::string(op) + ": N*k = " + std::to_string(S) + " does not fit I32");
}

inline void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& sorted_slot, int k) {
  constexpr const char* op = "moe_gather";
  SF_CHECK_REAL(op, xs);
  SF_CHECK_REAL(op, x);
  SF_CHECK_DTYPE(op, sorted_slot, DType::I32);
  SF_CHECK(k >= 1, std::string(op) + ": k must be >= 1");
  SF_CHECK(xs.cols() == x.cols() && rows(xs) == rows(x) * k, bad_shape(op, "xs", xs, "[N*k, H] (x [N, H])"));
  SF_CHECK_NUMEL(op, sorted_slot, rows(xs), "N*k");
  SF_CHECK_NO_ALIAS(op, xs, x);
}

inline void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& slot_pos, int k) {
  constexpr const char* op = "moe_gather_backward";
  SF_CHECK_REAL(op, dx);
  SF_CHECK_REAL(op, dxs);
  SF_CHECK_DTYPE(op, slot_pos, DType::I32);
  SF_CHECK(k >= 1, std::string(op) + ": k must be >= 1");
  SF_CHECK(dxs.cols() == dx.cols() && rows(dxs) == rows(dx) * k, bad_shape(op, "dxs", dxs, "[N*k, H] (dx [N, H])"));
  SF_CHECK_NUMEL(op, slot_pos, rows(dxs), "N*k");
  SF_CHECK_NO_ALIAS(op, dx, dxs);
}

// w [E, stride] with stride >= K*Nout, offsets [E+1].
inline void moe_grouped_w(const char* op, const Tensor& w, const Tensor& offsets, int64_t K, int64_t Nout) {
  SF_CHECK_REAL(op, w);
  SF_CHECK_DTYPE(op, offsets, DType::I32);
  SF_CHECK(w.ndim == 2 && w.cols() >= K * Nout,
           bad_shape(op, "w", w, ("[E, stride >= " + std::to_string(K * Nout) + "]").c_str()));
  SF_CHECK_NUMEL(op, offsets, rows(w) + 1, "E+1 (rows of w + 1)");
}

inline void moe_grouped_matmul(const Tensor& out, const Tensor& a, const Tensor& w, const Tensor& offsets) {
  constexpr const char* op = "moe_grouped_matmul";
  SF_CHECK_REAL(op, out);
  SF_CHECK_REAL(op, a);
  SF_CHECK(rows(out) == rows(a), bad_shape(op, "out", out, "[M, Nout] with M = rows of a"));
  moe_grouped_w(op, w, offsets, a.cols(), out.cols());
  SF_CHECK_NO_ALIAS(op, out, a);
  SF_CHECK_NO_ALIAS(op, out, w);
}

inline void moe_grouped_matmul_wgrad(const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& offsets) {
  constexpr const char* op = "moe_grouped_matmul_wgrad";
  SF_CHECK_REAL(op, dy);
  SF_CHECK_REAL(op, x);
  SF_CHECK(rows(dy) == rows(x), bad_shape(op, "dy", dy, "[M, Nout] with M = rows of x"));
  moe_grouped_w(op, dw, offsets, x.cols(), dy.cols());
  SF_CHECK_NO_ALIAS(op, dw, dy);
  SF_CHECK_NO_ALIAS(op, dw, x);
}

inline void moe_combine_common(const char* op, const Tensor& y, const Tensor& ys, const Tensor& weights,
                               const Tensor& slot_pos) {
  SF_CHECK_REAL(op, y);
  SF_CHECK_REAL(op, ys);
  SF_CHECK_DTYPE(op, weights, DType::F32);
  SF_CHECK_DTYPE(op, slot_pos, DType::I32);
  const int64_t N = rows(weights), k = weights.cols();
  SF_CHECK(k >= 1 && rows(y) == N, bad_shape(op, "weights", weights, "[N, k] (N = rows of y, k >= 1)"));
  SF_CHECK(ys.cols() == y.cols() && rows(ys) == N * k, bad_shape(op, "ys", ys, "[N*k, H]"));
  SF_CHECK_NUMEL(op, slot_pos, N * k, "N*k");
}

inline void moe_combine(const Tensor& y, const Tensor& ys, const Tensor& weights, const Tensor& slot_pos) {
  moe_combine_common("moe_combine", y, ys, weights, slot_pos);
  SF_CHECK_NO_ALIAS("moe_combine", y, ys);
}

inline void moe_combine_backward(const Tensor& dys, const Tensor& dweights, const Tensor& dy, const Tensor& ys,
                                 const Tensor& weights, const Tensor& slot_pos) {
  constexpr const char* op = "moe_combine_backward";
  moe_combine_common(op, dy, ys, weights, slot_pos);
  SF_CHECK_REAL(op, dys);
  SF_CHECK_NUMEL(op, dys, ys.numel(), "numel(ys)");
  SF_CHECK_DTYPE(op, dweights, DType::F32);
  SF_CHECK_NUMEL(op, dweights, weights.numel(), "N*k");
  SF_CHECK_NO_ALIAS(op, dys, ys);
  SF_CHECK_NO_ALIAS(op, dys, dy);
}

inline void moe_expert_scale_common(const char* op, const Tensor& out, const Tensor& w, const Tensor& idx,
                                    const Tensor& scale) {
  SF_CHECK_DTYPE(op, out, DType::F32);
  SF_CHECK_DTYPE(op, w, DType::F32);
  SF_CHECK_DTYPE(op, idx, DType::I32);
  SF_CHECK_REAL(op, scale);
  SF_CHECK(w.ndim == 2 && w.cols() >= 1, bad_shape(op, "w", w, "[N, k]"));
  SF_CHECK_NUMEL(op, out, w.numel(), "N*k");
  SF_CHECK_NUMEL(op, idx, w.numel(), "N*k");
  SF_CHECK(scale.numel() >= 1, bad_shape(op, "scale", scale, "[E]"));
}

inline void moe_expert_scale(const Tensor& out, const Tensor& w, const Tensor& idx, const Tensor& scale) {
  moe_expert_scale_common("moe_expert_scale", out, w, idx, scale);
}

inline void moe_expert_scale_backward(const Tensor& dw, const Tensor& dscale, const Tensor& dout, const Tensor& w,
                                      const Tensor& idx, const Tensor& scale) {
  constexpr const char* op = "moe_expert_scale_backward";
  moe_expert_scale_common(op, dout, w, idx, scale);
  SF_CHECK_DTYPE(op, dw, DType::F32);
  SF_CHECK_NUMEL(op, dw, w.numel(), "N*k");
  SF_CHECK_REAL(op, dscale);
  SF_CHECK_NUMEL(op, dscale, scale.numel(), "E (numel of scale)");
}

inline void moe_aux_loss(const Tensor& loss_sum, const Tensor& stats) {
  constexpr const char* op = "moe_aux_loss";
  SF_CHECK_DTYPE(op, loss_sum, DType::F32);
  SF_CHECK_NUMEL(op, loss_sum, 1, "");
  SF_CHECK_DTYPE(op, stats, DType::F32);
  SF_CHECK(stats.numel() >= 2 && stats.numel() % 2 == 0, bad_shape(op, "stats", stats, "[2, E]"));
}

}  // namespace sf::opcheck

namespace sf {

// The front itself: checks, then forwards to the backend's table (which it does not own).
class CheckedOps final : public Ops {
 public:
  explicit CheckedOps(Ops& backend) : in_(backend) {}

  void matmul(Tensor out, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, Stream& s) override {
    opcheck::matmul(out, a, b, ta, tb);
    in_.matmul(out, a, b, ta, tb, alpha, beta, s);
  }
  void matmul_add(Tensor out, Tensor a, Tensor b, bool ta, bool tb, Tensor c, Stream& s) override {
    opcheck::matmul_add(out, a, b, ta, tb, c);
    in_.matmul_add(out, a, b, ta, tb, c, s);
  }
  void add_bias(Tensor out, Tensor bias, Stream& s) override {
    opcheck::add_bias(out, bias);
    in_.add_bias(out, bias, s);
  }
  void bias_backward(Tensor dbias, Tensor dout, Stream& s) override {
    opcheck::bias_backward(dbias, dout);
    in_.bias_backward(dbias, dout, s);
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    opcheck::rmsnorm_forward(out, rstd, x, w);
    in_.rmsnorm_forward(out, rstd, x, w, eps, s);
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                        Stream& s) override {
    opcheck::rmsnorm_backward(dx, dw, dout, x, w, rstd);
    in_.rmsnorm_backward(dx, dw, dout, x, w, rstd, acc, s);
  }
  void rmsnorm_1p_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    opcheck::rmsnorm_forward(out, rstd, x, w, "rmsnorm_1p_forward");
    in_.rmsnorm_1p_forward(out, rstd, x, w, eps, s);
  }
  void rmsnorm_1p_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                           Stream& s) override {
    opcheck::rmsnorm_backward(dx, dw, dout, x, w, rstd, "rmsnorm_1p_backward");
    in_.rmsnorm_1p_backward(dx, dw, dout, x, w, rstd, acc, s);
  }
  void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    opcheck::rope("rope_forward", x, cos, sin, T, nh, hd, pos);
    in_.rope_forward(x, cos, sin, T, nh, hd, pos, s);
  }
  void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    opcheck::rope("rope_backward", dx, cos, sin, T, nh, hd, pos);
    in_.rope_backward(dx, cos, sin, T, nh, hd, pos, s);
  }
  void swiglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    opcheck::swiglu_forward(out, gate, up);
    in_.swiglu_forward(out, gate, up, s);
  }
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    opcheck::swiglu_backward(dgate, dup, dout, gate, up);
    in_.swiglu_backward(dgate, dup, dout, gate, up, s);
  }
  void geglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    opcheck::swiglu_forward(out, gate, up, "geglu_forward");
    in_.geglu_forward(out, gate, up, s);
  }
  void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    opcheck::swiglu_backward(dgate, dup, dout, gate, up, "geglu_backward");
    in_.geglu_backward(dgate, dup, dout, gate, up, s);
  }
  void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, Stream& s) override {
    opcheck::attention_forward(out, lse, q, k, v, d);
    in_.attention_forward(out, lse, q, k, v, d, s);
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                          Tensor lse, const AttnDims& d, Tensor ws, Stream& s) override {
    opcheck::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, ws, in_.attention_workspace_bytes(d));
    in_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, ws, s);
  }
  size_t attention_workspace_bytes(const AttnDims& d) const override { return in_.attention_workspace_bytes(d); }
  void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                            Tensor ws, Stream& s) override {
    opcheck::linear_cross_entropy(
        loss_sum, dx, dw, x, w, labels, ws,
        opcheck::rows(x) > 0 ? in_.linear_ce_workspace_bytes(opcheck::rows(x), x.cols(), opcheck::rows(w)) : 0);
    in_.linear_cross_entropy(loss_sum, dx, dw, x, w, labels, gs, ws, s);
  }
  void linear_cross_entropy_capped(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                                   float cap, Tensor ws, Stream& s) override {
    opcheck::linear_cross_entropy(
        loss_sum, dx, dw, x, w, labels, ws,
        opcheck::rows(x) > 0 ? in_.linear_ce_workspace_bytes(opcheck::rows(x), x.cols(), opcheck::rows(w)) : 0);
    SF_CHECK(cap > 0 && cap < 1e30f, "linear_cross_entropy_capped: softcap = " + std::to_string(cap) +
                                         " must be positive and finite");
    in_.linear_cross_entropy_capped(loss_sum, dx, dw, x, w, labels, gs, cap, ws, s);
  }
  size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) const override {
    return in_.linear_ce_workspace_bytes(N, H, V);
  }
  void embedding_forward(Tensor out, Tensor ids, Tensor table, Stream& s) override {
    opcheck::embedding_forward(out, ids, table);
    in_.embedding_forward(out, ids, table, s);
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, Stream& s) override {
    opcheck::embedding_backward(dtable, dout, ids);
    in_.embedding_backward(dtable, dout, ids, s);
  }
  void ids_or_zero(Tensor out, Tensor ids, int64_t limit, Stream& s) override {
    opcheck::ids_or_zero(out, ids, limit);
    in_.ids_or_zero(out, ids, limit, s);
  }
  void add(Tensor out, Tensor a, Tensor b, Stream& s) override {
    opcheck::add(out, a, b);
    in_.add(out, a, b, s);
  }
  void scale(Tensor x, float alpha, Stream& s) override {
    opcheck::scale(x);
    in_.scale(x, alpha, s);
  }
  void cast(Tensor out, Tensor in, Stream& s) override {
    opcheck::cast(out, in);
    in_.cast(out, in, s);
  }
  void zero(Tensor x, Stream& s) override {
    opcheck::zero(x);
    in_.zero(x, s);
  }
  void sq_norm(Tensor out, Tensor x, Stream& s) override {
    opcheck::sq_norm(out, x);
    in_.sq_norm(out, x, s);
  }
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, const AdamWParams& p, Stream& s) override {
    opcheck::adamw(param, grad, m, v, copy, p);
    in_.adamw(param, grad, m, v, copy, p, s);
  }
  void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm,
                 Stream& s) override {
    opcheck::moe_route(probs, idx, weights, stats, logits);
    in_.moe_route(probs, idx, weights, stats, logits, renorm, s);
  }
  void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                          float aux_scale, Stream& s) override {
    opcheck::moe_route_backward(dlogits, dweights, probs, idx, counts);
    in_.moe_route_backward(dlogits, dweights, probs, idx, renorm, counts, aux_scale, s);
  }
  void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, Stream& s) override {
    opcheck::moe_permute(offsets, sorted_slot, slot_pos, idx);
    in_.moe_permute(offsets, sorted_slot, slot_pos, idx, s);
  }
  void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, Stream& s) override {
    opcheck::moe_gather(xs, x, sorted_slot, k);
    in_.moe_gather(xs, x, sorted_slot, k, s);
  }
  void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, Stream& s) override {
    opcheck::moe_gather_backward(dx, dxs, slot_pos, k);
    in_.moe_gather_backward(dx, dxs, slot_pos, k, s);
  }
  void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta,
                          Stream& s) override {
    opcheck::moe_grouped_matmul(out, a, w, offsets);
    in_.moe_grouped_matmul(out, a, w, offsets, trans_w, beta, s);
  }
  void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, Stream& s) override {
    opcheck::moe_grouped_matmul_wgrad(dw, dy, x, offsets);
    in_.moe_grouped_matmul_wgrad(dw, dy, x, offsets, s);
  }
  void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, Stream& s) override {
    opcheck::moe_combine(y, ys, weights, slot_pos);
    in_.moe_combine(y, ys, weights, slot_pos, s);
  }
  void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                            Stream& s) override {
    opcheck::moe_combine_backward(dys, dweights, dy, ys, weights, slot_pos);
    in_.moe_combine_backward(dys, dweights, dy, ys, weights, slot_pos, s);
  }
  void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, Stream& s) override {
    opcheck::moe_aux_loss(loss_sum, stats);
    in_.moe_aux_loss(loss_sum, stats, scale, s);
  }
  void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, Stream& s) override {
    opcheck::moe_expert_scale(out, w, idx, scale);
    in_.moe_expert_scale(out, w, idx, scale, s);
  }
  void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                                 Stream& s) override {
    opcheck::moe_expert_scale_backward(dw, dscale, dout, w, idx, scale);
    in_.moe_expert_scale_backward(dw, dscale, dout, w, idx, scale, s);
  }

 private:
  Ops& in_;
};

}  // namespace sf
