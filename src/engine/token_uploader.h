// Token ids, targets (and positions of packed rows) of successive micro-batches, uploaded on their own stream through
// double-buffered pinned staging, ordered by events: the upload of the next micro-batch overlaps
// the compute of this one, and no call waits on the compute stream.
#pragma once
#include <memory>
#include <vector>

#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/buffers.h"

namespace sf {

struct TokenUploaderOptions {
  int64_t max_tokens = 0;  // tokens of the largest batch
  // Staging/device buffer pairs used in turn (2: double buffering; the sliding engine keeps every
  // micro-batch of a step on the device, so it takes 2 x micro-batches).
  int slots = 2;
};

class TokenUploader {
 public:
  TokenUploader(Device& dev, const TokenUploaderOptions& o);
  struct Tokens {
    Tensor ids;      // [N] I32 on the device
    Tensor targets;  // [N] I32 on the device
    Tensor pos;      // [N] I32 on the device (Batch::pos of packed rows), empty when the batch has none
    int slot = -1;   // for done(slot, compute)
  };
  // Queues the batch's upload and makes `compute` wait for it. Call done(compute) after the
  // last operation that reads the returned tensors has been queued.
  Tokens upload(const Batch& b, Stream& compute);
  void done(Stream& compute);  // the last upload's slot
  void done(int slot, Stream& compute);
  void synchronize();                           // the upload stream is idle
  static constexpr size_t kBytesPerToken = 12;  // ids, targets, pos: I32 each
  // Its buffers (what the constructor allocates): per slot a device buffer and its pinned staging.
  static MemoryItems buffers(const TokenUploaderOptions& o);
  size_t device_bytes() const { return slots_.size() * size_t(max_tokens_) * kBytesPerToken; }
  size_t host_bytes() const { return slots_.size() * size_t(max_tokens_) * kBytesPerToken; }  // pinned staging

 private:
  struct Slot {
    DeviceBuffer host;                // [3, max N] I32 pinned: ids, targets, pos
    DeviceBuffer dev;                 // [3, max N] I32
    std::unique_ptr<Event> uploaded;  // recorded on the upload stream after the copy
    std::unique_ptr<Event> consumed;  // recorded on the compute stream after the last read
  };
  Device& dev_;
  int64_t max_tokens_;
  std::unique_ptr<Stream> h2d_;
  std::vector<Slot> slots_;
  int next_ = 0, current_ = -1;
};

}  // namespace sf
