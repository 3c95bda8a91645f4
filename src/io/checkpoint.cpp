#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <chrono>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/manifest.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// Elements per parallel chunk: big enough that small tensors convert inline on the caller.
constexpr int64_t kConvertChunk = 1 << 20;

// Source bytes come from an mmap of a file possibly written by someone else, so they may be unaligned:
// every load goes through memcpy.
template <class Out, class Fn>
void convert(const uint8_t* src, size_t elem_size, int64_t n, Out* dst, Fn fn) {
  cpu_pool().parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[i] = fn(src + size_t(i) * elem_size);
      },
      kConvertChunk);
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

void parallel_copy(const uint8_t* src, size_t bytes, void* dst) {
  constexpr int64_t kBlock = 1 << 22;
  int64_t blocks = int64_t((bytes + kBlock - 1) / kBlock);
  cpu_pool().parallel_for(blocks, [&](int64_t b, int64_t e) {
    size_t lo = size_t(b) * kBlock, hi = std::min(bytes, size_t(e) * kBlock);
    std::memcpy(static_cast<uint8_t*>(dst) + lo, src + lo, hi - lo);
  });
}

// Shard names are plain file names in HF checkpoints; refuse anything that would leave the directory.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i, n);
  return buf;
}

void remove_file(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) input_error(path, "cannot remove stale file: " + ec.message());
}

}  // namespace

// ---------------------------------------------------------------- CheckpointReader

CheckpointReader CheckpointReader::open(const std::string& dir) {
  CheckpointReader r;
  r.dir_ = dir;
  std::error_code ec;
  if (!fs::exists(dir, ec)) input_error(dir, "checkpoint directory not found");
  if (!fs::is_directory(dir, ec)) input_error(dir, "not a directory");

  const std::string index_path = join(dir, kIndexFileName);
  const std::string single_path = join(dir, kSingleFileName);
  if (fs::exists(index_path, ec)) {
    r.source_ = index_path;
    r.sharded_ = true;
    nlohmann::json index = read_json_file(index_path);
    if (!index.is_object()) input_error(index_path, "not a JSON object");
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) input_error(index_path, "missing \"weight_map\" object");

    std::map<std::string, size_t> shard_idx;  // shard file -> index in files_
    std::vector<std::pair<std::string, size_t>> entries;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        input_error(index_path, "weight_map entry for tensor " + it.key() + " is not a string");
      std::string shard = it.value().get<std::string>();
      if (!plain_file_name(shard))
        input_error(index_path, "tensor " + it.key() + " maps to \"" + shard + "\", which is not a file name");
      auto [pos, inserted] = shard_idx.emplace(shard, r.files_.size());
      if (inserted) {
        std::string shard_path = join(dir, shard);
        if (!fs::exists(shard_path, ec))
          input_error(index_path, "shard " + shard + " (holding tensor " + it.key() + ") not found");
        r.files_.push_back(SafetensorsFile::open(shard_path));
      }
      entries.emplace_back(it.key(), pos->second);
    }
    // Look-ups only after every shard is open: TensorInfo addresses are stable from here on.
    for (const auto& [name, fi] : entries) {
      const TensorInfo* t = r.files_[fi].find(name);
      if (!t)
        input_error(index_path, "tensor " + name + " is mapped to " +
                                    fs::path(r.files_[fi].path()).filename().string() +
                                    " but that shard does not contain it");
      r.by_name_.emplace(name, t);
    }
    // Storage order; only weight_map tensors are exposed (HF loaders go by the index too).
    for (const SafetensorsFile& f : r.files_)
      for (const TensorInfo& t : f.tensors()) {
        auto it = r.by_name_.find(t.name);
        if (it != r.by_name_.end() && it->second == &t) r.order_.push_back(&t);
      }
  } else if (fs::exists(single_path, ec)) {
    r.source_ = single_path;
    r.files_.push_back(SafetensorsFile::open(single_path));
    for (const TensorInfo& t : r.files_[0].tensors()) {
      r.order_.push_back(&t);
      r.by_name_.emplace(t.name, &t);
    }
  } else {
    input_error(dir, std::string("no ") + kSingleFileName + " or " + kIndexFileName);
  }
  return r;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  out.reserve(order_.size());
  for (const TensorInfo* t : order_) out.push_back(t->name);
  return out;
}

const TensorInfo* CheckpointReader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& CheckpointReader::require(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const TensorInfo* t = find(name);
  if (!t) input_error(source_, "tensor " + name + " missing");
  if (t->shape != expected_shape)
    input_error(t->file, "tensor " + name + " has shape " + shape_string(t->shape) + ", config expects " +
                             shape_string(expected_shape));
  return *t;
}

void CheckpointReader::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* dst) const {
  const TensorInfo& t = require(name, expected_shape);
  read_f32(name, expected_shape, 0, t.numel(), dst);
}

void CheckpointReader::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, int64_t begin,
                                int64_t count, float* dst) const {
  const TensorInfo& t = require(name, expected_shape);
  SF_CHECK(begin >= 0 && count >= 0 && count <= t.numel() - begin, "element range outside tensor " + name);
  const size_t es = dtype_size(t.dtype);
  const uint8_t* src = t.data + size_t(begin) * es;
  switch (t.dtype) {
    case DType::F32:
      parallel_copy(src, size_t(count) * es, dst);
      break;
    case DType::BF16:
      convert(src, 2, count, dst, [](const uint8_t* p) { return bf16_to_float(bf16{load_u16(p)}); });
      break;
    case DType::F16:
      convert(src, 2, count, dst, [](const uint8_t* p) { return f16_to_float(load_u16(p)); });
      break;
    default:
      SF_CHECK(false, "unsupported dtype passed safetensors validation");
  }
}

void CheckpointReader::read_bf16(const std::string& name, const std::vector<int64_t>& expected_shape, bf16* dst) const {
  const TensorInfo& t = require(name, expected_shape);
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::BF16:
      parallel_copy(t.data, t.bytes, dst);
      break;
    case DType::F32:
      convert(t.data, 4, n, dst, [](const uint8_t* p) { return float_to_bf16(load_f32(p)); });
      break;
    case DType::F16:
      convert(t.data, 2, n, dst, [](const uint8_t* p) { return float_to_bf16(f16_to_float(load_u16(p))); });
      break;
    default:
      SF_CHECK(false, "unsupported dtype passed safetensors validation");
  }
}

DType CheckpointReader::dominant_dtype() const {
  int64_t count[3] = {0, 0, 0};  // BF16, F16, F32: tie-break order
  for (const TensorInfo* t : order_) count[t->dtype == DType::BF16 ? 0 : t->dtype == DType::F16 ? 1 : 2] += t->numel();
  const DType kinds[3] = {DType::BF16, DType::F16, DType::F32};
  int best = 2;
  for (int i = 1; i >= 0; --i)
    if (count[i] > 0 && count[i] >= count[best]) best = i;
  return kinds[best];
}

int64_t CheckpointReader::total_params() const {
  int64_t n = 0;
  for (const TensorInfo* t : order_) n += t->numel();
  return n;
}

// ---------------------------------------------------------------- writing

void write_checkpoint_tensors(const std::string& dir, const std::vector<TensorWrite>& tensors, size_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) input_error(dir, "cannot create directory: " + ec.message());

  size_t total = 0;
  for (const TensorWrite& t : tensors) total += t.bytes();
  const std::string index_path = join(dir, kIndexFileName);
  if (total <= max_shard_bytes) {
    // An index left over from a sharded save would take precedence over the new file: drop it.
    if (fs::exists(index_path, ec)) remove_file(index_path);
    write_safetensors(join(dir, kSingleFileName), tensors);
    return;
  }

  // Greedy packing in the given order (layer order keeps each layer in one or two shards).
  std::vector<std::vector<TensorWrite>> shards;
  size_t cur = 0;
  for (const TensorWrite& t : tensors) {
    size_t b = t.bytes();
    if (shards.empty() || (cur > 0 && cur + b > max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
  }
  // Remove the index first: a crash mid-save must not leave an old index next to half-new shards.
  if (fs::exists(index_path, ec)) remove_file(index_path);
  const std::string single_path = join(dir, kSingleFileName);
  if (fs::exists(single_path, ec)) remove_file(single_path);

  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = shard_name(i + 1, shards.size());
    write_safetensors(join(dir, name), shards[i]);
    for (const TensorWrite& t : shards[i]) weight_map[t.name] = name;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_json_file(index_path, index);
}

// ---------------------------------------------------------------- copy_if_exists

std::vector<std::string> copy_if_exists(const std::string& src_dir, const std::string& dst_dir,
                                        const std::vector<std::string>& names) {
  std::vector<std::string> copied;
  for (const std::string& n : names) {
    std::string src = join(src_dir, n), dst = join(dst_dir, n);
    std::error_code ec;
    if (!fs::is_regular_file(src, ec)) continue;
    fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
    if (ec) input_error(dst, "cannot copy from " + src + ": " + ec.message());
    // Same durability as the files we write ourselves before the directory is committed.
    fsync_file(dst);
    copied.push_back(n);
  }
  return copied;
}

Verified verify_checkpoint(const CheckpointReader& r, const std::vector<std::string>& required) {
  const auto t0 = std::chrono::steady_clock::now();
  Verified v;
  v.manifest = verify_manifest(r.dir(), required);
  for (const SafetensorsFile& f : r.files()) {
    if (!f.verify_checksums(/*check_finite=*/true)) v.without_checksums.push_back(f.path());
    for (const TensorInfo& t : f.tensors()) v.bytes += t.bytes;
  }
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return v;
}

}  // namespace sf
