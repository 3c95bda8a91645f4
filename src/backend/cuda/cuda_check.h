// Private to the cuda backend: status checking for every CUDA / cuBLAS call, with file:line.
// Usable from host C++ (.cpp) and CUDA (.cu) files alike.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/cublaslt_library.h"
#include "core/error.h"

namespace sf::cuda {

// Throws std::runtime_error("file:line: expr: what").
[[noreturn]] void fail(const char* file, int line, const char* expr, const std::string& what);

}  // namespace sf::cuda

// One status check: `expr` gives a status of type `type`; anything but `ok` fails with the status's
// name and description (`name_fn`, `string_fn`).
#define SF_API_CHECK(expr, type, ok, name_fn, string_fn)                                                            \
  do {                                                                                                              \
    type sf_status_ = (expr);                                                                                       \
    if (sf_status_ != (ok))                                                                                         \
      ::sf::cuda::fail(__FILE__, __LINE__, #expr, std::string(name_fn(sf_status_)) + ": " + string_fn(sf_status_)); \
  } while (0)

#define CUDA_CHECK(expr) SF_API_CHECK(expr, cudaError_t, cudaSuccess, cudaGetErrorName, cudaGetErrorString)
#define CUBLAS_CHECK(expr)                                                                                \
  SF_API_CHECK(expr, cublasStatus_t, CUBLAS_STATUS_SUCCESS, ::sf::cuda::cublaslt().cublasLtGetStatusName, \
               ::sf::cuda::cublaslt().cublasLtGetStatusString)

// After every kernel launch: launch-configuration errors surface here, at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Argument checks are not here: the front of the kernel table (backend/ops_check.h) checks what
// ops.h documents, and the kernels check their own limits with SF_CHECK (core/error.h).
