// Private to the cuda backend: what every launcher gets besides its tensors.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/tensor.h"

namespace sf::cuda {

class LtCache;        // matmul.cuh
class MoeOffsets;     // moe_gemm.cuh
class ExpertStreams;  // moe_gemm.cuh

// Per-stream scratch, carved from the arena once (the first time a stream runs a kernel that
// needs it). Two kernels on different streams never share scratch.
struct Scratch {
  void* lt_ws = nullptr;  // cuBLASLt workspace
  size_t lt_bytes = 0;
  void* buf = nullptr;  // small kernel scratch (reduction partials)
  size_t buf_bytes = 0;
};

struct Launch {
  cudaStream_t stream = nullptr;
  const Scratch* scratch = nullptr;
  LtCache* lt = nullptr;
  MoeOffsets* moe = nullptr;             // host copies of MoE expert offsets (the device's one cache)
  ExpertStreams* moe_streams = nullptr;  // streams the MoE experts' GEMMs spread over
  int num_sms = 132;
};

inline const char* dt_name(DType t) { return dtype_name(t); }  // core's spelling

inline bool is_float_dt(DType t) { return t == DType::F32 || t == DType::BF16; }

}  // namespace sf::cuda
