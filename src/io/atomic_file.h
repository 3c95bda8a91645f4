// Crash-safe file replacement: data goes to a sibling temp file, is fsynced, then renamed over the
// final name, so readers see either the old complete file or the new complete file, never a prefix.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sf {

class AtomicFile {
 public:
  // Creates "<path>.tmp-<pid>-<rand>" next to `path`. Failures -> InputError naming `path`.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // not committed: the temp file is removed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);  // full write (retries partial writes / EINTR)
  // Overwrites bytes already written at `offset` (a header completed after the data); the file
  // position for write() is unchanged.
  void write_at(uint64_t offset, const void* data, size_t bytes);
  void commit();  // fsync, close, rename over `path`, fsync the directory
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Whole-buffer convenience wrapper.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);

// fsync a directory so a rename inside it survives a crash. Errors are InputErrors naming it, except
// EINVAL (a filesystem that cannot sync directories).
void fsync_dir(const std::string& dir);
// fsync a file written by someone else's code (a copy); errors as fsync_dir.
void fsync_file(const std::string& path);

// Test hook for the publishing steps of a save (renames, fsyncs, links): with the environment variable
// SF_CRASH_AT=N the process kills itself (SIGKILL) at the N-th call; SF_CRASH_TRACE=1 prints each call
// ("crash point N: what") to stderr. Without them it does nothing.
void crash_point(const char* what);

// Random hex suffix for sibling temp names; unique enough across processes together with the pid.
std::string unique_suffix();

}  // namespace sf
