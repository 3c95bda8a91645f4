// The sliding engine's activation checkpoints (docs/ARCHITECTURE.md §2): each
// layer's input, per micro-batch, goes down to page-locked host memory during the forward and
// comes back for the layer's recompute and backward, the k-th fetch of a backward into GPU buffer
// k % 2 (one in use while the next is fetched).
//
// The NVMe tier: the checkpoints of the first `disk_layers` layers (written first in a forward,
// read last in the backward: the most time between) go to the offload file instead, through a
// small pinned ring, on an I/O stream whose host functions do the transfers: down, d2h into a
// ring buffer then written out; up, read into a ring buffer `read_ahead` fetches ahead (from the
// end of the forward on), then h2d into the GPU buffer. The ring is registered with the store's
// io_uring where the kernel allows.
//
// With GPUDirect Storage (`gpu_direct`: cuFile, io/gds.h) there is no pinned ring: down, the
// layer input is copied on the GPU into one of the two fetch buffers (idle during the forward)
// and written from there by cuFile; up, cuFile reads into the fetch buffer itself once the
// compute stream is done with it (one fetch ahead, as for the checkpoints in host memory).
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "engine/buffers.h"
#include "io/nvme_store.h"

namespace sf {

struct CheckpointOptions {
  int micro = 1;        // micro-batches a step
  int layers = 1;       // layer inputs a micro-batch
  size_t stride = 0;    // bytes of one layer input at most
  int disk_layers = 0;  // the first layers whose checkpoints are in the offload file
  int write_ring = 2;   // pinned buffers of the writes
  int read_ahead = 4;   // pinned buffers of the reads (fetches read ahead)
  bool gpu_direct = false;  // disk layers through cuFile (the store's gpu_* calls), no pinned ring
};

class CheckpointStore {
 public:
  // `store` and `io` (a stream of its own) when disk_layers > 0; the checkpoints are at
  // `store_offset` in the store.
  CheckpointStore(Device& dev, const CheckpointOptions& o, NvmeStore* store = nullptr, uint64_t store_offset = 0,
                  Stream* io = nullptr);
  // Its buffers: the two GPU buffers of the fetches ("ckpt.fetch"), the pinned store of the layers
  // in host memory ("ckpt.host"), and with disk layers the pinned ring ("ckpt.ring") and the
  // store's bytes ("ckpt.disk").
  static MemoryItems buffers(const CheckpointOptions& o);

  // Micro-batch j's input of layer l, `bytes` at `src` on the GPU, down on `d2h` (which has waited
  // for `src` to be written).
  void offload(int j, int l, const void* src, size_t bytes, Stream& d2h);
  // Every offload of this forward is queued on d2h: the backward's fetches wait for them.
  void forward_done(Stream& d2h);
  // Fetch k of the backward: micro-batch j's input of layer l into buffer k % 2, on h2d, once
  // the compute stream is done with what fetch k - 2 brought. Fetches come in the backward's
  // order: layers last to first, micro-batches in order.
  void fetch(int k, int j, int l, size_t bytes, Stream& h2d);
  // The compute stream waits for fetch k; its buffer.
  void* use(int k, Stream& compute);
  // The compute stream's work queued so far is the last that reads fetch k's buffer.
  void done(int k, Stream& compute);

  // Lends each checkpoint buffer in host memory while the backward no longer needs it and the next
  // forward has not written it (docs/ENGINE.md "Read-ahead into freed checkpoints"): `lend(key,
  // mem, bytes, layer)` from a host function on h2d after its fetch, before the fetch's `ready`
  // (so the compute, and through it the next forward's offload, comes after it); `reclaim(key)`
  // from a host function on d2h before the offload that writes it again — unless
  // `try_reclaim(key)`, called when that offload is queued, took it back already (nothing of the
  // borrower's is in it). One host function a layer each way, not one a micro-batch: CUDA runs
  // every stream's host functions on one thread, where a host update may wait for the disk for a
  // second, and each host function queued behind it stalls its stream that long.
  using Lend = std::function<void(int key, char* mem, size_t bytes, int layer)>;
  using Reclaim = std::function<void(int key)>;
  using TryReclaim = std::function<bool(int key)>;
  void lend_to(Lend lend, Reclaim reclaim, TryReclaim try_reclaim = nullptr) {
    lend_ = std::move(lend);
    reclaim_ = std::move(reclaim);
    try_reclaim_ = std::move(try_reclaim);
  }

  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  size_t host_bytes() const { return host_.size() + ring_.size(); }
  size_t device_bytes() const { return gpu_.size(); }

 private:
  char* at(int j, int l) const;
  bool on_disk(int l) const { return l < o_.disk_layers; }
  uint64_t disk_at(int j, int l) const;
  char* ring_slot(int i) const;  // write ring 0..write_ring-1, then the read ring
  void queue_read();  // the next disk checkpoint of the backward into the read ring (io stream)
  void reclaim_layer(int l, Stream& d2h);  // layer l's lent checkpoints back before its first offload
  void queue_lends(Stream& h2d);           // what was fetched since the last lend, lent
  void offload_direct(int j, int l, const void* src, size_t bytes, Stream& d2h);  // gpu_direct
  void fetch_direct(int i, int j, int l, size_t bytes);                           // gpu_direct
  Device& dev_;
  CheckpointOptions o_;
  size_t dstride_ = 0;  // stride rounded to the store's block
  NvmeStore* store_ = nullptr;
  uint64_t store_off_ = 0;
  Stream* io_ = nullptr;
  DeviceBuffer host_;                          // [micro, layers - disk_layers, stride] pinned
  DeviceBuffer gpu_;                           // [2, stride]: the fetched checkpoints
  DeviceBuffer ring_;                          // [write_ring + read_ahead, dstride] pinned (+ alignment)
  std::unique_ptr<Event> ready_[2], free_[2];  // h2d: fetched; compute: released
  std::unique_ptr<Event> offloaded_;           // d2h: the forward's offloads are done
  // The disk part: a write buffer is free once written (io); copied once d2h filled it.
  std::vector<std::unique_ptr<Event>> w_free_, w_copied_;
  int next_w_ = 0;
  // The read ring: read (io) and free again once h2d has copied it out.
  std::vector<std::unique_ptr<Event>> r_ready_, r_free_;
  std::vector<std::pair<int, int>> disk_order_;  // (j, l) of the disk checkpoints in fetch order
  size_t reads_queued_ = 0, reads_used_ = 0;
  RegisteredBuffer ring_reg_;               // the pinned ring in the store's io_uring table
  bool gpu_reg_ = false;                    // gpu_ registered with cuFile
  std::unique_ptr<Event> written_;          // io: the forward's cuFile writes from gpu_ are done
  Lend lend_;        // the host memory of a fetched checkpoint, lent until its next offload
  Reclaim reclaim_;
  TryReclaim try_reclaim_;
  // Lending, on the queuing thread: the micro-batches of the last forward (a layer's lends go in
  // one host function after its last fetch), the keys whose lend is queued and not yet taken back
  // ([micro * layers]), the lends' host functions queued and run (try_reclaim is only asked once
  // every lend queued has run: a key it does not know may be lent still).
  int fwd_micro_ = 0, pass_micro_ = 0;
  std::vector<char> lent_;
  std::vector<std::pair<int, char*>> to_lend_;  // (key, memory) fetched, lend not yet queued
  uint64_t lends_queued_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> lends_run_ = std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace sf
