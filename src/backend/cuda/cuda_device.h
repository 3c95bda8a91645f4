// The cuda backend's Device (backend/device.h): one cudaMalloc'd arena sub-allocated first-fit
// (256-byte alignment), non-blocking streams, timing-free events, pinned host memory, and the
// kernel table implemented by the launchers in this folder.
#pragma once
#include "backend/device.h"

namespace sf {

// arena_bytes 0: default_gpu_budget (backend/device.h) of the free device memory at start-up.
// ordinal: the GPU (cudaSetDevice's number); an InputError when there is no such GPU.
std::unique_ptr<Device> make_cuda_device(size_t arena_bytes, int ordinal);  // default ordinal: device.h
bool cuda_available();

namespace cuda {
// Bytes of arena each stream takes the first time it runs a kernel that needs scratch
// (cuBLASLt workspace + reduction partials). Copy-only streams take none.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kKernelScratchBytes = size_t(32) << 20;

// The cudaStream_t behind a Stream of a cuda Device (for benchmarks and interop), as void*.
void* native_stream(Stream& s);
}  // namespace cuda

}  // namespace sf
