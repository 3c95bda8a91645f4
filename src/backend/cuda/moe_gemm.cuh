// The MoE grouped GEMMs (moe.cuh declares them) on cuBLASLt: one GEMM per expert with its real row
// count, read from a host copy of the expert offsets. ops.h's contract is unchanged (offsets live on the device); the
// host copy is taken once per routing: moe_permute's scan kernel writes it beside the offsets
// (publish), the first grouped GEMM on those offsets waits for that kernel's event (one host wait
// per routing, on that event alone), and every later GEMM on the same offsets tensor (the layer's
// forward, its backward) reuses it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda/launch.h"

namespace sf::cuda {

// Host copies of expert offsets [E+1] that moe_permute wrote, keyed by the device pointer. A copy
// is valid from its publish until the next publish to that pointer, or until the memory is freed
// or written by a device copy (CudaDevice calls forget). Offsets written any other way (uploaded,
// a test's) are never published: each GEMM on them reads them afresh (a copy and a wait each).
class MoeOffsets {
 public:
  MoeOffsets() = default;
  ~MoeOffsets();
  MoeOffsets(const MoeOffsets&) = delete;
  MoeOffsets& operator=(const MoeOffsets&) = delete;

  // write(mirror) launches on `s` the kernel that writes `offsets` [E+1] and the same values to
  // `mirror` (pinned host memory mapped for the device: plain stores over PCIe, so the copy does
  // not queue behind the copy engines' bulk transfers, the offload's); then the event is recorded.
  void publish(const Tensor& offsets, cudaStream_t s, const std::function<void(int32_t* mirror)>& write);
  // offsets as the stream `s` sees them at this point, into `out` (E+1 values): the published copy
  // (the host waits for its event the first time only), else a fresh copy on `s` and a wait.
  void read(const Tensor& offsets, cudaStream_t s, std::vector<int32_t>& out);
  // The device range [p, p + bytes) was freed or overwritten: its published copies are dropped.
  void forget(const void* p, size_t bytes);

 private:
  struct Copy {
    int32_t* host = nullptr;  // [cap] pinned, mapped
    int32_t* dev = nullptr;   // the same memory as the device addresses it
    int64_t cap = 0;
    int64_t n = 0;  // E + 1 values of the copy
    cudaEvent_t done = nullptr;
    bool waited = false;  // the host saw `done` complete
  };
  Copy take(int64_t n);  // a pinned buffer of >= n values whose last copy has completed

  std::mutex mu_;
  std::unordered_map<const void*, Copy> live_;
  std::vector<Copy> spare_;
  Copy fresh_;  // the buffer of fresh reads
};

// Streams the experts' GEMMs spread over (expert j of those with rows on stream j mod n), forked
// from the caller's stream and joined back to it by events: small experts (Qwen3-30B-A3B's are
// ~1024 x 768 outputs, a third of the H200's SMs in 128 x 128 tiles) run side by side, and one
// expert's last wave overlaps the next. Each stream takes a slice of the caller's cuBLASLt
// workspace: the caller's stream waits for the join, so it uses none of it meanwhile. One stream
// or four, every GEMM runs on a quarter of the workspace: the same algorithms, the same bits.
class ExpertStreams {
 public:
  static constexpr int kStreams = 4;
  ExpertStreams() = default;
  ~ExpertStreams();
  ExpertStreams(const ExpertStreams&) = delete;
  ExpertStreams& operator=(const ExpertStreams&) = delete;

  // One grouped GEMM's fork .. join (RAII: the join also on an exception); at most one at a time.
  class Lanes {
   public:
    Lanes(ExpertStreams* owner, const Launch& L, int n);  // n <= 1: everything on L's stream
    ~Lanes();
    Lanes(const Lanes&) = delete;
    Lanes& operator=(const Lanes&) = delete;
    const Launch& next();  // the launch of the next expert's GEMM

   private:
    ExpertStreams* o_ = nullptr;
    std::unique_lock<std::mutex> lk_;
    Launch base_;
    int n_ = 1, i_ = 0;
    Launch lanes_[kStreams];
    Scratch slices_[kStreams];
  };

 private:
  std::mutex mu_;
  cudaStream_t s_[kStreams] = {};
  cudaEvent_t fork_ = nullptr, join_[kStreams] = {};
};

}  // namespace sf::cuda
