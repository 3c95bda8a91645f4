#include "io/nvme_store.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#ifdef SF_HAVE_LIBURING
#include <liburing.h>
#endif

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/units.h"
#include "io/atomic_file.h"
#include "io/gds.h"

namespace sf {

uint64_t free_disk_bytes(const std::string& dir) {
  struct statvfs st{};
  if (::statvfs(dir.c_str(), &st) != 0) return 0;
  return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// In a named namespace, not the anonymous one: NvmeStore::Impl, a class with linkage, holds them
// (a unity build would warn that its members have internal linkage).
namespace nvme_io {

// One read() or write(): done once every piece has completed.
struct IoRequest {
  bool write = false;
  bool urgent = false;  // a caller's thread waits for it (the *_wait / *_sync calls): issued first
  std::atomic<int> pieces{0};
  std::atomic<int> err{0};
  NvmeStore::Done done;
};

struct IoPiece {
  std::shared_ptr<IoRequest> req;
  uint64_t off = 0;
  char* buf = nullptr;
  size_t len = 0;
  bool shortened = false;  // StoreFaults::short_transfers: each piece is cut once
  int fixed = -1;          // the registered buffer holding [buf, buf + len), or -1
};

// One entry of io_uring's registered buffer table: the kernel takes at most 1 GiB an entry, so a
// larger buffer is several entries (a piece that straddles two goes as a plain transfer).
struct FixedBuffer {
  const char* base;
  size_t len;
  const void* owner;  // the buffer register_buffer was given
};

}  // namespace nvme_io
using nvme_io::FixedBuffer;
using nvme_io::IoPiece;
using nvme_io::IoRequest;

namespace {

constexpr size_t kFixedMax = size_t(1) << 30;

std::string memlock_limit() {
  struct rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  return rl.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(uint64_t(rl.rlim_cur));
}

// Opens the anonymous file: O_TMPFILE, else a marked name unlinked at once; with O_DIRECT unless
// the filesystem refuses it (EINVAL: tmpfs and others), then through the page cache.
int open_anonymous(const std::string& dir, int flags) {
  int fd = ::open(dir.c_str(), flags | O_TMPFILE, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != ENOENT)) return fd;
  // A kill between the create and the unlink leaves a ".slideformer-store-*" file, which says what it is.
  const std::string path = dir + "/.slideformer-store-" + unique_suffix();
  fd = ::open(path.c_str(), flags | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) ::unlink(path.c_str());
  return fd;
}

int open_store_file(const std::string& dir, bool want_direct, bool& direct) {
  const int flags = O_RDWR | O_CLOEXEC;
  direct = want_direct;
  int fd = want_direct ? open_anonymous(dir, flags | O_DIRECT) : -1;
  if (fd < 0 && (!want_direct || errno == EINVAL)) {
    direct = false;
    fd = open_anonymous(dir, flags);
  }
  if (fd < 0) {
    const int err = errno;
    input_error_naming(dir, {std::string("cannot create the offload file: ") + std::strerror(err) + " (",
                             Setting::OffloadDir, ")"});
  }
  return fd;
}

}  // namespace

struct NvmeStore::Impl {
  StoreOptions o;
  int fd = -1;
  bool direct = false, uring = false;

  std::mutex mu;
  std::condition_variable cv;          // queue non-empty, or a request done (drain)
  // Pieces not yet issued: those of urgent requests first, whatever was queued before them. A
  // blocking transfer holds a thread that others wait for (a stream's host function: CUDA runs
  // every stream's host functions on one thread), so it does not queue behind read-ahead.
  std::deque<IoPiece> urgent, queue;
  int inflight = 0;                    // pieces issued, not completed
  int64_t open_requests = 0;           // requests not yet done
  bool stopping = false;
  // Registration (change_fixed): new pieces are held back, and the reaper waits outside the kernel
  // (some kernels' io_uring_register waits for every thread inside io_uring_enter to leave it).
  bool registering = false, reaper_paused = false;
  std::vector<std::thread> threads;    // the reaper (io_uring) or the workers
  Clock::time_point busy_since{};
  std::atomic<uint64_t> busy_ns{0}, rd{0}, wr{0};
  std::atomic<uint64_t> fault_bytes{0};
  std::atomic<int> first_err{0};  // 2 * errno + (1 for a write): the first failure
  std::mt19937_64 rng;
  std::mutex rng_mu;
  std::vector<FixedBuffer> fixed;       // the registered buffers (under mu; changed with nothing in flight)
  bool fixed_refused = false;           // the kernel refused once: no more attempts
  std::atomic<uint64_t> fixed_issued{0};
  std::unique_ptr<CuFile> cufile;  // GPUDirect Storage (StoreOptions::cufile)
  void* cufile_handle = nullptr;   // the file registered with it
  std::atomic<uint64_t> gpu_moved{0};
  // The cuFile transfers run on a thread of their own (bound to the CUDA context): the callers are
  // stream host functions, which may make no CUDA call. One job at a time, the caller waiting.
  struct GpuJob {
    bool write;
    uint64_t off;
    char* dev;
    size_t bytes;
    bool done = false;
    std::exception_ptr error;
  };
  std::thread gpu_thread;
  std::mutex gpu_mu;
  std::condition_variable gpu_cv;
  std::deque<GpuJob*> gpu_jobs;
  bool gpu_stop = false;
#ifdef SF_HAVE_LIBURING
  io_uring ring{};
#endif

  explicit Impl(const StoreOptions& opt) : o(opt), rng(opt.faults.seed) {}

  // ---- pieces: queued, issued by a backend, completed here
  void enqueue(std::shared_ptr<IoRequest> r, uint64_t off, char* buf, size_t bytes) {
    std::vector<IoPiece> ps;
    for (size_t at = 0; at < bytes; at += o.piece) ps.push_back({r, off + at, buf + at, std::min(o.piece, bytes - at)});
    if (ps.empty()) {  // nothing to move
      r->done(0);
      return;
    }
    r->pieces = int(ps.size());
    {
      std::lock_guard<std::mutex> lk(mu);
      ++open_requests;
      for (IoPiece& p : ps) (r->urgent ? urgent : queue).push_back(std::move(p));
      issue_locked();
    }
    cv.notify_all();
  }

  bool waiting_locked() const { return !urgent.empty() || !queue.empty(); }
  IoPiece take_locked() {  // the next piece to issue (one is waiting)
    std::deque<IoPiece>& q = urgent.empty() ? queue : urgent;
    IoPiece p = std::move(q.front());
    q.pop_front();
    return p;
  }
  void started_locked() {
    if (inflight++ == 0) busy_since = Clock::now();
  }
  void finished_locked() {
    if (--inflight == 0)
      busy_ns += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - busy_since).count());
  }

  // StoreFaults applied to a transfer's result (bytes moved or -errno) of `len` requested:
  // a random delay, the first transfer cut short, a failure past the byte budget.
  ssize_t inject(ssize_t res, size_t len, bool write, bool& shortened) {
    const StoreFaults& f = o.faults;
    if (f.max_delay_us > 0) {
      int us;
      {
        std::lock_guard<std::mutex> lk(rng_mu);
        us = int(rng() % uint64_t(f.max_delay_us + 1));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
    if (res > 0 && f.short_transfers && !shortened && size_t(res) == len && len > kAlign) {
      res = ssize_t(len / 2 / kAlign * kAlign);
      shortened = true;
    }
    if (res > 0 && f.fail_errno != 0 && f.fail_reads != write) {
      if (fault_bytes.fetch_add(uint64_t(res)) + uint64_t(res) > f.fail_after_bytes) res = -f.fail_errno;
    }
    return res;
  }

  // A piece's result (bytes moved or -errno) from either backend: faults applied, short transfers
  // and interruptions resubmitted, the request done after its last piece.
  void complete(IoPiece p, ssize_t res) {
    res = inject(res, p.len, p.req->write, p.shortened);
    bool again = false;
    if (res == -EINTR || res == -EAGAIN) {
      again = true;
    } else if (res < 0) {
      int expected = 0;
      p.req->err.compare_exchange_strong(expected, int(-res));
    } else if (res == 0) {
      int expected = 0;
      p.req->err.compare_exchange_strong(expected, p.req->write ? ENOSPC : EIO);
    } else {
      (p.req->write ? wr : rd) += uint64_t(res);
      if (size_t(res) < p.len) {
        p.off += uint64_t(res);
        p.buf += res;
        p.len -= size_t(res);
        again = true;
      }
    }
    std::shared_ptr<IoRequest> done_req;
    {
      std::lock_guard<std::mutex> lk(mu);
      finished_locked();
      if (again)
        (p.req->urgent ? urgent : queue).push_front(p);
      else if (--p.req->pieces == 0)
        done_req = p.req;
      issue_locked();
    }
    cv.notify_all();
    if (!done_req) return;
    const int err = done_req->err.load();
    if (err) {
      int expected = 0;
      first_err.compare_exchange_strong(expected, 2 * err + (done_req->write ? 1 : 0));
    }
    done_req->done(err);
    {
      std::lock_guard<std::mutex> lk(mu);
      --open_requests;
    }
    cv.notify_all();
  }

  int fixed_index_locked(const char* b, size_t n) const {
    for (size_t i = 0; i < fixed.size(); ++i)
      if (b >= fixed[i].base && b + n <= fixed[i].base + fixed[i].len) return int(i);
    return -1;
  }

  // Replaces the registered table (under mu, nothing in flight): 0 or -errno.
  int set_fixed_locked(const std::vector<FixedBuffer>& table) {
#ifdef SF_HAVE_LIBURING
    if (!fixed.empty()) {
      io_uring_unregister_buffers(&ring);
      fixed.clear();
    }
    if (table.empty()) return 0;
    if (o.faults.refuse_registration) return -ENOMEM;
    std::vector<iovec> iov;
    for (const FixedBuffer& f : table) iov.push_back({const_cast<char*>(f.base), f.len});
    const int r = io_uring_register_buffers(&ring, iov.data(), unsigned(iov.size()));
    if (r == 0) fixed = table;
    return r;
#else
    (void)table;
    return -EOPNOTSUPP;
#endif
  }

  // The table without `drop`'s entries and with [add, add + bytes): once nothing is in flight and
  // the reaper has left the kernel (new pieces wait in the queue meanwhile). False when the kernel
  // refuses: said once, and no more attempts.
  bool change_fixed(const void* add, size_t bytes, const void* drop) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return !registering; });
    if (!uring || fixed_refused) return false;
    std::vector<FixedBuffer> table;
    for (const FixedBuffer& f : fixed)
      if (f.owner != drop) table.push_back(f);
    for (size_t at = 0; add && at < bytes; at += kFixedMax)
      table.push_back({static_cast<const char*>(add) + at, std::min(kFixedMax, bytes - at), add});
    if (table.size() == fixed.size() && !add) return true;  // nothing of `drop` was registered
    registering = true;
    cv.wait(lk, [&] { return inflight == 0; });
    const int r = pause_reaper_locked(lk) ? set_fixed_locked(table) : -EBUSY;
    if (r != 0) {
      fixed_refused = true;
      fixed.clear();
    }
    registering = reaper_paused = false;
    issue_locked();
    lk.unlock();
    cv.notify_all();
    if (r == 0) return true;
    log_info("offload dir %s: io_uring did not register the store's buffers (%s; locked-memory limit %s, "
             "`ulimit -l`): plain reads and writes from here on",
             o.dir.c_str(), std::strerror(-r), memlock_limit().c_str());
    return false;
  }

  // The reaper out of io_uring_enter, waiting on cv until registering ends (under mu, nothing in
  // flight): a marker NOP wakes it. False when the NOP cannot be submitted.
  bool pause_reaper_locked(std::unique_lock<std::mutex>& lk) {
#ifdef SF_HAVE_LIBURING
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (!sqe) return false;
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, &reaper_paused);
    if (io_uring_submit(&ring) < 1) return false;
    cv.wait(lk, [&] { return reaper_paused; });
    return true;
#else
    (void)lk;
    return false;
#endif
  }

  // io_uring: the pieces the depth allows go to the ring (under mu), on registered buffers where
  // they lie in one. The workers take theirs.
  void issue_locked() {
#ifdef SF_HAVE_LIBURING
    if (!uring || registering) return;
    int n = 0;
    while (waiting_locked() && inflight < o.depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;
      IoPiece* p = new IoPiece(take_locked());
      p->fixed = fixed_index_locked(p->buf, p->len);
      if (p->fixed >= 0) {
        if (p->req->write)
          io_uring_prep_write_fixed(sqe, fd, p->buf, unsigned(p->len), p->off, p->fixed);
        else
          io_uring_prep_read_fixed(sqe, fd, p->buf, unsigned(p->len), p->off, p->fixed);
        ++fixed_issued;
      } else if (p->req->write) {
        io_uring_prep_write(sqe, fd, p->buf, unsigned(p->len), p->off);
      } else {
        io_uring_prep_read(sqe, fd, p->buf, unsigned(p->len), p->off);
      }
      io_uring_sqe_set_data(sqe, p);
      started_locked();
      ++n;
    }
    if (n > 0) {
      const int r = io_uring_submit(&ring);
      SF_CHECK(r >= 0, std::string("io_uring_submit: ") + std::strerror(-r));
    }
#endif
  }

#ifdef SF_HAVE_LIBURING
  void reaper() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring, &cqe);
      if (r == -EINTR) continue;
      SF_CHECK(r == 0, std::string("io_uring_wait_cqe: ") + std::strerror(-r));
      void* data = io_uring_cqe_get_data(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (!data) return;  // the stop marker (a NOP)
      if (data == &reaper_paused) {  // change_fixed's marker: wait here until it is done
        std::unique_lock<std::mutex> lk(mu);
        reaper_paused = true;
        cv.notify_all();
        cv.wait(lk, [&] { return !reaper_paused; });
        continue;
      }
      IoPiece* p = static_cast<IoPiece*>(data);
      IoPiece piece;
      {
        // The submitter wrote *p under mu: taking it here orders the two for the thread sanitizer,
        // which cannot see the ordering through the kernel's ring.
        std::lock_guard<std::mutex> lk(mu);
        piece = std::move(*p);
        delete p;
      }
      complete(std::move(piece), res);
    }
  }
#endif

  void worker() {
    for (;;) {
      IoPiece p;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stopping || waiting_locked(); });
        if (!waiting_locked()) return;
        p = take_locked();
        started_locked();
      }
      const ssize_t n = p.req->write ? ::pwrite(fd, p.buf, p.len, off_t(p.off)) : ::pread(fd, p.buf, p.len, off_t(p.off));
      complete(std::move(p), n < 0 ? -ssize_t(errno) : n);
    }
  }

  void start() {
#ifdef SF_HAVE_LIBURING
    if (o.uring) {
      const int r = io_uring_queue_init(unsigned(std::max(o.depth, 1)) * 2, &ring, 0);
      if (r == 0) {
        uring = true;
        threads.emplace_back([this] { reaper(); });
        return;
      }
      log_info("offload dir %s: io_uring unavailable (%s); worker threads do the I/O", o.dir.c_str(),
               std::strerror(-r));
    }
#endif
    for (int i = 0; i < std::max(o.depth, 1); ++i) threads.emplace_back([this] { worker(); });
  }

  void stop() {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return open_requests == 0; });
      stopping = true;
    }
    cv.notify_all();
#ifdef SF_HAVE_LIBURING
    if (uring) {
      {
        std::lock_guard<std::mutex> lk(mu);
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        if (sqe) {
          io_uring_prep_nop(sqe);
          io_uring_sqe_set_data(sqe, nullptr);
          io_uring_submit(&ring);
        }
      }
      for (std::thread& t : threads) t.join();
      io_uring_queue_exit(&ring);
      return;
    }
#endif
    for (std::thread& t : threads) t.join();
  }

  // A cuFile transfer, blocking: short ones continued, faults injected, counted as the others.
  void gpu_transfer(bool write, uint64_t off, char* dev, size_t bytes, const NvmeStore& s) {
    SF_CHECK(cufile, "store: no GPUDirect Storage (StoreOptions::cufile)");
    SF_CHECK(off % kAlign == 0 && off + bytes <= aligned(o.bytes), "store GPU transfer: unaligned or past the end");
    {
      std::lock_guard<std::mutex> lk(mu);
      started_locked();
    }
    bool shortened = false;
    int err = 0;
    std::string detail;
    while (bytes > 0 && err == 0) {
      ssize_t r = write ? cufile->write(cufile_handle, dev, bytes, off, detail)
                        : cufile->read(cufile_handle, dev, bytes, off, detail);
      r = inject(r, bytes, write, shortened);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r <= 0) {
        err = r < 0 ? int(-r) : (write ? ENOSPC : EIO);
        break;
      }
      (write ? wr : rd) += uint64_t(r);
      gpu_moved += uint64_t(r);
      off += uint64_t(r);
      dev += r;
      bytes -= size_t(r);
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      finished_locked();
    }
    if (err == 0) return;
    int expected = 0;
    first_err.compare_exchange_strong(expected, 2 * err + (write ? 1 : 0));
    throw std::runtime_error(s.error_text(write, err) + (detail.empty() ? "" : " (" + detail + ")"));
  }

  void gpu_worker(const NvmeStore& s) {
    cufile->bind_thread();
    for (;;) {
      GpuJob* j;
      {
        std::unique_lock<std::mutex> lk(gpu_mu);
        gpu_cv.wait(lk, [&] { return gpu_stop || !gpu_jobs.empty(); });
        if (gpu_jobs.empty()) return;
        j = gpu_jobs.front();
        gpu_jobs.pop_front();
      }
      try {
        gpu_transfer(j->write, j->off, j->dev, j->bytes, s);
      } catch (...) {
        j->error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(gpu_mu);
        j->done = true;
      }
      gpu_cv.notify_all();
    }
  }

  // A cuFile transfer on the store's thread, the caller waiting; its error rethrown here.
  void gpu_wait(bool write, uint64_t off, char* dev, size_t bytes) {
    GpuJob j{write, off, dev, bytes, false, nullptr};
    std::unique_lock<std::mutex> lk(gpu_mu);
    gpu_jobs.push_back(&j);
    gpu_cv.notify_all();
    gpu_cv.wait(lk, [&] { return j.done; });
    if (j.error) std::rethrow_exception(j.error);
  }

  void gpu_stop_thread() {
    if (!gpu_thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(gpu_mu);
      gpu_stop = true;
    }
    gpu_cv.notify_all();
    gpu_thread.join();
  }

  // A synchronous transfer of aligned ranges.
  int transfer_sync(bool write, uint64_t off, char* buf, size_t bytes) {
    std::mutex m;
    std::condition_variable c;
    bool done = false;
    int err = 0;
    auto r = std::make_shared<IoRequest>();
    r->write = write;
    r->urgent = true;
    r->done = [&](int e) {
      std::lock_guard<std::mutex> lk(m);
      err = e;
      done = true;
      c.notify_all();
    };
    enqueue(r, off, buf, bytes);
    std::unique_lock<std::mutex> lk(m);
    c.wait(lk, [&] { return done; });
    return err;
  }
};

NvmeStore::NvmeStore(const StoreOptions& o) : impl_(std::make_unique<Impl>(o)) {
  Impl& s = *impl_;
  SF_CHECK(o.piece >= kAlign && o.piece % kAlign == 0, "store piece size must be a multiple of 4096");
  struct stat st{};
  if (::stat(o.dir.c_str(), &st) != 0)
    input_error_naming(o.dir, {std::string("cannot use as the offload directory: ") + std::strerror(errno) + " (",
                               Setting::OffloadDir, ")"});
  if (!S_ISDIR(st.st_mode)) input_error_naming(o.dir, {"is not a directory (", Setting::OffloadDir, ")"});
  s.fd = open_store_file(o.dir, o.direct, s.direct);
  const uint64_t bytes = aligned(o.bytes);
  if (bytes > 0) {
    int err = ::fallocate(s.fd, 0, 0, off_t(bytes)) == 0 ? 0 : errno;
    if (err == EOPNOTSUPP || err == ENOSYS) err = ::posix_fallocate(s.fd, 0, off_t(bytes));
    if (err != 0) {
      ::close(s.fd);
      s.fd = -1;
      input_error_naming(o.dir, {"cannot reserve " + format_bytes(bytes) + " for the offload file (" +
                                     format_bytes(free_disk_bytes(o.dir)) + " free): " + std::strerror(err) + " (",
                                 Setting::OffloadDir, ")"});
    }
  }
  if (!o.cufile.empty()) {
    std::string why;
    s.cufile = CuFile::open(o.cufile, why);
    if (s.cufile) s.cufile_handle = s.cufile->register_file(s.fd, why);
    if (!s.cufile_handle) {
      ::close(s.fd);
      s.fd = -1;
      throw std::runtime_error("offload dir " + o.dir + ": GPUDirect Storage was chosen at start-up but " + why +
                               " (SF_CUFILE=0 turns it off)");
    }
  }
  if (s.cufile_handle) s.gpu_thread = std::thread([this] { impl_->gpu_worker(*this); });
  s.start();
}

NvmeStore::~NvmeStore() {
  if (!impl_) return;
  impl_->gpu_stop_thread();
  impl_->stop();
  if (impl_->cufile) impl_->cufile->deregister_file(impl_->cufile_handle);
  if (impl_->fd >= 0) ::close(impl_->fd);
}

bool NvmeStore::gpu_direct() const { return impl_->cufile_handle != nullptr; }

std::string NvmeStore::gpu_how() const {
  return impl_->cufile ? "cuFile (" + impl_->cufile->library() + ", " + impl_->cufile->mode() + ")" : std::string();
}

void NvmeStore::gpu_read_wait(uint64_t offset, void* dev, size_t bytes) {
  SF_CHECK(gpu_direct(), "store: no GPUDirect Storage (StoreOptions::cufile)");
  impl_->gpu_wait(false, offset, static_cast<char*>(dev), bytes);
}

void NvmeStore::gpu_write_wait(uint64_t offset, const void* dev, size_t bytes) {
  SF_CHECK(gpu_direct(), "store: no GPUDirect Storage (StoreOptions::cufile)");
  impl_->gpu_wait(true, offset, const_cast<char*>(static_cast<const char*>(dev)), bytes);
}

bool NvmeStore::gpu_register(const void* dev, size_t bytes) {
  return impl_->cufile && impl_->cufile->register_buffer(dev, bytes);
}

void NvmeStore::gpu_unregister(const void* dev) {
  if (impl_->cufile) impl_->cufile->deregister_buffer(dev);
}

uint64_t NvmeStore::gpu_bytes() const { return impl_->gpu_moved.load(); }

void NvmeStore::read(uint64_t offset, void* buf, size_t bytes, Done done, bool urgent) {
  SF_CHECK(offset % kAlign == 0 && bytes % kAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kAlign == 0,
           "store read: unaligned");
  SF_CHECK(offset + bytes <= capacity(), "store read past the end");
  auto r = std::make_shared<IoRequest>();
  r->urgent = urgent;
  r->done = std::move(done);
  impl_->enqueue(std::move(r), offset, static_cast<char*>(buf), bytes);
}

void NvmeStore::write(uint64_t offset, const void* buf, size_t bytes, Done done, bool urgent) {
  SF_CHECK(offset % kAlign == 0 && bytes % kAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kAlign == 0,
           "store write: unaligned");
  SF_CHECK(offset + bytes <= capacity(), "store write past the end");
  auto r = std::make_shared<IoRequest>();
  r->write = true;
  r->urgent = urgent;
  r->done = std::move(done);
  impl_->enqueue(std::move(r), offset, const_cast<char*>(static_cast<const char*>(buf)), bytes);
}

namespace {
constexpr size_t kBounce = size_t(16) << 20;  // the synchronous transfers' window

// An aligned bounce buffer of kBounce bytes.
struct Bounce {
  HostBuffer mem{kBounce + NvmeStore::kAlign};
  char* data() const {
    return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mem.data()) + NvmeStore::kAlign - 1) /
                                   NvmeStore::kAlign * NvmeStore::kAlign);
  }
};
}  // namespace

void NvmeStore::read_sync(uint64_t offset, void* dst, size_t bytes) {
  SF_CHECK(offset + bytes <= capacity(), "store read past the end");
  Bounce b;
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const uint64_t lo = offset / kAlign * kAlign;
    const size_t n = std::min(bytes, size_t(lo + kBounce - offset));
    const size_t span = size_t(aligned(offset + n) - lo);
    const int err = impl_->transfer_sync(false, lo, b.data(), span);
    if (err) throw std::runtime_error(error_text(false, err));
    std::memcpy(out, b.data() + (offset - lo), n);
    out += n;
    offset += n;
    bytes -= n;
  }
}

void NvmeStore::write_sync(uint64_t offset, const void* src, size_t bytes) {
  SF_CHECK(offset + bytes <= capacity(), "store write past the end");
  Bounce b;
  const char* in = static_cast<const char*>(src);
  while (bytes > 0) {
    const uint64_t lo = offset / kAlign * kAlign;
    const size_t n = std::min(bytes, size_t(lo + kBounce - offset));
    const size_t span = size_t(aligned(offset + n) - lo);
    if (offset != lo || n != span) {  // partial blocks at the edges: read them first
      const int err = impl_->transfer_sync(false, lo, b.data(), span);
      if (err) throw std::runtime_error(error_text(false, err));
    }
    std::memcpy(b.data() + (offset - lo), in, n);
    const int err = impl_->transfer_sync(true, lo, b.data(), span);
    if (err) throw std::runtime_error(error_text(true, err));
    in += n;
    offset += n;
    bytes -= n;
  }
}

void NvmeStore::read_wait(uint64_t offset, void* buf, size_t bytes) {
  SF_CHECK(offset % kAlign == 0 && bytes % kAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kAlign == 0,
           "store read: unaligned");
  SF_CHECK(offset + bytes <= capacity(), "store read past the end");
  const int err = impl_->transfer_sync(false, offset, static_cast<char*>(buf), bytes);
  if (err) throw std::runtime_error(error_text(false, err));
}

void NvmeStore::write_wait(uint64_t offset, const void* buf, size_t bytes) {
  SF_CHECK(offset % kAlign == 0 && bytes % kAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kAlign == 0,
           "store write: unaligned");
  SF_CHECK(offset + bytes <= capacity(), "store write past the end");
  const int err = impl_->transfer_sync(true, offset, const_cast<char*>(static_cast<const char*>(buf)), bytes);
  if (err) throw std::runtime_error(error_text(true, err));
}

bool NvmeStore::register_buffer(const void* buf, size_t bytes) {
  SF_CHECK(buf && bytes > 0, "store: registering an empty buffer");
  return impl_->change_fixed(buf, bytes, nullptr);
}

void NvmeStore::unregister_buffer(const void* buf) { impl_->change_fixed(nullptr, 0, buf); }

uint64_t NvmeStore::fixed_pieces() const { return impl_->fixed_issued.load(); }


void NvmeStore::check() const {
  if (const int e = impl_->first_err.load()) throw std::runtime_error(error_text(e % 2 == 1, e / 2));
}

void NvmeStore::drain() {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->cv.wait(lk, [&] { return impl_->open_requests == 0; });
}

uint64_t NvmeStore::capacity() const { return aligned(impl_->o.bytes); }
const std::string& NvmeStore::dir() const { return impl_->o.dir; }
std::string NvmeStore::how() const {
  std::string t = std::string(impl_->uring ? "io_uring" : "worker threads") + (impl_->direct ? ", O_DIRECT" : ", page cache");
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<const void*> owners;
  for (const FixedBuffer& f : impl_->fixed)
    if (owners.empty() || owners.back() != f.owner) owners.push_back(f.owner);
  if (!owners.empty()) t += ", " + std::to_string(owners.size()) + " registered buffer" + (owners.size() > 1 ? "s" : "");
  if (impl_->fixed_refused) t += ", buffers not registered";
  return t;
}
uint64_t NvmeStore::bytes_read() const { return impl_->rd.load(); }
uint64_t NvmeStore::bytes_written() const { return impl_->wr.load(); }
double NvmeStore::busy_seconds() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  uint64_t ns = impl_->busy_ns.load();
  if (impl_->inflight > 0)
    ns += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - impl_->busy_since).count());
  return double(ns) * 1e-9;
}

std::string NvmeStore::error_text(bool write, int err) const {
  return "offload dir " + impl_->o.dir + ": " + (write ? "writing" : "reading") + " the offload file failed: " +
         std::strerror(err);
}

}  // namespace sf
