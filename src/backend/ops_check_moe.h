// The preconditions of the mixture-of-experts operations of the kernel table (ops.h), in the
// style of ops_check.h (which includes this file after its helpers).
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace sf::opcheck {

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

inline void moe_aux_loss(const Tensor& loss_sum, const Tensor& stats) {
  constexpr const char* op = "moe_aux_loss";
  SF_CHECK_DTYPE(op, loss_sum, DType::F32);
  SF_CHECK_NUMEL(op, loss_sum, 1, "");
  SF_CHECK_DTYPE(op, stats, DType::F32);
  SF_CHECK(stats.numel() >= 2 && stats.numel() % 2 == 0, bad_shape(op, "stats", stats, "[2, E]"));
}

}  // namespace sf::opcheck
