#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "core/error.h"

namespace sf {

#ifndef SF_HAVE_CUDA
bool cuda_available() { return false; }
std::unique_ptr<Device> make_cuda_device(size_t, int) {
  setting_error(Setting::Device, {Setting::Device, " cuda"},
                "this slideformer was built without CUDA (rebuild with -DSF_CUDA=ON)");
}
BackendInfo cuda_backend_info(int) {
  setting_error(Setting::Device, {Setting::Device, " cuda"},
                "this slideformer was built without CUDA (rebuild with -DSF_CUDA=ON)");
}
#else
BackendInfo cuda_backend_info(int ordinal);  // backend/cuda/cuda_device.cpp
#endif

BackendInfo backend_info(const std::string& which, int ordinal) {
  if (which == "cuda" || ((which == "auto" || which.empty()) && cuda_available())) return cuda_backend_info(ordinal);
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
