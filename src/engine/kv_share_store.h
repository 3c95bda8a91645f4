// Gemma 4 K/V sharing (Gemma4Spec::kv_source; docs/GEMMA4.md), shared by both engines: the keys and
// values of each source layer (a layer whose K/V later layers attend to), kept from its forward to
// the backward of the layers sharing them, and the gradient those layers add for the source's
// backward (which runs after theirs). One set per micro-batch alive between its forward and its
// backward, as KeptActivations: 1 in the resident engine, the step's micro-batches in the sliding one.
#pragma once
#include <cstddef>
#include <vector>

#include "engine/buffers.h"
#include "engine/engine.h"
#include "model/program.h"
#include "model/spec.h"

namespace sf {

class KvShareStore {
 public:
  // The item "kvshare" on the device, for models with shared K/V: per micro-batch, per source
  // layer, its k and v [max N, KV] act and, with training, their gradient accumulators; nothing
  // for other models.
  static MemoryItems buffers(const ModelSpec& s, const EngineOptions& o, DType act, int micro);

  KvShareStore() = default;
  KvShareStore(BufferSource& src, const ModelSpec& s, const EngineOptions& o, DType act, int micro);

  // w with LayerBuffers::kv_* set to micro-batch j's store of layer l's source (l's own when l is
  // a source) at d's tokens; w unchanged when l neither shares nor is shared.
  LayerBuffers bind(LayerBuffers w, int l, int j, const BatchDims& d) const;
  // Zeroes micro-batch j's gradient accumulators (before its backward's first layer).
  void zero_grads(int j, Ops& ops, Stream& st) const;

 private:
  const ModelSpec* s_ = nullptr;
  DType act_ = DType::F32;
  int micro_ = 0;
  bool grads_ = false;
  int64_t max_n_ = 0;
  std::vector<int64_t> kv_;     // [n_layer] a source's KV width, 0 for other layers
  std::vector<size_t> offset_;  // [n_layer] a source's byte offset inside one micro-batch's set
  size_t stride_ = 0;           // bytes of one micro-batch's set
  DeviceBuffer buf_;            // [micro][sources][k, v (, dk, dv)] each [max N, KV] act, 256-aligned
};

}  // namespace sf
