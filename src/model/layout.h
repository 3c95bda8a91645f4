// Parameter layout: every blob (embedding, one per decoder layer, head) is one contiguous block
// whose tensors sit at fixed offsets aligned to 256 bytes in any storage dtype (docs/ARCHITECTURE.md §2).
// Gradients, master weights and optimizer state use the same layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/spec.h"

namespace sf {

// Which parameter of a decoder layer (index into LayerParams).
enum class LayerParam : int {
  InputNorm,
  Wq,
  Bq,
  Wk,
  Bk,
  Wv,
  Bv,
  Wo,
  Bo,
  QNorm,
  KNorm,
  PostNorm,
  Wgate,
  Bgate,
  Wup,
  Bup,
  Wdown,
  Bdown,
  // Gemma 3's sandwich norms: HF post_attention_layernorm (on the attention output, before the
  // residual) and post_feedforward_layernorm (on the MLP output); its pre_feedforward_layernorm
  // is PostNorm (the norm in front of the MLP, as in Llama).
  AttnOutNorm,
  FfnOutNorm,
  // Mixture of experts (ModelSpec::moe): the router [E, H] and each expert matrix as one view
  // [E, stride] over the E equally spaced per-expert tensors (gate, up [I, H] each; down [H, I]).
  Router,
  ExpGate,
  ExpUp,
  ExpDown,
  // Gemma 4's per-layer inputs (ple_dim P > 0): per_layer_input_gate [P, H], per_layer_projection
  // [H, P], post_per_layer_input_norm [H] (docs/GEMMA4.md section 2).
  PleGate,
  PleProj,
  PleNorm,
  // Gemma 4's MoE block (enable_moe_block; docs/GEMMA4.md section 2), beside the dense MLP:
  // router.scale [H], router.per_expert_scale [E] (the router is Router, the experts ExpGate /
  // ExpUp / ExpDown) and three norms [H]: pre_feedforward_layernorm_2 (the experts' input),
  // post_feedforward_layernorm_1 (the dense MLP's output), post_feedforward_layernorm_2 (the
  // experts' combined output).
  RouterScale,
  ExpertScale,
  MoeInNorm,
  MlpOutNorm1,
  MoeOutNorm,
  Count
};

struct BlobEntry {
  std::string name;            // HF tensor name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape
  int64_t offset = 0;          // in elements from the blob start (multiple of 128)
  int64_t numel = 0;
  int param = -1;  // LayerParam index for layers, else -1
  int group = 1;   // expert matrices: the LayerParam view spans this many equally spaced entries (this one first)
};

enum class BlobKind { Embedding, Layer, Head };

// How a blob's entries are stored in an HF checkpoint: usually one tensor an entry; transformers v5's
// fused experts (MoeSpec::fused_experts) store all experts of a layer in two 3-D tensors, each
// expert's matrix a contiguous slice of one. Loading and saving go through this list, the engines
// through the entries.
struct StoredPart {
  int entry = 0;       // index into BlobLayout::entries
  int64_t offset = 0;  // element offset of that entry's values inside the stored tensor
};
struct StoredTensor {
  std::string name;            // checkpoint tensor name
  std::vector<int64_t> shape;  // checkpoint shape
  std::vector<StoredPart> parts;  // together they cover the tensor exactly, in increasing offset
};

struct BlobLayout {
  BlobKind kind = BlobKind::Layer;
  int layer = -1;  // for BlobKind::Layer
  std::vector<BlobEntry> entries;
  std::vector<StoredTensor> stored;  // the same values as the checkpoint names and shapes them
  int64_t numel = 0;      // padded size in elements
  float norm_init = 1.f;  // a fresh model's norm weights (0 for Gemma's (1 + w) norms)
  // Entry for a LayerParam, or nullptr when the architecture has no such tensor.
  const BlobEntry* entry(LayerParam p) const;  // nullptr when the layer lacks it
};

// Gemma 4's model-level per-layer input tensors live in the embedding blob after the token table
// (entries[0]): embed_tokens_per_layer [V_pl, L*P], per_layer_model_projection [L*P, H],
// per_layer_projection_norm [P], in this order (absent without per-layer inputs).
enum class PleEntry : int { Table = 1, Projection = 2, Norm = 3 };

// All blobs of a model, in slide order: embedding, layers 0..L-1, head (final norm [+ lm_head]).
struct ModelLayout {
  std::vector<BlobLayout> blobs;
  int64_t total_numel() const;
  int64_t max_blob_numel() const;
  const BlobLayout& embedding() const { return blobs.front(); }
  const BlobLayout& head() const { return blobs.back(); }
  const BlobLayout& layer(int i) const { return blobs[1 + i]; }
};

ModelLayout make_layout(const ModelSpec& s);

// Views of one layer's parameters inside a blob at `base` with storage `dtype` (empty where absent).
struct LayerParams {
  Tensor t[int(LayerParam::Count)];
  int layer = -1;  // the decoder layer (BlobLayout::layer): local or global attention
  const Tensor& operator[](LayerParam p) const { return t[int(p)]; }
};
LayerParams layer_views(const BlobLayout& b, void* base, DType dtype);
// A view of one entry (2-D [rows, cols] for matrices, 1-D otherwise).
Tensor entry_view(const BlobEntry& e, void* base, DType dtype);

}  // namespace sf
