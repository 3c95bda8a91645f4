// Line-by-line reading of text files (JSONL data, YAML configs) with a bound on the line length:
// never buffers more than the limit, so /dev/zero or a file without newlines is refused quickly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/error.h"

namespace sf {

class LineReader {
 public:
  // InputError naming `path` when it cannot be opened. `limit` (when given) is the setting that
  // sets max_line_bytes: the too-long message ends "(raise it with <setting>)".
  LineReader(const std::string& path, size_t max_line_bytes, std::optional<Setting> limit = std::nullopt);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\\n' (a last line without one counts); false at the end.
  // InputError("path:N: line longer than the limit of M bytes ...") past the limit.
  bool next(std::string& line);
  int64_t line_number() const { return lineno_; }

 private:
  bool fill();

  std::string path_;
  std::optional<Setting> limit_;
  size_t max_;
  int fd_ = -1;
  int64_t lineno_ = 0;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
};

}  // namespace sf
