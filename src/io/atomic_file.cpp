#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
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
#include <vector>

#include "core/error.h"
#include "core/test_hooks.h"

namespace sf {

std::string unique_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%08llx", int(::getpid()), (unsigned long long)(rng() & 0xffffffffull));
  return buf;
}

std::string marked_temp_name(const std::string& base, const char* kind) {
  return base + ".sf-" + kind + "-" + unique_suffix();
}

bool parse_marked_temp(const std::string& name, const char* kind, std::string* base_out, long* pid_out) {
  // <base>.sf-<kind>-<digits>-<8 hex>, parsed from the end (the base may hold anything).
  if (name.size() < 9) return false;
  const std::string hex = name.substr(name.size() - 8);
  if (hex.find_first_not_of("0123456789abcdef") != std::string::npos || name[name.size() - 9] != '-') return false;
  const std::string rest = name.substr(0, name.size() - 9);  // <base>.sf-<kind>-<digits>
  const size_t dash = rest.rfind('-');
  if (dash == std::string::npos || dash + 1 == rest.size() || rest.size() - dash - 1 > 9) return false;
  const std::string digits = rest.substr(dash + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const std::string tag = std::string(".sf-") + kind;
  if (dash < tag.size() || rest.compare(dash - tag.size(), tag.size(), tag) != 0) return false;
  if (base_out) *base_out = rest.substr(0, dash - tag.size());
  if (pid_out) *pid_out = std::strtol(digits.c_str(), nullptr, 10);
  return true;
}

bool process_gone(long pid) {
  if (pid == long(::getpid())) return false;
  return !(pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM));
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    input_error(path, std::string("cannot remove: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) names.push_back(e.path().string());
    if (ec) input_error(path, "cannot list directory: " + ec.message());
    for (const std::string& n : names) remove_tree(n);
    crash_point("remove dir");
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) input_error(path, std::string("cannot remove: ") + std::strerror(errno));
    return;
  }
  // No crash point per file: a kill between two unlinks leaves the same kind of part-removed
  // trash tree as one before a directory's rmdir (which has one), and the kill tests stay short.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) input_error(path, std::string("cannot remove: ") + std::strerror(errno));
}

std::string unmarked_name(std::string name) {
  for (bool again = true; again;) {
    again = false;
    for (const char* kind : {kTempKindTmp, kTempKindOld, kTempKindTrash}) {
      std::string base;
      if (parse_marked_temp(name, kind, &base)) {
        name = base;
        again = true;
      }
    }
  }
  return name;
}

void remove_marked_tree(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  // Named after the unmarked base ("out.sf-trash-..." also for "out.sf-tmp-..."), so that the next
  // run on "out" finds it.
  const std::filesystem::path fp(p);
  const std::string trash =
      (fp.parent_path() / marked_temp_name(unmarked_name(fp.filename().string()), kTempKindTrash)).string();
  crash_point("rename to trash");
  if (::rename(p.c_str(), trash.c_str()) != 0) {
    if (errno == ENOENT) return;
    input_error(p, std::string("cannot move aside for removal: ") + std::strerror(errno));
  }
  remove_tree(trash);
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

namespace {
std::atomic<long> g_crash_calls{0};
std::atomic<long> g_crash_at{-1};  // -1: not read from the environment yet
}  // namespace

void set_crash_point_for_test(long n) {
  g_crash_at = n;
  g_crash_calls = 0;
}

void crash_point(const char* what) {
  if (g_crash_at < 0) {
    long expected = -1;
    g_crash_at.compare_exchange_strong(expected, std::max(0L, long(test_hooks::crash_at())));
  }
  static const bool trace = test_hooks::crash_trace();
  if (g_crash_at <= 0 && !trace) return;
  const long n = ++g_crash_calls;
  if (trace) std::fprintf(stderr, "crash point %ld: %s\n", n, what);
  if (n == g_crash_at) ::kill(::getpid(), SIGKILL);
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // O_EXCL + retry: never clobber another writer's temp file.
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp_ = marked_temp_name(path_, kTempKindTmp);
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
