// The sliding engine's activation checkpoints (docs/ARCHITECTURE.md §2): each layer's input, per micro-batch,
// goes down to page-locked host memory during the forward and comes back for the layer's
// recompute and backward, the k-th fetch of a backward into GPU buffer k % 2 (one in use while
// the next is fetched).
#pragma once
#include <cstddef>
#include <memory>

#include "backend/device.h"
#include "engine/buffers.h"

namespace sf {

class CheckpointStore {
 public:
  // `micro` micro-batches of `layers` layer inputs, each at most `stride` bytes.
  CheckpointStore(Device& dev, int micro, int layers, size_t stride);
  // Its buffers: the pinned store and the two GPU buffers of the fetches ("ckpt.host", "ckpt.fetch").
  static MemoryItems buffers(int micro, int layers, size_t stride);

  // Micro-batch j's input of layer l, `bytes` at `src` on the GPU, down on `d2h` (which has waited
  // for `src` to be written).
  void offload(int j, int l, const void* src, size_t bytes, Stream& d2h);
  // Every offload of this forward is queued on d2h: the backward's fetches wait for them.
  void forward_done(Stream& d2h);
  // Fetch k of the backward: micro-batch j's input of layer l into buffer k % 2, on h2d, once
  // the compute stream is done with what fetch k - 2 brought.
  void fetch(int k, int j, int l, size_t bytes, Stream& h2d);
  // The compute stream waits for fetch k; its buffer.
  void* use(int k, Stream& compute);
  // The compute stream's work queued so far is the last that reads fetch k's buffer.
  void done(int k, Stream& compute);

  size_t host_bytes() const { return host_.size(); }
  size_t device_bytes() const { return gpu_.size(); }

 private:
  char* at(int j, int l) const;
  Device& dev_;
  int layers_;
  size_t stride_;
  DeviceBuffer host_;                          // [micro, layers, stride] pinned
  DeviceBuffer gpu_;                           // [2, stride]: the fetched checkpoints
  std::unique_ptr<Event> ready_[2], free_[2];  // h2d: fetched; compute: released
  std::unique_ptr<Event> offloaded_;           // d2h: the forward's offloads are done
};

}  // namespace sf
