// Gemma 4 per-layer inputs (Gemma4Spec::ple_dim; docs/GEMMA4.md section 4), shared by both engines:
// per micro-batch alive between its forward and its backward, the layer-major inputs pli and their
// gradient [L * max N, P] and the model-level buffers PleProgram keeps from the embedding's forward
// to its backward (PleModelBuffers); one F32 padding row. Nothing for other models.
#pragma once
#include <cstddef>
#include <vector>

#include "backend/device.h"
#include "engine/buffers.h"
#include "engine/engine.h"
#include "model/gemma4_ple.h"
#include "model/program.h"
#include "model/spec.h"

namespace sf {

class PleStore {
 public:
  // The item "ple" on the device: `micro` sets and the padding row.
  static MemoryItems buffers(const ModelSpec& s, const EngineOptions& o, DType act, int micro);

  PleStore() = default;
  PleStore(BufferSource& src, const ModelSpec& s, const EngineOptions& o, DType act, int micro);
  bool active() const { return stride_ > 0; }

  // Micro-batch j's permutations for N tokens (uploaded when N changed for j: the host copy must
  // outlive the upload, so a change waits for st first).
  void prepare(int j, int64_t N, Device& dev, Stream& st);
  // Micro-batch j's views at N tokens: pli, dpli [L*N, P] and the model-level buffers.
  Tensor pli(int j, int64_t N) const { return part(j, 0, {int64_t(s_->n_layer) * N, P()}); }
  Tensor dpli(int j, int64_t N) const { return part(j, 1, {int64_t(s_->n_layer) * N, P()}); }
  PleModelBuffers model(int j, int64_t N) const;
  // w with pli_l / dpli_l set to layer l's rows of micro-batch j (w unchanged without PLE).
  LayerBuffers bind(LayerBuffers w, int l, int j, const BatchDims& d) const;

  // The engines' two calls (nothing without PLE). forward: after the embedding's forward, e [N, H]
  // its output, params the embedding blob's parameters (compute dtype); with training it keeps e
  // and the projection's parameters for the backward. backward: after layer 0's backward and
  // before the embedding's, de [N, H] (+=) and grads the embedding blob's F32 gradients (+=).
  void forward(int j, Tensor ids, Tensor e, const BlobLayout& emb, void* params, bool training, Device& dev,
               Stream& st);
  void backward(int j, Tensor ids, Tensor de, const BlobLayout& emb, void* grads, Device& dev, Stream& st) const;

 private:
  int64_t P() const { return s_->gemma4.ple_dim; }
  Tensor part(int j, int i, std::initializer_list<int64_t> dims) const;
  // The ids the per-layer table is looked up with: ids, or (a table shorter than the vocabulary)
  // micro-batch j's copy with the ids past it set to 0, transformers' lookup.
  Tensor table_ids(int j, Tensor ids, Device& dev, Stream& st) const;
  char* shared() const;      // after the sets: the padding row, the projection's copies
  Tensor proj_copy() const;  // [L*P, H] act
  Tensor norm_copy() const;  // [P] act
  const ModelSpec* s_ = nullptr;
  DType act_ = DType::F32;
  int micro_ = 0;
  int64_t max_n_ = 0;
  std::vector<size_t> off_;  // [9] byte offsets in one set: pli, dpli, tok, ctx, rstd, order, inverse, e, ids
  size_t stride_ = 0;        // bytes of one set
  std::vector<int64_t> n_;   // [micro] N of the uploaded permutations (0: none)
  std::vector<std::vector<int32_t>> host_;  // [micro][2 * N * L] order then inverse (kept for the upload)
  DeviceBuffer buf_;                        // [micro sets][shared: padding row F32 [L*P], projection copy, norm copy]
};

}  // namespace sf
