#include "train/model_io.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/safetensors.h"

namespace sf {

namespace fs = std::filesystem;

ModelDir open_model_dir(const std::string& dir) {
  if (!fs::exists(dir)) input_error(dir, "model directory not found");
  if (!fs::is_directory(dir)) input_error(dir, "not a directory");
  ModelDir m;
  m.path = dir;
  m.config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(m.config_path)) input_error(m.config_path, "not found (a model directory needs config.json)");
  m.spec = load_model_spec(m.config_path);
  return m;
}

DType checkpoint_dtype(const std::string& dir) {
  DType t = CheckpointReader::open(dir).dominant_dtype();
  return t;
}

namespace {

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      return "float32";
  }
}

}  // namespace

void save_hf_model(Engine& engine, nlohmann::json cfg, const std::string& src_dir, const std::string& out_dir,
                   DType dtype, size_t max_shard_bytes) {
  auto params = engine.export_params();
  // Round the fp32 masters to the checkpoint dtype (nearest-even for bf16).
  std::vector<std::vector<uint16_t>> half(params.size());
  std::vector<TensorWrite> tw;
  tw.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TensorWrite w;
    w.name = params[i].name;
    w.shape = params[i].shape;
    w.dtype = dtype;
    if (dtype == DType::F32) {
      w.data = params[i].data.data();
    } else {
      half[i].resize(params[i].data.size());
      for (size_t k = 0; k < half[i].size(); ++k) {
        half[i][k] = dtype == DType::BF16 ? float_to_bf16(params[i].data[k]).bits : float_to_f16(params[i].data[k]);
      }
      w.data = half[i].data();
    }
    tw.push_back(std::move(w));
  }
  write_checkpoint_tensors(out_dir, tw, max_shard_bytes);

  const ModelSpec& spec = engine.spec();
  if (!cfg.contains("architectures")) cfg["architectures"] = {spec.architecture};
  if (!cfg.contains("model_type")) cfg["model_type"] = spec.model_type;
  // transformers v5 writes "dtype", v4 "torch_dtype" (v5 still reads it): update what is there.
  if (cfg.contains("dtype")) cfg["dtype"] = torch_dtype_name(dtype);
  if (cfg.contains("torch_dtype") || !cfg.contains("dtype")) cfg["torch_dtype"] = torch_dtype_name(dtype);
  write_json_file((fs::path(out_dir) / "config.json").string(), cfg);
  if (src_dir.empty()) return;
  copy_if_exists(src_dir, out_dir,
                 {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                  "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"});
}

}  // namespace sf
