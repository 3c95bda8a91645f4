// Level 4 of the NVMe tier (docs/ENGINE.md): blobs whose working copy (the parameters in the
// compute dtype, written by each update into the blob's region of the store, engine/state_stream.h)
// lives in the offload file. Each upload of such a blob reads the copy into one of `ring` pinned
// buffers on an I/O stream of its own, after the blob's last update has written it; h2d waits
// for the read and copies the buffer into the slot, which frees it for the read after next. The
// read is queued when the upload is (the slot cache prefetches one blob ahead), so it overlaps
// the compute of the blob before. Disk traffic: the copy is read for every upload, twice a step
// (forward and backward; layer-major micro-batches share them). The ring is registered with the
// store's io_uring where the kernel allows.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "engine/buffers.h"
#include "engine/state_stream.h"
#include "io/nvme_store.h"

namespace sf {

class WeightStream {
 public:
  // "disk.wring": `ring` pinned buffers of `max_bytes` (the largest working copy).
  static MemoryItems buffers(int ring, size_t max_bytes);
  WeightStream(Device& dev, NvmeStore& store, StateStream& state, int ring, size_t max_bytes, BufferSource& src);
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  // Queues the read of `blob`'s working copy (after `updated`, the blob's last host update, and
  // its write-back) into the next ring buffer; h2d waits for it. The buffer.
  const void* begin(int blob, Event& updated, Stream& h2d);
  // h2d has queued its copy out of the last begin's buffer.
  void end(Stream& h2d);
  size_t pinned_bytes() const { return mem_.size(); }

 private:
  char* slot(int i) const;
  Device& dev_;
  NvmeStore& store_;
  StateStream& state_;
  int ring_;
  size_t stride_;  // bytes of a ring buffer (aligned)
  std::unique_ptr<Stream> io_;
  DeviceBuffer mem_;                                  // [ring, stride_] pinned (+ alignment)
  RegisteredBuffer reg_;                              // the ring in the store's io_uring table (before mem_ goes)
  std::vector<std::unique_ptr<Event>> ready_, free_;  // io: read; h2d: copied out
  int next_ = 0, cur_ = -1;
};

}  // namespace sf
