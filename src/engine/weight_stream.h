// Level 5 of the NVMe tier (docs/ENGINE.md): blobs whose working copy (the parameters in the
// compute dtype, written by each update into the blob's region of the store, engine/state_stream.h)
// lives in the offload file. Each upload of such a blob reads the copy a piece at a time into a
// small ring of pinned buffers, on an I/O stream of its own, after the blob's last update has
// written it; the upload is one host-to-device copy a piece, each waiting on h2d for its piece's
// read, and the read of a buffer's next piece waits for the copy that empties it. So the ring holds
// `ring` pieces, not blobs (at 123B a layer's working copy is 2.8 GB, a piece of 32 Mi elements
// 64 MiB), and the disk, PCIe and the GPU overlap within one upload. The reads are queued when
// the upload is (the slot cache prefetches one blob ahead), so they overlap the compute of the
// blob before. Disk traffic: the copy is read for every upload, twice a step (forward and
// backward; layer-major micro-batches share them). The ring is registered with the store's
// io_uring where the kernel allows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "engine/buffers.h"
#include "engine/state_stream.h"
#include "io/nvme_store.h"

namespace sf {

class WeightStream {
 public:
  struct Config {
    std::vector<int64_t> numel;  // [blobs] elements of the working copies in the store (0: not there)
    size_t elem_bytes = 2;       // bytes of an element (the compute dtype)
    // Elements a piece: a multiple of StateStream::kPieceAlign (every piece starts block-aligned
    // in the file); 0 or more than a blob: the largest working copy (one piece a blob).
    int64_t piece = 0;
    int ring = 2;  // pieces in pinned memory at once (no more than the pieces of all the blobs)
  };
  // "disk.wring": the ring's pinned buffers (+ alignment); nothing when no working copy is there.
  static MemoryItems buffers(const Config& c);
  // Elements of a full piece (the last of a blob may be shorter).
  static int64_t piece_of(const Config& c);
  WeightStream(Device& dev, NvmeStore& store, StateStream& state, const Config& c, BufferSource& src);
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;

  int64_t piece() const { return piece_; }
  // Queues the read of elements [first, first + n) of `blob`'s working copy (n <= piece(), first
  // a multiple of it; after `updated`, the blob's last host update, and its write-back) into the
  // next ring buffer, once h2d has copied out what that buffer held; h2d waits for the read. The
  // buffer: [n] elements.
  const void* begin(int blob, int64_t first, int64_t n, Event& updated, Stream& h2d);
  // h2d has queued its copy out of the last begin's buffer.
  void end(Stream& h2d);
  size_t pinned_bytes() const { return mem_.size(); }
  int ring() const { return ring_; }

 private:
  char* slot(int i) const;
  Device& dev_;
  NvmeStore& store_;
  StateStream& state_;
  size_t elem_;
  int64_t piece_;   // elements a ring buffer holds
  int ring_;
  size_t stride_;   // bytes of a ring buffer (aligned)
  std::unique_ptr<Stream> io_;
  DeviceBuffer mem_;                                  // [ring_, stride_] pinned (+ alignment)
  RegisteredBuffer reg_;                              // the ring in the store's io_uring table (before mem_ goes)
  std::vector<std::unique_ptr<Event>> ready_, free_;  // io: read; h2d: copied out
  int next_ = 0, cur_ = -1;
};

}  // namespace sf
