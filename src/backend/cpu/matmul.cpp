// matmul: OpenBLAS sgemm on fp32 memory; BF16 operands go through fp32 copies.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <mutex>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {
namespace detail {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {
    // No products: C = beta * C, and beta == 0 must clear NaN garbage (BLAS semantics).
    for (int64_t i = 0; i < M; ++i) {
      float* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) c[j] = beta == 0.f ? 0.f : beta * c[j];
    }
    return;
  }
  SF_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
           "sgemm: dimension over the 32-bit BLAS limit");
  if (beta == 0.f) {
    // OpenBLAS already treats beta == 0 as "overwrite"; clear explicitly anyway so that NaN
    // garbage in C can never leak through whatever BLAS is linked (cost: one pass over C).
    for (int64_t i = 0; i < M; ++i) std::memset(C + i * ldc, 0, size_t(N) * 4);
  }
  // OpenBLAS runs single-threaded and our pool splits C into blocks: no oversubscription between
  // the two thread sets (many small products spent most of their time waking BLAS threads), and
  // the result does not depend on OpenBLAS's own thread count.
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int64_t parts = std::min<int64_t>(cpu_pool().size(), std::max<int64_t>(1, M * N * K / (int64_t(1) << 18)));
  if (parts <= 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
    return;
  }
  if (M >= N) {  // blocks of rows of C: rows of op(A)
    cpu_pool().parallel_for(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        int64_t i0 = M * p / parts, i1 = M * (p + 1) / parts;
        if (i1 == i0) continue;
        const float* Ab = trans_a ? A + i0 : A + i0 * lda;
        cblas_sgemm(CblasRowMajor, ta, tb, int(i1 - i0), int(N), int(K), alpha, Ab, int(lda), B, int(ldb), beta,
                    C + i0 * ldc, int(ldc));
      }
    });
  } else {  // blocks of columns of C: columns of op(B)
    cpu_pool().parallel_for(parts, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        int64_t j0 = N * p / parts, j1 = N * (p + 1) / parts;
        if (j1 == j0) continue;
        const float* Bb = trans_b ? B + j0 * ldb : B + j0;
        cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(j1 - j0), int(K), alpha, A, int(lda), Bb, int(ldb), beta, C + j0,
                    int(ldc));
      }
    });
  }
}

}  // namespace detail

using namespace detail;

void matmul(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta) {
  // Every tensor is seen as a matrix [rows, cols]. op(a) [M,K], op(b) [K,N], out [M,N] (shapes and
  // no aliasing: ops_check.h).
  const int64_t M = out.rows(), N = out.cols();
  const int64_t K = trans_a ? a.rows() : a.cols();

  const float* af = as_f32(a, 0);  // [a.rows, a.cols]
  const float* bf = as_f32(b, 1);  // [b.rows, b.cols]
  if (out.dtype == DType::F32) {
    sgemm(trans_a, trans_b, M, N, K, alpha, af, a.cols(), bf, b.cols(), beta, out.ptr<float>(), N);
    return;
  }
  // BF16 out: the fp32 result is rounded once. beta != 0 needs the old values in fp32.
  float* of = scratch(2, size_t(M * N));  // [M, N]
  if (beta != 0.f) load(out, 0, M * N, of);
  sgemm(trans_a, trans_b, M, N, K, alpha, af, a.cols(), bf, b.cols(), beta, of, N);
  store(out, 0, M * N, of);
}

void matmul_add(Tensor out, Tensor a, Tensor b, bool trans_a, bool trans_b, Tensor c) {
  if (c.data == out.data) return matmul(out, a, b, trans_a, trans_b, 1.f, 1.f);
  matmul(out, a, b, trans_a, trans_b, 1.f, 0.f);
  add(out, out, c);
}

}  // namespace sf::cpu
