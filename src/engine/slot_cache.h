// The GPU parameter slots of the sliding engine (docs/ARCHITECTURE.md §2): which host blob is in which slot,
// least-recently-used replacement with lookahead, and the upload itself. Slots come in two sizes:
// one of the largest blob (the embedding or the untied head, often several layers' worth) and the
// others of the largest layer; a blob takes the least recently used slot of the smallest size
// that holds it, so layers leave the large slot to the embedding. A blob goes up as its
// fp32 master (page-locked host memory) in chunks through one fp32 staging buffer and is cast to
// the compute dtype on the GPU, on the upload stream: the host keeps no compute-dtype copy and does
// no conversion pass (PCIe carries 4 bytes a parameter instead of 2; measured in
// docs/PERFORMANCE.md).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "engine/buffers.h"
#include "engine/upload_source.h"

namespace sf {

// The slots' replacement policy alone, without memory or events: SlotCache's bookkeeping, and
// what the planner runs over a pass's schedule to count its uploads (SlidingEngine::pass_uploads).
class SlotTable {
 public:
  explicit SlotTable(const std::vector<int64_t>& capacity);
  // The slot holding `blob`, now the most recently used (-1: none holds it).
  int find(int blob);
  // The slot an upload of `numel` elements replaces: the least recently used of the smallest
  // capacity that holds it, other than `keep` (-1: none can).
  int victim(int64_t numel, int keep) const;
  // `slot` now holds `blob`, the most recently used.
  void assign(int slot, int blob);
  void clear();  // every slot's contents stale
  int size() const { return int(slots_.size()); }
  int64_t capacity(int slot) const { return slots_[size_t(slot)].capacity; }

 private:
  struct Entry {
    int64_t capacity = 0;
    int blob = -1;
    uint64_t last_use = 0;
  };
  std::vector<Entry> slots_;
  uint64_t clock_ = 0;
};

struct SlotCacheOptions {
  std::vector<int64_t> capacity;  // [slots] elements a slot (SlotCache::capacities)
  DType act = DType::F32;         // the slots' dtype (the compute copy)
  int64_t chunk = 1;              // elements an upload chunk (the fp32 staging below fp32)
};

class SlotCache {
 public:
  // Uploads on `h2d`, kernels read on `compute`.
  SlotCache(Device& dev, const SlotCacheOptions& o, Stream& h2d, Stream& compute);
  // The capacities for `slots` slots over host blobs of these sizes (0: not on the host).
  static std::vector<int64_t> capacities(int slots, const std::vector<int64_t>& blob_numel,
                                         const std::vector<bool>& is_layer);

  // The slot holding `blob` (uploaded from `master` [numel] F32 if it is not there yet, once
  // `gate` — the blob's last host update, the schedule's upload_gate — is done). The least recently used slot other than
  // `keep` is replaced once the compute stream has released it. With `use`, the compute stream
  // waits for the upload (without: a prefetch, skipped (-1) when no slot but `keep` could hold it).
  int acquire(int blob, const float* master, int64_t numel, Event& gate, bool use, int keep = -1) {
    return acquire(blob, UploadSource{master, DType::F32, 0, {}, {}}, numel, gate, use, keep);
  }
  // The same from any source (engine/upload_source.h: a working copy in the compute dtype goes up
  // as is; the NVMe tier's working copy in the store goes up a piece at a time, `begin` and `end`
  // around each piece's copy).
  int acquire(int blob, const UploadSource& src, int64_t numel, Event& gate, bool use, int keep = -1);
  void* data(int slot) const;
  // The compute stream's work queued so far is the last that reads the slot.
  void release(int slot);
  // Every slot's contents are stale (the parameters changed).
  void invalidate();

  int64_t uploads() const { return uploads_; }
  uint64_t uploaded_bytes() const { return uploaded_bytes_; }  // what the uploads copied from host memory
  size_t device_bytes() const;
  // What the constructor allocates: a "slot" per capacity, and the fp32 upload staging
  // ("slot.staging") when `act` is below fp32.
  static MemoryItems buffers(const SlotCacheOptions& o);

 private:
  struct Slot {
    DeviceBuffer mem;                 // [capacity] act
    std::unique_ptr<Event> ready;     // h2d: the upload into the slot is done
    std::unique_ptr<Event> released;  // compute: the last kernel reading the slot is done
  };
  Device& dev_;
  DType act_;
  int64_t chunk_;
  Stream& h2d_;
  Stream& compute_;
  DeviceBuffer staging_;  // [chunk] F32 (act != F32): a master chunk on its way to the cast
  std::vector<Slot> slots_;
  SlotTable table_;  // which blob each slot holds, and the replacement order
  int64_t uploads_ = 0;
  uint64_t uploaded_bytes_ = 0;
};

}  // namespace sf
