#include "engine/kept_activations.h"

#include <algorithm>
#include <string>

#include "core/align.h"
#include "core/error.h"

namespace sf {

namespace {
size_t att_part(const ModelSpec& s, int max_batch, int max_seq, DType act) {
  return round256(size_t(int64_t(max_batch) * max_seq * max_q_dim(s)) * dtype_size(act));
}
size_t lse_part(const ModelSpec& s, int max_batch, int max_seq) {
  return round256(size_t(int64_t(max_batch) * max_seq * s.n_head) * 4);
}
}  // namespace

size_t KeptActivations::attention_bytes(const ModelSpec& s, int max_batch, int max_seq, DType act) {
  return att_part(s, max_batch, max_seq, act) + lse_part(s, max_batch, max_seq);
}

size_t KeptActivations::whole_bytes(const ModelSpec& s, int max_batch, int max_seq, DType act) {
  return Workspace::forward_bytes_for(s, max_batch, max_seq, act);
}

MemoryItems KeptActivations::buffers(const ModelSpec& s, const EngineOptions& o, DType act, int micro) {
  MemoryItems m;
  const size_t k = size_t(std::max(micro, 1));
  if (o.training && o.whole_layers > 0)
    m.push_back({"layer activations kept whole (selective recompute)",
                 size_t(o.whole_layers) * k * whole_bytes(s, o.max_batch, o.max_seq, act), Place::Device, "whole"});
  if (o.training && o.kept_layers > 0)
    m.push_back({"kept attention outputs (selective recompute)",
                 size_t(o.kept_layers) * k * attention_bytes(s, o.max_batch, o.max_seq, act), Place::Device, "kept"});
  return m;
}

KeptActivations::KeptActivations(BufferSource& src, const ModelSpec& s, const EngineOptions& o, DType act, int micro)
    : s_(&s), act_(act), micro_(std::max(micro, 1)) {
  SF_CHECK(o.whole_layers >= 0 && o.kept_layers >= 0 && o.whole_layers + o.kept_layers <= s.n_layer,
           "more kept layers than the model has");
  whole_buf_ = src.buffer_if("whole");
  if (whole_buf_.data()) {
    whole_layers_ = o.whole_layers;
    whole_stride_ = whole_bytes(s, o.max_batch, o.max_seq, act);
  }
  kept_buf_ = src.buffer_if("kept");
  if (kept_buf_.data()) {
    kept_layers_ = o.kept_layers;
    kept_att_ = att_part(s, o.max_batch, o.max_seq, act);
    kept_stride_ = kept_att_ + lse_part(s, o.max_batch, o.max_seq);
  }
}

LayerBuffers KeptActivations::layer(const Workspace& ws, int l, int j, const BatchDims& d) const {
  if (!whole(l)) return ws.layer(d);
  SF_CHECK(j >= 0 && j < micro_, "kept activations: no micro-batch " + std::to_string(j));
  return ws.layer_kept(
      d, static_cast<char*>(whole_buf_.data()) + (size_t(l) * size_t(micro_) + size_t(j)) * whole_stride_);
}

KeptActs KeptActivations::attention(int l, int j, const BatchDims& d) const {
  if (l < whole_layers_ || l >= whole_layers_ + kept_layers_) return {};
  SF_CHECK(j >= 0 && j < micro_, "kept activations: no micro-batch " + std::to_string(j));
  char* p =
      static_cast<char*>(kept_buf_.data()) + (size_t(l - whole_layers_) * size_t(micro_) + size_t(j)) * kept_stride_;
  return {Tensor(p, act_, {d.N(), max_q_dim(*s_)}), Tensor(p + kept_att_, DType::F32, {int64_t(d.B) * s_->n_head * d.T})};
}

}  // namespace sf
