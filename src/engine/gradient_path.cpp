#include "engine/gradient_path.h"

#include <algorithm>
#include <string>

#include "core/align.h"
#include "core/error.h"
#include "engine/step_trace.h"

namespace sf {

namespace {
const char* const kAccKey[4] = {"acc.layer", "acc.layer", "acc.emb", "acc.head"};
}  // namespace

MemoryItems GradientPath::buffers(const GradientPathOptions& o) {
  const std::string acc = "fp32 gradient accumulators (2 layers, embedding, head)";
  const int64_t numel[4] = {o.max_layer, o.max_layer, o.emb, o.head};
  MemoryItems m;
  for (int i = 0; i < 4; ++i) m.push_back({acc, round256(size_t(numel[i]) * 4), Place::Device, kAccKey[i]});
  if (o.act != DType::F32)
    m.push_back({"gradient staging (2 chunks)", 2 * round256(size_t(o.chunk) * dtype_size(o.act)), Place::Device,
                 "grad.staging"});
  if (o.early_chunk > 0 && o.act != DType::F32)
    m.push_back({"gradient staging of the embedding's untouched rows (2 chunks)",
                 2 * round256(size_t(o.early_chunk) * dtype_size(o.act)), Place::Device, "grad.early_staging"});
  return m;
}

GradientPath::GradientPath(Device& dev, const GradientPathOptions& o, Streams streams, HostOptimizer& host,
                           float* norms, StepTrace* trace)
    : dev_(dev),
      act_(o.act),
      chunk_(o.chunk),
      s_(streams),
      host_(host),
      norms_(norms),
      trace_(trace),
      staging_stride_(round256(size_t(o.chunk) * dtype_size(o.act))) {
  BufferSource src(dev, buffers(o));
  for (int i = 0; i < 4; ++i) {
    acc_[i].buf = src.buffer(kAccKey[i]);
    acc_[i].sent = dev.create_event();
  }
  staging_ = src.buffer_if("grad.staging");
  for (int i = 0; i < 2; ++i) {
    stg_ready_[i] = dev.create_event();
    stg_free_[i] = dev.create_event();
  }
  grads_ready_ = dev.create_event();
  chunk_landed_ = dev.create_event();
  early_chunk_ = o.early_chunk;
  if (early_chunk_ > 0) {
    early_ = dev.create_stream();
    early_staging_ = src.buffer_if("grad.early_staging");
    early_stride_ = round256(size_t(early_chunk_) * dtype_size(o.act));
    for (auto& e : early_free_) e = dev.create_event();
    early_ready_ = dev.create_event();
    early_read_ = dev.create_event();
    early_landed_ = dev.create_event();
  }
}

size_t GradientPath::device_bytes() const {
  size_t n = staging_.size() + early_staging_.size();
  for (const Accumulator& a : acc_) n += a.buf.size();
  return n;
}

void GradientPath::mark(Stream& s, const char* name, const char* what, int index, const char* suffix) {
  if (trace_) trace_->mark(s, name, what + (" " + std::to_string(index)) + suffix);
}

GradientPath::Grad GradientPath::fresh(Acc which, int64_t numel, float* kept, void* kept_low) {
  int i = int(which) + 1;     // Embedding 2, Head 3
  if (which == Acc::Layer) {  // the layers alternate, kept ones included
    i = next_layer_;
    next_layer_ ^= 1;
  }
  if (kept) return {Tensor(kept, DType::F32, {numel}), -1, Tensor()};
  Accumulator& a = acc_[i];
  dev_.wait(s_.compute, *a.sent);  // its last contents have left
  Tensor t(a.buf.data(), DType::F32, {numel});
  dev_.ops().zero(t, s_.compute);
  return {t, i, kept_low ? Tensor(kept_low, act_, {numel}) : Tensor()};
}

// A kept blob's gradient rounded in place, as the resident engine does.
void GradientPath::round_kept(Tensor g) {
  if (act_ == DType::F32) return;
  float* gp = g.ptr<float>();
  const int64_t n = g.numel();
  dev_.wait(s_.compute, *stg_free_[0]);  // no copy down reads staging 0 any more
  for (int64_t i = 0; i < n; i += chunk_) {
    const int64_t c = std::min(chunk_, n - i);
    Tensor part(gp + i, DType::F32, {c}), st(staging_.data(), act_, {c});
    dev_.ops().cast(st, part, s_.compute);
    dev_.ops().cast(part, st, s_.compute);
  }
}

void GradientPath::send(int blob, const Grad& grad, bool update_chunks, const AdamWParams& p, const UpdateRows& rows) {
  const Tensor& g = grad.g;
  const int64_t n = g.numel();
  float* gp = g.ptr<float>();
  Tensor norm(norms_ + blob, DType::F32, {1});
  if (grad.acc < 0) {
    round_kept(g);
    dev_.ops().sq_norm(norm, g, s_.compute);
    return;
  }
  if (!grad.low.empty()) {  // a kept layer: rounded into its own store, the norm of the rounded values as above
    dev_.ops().cast(grad.low, g, s_.compute);
    dev_.ops().cast(g, grad.low, s_.compute);
    dev_.ops().sq_norm(norm, g, s_.compute);
    dev_.record(*acc_[grad.acc].sent, s_.compute);
    return;
  }
  if (act_ == DType::F32) {  // copied down as it is
    dev_.record(*grads_ready_, s_.compute);
    dev_.wait(s_.d2h, *grads_ready_);
  }
  for (int64_t i = 0; i < n; i += chunk_) {
    const int64_t c = std::min(chunk_, n - i);
    const HostOptimizer::Landing at = host_.land(blob, i, s_.d2h);
    if (act_ == DType::F32) {
      dev_.copy(at.ptr, gp + i, size_t(c) * 4, CopyKind::DeviceToHost, s_.d2h);
    } else {
      const int s = next_stg_;
      next_stg_ ^= 1;
      Tensor part(gp + i, DType::F32, {c});
      Tensor st(static_cast<char*>(staging_.data()) + size_t(s) * staging_stride_, act_, {c});
      dev_.wait(s_.compute, *stg_free_[s]);
      dev_.ops().cast(st, part, s_.compute);
      dev_.ops().cast(part, st, s_.compute);  // the norm (and the resident engine) see the rounded values
      dev_.record(*stg_ready_[s], s_.compute);
      dev_.wait(s_.d2h, *stg_ready_[s]);
      dev_.copy(at.ptr, st.data, size_t(c) * dtype_size(act_), CopyKind::DeviceToHost, s_.d2h);
      dev_.record(*stg_free_[s], s_.d2h);
    }
    host_.landed(blob, i, c, at, s_.d2h);  // (NVMe tier: a held gradient in the store is written out)
    if (update_chunks) {
      dev_.record(*chunk_landed_, s_.d2h);
      dev_.wait(s_.opt, *chunk_landed_);
      if (i == 0) mark(s_.opt, "opt", "update", blob);
      host_.queue_update(blob, i, c, at, p, s_.opt, cpu::AdamWPart::All, rows);
    }
  }
  mark(s_.d2h, "d2h", "landed", blob);
  if (update_chunks) mark(s_.opt, "opt", "updated", blob);
  dev_.record(*acc_[grad.acc].sent, s_.d2h);
  dev_.ops().sq_norm(norm, g, s_.compute);
}

void GradientPath::send_early(int blob, const Grad& grad, const AdamWParams& p, const UpdateRows& rows) {
  SF_CHECK(early_ && grad.acc >= 0 && rows.flags && rows.want == 0, "send_early: the embedding's first part");
  Stream& e = *early_;
  const float* gp = grad.g.ptr<float>();
  const int64_t n = grad.g.numel();
  dev_.record(*early_ready_, s_.compute);
  dev_.wait(e, *early_ready_);
  for (int64_t i = 0; i < n; i += early_chunk_) {
    const int64_t c = std::min(early_chunk_, n - i);
    const HostOptimizer::Landing at = host_.land(blob, i, e);
    if (act_ == DType::F32) {
      dev_.copy(at.ptr, gp + i, size_t(c) * 4, CopyKind::DeviceToHost, e);
    } else {  // rounded as send() rounds, into staging only
      const int s = early_next_;
      early_next_ ^= 1;
      Tensor st(static_cast<char*>(early_staging_.data()) + size_t(s) * early_stride_, act_, {c});
      dev_.wait(e, *early_free_[s]);
      dev_.ops().cast(st, Tensor(const_cast<float*>(gp) + i, DType::F32, {c}), e);
      dev_.copy(at.ptr, st.data, size_t(c) * dtype_size(act_), CopyKind::DeviceToHost, e);
      dev_.record(*early_free_[s], e);
    }
    host_.landed(blob, i, c, at, e);
    dev_.record(*early_landed_, e);
    dev_.wait(s_.opt, *early_landed_);
    if (i == 0) mark(s_.opt, "opt", "update", blob, " untouched rows");
    host_.queue_update(blob, i, c, at, p, s_.opt, cpu::AdamWPart::All, rows);
  }
  mark(s_.opt, "opt", "updated", blob, " untouched rows");
  dev_.record(*early_read_, e);
}

void GradientPath::before_rows_written() {
  if (early_) dev_.wait(s_.compute, *early_read_);
}

void GradientPath::queue_update(int blob, int64_t i0, int64_t n, const AdamWParams& p, cpu::AdamWPart part) {
  const char* g = static_cast<const char*>(host_.grads(blob));
  const HostOptimizer::Landing at{g ? const_cast<char*>(g) + size_t(i0) * dtype_size(host_.grad_dtype()) : nullptr, -1};
  static const char* const kPart[] = {"", " params", " moments"};
  mark(s_.opt, "opt", "update", blob, kPart[int(part)]);
  host_.queue_update(blob, i0, n, at, p, s_.opt, part);
  mark(s_.opt, "opt", "updated", blob, kPart[int(part)]);
}

}  // namespace sf
