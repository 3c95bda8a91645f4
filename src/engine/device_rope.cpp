#include "engine/device_rope.h"

#include "core/error.h"
#include "model/rope.h"

namespace sf {

MemoryItems DeviceRope::buffers(const ModelSpec& spec, int max_T) {
  const size_t n = spec.has_local_rope() ? 4 : 2;  // cos, sin (+ the local layers' cos, sin)
  return {{"RoPE tables", n * size_t(max_T) * size_t(spec.head_dim / 2) * 4, Place::Device, "rope"}};
}

DeviceRope::DeviceRope(Device& dev, const ModelSpec& spec, int max_T, Stream& s) {
  std::vector<float> cos, sin;
  rope_tables(spec, max_T, cos, sin);
  const size_t table = cos.size() * 4;
  buf = BufferSource(dev, buffers(spec, max_T)).buffer("rope");
  std::vector<float> lcos, lsin;  // [max_T, head_dim/2] each (local layers only)
  if (spec.has_local_rope()) rope_tables_local(spec, max_T, lcos, lsin);
  SF_CHECK(buf.size() == (spec.has_local_rope() ? 4 : 2) * table, "RoPE tables of another size than listed");
  char* base = static_cast<char*>(buf.data());
  dev.copy(base, cos.data(), table, CopyKind::HostToDevice, s);
  dev.copy(base + table, sin.data(), table, CopyKind::HostToDevice, s);
  const int64_t half = spec.head_dim / 2;
  tables.cos = Tensor(base, DType::F32, {int64_t(max_T), half});
  tables.sin = Tensor(base + table, DType::F32, {int64_t(max_T), half});
  if (spec.has_local_rope()) {
    dev.copy(base + 2 * table, lcos.data(), table, CopyKind::HostToDevice, s);
    dev.copy(base + 3 * table, lsin.data(), table, CopyKind::HostToDevice, s);
    tables.cos_local = Tensor(base + 2 * table, DType::F32, {int64_t(max_T), half});
    tables.sin_local = Tensor(base + 3 * table, DType::F32, {int64_t(max_T), half});
  }
  dev.synchronize(s);  // the host tables go out of scope
}

}  // namespace sf
