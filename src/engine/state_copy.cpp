#include "engine/state_copy.h"

#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace sf {

void check_state_part(const BlobEntry& e, int64_t first, int64_t count) {
  SF_CHECK(first >= 0 && count >= 0 && first <= e.numel && count <= e.numel - first,
           "state part [" + std::to_string(first) + ", +" + std::to_string(count) + ") outside " + e.name + "'s " +
               std::to_string(e.numel) + " elements");
}

void state_to_f32(Device& dev, Stream& s, const void* src, DType t, int64_t n, float* dst) {
  std::vector<char> tmp(t == DType::F32 ? 0 : size_t(n) * dtype_size(t));  // [n] t, staged
  dev.copy(tmp.empty() ? static_cast<void*>(dst) : tmp.data(), src, size_t(n) * dtype_size(t), CopyKind::DeviceToHost,
           s);
  dev.synchronize(s);
  if (!tmp.empty()) cpu::cast(Tensor(dst, DType::F32, {n}), Tensor(tmp.data(), t, {n}));
}

void state_from_f32(Device& dev, Stream& s, void* dst, DType t, int64_t n, const float* src) {
  std::vector<char> tmp(t == DType::F32 ? 0 : size_t(n) * dtype_size(t));  // [n] t, staged
  if (!tmp.empty()) cpu::cast(Tensor(tmp.data(), t, {n}), Tensor(const_cast<float*>(src), DType::F32, {n}));
  dev.copy(dst, tmp.empty() ? static_cast<const void*>(src) : tmp.data(), size_t(n) * dtype_size(t),
           CopyKind::HostToDevice, s);
  dev.synchronize(s);
}

}  // namespace sf
