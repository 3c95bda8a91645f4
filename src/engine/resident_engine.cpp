#include "engine/resident_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/align.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/blob_init.h"
#include "engine/device_rope.h"
#include "engine/kept_activations.h"
#include "engine/kv_share_store.h"
#include "engine/ple_store.h"
#include "engine/moe_stats.h"
#include "engine/state_copy.h"
#include "engine/token_uploader.h"
#include "io/checkpoint.h"

namespace sf {

namespace {

DType compute_dtype_for(const Device& d, const std::string& name) {
  if (name.empty()) return d.is_host() ? DType::F32 : DType::BF16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp32" || name == "float32") {
    if (!d.is_host()) setting_error(Setting::ComputeDtype, "fp32 compute is only available on the cpu backend");
    return DType::F32;
  }
  setting_error(Setting::ComputeDtype, "unknown compute dtype '" + name + "' (expected fp32 or bf16)");
}

}  // namespace

struct ResidentEngine::Impl {
  Impl(Device& dev, const ModelSpec& s, const ModelLayout& layout, const EngineOptions& opt);

  Device& dev;
  const ModelSpec& spec;
  const ModelLayout& layout;
  DType act;                      // activation / compute-parameter dtype: F32 on cpu, BF16 elsewhere
  std::vector<int64_t> blob_off;  // element offset of each blob in the flat buffers
  int64_t total = 0;              // elements in the flat buffers

  DeviceBuffer master;          // [total] F32 parameters (fp32 masters)
  DeviceBuffer compute;         // [total] act copy of the parameters (only when act != F32)
  DeviceBuffer grads;           // [total] F32
  DeviceBuffer adam_m, adam_v;  // [total] sd
  DType sd = DType::F32;        // AdamW m and v (EngineOptions::state_dtype)
  DeviceBuffer round_buf;       // [min(total, kGradRoundChunk)] act: round_grads (act != F32)
  DeviceBuffer ckpt;            // [L+1, N, H] act: layer inputs (checkpoints) + final hidden state
  DeviceBuffer dbuf;            // [3, N, H] act: dy, dx, recompute output scratch
  // Selective recompute (EngineOptions::whole_layers, kept_layers): one micro-batch's at a time.
  KeptActivations kept;
  KvShareStore kv_share;  // Gemma 4 K/V sharing: one micro-batch's at a time
  PleStore ple;           // Gemma 4 per-layer inputs: one micro-batch's at a time
  // [max_micro, N, H] act (training with several micro-batches): each micro-batch's gradient at the
  // embedding output, kept so that every embedding backward of a step runs after every head's —
  // the order in which the sliding engine's layer-major micro-batches add into a tied embedding.
  DeviceBuffer dy0;
  struct Deferred {
    int64_t N = 0;
    Tensor ids;
    int token_slot = -1;
  };
  std::vector<Deferred> deferred;  // the step's micro-batches whose embedding backward waits
  bool defer = false;
  std::unique_ptr<TokenUploader> tokens;
  DeviceBuffer scalars;    // engine_scalar_bytes: loss sum, per-blob squared norms
  DeviceBuffer moe_stats;  // [2, E] F32 router statistics of the running micro-batch (engine/moe_stats.h)
  int micro_in_step = 1;   // micro-batches of the running step (weights the load-balancing loss)
  std::unique_ptr<DeviceRope> rope_dev;
  RopeTables rope;
  std::unique_ptr<Workspace> ws;
  // Layer l's buffers for micro-batch j: a kept layer's own (when its backward follows) or the shared
  // workspace, with Gemma 4's shared K/V and per-layer inputs bound (no-ops for other families).
  LayerBuffers layer_buffers(int l, int j, const BatchDims& d, bool backward) const {
    const LayerBuffers w = backward ? kept.layer(*ws, l, j, d) : ws->layer(d);
    return ple.bind(kv_share.bind(w, l, j, d), l, j, d);
  }
  std::unique_ptr<Stream> stream;
  Program program;
  float host_scalars[2] = {0, 0};
  std::vector<float> host_norms;   // [blobs]
  std::vector<float> host_logits;  // [N, V], logits() only

  void* at(const DeviceBuffer& b, int blob, DType t) const {
    return static_cast<char*>(b.data()) + blob_off[blob] * int64_t(dtype_size(t));
  }
  Tensor entry(const DeviceBuffer& b, int blob, int idx, DType t) const {
    return entry_view(layout.blobs[blob].entries[idx], at(b, blob, t), t);
  }
  Tensor ckpt_at(int l, int64_t N) const {
    char* p = static_cast<char*>(ckpt.data()) + size_t(l) * stride_nh;
    return Tensor(p, act, {N, spec.hidden});
  }
  Tensor dtensor(int i, int64_t N) const {
    char* p = static_cast<char*>(dbuf.data()) + size_t(i) * stride_nh;
    return Tensor(p, act, {N, spec.hidden});
  }
  size_t stride_nh = 0;      // bytes of one [max N, H] activation
  Tensor dscratch() const {  // the recompute scratch (dbuf's third) as raw F32: free once the layers are done
    return Tensor(static_cast<char*>(dbuf.data()) + 2 * stride_nh, DType::F32, {int64_t(stride_nh / 4)});
  }
  void upload_blob(int blob, const std::vector<float>& host);
  DType dtype(State which) const { return which == State::AdamM || which == State::AdamV ? sd : DType::F32; }
  const DeviceBuffer& state(State which) const {
    const DeviceBuffer& b = which == State::Params  ? master
                            : which == State::Grads ? grads
                            : which == State::AdamM ? adam_m
                                                    : adam_v;
    SF_CHECK(b.data(), "engine built without this state");
    return b;
  }
};

MemoryItems ResidentEngine::buffers(const ModelSpec& spec, const EngineOptions& opt, const BackendSizes& be) {
  const ModelLayout layout = make_layout(spec);
  int64_t total = 0;
  for (const auto& b : layout.blobs) total += b.numel;
  const size_t P = size_t(total), act = dtype_size(be.act);
  const bool low = be.act != DType::F32;
  const int64_t maxN = int64_t(opt.max_batch) * opt.max_seq;
  const size_t stride = activation_stride(spec, maxN, be.act);
  const int micro = std::max(opt.max_micro, 1);
  // In the order `slideformer plan` prints them (by place).
  MemoryItems m = {{"fp32 master weights", P * 4, Place::Device, "master"}};
  if (low) m.push_back({"compute copy of the weights", P * act, Place::Device, "compute"});
  if (opt.training) m.push_back({"fp32 gradients", P * 4, Place::Device, "grads"});
  if (opt.training && low)
    m.push_back({"gradient rounding scratch", size_t(std::min(total, kGradRoundChunk)) * act, Place::Device, "round"});
  if (opt.training && opt.optimizer) {
    const size_t sd = dtype_size(opt.state_dtype);
    m.push_back({sd == 4 ? "AdamW m" : "AdamW m (bf16)", P * sd, Place::Device, "m"});
    m.push_back({sd == 4 ? "AdamW v" : "AdamW v (bf16)", P * sd, Place::Device, "v"});
  }
  m.push_back({"layer-input checkpoints", stride * size_t(spec.n_layer + 1), Place::Device, "ckpt"});
  m.push_back({"backward activations (dy, dx, recompute)", stride * 3, Place::Device, "dbuf"});
  append(m, KeptActivations::buffers(spec, opt, be.act, 1));
  append(m, KvShareStore::buffers(spec, opt, be.act, 1));
  append(m, PleStore::buffers(spec, opt, be.act, 1));
  m.push_back({"workspace (one layer's recompute + backward; chunked head)", be.workspace, Place::Device, "workspace"});
  append(m, TokenUploader::buffers({maxN, 2 * micro}));
  if (opt.training && micro > 1)
    m.push_back(
        {"embedding-output gradients of the step's micro-batches", size_t(micro) * stride, Place::Device, "dy0"});
  append(m, DeviceRope::buffers(spec, opt.max_seq));
  m.push_back({"scalars", engine_scalar_bytes(layout.blobs.size()), Place::Device, "scalars"});
  append(m, moe_stats_buffers(spec, 1));  // micro-batches run one after the other
  if (be.stream_scratch) m.push_back({"kernel scratch (compute stream)", be.stream_scratch, Place::Device});
  return m;
}

ResidentEngine::Impl::Impl(Device& d, const ModelSpec& s, const ModelLayout& lay, const EngineOptions& opt)
    : dev(d),
      spec(s),
      layout(lay),
      act(compute_dtype_for(d, opt.compute_dtype)),
      sd(opt.state_dtype),
      stream(d.create_stream()),
      program(s, d.ops(), act) {
  for (const auto& b : layout.blobs) {
    blob_off.push_back(total);
    total += b.numel;
  }
  SF_CHECK(sd == DType::F32 || sd == DType::BF16, "the optimizer state is F32 or BF16");
  const int64_t maxN = int64_t(opt.max_batch) * opt.max_seq;
  stride_nh = activation_stride(spec, maxN, act);
  // Every buffer comes from the engine's list (ResidentEngine::buffers); a part allocates from its
  // own list, which must be the engine's items of that part.
  ws = std::make_unique<Workspace>(dev, spec, opt.max_batch, opt.max_seq, act);
  BufferSource src(dev, ResidentEngine::buffers(spec, opt, BackendSizes{act, ws->bytes(), 0}));
  src.allocated({{"", ws->bytes(), Place::Device, "workspace"}});
  master = src.buffer("master");
  compute = src.buffer_if("compute");
  grads = src.buffer_if("grads");
  round_buf = src.buffer_if("round");
  adam_m = src.buffer_if("m");
  adam_v = src.buffer_if("v");
  ckpt = src.buffer("ckpt");
  dbuf = src.buffer("dbuf");
  kept = KeptActivations(src, spec, opt, act, 1);
  kv_share = KvShareStore(src, spec, opt, act, 1);
  ple = PleStore(src, spec, opt, act, 1);
  const int micro = std::max(opt.max_micro, 1);
  const TokenUploaderOptions to{maxN, 2 * micro};
  tokens = std::make_unique<TokenUploader>(dev, to);
  src.allocated(TokenUploader::buffers(to));
  dy0 = src.buffer_if("dy0");
  scalars = src.buffer("scalars");
  moe_stats = src.buffer_if("moe.stats");
  host_norms.resize(layout.blobs.size());

  rope_dev = std::make_unique<DeviceRope>(dev, spec, opt.max_seq, *stream);
  src.allocated(DeviceRope::buffers(spec, opt.max_seq));
  rope = rope_dev->tables;

  Ops& ops = dev.ops();
  ops.zero(Tensor(master.data(), DType::F32, {total}), *stream);  // padding between tensors stays 0
  if (adam_m.data()) {
    ops.zero(Tensor(adam_m.data(), sd, {total}), *stream);
    ops.zero(Tensor(adam_v.data(), sd, {total}), *stream);
  }
  ops.zero(Tensor(scalars.data(), DType::F32, {2}), *stream);
  dev.synchronize(*stream);  // the host tables above go out of scope
}

ResidentEngine::ResidentEngine(Device& dev, const ModelSpec& spec, const EngineOptions& opt)
    : dev_(dev), spec_(spec), layout_(make_layout(spec)), opt_(opt) {
  impl_ = std::make_unique<Impl>(dev_, spec_, layout_, opt_);
}

ResidentEngine::~ResidentEngine() {
  if (impl_)
    quietly([&] {
      impl_->tokens->synchronize();
      dev_.synchronize(*impl_->stream);
    });
}

// Upload fp32 host values of one blob to the masters (and the compute copy).
void ResidentEngine::Impl::upload_blob(int blob, const std::vector<float>& host) {
  dev.copy(at(master, blob, DType::F32), host.data(), host.size() * 4, CopyKind::HostToDevice, *stream);
  if (act != DType::F32) {
    const int64_t n = int64_t(host.size());
    dev.ops().cast(Tensor(at(compute, blob, act), act, {n}), Tensor(at(master, blob, DType::F32), DType::F32, {n}),
                   *stream);
  }
  dev.synchronize(*stream);  // the host buffer is reused by the caller
}

void ResidentEngine::load(const CheckpointReader& ckpt) {
  std::vector<float> host;
  ProgressLog progress("loading weights", double(impl_->total) * 4);
  for (size_t b = 0; b < layout_.blobs.size(); ++b) {
    host.resize(size_t(layout_.blobs[b].numel));
    read_blob(ckpt, layout_.blobs[b], host.data());
    impl_->upload_blob(int(b), host);
    progress.add(double(layout_.blobs[b].numel) * 4);
  }
}

void ResidentEngine::init_random(uint64_t seed) {
  ProgressLog progress("random weights", double(layout_.total_numel()) * 4);
  std::vector<float> host;
  for (size_t b = 0; b < layout_.blobs.size(); ++b) {
    host.resize(size_t(layout_.blobs[b].numel));
    random_blob(layout_.blobs[b], int(b), seed, spec_.initializer_range, host.data());
    impl_->upload_blob(int(b), host);
    progress.add(double(layout_.blobs[b].numel) * 4);
  }
}

size_t ResidentEngine::device_bytes() const {
  const Impl& m = *impl_;
  return m.master.size() + m.compute.size() + m.grads.size() + m.adam_m.size() + m.adam_v.size() + m.ckpt.size() +
         m.round_buf.size() + m.dbuf.size() + m.kept.device_bytes() + m.dy0.size() + m.tokens->device_bytes() +
         m.scalars.size() + m.moe_stats.size() + m.rope_dev->buf.size() + m.ws->bytes();
}

size_t ResidentEngine::host_bytes() const { return impl_->tokens->host_bytes(); }

void ResidentEngine::read_state_part(State which, int blob, int entry, int64_t first, int64_t count, float* dst) {
  Impl& m = *impl_;
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  check_state_part(e, first, count);
  const DType t = m.dtype(which);
  const char* src =
      static_cast<const char*>(m.at(m.state(which), blob, t)) + (e.offset + first) * int64_t(dtype_size(t));
  state_to_f32(dev_, *m.stream, src, t, count, dst);
}

void ResidentEngine::write_state_part(State which, int blob, int entry, int64_t first, int64_t count,
                                      const float* src) {
  Impl& m = *impl_;
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  check_state_part(e, first, count);
  const DType t = m.dtype(which);
  const int64_t at = e.offset + first;
  char* dst = static_cast<char*>(m.at(m.state(which), blob, t)) + at * int64_t(dtype_size(t));
  state_from_f32(dev_, *m.stream, dst, t, count, src);
  if (which == State::Params && m.act != DType::F32) {
    char* cdst = static_cast<char*>(m.at(m.compute, blob, m.act)) + at * int64_t(dtype_size(m.act));
    dev_.ops().cast(Tensor(cdst, m.act, {count}), Tensor(dst, DType::F32, {count}), *m.stream);
  }
  dev_.synchronize(*m.stream);
}

void ResidentEngine::zero_grads() {
  SF_CHECK(impl_->grads.data(), "engine built without gradients");
  dev_.ops().zero(Tensor(impl_->grads.data(), DType::F32, {impl_->total}), *impl_->stream);
}

std::vector<float> ResidentEngine::logits(const Batch& b) {
  forward_backward(b, 0.f, false, true);
  Impl& m = *impl_;
  return std::move(m.host_logits);
}

void ResidentEngine::forward_backward(const Batch& b, float grad_scale, bool backward) {
  forward_backward(b, grad_scale, backward, false);
}

void ResidentEngine::forward_backward(const Batch& b, float grad_scale, bool backward, bool want_logits) {
  Impl& m = *impl_;
  SF_CHECK(b.B <= opt_.max_batch && b.T <= opt_.max_seq, "batch larger than the engine was built for");
  SF_CHECK(!backward || m.grads.data(), "engine built without gradients");
  Stream& st = *m.stream;
  const TokenUploader::Tokens tok = m.tokens->upload(b, st);
  BatchDims d{b.B, b.T, tok.pos};
  bind_moe_stats(d, spec_, m.moe_stats, 0, m.micro_in_step, dev_.ops(), st);
  const int64_t N = d.N();
  const int L = spec_.n_layer;
  const int head_blob = int(layout_.blobs.size()) - 1;
  const DType act = m.act;

  const Tensor ids = tok.ids, targets = tok.targets;
  struct MarkDone {  // every exit below records that the tokens were read
    TokenUploader& t;
    Stream& s;
    ~MarkDone() {
      try {
        t.done(s);
      } catch (...) {  // a failing device reports at the next synchronize
      }
    }
  } mark{*m.tokens, st};

  const DeviceBuffer& pbuf = act == DType::F32 ? m.master : m.compute;  // parameters in compute dtype
  Tensor emb_table = m.entry(pbuf, 0, 0, act);

  // Forward: keep every layer's input (the checkpoints) and, when a backward follows, the
  // activations of the layers kept whole and the attention outputs of the kept layers (selective
  // recompute).
  m.program.embed_forward(m.ckpt_at(0, N), ids, emb_table, st);
  m.ple.forward(0, ids, m.ckpt_at(0, N), layout_.embedding(), m.at(pbuf, 0, act), backward, dev_, st);
  d.moe_collect = true;  // the router statistics of this forward (not of the recompute below)
  for (int l = 0; l < L; ++l) {
    LayerParams p = layer_views(layout_.layer(l), m.at(pbuf, 1 + l, act), act);
    const KeptActs kept = backward ? m.kept.attention(l, 0, d) : KeptActs{};
    const LayerBuffers w = m.layer_buffers(l, 0, d, backward);
    m.program.layer_forward(p, m.ckpt_at(l, N), m.ckpt_at(l + 1, N), w, d, m.rope, st, kept);
  }
  d.moe_collect = false;
  Tensor loss_sum(m.scalars.data(), DType::F32, {1});
  Tensor norm_w = m.entry(pbuf, head_blob, 0, act);
  Tensor w_head = spec_.tie_embeddings ? emb_table : m.entry(pbuf, head_blob, 1, act);
  HeadBuffers hb = m.ws->head(d);
  if (want_logits) {
    DeviceBuffer lg(dev_, size_t(N * spec_.vocab) * 4);
    Tensor logits(lg.data(), DType::F32, {N, spec_.vocab});
    m.program.head_logits(m.ckpt_at(L, N), norm_w, w_head, logits, hb, st);
    m.host_logits.resize(size_t(N * spec_.vocab));
    dev_.copy(m.host_logits.data(), lg.data(), m.host_logits.size() * 4, CopyKind::DeviceToHost, st);
    dev_.synchronize(st);
    return;
  }
  if (!backward) {
    m.program.head_forward_backward({.x = m.ckpt_at(L, N),
                                     .norm_w = norm_w,
                                     .w_head = w_head,
                                     .targets = targets,
                                     .loss_sum = loss_sum,
                                     .grad_scale = grad_scale},
                                    hb, d, st);
    return;
  }
  Tensor dy = m.dtensor(0, N), dx = m.dtensor(1, N), scratch = m.dtensor(2, N);
  Tensor g_emb = m.entry(m.grads, 0, 0, DType::F32);
  Tensor g_norm = m.entry(m.grads, head_blob, 0, DType::F32);
  Tensor g_head = spec_.tie_embeddings ? g_emb : m.entry(m.grads, head_blob, 1, DType::F32);
  m.program.head_forward_backward({m.ckpt_at(L, N), norm_w, w_head, targets, loss_sum, grad_scale, dy, g_norm, g_head},
                                  hb, d, st);
  // Backward: recompute each layer from its checkpoint (not a layer kept whole), then its backward.
  m.kv_share.zero_grads(0, dev_.ops(), st);
  for (int l = L - 1; l >= 0; --l) {
    LayerParams p = layer_views(layout_.layer(l), m.at(pbuf, 1 + l, act), act);
    LayerParams g = layer_views(layout_.layer(l), m.at(m.grads, 1 + l, DType::F32), DType::F32);
    const LayerBuffers w = m.layer_buffers(l, 0, d, true);
    const KeptActs kept = m.kept.attention(l, 0, d);
    if (!m.kept.whole(l)) m.program.layer_recompute(p, m.ckpt_at(l, N), scratch, w, d, m.rope, st, kept);
    m.program.layer_backward(p, g, m.ckpt_at(l, N), dy, dx, w, d, m.rope, st, kept);
    std::swap(dy, dx);
  }
  // The per-layer inputs' gradient into dy, before the embedding's backward (deferred or not).
  m.ple.backward(0, ids, dy, layout_.embedding(), m.at(m.grads, 0, DType::F32), dev_, st);
  if (m.defer) {  // step(): the embedding backward after every micro-batch's head
    const size_t k = m.deferred.size();
    SF_CHECK(k < size_t(std::max(opt_.max_micro, 1)), "more micro-batches than the engine was built for");
    dev_.copy(static_cast<char*>(m.dy0.data()) + k * m.stride_nh, dy.data, size_t(N * spec_.hidden) * dtype_size(act),
              CopyKind::DeviceToDevice, st);
    m.deferred.push_back({N, ids, tok.slot});
    return;
  }
  m.program.embed_backward(g_emb, dy, ids, m.dscratch(), st);
}

double ResidentEngine::take_loss_sum() {
  Impl& m = *impl_;
  dev_.copy(&m.host_scalars[0], m.scalars.data(), 4, CopyKind::DeviceToHost, *m.stream);
  dev_.ops().zero(Tensor(m.scalars.data(), DType::F32, {1}), *m.stream);
  dev_.synchronize(*m.stream);
  return m.host_scalars[0];
}

void ResidentEngine::synchronize() {
  impl_->tokens->synchronize();
  dev_.synchronize(*impl_->stream);
}

double ResidentEngine::grad_sq_norm() {
  Impl& m = *impl_;
  const int nb = int(layout_.blobs.size());
  float* norms = static_cast<float*>(m.scalars.data()) + 2;  // [blobs]
  dev_.ops().zero(Tensor(norms, DType::F32, {nb}), *m.stream);
  for (int b = 0; b < nb; ++b)
    dev_.ops().sq_norm(Tensor(norms + b, DType::F32, {1}),
                       Tensor(m.at(m.grads, b, DType::F32), DType::F32, {layout_.blobs[b].numel}), *m.stream);
  dev_.copy(m.host_norms.data(), norms, size_t(nb) * 4, CopyKind::DeviceToHost, *m.stream);
  dev_.synchronize(*m.stream);
  return sum_blob_norms(m.host_norms);
}

void ResidentEngine::round_grads() {
  Impl& m = *impl_;
  if (m.act == DType::F32) return;
  for (int64_t i = 0; i < m.total; i += kGradRoundChunk) {
    const int64_t n = std::min(kGradRoundChunk, m.total - i);
    Tensor g(static_cast<float*>(m.grads.data()) + i, DType::F32, {n}), r(m.round_buf.data(), m.act, {n});
    dev_.ops().cast(r, g, *m.stream);
    dev_.ops().cast(g, r, *m.stream);
  }
}

void ResidentEngine::accumulate(const std::vector<Batch>& mbs, float scale) {
  zero_grads();
  Impl& m = *impl_;
  m.defer = mbs.size() > 1;
  m.deferred.clear();
  m.micro_in_step = int(mbs.size());
  for (const Batch& b : mbs) forward_backward(b, scale, true);
  m.micro_in_step = 1;
  m.defer = false;
  const Tensor g_emb = m.entry(m.grads, 0, 0, DType::F32);
  for (size_t k = 0; k < m.deferred.size(); ++k) {
    const Impl::Deferred& d = m.deferred[k];
    const Tensor dy(static_cast<char*>(m.dy0.data()) + k * m.stride_nh, m.act, {d.N, spec_.hidden});
    m.program.embed_backward(g_emb, dy, d.ids, m.dscratch(), *m.stream);
    m.tokens->done(d.token_slot, *m.stream);  // the ids were read until here
  }
  m.deferred.clear();
}

Engine::StepResult ResidentEngine::step(const std::vector<Batch>& mbs, const StepParams& sp) {
  StepResult r;
  for (const Batch& b : mbs) r.trained += b.trained;
  const float scale = r.trained > 0 ? float(1.0 / double(r.trained)) : 0.f;
  accumulate(mbs, scale);
  r.loss = r.trained > 0 ? take_loss_sum() / double(r.trained) : (take_loss_sum(), 0.0);
  round_grads();
  r.grad_norm = std::sqrt(grad_sq_norm());
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  AdamWParams p = sp.adamw;
  p.grad_scale = clip_factor(r.grad_norm, sp.max_grad_norm);
  adamw_step(p);
  r.updated = true;
  return r;
}

double ResidentEngine::loss_sum(const std::vector<Batch>& batches) {
  double sum = 0;
  for (const Batch& b : batches) {
    forward_backward(b, 1.f, false);
    sum += take_loss_sum();
  }
  return sum;
}

double ResidentEngine::compute_grads(const std::vector<Batch>& batches) {
  int64_t trained = 0;
  for (const Batch& b : batches) trained += b.trained;
  const float scale = trained > 0 ? float(1.0 / double(trained)) : 0.f;
  accumulate(batches, scale);
  const double sum = take_loss_sum();
  round_grads();
  synchronize();
  return trained > 0 ? sum / double(trained) : 0.0;
}

void ResidentEngine::adamw_step(const AdamWParams& p) {
  Impl& m = *impl_;
  SF_CHECK(m.adam_m.data(), "engine built without optimizer state");
  if (m.sd == DType::F32) {  // one pass over every blob (elementwise: the same bits as blob by blob)
    Tensor copy = m.act == DType::F32 ? Tensor() : Tensor(m.compute.data(), m.act, {m.total});
    dev_.ops().adamw(Tensor(m.master.data(), DType::F32, {m.total}), Tensor(m.grads.data(), DType::F32, {m.total}),
                     Tensor(m.adam_m.data(), DType::F32, {m.total}), Tensor(m.adam_v.data(), DType::F32, {m.total}),
                     copy, p, *m.stream);
    return;
  }
  // Compact state: blob by blob, each drawing its own rounding stream (AdamWParams::blob), as the
  // sliding engine's host and GPU updates do.
  for (int b = 0; b < int(layout_.blobs.size()); ++b) {
    const int64_t n = layout_.blobs[size_t(b)].numel;
    AdamWParams q = p;
    q.blob = b;
    q.first = 0;
    dev_.ops().adamw(Tensor(m.at(m.master, b, DType::F32), DType::F32, {n}),
                     Tensor(m.at(m.grads, b, DType::F32), DType::F32, {n}), Tensor(m.at(m.adam_m, b, m.sd), m.sd, {n}),
                     Tensor(m.at(m.adam_v, b, m.sd), m.sd, {n}),
                     m.act == DType::F32 ? Tensor() : Tensor(m.at(m.compute, b, m.act), m.act, {n}), q, *m.stream);
  }
}

}  // namespace sf
