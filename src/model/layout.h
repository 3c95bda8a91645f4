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
  Count
};

struct BlobEntry {
  std::string name;            // HF tensor name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape
  int64_t offset = 0;          // in elements from the blob start (multiple of 128)
  int64_t numel = 0;
  int param = -1;  // LayerParam index for layers, else -1
};

enum class BlobKind { Embedding, Layer, Head };

struct BlobLayout {
  BlobKind kind = BlobKind::Layer;
  int layer = -1;  // for BlobKind::Layer
  std::vector<BlobEntry> entries;
  int64_t numel = 0;  // padded size in elements
  // Entry for a LayerParam, or nullptr when the architecture has no such tensor.
  const BlobEntry* entry(LayerParam p) const;  // nullptr when the layer lacks it
};

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
  const Tensor& operator[](LayerParam p) const { return t[int(p)]; }
};
LayerParams layer_views(const BlobLayout& b, void* base, DType dtype);
// A view of one entry (2-D [rows, cols] for matrices, 1-D otherwise).
Tensor entry_view(const BlobEntry& e, void* base, DType dtype);

}  // namespace sf
