#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/atomic_file.h"
#include "io/json_file.h"

namespace sf {

namespace {

using nlohmann::json;

// Headers of real checkpoints are well under 1 MB; anything this big is corruption, not a model.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Non-negative JSON integer (floats like 2.0 are rejected: the format stores integers).
bool get_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = uint64_t(x);
    return true;
  }
  return false;
}

std::string crc_hex(uint32_t c) {
  static const char* digits = "0123456789abcdef";
  std::string h(8, '0');
  for (int i = 7; i >= 0; --i, c >>= 4) h[size_t(i)] = digits[c & 0xFu];
  return h;
}

std::string offsets_string(uint64_t b, uint64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + "]"; }

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::optional<DType> parse_supported_dtype(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  return std::nullopt;
}

// ---------------------------------------------------------------- reading

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      tensors_(std::move(o.tensors_)),
      by_name_(std::move(o.by_name_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tensors_ = std::move(o.tensors_);
    by_name_ = std::move(o.by_name_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

namespace {

// The whole file mapped read-only; the descriptor is closed (the mapping keeps the file alive).
struct Mapping {
  void* addr = nullptr;
  uint64_t size = 0;
};

Mapping map_regular_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    input_error(path, err == ENOENT ? std::string("not found") : std::string("cannot open: ") + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    input_error(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    input_error(path, "not a regular file");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    input_error(path, "file is " + std::to_string(size) + " bytes, too short for a safetensors header (truncated?)");
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (m == MAP_FAILED) input_error(path, std::string("cannot mmap: ") + std::strerror(map_err));
  return {m, size};
}

// The u64 little-endian header length, bounded by the limit and by the file.
uint64_t header_length(const std::string& path, const uint8_t* base, uint64_t size) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian on any host
  if (header_len > kMaxHeaderBytes)
    input_error(path,
                "header length " + std::to_string(header_len) + " is absurd (limit 100 MB); not a safetensors file?");
  if (header_len > size - 8)
    input_error(path, "header length " + std::to_string(header_len) + " exceeds the file size (" +
                          std::to_string(size) + " bytes); truncated?");
  return header_len;
}

// The header JSON: depth-checked, an object, no tensor named twice.
json parse_header(const std::string& path, const char* hbeg, const char* hend) {
  // nlohmann keeps the last of duplicate keys silently; a callback spots duplicate tensor names.
  std::set<std::string> seen;
  std::string duplicate;
  json header;
  // Real headers nest 3 deep; the limit is checked on the bytes, so the parser and everything after
  // it (dump() in messages, destruction) never see deep input.
  check_json_depth(path, hbeg, hend, kJsonMaxDepth);
  check_json_text(path, hbeg, hend);  // a NUL ends nlohmann's input: the rest would be ignored
  try {
    header = json::parse(hbeg, hend, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth == 1 && ev == json::parse_event_t::key && duplicate.empty()) {
        std::string k = parsed.get<std::string>();
        if (!seen.insert(k).second) duplicate = k;
      }
      return true;
    });
  } catch (const json::parse_error& e) {
    input_error(path, "invalid header JSON at byte " + std::to_string(e.byte) + ": " + describe_json_parse_error(e));
  } catch (const json::exception& e) {  // out_of_range 406: a number like 1e400
    input_error(path, "invalid header JSON: " + describe_json_parse_error(e));
  }
  if (!header.is_object()) input_error(path, "header is not a JSON object");
  if (!duplicate.empty()) input_error(path, "header lists \"" + duplicate + "\" twice");
  return header;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& v) {
  if (!v.is_object()) input_error(path, "__metadata__ is not an object");
  std::map<std::string, std::string> out;
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string()) input_error(path, "__metadata__ value for \"" + m.key() + "\" is not a string");
    out[m.key()] = m.value().get<std::string>();
  }
  return out;
}

// The shape's dimensions; their byte count (times elem_bytes) in *nbytes, with overflow checks: a
// hostile shape must not wrap around to a valid size.
std::vector<int64_t> parse_shape(const std::string& path, const std::string& where, const json& sh, uint64_t elem_bytes,
                                 uint64_t* nbytes) {
  if (!sh.is_array()) input_error(path, where + "shape is not an array");
  std::vector<int64_t> shape;
  *nbytes = elem_bytes;
  for (const json& d : sh) {
    if (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0)
      input_error(path, where + "negative dimension " + std::to_string(d.get<int64_t>()) + " in shape");
    uint64_t dim;
    if (!get_u64(d, &dim)) input_error(path, where + "shape has a non-integer dimension " + d.dump());
    if (dim > uint64_t(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(*nbytes, dim, nbytes))
      input_error(path, where + "shape " + sh.dump() + " is absurdly large");
    shape.push_back(int64_t(dim));
  }
  return shape;
}

// Where a tensor's bytes lie in the data area.
struct Range {
  uint64_t begin, end;
  size_t idx;
};

// One tensor's header entry: dtype, shape, and data_offsets inside the data area and matching the shape.
TensorInfo parse_tensor_entry(const std::string& path, const std::string& name, const json& v, const uint8_t* data,
                              uint64_t data_size, Range* range) {
  const std::string where = "tensor " + name + ": ";
  if (!v.is_object()) input_error(path, where + "header entry is not an object");
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end()) input_error(path, where + "missing dtype");
  if (sh == v.end()) input_error(path, where + "missing shape");
  if (off == v.end()) input_error(path, where + "missing data_offsets");
  if (!dt->is_string()) input_error(path, where + "dtype is not a string");
  std::string dname = dt->get<std::string>();
  auto dtype = parse_supported_dtype(dname);
  if (!dtype) input_error(path, where + "unsupported dtype " + dname + " (supported: F32, BF16, F16)");
  TensorInfo t;
  t.name = name;
  t.dtype = *dtype;
  t.file = path;
  uint64_t nbytes = 0;
  t.shape = parse_shape(path, where, *sh, dtype_size(*dtype), &nbytes);
  uint64_t b, e;
  if (!off->is_array() || off->size() != 2 || !get_u64((*off)[0], &b) || !get_u64((*off)[1], &e))
    input_error(path, where + "data_offsets must be two non-negative integers, got " + off->dump());
  if (b > e) input_error(path, where + "data_offsets " + offsets_string(b, e) + " end before they begin");
  if (e > data_size)
    input_error(path, where + "data_offsets " + offsets_string(b, e) + " out of range of the data area (" +
                          std::to_string(data_size) + " bytes)");
  if (e - b != nbytes)
    input_error(path, where + "shape " + shape_string(t.shape) + " of " + dname + " needs " + std::to_string(nbytes) +
                          " bytes but data_offsets " + offsets_string(b, e) + " span " + std::to_string(e - b));
  t.data = data + b;
  t.bytes = size_t(nbytes);
  range->begin = b;
  range->end = e;
  return t;
}

// The format requires the tensors to tile the data area exactly: checked in offset order, which
// `ranges` is left in.
void check_tiling(const std::string& path, std::vector<Range>& ranges, const std::vector<TensorInfo>& tensors,
                  uint64_t data_size) {
  std::stable_sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const std::string* prev = nullptr;
  for (const Range& r : ranges) {
    const std::string& name = tensors[r.idx].name;
    if (r.begin < covered)
      input_error(path,
                  "tensor " + name + ": data_offsets " + offsets_string(r.begin, r.end) + " overlap tensor " + *prev);
    if (r.begin > covered)
      input_error(path, "gap in the data area: bytes " + std::to_string(covered) + " to " + std::to_string(r.begin) +
                            " before tensor " + name + " belong to no tensor");
    covered = r.end;
    prev = &name;
  }
  if (covered != data_size)
    input_error(path,
                "data area has " + std::to_string(data_size - covered) + " trailing bytes that belong to no tensor");
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const Mapping m = map_regular_file(path);
  f.map_ = m.addr;
  f.map_bytes_ = m.size;  // from here on `f` owns the mapping, so throwing unmaps it

  const uint8_t* base = static_cast<const uint8_t*>(m.addr);
  const uint64_t header_len = header_length(path, base, m.size);
  const char* hbeg = reinterpret_cast<const char*>(base + 8);
  const json header = parse_header(path, hbeg, hbeg + header_len);
  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_size = m.size - 8 - header_len;

  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      f.metadata_ = parse_metadata(path, it.value());
      continue;
    }
    Range r{0, 0, f.tensors_.size()};
    f.tensors_.push_back(parse_tensor_entry(path, it.key(), it.value(), data, data_size, &r));
    ranges.push_back(r);
  }
  check_tiling(path, ranges, f.tensors_, data_size);

  // Present tensors in file order (sequential reads of the mapping).
  std::vector<TensorInfo> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) ordered.push_back(std::move(f.tensors_[r.idx]));
  f.tensors_ = std::move(ordered);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.by_name_.emplace(f.tensors_[i].name, i);
  return f;
}

namespace {

// Whether every value of an F32/BF16/F16 tensor is finite: the exponent field all ones is Inf or
// NaN. Eight bytes at a time (SWAR): y = (w & M) ^ M has a zero lane exactly where a value's
// exponent is all ones, and (y - 1s) & ~y & high bits finds a zero lane (no lane of y has its high
// bit set, the masks leave the sign out): 12 GB/s a core where a compare per element ran at 2.
// Only a chunk with a hit is scanned element by element for the index. Unaligned data (another
// writer's file) is read by memcpy.
template <class U>
int64_t first_non_finite(const uint8_t* p, size_t n, U mask) {
  uint64_t m = 0, ones = 0, highs = 0;
  for (size_t lane = 0; lane < 8 / sizeof(U); ++lane) {
    m |= uint64_t(mask) << (8 * sizeof(U) * lane);
    ones |= uint64_t(1) << (8 * sizeof(U) * lane);
    highs |= uint64_t(1) << (8 * sizeof(U) * lane + 8 * sizeof(U) - 1);
  }
  const size_t words = n * sizeof(U) / 8;
  uint64_t bad = 0;
  for (size_t k = 0; k < words; ++k) {
    uint64_t w;
    std::memcpy(&w, p + 8 * k, 8);
    const uint64_t y = (w & m) ^ m;
    bad |= (y - ones) & ~y & highs;
  }
  const size_t from = bad ? 0 : words * 8 / sizeof(U);  // a hit: find it; else only the tail
  for (size_t k = from; k < n; ++k) {
    U v;
    std::memcpy(&v, p + k * sizeof(U), sizeof(U));
    if ((v & mask) == mask) return int64_t(k);
  }
  return -1;
}

int64_t first_non_finite(const TensorInfo& t, size_t begin, size_t end) {  // [begin, end) in bytes
  const uint8_t* p = t.data + begin;
  switch (t.dtype) {
    case DType::F32:
      return first_non_finite<uint32_t>(p, (end - begin) / 4, 0x7f800000u);
    case DType::BF16:
      return first_non_finite<uint16_t>(p, (end - begin) / 2, uint16_t(0x7f80));
    case DType::F16:
      return first_non_finite<uint16_t>(p, (end - begin) / 2, uint16_t(0x7c00));
    default:
      return -1;
  }
}

}  // namespace

bool SafetensorsFile::verify_checksums(bool check_finite) const {
  const std::string prefix = kChecksumKeyPrefix;
  size_t listed = 0;
  for (auto it = metadata_.lower_bound(prefix); it != metadata_.end() && it->first.starts_with(prefix); ++it) {
    const std::string name = it->first.substr(prefix.size());
    if (!find(name)) input_error(path_, "__metadata__ has a checksum for tensor " + name + ", which the file lacks");
    ++listed;
  }
  const bool crc = listed > 0;
  if (!crc && !check_finite) return false;
  std::vector<const std::string*> want(tensors_.size(), nullptr);
  for (size_t i = 0; crc && i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    auto it = metadata_.find(prefix + t.name);
    if (it == metadata_.end()) input_error(path_, "tensor " + t.name + ": no checksum (the others have one)");
    if (it->second.size() != 8 || it->second.find_first_not_of("0123456789abcdef") != std::string::npos)
      input_error(path_, "tensor " + t.name + ": checksum \"" + it->second + "\" is not 8 lowercase hex digits");
    want[i] = &it->second;
  }
  // One pass over each tensor's bytes, in cache-sized chunks: the checksum and the finiteness scan
  // read each chunk while it is in cache. Tensors in parallel (a model's data is read at memory
  // or disk speed, not one core's CRC speed); the first defect in file order is reported.
  std::vector<std::string> error(tensors_.size());
  cpu_pool().parallel_pieces(
      int64_t(tensors_.size()),
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const TensorInfo& t = tensors_[size_t(i)];
          constexpr size_t kChunk = size_t(256) << 10;  // a multiple of every element size
          uint32_t c = 0;
          for (size_t off = 0; off < t.bytes; off += kChunk) {
            const size_t end = std::min(t.bytes, off + kChunk);
            if (crc) c = crc32c(t.data + off, end - off, c);
            if (check_finite && error[size_t(i)].empty()) {
              const int64_t k = first_non_finite(t, off, end);
              if (k >= 0)
                error[size_t(i)] = "tensor " + t.name + ": element " +
                                   std::to_string(int64_t(off / dtype_size(t.dtype)) + k) +
                                   " is NaN or infinite (the model's weights are broken)";
            }
          }
          if (crc && crc_hex(c) != *want[size_t(i)])
            error[size_t(i)] = "tensor " + t.name + ": CRC-32C " + crc_hex(c) + " does not match the stored " +
                               *want[size_t(i)] + " (the file is corrupt)";
        }
      },
      1);
  for (const std::string& e : error)
    if (!e.empty()) input_error(path_, e);
  return crc;
}

// ---------------------------------------------------------------- writing

size_t TensorWrite::bytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json: header order = data order = caller's order, which makes files easy to inspect.
  nlohmann::ordered_json header;
  nlohmann::ordered_json md = nlohmann::ordered_json::object();
  md["format"] = "pt";
  for (const auto& [k, v] : metadata) {
    SF_CHECK(!k.starts_with(kChecksumKeyPrefix), "write_safetensors: metadata key " + k + " is reserved");
    md[k] = v;
  }
  // Placeholders of the final length: the header is rewritten in place once the data is written.
  for (const TensorWrite& t : tensors) md[kChecksumKeyPrefix + t.name] = crc_hex(0);
  header["__metadata__"] = md;
  uint64_t offset = 0;
  for (const TensorWrite& t : tensors) {
    SF_CHECK(!t.name.empty() && t.name != "__metadata__", "write_safetensors: bad tensor name '" + t.name + "'");
    SF_CHECK(!header.contains(t.name), "write_safetensors: duplicate tensor " + t.name);
    for (int64_t d : t.shape) SF_CHECK(d >= 0, "write_safetensors: negative dimension in " + t.name);
    size_t n = t.bytes();
    SF_CHECK(n == 0 || t.data != nullptr || t.fill, "write_safetensors: no data for " + t.name);
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data area then starts 8-byte aligned

  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  AtomicFile out(path);
  out.write(len, 8);
  out.write(h.data(), h.size());
  std::vector<char> staged;  // one tensor at a time for the fill()ed ones
  nlohmann::ordered_json& sums = header["__metadata__"];
  for (const TensorWrite& t : tensors) {
    const void* bytes = t.data;
    if (t.data == nullptr && t.bytes() > 0) {
      staged.resize(t.bytes());
      t.fill(staged.data());
      bytes = staged.data();
    }
    sums[kChecksumKeyPrefix + t.name] = crc_hex(crc32c(bytes, t.bytes()));
    out.write(bytes, t.bytes());
  }
  std::string final_header = header.dump();
  final_header.append((8 - final_header.size() % 8) % 8, ' ');
  SF_CHECK(final_header.size() == h.size(), "write_safetensors: header changed length");
  out.write_at(8, final_header.data(), final_header.size());
  out.commit();
}

}  // namespace sf
