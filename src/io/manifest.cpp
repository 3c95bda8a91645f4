#include "io/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/output_dir.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "slideformer-manifest-1";
// A safetensors header is at most 100 MB (safetensors.cpp refuses larger ones).
constexpr uint64_t kMaxManifestHeaderBytes = 100ull << 20;

std::string hex8(uint32_t c) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", c);
  return buf;
}

bool is_safetensors(const std::string& name) { return name.size() > 12 && name.ends_with(".safetensors"); }

// What the manifest records of a file: its size, and the CRC-32C of all of it or (safetensors) of
// its header only. `limit`: bytes to cover (all, or the header).
struct FileSum {
  uint64_t size = 0;
  uint32_t crc = 0;
};

FileSum sum_file(const std::string& path, bool header_only) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) input_error(path, errno == ENOENT ? std::string("missing (the manifest lists it)")
                                                : std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    input_error(path, "not a regular file");
  }
  FileSum s;
  s.size = uint64_t(st.st_size);
  uint64_t limit = s.size;
  std::vector<char> buf(size_t(1) << 20);
  uint64_t done = 0;
  while (done < limit) {
    const ssize_t n = ::read(fd, buf.data(), size_t(std::min<uint64_t>(buf.size(), limit - done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      input_error(path, std::string("cannot read: ") + std::strerror(err));
    }
    if (header_only && done == 0) {  // the header's length is in its first 8 bytes
      uint64_t len = 0;
      for (int i = 7; i >= 0 && n >= 8; --i) len = (len << 8) | uint8_t(buf[size_t(i)]);
      limit = n >= 8 && len <= kMaxManifestHeaderBytes ? std::min<uint64_t>(s.size, 8 + len) : uint64_t(n);
    }
    const uint64_t take = std::min<uint64_t>(uint64_t(n), limit - done);
    s.crc = crc32c(buf.data(), size_t(take), s.crc);
    done += take;
  }
  ::close(fd);
  return s;
}

bool listed_file(const fs::directory_entry& e) {
  const std::string n = e.path().filename().string();
  std::error_code ec;
  return e.is_regular_file(ec) && !e.is_symlink(ec) && n != kManifestName && n != kOutputMarker &&
         unmarked_name(n) == n && !n.ends_with(".sf-lock");
}

}  // namespace

void write_manifest(const std::string& dir) {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (listed_file(e)) names.push_back(e.path().filename().string());
  if (ec) input_error(dir, "cannot list directory: " + ec.message());
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const bool header_only = is_safetensors(n);
    const FileSum s = sum_file((fs::path(dir) / n).string(), header_only);
    files[n] = {{"size", s.size}, {header_only ? "header_crc32c" : "crc32c", hex8(s.crc)}};
  }
  write_json_file((fs::path(dir) / kManifestName).string(), nlohmann::ordered_json{{"format", kFormat}, {"files", files}});
}

bool verify_manifest(const std::string& dir, const std::vector<std::string>& required) {
  const std::string mpath = (fs::path(dir) / kManifestName).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(mpath, ec))) return false;
  const nlohmann::json m = read_json_file(mpath);
  const JsonRef root(m, mpath);
  root.expect_object();
  if (root.at("format").as_string() != kFormat)
    root.at("format").fail("unknown manifest format (written by a newer slideformer?)");
  const JsonRef files = root.at("files");
  files.expect_object();
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const std::string& n = it.key();
    const JsonRef entry = files.at(n);
    if (n.empty() || n.find('/') != std::string::npos || n == "." || n == "..")
      entry.fail("not a file name of this directory");
    const bool header_only = entry.has("header_crc32c");
    const std::string want = entry.at(header_only ? "header_crc32c" : "crc32c").as_string(8);
    const uint64_t want_size = uint64_t(entry.at("size").as_int(0, INT64_MAX, false));
    const std::string path = (fs::path(dir) / n).string();
    const FileSum s = sum_file(path, header_only);
    if (s.size != want_size)
      input_error(path, "is " + std::to_string(s.size) + " bytes, the manifest " + mpath + " says " +
                            std::to_string(want_size) +
                            " (the file was changed or is corrupt; if you edited it, --no-verify skips this check)");
    if (hex8(s.crc) != want)
      input_error(path, std::string(header_only ? "header " : "") + "CRC-32C " + hex8(s.crc) +
                            " does not match " + want + " in " + mpath +
                            " (the file was changed or is corrupt; if you edited it, --no-verify skips this check)");
  }
  for (const std::string& r : required)
    if (!m["files"].contains(r)) input_error(mpath, "does not list " + r);
  return true;
}

}  // namespace sf
