#include "engine/ple_store.h"

#include <algorithm>
#include <string>

#include "core/align.h"
#include "core/error.h"

namespace sf {

namespace {

bool has_ple(const ModelSpec& s) { return s.arch == Arch::Gemma4 && s.gemma4.ple_dim > 0; }

// Whether token ids can fall past the per-layer table (vocab_size_per_layer_input < vocab_size):
// transformers looks those up as row 0, so the lookup reads a mapped copy of the ids.
bool short_table(const ModelSpec& s) { return s.gemma4.ple_vocab < s.vocab; }

// Bytes of one micro-batch's set and its parts' offsets (pli, dpli, tok, ctx, rstd, order, inverse,
// e, the table's ids).
size_t ple_layout_of(const ModelSpec& s, const EngineOptions& o, DType act, std::vector<size_t>* off) {
  if (!has_ple(s)) return 0;
  const size_t n = size_t(int64_t(o.max_batch) * o.max_seq), rows = n * size_t(s.n_layer);
  const size_t a = dtype_size(act), P = size_t(s.gemma4.ple_dim);
  const size_t sizes[9] = {rows * P * a,
                           o.training ? rows * P * a : 0,
                           rows * P * a,
                           rows * P * a,
                           rows * 4,
                           rows * 4,
                           rows * 4,
                           o.training ? n * size_t(s.hidden) * a : 0,
                           short_table(s) ? n * 4 : 0};
  size_t at = 0;
  if (off) off->assign(9, 0);
  for (int i = 0; i < 9; ++i) {
    if (off) (*off)[size_t(i)] = at;
    at += round256(sizes[i]);
  }
  return at;
}

// After the sets: the padding row F32 [L*P] and the copies of the projection [L*P, H] and its norm
// [P] in the compute dtype (the backward's: the sliding engine no longer holds the blob then).
size_t shared_bytes(const ModelSpec& s, DType act) {
  const size_t LP = size_t(s.n_layer) * size_t(s.gemma4.ple_dim), a = dtype_size(act);
  return round256(LP * 4) + round256(LP * size_t(s.hidden) * a) + round256(size_t(s.gemma4.ple_dim) * a);
}

}  // namespace

MemoryItems PleStore::buffers(const ModelSpec& s, const EngineOptions& o, DType act, int micro) {
  const size_t set = ple_layout_of(s, o, act, nullptr);
  if (set == 0) return {};
  return {
      {"per-layer inputs (Gemma 4)", size_t(std::max(micro, 1)) * set + shared_bytes(s, act), Place::Device, "ple"}};
}

PleStore::PleStore(BufferSource& src, const ModelSpec& s, const EngineOptions& o, DType act, int micro)
    : s_(&s), act_(act), micro_(std::max(micro, 1)) {
  stride_ = ple_layout_of(s, o, act, &off_);
  max_n_ = int64_t(o.max_batch) * o.max_seq;
  n_.assign(size_t(micro_), 0);
  host_.resize(size_t(micro_));
  if (stride_ > 0) buf_ = src.buffer("ple");
}

Tensor PleStore::part(int j, int i, std::initializer_list<int64_t> dims) const {
  SF_CHECK(active() && j >= 0 && j < micro_, "per-layer inputs: no micro-batch " + std::to_string(j));
  const DType dt = i == 4 ? DType::F32 : (i == 5 || i == 6 || i == 8) ? DType::I32 : act_;
  return Tensor(static_cast<char*>(buf_.data()) + size_t(j) * stride_ + off_[size_t(i)], dt, dims);
}

void PleStore::prepare(int j, int64_t N, Device& dev, Stream& st) {
  SF_CHECK(N > 0 && N <= max_n_, "per-layer inputs: batch larger than the engine was built for");
  (void)part(j, 0, {1});  // checks j
  if (n_[size_t(j)] == N) return;
  if (n_[size_t(j)] != 0) dev.synchronize(st);  // the previous upload read host_[j]
  const int64_t L = s_->n_layer;
  std::vector<int32_t>& h = host_[size_t(j)];
  h.assign(size_t(2 * N * L), 0);
  ple_fill_permutations(h.data(), h.data() + N * L, N, L);
  dev.copy(part(j, 5, {N * L}).data, h.data(), size_t(N * L) * 4, CopyKind::HostToDevice, st);
  dev.copy(part(j, 6, {N * L}).data, h.data() + N * L, size_t(N * L) * 4, CopyKind::HostToDevice, st);
  n_[size_t(j)] = N;
}

PleModelBuffers PleStore::model(int j, int64_t N) const {
  SF_CHECK(n_[size_t(j)] == N, "per-layer inputs: prepare() not called for this batch");
  const int64_t L = s_->n_layer, LP = L * P();
  PleModelBuffers b;
  b.tok = part(j, 2, {N, LP});
  b.ctx = part(j, 3, {N, LP});
  b.rstd = part(j, 4, {N * L});
  b.order = part(j, 5, {N * L});
  b.inverse = part(j, 6, {N * L});
  b.pad_row = Tensor(shared(), DType::F32, {LP});
  return b;
}

Tensor PleStore::table_ids(int j, Tensor ids, Device& dev, Stream& st) const {
  if (!short_table(*s_)) return ids;
  const Tensor out = part(j, 8, {ids.numel()});
  dev.ops().ids_or_zero(out, ids, s_->gemma4.ple_vocab, st);
  return out;
}

char* PleStore::shared() const { return static_cast<char*>(buf_.data()) + size_t(micro_) * stride_; }
Tensor PleStore::proj_copy() const {
  const int64_t LP = int64_t(s_->n_layer) * P();
  return Tensor(shared() + round256(size_t(LP) * 4), act_, {LP, s_->hidden});
}
Tensor PleStore::norm_copy() const {
  const int64_t LP = int64_t(s_->n_layer) * P();
  return Tensor(shared() + round256(size_t(LP) * 4) + round256(size_t(LP * s_->hidden) * dtype_size(act_)), act_,
                {P()});
}

LayerBuffers PleStore::bind(LayerBuffers w, int l, int j, const BatchDims& d) const {
  if (!active() || l < 0 || l >= s_->n_layer) return w;
  const int64_t N = d.N(), rows = N * P();
  const size_t a = dtype_size(act_);
  char* base = static_cast<char*>(buf_.data()) + size_t(j) * stride_;
  w.pli_l = Tensor(base + off_[0] + size_t(l) * size_t(rows) * a, act_, {N, P()});
  if (off_[1] != off_[2]) w.dpli_l = Tensor(base + off_[1] + size_t(l) * size_t(rows) * a, act_, {N, P()});
  return w;
}

void PleStore::forward(int j, Tensor ids, Tensor e, const BlobLayout& emb, void* params, bool training, Device& dev,
                       Stream& st) {
  if (!active()) return;
  const int64_t N = e.rows();
  prepare(j, N, dev, st);
  auto v = [&](PleEntry k) { return entry_view(emb.entries[size_t(k)], params, act_); };
  PleProgram(*s_, dev.ops(), act_)
      .inputs_forward(pli(j, N), table_ids(j, ids, dev, st), e, v(PleEntry::Table), v(PleEntry::Projection),
                      v(PleEntry::Norm), model(j, N), st);
  if (!training) return;
  // What the backward reads: e, and (once a pass: the same parameters for every micro-batch) the
  // projection and its norm.
  dev.ops().cast(part(j, 7, {N, s_->hidden}), e, st);
  if (j == 0) {
    dev.ops().cast(proj_copy(), v(PleEntry::Projection), st);
    dev.ops().cast(norm_copy(), v(PleEntry::Norm), st);
  }
}

void PleStore::backward(int j, Tensor ids, Tensor de, const BlobLayout& emb, void* grads, Device& dev,
                        Stream& st) const {
  if (!active()) return;
  const int64_t N = de.rows();
  auto g = [&](PleEntry k) { return entry_view(emb.entries[size_t(k)], grads, DType::F32); };
  PleProgram(*s_, dev.ops(), act_)
      .inputs_backward(de, g(PleEntry::Table), g(PleEntry::Projection), g(PleEntry::Norm), dpli(j, N),
                       table_ids(j, ids, dev, st), part(j, 7, {N, s_->hidden}), proj_copy(), norm_copy(), model(j, N),
                       st);
}

}  // namespace sf
