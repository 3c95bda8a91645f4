#include "io/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/output_dir.h"
#include "io/written_paths.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

// The pid a holder wrote into the lock file ("?" when unreadable).
std::string holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "?";
  std::string s(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.find_first_not_of("0123456789") == std::string::npos && !s.empty() ? s : "?";
}

}  // namespace

OutputLock::OutputLock(const std::string& output, Kind kind, const std::string& option) {
  // "/", ".", a file, a foreign directory: refused before any lock file
  if (kind == Kind::Directory) check_output_dir(output);
  const std::string out = resolved_path(output);
  path_ = out + ".sf-lock";
  std::error_code ec;
  const fs::path parent = fs::path(out).parent_path();
  if (kind == Kind::File) {
    // A file's directory is not made here (nor by the run: it would fail later, having computed
    // everything); and no lock file goes into a directory that does not exist yet.
    if (!fs::is_directory(parent, ec))
      input_error(option.empty() ? output : option, (option.empty() ? "" : output + ": ") +
                                                       "cannot create the file: its directory " + parent.string() +
                                                       " does not exist");
  } else {
    fs::create_directories(parent, ec);
    if (ec) input_error(parent.string(), "cannot create directory: " + ec.message());
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0) input_error(path_, std::string("cannot create the output's lock file: ") + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string pid = holder_pid(fd_);
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK)
        input_error(output, "is in use by another slideformer run (pid " + pid + ", lock " + path_ +
                                "); wait for it to end or choose another output");
      input_error(path_, std::string("cannot lock: ") + std::strerror(err));
    }
    // The holder before us may have removed the file after we opened it: then our lock is on a
    // file no one else will open; take the one now at the path.
    struct stat a, b;
    if (::fstat(fd_, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
        // The pid only makes the refusal of a second run clearer; the lock holds without it.
      }
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  input_error(path_, "cannot take the output's lock (the lock file keeps changing)");
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held: a run that opened it before sees it gone and retries
  ::close(fd_);
}

}  // namespace sf
