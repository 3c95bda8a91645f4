// Line-by-line reading of text files (JSONL data, YAML configs) with a bound on the line length:
// never buffers more than the limit, so /dev/zero or a file without newlines is refused quickly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sf {

class LineReader {
 public:
  // InputError naming `path` when it cannot be opened. `limit_hint` ends the too-long message
  // (e.g. "raise it with --max-record-bytes").
  LineReader(const std::string& path, size_t max_line_bytes, std::string limit_hint = "");
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\\n' (a last line without one counts); false at the end.
  // InputError("path:N: line longer than the limit of M bytes ...") past the limit.
  bool next(std::string& line);
  int64_t line_number() const { return lineno_; }

 private:
  bool fill();

  std::string path_, hint_;
  size_t max_;
  int fd_ = -1;
  int64_t lineno_ = 0;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
};

}  // namespace sf
