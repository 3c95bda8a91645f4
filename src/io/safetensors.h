// safetensors files: read by mmap (fully validated), written atomically.
// Format: u64 little-endian header length N, N bytes of JSON header, then the data area, which the
// tensors' [begin, end) data_offsets must cover exactly, without overlaps or gaps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace sf {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the read-only mmap; NOT necessarily aligned (files of other writers)
  size_t bytes = 0;
  std::string file;  // path of the file it lives in (for error messages)

  int64_t numel() const;
};

// "[a, b]" (as in error messages).
std::string shape_string(const std::vector<int64_t>& shape);

// "F32"/"BF16"/"F16" -> DType; any other name (incl. I32 and other safetensors dtypes) -> nullopt.
std::optional<DType> parse_supported_dtype(const std::string& name);

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it; any defect -> InputError("path: ...").
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // In file (data offset) order, which is the order that reads the mapping sequentially.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Checks the per-tensor CRC-32C checksums write_safetensors puts in __metadata__
  // (kChecksumKeyPrefix + tensor name -> 8 lowercase hex digits). Returns false when the file carries
  // none (another program's file, or one slideformer wrote before checksums); true when every tensor
  // matches. A mismatch, a tensor without a checksum in a file that has them, a checksum for no
  // tensor or a malformed one -> InputError("path: tensor NAME: ..."). With check_finite, also that
  // every value is finite (NaN/Inf -> InputError naming the tensor), in the same pass over the
  // bytes. Tensors are checked in parallel on cpu_pool().
  bool verify_checksums(bool check_finite = false) const;

 private:
  SafetensorsFile() = default;
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Metadata key prefix of the per-tensor checksums ("crc32c.model.norm.weight": "1a2b3c4d").
inline constexpr const char* kChecksumKeyPrefix = "crc32c.";

struct TensorWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // host memory, numel * dtype_size bytes
  // Or, when data is null: writes the bytes into dst when the writer gets to this tensor (so a
  // model is saved holding one tensor at a time, not a copy of all of it).
  std::function<void(void* dst)> fill = nullptr;

  size_t bytes() const;
};

// Writes tensors in the given order with contiguous offsets; "__metadata__" holds {"format": "pt"},
// `metadata` and the CRC-32C of every tensor's bytes (see verify_checksums). The checksums are
// computed as the tensors are written (one tensor in memory at a time) into a header written first
// with placeholders of the same length and rewritten in place before the file is committed. The header is space-padded
// to a multiple of 8 so the data area is 8-byte aligned. Goes through temp file + fsync + rename; I/O failures ->
// InputError("path: ...: strerror"). Bad arguments (duplicate/empty names, negative dims, null data) are internal bugs
// (SF_CHECK).
void write_safetensors(const std::string& path, const std::vector<TensorWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace sf
