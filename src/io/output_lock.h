// One run per output: an advisory lock (flock) on "<output>.sf-lock" beside the output directory
// (or file), held from before the output is claimed until the run ends. A second run (train, init,
// demo on the output directory; train --metrics FILE; grad --output FILE) on the same output,
// however it names it (a trailing slash, "..", a symbolic link), is refused with the holder's pid.
// The lock goes with the process: a killed run holds nothing.
#pragma once
#include <string>

namespace sf {

class OutputLock {
 public:
  enum class Kind { Directory, File };
  // Directory: check_output_dir(output) first, and its parent directories are created. File: its
  // directory must exist (InputError naming the file otherwise). Then takes the lock of `output`.
  // Held by a live process -> InputError naming the output, the holder's pid and the lock file.
  // `option` (e.g. "--metrics") names the file in a File's errors.
  explicit OutputLock(const std::string& output, Kind kind = Kind::Directory, const std::string& option = "");
  ~OutputLock();  // removes the lock file and releases the lock
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace sf
