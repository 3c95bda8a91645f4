#include "engine/kv_share_store.h"

#include <algorithm>
#include <string>

#include "core/align.h"
#include "core/error.h"

namespace sf {

namespace {

// Each layer's source role: KV width where some later layer shares its K/V, else 0.
std::vector<int64_t> source_widths(const ModelSpec& s) {
  std::vector<int64_t> kv(size_t(std::max(s.n_layer, 0)), 0);
  if (s.arch != Arch::Gemma4) return kv;
  const Gemma4Spec& g = s.gemma4;
  for (int l = 0; l < s.n_layer; ++l)
    if (g.kv_shared(l)) {
      const int src = g.kv_source[size_t(l)];
      kv[size_t(src)] = int64_t(g.kv_heads[size_t(src)]) * g.head_dim[size_t(src)];
    }
  return kv;
}

int parts(const EngineOptions& o) { return o.training ? 4 : 2; }  // k, v (, dk, dv)

// Bytes of one micro-batch's set, and each source's offset in it.
size_t kv_layout_of(const ModelSpec& s, const EngineOptions& o, DType act, std::vector<size_t>* offsets) {
  const std::vector<int64_t> kv = source_widths(s);
  const size_t n = size_t(int64_t(o.max_batch) * o.max_seq);
  size_t at = 0;
  if (offsets) offsets->assign(kv.size(), 0);
  for (size_t l = 0; l < kv.size(); ++l) {
    if (kv[l] == 0) continue;
    if (offsets) (*offsets)[l] = at;
    at += size_t(parts(o)) * round256(n * size_t(kv[l]) * dtype_size(act));
  }
  return at;
}

}  // namespace

MemoryItems KvShareStore::buffers(const ModelSpec& s, const EngineOptions& o, DType act, int micro) {
  const size_t set = kv_layout_of(s, o, act, nullptr);
  if (set == 0) return {};
  return {{std::string("shared K/V of the source layers") + (o.training ? " and their gradients" : ""),
           size_t(std::max(micro, 1)) * set, Place::Device, "kvshare"}};
}

KvShareStore::KvShareStore(BufferSource& src, const ModelSpec& s, const EngineOptions& o, DType act, int micro)
    : s_(&s), act_(act), micro_(std::max(micro, 1)), grads_(o.training) {
  kv_ = source_widths(s);
  stride_ = kv_layout_of(s, o, act, &offset_);
  max_n_ = int64_t(o.max_batch) * o.max_seq;
  if (stride_ > 0) buf_ = src.buffer("kvshare");
}

LayerBuffers KvShareStore::bind(LayerBuffers w, int l, int j, const BatchDims& d) const {
  if (s_ == nullptr || s_->arch != Arch::Gemma4 || l < 0 || l >= s_->n_layer) return w;
  const int src = s_->gemma4.kv_source[size_t(l)];
  const int64_t KV = kv_[size_t(src)];
  if (KV == 0) return w;  // neither shares nor is shared
  SF_CHECK(j >= 0 && j < micro_, "shared K/V: no micro-batch " + std::to_string(j));
  SF_CHECK(d.N() <= max_n_, "shared K/V: batch larger than the engine was built for");
  const size_t part = round256(size_t(max_n_) * size_t(KV) * dtype_size(act_));
  char* base = static_cast<char*>(buf_.data()) + size_t(j) * stride_ + offset_[size_t(src)];
  auto view = [&](int i) { return Tensor(base + size_t(i) * part, act_, {d.N(), KV}); };
  w.kv_k = view(0);
  w.kv_v = view(1);
  if (grads_) {
    w.kv_dk = view(2);
    w.kv_dv = view(3);
  }
  return w;
}

void KvShareStore::zero_grads(int j, Ops& ops, Stream& st) const {
  if (!grads_ || stride_ == 0) return;
  SF_CHECK(j >= 0 && j < micro_, "shared K/V: no micro-batch " + std::to_string(j));
  for (size_t l = 0; l < kv_.size(); ++l) {
    if (kv_[l] == 0) continue;
    const size_t part = round256(size_t(max_n_) * size_t(kv_[l]) * dtype_size(act_));
    char* base = static_cast<char*>(buf_.data()) + size_t(j) * stride_ + offset_[l];
    ops.zero(Tensor(base + 2 * part, act_, {max_n_ * kv_[l]}), st);
    ops.zero(Tensor(base + 3 * part, act_, {max_n_ * kv_[l]}), st);
  }
}

}  // namespace sf
