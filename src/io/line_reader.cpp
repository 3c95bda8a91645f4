#include "io/line_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace sf {

namespace {
constexpr size_t kChunk = size_t(1) << 16;
}

LineReader::LineReader(const std::string& path, size_t max_line_bytes, std::optional<Setting> limit)
    : path_(path), limit_(limit), max_(max_line_bytes) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    input_error(path, err == ENOENT ? std::string("not found") : std::string("cannot open: ") + std::strerror(err));
  }
}

LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

// Appends the next chunk to buf_; false at the end of the file.
bool LineReader::fill() {
  if (eof_) return false;
  const size_t old = buf_.size();
  buf_.resize(old + kChunk);
  for (;;) {
    const ssize_t n = ::read(fd_, &buf_[old], kChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;  // e.g. EISDIR
      buf_.resize(old);
      input_error(path_, std::string("cannot read: ") + std::strerror(err));
    }
    buf_.resize(old + size_t(n));
    if (n == 0) eof_ = true;
    return n > 0;
  }
}

bool LineReader::next(std::string& line) {
  size_t scanned = pos_;
  for (;;) {
    const void* nl = std::memchr(buf_.data() + scanned, '\n', buf_.size() - scanned);
    const size_t end = nl ? size_t(static_cast<const char*>(nl) - buf_.data()) : buf_.size();
    if (end - pos_ > max_) {
      SettingText what = "line longer than the limit of " + std::to_string(max_) + " bytes";
      if (limit_) what += {" (raise it with ", *limit_, ")"};
      input_error_naming(path_ + ":" + std::to_string(lineno_ + 1), std::move(what));
    }
    if (nl) {
      line.assign(buf_, pos_, end - pos_);
      pos_ = end + 1;
      ++lineno_;
      return true;
    }
    // No newline yet: drop what was consumed, read more (never more than the limit plus a chunk).
    buf_.erase(0, pos_);
    scanned = buf_.size();
    pos_ = 0;
    if (!fill()) {
      if (buf_.empty()) return false;
      line.swap(buf_);
      buf_.clear();
      ++lineno_;
      return true;
    }
  }
}

}  // namespace sf
