#include "engine/slot_cache.h"

#include <algorithm>
#include <string>

#include "core/align.h"
#include "core/error.h"

namespace sf {

std::vector<int64_t> SlotCache::capacities(int slots, const std::vector<int64_t>& blob_numel,
                                           const std::vector<bool>& is_layer) {
  int64_t largest = 0, layer = 0;
  for (size_t b = 0; b < blob_numel.size(); ++b) {
    largest = std::max(largest, blob_numel[b]);
    if (is_layer[b]) layer = std::max(layer, blob_numel[b]);
  }
  // Blobs larger than a layer (embedding, untied head) are never needed at once (the tied head
  // blob is only the final norm), so one large slot holds them in turn.
  std::vector<int64_t> c(size_t(std::max(slots, 0)), layer > 0 ? layer : largest);
  if (!c.empty()) c[0] = largest;
  return c;
}

SlotTable::SlotTable(const std::vector<int64_t>& capacity) {
  for (int64_t c : capacity) slots_.push_back({c, -1, 0});
}

int SlotTable::find(int blob) {
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].blob == blob) {
      slots_[k].last_use = ++clock_;
      return int(k);
    }
  return -1;
}

int SlotTable::victim(int64_t numel, int keep) const {
  int v = -1;
  for (int k = 0; k < int(slots_.size()); ++k) {
    const Entry& s = slots_[size_t(k)];
    if (k == keep || s.capacity < numel) continue;
    if (v < 0 || s.capacity < slots_[size_t(v)].capacity ||
        (s.capacity == slots_[size_t(v)].capacity && s.last_use < slots_[size_t(v)].last_use))
      v = k;
  }
  return v;
}

void SlotTable::assign(int slot, int blob) {
  slots_[size_t(slot)].blob = blob;
  slots_[size_t(slot)].last_use = ++clock_;
}

void SlotTable::clear() {
  for (Entry& s : slots_) s.blob = -1;
}

namespace {
int64_t largest_of(const std::vector<int64_t>& capacity) {
  int64_t largest = 0;
  for (int64_t c : capacity) largest = std::max(largest, c);
  return largest;
}
}  // namespace

MemoryItems SlotCache::buffers(const SlotCacheOptions& o) {
  const std::vector<int64_t>& capacity = o.capacity;
  const DType act = o.act;
  const bool staging = act != DType::F32 && largest_of(capacity) > 0;
  const std::string name = "parameter slots (" + std::to_string(capacity.size()) +
                           ": one of the largest blob, the others of a layer)" +
                           (act != DType::F32 ? " + fp32 upload staging" : "");
  MemoryItems m;
  for (int64_t c : capacity) m.push_back({name, round256(size_t(c) * dtype_size(act)), Place::Device, "slot"});
  if (staging)
    m.push_back({name, round256(size_t(std::min(o.chunk, largest_of(capacity))) * 4), Place::Device, "slot.staging"});
  return m;
}

SlotCache::SlotCache(Device& dev, const SlotCacheOptions& o, Stream& h2d, Stream& compute)
    : dev_(dev), act_(o.act), h2d_(h2d), compute_(compute), table_(o.capacity) {
  chunk_ = std::max<int64_t>(1, std::min(o.chunk, std::max<int64_t>(largest_of(o.capacity), 1)));
  BufferSource src(dev, buffers(o));
  staging_ = src.buffer_if("slot.staging");
  for (size_t k = 0; k < o.capacity.size(); ++k) {
    Slot s;
    s.mem = src.buffer("slot");
    s.ready = dev.create_event();
    s.released = dev.create_event();
    slots_.push_back(std::move(s));
  }
}

size_t SlotCache::device_bytes() const {
  size_t n = staging_.size();
  for (const Slot& s : slots_) n += s.mem.size();
  return n;
}

void* SlotCache::data(int slot) const { return slots_[size_t(slot)].mem.data(); }

int SlotCache::acquire(int blob, const UploadSource& from, int64_t numel, Event& gate, bool use, int keep) {
  if (const int k = table_.find(blob); k >= 0) {
    if (use) dev_.wait(compute_, *slots_[size_t(k)].ready);
    return k;
  }
  const int v = table_.victim(numel, keep);
  if (v < 0 && !use) return -1;  // a prefetch that would evict the slot in use: later, on demand
  SF_CHECK(v >= 0, "no parameter slot can hold blob " + std::to_string(blob));
  Slot& s = slots_[size_t(v)];
  dev_.wait(h2d_, *s.released);
  dev_.wait(h2d_, gate);  // the master is final (an update may still run on the host)
  char* dst = static_cast<char*>(data(v));
  if (from.begin) {  // a working copy read in pieces: one copy a piece, as each lands in its buffer
    SF_CHECK(from.dtype == act_ && from.piece > 0 && from.end, "a source read in pieces is in the compute dtype");
    const size_t es = dtype_size(act_);
    for (int64_t i = 0; i < numel; i += from.piece) {
      const int64_t n = std::min(from.piece, numel - i);
      const void* piece = from.begin(h2d_, i, n);
      dev_.copy(dst + size_t(i) * es, piece, size_t(n) * es, CopyKind::HostToDevice, h2d_);
      uploaded_bytes_ += uint64_t(n) * es;
      from.end(h2d_);
    }
  } else if (from.dtype == act_) {  // the master in fp32, or a working copy in the compute dtype
    dev_.copy(dst, from.data, size_t(numel) * dtype_size(act_), CopyKind::HostToDevice, h2d_);
    uploaded_bytes_ += uint64_t(numel) * dtype_size(act_);
  } else {
    SF_CHECK(from.dtype == DType::F32, "an upload source is fp32 or the compute dtype");
    // Chunks through the staging buffer; the cast runs on the upload stream, so the next chunk's
    // copy is ordered after it (one staging buffer suffices).
    const float* master = static_cast<const float*>(from.data);
    for (int64_t i = 0; i < numel; i += chunk_) {
      const int64_t n = std::min(chunk_, numel - i);
      dev_.copy(staging_.data(), master + i, size_t(n) * 4, CopyKind::HostToDevice, h2d_);
      uploaded_bytes_ += uint64_t(n) * 4;
      dev_.ops().cast(Tensor(dst + size_t(i) * dtype_size(act_), act_, {n}), Tensor(staging_.data(), DType::F32, {n}),
                      h2d_);
    }
  }
  dev_.record(*s.ready, h2d_);
  ++uploads_;
  table_.assign(v, blob);
  if (use) dev_.wait(compute_, *s.ready);
  return v;
}

void SlotCache::release(int slot) { dev_.record(*slots_[size_t(slot)].released, compute_); }

void SlotCache::invalidate() { table_.clear(); }

}  // namespace sf
