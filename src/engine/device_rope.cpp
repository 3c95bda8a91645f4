#include "engine/device_rope.h"

#include "core/error.h"
#include "model/rope.h"

namespace sf {

namespace {
// Bytes of one global / one local table [max_T, head dim / 2] F32 (Gemma 4's differ in width).
size_t table_bytes(const ModelSpec& spec, int max_T) { return size_t(max_T) * size_t(rope_head_dim(spec) / 2) * 4; }
size_t local_table_bytes(const ModelSpec& spec, int max_T) {
  return spec.has_local_rope() ? size_t(max_T) * size_t(spec.head_dim / 2) * 4 : 0;
}
}  // namespace

MemoryItems DeviceRope::buffers(const ModelSpec& spec, int max_T) {
  // cos, sin (+ the local layers' cos, sin)
  return {{"RoPE tables", 2 * table_bytes(spec, max_T) + 2 * local_table_bytes(spec, max_T), Place::Device, "rope"}};
}

DeviceRope::DeviceRope(Device& dev, const ModelSpec& spec, int max_T, Stream& s) {
  std::vector<float> cos, sin;
  rope_tables(spec, max_T, cos, sin);
  const size_t table = cos.size() * 4, ltable = local_table_bytes(spec, max_T);
  buf = BufferSource(dev, buffers(spec, max_T)).buffer("rope");
  std::vector<float> lcos, lsin;  // [max_T, head_dim/2] each (local layers only)
  if (spec.has_local_rope()) rope_tables_local(spec, max_T, lcos, lsin);
  SF_CHECK(table == table_bytes(spec, max_T) && lcos.size() * 4 == ltable && buf.size() == 2 * table + 2 * ltable,
           "RoPE tables of another size than listed");
  char* base = static_cast<char*>(buf.data());
  dev.copy(base, cos.data(), table, CopyKind::HostToDevice, s);
  dev.copy(base + table, sin.data(), table, CopyKind::HostToDevice, s);
  const int64_t half = rope_head_dim(spec) / 2, lhalf = spec.head_dim / 2;
  tables.cos = Tensor(base, DType::F32, {int64_t(max_T), half});
  tables.sin = Tensor(base + table, DType::F32, {int64_t(max_T), half});
  if (spec.has_local_rope()) {
    dev.copy(base + 2 * table, lcos.data(), ltable, CopyKind::HostToDevice, s);
    dev.copy(base + 2 * table + ltable, lsin.data(), ltable, CopyKind::HostToDevice, s);
    tables.cos_local = Tensor(base + 2 * table, DType::F32, {int64_t(max_T), lhalf});
    tables.sin_local = Tensor(base + 2 * table + ltable, DType::F32, {int64_t(max_T), lhalf});
  }
  dev.synchronize(s);  // the host tables go out of scope
}

}  // namespace sf
