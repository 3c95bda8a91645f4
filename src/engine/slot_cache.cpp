#include "engine/slot_cache.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

namespace {
size_t round256(size_t b) { return (b + 255) / 256 * 256; }
}  // namespace

size_t SlotCache::bytes_for(int slots, int64_t max_blob, DType act, int64_t chunk) {
  const size_t slot = round256(size_t(max_blob) * dtype_size(act));
  const size_t staging = act == DType::F32 ? 0 : round256(size_t(std::min(chunk, max_blob)) * 4);
  return size_t(slots) * slot + staging;
}

SlotCache::SlotCache(Device& dev, int slots, int64_t max_blob, DType act, int64_t chunk, Stream& h2d, Stream& compute)
    : dev_(dev),
      act_(act),
      max_blob_(max_blob),
      chunk_(std::max<int64_t>(1, std::min(chunk, std::max<int64_t>(max_blob, 1)))),
      h2d_(h2d),
      compute_(compute) {
  mem_ = DeviceBuffer(dev, size_t(slots) * round256(size_t(max_blob) * dtype_size(act)));
  if (act != DType::F32 && max_blob > 0) staging_ = DeviceBuffer(dev, round256(size_t(chunk_) * 4));
  for (int k = 0; k < slots; ++k) {
    Slot s;
    s.ready = dev.create_event();
    s.released = dev.create_event();
    slots_.push_back(std::move(s));
  }
}

void* SlotCache::data(int slot) const {
  return static_cast<char*>(mem_.data()) + size_t(slot) * round256(size_t(max_blob_) * dtype_size(act_));
}

int SlotCache::acquire(int blob, const float* master, int64_t numel, Event& updated, bool use, int keep) {
  for (int k = 0; k < int(slots_.size()); ++k) {
    if (slots_[size_t(k)].blob != blob) continue;
    slots_[size_t(k)].last_use = ++clock_;
    if (use) dev_.wait(compute_, *slots_[size_t(k)].ready);
    return k;
  }
  int v = -1;
  for (int k = 0; k < int(slots_.size()); ++k) {
    if (k == keep) continue;
    if (v < 0 || slots_[size_t(k)].last_use < slots_[size_t(v)].last_use) v = k;
  }
  SF_CHECK(v >= 0, "no free parameter slot");
  SF_CHECK(numel <= max_blob_, "blob larger than a slot");
  Slot& s = slots_[size_t(v)];
  dev_.wait(h2d_, *s.released);
  dev_.wait(h2d_, updated);  // the master is final (an update may still run on the host)
  if (act_ == DType::F32) {
    dev_.copy(data(v), master, size_t(numel) * 4, CopyKind::HostToDevice, h2d_);
  } else {
    // Chunks through the staging buffer; the cast runs on the upload stream, so the next chunk's
    // copy is ordered after it (one staging buffer suffices).
    char* dst = static_cast<char*>(data(v));
    for (int64_t i = 0; i < numel; i += chunk_) {
      const int64_t n = std::min(chunk_, numel - i);
      dev_.copy(staging_.data(), master + i, size_t(n) * 4, CopyKind::HostToDevice, h2d_);
      dev_.ops().cast(Tensor(dst + size_t(i) * dtype_size(act_), act_, {n}), Tensor(staging_.data(), DType::F32, {n}),
                      h2d_);
    }
  }
  dev_.record(*s.ready, h2d_);
  ++uploads_;
  s.blob = blob;
  s.last_use = ++clock_;
  if (use) dev_.wait(compute_, *s.ready);
  return v;
}

void SlotCache::release(int slot) { dev_.record(*slots_[size_t(slot)].released, compute_); }

void SlotCache::invalidate() {
  for (Slot& s : slots_) s.blob = -1;
}

}  // namespace sf
