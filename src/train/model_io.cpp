#include "train/model_io.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/layout.h"

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

void append_engine_tensors(std::vector<TensorWrite>& out, Engine& engine, const ModelLayout& layout,
                           Engine::State state, DType dtype, const std::string& prefix) {
  for (size_t b = 0; b < layout.blobs.size(); ++b) {
    for (size_t i = 0; i < layout.blobs[b].entries.size(); ++i) {
      const BlobEntry& e = layout.blobs[b].entries[i];
      TensorWrite w{prefix + e.name, dtype, e.shape, nullptr};
      w.fill = [&engine, state, b, i, n = e.numel, dtype](void* dst) {
        if (dtype == DType::F32) {
          engine.read_state(state, int(b), int(i), static_cast<float*>(dst));
          return;
        }
        std::vector<float> f(static_cast<size_t>(n));
        engine.read_state(state, int(b), int(i), f.data());
        uint16_t* h = static_cast<uint16_t*>(dst);
        for (size_t k = 0; k < f.size(); ++k)
          h[k] = dtype == DType::BF16 ? float_to_bf16(f[k]).bits : float_to_f16(f[k]);
      };
      out.push_back(std::move(w));
    }
  }
}

void save_hf_model(Engine& engine, nlohmann::json cfg, const std::string& src_dir, const std::string& out_dir,
                   DType dtype, size_t max_shard_bytes) {
  // One tensor at a time from the engine, the fp32 masters rounded to the checkpoint dtype
  // (nearest-even for bf16): no copy of the whole model in host memory.
  std::vector<TensorWrite> tw;
  append_engine_tensors(tw, engine, make_layout(engine.spec()), Engine::State::Params, dtype);
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
