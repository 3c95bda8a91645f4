// The sliding engine's host state and host AdamW (docs/ARCHITECTURE.md §2-3). Per parameter of the blobs kept
// on the host: the fp32 master (page-locked: the upload source), AdamW m and v in the state dtype
// (F32, or BF16 stochastically rounded) — 12 or 8 bytes — and
// the gradients as they come down from the GPU, in the compute dtype (bf16 on cuda); a blob with
// a bf16 upload copy keeps its master split instead (core/split_master.h: the copy and the low
// halves, 4 bytes a parameter where master and copy took 6; docs/ENGINE.md "Split masters");
// - `keep_grads` (clipping, or gradients read back): every gradient of the step is held until the
//   norm is known (+2 bytes a parameter);
// - otherwise a ring of a few chunk-sized page-locked buffers: each chunk is consumed by its AdamW
//   as soon as it lands and the buffer goes back to the ring; except the blobs marked `held` (the
//   last ones in forward order), whose gradients wait in their own place to be updated after the
//   backward, in forward order, while the next forward runs (the host would idle there otherwise).
// One fused pass per chunk (cpu::adamw): reads the gradient, p, m, v; writes p, m, v; or, split,
// a parameter pass (reads g, p, m, v; writes p) and later a moment pass (reads g, m, v; writes m, v).
// The m and v of the blobs marked `disk` live in the NVMe store instead (engine/state_stream.h):
// read a piece at a time into a small ring ahead of their update and written back after it; their
// update is always the fused pass (a split would read them twice), run piece by piece, which
// gives the same bits (AdamW is elementwise; the rounding stream is keyed by element).
// Levels 3 and 4 of the tier: a disk blob marked `disk_master` has its fp32 master in the store
// too (read with m and v before the update, written back after), and the update writes the
// blob's working copy, the new parameters in the compute dtype, from which its uploads read: in
// page-locked host memory (2 bytes a parameter instead of the master's 4), or, marked
// `disk_work`, in the store as well, read a piece at a time into a small pinned ring for each
// upload (engine/weight_stream.h). The cast is the one the GPU does on an upload of a master, so the
// slots hold the same bits either way.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "core/host_memory.h"
#include "core/phase_times.h"
#include "engine/buffers.h"
#include "engine/state_stream.h"
#include "engine/upload_source.h"
#include "engine/weight_stream.h"
#include "io/nvme_store.h"

namespace sf {

struct HostOptimizerOptions {
  std::vector<int64_t> blob_numel;  // [blobs] elements (0: the blob is not on the host)
  DType grad_dtype = DType::F32;    // the gradients as they land
  bool keep_grads = true;           // the step's gradients held until the norm is known
  int64_t chunk = 1;                // elements a gradient chunk
  int ring = 4;                     // gradient buffers when not keep_grads
  std::vector<bool> held;           // [blobs] (without keep_grads) the blob's gradient waits in place
  std::vector<bool> disk;           // [blobs] the blob's m and v live in the NVMe store
  int disk_ring = 4;                // pieces of the disk blobs' state in host memory at once (StateStream)
  int64_t disk_piece = 0;           // elements a piece (StateStream::Config::piece; 0: the largest blob)
  DType state_dtype = DType::F32;   // m and v (EngineOptions::state_dtype)
  std::vector<bool> disk_master;    // [blobs] (disk blobs) the fp32 master lives in the store too
  std::vector<bool> disk_work;      // [blobs] (disk masters) and the working copy the uploads read
  DType work_dtype = DType::BF16;   // the working copy's dtype: the compute dtype
  int weight_ring = 2;              // pieces (disk_piece) of the working copies read for uploads, pinned
  // (keep_grads, disk blobs) the step's gradient waits for the update in the store, not in host
  // memory: it lands in a ring of 2 pinned chunks and is written out on an I/O stream.
  std::vector<bool> disk_grads;
  // [blobs] (not `disk`) an upload copy: the master stays in host memory and a working copy in
  // work_dtype sits beside it ("host.work"), written by every update, read by every upload.
  std::vector<bool> ram_work;
};

// Rows of a blob that an update touches (the embedding's two parts a step: docs/ENGINE.md
// "The embedding's rows"): those whose flag equals `want`; no flags: every element.
struct UpdateRows {
  std::shared_ptr<const std::vector<uint8_t>> flags;  // [rows] 0 or 1, shared with the queued work
  int64_t row_len = 1;
  uint8_t want = 1;
};

class HostOptimizer {
 public:
  // `store`: the NVMe store, when a blob is marked `disk` (its "disk.state" bytes at offset 0).
  HostOptimizer(Device& dev, const HostOptimizerOptions& o, NvmeStore* store = nullptr);

  int64_t total() const { return total_; }
  bool master_on_disk(int blob) const { return disk_ && disk_->has_master(blob); }
  // What an upload of the blob reads (the master, the working copy in host memory, or the
  // working copy read from the store after `updated`, the blob's last update).
  UploadSource upload_source(int blob, Event& updated);
  bool has_upload_copy(int blob) const { return !master_on_disk(blob) && woff_[size_t(blob)] >= 0; }
  DType state_dtype() const { return sd_; }
  // Elements [off, off + n) of the master (0), m (1) or v (2) of a host blob, outside a step, as fp32
  // (m and v converted from the state dtype; written back rounded to nearest). Writing a master
  // also writes its working copy, if the blob has one (a split master: both its halves).
  void read_state(int which, int blob, int64_t off, int64_t n, float* dst);
  void write_state(int which, int blob, int64_t off, int64_t n, const float* src);
  bool on_disk(int blob) const { return disk_ && disk_->has(blob); }
  // Outside a step, before state is read or written: the store's transfers are done and what was
  // read ahead is dropped. Throws a kept I/O error (check_io too).
  void quiesce();
  void check_io() const {
    if (disk_) disk_->check();
  }
  // The state ring's read-ahead into memory lent by the checkpoint store (StateStream::lend,
  // reclaim; docs/ENGINE.md "Read-ahead into freed checkpoints"). No-ops without state on disk.
  bool can_borrow() const { return disk_ && disk_->host_bytes() > 0; }
  void lend(int key, char* mem, size_t bytes, int through) {
    if (disk_) disk_->lend(key, mem, bytes, through);
  }
  void reclaim(int key) {
    if (disk_) disk_->reclaim(key);
  }
  bool try_reclaim(int key) { return !disk_ || disk_->try_reclaim(key); }
  uint64_t lent_reads() const { return disk_ ? disk_->lent_reads() : 0; }
  bool keep_grads() const { return keep_; }
  DType grad_dtype() const { return gd_; }

  // Where chunk [i0, i0 + n) of blob's gradient lands. With keep_grads (or a held blob): its place
  // in the store; else the next ring buffer, once `stream` has waited for it to be free (its last
  // update done).
  struct Landing {
    void* ptr = nullptr;
    int ring = -1;   // the ring buffer, or -1
    int gring = -1;  // the ring of gradients on their way to the store, or -1
  };
  Landing land(int blob, int64_t i0, Stream& stream);
  // The chunk's copy into `at` is queued on `d2h`: a gradient held in the store is written out
  // from there (a no-op for the others).
  void landed(int blob, int64_t i0, int64_t n, const Landing& at, Stream& d2h);
  // The chunk's AdamW on `opt` (after the work queued there so far); a ring buffer is free after.
  // `part`: both passes (All) or one of the two of a split update (cpu::AdamWPart); `rows`: only
  // those rows' elements (a blob in host memory).
  void queue_update(int blob, int64_t i0, int64_t n, const Landing& at, const AdamWParams& p, Stream& opt,
                    cpu::AdamWPart part = cpu::AdamWPart::All, const UpdateRows& rows = {});
  // The gradient store of a blob (keep_grads, or held), [numel] in grad_dtype(); nullptr when it
  // is in the NVMe store (read by the update only).
  const void* grads(int blob) const;
  bool held(int blob) const { return keep_ || held_off_[size_t(blob)] >= 0; }

  double update_seconds() const { return double(update_ns_.load()) * 1e-9; }
  size_t pinned_bytes() const { return master_.size() + work_.size() + store_.size() + wring_bytes_ + gring_.size(); }
  // Seconds of the constructor's phases: page-locked allocation, zeroing (the first touch), the
  // NVMe streams (the engine's set-up report).
  const PhaseTimes& setup_times() const { return setup_; }
  size_t host_bytes() const {
    return pinned_bytes() + m_.size() + v_.size() + lo_.size() + ties_.size() + (disk_ ? disk_->host_bytes() : 0);
  }
  // What the constructor allocates, from the same options: "host.master", "host.work" (working
  // copies in host memory: of masters in the store, upload copies) and "host.grads" (the
  // store or the ring, when there is a gradient on the host) page-locked, "host.m", "host.v" and
  // the split masters' "host.lo", "host.ties" pageable, and for blobs in the store "disk.ring"
  // (pageable) and "disk.state" (the store's bytes).
  static MemoryItems buffers(const HostOptimizerOptions& o);
  // The order in which the blobs' updates run on the opt stream within a step (the disk ring reads
  // ahead in it): with keep_grads forward order; else the blobs not held in backward order, as
  // their gradients land, then the held ones in forward order.
  static std::vector<int> update_order(const HostOptimizerOptions& o);

 private:
  void update_disk(int blob, int64_t i0, int64_t n, const void* g, AdamWParams q);  // on the opt stream
  // The fp32 master of a blob whose master is in host memory unsplit.
  float* master(int blob);
  // A blob with a bf16 upload copy keeps its master split (core/split_master.h): the copy is its
  // high half, lo_ its low halves, ties_ its tie bits. Then it has no fp32 master.
  bool is_split(int blob) const { return loff_[size_t(blob)] >= 0; }
  SplitMaster split(int blob);

  Device& dev_;
  DType gd_, sd_;
  bool keep_;
  int64_t chunk_;
  std::vector<int64_t> off_;   // [blobs] element offset among the host blobs (gradient store; -1: not on the host)
  std::vector<int64_t> poff_;  // [blobs] element offset in master_ (-1: not there: on the GPU or in the store)
  std::vector<int64_t> goff_;  // [blobs] (keep_grads) element offset in store_ (-1: the gradient is in the NVMe store)
  std::vector<int64_t> woff_;  // [blobs] element offset in work_ (-1: no working copy in host memory)
  std::vector<int64_t> moff_;  // [blobs] element offset in m_ and v_ (-1: not on the host, or on disk)
  std::vector<int64_t> loff_;  // [blobs] element offset in lo_ (-1: the master is not split)
  std::vector<int64_t> toff_;  // [blobs] byte offset in ties_ (-1: the master is not split)
  std::vector<int64_t> numel_;
  int64_t total_ = 0;
  DeviceBuffer master_;  // [masters in host memory] F32 pinned
  DeviceBuffer work_;    // [working copies in host memory] work dtype, pinned
  DType wd_ = DType::BF16;
  size_t wring_bytes_ = 0;
  HostBuffer m_, v_;  // [total of the blobs not on disk] sd_
  HostBuffer lo_;     // [split masters] uint16 low halves
  HostBuffer ties_;   // [split masters' tie bitmaps, each from a byte] bits
  PhaseTimes setup_;
  std::unique_ptr<StateStream> disk_;      // m and v of the blobs in the NVMe store
  StateStream::View disk_view_;            // the piece being updated (opt stream only)
  bool disk_open_ = false;                 // disk_view_ is acquired (a chunk may end inside a piece)
  std::unique_ptr<WeightStream> weights_;  // working copies read from the store for uploads (after disk_)
  // Gradients on their way to the store: [2, chunk] pinned, written out on gio_.
  DeviceBuffer gring_;          // (+ a block: the chunks start block-aligned)
  size_t gstride_ = 0;          // bytes of a chunk's buffer in it (a whole number of blocks)
  char* gring_at(int r) const;  // chunk buffer r of gring_
  std::unique_ptr<Stream> gio_;
  std::vector<std::unique_ptr<Event>> g_copied_, g_free_;
  int gnext_ = 0;
  DeviceBuffer store_;                             // keep_grads: [total] gd; else [ring, chunk] + [held] gd; pinned
  std::vector<int64_t> held_off_;                  // [blobs] element offset of a held blob in store_ (-1: not held)
  std::vector<std::unique_ptr<Event>> ring_free_;  // [ring] opt: the buffer's update is done
  int ring_next_ = 0;
  std::atomic<int64_t> update_ns_{0};
};

}  // namespace sf
