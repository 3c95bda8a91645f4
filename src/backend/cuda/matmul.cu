#include <algorithm>

#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/matmul.cuh"

namespace sf::cuda {
namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    default:
      break;
  }
  internal_error(__FILE__, __LINE__, std::string("matmul: the cuda backend does not support the dtype ") + dt_name(t));
}

int64_t ptr_align(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && (u % uint64_t(a)) != 0) a >>= 1;
  return a;
}

// The plan cache's key of g's operands with the sizes M, N, K:
// M N K ta tb lda ldb ldo at bt ot align_a align_b align_out (beta != 0) workspace: an algorithm
// picked for a workspace needs it (the MoE GEMMs run on slices of a stream's).
LtCache::Key plan_key(const Gemm& g, int64_t M, int64_t N, int64_t K, size_t workspace_bytes) {
  const void* c = g.c ? g.c : g.out;
  return LtCache::Key{M,
                      N,
                      K,
                      g.ta,
                      g.tb,
                      g.lda,
                      g.ldb,
                      g.ldo,
                      int64_t(g.at),
                      int64_t(g.bt),
                      int64_t(g.ot),
                      ptr_align(g.a),
                      ptr_align(g.b),
                      std::min(ptr_align(g.out), ptr_align(c)),  // C and D share one layout and alignment
                      0,
                      int64_t(workspace_bytes)};
}

}  // namespace

LtCache::LtCache() : lt_(cublaslt()) { CUBLAS_CHECK(lt_.cublasLtCreate(&handle_)); }

LtCache::~LtCache() {
  for (auto& [k, p] : plans_) {
    lt_.cublasLtMatrixLayoutDestroy(p.la);
    lt_.cublasLtMatrixLayoutDestroy(p.lb);
    lt_.cublasLtMatrixLayoutDestroy(p.lc);
    lt_.cublasLtMatmulDescDestroy(p.desc);
  }
  if (handle_) lt_.cublasLtDestroy(handle_);
}

// key: plan_key (above).
const LtCache::Plan& LtCache::plan(const Key& key, size_t workspace_bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  const int64_t M = key[0], N = key[1], K = key[2];
  const bool ta = key[3] != 0, tb = key[4] != 0;
  const int64_t lda = key[5], ldb = key[6], ldo = key[7];
  const DType at = DType(key[8]), bt = DType(key[9]), ot = DType(key[10]);
  const bool all_f32 = at == DType::F32 && bt == DType::F32 && ot == DType::F32;

  Plan p;
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // fp32 accumulate; never TF32
  CUBLAS_CHECK(lt_.cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  // cuBLASLt A = our b, cuBLASLt B = our a (see matmul.cuh).
  const cublasOperation_t opA = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(lt_.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
  CUBLAS_CHECK(lt_.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
  // Stored (column-major) shapes: A = b^T: [N,K] (ld ldb) or, when tb, [K,N]; B = a^T: [K,M] or [M,K].
  CUBLAS_CHECK(lt_.cublasLtMatrixLayoutCreate(&p.la, lt_type(bt), tb ? K : N, tb ? N : K, ldb));
  CUBLAS_CHECK(lt_.cublasLtMatrixLayoutCreate(&p.lb, lt_type(at), ta ? M : K, ta ? K : M, lda));
  CUBLAS_CHECK(lt_.cublasLtMatrixLayoutCreate(&p.lc, lt_type(ot), N, M, ldo));
  (void)all_f32;

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(lt_.cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(lt_.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &workspace_bytes, sizeof(workspace_bytes)));
  const uint32_t al_a = uint32_t(key[12]), al_b = uint32_t(key[11]), al_c = uint32_t(key[13]);
  CUBLAS_CHECK(
      lt_.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  CUBLAS_CHECK(
      lt_.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  CUBLAS_CHECK(
      lt_.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  CUBLAS_CHECK(
      lt_.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      lt_.cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &found);
  lt_.cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    lt_.cublasLtMatrixLayoutDestroy(p.la);
    lt_.cublasLtMatrixLayoutDestroy(p.lb);
    lt_.cublasLtMatrixLayoutDestroy(p.lc);
    lt_.cublasLtMatmulDescDestroy(p.desc);
    fail(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic",
         "no cuBLASLt algorithm for M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
             " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " a=" + dt_name(at) + " b=" + dt_name(bt) +
             " out=" + dt_name(ot) + " (" + lt_.cublasLtGetStatusString(st) + ")");
  }
  p.algo = res.algo;
  return plans_.emplace(key, p).first->second;
}

void check_gemm_dtypes(const char* op, DType a, DType b, DType out) {
  const bool bf_in = a == DType::BF16 && b == DType::BF16 && (out == DType::BF16 || out == DType::F32);
  const bool f32 = a == DType::F32 && b == DType::F32 && out == DType::F32;
  SF_CHECK(bf_in || f32, std::string(op) + ": the cuda backend does not support the dtypes a=" + dt_name(a) +
                             " b=" + dt_name(b) + " out=" + dt_name(out) +
                             " (supported: BF16,BF16->BF16|F32 and F32,F32->F32)");
}

void gemm(const Gemm& g, const Launch& L) {
  SF_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "cuda gemm: negative size");
  if (g.M == 0 || g.N == 0) return;
  check_gemm_dtypes("matmul", g.at, g.bt, g.ot);
  const void* c = g.c ? g.c : g.out;
  if (g.K == 0) {  // out = beta * C
    Tensor o(g.out, g.ot, {g.M, g.ldo});
    SF_CHECK(g.ldo == g.N, "cuda gemm: K == 0 with a padded out is not supported");
    if (c != g.out) {
      SF_CHECK(g.beta == 1.f, "cuda gemm: K == 0 with a separate C needs beta 1");
      cast(o, Tensor(const_cast<void*>(c), g.ot, {g.M, g.ldo}), L);  // same dtype: a copy
      return;
    }
    if (g.beta == 0.f)
      zero(o, L);
    else if (g.beta != 1.f)
      scale(o, g.beta, L);
    return;
  }
  const LtCache::Plan& p = L.lt->plan(plan_key(g, g.M, g.N, g.K, L.scratch->lt_bytes), L.scratch->lt_bytes);
  CUBLAS_CHECK(L.lt->lib().cublasLtMatmul(L.lt->handle(), p.desc, &g.alpha, g.b, p.la, g.a, p.lb, &g.beta, c, p.lc,
                                          g.out, p.lc, &p.algo, L.scratch->lt_ws, L.scratch->lt_bytes, L.stream));
}

bool gemm_planned_as(const Gemm& g, int64_t M_plan, int64_t N_plan, int64_t K_plan, const Launch& L) {
  if (g.M == 0 || g.N == 0 || g.K == 0) return false;
  if (g.c && g.c != g.out) return false;
  const LtCache::Plan& p = L.lt->plan(plan_key(g, M_plan, N_plan, K_plan, L.scratch->lt_bytes), L.scratch->lt_bytes);
  // The plan's descriptor and algorithm with layouts of the real sizes (on the stack: no allocation).
  cublasLtMatrixLayoutOpaque_t la, lb, lc;
  CUBLAS_CHECK(L.lt->lib().layout_init(&la, lt_type(g.bt), g.tb ? g.K : g.N, g.tb ? g.N : g.K, g.ldb));
  CUBLAS_CHECK(L.lt->lib().layout_init(&lb, lt_type(g.at), g.ta ? g.M : g.K, g.ta ? g.K : g.M, g.lda));
  CUBLAS_CHECK(L.lt->lib().layout_init(&lc, lt_type(g.ot), g.N, g.M, g.ldo));
  const cublasStatus_t st =
      L.lt->lib().cublasLtMatmul(L.lt->handle(), p.desc, &g.alpha, g.b, &la, g.a, &lb, &g.beta, g.out, &lc, g.out, &lc,
                                 &p.algo, L.scratch->lt_ws, L.scratch->lt_bytes, L.stream);
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  // The algorithm does not take these sizes: checked before anything is launched.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) return false;
  CUBLAS_CHECK(st);
  return false;
}

void matmul(Tensor out, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, const Launch& L) {
  const int64_t M = out.rows(), N = out.cols();
  const int64_t K = ta ? a.rows() : a.cols();  // shapes agree (ops_check.h)
  gemm(Gemm{out.data, out.dtype, N, a.data, a.dtype, a.cols(), b.data, b.dtype, b.cols(), M, N, K, ta, tb, alpha, beta},
       L);
}

void matmul_add(Tensor out, Tensor a, Tensor b, bool ta, bool tb, Tensor c, const Launch& L) {
  const int64_t M = out.rows(), N = out.cols();
  const int64_t K = ta ? a.rows() : a.cols();
  Gemm g{out.data, out.dtype, N, a.data, a.dtype, a.cols(), b.data, b.dtype, b.cols(), M, N, K, ta, tb, 1.f, 1.f};
  g.c = c.data;
  gemm(g, L);
}

}  // namespace sf::cuda
