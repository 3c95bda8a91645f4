// The GPU parameter slots of the sliding engine (DESIGN.md §3): which host blob is in which slot,
// least-recently-used replacement with lookahead, and the upload itself. A blob goes up as its
// fp32 master (page-locked host memory) in chunks through one fp32 staging buffer and is cast to
// the compute dtype on the GPU, on the upload stream: the host keeps no compute-dtype copy and does
// no conversion pass (PCIe carries 4 bytes a parameter instead of 2; measured in
// docs/PERFORMANCE.md).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"

namespace sf {

class SlotCache {
 public:
  // `slots` slots of `max_blob` elements in `act`; uploads on `h2d`, kernels read on `compute`.
  SlotCache(Device& dev, int slots, int64_t max_blob, DType act, int64_t chunk, Stream& h2d, Stream& compute);

  // The slot holding `blob` (uploaded from `master` [numel] F32 if it is not there yet, once
  // `updated` — the blob's last host update — is done). The least recently used slot other than
  // `keep` is replaced once the compute stream has released it. With `use`, the compute stream
  // waits for the upload (without: a prefetch).
  int acquire(int blob, const float* master, int64_t numel, Event& updated, bool use, int keep = -1);
  void* data(int slot) const;
  // The compute stream's work queued so far is the last that reads the slot.
  void release(int slot);
  // Every slot's contents are stale (the parameters changed).
  void invalidate();

  int64_t uploads() const { return uploads_; }
  size_t device_bytes() const { return mem_.size() + staging_.size(); }
  // What the constructor allocates (the planner's figure).
  static size_t bytes_for(int slots, int64_t max_blob, DType act, int64_t chunk);

 private:
  struct Slot {
    int blob = -1;
    uint64_t last_use = 0;
    std::unique_ptr<Event> ready;     // h2d: the upload into the slot is done
    std::unique_ptr<Event> released;  // compute: the last kernel reading the slot is done
  };
  Device& dev_;
  DType act_;
  int64_t max_blob_, chunk_;
  Stream& h2d_;
  Stream& compute_;
  DeviceBuffer mem_;      // [slots, max_blob] act
  DeviceBuffer staging_;  // [chunk] F32 (act != F32): a master chunk on its way to the cast
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  int64_t uploads_ = 0;
};

}  // namespace sf
