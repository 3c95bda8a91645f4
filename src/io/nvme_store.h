// The NVMe tier's scratch file (--offload-dir; docs/ENGINE.md "NVMe tier"). One file in the offload
// directory, preallocated at start-up, read and written in large aligned pieces with several
// requests in flight: io_uring with O_DIRECT where the kernel and the filesystem allow, else
// worker threads with pread/pwrite (and the page cache where O_DIRECT is refused, e.g. tmpfs).
//
// The file has no name: O_TMPFILE, else created under a marked name and unlinked at once. So it
// disappears when the process ends however it ends (exit, Ctrl-C, a kill), a later run never finds
// and reuses it, and nothing in the directory that slideformer did not create is touched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace sf {

// Test hooks (tests/test_nvme_store.cpp, tests/test_sliding_engine.cpp): failures and disorder
// injected at the completion of each piece, in either backend.
struct StoreFaults {
  int fail_errno = 0;                      // EIO, ENOSPC, ...: pieces past fail_after_bytes fail with it
  uint64_t fail_after_bytes = 0;           // bytes transferred (of the kind below) before the failure
  bool fail_reads = false;                 // the failure hits reads (else writes)
  bool short_transfers = false;            // every piece of more than one block first moves half
  int max_delay_us = 0;                    // each piece completes after a random delay up to this
  uint64_t seed = 1;                       // of the delays
  bool refuse_registration = false;        // register_buffer fails as the kernel does past RLIMIT_MEMLOCK
  bool any() const { return fail_errno != 0 || short_transfers || max_delay_us > 0 || refuse_registration; }
};

struct StoreOptions {
  std::string dir;                  // the offload directory (must exist)
  uint64_t bytes = 0;               // capacity, preallocated
  int depth = 8;                    // pieces in flight
  size_t piece = size_t(8) << 20;   // the largest transfer of one request (bytes)
  bool direct = true;               // O_DIRECT where the filesystem allows it
  bool uring = true;                // io_uring where the kernel allows it (and liburing is built in)
  // GPUDirect Storage: the cuFile library to load (CheckpointIo::library, io/gds.h) for
  // gpu_read_wait / gpu_write_wait; empty: none. Chosen at start-up; a failure here is an error.
  std::string cufile;
  StoreFaults faults;
};

class NvmeStore {
 public:
  static constexpr size_t kAlign = 4096;  // offsets, sizes and buffers of read()/write()

  // Creates and preallocates the file. Failures are InputErrors naming the directory (missing,
  // not a directory, not writable, too small: "needs X, Y free").
  explicit NvmeStore(const StoreOptions& o);
  ~NvmeStore();  // waits for the requests in flight; the file disappears with its descriptor
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Asynchronous transfers of [offset, offset + bytes) from / to `buf` (all kAlign-aligned); split
  // into pieces, several in flight. `done(err)` runs once, on a store thread, when every piece has
  // completed: err 0, or the first errno (a short transfer is retried; 0 bytes moved is EIO for a
  // read, ENOSPC for a write). `done` must not call back into the store synchronously... except
  // read()/write(), which it may.
  // `urgent`: issued ahead of the others queued (a stream waits for it), as the blocking calls.
  using Done = std::function<void(int err)>;
  void read(uint64_t offset, void* buf, size_t bytes, Done done, bool urgent = false);
  void write(uint64_t offset, const void* buf, size_t bytes, Done done, bool urgent = false);
  // Synchronous, any offset and size (through an aligned bounce buffer; read-modify-write at the
  // edges): state loaded, saved or inspected outside a step. Errors: std::runtime_error.
  void read_sync(uint64_t offset, void* dst, size_t bytes);
  void write_sync(uint64_t offset, const void* src, size_t bytes);
  // Aligned and blocking (the calling thread waits): the checkpoints' transfers and the held
  // gradients' writes, which run as host functions of an I/O stream. These (and the *_sync calls)
  // are issued ahead of the asynchronous transfers already queued: a waiting host function holds
  // CUDA's one host-function thread, every stream's. Errors: std::runtime_error.
  void read_wait(uint64_t offset, void* buf, size_t bytes);
  void write_wait(uint64_t offset, const void* buf, size_t bytes);
  void drain();  // every request submitted so far has completed

  // Registered ("fixed") buffers: io_uring maps [buf, buf + bytes) once instead of at every
  // request; a piece that lies inside a registered buffer then goes as READ_FIXED / WRITE_FIXED.
  // For the long-lived rings the store reads into and writes from, at start-up (it waits for the
  // requests in flight). False when the store has no io_uring or the kernel refuses (the pages
  // count against RLIMIT_MEMLOCK; the first refusal is logged once and the store stops trying):
  // the transfers are then plain reads and writes, the same bytes.
  bool register_buffer(const void* buf, size_t bytes);
  void unregister_buffer(const void* buf);  // before the buffer is freed (RegisteredBuffer does it)
  uint64_t fixed_pieces() const;            // pieces issued on registered buffers (tests, logs)

  // GPUDirect Storage (StoreOptions::cufile): blocking transfers between the file and GPU memory
  // (any size; offsets kAlign-aligned), with the same counters, fault hooks and errors as the
  // others. gpu_register keeps GPU memory registered with cuFile until gpu_unregister.
  bool gpu_direct() const;
  std::string gpu_how() const;  // "cuFile (libcufile.so.0, compatibility mode)"
  void gpu_read_wait(uint64_t offset, void* dev, size_t bytes);
  void gpu_write_wait(uint64_t offset, const void* dev, size_t bytes);
  bool gpu_register(const void* dev, size_t bytes);
  void gpu_unregister(const void* dev);
  uint64_t gpu_bytes() const;  // bytes moved by cuFile (tests, logs)
  // Throws the first failure any transfer ever had (a run stops at its next step, whichever part's
  // transfer it was).
  void check() const;

  uint64_t capacity() const;
  const std::string& dir() const;
  std::string how() const;  // "io_uring, O_DIRECT" | "threads, buffered" ...: what plan/logs say
  // Counters (bytes moved; seconds during which at least one piece was in flight).
  uint64_t bytes_read() const;
  uint64_t bytes_written() const;
  double busy_seconds() const;

  // Round up to kAlign.
  static uint64_t aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  // The message of an errno from a transfer: "offload dir DIR: reading failed: ..." (for callers
  // that turn a done(err) into an error).
  std::string error_text(bool write, int err) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A buffer registered with a store for the holder's lifetime (NvmeStore::register_buffer); the
// store must outlive it. `registered()` says whether the kernel took it.
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  RegisteredBuffer(NvmeStore* store, const void* buf, size_t bytes)
      : store_(store), buf_(buf), ok_(store && bytes > 0 && store->register_buffer(buf, bytes)) {}
  ~RegisteredBuffer() {
    if (ok_) store_->unregister_buffer(buf_);
  }
  RegisteredBuffer(RegisteredBuffer&& o) noexcept : store_(o.store_), buf_(o.buf_), ok_(o.ok_) { o.ok_ = false; }
  RegisteredBuffer& operator=(RegisteredBuffer&& o) noexcept {
    if (this != &o) {
      if (ok_) store_->unregister_buffer(buf_);
      store_ = o.store_;
      buf_ = o.buf_;
      ok_ = o.ok_;
      o.ok_ = false;
    }
    return *this;
  }
  bool registered() const { return ok_; }

 private:
  NvmeStore* store_ = nullptr;
  const void* buf_ = nullptr;
  bool ok_ = false;
};

// Free bytes of the filesystem holding `dir` (0 when it cannot be read).
uint64_t free_disk_bytes(const std::string& dir);

}  // namespace sf
