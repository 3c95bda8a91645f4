// Selective recompute's buffers (EngineOptions::whole_layers, kept_layers; docs/ENGINE.md
// "Selective recompute"), shared by both engines: the first whole_layers decoder layers keep every
// activation their backward reads (their own Workspace::layer_kept block: no recompute), the next
// kept_layers keep attention's output and log-sum-exp (KeptActs: their recompute skips attention).
// One set per micro-batch that is alive between its forward and its backward: the resident engine
// runs a micro-batch's backward right after its forward (1), the sliding engine runs every
// micro-batch's forward of a layer before any backward (the step's micro-batches).
#pragma once
#include <cstddef>

#include "engine/buffers.h"
#include "engine/engine.h"
#include "model/program.h"
#include "model/spec.h"

namespace sf {

class KeptActivations {
 public:
  // Bytes of one layer's kept attention output [N, Q] act and its statistics [B * n_head * T] F32,
  // each 256-aligned, at max_batch x max_seq (one micro-batch).
  static size_t attention_bytes(const ModelSpec& s, int max_batch, int max_seq, DType act);
  // Bytes of one layer kept whole, one micro-batch (Workspace::forward_bytes_for).
  static size_t whole_bytes(const ModelSpec& s, int max_batch, int max_seq, DType act);
  // The items "whole" and "kept" (each only when its count is positive and o.training):
  // [whole_layers][micro] x whole_bytes and [kept_layers][micro] x attention_bytes, on the device.
  static MemoryItems buffers(const ModelSpec& s, const EngineOptions& o, DType act, int micro);

  KeptActivations() = default;
  // Allocates the items buffers() lists from `src` (none when the counts are 0).
  KeptActivations(BufferSource& src, const ModelSpec& s, const EngineOptions& o, DType act, int micro);

  bool whole(int l) const { return l < whole_layers_; }
  // Layer l's activation buffers for micro-batch j: its own block when kept whole, else ws.layer(d).
  LayerBuffers layer(const Workspace& ws, int l, int j, const BatchDims& d) const;
  // Layer l's kept attention output for micro-batch j (empty: not kept, or kept whole).
  KeptActs attention(int l, int j, const BatchDims& d) const;
  size_t device_bytes() const { return whole_buf_.size() + kept_buf_.size(); }

 private:
  const ModelSpec* s_ = nullptr;
  DType act_ = DType::F32;
  int micro_ = 1;
  int whole_layers_ = 0, kept_layers_ = 0;
  DeviceBuffer whole_buf_;  // [whole_layers][micro] blocks of whole_stride_ bytes
  DeviceBuffer kept_buf_;   // [kept_layers][micro] {att, lse} of kept_stride_ bytes
  size_t whole_stride_ = 0, kept_att_ = 0, kept_stride_ = 0;
};

}  // namespace sf
