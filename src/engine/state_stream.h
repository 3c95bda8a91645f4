// AdamW state of whole blobs in the NVMe store (docs/ENGINE.md "NVMe tier"): each such blob's m and
// v live in the offload file and pass through a small ring of host buffers around its update. The
// blobs are updated in the same order every step (`order`, one cycle a step), so the ring reads
// ahead in that order as buffers come free, and a buffer is free again once the blob's updated
// state is written back: reads, writes, the host AdamW, PCIe and the GPU all overlap, several
// transfers in flight.
//
// Reads of a blob never pass the write-back of its previous update (a read waits until that write
// is done), and never run a whole cycle ahead. Errors of the store are kept and thrown by the next
// acquire() or check(), with the offload directory and the errno in the message.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/host_memory.h"
#include "engine/buffers.h"
#include "io/nvme_store.h"

namespace sf {

class StateStream {
 public:
  struct Config {
    std::vector<int64_t> numel;  // [blobs] elements whose m and v are in the store (0: not there)
    size_t elem_bytes = 4;       // bytes of one element of m (and of v)
    std::vector<int> order;      // the store's blobs in the order of their updates within a step
    int ring = 3;                // blobs' state in host memory at once (>= 1)
  };
  // "disk.ring" (the host buffers, pageable, aligned for O_DIRECT) and "disk.state" (the bytes in
  // the store).
  static MemoryItems buffers(const Config& c);
  static uint64_t store_bytes(const Config& c);  // the "disk.state" item's bytes

  // Allocates the ring from `src`; the state starts at zero (a fresh store reads as zeros).
  StateStream(NvmeStore& store, const Config& c, BufferSource& src);
  ~StateStream();  // waits for the transfers in flight
  StateStream(const StateStream&) = delete;
  StateStream& operator=(const StateStream&) = delete;

  bool has(int blob) const { return blob >= 0 && size_t(blob) < cfg_.numel.size() && cfg_.numel[size_t(blob)] > 0; }
  struct View {
    void* m = nullptr;  // [numel] elements
    void* v = nullptr;
  };
  // The next blob of the cycle, once it is in host memory (blocks). `blob` must be that blob.
  View acquire(int blob);
  // The blob's update is done: its state goes back to the store and the buffer is reused after.
  void release(int blob);
  // Waits for every transfer, drops what was read ahead (state read or written outside a step
  // goes straight to the store), throws a kept error.
  void quiesce();
  void check() const;  // throws a kept error

  // Outside a step (after quiesce): elements [off, off + n) of m (which 1) or v (which 2).
  void read(int which, int blob, int64_t off, int64_t n, void* dst);
  void write(int which, int blob, int64_t off, int64_t n, const void* src);

  size_t host_bytes() const { return ring_mem_.size(); }

 private:
  enum class St { Free, Reading, Ready, InUse, Writing };
  struct Slot {
    St st = St::Free;
    int64_t pos = -1;  // position in the cycle sequence (order[pos % n])
    char* mem = nullptr;
  };
  void pump_locked();
  Slot* slot_at(int64_t pos);
  uint64_t region(int blob) const { return uint64_t(NvmeStore::aligned(uint64_t(cfg_.numel[size_t(blob)]) * cfg_.elem_bytes)); }

  NvmeStore& store_;
  Config cfg_;
  std::vector<uint64_t> off_;  // [blobs] byte offset of the blob's m in the store (v follows its m region)
  HostBuffer ring_mem_;        // [ring, slot_bytes_] (+ alignment)
  size_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_use_ = 0, next_read_ = 0;
  std::vector<int> writing_;  // [blobs] write-backs in flight
  int err_ = 0;
  bool err_write_ = false;
};

}  // namespace sf
