#include "engine/sliding_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/kernels.h"
#include "core/align.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/blob_init.h"
#include "engine/checkpoint_store.h"
#include "engine/device_rope.h"
#include "engine/host_optimizer.h"
#include "engine/slot_cache.h"
#include "engine/step_trace.h"
#include "engine/token_uploader.h"
#include "io/checkpoint.h"
#include "model/program.h"

namespace sf {

namespace {

DType natural_compute_dtype(const Device& d, const std::string& name) {
  if (name.empty()) return d.is_host() ? DType::F32 : DType::BF16;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if ((name == "fp32" || name == "float32") && d.is_host()) return DType::F32;
  input_error("--compute-dtype", "'" + name + "' is not available here (fp32 on the cpu backend, or bf16)");
}

}  // namespace

std::vector<bool> held_grad_blobs(const ModelLayout& layout, const std::vector<int>& gpu_blobs, int64_t hold) {
  const int nb = int(layout.blobs.size());
  std::vector<bool> held(size_t(nb), false);
  int64_t n = 0;
  for (int b = 0; b < nb - 1 && n < hold; ++b) {  // forward order, never the head (its gradient lands first)
    if (std::find(gpu_blobs.begin(), gpu_blobs.end(), b) != gpu_blobs.end()) continue;
    held[size_t(b)] = true;
    n += layout.blobs[size_t(b)].numel;
  }
  return held;
}

// The blobs kept whole on the GPU (SlidingOptions::gpu_blobs): every state in place, each buffer
// [total] in `off`'s layout; their AdamW runs on the compute stream.
struct GpuBlobs {
  std::vector<int64_t> off;  // [blobs] element offset (-1: on the host)
  int64_t total = 0;
  DeviceBuffer params;               // act (act != F32): the compute copy
  DeviceBuffer master, m, v, grads;  // F32; grads accumulate over the step's micro-batches
  bool has(int b) const { return off[size_t(b)] >= 0; }
  float* at(const DeviceBuffer& buf, int b) const { return static_cast<float*>(buf.data()) + off[size_t(b)]; }
  const DeviceBuffer& state(Engine::State s) const {
    return s == Engine::State::Params ? master : s == Engine::State::Grads ? grads : s == Engine::State::AdamM ? m : v;
  }
};

// Where a blob's compute-dtype parameters are while kernels read them.
struct ParamsRef {
  void* data = nullptr;
  int slot = -1;  // the slot to release, or -1 for a blob kept on the GPU
};

struct SlidingEngine::Impl {
  Impl(Device& d, const ModelSpec& s, const ModelLayout& lay, const SlidingOptions& o);

  Device& dev;
  const ModelSpec& spec;
  const ModelLayout& layout;
  const SlidingOptions& opt;
  DType act;  // activations, compute copy of the parameters, and gradients on their way down
  int L = 0, nb = 0;
  int64_t max_tokens = 0;
  size_t stride_nh = 0;  // bytes of one [max N, H] activation
  int64_t chunk = 0;

  std::unique_ptr<Stream> compute, h2d, d2h;
  GpuBlobs gpu;
  std::unique_ptr<HostOptimizer> host;
  std::unique_ptr<SlotCache> slots;
  bool slots_stale = false;  // an update was queued: the next forward re-uploads every blob

  // The gradient path: a blob's gradient accumulates in fp32 on the GPU over the micro-batches,
  // is rounded to the compute dtype (in place, chunk by chunk, through staging), its squared norm
  // taken, and the chunks copied down into host memory (HostOptimizer::land).
  struct Acc {
    DeviceBuffer buf;             // [numel] F32
    std::unique_ptr<Event> sent;  // d2h: copied down (when no staging is used)
  };
  Acc layer_acc[2], emb_acc, head_acc;  // layers alternate: one fills while the other drains
  int next_acc = 0;
  DeviceBuffer grad_stg;  // [2, chunk] act (act != F32)
  std::unique_ptr<Event> stg_ready[2], stg_free[2];
  int next_stg = 0;
  std::unique_ptr<Event> grads_ready;           // compute: a gradient is complete (re-recorded)
  std::unique_ptr<Event> chunk_landed;          // d2h, re-recorded per chunk (waited at once)
  std::vector<std::unique_ptr<Event>> landed;   // [blobs] d2h: the step's gradient is in host memory
  std::vector<std::unique_ptr<Event>> updated;  // [blobs] opt: the blob's master is updated (uploads wait)
  std::vector<std::unique_ptr<Event>> moved;    // [blobs] opt: its last update has read the gradient store

  // Activations: a ring of K+1 [N, H] buffers holds each micro-batch's current hidden state (or
  // gradient); a layer writes micro-batch j's output into the spare one.
  DeviceBuffer acts;                             // [K + 1, N, H] act
  std::vector<std::unique_ptr<Event>> act_read;  // [K + 1] compute: the layer reading it is queued
  std::vector<std::unique_ptr<Event>> act_free;  // [K + 1] d2h: its checkpoint offload is done
  DeviceBuffer scratch;                          // [N, H] act: the recompute's output
  std::unique_ptr<CheckpointStore> ckpts;        // each layer's input per micro-batch ([K, L, N, H] act)

  DeviceBuffer scalars;  // engine_scalar_bytes: loss sum, per-blob squared norms
  std::vector<float> host_scalars;
  std::unique_ptr<DeviceRope> rope;
  std::unique_ptr<Workspace> ws;
  std::unique_ptr<TokenUploader> tokens;
  // Host optimizer work in its own stream, so that gradient and checkpoint copies on d2h never
  // queue behind it. Created last (stream indices of the race tests).
  std::unique_ptr<Stream> opt_stream;
  Program program;
  std::unique_ptr<StepTrace> trace;  // SF_TRACE: a timeline of the streams

  // "what index suffix"; the text is built only when tracing (the step allocates nothing else).
  void mark(Stream& s, const char* name, const char* what, int index = -1, const char* suffix = "") {
    if (trace) trace->mark(s, name, what + (index >= 0 ? " " + std::to_string(index) : std::string()) + suffix);
  }

  Tensor act_at(const DeviceBuffer& b, int i, int64_t N) const {
    return Tensor(static_cast<char*>(b.data()) + size_t(i) * stride_nh, act, {N, spec.hidden});
  }

  // ---- parameters
  ParamsRef acquire(int blob, bool use, int keep = -1) {
    if (gpu.has(blob)) return {act == DType::F32 ? gpu.at(gpu.master, blob) : gpu_params(blob), -1};
    const int64_t before = slots->uploads();
    const int k =
        slots->acquire(blob, host->master(blob), layout.blobs[size_t(blob)].numel, *updated[size_t(blob)], use, keep);
    if (slots->uploads() != before) mark(*h2d, "h2d", "uploaded", blob);
    return k >= 0 ? ParamsRef{slots->data(k), k} : ParamsRef{};  // (-1: a prefetch that was skipped)
  }
  void release(const ParamsRef& p) {
    if (p.slot >= 0) slots->release(p.slot);
  }
  void* gpu_params(int blob) const {
    return static_cast<char*>(gpu.params.data()) + size_t(gpu.off[size_t(blob)]) * dtype_size(act);
  }
  void gpu_update(int blob, const AdamWParams& p) {
    const int64_t n = layout.blobs[size_t(blob)].numel;
    auto f32 = [&](const DeviceBuffer& b) { return Tensor(gpu.at(b, blob), DType::F32, {n}); };
    dev.ops().adamw(f32(gpu.master), f32(gpu.grads), f32(gpu.m), f32(gpu.v),
                    act == DType::F32 ? Tensor() : Tensor(gpu_params(blob), act, {n}), p, *compute);
  }
  // The compute copy of a kept blob from its master (after load / import).
  void gpu_refresh(int blob) {
    if (act == DType::F32) return;
    const int64_t n = layout.blobs[size_t(blob)].numel;
    dev.ops().cast(Tensor(gpu_params(blob), act, {n}), Tensor(gpu.at(gpu.master, blob), DType::F32, {n}), *compute);
  }

  // ---- gradients
  Tensor fresh_acc(Acc& a, int blob) {
    if (gpu.has(blob)) return Tensor(gpu.at(gpu.grads, blob), DType::F32, {layout.blobs[size_t(blob)].numel});
    dev.wait(*compute, *a.sent);  // its last contents have left
    Tensor t(a.buf.data(), DType::F32, {layout.blobs[size_t(blob)].numel});
    dev.ops().zero(t, *compute);
    return t;
  }
  // Blob's gradient `g` is complete on the compute stream: rounded, normed, sent down, and (with
  // `overlap`, no clipping) its AdamW queued chunk by chunk as the chunks land.
  void send_grads(int blob, Tensor g, Acc* a, const AdamWParams* overlap) {
    const int64_t n = g.numel();
    float* gp = g.ptr<float>();
    Tensor norm(static_cast<float*>(scalars.data()) + 2 + blob, DType::F32, {1});
    if (gpu.has(blob)) {
      if (act != DType::F32) {
        dev.wait(*compute, *stg_free[0]);         // no copy down reads staging 0 any more
        for (int64_t i = 0; i < n; i += chunk) {  // rounding in place, as the resident engine does
          const int64_t c = std::min(chunk, n - i);
          Tensor part(gp + i, DType::F32, {c}), st(grad_stg.data(), act, {c});
          dev.ops().cast(st, part, *compute);
          dev.ops().cast(part, st, *compute);
        }
      }
      dev.ops().sq_norm(norm, g, *compute);
      if (overlap) gpu_update(blob, *overlap);
      return;
    }
    const bool held = host->held(blob);
    if (held) dev.wait(*d2h, *moved[size_t(blob)]);  // the last update has read the store
    if (held) overlap = nullptr;                     // updated after the backward (SlidingEngine::step)
    if (act == DType::F32) {                         // copied down as it is
      dev.record(*grads_ready, *compute);
      dev.wait(*d2h, *grads_ready);
    }
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t c = std::min(chunk, n - i);
      const HostOptimizer::Landing at = host->land(blob, i, *d2h);
      if (act == DType::F32) {
        dev.copy(at.ptr, gp + i, size_t(c) * 4, CopyKind::DeviceToHost, *d2h);
      } else {
        const int s = next_stg;
        next_stg ^= 1;
        Tensor part(gp + i, DType::F32, {c});
        Tensor st(static_cast<char*>(grad_stg.data()) + size_t(s) * round256(size_t(chunk) * dtype_size(act)), act,
                  {c});
        dev.wait(*compute, *stg_free[s]);
        dev.ops().cast(st, part, *compute);
        dev.ops().cast(part, st, *compute);  // the norm (and the resident engine) see the rounded values
        dev.record(*stg_ready[s], *compute);
        dev.wait(*d2h, *stg_ready[s]);
        dev.copy(at.ptr, st.data, size_t(c) * dtype_size(act), CopyKind::DeviceToHost, *d2h);
        dev.record(*stg_free[s], *d2h);
      }
      if (overlap) {
        dev.record(*chunk_landed, *d2h);
        dev.wait(*opt_stream, *chunk_landed);
        if (i == 0) mark(*opt_stream, "opt", "update", blob);
        host->queue_update(blob, i, c, at, *overlap, *opt_stream);
      }
    }
    mark(*d2h, "d2h", "landed", blob);
    if (overlap) mark(*opt_stream, "opt", "updated", blob);
    if (a) dev.record(*a->sent, *d2h);
    dev.record(*landed[size_t(blob)], *d2h);
    if (overlap) {
      dev.record(*updated[size_t(blob)], *opt_stream);
      dev.record(*moved[size_t(blob)], *opt_stream);
    }
    dev.ops().sq_norm(norm, g, *compute);
  }

  // ---- checkpoints: the k-th fetch of a backward goes to buffer k % 2.
  void fetch(int k, int j, int l, int64_t N) { ckpts->fetch(k, j, l, size_t(N * spec.hidden) * dtype_size(act), *h2d); }

  // A held blob's AdamW (or one pass of it) on the opt stream, once its whole gradient has landed.
  // (A moment pass follows its blob's parameter pass on the same stream: no second wait. Fewer
  // operations queued: CUDA blocks the queuing thread once a stream holds too many.)
  void queue_blob_update(int blob, const AdamWParams& p, cpu::AdamWPart part = cpu::AdamWPart::All) {
    if (part != cpu::AdamWPart::Moments) dev.wait(*opt_stream, *landed[size_t(blob)]);
    const HostOptimizer::Landing at{const_cast<void*>(host->grads(blob)), -1};
    static const char* const kPart[] = {"", " params", " moments"};
    mark(*opt_stream, "opt", "update", blob, kPart[int(part)]);
    host->queue_update(blob, 0, layout.blobs[size_t(blob)].numel, at, p, *opt_stream, part);
    mark(*opt_stream, "opt", "updated", blob, kPart[int(part)]);
    if (part != cpu::AdamWPart::Moments) dev.record(*updated[size_t(blob)], *opt_stream);
    if (part != cpu::AdamWPart::Params) dev.record(*moved[size_t(blob)], *opt_stream);
  }
  void run(const std::vector<Batch>& mbs, float scale, bool backward, const AdamWParams* overlap);
  // The split update's moment passes, queued on the opt stream only once the next forward is
  // queued (run()) or before anything waits for the streams: CUDA blocks the queuing thread when a
  // stream holds too many operations, and at the norm 60 passes would (measured: the next forward
  // was queued ~110 ms late, docs/PERFORMANCE.md session 4). Their order is unchanged: after every
  // parameter pass, before the next gradients land (d2h waits for `moved`).
  struct PendingMoments {
    bool any = false;
    AdamWParams p;
  } moments;
  void flush_moments() {
    if (!moments.any) return;
    moments.any = false;
    for (int b = nb - 1; b >= 0; --b)
      if (!gpu.has(b)) queue_blob_update(b, moments.p, cpu::AdamWPart::Moments);
  }
  void sync_all() {
    flush_moments();
    tokens->synchronize();
    dev.synchronize(*h2d);
    dev.synchronize(*compute);
    dev.synchronize(*d2h);
    dev.synchronize(*opt_stream);
  }
  void zero_scalars() { dev.ops().zero(Tensor(scalars.data(), DType::F32, {2 + nb}), *compute); }
  void read_scalars() {
    dev.copy(host_scalars.data(), scalars.data(), host_scalars.size() * 4, CopyKind::DeviceToHost, *compute);
    dev.synchronize(*compute);
  }
  double grad_sq_norm() const {
    return sum_blob_norms(std::vector<float>(host_scalars.begin() + 2, host_scalars.end()));
  }
};

SlidingEngine::Impl::Impl(Device& d, const ModelSpec& s, const ModelLayout& lay, const SlidingOptions& o)
    : dev(d),
      spec(s),
      layout(lay),
      opt(o),
      act(natural_compute_dtype(d, o.base.compute_dtype)),
      L(s.n_layer),
      nb(int(lay.blobs.size())),
      compute(d.create_stream()),
      h2d(d.create_stream()),
      d2h(d.create_stream()),
      program(s, d.ops(), act) {
  SF_CHECK(o.slots >= 2, "the sliding engine needs at least 2 parameter slots");
  SF_CHECK(o.base.max_micro >= 1, "max_micro must be positive");
  const int K = o.base.max_micro;
  gpu.off.assign(size_t(nb), -1);
  for (int b : o.gpu_blobs) {
    SF_CHECK(b >= 0 && b < nb, "gpu_blobs: no blob " + std::to_string(b));
    gpu.off[size_t(b)] = 0;
  }
  std::vector<int64_t> host_numel(size_t(nb), 0);
  int64_t max_blob = 0, max_layer = 0;
  for (int b = 0; b < nb; ++b) {
    const BlobLayout& bl = layout.blobs[size_t(b)];
    if (gpu.has(b)) {
      gpu.off[size_t(b)] = gpu.total;
      gpu.total += bl.numel;
      continue;
    }
    host_numel[size_t(b)] = bl.numel;
    max_blob = std::max(max_blob, bl.numel);
    if (bl.kind == BlobKind::Layer) max_layer = std::max(max_layer, bl.numel);
  }
  chunk = std::max<int64_t>(1, std::min(o.chunk, std::max(max_blob, gpu.total)));
  max_tokens = int64_t(o.base.max_batch) * o.base.max_seq;
  stride_nh = round256(size_t(max_tokens * spec.hidden) * dtype_size(act));

  host = std::make_unique<HostOptimizer>(dev, host_numel, act, o.keep_grads, chunk, o.grad_ring,
                                         held_grad_blobs(layout, o.gpu_blobs, o.keep_grads ? 0 : o.hold_grads));
  std::vector<bool> is_layer;
  for (const BlobLayout& bl : layout.blobs) is_layer.push_back(bl.kind == BlobKind::Layer);
  slots = std::make_unique<SlotCache>(dev, SlotCache::capacities(o.slots, host_numel, is_layer), act, chunk, *h2d,
                                      *compute);
  auto make_acc = [&](Acc& a, int64_t n) {
    a.buf = DeviceBuffer(dev, round256(size_t(n) * 4));
    a.sent = dev.create_event();
  };
  for (Acc& a : layer_acc) make_acc(a, max_layer);
  make_acc(emb_acc, gpu.has(0) ? 0 : layout.embedding().numel);
  make_acc(head_acc, gpu.has(L + 1) ? 0 : layout.head().numel);
  if (act != DType::F32) grad_stg = DeviceBuffer(dev, 2 * round256(size_t(chunk) * dtype_size(act)));
  for (int i = 0; i < 2; ++i) {
    stg_ready[i] = dev.create_event();
    stg_free[i] = dev.create_event();
  }
  grads_ready = dev.create_event();
  chunk_landed = dev.create_event();
  for (int b = 0; b < nb; ++b) {
    landed.push_back(dev.create_event());
    updated.push_back(dev.create_event());
    moved.push_back(dev.create_event());
  }
  if (gpu.total > 0) {
    const size_t n = size_t(gpu.total);
    if (act != DType::F32) gpu.params = DeviceBuffer(dev, n * dtype_size(act));
    for (DeviceBuffer* b : {&gpu.master, &gpu.m, &gpu.v, &gpu.grads}) {
      *b = DeviceBuffer(dev, n * 4);
      dev.ops().zero(Tensor(b->data(), DType::F32, {gpu.total}), *compute);
    }
  }

  acts = DeviceBuffer(dev, size_t(K + 1) * stride_nh);
  for (int i = 0; i <= K; ++i) {
    act_read.push_back(dev.create_event());
    act_free.push_back(dev.create_event());
  }
  scratch = DeviceBuffer(dev, stride_nh);
  ckpts = std::make_unique<CheckpointStore>(dev, K, L, stride_nh);
  scalars = DeviceBuffer(dev, engine_scalar_bytes(size_t(nb)));
  host_scalars.assign(size_t(2 + nb), 0.f);
  zero_scalars();
  rope = std::make_unique<DeviceRope>(dev, spec, o.base.max_seq, *compute);
  ws = std::make_unique<Workspace>(dev, spec, o.base.max_batch, o.base.max_seq, act);
  tokens = std::make_unique<TokenUploader>(dev, max_tokens, 2 * K);
  opt_stream = d.create_stream();
  trace = StepTrace::from_env(dev, *compute);
  dev.synchronize(*compute);
}

// One pass over the micro-batches, layer-major (DESIGN.md §4). Forward: the embedding, then each
// layer for every micro-batch while its parameters sit in the slot, each layer input offloaded as
// that micro-batch's checkpoint; the head (loss, and with `backward` the first gradients); then
// the backward in reverse, each layer recomputed from its fetched checkpoints, its gradient
// accumulated over the micro-batches on the GPU and sent down once.
void SlidingEngine::Impl::run(const std::vector<Batch>& mbs, float scale, bool backward, const AdamWParams* overlap) {
  const int K = int(mbs.size());
  SF_CHECK(K >= 1 && K <= opt.base.max_micro, "more micro-batches than the engine was built for");
  Stream& c = *compute;
  const int head_blob = L + 1;
  if (slots_stale) {
    slots->invalidate();
    slots_stale = false;
  }
  if (trace) trace->now("host", backward ? "run" : "run forward");
  std::vector<TokenUploader::Tokens> tok;
  std::vector<BatchDims> dims;
  for (const Batch& b : mbs) {
    SF_CHECK(b.B <= opt.base.max_batch && b.T <= opt.base.max_seq, "batch larger than the engine was built for");
    tok.push_back(tokens->upload(b, c));
    dims.push_back(BatchDims{b.B, b.T, tok.back().pos});
  }
  auto N = [&](int j) { return dims[size_t(j)].N(); };
  auto layer = [&](const ParamsRef& p, int blob) { return layer_views(layout.blobs[size_t(blob)], p.data, act); };
  auto entry = [&](const ParamsRef& p, int blob, int i) {
    return entry_view(layout.blobs[size_t(blob)].entries[size_t(i)], p.data, act);
  };
  // The activation ring: cur[j] holds micro-batch j's current activation, `spare` is free.
  std::vector<int> cur(static_cast<size_t>(K), 0);
  int spare = K;
  auto out_buf = [&](int j) {  // the spare buffer, once its checkpoint offload is done
    dev.wait(c, *act_free[size_t(spare)]);
    return act_at(acts, spare, N(j));
  };
  auto advance = [&](int j) { std::swap(spare, cur[size_t(j)]); };  // the output becomes current

  // Forward.
  ParamsRef p = acquire(0, true);
  for (int j = 0; j < K; ++j) {
    cur[size_t(j)] = j;
    dev.wait(c, *act_free[size_t(j)]);
    program.embed_forward(act_at(acts, j, N(j)), tok[size_t(j)].ids, entry(p, 0, 0), c);
  }
  release(p);
  mark(c, "compute", "forward", 0);
  if (L > 0) acquire(1, false);
  for (int l = 0; l < L; ++l) {
    p = acquire(1 + l, true);
    acquire(std::min(2 + l, head_blob), false, p.slot);  // prefetch the next blob
    for (int j = 0; j < K; ++j) {
      const int in = cur[size_t(j)];
      Tensor y = out_buf(j);
      program.layer_forward(layer(p, 1 + l), act_at(acts, in, N(j)), y, ws->layer(dims[size_t(j)]), dims[size_t(j)],
                            rope->tables, c);
      if (backward) {  // the layer's input is micro-batch j's checkpoint of layer l
        dev.record(*act_read[size_t(in)], c);
        dev.wait(*d2h, *act_read[size_t(in)]);
        ckpts->offload(j, l, act_at(acts, in, N(j)).data, size_t(N(j) * spec.hidden) * dtype_size(act), *d2h);
        dev.record(*act_free[size_t(in)], *d2h);
      }
      advance(j);
    }
    release(p);
    mark(c, "compute", "forward", 1 + l);
  }
  if (backward) ckpts->forward_done(*d2h);
  flush_moments();  // the last step's moment passes: after its parameter passes, before this backward's landings

  // Head: the loss of every micro-batch, and with the backward its gradients (dy into the ring).
  const ParamsRef ph = acquire(head_blob, true);
  const ParamsRef pe = spec.tie_embeddings ? acquire(0, true, ph.slot) : ParamsRef{};
  const Tensor norm_w = entry(ph, head_blob, 0);
  const Tensor w_head = spec.tie_embeddings ? entry(pe, 0, 0) : entry(ph, head_blob, 1);
  Tensor loss(scalars.data(), DType::F32, {1});
  if (!backward) {
    for (int j = 0; j < K; ++j)
      program.head_forward_backward(act_at(acts, cur[size_t(j)], N(j)), norm_w, w_head, tok[size_t(j)].targets, loss,
                                    Tensor(), Tensor(), Tensor(), scale, ws->head(dims[size_t(j)]), dims[size_t(j)], c);
    release(ph);
    release(pe);
    for (const auto& t : tok) tokens->done(t.slot, c);
    return;
  }
  if (L > 0) fetch(0, 0, L - 1, N(0));
  const Tensor g_emb = fresh_acc(emb_acc, 0);
  const Tensor g_head = fresh_acc(head_acc, head_blob);
  const BlobLayout& hl = layout.head();
  const Tensor g_norm = entry_view(hl.entries[0], g_head.data, DType::F32);
  const Tensor g_table = entry_view(layout.embedding().entries[0], g_emb.data, DType::F32);
  const Tensor g_w_head = spec.tie_embeddings ? g_table : entry_view(hl.entries[1], g_head.data, DType::F32);
  for (int j = 0; j < K; ++j) {
    Tensor dy = out_buf(j);
    program.head_forward_backward(act_at(acts, cur[size_t(j)], N(j)), norm_w, w_head, tok[size_t(j)].targets, loss, dy,
                                  g_norm, g_w_head, scale, ws->head(dims[size_t(j)]), dims[size_t(j)], c);
    advance(j);
  }
  release(ph);
  release(pe);
  mark(c, "compute", "head");
  send_grads(head_blob, g_head, gpu.has(head_blob) ? nullptr : &head_acc, overlap);

  // Backward: the k-th checkpoint fetch (layer l, micro-batch j in this order) is queued while
  // the (k-1)-th is in use.
  int k = 0;
  for (int l = L - 1; l >= 0; --l) {
    p = acquire(1 + l, true);
    if (l > 0) acquire(l, false, p.slot);  // prefetch layer l-1's parameters
    Acc& a = layer_acc[next_acc];
    next_acc ^= 1;
    const Tensor g = fresh_acc(a, 1 + l);
    const LayerParams gv = layer_views(layout.layer(l), g.data, DType::F32);
    for (int j = 0; j < K; ++j, ++k) {
      if (j + 1 < K)
        fetch(k + 1, j + 1, l, N(j + 1));
      else if (l > 0)
        fetch(k + 1, 0, l - 1, N(0));
      const Tensor x(ckpts->use(k, c), act, {N(j), spec.hidden});
      const LayerBuffers w = ws->layer(dims[size_t(j)]);
      program.layer_forward(layer(p, 1 + l), x, act_at(scratch, 0, N(j)), w, dims[size_t(j)], rope->tables, c);
      Tensor dx = act_at(acts, spare, N(j));
      program.layer_backward(layer(p, 1 + l), gv, x, act_at(acts, cur[size_t(j)], N(j)), dx, w, dims[size_t(j)],
                             rope->tables, c);
      ckpts->done(k, c);
      advance(j);
    }
    release(p);
    mark(c, "compute", "backward", 1 + l);
    send_grads(1 + l, g, gpu.has(1 + l) ? nullptr : &a, overlap);
  }
  for (int j = 0; j < K; ++j)
    program.embed_backward(g_table, act_at(acts, cur[size_t(j)], N(j)), tok[size_t(j)].ids, c);
  for (const auto& t : tok) tokens->done(t.slot, c);
  mark(c, "compute", "backward", 0);
  send_grads(0, g_emb, gpu.has(0) ? nullptr : &emb_acc, overlap);
}

SlidingEngine::SlidingEngine(Device& dev, const ModelSpec& spec, const SlidingOptions& opt)
    : dev_(dev), spec_(spec), layout_(make_layout(spec)), opt_(opt) {
  impl_ = std::make_unique<Impl>(dev_, spec_, layout_, opt_);
}

SlidingEngine::~SlidingEngine() {
  if (impl_) {
    try {
      impl_->sync_all();
    } catch (...) {
    }
  }
}

void SlidingEngine::load(const CheckpointReader& ckpt) {
  Impl& m = *impl_;
  m.sync_all();  // no update in flight writes the masters
  ProgressLog progress("loading weights", double(layout_.total_numel()) * 4);
  std::vector<float> tmp;
  for (int b = 0; b < m.nb; ++b) {
    const BlobLayout& bl = layout_.blobs[size_t(b)];
    if (m.gpu.has(b)) {
      tmp.resize(size_t(bl.numel));
      read_blob(ckpt, bl, tmp.data());
      dev_.copy(m.gpu.at(m.gpu.master, b), tmp.data(), tmp.size() * 4, CopyKind::HostToDevice, *m.compute);
      m.gpu_refresh(b);
      dev_.synchronize(*m.compute);
    } else {
      read_blob(ckpt, bl, m.host->master(b));
    }
    progress.add(double(bl.numel) * 4);
  }
  m.slots->invalidate();
}

void SlidingEngine::init_random(uint64_t seed) {
  Impl& m = *impl_;
  m.sync_all();
  std::vector<float> tmp;
  for (int b = 0; b < m.nb; ++b) {
    const BlobLayout& bl = layout_.blobs[size_t(b)];
    if (m.gpu.has(b)) {
      tmp.resize(size_t(bl.numel));
      random_blob(bl, b, seed, spec_.initializer_range, tmp.data());
      dev_.copy(m.gpu.at(m.gpu.master, b), tmp.data(), tmp.size() * 4, CopyKind::HostToDevice, *m.compute);
      m.gpu_refresh(b);
      dev_.synchronize(*m.compute);
    } else {
      random_blob(bl, b, seed, spec_.initializer_range, m.host->master(b));
    }
  }
  m.slots->invalidate();
}

Engine::StepResult SlidingEngine::step(const std::vector<Batch>& mbs, const StepParams& sp) {
  Impl& m = *impl_;
  StepResult r;
  for (const Batch& b : mbs) r.trained += b.trained;
  const float scale = r.trained > 0 ? float(1.0 / double(r.trained)) : 0.f;
  const bool clip = sp.max_grad_norm > 0;
  SF_CHECK(!clip || opt_.keep_grads, "clipping needs an engine built with keep_grads");
  // Without clipping the update is known before the gradients: each blob is updated as soon as
  // its gradient lands, overlapped with the rest of the backward (SlideFormer's schedule).
  AdamWParams p = sp.adamw;
  p.grad_scale = 1.f;
  if (m.gpu.total > 0) dev_.ops().zero(Tensor(m.gpu.grads.data(), DType::F32, {m.gpu.total}), *m.compute);
  m.zero_scalars();
  m.run(mbs, scale, true, clip ? nullptr : &p);
  if (!clip)  // the held gradients' updates, in forward order, overlapping the next forward
    for (int b = 0; b < m.nb; ++b)
      if (!m.gpu.has(b) && m.host->held(b)) m.queue_blob_update(b, p);
  m.read_scalars();  // the step's one host synchronisation: loss and norms
  if (m.trace) m.trace->now("host", "norm known");
  r.loss = r.trained > 0 ? double(m.host_scalars[0]) / double(r.trained) : 0.0;
  r.grad_norm = std::sqrt(m.grad_sq_norm());
  if (!clip) {
    m.slots_stale = true;
    r.updated = true;
    return r;
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return r;
  // The clip factor is known: every blob's AdamW in forward order, the host ones on the opt
  // stream after their gradient has landed. The next forward uploads blob b as soon as its own
  // update is done, so the updates overlap that forward; nothing waits here. Split: the
  // parameter passes first (what that forward waits for), then the moment passes in backward
  // order (the order in which the next backward's gradients land on their stores).
  p.grad_scale = clip_factor(r.grad_norm, sp.max_grad_norm);
  const bool split = opt_.split_update;
  for (int b = 0; b < m.nb; ++b) {
    if (m.gpu.has(b)) {
      m.gpu_update(b, p);  // compute stream: before the next forward reads the blob
      continue;
    }
    m.queue_blob_update(b, p, split ? cpu::AdamWPart::Params : cpu::AdamWPart::All);
  }
  if (split) m.moments = {true, p};  // queued by the next run() or synchronisation (flush_moments)
  m.slots_stale = true;
  r.updated = true;
  return r;
}

double SlidingEngine::loss_sum(const std::vector<Batch>& batches) {
  Impl& m = *impl_;
  double sum = 0;
  for (const Batch& b : batches) {
    m.zero_scalars();
    m.run({b}, 1.f, false, nullptr);
    m.read_scalars();
    sum += m.host_scalars[0];
  }
  return sum;
}

double SlidingEngine::compute_grads(const std::vector<Batch>& batches) {
  Impl& m = *impl_;
  SF_CHECK(opt_.keep_grads, "compute_grads needs an engine built with keep_grads");
  int64_t trained = 0;
  for (const Batch& b : batches) trained += b.trained;
  if (m.gpu.total > 0) dev_.ops().zero(Tensor(m.gpu.grads.data(), DType::F32, {m.gpu.total}), *m.compute);
  m.zero_scalars();
  m.run(batches, trained > 0 ? float(1.0 / double(trained)) : 0.f, true, nullptr);
  m.read_scalars();
  m.sync_all();
  return trained > 0 ? double(m.host_scalars[0]) / double(trained) : 0.0;
}

void SlidingEngine::synchronize() { impl_->sync_all(); }

void SlidingEngine::read_state(State which, int blob, int entry, float* dst) {
  Impl& m = *impl_;
  m.sync_all();
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  if (m.gpu.has(blob)) {
    dev_.copy(dst, m.gpu.at(m.gpu.state(which), blob) + e.offset, size_t(e.numel) * 4, CopyKind::DeviceToHost,
              *m.compute);
    dev_.synchronize(*m.compute);
    return;
  }
  if (which == State::Grads) {
    const char* g = static_cast<const char*>(m.host->grads(blob)) + size_t(e.offset) * dtype_size(m.act);
    cpu::cast(Tensor(dst, DType::F32, {e.numel}), Tensor(const_cast<char*>(g), m.act, {e.numel}));
    return;
  }
  const int s = which == State::Params ? 0 : which == State::AdamM ? 1 : 2;
  std::memcpy(dst, m.host->state(s, blob) + e.offset, size_t(e.numel) * 4);
}

void SlidingEngine::write_state(State which, int blob, int entry, const float* src) {
  Impl& m = *impl_;
  SF_CHECK(which != State::Grads, "gradients are not written back");
  m.sync_all();
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  if (m.gpu.has(blob)) {
    dev_.copy(m.gpu.at(m.gpu.state(which), blob) + e.offset, src, size_t(e.numel) * 4, CopyKind::HostToDevice,
              *m.compute);
    if (which == State::Params) m.gpu_refresh(blob);
    dev_.synchronize(*m.compute);
    return;
  }
  const int s = which == State::Params ? 0 : which == State::AdamM ? 1 : 2;
  std::memcpy(m.host->state(s, blob) + e.offset, src, size_t(e.numel) * 4);
  if (which == State::Params) m.slots->invalidate();
}

size_t SlidingEngine::device_bytes() const {
  const Impl& m = *impl_;
  size_t n = m.slots->device_bytes() + m.emb_acc.buf.size() + m.head_acc.buf.size() + m.grad_stg.size() +
             m.acts.size() + m.ckpts->device_bytes() + m.scratch.size() + m.scalars.size() + m.rope->buf.size() +
             m.ws->bytes() + m.tokens->device_bytes() + m.gpu.params.size() + m.gpu.master.size() + m.gpu.m.size() +
             m.gpu.v.size() + m.gpu.grads.size();
  for (const auto& a : m.layer_acc) n += a.buf.size();
  return n;
}

size_t SlidingEngine::host_bytes() const {
  const Impl& m = *impl_;
  return m.host->host_bytes() + m.ckpts->host_bytes() + m.tokens->host_bytes();
}

int64_t SlidingEngine::uploads() const { return impl_->slots->uploads(); }

Engine::Stats SlidingEngine::stats() const {
  const Impl& m = *impl_;
  return Stats{m.host->update_seconds(), m.slots->uploads(),
               m.host->pinned_bytes() + m.ckpts->host_bytes() + m.tokens->host_bytes()};
}

}  // namespace sf
