#include "io/json_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sf {

namespace {

std::string read_text(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    input_error(path, err == ENOENT ? std::string("not found") : std::string("cannot open: ") + std::strerror(err));
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;  // e.g. EISDIR
      ::close(fd);
      input_error(path, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

template <class J>
J parse_text(const std::string& path, const std::string& text) {
  try {
    return J::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    input_error(path, "invalid JSON at byte " + std::to_string(e.byte) + ": " + describe_json_parse_error(e));
  }
}

}  // namespace

std::string describe_json_parse_error(const std::exception& e) {
  // Keep nlohmann's explanation (line/column, what was expected) minus "[json.exception...] parse error at ".
  std::string m = e.what();
  size_t p = m.find("] ");
  if (p != std::string::npos) m = m.substr(p + 2);
  const std::string noise = "parse error at ";
  if (m.compare(0, noise.size(), noise) == 0) m = m.substr(noise.size());
  return m;
}

nlohmann::json read_json_file(const std::string& path) { return parse_text<nlohmann::json>(path, read_text(path)); }

nlohmann::ordered_json read_ordered_json_file(const std::string& path) {
  return parse_text<nlohmann::ordered_json>(path, read_text(path));
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::string s = j.dump(2) + "\n";
  write_file_atomic(path, s.data(), s.size());
}

void write_json_file(const std::string& path, const nlohmann::ordered_json& j) {
  std::string s = j.dump(2) + "\n";
  write_file_atomic(path, s.data(), s.size());
}

}  // namespace sf
