#include "train/model_io.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/layout.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

std::string layer_scalar_name(const ModelSpec& spec, int l) {
  return spec.tensor_prefix + "layers." + std::to_string(l) + ".layer_scalar";
}

// Gemma 4's per-layer output scales (transformers' layer_scalar buffer, shape [1]) into
// spec.gemma4.layer_scalar. A checkpoint without them gets transformers' initial 1 (said once).
void read_layer_scalars(ModelSpec& spec, const CheckpointReader& ckpt) {
  int absent = 0;
  for (int l = 0; l < spec.n_layer; ++l) {
    const std::string name = layer_scalar_name(spec, l);
    if (ckpt.find(name) == nullptr) {
      ++absent;
      continue;
    }
    float v = 0.f;
    ckpt.read_f32(name, {1}, &v);  // shape and dtype checked, naming the file
    if (!std::isfinite(v)) input_error(ckpt.dir(), "tensor " + name + " is not finite (" + std::to_string(v) + ")");
    spec.gemma4.layer_scalar[size_t(l)] = v;
  }
  if (absent > 0)
    log_info("warning: %s has no layer_scalar for %d of %d layers (e.g. %s); 1 is used there, as transformers "
             "initialises it",
             ckpt.dir().c_str(), absent, spec.n_layer, layer_scalar_name(spec, 0).c_str());
}

}  // namespace

ModelDir open_model_dir(const std::string& dir) {
  if (!fs::exists(dir)) input_error(dir, "model directory not found");
  if (!fs::is_directory(dir)) input_error(dir, "not a directory");
  ModelDir m;
  m.path = dir;
  m.config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(m.config_path)) input_error(m.config_path, "not found (a model directory needs config.json)");
  m.spec = load_model_spec(m.config_path);
  adopt_checkpoint_names(m.spec, dir);
  return m;
}

void adopt_checkpoint_names(ModelSpec& spec, const std::string& dir) {
  // Two spellings exist for gemma3 multimodal checkpoints (the published language_model.model.*,
  // spec's default, and transformers >= 4.52's model.language_model.* with lm_head.weight) and for
  // MoE experts (per expert, or transformers v5's fused tensors: model/layout.h StoredTensor).
  // Gemma 4's layer_scalar buffers are read here too (they are values, not parameters).
  const bool gemma_mm = spec.tensor_prefix == "language_model.model.";
  if (!gemma_mm && !spec.is_moe() && spec.arch != Arch::Gemma4) return;
  if (!fs::exists(fs::path(dir) / kSingleFileName) && !fs::exists(fs::path(dir) / kIndexFileName)) return;
  const CheckpointReader ckpt = CheckpointReader::open(dir);
  if (spec.arch == Arch::Gemma4) read_layer_scalars(spec, ckpt);
  if (gemma_mm && ckpt.find(spec.tensor_prefix + "embed_tokens.weight") == nullptr &&
      ckpt.find("model.language_model.embed_tokens.weight") != nullptr) {
    spec.tensor_prefix = "model.language_model.";
    spec.lm_head_name = "lm_head.weight";
  }
  if (spec.is_moe() && spec.arch != Arch::Gemma4) {  // Gemma 4: fused, its only layout (spec_gemma4.cpp)
    // Decided by the first sparse layer; a checkpoint mixing the layouts then reports the other
    // layers' tensors missing under the names of this one.
    int l = 0;
    while (l < spec.n_layer && !spec.moe_layer(l)) ++l;
    spec.moe.fused_experts =
        l < spec.n_layer &&
        ckpt.find(spec.tensor_prefix + "layers." + std::to_string(l) + ".mlp.experts.gate_up_proj") != nullptr;
  }
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

// Entry i of blob b of `state`, rounded to `dtype` (nearest-even for bf16) when that is not F32, a
// part of kStatePart elements at a time (one part's fp32 beside the engine, not the tensor's).
void fill_entry(Engine& engine, Engine::State state, size_t b, size_t i, int64_t n, DType dtype, void* dst) {
  if (dtype == DType::F32) {
    for (int64_t k0 = 0; k0 < n; k0 += kStatePart)
      engine.read_state_part(state, int(b), int(i), k0, std::min(kStatePart, n - k0), static_cast<float*>(dst) + k0);
    return;
  }
  std::vector<float> f(static_cast<size_t>(std::min(n, kStatePart)));
  uint16_t* h = static_cast<uint16_t*>(dst);
  for (int64_t k0 = 0; k0 < n; k0 += kStatePart) {
    const int64_t c = std::min(kStatePart, n - k0);
    engine.read_state_part(state, int(b), int(i), k0, c, f.data());
    for (int64_t k = 0; k < c; ++k)
      h[k0 + k] = dtype == DType::BF16 ? float_to_bf16(f[size_t(k)]).bits : float_to_f16(f[size_t(k)]);
  }
}

}  // namespace

void append_engine_tensors(std::vector<TensorWrite>& out, Engine& engine, const ModelLayout& layout,
                           Engine::State state, DType dtype, const std::string& prefix) {
  for (size_t b = 0; b < layout.blobs.size(); ++b) {
    for (size_t i = 0; i < layout.blobs[b].entries.size(); ++i) {
      const BlobEntry& e = layout.blobs[b].entries[i];
      TensorWrite w{prefix + e.name, dtype, e.shape, nullptr};
      w.fill = [&engine, state, b, i, n = e.numel, dtype](void* dst) { fill_entry(engine, state, b, i, n, dtype, dst); };
      out.push_back(std::move(w));
    }
  }
}

void append_checkpoint_tensors(std::vector<TensorWrite>& out, Engine& engine, const ModelLayout& layout,
                               Engine::State state, DType dtype) {
  for (size_t b = 0; b < layout.blobs.size(); ++b) {
    for (const StoredTensor& t : layout.blobs[b].stored) {
      struct Part {
        size_t entry;
        int64_t numel, offset;
      };
      std::vector<Part> parts;  // by value: the writer may run after `layout` is gone
      for (const StoredPart& p : t.parts)
        parts.push_back({size_t(p.entry), layout.blobs[b].entries[size_t(p.entry)].numel, p.offset});
      TensorWrite w{t.name, dtype, t.shape, nullptr};
      w.fill = [&engine, parts = std::move(parts), state, b, dtype](void* dst) {
        for (const Part& p : parts)
          fill_entry(engine, state, b, p.entry, p.numel, dtype,
                     static_cast<char*>(dst) + size_t(p.offset) * dtype_size(dtype));
      };
      out.push_back(std::move(w));
    }
  }
}

void append_layer_scalars(std::vector<TensorWrite>& out, const ModelSpec& spec, DType dtype) {
  if (spec.arch != Arch::Gemma4) return;
  // transformers casts buffers with the model: the checkpoint's dtype, shape [1].
  for (int l = 0; l < spec.n_layer; ++l) {
    TensorWrite w{layer_scalar_name(spec, l), dtype, {1}, nullptr};
    w.fill = [v = spec.gemma4.layer_scalar[size_t(l)], dtype](void* dst) {
      if (dtype == DType::F32) {
        std::memcpy(dst, &v, sizeof v);
      } else {
        const uint16_t h = dtype == DType::BF16 ? float_to_bf16(v).bits : float_to_f16(v);
        std::memcpy(dst, &h, sizeof h);
      }
    };
    out.push_back(std::move(w));
  }
}

void save_hf_model(Engine& engine, nlohmann::json cfg, const std::string& src_dir, const std::string& out_dir,
                   DType dtype, size_t max_shard_bytes) {
  // One tensor at a time from the engine, the fp32 masters rounded to the checkpoint dtype
  // (nearest-even for bf16): no copy of the whole model in host memory.
  std::vector<TensorWrite> tw;
  const ModelLayout layout = make_layout(engine.spec());
  append_checkpoint_tensors(tw, engine, layout, Engine::State::Params, dtype);
  append_layer_scalars(tw, engine.spec(), dtype);
  // A gemma3 multimodal checkpoint's other tensors (vision tower, projector; not trained) are
  // copied from the source byte for byte: the output loads as the same Gemma3ForConditionalGeneration.
  std::shared_ptr<const CheckpointReader> src;  // kept open (mmap) until the writer is done
  if (engine.spec().tensor_prefix != "model." && !src_dir.empty()) {
    src = std::make_shared<const CheckpointReader>(CheckpointReader::open(src_dir));
    std::unordered_set<std::string> ours;
    for (const TensorWrite& t : tw) ours.insert(t.name);
    for (const std::string& name : src->names()) {
      if (ours.count(name)) continue;
      const TensorInfo* t = src->find(name);
      TensorWrite w{name, t->dtype, t->shape, nullptr};
      w.fill = [src, t](void* dst) { std::memcpy(dst, t->data, t->bytes); };
      tw.push_back(std::move(w));
    }
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
