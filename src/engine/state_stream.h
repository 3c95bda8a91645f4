// AdamW state of whole blobs in the NVMe store (docs/ENGINE.md "NVMe tier"): each such blob's m and
// v live in the offload file and pass through a small ring of host buffers around its update, a
// piece at a time (`piece` elements: the gradient chunk, so that an update without clipping
// consumes one piece a chunk). The blobs are updated in the same order every step (`order`, one
// cycle a step, each blob's pieces in element order), so the ring reads ahead in that order as
// buffers come free, and a buffer is free again once the piece's updated state is written back:
// reads, writes, the host AdamW, PCIe and the GPU all overlap, several transfers in flight. The
// ring holds `ring` pieces, not blobs: at 123B a layer's region is ~20 GB, a piece of 32 Mi
// elements 512 MiB at most.
//
// Reads of a piece never pass the write-back of its previous update (a read waits until that
// write is done), and never run a whole cycle ahead. Errors of the store are kept and thrown by
// the next acquire() or check(), with the offload directory and the errno in the message. The
// ring is registered with the store's io_uring (registered buffers) where the kernel allows.
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
//
// Lent memory (docs/ENGINE.md "Read-ahead into freed checkpoints"): the backward consumes the
// layer-input checkpoints from the last layer down, and the next forward writes them again from
// the first layer up. In between, a checkpoint's pinned buffer is lent to the stream (`lend`, from
// a host function on the h2d stream after its fetch) as extra read-ahead space: the next pieces of
// the cycle are read into it while the disk would be idle. Only pieces whose update the forward
// waits for before it writes that checkpoint again may go there (`through`: the blobs updated no
// later than the layer's own), so that at `reclaim` (a host function on d2h before the offload)
// every such piece has been updated and only its write-back can be in flight: reclaim waits for
// the store, never for a host update. A lent buffer serves each piece once (carved from the top
// down, coalesced with the lent buffer just above it); a piece read ahead into it but not updated
// by then (a step stopped at a non-finite norm) is dropped and read again later.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
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
    int ring = 4;                // pieces in host memory at once (>= 1)
    // Elements a piece: a multiple of kPieceAlign (every part's pieces start block-aligned in the
    // file); 0: the largest blob (one piece a blob).
    int64_t piece = 0;
    std::vector<bool> master;    // [blobs] the fp32 master is in the region too (level 3)
    std::vector<bool> work;      // [blobs] and the working copy, work_bytes an element (level 4)
    size_t work_bytes = 2;       // bytes of an element of the working copy (the compute dtype)
    std::vector<bool> grads;     // [blobs] the step's gradient waits for the update here (clipping)
    size_t grad_bytes = 2;       // bytes of an element of a gradient
  };
  // Which part of a blob's region.
  enum Part { M = 1, V = 2, Master = 0, Work = 3, Grad = 4 };
  // A piece's elements are a multiple of this: 4 KiB of 2-byte elements.
  static constexpr int64_t kPieceAlign = int64_t(NvmeStore::kAlign / 2);
  // The piece size of a ring that gives updates of `chunk` elements one piece each.
  static int64_t piece_for(int64_t chunk) { return (chunk + kPieceAlign - 1) / kPieceAlign * kPieceAlign; }
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
  // One piece of a blob: elements [first, first + n).
  struct View {
    int64_t first = 0, n = 0;
    void* m = nullptr;  // [n] elements
    void* v = nullptr;
    float* master = nullptr;     // [n] fp32, when the master is in the store
    void* work = nullptr;        // [n] work_bytes each, when the working copy is: written by the update
    const void* grad = nullptr;  // [n] grad_bytes each, when the gradient is in the store
  };
  // The next piece of the cycle, once it is in host memory (blocks). `blob` must be its blob.
  View acquire(int blob);
  // The piece's update is done: its state goes back to the store and the buffer is reused after.
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
  // gradient is complete, and the blob's state may be read ahead). From a block-aligned `src`
  // holding a whole number of blocks at a block-aligned place in the file, the bytes go in place.
  void write_grad(int blob, int64_t i0, int64_t n, const void* src, bool last);
  // The same without waiting where the bytes go in place (else as write_grad): `src` is gradient
  // ring buffer `ticket` (0 or 1), busy until wait_grad(ticket) returns; the blob's state may be
  // read ahead once all its chunks, `last` the final one, are written. Two chunks in flight keep a
  // write queued on the disk while the host function waits for the other (the store issues them
  // ahead of the read-ahead: the backward's landings wait for them).
  void write_grad_async(int blob, int64_t i0, int64_t n, const void* src, bool last, int ticket);
  void wait_grad(int ticket);  // ticket's write is done (throws a kept error)

  // Outside a step (after quiesce): elements [off, off + n) of a part (which: Part).
  void read(int which, int blob, int64_t off, int64_t n, void* dst);
  void write(int which, int blob, int64_t off, int64_t n, const void* src);

  // Lends [mem, mem + bytes) (`key` names it for reclaim) for pieces of the blobs updated no later
  // than `through` within the current cycle (the cycle's prefix of blobs <= through). Aligned
  // inward to the store's block; coalesced with an open lent buffer that starts at mem + bytes.
  void lend(int key, char* mem, size_t bytes, int through);
  // Takes `key`'s memory back: no more pieces go into its lent buffer; waits for the transfers of
  // the pieces in it; a piece not yet updated is dropped (read again from the store later). A
  // piece being updated there is a broken contract (thrown). A key never lent: nothing.
  void reclaim(int key);
  // reclaim() now, from the thread that queues the step, when there is nothing to wait for: no
  // piece of the cycle is in `key`'s memory (its lent buffer takes no more pieces from here on).
  // False: a piece is there (read ahead, being updated or written back): reclaim() it in stream
  // order instead. True for a key not lent: the caller knows every lend queued has run.
  bool try_reclaim(int key);
  uint64_t lent_reads() const;  // pieces read into lent memory so far

  size_t host_bytes() const { return ring_mem_.size(); }
  bool registered() const { return ring_reg_.registered(); }  // the ring is in io_uring's table

 private:
  enum class St { Free, Reading, Ready, InUse, Writing };
  struct Slot {
    St st = St::Free;
    int64_t pos = -1;  // position in the cycle sequence (seq_[pos % seq_.size()])
    int pending = 0;   // the piece's transfers (one a part) not yet complete
    char* mem = nullptr;
    bool own = true;   // one of the ring's; else carved from lent memory (one piece, then retired)
    int lease = -1;    // (not own) index in leases_; -1: retired, reusable for another carve
    size_t bytes = 0;  // (not own) carved bytes
  };
  // Lent memory: [lo, hi) block-aligned, carved downward from hi (free: [lo, cut)).
  struct Region {
    int key;
    char *lo, *hi;  // as lent (unaligned)
  };
  struct Lease {
    char *lo = nullptr, *cut = nullptr;
    char* raw_lo = nullptr;  // the lowest region's start as lent (coalescing)
    int64_t limit = 0;       // pieces at cycle positions below this only
    bool open = true;
    int live = 0;  // carved slots not yet retired
    std::vector<Region> regions;
  };
  struct PieceRef {
    int blob;
    int64_t first, n;  // elements
  };
  void pump_locked();
  // Where chunk [i0, i0 + n) of the blob's gradient goes in the store, its bytes, and whether it
  // can go in place from `src` (block-aligned buffer and offset).
  bool grad_chunk(int blob, int64_t i0, int64_t n, const void* src, uint64_t& at, size_t& bytes) const;
  Slot* slot_at(int64_t pos);
  Slot* carve_locked(const PieceRef& p, int64_t pos);  // a lent buffer's slot for piece p, or null
  void drop_ready_from_locked(int64_t pos);  // Ready pieces at pos and after: dropped, read again
  // The piece's parts between the file and the slot (reads: [grad | m | v | master]; writes:
  // [m | v | master | work]), `done` once all have completed.
  void transfer(Slot* s, const PieceRef& p, bool write);
  void finished(Slot* s, int err, bool write);  // one part's transfer completed
  uint64_t part_bytes(int blob, int which) const;  // of the part in this blob's region (0: not there)
  uint64_t part_at(int blob, int which) const;     // its offset within the region
  uint64_t slot_part_at(int blob, int which) const;  // its offset within a ring buffer
  size_t part_elem(int which) const;  // bytes of an element of the part
  int64_t piece_of(int blob) const;  // elements of a (full) piece of the blob

  NvmeStore& store_;
  Config cfg_;
  std::vector<uint64_t> off_;  // [blobs] byte offset of the blob's region [grad | m | v | master | work] in the store
  std::vector<PieceRef> seq_;  // one cycle: the pieces of `order`'s blobs, in the order of their updates
  HostBuffer ring_mem_;        // [ring, slot_bytes_] (+ alignment)
  size_t slot_bytes_ = 0;
  RegisteredBuffer ring_reg_;  // the ring in the store's io_uring table (released before ring_mem_)
  std::deque<Slot> slots_;  // the ring's, then carved from lent memory (stable addresses)
  std::vector<Lease> leases_;
  uint64_t lent_reads_ = 0;
  bool hold_reads_ = false;  // reclaim drops pieces read ahead: no read starts meanwhile
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_use_ = 0, next_read_ = 0;
  std::vector<int> writing_;        // [blobs] pieces' write-backs in flight
  std::vector<char> piece_writing_;  // [seq_] the piece's write-back is in flight
  std::vector<char> grad_ready_;    // [blobs] the step's gradient is in the store, not yet all read
  std::vector<int> grad_writes_;    // [blobs] chunks of its gradient being written (write_grad_async)
  std::vector<char> grad_last_;     // [blobs] its last chunk is among them
  char ticket_busy_[2] = {0, 0};    // the gradient ring's buffers being written
  int err_ = 0;
  bool err_write_ = false;
};

}  // namespace sf
