#include "backend/device.h"
#include "core/error.h"

namespace sf {

#ifndef SF_HAVE_CUDA
bool cuda_available() { return false; }
std::unique_ptr<Device> make_cuda_device(size_t) {
  input_error("--device cuda", "this slideformer was built without CUDA (rebuild with -DSF_CUDA=ON)");
}
#endif

std::unique_ptr<Device> make_device(const std::string& which, size_t arena_bytes) {
  if (which == "cpu") return make_cpu_device();
  if (which == "cuda") return make_cuda_device(arena_bytes);
  if (which == "auto" || which.empty()) {
    if (cuda_available()) return make_cuda_device(arena_bytes);
    return make_cpu_device();
  }
  input_error("--device", "unknown device '" + which + "' (expected cpu, cuda or auto)");
}

}  // namespace sf
