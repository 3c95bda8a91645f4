// cuBLASLt, loaded on first use instead of linked: the library's initialisers cost ~0.3 s in every
// process that links it (measured: an empty program linked to libcublasLt.so.13 takes 0.32 s, to
// libcudart 0.00 s), so every CLI run paid it, CPU-only runs and the test suite's ~1,000 processes too.
// The CUDA backend's first GEMM plan cache (LtCache) loads it; nothing else needs it.
#pragma once
#include <cublasLt.h>

namespace sf::cuda {

// The functions the backend calls, each a member of the same name and type as the library's.
#define SF_CUBLASLT_FUNCTIONS(X)          \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetStatusName)                \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutInit_internal)

struct CublasLt {
#define SF_CUBLASLT_MEMBER(f) decltype(&::f) f = nullptr;
  SF_CUBLASLT_FUNCTIONS(SF_CUBLASLT_MEMBER)
#undef SF_CUBLASLT_MEMBER
  // cublasLt.h's cublasLtMatrixLayoutInit is an inline wrapper of the _internal entry point.
  cublasStatus_t layout_init(cublasLtMatrixLayout_t l, cudaDataType type, uint64_t rows, uint64_t cols,
                             int64_t ld) const {
    return cublasLtMatrixLayoutInit_internal(l, sizeof(*l), type, rows, cols, ld);
  }
};

// The process's table, loaded on the first call (thread-safe). The library stays loaded until the
// process exits: a library with CUDA modules is not safely unloadable while the runtime lives.
// Throws std::runtime_error naming the library when it or one of its functions is missing.
const CublasLt& cublaslt();

}  // namespace sf::cuda
