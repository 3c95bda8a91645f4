// Crash-safe file replacement: data goes to a sibling temp file, is fsynced, then renamed over the
// final name, so readers see either the old complete file or the new complete file, never a prefix.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sf {

class AtomicFile {
 public:
  // Creates "<path>.sf-tmp-<pid>-<rand>" next to `path` (a marked temporary name, see
  // marked_temp_name). Failures -> InputError naming `path`.
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
// The removals of temporaries and replaced outputs (remove_marked_tree) have crash points too.
void crash_point(const char* what);
// In-process tests (a forked child): kill at the n-th crash point from now (0: never).
void set_crash_point_for_test(long n);

// Random hex suffix for sibling temp names; unique enough across processes together with the pid.
std::string unique_suffix();

// The temporary names slideformer creates and may remove: "<base>.sf-<kind>-<pid>-<8 hex>" with
// kind "tmp" (being written), "old" (an old output stepped aside), "trash" (being removed). The
// tag is the mark: no user names a file so, and nothing without it is ever removed as a leftover.
inline constexpr const char* kTempKindTmp = "tmp";
inline constexpr const char* kTempKindOld = "old";
inline constexpr const char* kTempKindTrash = "trash";
std::string marked_temp_name(const std::string& base, const char* kind);
// Whether `name` (a file name, no directory) is marked_temp_name(base, kind) of some process; its
// base and pid in *base_out / *pid_out when given.
bool parse_marked_temp(const std::string& name, const char* kind, std::string* base_out = nullptr,
                       long* pid_out = nullptr);
// `name` without its marked-temporary tags ("out" for "out.sf-tmp-1-0000abcd").
std::string unmarked_name(std::string name);
// Whether process `pid` is gone (then its marked temporaries are leftovers); never true for us.
bool process_gone(long pid);

// Removes a file or directory tree that slideformer wrote, kill-safely: it is first renamed to a
// marked "trash" name beside it (one atomic step), then removed entry by entry (crash points at
// the rename and before each directory's rmdir), so a kill at any moment leaves either the whole tree under its name or a marked trash
// name that the next run on the output removes. Symbolic links are removed, never followed.
// Errors are InputErrors naming the path.
void remove_marked_tree(const std::string& path);
// The removal half of remove_marked_tree, for a tree already under a marked name.
void remove_tree(const std::string& path);

}  // namespace sf
