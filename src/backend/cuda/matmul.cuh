// GEMM through cuBLASLt. Row-major semantics of ops.h mapped onto column-major cuBLASLt:
// a row-major X [r, c] with leading dim ld is the column-major X^T [c, r], so
//   out[M,N] = op(a) @ op(b)   <=>   out^T[N,M] = op(b)^T @ op(a)^T   (column-major),
// i.e. cuBLASLt's "A" is b (m = N) and its "B" is a (n = M), with the transposes kept.
// Descriptors, layouts and the heuristic's algorithm are cached per shape/dtype/alignment, so the
// hot path does one map lookup and cublasLtMatmul.
#pragma once
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>

#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/launch.h"

namespace sf::cuda {

class LtCache {
 public:
  LtCache();
  ~LtCache();
  LtCache(const LtCache&) = delete;
  LtCache& operator=(const LtCache&) = delete;
  cublasLtHandle_t handle() const { return handle_; }
  const CublasLt& lib() const { return lt_; }

  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::array<int64_t, 16>;
  // Finds or builds the plan (the heuristic query happens once per key).
  const Plan& plan(const Key& key, size_t workspace_bytes);

 private:
  const CublasLt& lt_;  // loaded by the first LtCache (cublaslt_library.h)
  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<Key, Plan> plans_;
};

// Row-major GEMM with explicit leading dimensions (in elements):
// out [M,N] (ldo) = alpha * op(a) @ op(b) + beta * out; a stored [M,K] (or [K,M] when ta) with lda,
// b stored [K,N] (or [N,K] when tb) with ldb. Supported dtypes: a, b BF16 with out BF16 or F32;
// a, b, out F32 (true fp32: CUBLAS_COMPUTE_32F, no TF32). fp32 accumulation always.
struct Gemm {
  void* out;
  DType ot;
  int64_t ldo;
  const void* a;
  DType at;
  int64_t lda;
  const void* b;
  DType bt;
  int64_t ldb;
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  const void* c = nullptr;  // C of alpha * op(a) @ op(b) + beta * C, out's dtype and ldo; nullptr: out
};
void gemm(const Gemm& g, const Launch& L);
// Refuses (op named in the message) the dtypes gemm does not take.
void check_gemm_dtypes(const char* op, DType a, DType b, DType out);
// g (with C = out) on the algorithm cuBLASLt's heuristic picked for the sizes M_plan, N_plan,
// K_plan and g's other parameters: one plan serves a range of sizes (the MoE grouped GEMMs' row
// counts change every step; a plan per count would grow without bound). False, with nothing
// launched, when that algorithm does not take g's sizes (then gemm(g) does).
bool gemm_planned_as(const Gemm& g, int64_t M_plan, int64_t N_plan, int64_t K_plan, const Launch& L);

// ops.h matmul on tensors (shapes checked).
void matmul(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, const Launch& L);
// ops.h matmul_add: c enters cuBLASLt's epilogue as C (beta 1), out is D.
void matmul_add(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, Tensor c, const Launch& L);

}  // namespace sf::cuda
