#include "engine/disk_rate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/test_hooks.h"
#include "core/error.h"

namespace sf {

namespace {

constexpr size_t kAlign = 4096;  // O_DIRECT: offsets, sizes and buffers aligned to the logical block

// The scratch file: created exclusively by us, so removing it never touches anything else.
class ScratchFile {
 public:
  ScratchFile(const std::string& dir) {
    static std::atomic<int> counter{0};
    path_ = dir + "/.slideformer-disk-probe." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      const int err = errno;
      if (err == EINVAL)
        input_error(dir, "its file system does not support O_DIRECT (tmpfs?); the NVMe store needs a real disk");
      input_error(dir, std::string("cannot create a scratch file to measure the disk: ") + std::strerror(err));
    }
  }
  ~ScratchFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One phase: `in_flight` threads take the next block until `blocks` are done or the time is up.
// Returns the bytes moved and the seconds (with fdatasync for writes); errno of the first failure.
struct PhaseResult {
  size_t bytes = 0;
  double seconds = 0;
  int err = 0;
};
PhaseResult run_phase(int fd, bool write, size_t blocks, const DiskProbeOptions& o, std::vector<char*>& bufs) {
  std::atomic<size_t> next{0}, done_bytes{0};
  std::atomic<int> first_err{0};
  const auto t0 = std::chrono::steady_clock::now();
  auto worker = [&](char* buf) {
    for (;;) {
      if (first_err.load() != 0) return;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= o.seconds) return;
      const size_t i = next.fetch_add(1);
      if (i >= blocks) return;
      size_t off = 0;
      while (off < o.block_bytes) {
        const off_t at = off_t(i * o.block_bytes + off);
        const ssize_t n = write ? ::pwrite(fd, buf + off, o.block_bytes - off, at)
                                : ::pread(fd, buf + off, o.block_bytes - off, at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {  // 0: a short read or write that makes no progress (the file ended, the disk is full)
          int expected = 0;
          first_err.compare_exchange_strong(expected, n < 0 ? errno : (write ? ENOSPC : EIO));
          return;
        }
        off += size_t(n);
      }
      done_bytes += o.block_bytes;
    }
  };
  std::vector<std::thread> threads;
  for (char* b : bufs) threads.emplace_back(worker, b);
  for (auto& t : threads) t.join();
  PhaseResult r;
  r.err = first_err.load();
  if (write && r.err == 0 && ::fdatasync(fd) != 0) r.err = errno;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.bytes = done_bytes.load();
  return r;
}

}  // namespace

DiskProbeOptions disk_probe_options_from_env() {
  DiskProbeOptions o;
  const long long mib = test_hooks::disk_probe_mib();
  if (mib > 0) {
    o.max_bytes = size_t(mib) << 20;
    o.block_bytes = std::max(kAlign, std::min(size_t(64) << 20, o.max_bytes / 4) / kAlign * kAlign);
  }
  return o;
}

DiskRate measure_disk(const std::string& dir, const DiskProbeOptions& o) {
  if (o.block_bytes == 0 || o.block_bytes % kAlign != 0 || o.in_flight < 1 || o.seconds <= 0)
    input_error(dir, "disk probe: block size must be a positive multiple of 4096, with at least one request");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) input_error(dir, std::string("cannot measure the disk: ") + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) input_error(dir, "not a directory");
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) input_error(dir, std::string("statvfs: ") + std::strerror(errno));
  const size_t free_bytes = size_t(vfs.f_bavail) * size_t(vfs.f_frsize);
  const size_t blocks = std::min(o.max_bytes, free_bytes / 2) / o.block_bytes;
  if (blocks == 0)
    input_error(dir, "too little free space to measure the disk (" + std::to_string(free_bytes >> 20) + " MiB free)");

  std::vector<std::unique_ptr<char, FreeDeleter>> owned;
  std::vector<char*> bufs;
  for (int i = 0; i < o.in_flight; ++i) {
    char* p = static_cast<char*>(std::aligned_alloc(kAlign, o.block_bytes));
    if (!p) throw std::bad_alloc();
    owned.emplace_back(p);
    bufs.push_back(p);
    // Not zeros: some drives compress or skip them. A cheap pattern that differs per buffer.
    uint64_t x = 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
    for (size_t k = 0; k + 8 <= o.block_bytes; k += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(p + k, &x, 8);
    }
  }

  ScratchFile file(dir);
  // Preallocate (as the store does) so the writes measure the data path, not block allocation.
  if (::fallocate(file.fd(), 0, 0, off_t(blocks * o.block_bytes)) != 0 && errno != EOPNOTSUPP) {
    const int err = errno;
    input_error(dir, std::string("cannot preallocate the disk probe's scratch file: ") + std::strerror(err));
  }
  const PhaseResult w = run_phase(file.fd(), true, blocks, o, bufs);
  if (w.err) input_error(dir, std::string("disk probe: write failed: ") + std::strerror(w.err));
  const PhaseResult r = run_phase(file.fd(), false, w.bytes / o.block_bytes, o, bufs);
  if (r.err) input_error(dir, std::string("disk probe: read failed: ") + std::strerror(r.err));
  DiskRate d;
  d.bytes_written = w.bytes;
  d.bytes_read = r.bytes;
  d.free_bytes = double(free_bytes);
  d.write_gbs = w.seconds > 0 ? double(w.bytes) / w.seconds * 1e-9 : 0;
  d.read_gbs = r.seconds > 0 ? double(r.bytes) / r.seconds * 1e-9 : 0;
  return d;
}

}  // namespace sf
