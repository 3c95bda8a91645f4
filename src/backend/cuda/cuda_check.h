// Private to the cuda backend: error checking for every CUDA / cuBLAS call, with file:line.
// Usable from host C++ (.cpp) and CUDA (.cu) files alike.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

namespace sf::cuda {

// Throws std::runtime_error("file:line: expr: what").
[[noreturn]] void fail(const char* file, int line, const char* expr, const std::string& what);

}  // namespace sf::cuda

#define CUDA_CHECK(expr)                                                                             \
  do {                                                                                               \
    cudaError_t sf_err_ = (expr);                                                                    \
    if (sf_err_ != cudaSuccess)                                                                      \
      ::sf::cuda::fail(__FILE__, __LINE__, #expr,                                                    \
                       std::string(cudaGetErrorName(sf_err_)) + ": " + cudaGetErrorString(sf_err_)); \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                               \
  do {                                                                                                   \
    cublasStatus_t sf_st_ = (expr);                                                                      \
    if (sf_st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
      ::sf::cuda::fail(__FILE__, __LINE__, #expr,                                                        \
                       std::string(cublasGetStatusName(sf_st_)) + ": " + cublasGetStatusString(sf_st_)); \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Argument checks of the kernel table (shape / dtype mismatches are programming errors).
#define SF_CUDA_REQUIRE(cond, msg)                                   \
  do {                                                               \
    if (!(cond)) ::sf::cuda::fail(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
