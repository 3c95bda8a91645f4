#include "backend/cpu/kernels.h"
#include "backend/cuda/workspace_sizes.h"
#include "backend/device.h"
#include "core/error.h"

namespace sf {

#ifndef SF_HAVE_CUDA
bool cuda_available() { return false; }
std::unique_ptr<Device> make_cuda_device(size_t, int) {
  setting_error(Setting::Device, {Setting::Device, " cuda"},
                "this slideformer was built without CUDA (rebuild with -DSF_CUDA=ON)");
}
void cuda_device_memory(int, size_t&, size_t&) {
  setting_error(Setting::Device, {Setting::Device, " cuda"},
                "this slideformer was built without CUDA (rebuild with -DSF_CUDA=ON)");
}
#else
void cuda_device_memory(int ordinal, size_t& free_bytes, size_t& total_bytes);  // backend/cuda/cuda_device.cpp
#endif

BackendInfo cuda_backend_sizes() {
  BackendInfo b;
  b.kind = DeviceKind::Cuda;
  b.compute_dtype = DType::BF16;
  b.stream_scratch = cuda::kLtWorkspaceBytes + cuda::kKernelScratchBytes;
  b.attention_ws = cuda::attention_workspace_bytes;
  b.linear_ce_ws = cuda::linear_ce_workspace_bytes;
  return b;
}

BackendInfo backend_info(const std::string& which, int ordinal) {
  if (which == "cuda" || ((which == "auto" || which.empty()) && cuda_available())) {
    BackendInfo b = cuda_backend_sizes();
    cuda_device_memory(ordinal, b.device_free, b.device_total);
    return b;
  }
  if (which == "cpu" || which == "auto" || which.empty()) {
    BackendInfo b;
    b.kind = DeviceKind::Cpu;
    b.compute_dtype = DType::F32;
    b.attention_ws = cpu::attention_workspace_bytes;
    b.linear_ce_ws = cpu::linear_ce_workspace_bytes;
    return b;
  }
  setting_error(Setting::Device, "unknown device '" + which + "' (expected cpu, cuda or auto)");
}

std::unique_ptr<Device> make_device(const std::string& which, size_t arena_bytes, int ordinal) {
  if (which == "cpu") return make_cpu_device();
  if (which == "cuda") return make_cuda_device(arena_bytes, ordinal);
  if (which == "auto" || which.empty()) {
    if (cuda_available()) return make_cuda_device(arena_bytes, ordinal);
    return make_cpu_device();
  }
  setting_error(Setting::Device, "unknown device '" + which + "' (expected cpu, cuda or auto)");
}

}  // namespace sf
