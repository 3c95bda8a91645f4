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
//
// Levels 3 and 4 of the tier (docs/ENGINE.md "NVMe tier"): a blob's fp32 master can live in its
// region too (`master`), and then also its working copy, the parameters in the compute dtype that
// the uploads read (`work`). A blob's region is [m | v | master | work] (each part 4 KiB aligned);
// the update reads [m | v | master] and writes the whole region back, the working copy computed
// from the new master in the same pass (WeightStream reads it for the uploads).
// With clipping, a blob's gradient can wait for the update in the store too (`grads`): the region is
// then [grad | m | v | master | work], the gradient written chunk by chunk as it lands
// (write_grad, on the host optimizer's I/O stream) and read with the state; a blob's read waits
// until its gradient of the step is complete, and the write-back skips it.
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
    std::vector<bool> master;    // [blobs] the fp32 master is in the region too (level 3)
    std::vector<bool> work;      // [blobs] and the working copy, work_bytes an element (level 4)
    size_t work_bytes = 2;       // bytes of an element of the working copy (the compute dtype)
    std::vector<bool> grads;     // [blobs] the step's gradient waits for the update here (clipping)
    size_t grad_bytes = 2;       // bytes of an element of a gradient
  };
  // Which part of a blob's region.
  enum Part { M = 1, V = 2, Master = 0, Work = 3, Grad = 4 };
  // "disk.ring" (the host buffers, pageable, aligned for O_DIRECT) and the bytes in the store:
  // "disk.state" (m and v), "disk.master", "disk.work" (in that order in the file).
  static MemoryItems buffers(const Config& c);
  static uint64_t store_bytes(const Config& c);  // the "disk.state" item's bytes

  // Allocates the ring from `src`; the state starts at zero (a fresh store reads as zeros).
  StateStream(NvmeStore& store, const Config& c, BufferSource& src);
  ~StateStream();  // waits for the transfers in flight
  StateStream(const StateStream&) = delete;
  StateStream& operator=(const StateStream&) = delete;

  bool has(int blob) const { return blob >= 0 && size_t(blob) < cfg_.numel.size() && cfg_.numel[size_t(blob)] > 0; }
  bool has_master(int blob) const { return has(blob) && blob < int(cfg_.master.size()) && cfg_.master[size_t(blob)]; }
  bool has_work(int blob) const { return has_master(blob) && blob < int(cfg_.work.size()) && cfg_.work[size_t(blob)]; }
  bool has_grad(int blob) const { return has(blob) && blob < int(cfg_.grads.size()) && cfg_.grads[size_t(blob)]; }
  struct View {
    void* m = nullptr;  // [numel] elements
    void* v = nullptr;
    float* master = nullptr;     // [numel] fp32, when the master is in the store
    void* work = nullptr;        // [numel] work_bytes each, when the working copy is: written by the update
    const void* grad = nullptr;  // [numel] grad_bytes each, when the gradient is in the store
  };
  // The next blob of the cycle, once it is in host memory (blocks). `blob` must be that blob.
  View acquire(int blob);
  // The blob's update is done: its state goes back to the store and the buffer is reused after.
  void release(int blob);
  // Waits for every transfer, drops what was read ahead (state read or written outside a step
  // goes straight to the store), throws a kept error.
  void quiesce();
  void check() const;  // throws a kept error

  // Where the blob's working copy is in the store (level 4), and its bytes (aligned).
  uint64_t work_offset(int blob) const { return off_[size_t(blob)] + part_at(blob, Work); }
  uint64_t work_span(int blob) const { return part_bytes(blob, Work); }
  // Blocks until no write-back of the blob is in flight (a read of its working copy follows the
  // update that wrote it). Throws a kept error.
  void wait_written(int blob);
  // Elements [i0, i0 + n) of the blob's gradient of this step, written now (blocks; `last`: the
  // gradient is complete, and the blob's state may be read ahead).
  void write_grad(int blob, int64_t i0, int64_t n, const void* src, bool last);

  // Outside a step (after quiesce): elements [off, off + n) of a part (which: Part).
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
  uint64_t part_bytes(int blob, int which) const;  // of the part in this blob's region (0: not there)
  uint64_t part_at(int blob, int which) const;     // its offset within the region
  size_t part_elem(int which) const {
    return which == Master ? 4 : which == Work ? cfg_.work_bytes : which == Grad ? cfg_.grad_bytes : cfg_.elem_bytes;
  }
  uint64_t read_bytes(int blob) const { return part_at(blob, Work); }  // [grad | m | v | master]
  uint64_t write_bytes(int blob) const { return part_at(blob, Work) + part_bytes(blob, Work) - part_at(blob, M); }

  NvmeStore& store_;
  Config cfg_;
  std::vector<uint64_t> off_;  // [blobs] byte offset of the blob's region [m | v | master | work] in the store
  HostBuffer ring_mem_;        // [ring, slot_bytes_] (+ alignment)
  size_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_use_ = 0, next_read_ = 0;
  std::vector<int> writing_;      // [blobs] write-backs in flight
  std::vector<char> grad_ready_;  // [blobs] the step's gradient is in the store, not yet read
  int err_ = 0;
  bool err_write_ = false;
};

}  // namespace sf
