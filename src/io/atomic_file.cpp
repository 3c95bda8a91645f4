#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/test_hooks.h"

namespace sf {

std::string unique_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%08llx", int(::getpid()), (unsigned long long)(rng() & 0xffffffffull));
  return buf;
}

namespace {

void fsync_path(const std::string& path, int flags) {
  crash_point("fsync");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | flags);
  if (fd < 0) input_error(path, std::string("cannot open to sync: ") + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) input_error(path, std::string("fsync failed: ") + std::strerror(err));
}

}  // namespace

void fsync_dir(const std::string& dir) { fsync_path(dir.empty() ? "." : dir, O_DIRECTORY); }
void fsync_file(const std::string& path) { fsync_path(path, 0); }

void crash_point(const char* what) {
  static const long crash_at = [] {
    return long(test_hooks::crash_at());
  }();
  static const bool trace = test_hooks::crash_trace();
  static std::atomic<long> calls{0};
  if (crash_at <= 0 && !trace) return;
  const long n = ++calls;
  if (trace) std::fprintf(stderr, "crash point %ld: %s\n", n, what);
  if (n == crash_at) ::kill(::getpid(), SIGKILL);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // O_EXCL + retry: never clobber another writer's temp file.
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp_ = path_ + ".tmp-" + unique_suffix();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  int err = errno;
  tmp_.clear();
  input_error(path_, std::string("cannot create file: ") + std::strerror(err));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  input_error(path_, what + ": " + std::strerror(err));
}

void AtomicFile::write(const void* data, size_t bytes) {
  SF_CHECK(fd_ >= 0 && !committed_, "AtomicFile::write after commit or failure");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux caps a single write at ~2 GiB; chunk explicitly so huge tensors need no special case.
    size_t n = std::min(bytes, size_t(1) << 30);
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    if (w == 0) fail("write failed", ENOSPC);
    p += w;
    bytes -= size_t(w);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  SF_CHECK(fd_ >= 0 && !committed_, "AtomicFile::write_at after commit or failure");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    size_t n = std::min(bytes, size_t(1) << 30);
    ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed", errno);
    }
    if (w == 0) fail("write failed", ENOSPC);
    p += w;
    offset += uint64_t(w);
    bytes -= size_t(w);
  }
}

void AtomicFile::commit() {
  SF_CHECK(fd_ >= 0 && !committed_, "AtomicFile::commit twice or after failure");
  crash_point("fsync file");
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  int fd = fd_;
  fd_ = -1;
  // close() can report deferred write errors (NFS, quota): treat like a failed write.
  if (::close(fd) != 0) fail("close failed", errno);
  crash_point("rename file");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename temp file into place", errno);
  committed_ = true;
  fsync_dir(std::filesystem::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  AtomicFile f(path);
  f.write(data, bytes);
  f.commit();
}

}  // namespace sf
