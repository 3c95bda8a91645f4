// Hugging Face checkpoint directories: model.safetensors or sharded model-0000i-of-0000N.safetensors +
// model.safetensors.index.json; staged output directories that appear only when complete.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "io/output_dir.h"
#include "io/safetensors.h"

namespace sf {

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

class CheckpointReader {
 public:
  // Uses dir/model.safetensors.index.json when present (each shard opened once, every weight_map entry
  // verified to exist in its shard), else dir/model.safetensors. Problems -> InputError naming the file.
  static CheckpointReader open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }  // read through an index file
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;                 // in storage order (shard, then offset)
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent

  // The tensor, checked to exist with exactly `expected_shape`:
  //   "<index or model.safetensors>: tensor <name> missing"
  //   "<shard>: tensor <name> has shape [a, b], config expects [c, d]"
  const TensorInfo& require(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // require() + convert F32/BF16/F16 -> fp32 into dst (numel floats).
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* dst) const;
  // The same for elements [begin, begin + count) of the tensor in storage order (a slice of a
  // fused tensor, e.g. one expert's matrix); the range must lie inside the tensor.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, int64_t begin, int64_t count,
                float* dst) const;
  // require() + convert to bf16 (F32 and F16 round to nearest even) into dst (numel values).
  void read_bf16(const std::string& name, const std::vector<int64_t>& expected_shape, bf16* dst) const;

  // The dtype holding the most parameters (ties: BF16 over F16 over F32), to save back in the same dtype.
  // An empty checkpoint gives F32.
  DType dominant_dtype() const;
  int64_t total_params() const;

 private:
  std::string dir_;
  std::string source_;  // the index or model.safetensors path: named when a tensor is missing
  std::vector<SafetensorsFile> files_;
  std::vector<const TensorInfo*> order_;  // point into files_' TensorInfo vectors (stable across moves)
  std::unordered_map<std::string, const TensorInfo*> by_name_;
  bool sharded_ = false;
};

// Verifies a directory about to be read (a model to train, evaluate or take gradients of; a checkpoint
// to resume): its manifest when it has one (io/manifest.h; each of `required` must then be listed), and
// in every safetensors file of `r` the tensors' checksums (when the file carries them) and that
// every value is finite, in one pass. Any defect -> InputError naming the file (and tensor).
// Returns the safetensors files that carry no checksums (another program's, or an older
// slideformer's), whether the directory had a manifest, and the time taken.
struct Verified {
  std::vector<std::string> without_checksums;
  bool manifest = false;
  double seconds = 0;
  uint64_t bytes = 0;  // tensor bytes read
};
Verified verify_checkpoint(const CheckpointReader& r, const std::vector<std::string>& required = {});

// Writes `tensors` (in order) into `dir` (created if needed): a single model.safetensors when the total
// is <= max_shard_bytes, else HF-named shards model-0000i-of-0000N.safetensors, each filled greedily up to
// max_shard_bytes (a tensor is never split; one larger than the limit gets a shard of its own), plus
// model.safetensors.index.json {"metadata": {"total_size": N}, "weight_map": {tensor: shard}}, written
// last. A stale model.safetensors / index of the other layout is removed so readers cannot mix them up.
void write_checkpoint_tensors(const std::string& dir, const std::vector<TensorWrite>& tensors,
                              size_t max_shard_bytes = 5'000'000'000);

// Copies each of `names` that exists in src_dir into dst_dir (overwriting); returns the ones copied.
// For config.json, generation_config.json, tokenizer files, ...
std::vector<std::string> copy_if_exists(const std::string& src_dir, const std::string& dst_dir,
                                        const std::vector<std::string>& names);

}  // namespace sf
