// Loading a model directory into an engine and saving an engine's weights as an HF directory.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {

struct ModelDir {
  std::string path;
  std::string config_path;
  ModelSpec spec;
};

// Reads and validates DIR/config.json (InputError naming the file on any problem).
ModelDir open_model_dir(const std::string& dir);
// Tensor names as the checkpoint in `dir` spells them (when it has one): a gemma3 multimodal
// spec's published language_model.model.* or transformers >= 4.52's model.language_model.*; a
// MoE spec's per-expert tensors or transformers v5's fused ones (MoeSpec::fused_experts). Also
// reads a Gemma 4 checkpoint's layer_scalar values into spec.gemma4.layer_scalar.
void adopt_checkpoint_names(ModelSpec& spec, const std::string& dir);

// Checkpoint dtype to save in: the checkpoint's own (F32/BF16/F16 as stored) — see model_io.cpp.
DType checkpoint_dtype(const std::string& dir);

// Appends one TensorWrite per tensor of `layout` (blob by blob, entry by entry: slideformer's own
// files, e.g. the training state), named `prefix` +
// the tensor's name, whose fill reads `state` from the engine when the writer gets to it (one tensor
// at a time, no copy of the whole state in host memory); fp32 rounded to `dtype` (nearest-even for
// bf16) when that is not F32.
void append_engine_tensors(std::vector<TensorWrite>& out, Engine& engine, const ModelLayout& layout,
                           Engine::State state, DType dtype = DType::F32, const std::string& prefix = "");

// The same, one TensorWrite per tensor as the checkpoint stores it (BlobLayout::stored: names,
// shapes and fused experts as read): model and gradient files.
void append_checkpoint_tensors(std::vector<TensorWrite>& out, Engine& engine, const ModelLayout& layout,
                               Engine::State state, DType dtype = DType::F32);

// Gemma 4 (nothing for other families): one TensorWrite per layer_scalar, layers.N.layer_scalar
// of shape [1] in `dtype`, the values of spec.gemma4.layer_scalar (not trained: as read).
void append_layer_scalars(std::vector<TensorWrite>& out, const ModelSpec& spec, DType dtype);

// Writes an HF checkpoint into `out_dir`, a fresh (staging) directory: safetensors in `dtype`,
// config.json (`config` with its dtype updated), and tokenizer files copied from `src_dir`
// (none when empty).
void save_hf_model(Engine& engine, nlohmann::json config, const std::string& src_dir, const std::string& out_dir,
                   DType dtype, size_t max_shard_bytes);

}  // namespace sf
