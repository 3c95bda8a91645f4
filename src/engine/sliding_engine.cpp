#include "engine/sliding_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/blob_init.h"
#include "engine/device_rope.h"
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

// Adds the wall time of its scope to a counter.
struct Timer {
  std::atomic<int64_t>& ns;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  explicit Timer(std::atomic<int64_t>& n) : ns(n) {}
  ~Timer() {
    ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
};

struct SlidingEngine::Impl {
  Impl(Device& d, const ModelSpec& s, const ModelLayout& lay, const SlidingOptions& o);

  Device& dev;
  const ModelSpec& spec;
  const ModelLayout& layout;
  DType act;
  int L = 0;
  std::vector<int64_t> blob_off;             // element offset of each blob in the flat host buffers (-1: on the GPU)
  std::vector<int64_t> gpu_off;              // element offset of each blob in the GPU state buffers (-1: on the host)
  int64_t total = 0, gpu_total = 0;          // elements of the host / GPU state buffers
  int64_t max_blob = 0, max_layer_blob = 0;  // largest host blob / host layer blob
  bool on_gpu(int blob) const { return gpu_off[size_t(blob)] >= 0; }
  int64_t max_tokens = 0;
  size_t stride_nh = 0;  // bytes of one [max N, H] activation

  // Host state, flat, in the resident engine's layout (so both run the same host kernels).
  DeviceBuffer master;  // [total] F32, pinned: the upload source when act == F32
  DeviceBuffer upload;  // [total] act, pinned: the compute copy uploaded when act != F32
  // [total] F32 pinned: accumulated over the micro-batches of a step; a blob's first gradient of
  // the step is copied straight into it (no host pass), later ones are added from staging.
  DeviceBuffer grads;
  // Per blob: no gradient arrived since zero_grads, so the next one is copied rather than added
  // (zeroing is lazy: zero_grads never waits for the host work of the previous step).
  std::vector<bool> grads_fresh;
  HostBuffer adam_m, adam_v;  // [total] F32
  // The squared gradient norm, built as the gradients arrive (Engine::grad_sq_norm): the host
  // addition of a blob also sums its squares in cpu::sq_norm's fixed blocks, from the blob's start.
  std::vector<double> block_sq;    // [sum over blobs of their blocks]
  std::vector<int64_t> block_off;  // [blobs] first block of each blob in block_sq
  std::vector<float> blob_sq;      // [blobs] float(the blob's sq_norm)

  // GPU parameter slots: [K, max_blob] act.
  struct Slot {
    int blob = -1;
    uint64_t last_use = 0;
    std::unique_ptr<Event> ready;     // h2d: the upload into the slot is done
    std::unique_ptr<Event> released;  // compute: the last kernel reading the slot is done
  };
  DeviceBuffer slot_mem;
  std::vector<Slot> slots;
  uint64_t clock = 0;
  int64_t uploads = 0;
  std::atomic<int64_t> grad_ns{0}, update_ns{0};  // host work time (stats())

  // Gradients leave the GPU through these: a device buffer, its pinned staging, two events.
  struct GradBuf {
    DeviceBuffer dev;                 // [numel] F32
    DeviceBuffer host;                // [numel] F32 pinned
    std::unique_ptr<Event> computed;  // compute: the gradient is complete
    std::unique_ptr<Event> free;      // d2h: copied down and added on the host
  };
  GradBuf layer_grads[2];  // [max layer blob], alternating between layers
  int next_grad = 0;
  GradBuf emb_grads, head_grads;  // whole backward (the tied head adds into the embedding's)

  // Activations.
  DeviceBuffer fwd_acts;   // [2, N, H]: layer input / output, alternating, in the forward
  DeviceBuffer bwd_acts;   // [2, N, H]: checkpoints fetched back for the backward
  DeviceBuffer dbuf;       // [3, N, H]: dy, dx, recompute output
  DeviceBuffer host_ckpt;  // [L, N, H] act, pinned: each layer's input
  std::unique_ptr<Event> fwd_done[2], fwd_free[2], bwd_ready[2], bwd_free[2];

  // The overlapped update (schedule_update): applied to each blob by the d2h stream right after
  // its gradient lands; uploads of a blob wait for its update.
  bool update_armed = false;    // the next backward applies `update`
  bool update_applied = false;  // a backward applied it; adamw_step only completes the step
  bool slots_stale = false;     // an update was queued: the next forward re-uploads every blob
  AdamWParams update;
  std::vector<std::unique_ptr<Event>> updated;  // [blobs] opt: the blob's update is done
  std::vector<std::unique_ptr<Event>> added;    // [blobs] d2h: the blob's gradient is in `grads`

  DeviceBuffer scalars;  // [2] F32: loss sum, squared norm (device side)
  float host_loss = 0;
  std::unique_ptr<Stream> compute, h2d, d2h;
  // Host optimizer work (AdamW per blob) in its own stream, so that gradient and checkpoint
  // copies on d2h never queue behind it. Created last (stream indices of the race tests).
  std::unique_ptr<Stream> opt;
  std::unique_ptr<DeviceRope> rope;
  std::unique_ptr<Workspace> ws;
  std::unique_ptr<TokenUploader> tokens;
  Program program;

  // Blobs kept on the GPU (SlidingOptions::gpu_blobs), each [gpu_total] in gpu_off's layout.
  DeviceBuffer gpu_params;       // act: the compute copy
  DeviceBuffer gpu_master;       // F32
  DeviceBuffer gpu_m, gpu_v;     // F32 AdamW state
  DeviceBuffer gpu_grads;        // F32, accumulated over the micro-batches of a step
  std::vector<float> gpu_norms;  // [blobs] host copy of the device per-blob norms
  void* gpu_at(const DeviceBuffer& b, int blob, DType t) const {
    return static_cast<char*>(b.data()) + size_t(gpu_off[size_t(blob)]) * dtype_size(t);
  }
  Tensor gpu_tensor(const DeviceBuffer& b, int blob, DType t) const {
    return Tensor(gpu_at(b, blob, t), t, {layout.blobs[size_t(blob)].numel});
  }
  // AdamW of a GPU blob on the compute stream.
  void gpu_update(int blob, const AdamWParams& p) {
    dev.ops().adamw(gpu_tensor(gpu_master, blob, DType::F32), gpu_tensor(gpu_grads, blob, DType::F32),
                    gpu_tensor(gpu_m, blob, DType::F32), gpu_tensor(gpu_v, blob, DType::F32),
                    act == DType::F32 ? Tensor() : gpu_tensor(gpu_params, blob, act), p, *compute);
  }
  void* host_state(State which) const {
    return which == State::Params  ? master.data()
           : which == State::Grads ? grads.data()
           : which == State::AdamM ? adam_m.data()
                                   : adam_v.data();
  }
  const DeviceBuffer& gpu_state(State which) const {
    return which == State::Params  ? gpu_master
           : which == State::Grads ? gpu_grads
           : which == State::AdamM ? gpu_m
                                   : gpu_v;
  }
  // fp32 values of a GPU blob -> its master and compute copy (load, init, import).
  void gpu_upload_master(int blob, const std::vector<float>& host) {
    dev.copy(gpu_at(gpu_master, blob, DType::F32), host.data(), host.size() * 4, CopyKind::HostToDevice, *compute);
    gpu_refresh(blob);
    dev.synchronize(*compute);  // host is the caller's
  }
  // The compute copy of a GPU blob from its master (after load / import).
  void gpu_refresh(int blob) {
    if (act != DType::F32)
      dev.ops().cast(gpu_tensor(gpu_params, blob, act), gpu_tensor(gpu_master, blob, DType::F32), *compute);
  }

  Tensor act_at(const DeviceBuffer& b, int i, int64_t N) const {
    return Tensor(static_cast<char*>(b.data()) + size_t(i) * stride_nh, act, {N, spec.hidden});
  }
  // Handles from acquire: a slot index >= 0, or kGpu - blob for a blob kept on the GPU.
  static constexpr int kGpu = -2;
  void* slot_ptr(int k) const {
    if (k <= kGpu) return gpu_at(act == DType::F32 ? gpu_master : gpu_params, kGpu - k, act);
    return static_cast<char*>(slot_mem.data()) + size_t(k) * size_t(max_blob) * dtype_size(act);
  }
  // The host copy of a blob's parameters in the compute dtype (the upload source).
  const void* host_params(int blob) const {
    const DeviceBuffer& src = act == DType::F32 ? master : upload;
    return static_cast<const char*>(src.data()) + size_t(blob_off[blob]) * dtype_size(act);
  }
  float* host_f32(void* base, int blob) const { return static_cast<float*>(base) + blob_off[blob]; }

  // The slot holding `blob`, uploading it first if needed (the least recently used slot other
  // than `keep` is reused once the compute stream has released it). With `use`, the compute
  // stream waits for the upload.
  int acquire(int blob, bool use, int keep = -1) {
    if (on_gpu(blob)) return kGpu - blob;  // in place; its update ran earlier on the compute stream
    for (int k = 0; k < int(slots.size()); ++k) {
      if (slots[k].blob != blob) continue;
      slots[k].last_use = ++clock;
      if (use) dev.wait(*compute, *slots[k].ready);
      return k;
    }
    int v = -1;
    for (int k = 0; k < int(slots.size()); ++k) {
      if (k == keep) continue;
      if (v < 0 || slots[k].last_use < slots[v].last_use) v = k;
    }
    SF_CHECK(v >= 0, "no free parameter slot");
    Slot& s = slots[v];
    dev.wait(*h2d, *s.released);
    dev.wait(*h2d, *updated[blob]);  // the host copy is final (overlapped update)
    dev.copy(slot_ptr(v), host_params(blob), size_t(layout.blobs[blob].numel) * dtype_size(act), CopyKind::HostToDevice,
             *h2d);
    dev.record(*s.ready, *h2d);
    ++uploads;
    s.blob = blob;
    s.last_use = ++clock;
    if (use) dev.wait(*compute, *s.ready);
    return v;
  }
  void release(int k) {
    if (k >= 0) dev.record(*slots[k].released, *compute);
  }
  void invalidate_slots() {
    for (Slot& s : slots) s.blob = -1;
  }

  // Gradient of `blob` in g.dev is complete on the compute stream: copy it down and add it into
  // the host accumulator, in the d2h stream's order.
  void send_grads(GradBuf& g, int blob) {
    if (on_gpu(blob)) {
      if (update_armed) gpu_update(blob, update);
      return;
    }
    const int64_t n = layout.blobs[blob].numel;
    dev.record(*g.computed, *compute);
    dev.wait(*d2h, *g.computed);
    dev.wait(*d2h, *updated[blob]);  // the last update has read the accumulator (implied by the upload)
    const bool first = grads_fresh[blob];
    grads_fresh[blob] = false;
    if (first) {
      dev.copy(host_f32(grads.data(), blob), g.dev.data(), size_t(n) * 4, CopyKind::DeviceToHost, *d2h);
      dev.host_fn(*d2h, [this, blob] { add_grads(blob, nullptr); });
    } else {
      dev.copy(g.host.data(), g.dev.data(), size_t(n) * 4, CopyKind::DeviceToHost, *d2h);
      dev.host_fn(*d2h, [this, &g, blob] { add_grads(blob, static_cast<const float*>(g.host.data())); });
    }
    dev.record(*g.free, *d2h);
    dev.record(*added[blob], *d2h);
    if (update_armed) queue_update(blob, update);
  }
  // grads[blob] += src (src null: the gradient is already in place) on the host's thread pool (a
  // layer's gradient is tens of millions of values), and the blob's squared norm on the way.
  void add_grads(int blob, const float* src) {
    const Timer timer(grad_ns);
    const int64_t off = blob_off[blob], n = layout.blobs[blob].numel;
    float* base = static_cast<float*>(grads.data());
    auto add = [&](int64_t i0, int64_t i1) {  // flat indices
      if (src)
        for (int64_t i = i0; i < i1; ++i) base[i] += src[i - off];
    };
    const int64_t B = cpu::kSqNormBlock, nblk = (n + B - 1) / B;
    double* part = block_sq.data() + block_off[blob];
    cpu_pool().parallel_for(
        nblk,
        [&](int64_t k0, int64_t k1) {
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t i0 = off + k * B, i1 = std::min(i0 + B, off + n);
            add(i0, i1);
            part[k] = cpu::sq_sum(base + i0, i1 - i0);
          }
        },
        4);
    double sum = 0.0;
    for (int64_t k = 0; k < nblk; ++k) sum += part[k];
    blob_sq[size_t(blob)] = float(0.0 + sum);  // cpu::sq_norm into a zeroed scalar
  }
  // AdamW of `blob` on the opt stream once its gradient is in the accumulator; uploads of the
  // blob wait for `updated`.
  void queue_update(int blob, const AdamWParams& p) {
    dev.wait(*opt, *added[blob]);
    dev.host_fn(*opt, [this, blob, p] { update_blob(blob, p); });  // p by value: the next step may differ
    dev.record(*updated[blob], *opt);
  }
  // AdamW on one blob's host state (elementwise: the same bits as one call over all blobs).
  void update_blob(int blob, const AdamWParams& p) {
    const Timer timer(update_ns);
    const int64_t n = layout.blobs[blob].numel;
    auto at = [&](void* base) { return Tensor(host_f32(base, blob), DType::F32, {n}); };
    Tensor copy =
        act == DType::F32 ? Tensor() : Tensor(static_cast<char*>(upload.data()) + size_t(blob_off[blob]) * 2, act, {n});
    cpu::adamw(at(master.data()), at(grads.data()), at(adam_m.data()), at(adam_v.data()), copy, p);
  }
  // Zeroes a gradient buffer on the compute stream once its last contents have left.
  Tensor fresh_grads(GradBuf& g, int blob) {
    if (on_gpu(blob)) return gpu_tensor(gpu_grads, blob, DType::F32);  // accumulates; zeroed by zero_grads
    dev.wait(*compute, *g.free);
    Tensor t(g.dev.data(), DType::F32, {layout.blobs[blob].numel});
    dev.ops().zero(t, *compute);
    return t;
  }
  // Checkpoint l (the input of layer l) back to bwd_acts[l % 2], on the h2d stream.
  void fetch_checkpoint(int l, int64_t N) {
    const int i = l % 2;
    dev.wait(*h2d, *bwd_free[i]);
    dev.wait(*h2d, *fwd_free[l % 2]);  // its offload (and any later one) is done
    const size_t bytes = size_t(N * spec.hidden) * dtype_size(act);
    dev.copy(act_at(bwd_acts, i, N).data, static_cast<char*>(host_ckpt.data()) + size_t(l) * stride_nh, bytes,
             CopyKind::HostToDevice, *h2d);
    dev.record(*bwd_ready[i], *h2d);
  }
  // Blobs that received no gradient since zero_grads hold stale values: make them 0.
  // (No host work of this step touches such a blob, so this may run while other blobs are added.)
  void clear_fresh_grads() {
    for (size_t b = 0; b < grads_fresh.size(); ++b) {
      if (!grads_fresh[b] || on_gpu(int(b))) continue;
      dev.synchronize(*updated[b]);  // the last step's update of the blob has read it
      std::memset(host_f32(grads.data(), int(b)), 0, size_t(layout.blobs[b].numel) * 4);
      blob_sq[b] = 0.f;
      grads_fresh[b] = false;
    }
  }
  void sync_all() {
    tokens->synchronize();
    dev.synchronize(*h2d);
    dev.synchronize(*compute);
    dev.synchronize(*d2h);
    dev.synchronize(*opt);
  }
  void refresh_upload_copy() {
    if (act == DType::F32 || total == 0) return;
    cpu::cast(Tensor(upload.data(), act, {total}), Tensor(master.data(), DType::F32, {total}));
  }
};

SlidingEngine::Impl::Impl(Device& d, const ModelSpec& s, const ModelLayout& lay, const SlidingOptions& o)
    : dev(d),
      spec(s),
      layout(lay),
      act(natural_compute_dtype(d, o.base.compute_dtype)),
      L(s.n_layer),
      compute(d.create_stream()),
      h2d(d.create_stream()),
      d2h(d.create_stream()),
      program(s, d.ops(), act) {
  SF_CHECK(o.slots >= 2, "the sliding engine needs at least 2 parameter slots");
  std::vector<bool> keep(layout.blobs.size(), false);
  for (int b : o.gpu_blobs) {
    SF_CHECK(b >= 0 && b < int(layout.blobs.size()), "gpu_blobs: no blob " + std::to_string(b));
    keep[size_t(b)] = true;
  }
  for (size_t i = 0; i < layout.blobs.size(); ++i) {
    const BlobLayout& b = layout.blobs[i];
    if (keep[i]) {
      blob_off.push_back(-1);
      gpu_off.push_back(gpu_total);
      gpu_total += b.numel;
      continue;
    }
    blob_off.push_back(total);
    gpu_off.push_back(-1);
    total += b.numel;
    max_blob = std::max(max_blob, b.numel);
    if (b.kind == BlobKind::Layer) max_layer_blob = std::max(max_layer_blob, b.numel);
  }
  for (const auto& bl : layout.blobs) {
    block_off.push_back(int64_t(block_sq.size()));
    block_sq.resize(block_sq.size() + size_t((bl.numel + cpu::kSqNormBlock - 1) / cpu::kSqNormBlock));
  }
  blob_sq.assign(layout.blobs.size(), 0.f);
  max_tokens = int64_t(o.base.max_batch) * o.base.max_seq;
  stride_nh = (size_t(max_tokens * spec.hidden) * dtype_size(act) + 255) / 256 * 256;

  master = DeviceBuffer(dev, size_t(total) * 4, MemoryKind::PinnedHost);
  std::memset(master.data(), 0, size_t(total) * 4);  // padding between tensors stays 0
  if (act != DType::F32) upload = DeviceBuffer(dev, size_t(total) * dtype_size(act), MemoryKind::PinnedHost);
  grads = DeviceBuffer(dev, size_t(total) * 4, MemoryKind::PinnedHost);
  grads_fresh.assign(layout.blobs.size(), true);
  adam_m = HostBuffer(size_t(total) * 4);
  adam_v = HostBuffer(size_t(total) * 4);
  std::memset(grads.data(), 0, grads.size());
  std::memset(adam_m.data(), 0, adam_m.size());
  std::memset(adam_v.data(), 0, adam_v.size());

  slot_mem = DeviceBuffer(dev, size_t(o.slots) * size_t(max_blob) * dtype_size(act));
  slots.resize(size_t(o.slots));
  for (Slot& sl : slots) {
    sl.ready = dev.create_event();
    sl.released = dev.create_event();
  }
  auto make_grads = [&](GradBuf& g, int64_t n) {
    g.dev = DeviceBuffer(dev, size_t(n) * 4);
    g.host = DeviceBuffer(dev, size_t(n) * 4, MemoryKind::PinnedHost);
    g.computed = dev.create_event();
    g.free = dev.create_event();
  };
  for (GradBuf& g : layer_grads) make_grads(g, max_layer_blob);
  make_grads(emb_grads, on_gpu(0) ? 0 : layout.embedding().numel);
  make_grads(head_grads, on_gpu(L + 1) ? 0 : layout.head().numel);
  if (gpu_total > 0) {
    const size_t n = size_t(gpu_total);
    if (act != DType::F32) gpu_params = DeviceBuffer(dev, n * dtype_size(act));
    gpu_master = DeviceBuffer(dev, n * 4);
    gpu_m = DeviceBuffer(dev, n * 4);
    gpu_v = DeviceBuffer(dev, n * 4);
    gpu_grads = DeviceBuffer(dev, n * 4);
    for (const DeviceBuffer* b : {&gpu_master, &gpu_m, &gpu_v, &gpu_grads})
      dev.ops().zero(Tensor(b->data(), DType::F32, {gpu_total}), *compute);
  }
  gpu_norms.assign(layout.blobs.size(), 0.f);

  fwd_acts = DeviceBuffer(dev, 2 * stride_nh);
  bwd_acts = DeviceBuffer(dev, 2 * stride_nh);
  dbuf = DeviceBuffer(dev, 3 * stride_nh);
  host_ckpt = DeviceBuffer(dev, size_t(std::max(L, 1)) * stride_nh, MemoryKind::PinnedHost);
  for (int i = 0; i < 2; ++i) {
    fwd_done[i] = dev.create_event();
    fwd_free[i] = dev.create_event();
    bwd_ready[i] = dev.create_event();
    bwd_free[i] = dev.create_event();
  }
  for (size_t b = 0; b < layout.blobs.size(); ++b) {
    updated.push_back(dev.create_event());
    added.push_back(dev.create_event());
  }
  scalars = DeviceBuffer(dev, engine_scalar_bytes(layout.blobs.size()));
  dev.ops().zero(Tensor(scalars.data(), DType::F32, {2}), *compute);
  rope = std::make_unique<DeviceRope>(dev, spec, o.base.max_seq, *compute);
  ws = std::make_unique<Workspace>(dev, spec, o.base.max_batch, o.base.max_seq, act);
  tokens = std::make_unique<TokenUploader>(dev, max_tokens);
  opt = d.create_stream();
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
  impl_->sync_all();  // no update in flight writes the masters
  ProgressLog progress("loading weights", double(impl_->total + impl_->gpu_total) * 4);
  std::vector<float> tmp;
  for (size_t b = 0; b < layout_.blobs.size(); ++b) {
    if (impl_->on_gpu(int(b))) {
      tmp.resize(size_t(layout_.blobs[b].numel));
      read_blob(ckpt, layout_.blobs[b], tmp.data());
      impl_->gpu_upload_master(int(b), tmp);
    } else {
      read_blob(ckpt, layout_.blobs[b], impl_->host_f32(impl_->master.data(), int(b)));
    }
    progress.add(double(layout_.blobs[b].numel) * 4);
  }
  impl_->refresh_upload_copy();
  impl_->invalidate_slots();
}

void SlidingEngine::init_random(uint64_t seed) {
  impl_->sync_all();
  std::vector<float> tmp;
  for (size_t b = 0; b < layout_.blobs.size(); ++b) {
    if (impl_->on_gpu(int(b))) {
      tmp.resize(size_t(layout_.blobs[b].numel));
      random_blob(layout_.blobs[b], int(b), seed, spec_.initializer_range, tmp.data());
      impl_->gpu_upload_master(int(b), tmp);
    } else {
      random_blob(layout_.blobs[b], int(b), seed, spec_.initializer_range,
                  impl_->host_f32(impl_->master.data(), int(b)));
    }
  }
  impl_->refresh_upload_copy();
  impl_->invalidate_slots();
}

void SlidingEngine::zero_grads() {
  Impl& m = *impl_;
  m.grads_fresh.assign(layout_.blobs.size(), true);
  // GPU blobs accumulate in place: zeroed on the compute stream, after their last update read them.
  if (m.gpu_total > 0) dev_.ops().zero(Tensor(m.gpu_grads.data(), DType::F32, {m.gpu_total}), *m.compute);
}

void SlidingEngine::forward_backward(const Batch& b, float grad_scale, bool backward) {
  Impl& m = *impl_;
  SF_CHECK(b.B <= opt_.base.max_batch && b.T <= opt_.base.max_seq, "batch larger than the engine was built for");
  Stream& c = *m.compute;
  const BatchDims d{b.B, b.T};
  const int64_t N = d.N();
  const int L = m.L;
  const int head_blob = L + 1;
  const DType act = m.act;
  const size_t act_bytes = size_t(N * spec_.hidden) * dtype_size(act);

  if (m.slots_stale) {  // a new step after an update: every slot is stale
    m.invalidate_slots();
    m.slots_stale = false;
  }
  m.update_applied = false;
  const TokenUploader::Tokens tok = m.tokens->upload(b, c);
  auto params = [&](int k, int blob) { return layer_views(layout_.blobs[blob], m.slot_ptr(k), act); };
  auto entry = [&](int k, int blob, int i) { return entry_view(layout_.blobs[blob].entries[i], m.slot_ptr(k), act); };

  // Forward: layer l reads fwd_acts[l % 2] and writes fwd_acts[(l + 1) % 2]; its input then goes
  // to host_ckpt[l] on the d2h stream.
  int k = m.acquire(0, true);
  m.program.embed_forward(m.act_at(m.fwd_acts, 0, N), tok.ids, entry(k, 0, 0), c);
  m.release(k);
  if (L > 0) m.acquire(1, false);
  for (int l = 0; l < L; ++l) {
    k = m.acquire(1 + l, true);
    m.acquire(std::min(2 + l, head_blob), false, k);  // prefetch the next blob
    Tensor in = m.act_at(m.fwd_acts, l % 2, N), out = m.act_at(m.fwd_acts, (l + 1) % 2, N);
    dev_.wait(c, *m.fwd_free[(l + 1) % 2]);  // out's last contents (layer l-1's input) are offloaded
    m.program.layer_forward(params(k, 1 + l), in, out, m.ws->layer(d), d, m.rope->tables, c);
    m.release(k);
    if (backward) {
      dev_.record(*m.fwd_done[l % 2], c);
      dev_.wait(*m.d2h, *m.fwd_done[l % 2]);
      dev_.copy(static_cast<char*>(m.host_ckpt.data()) + size_t(l) * m.stride_nh, in.data, act_bytes,
                CopyKind::DeviceToHost, *m.d2h);
      dev_.record(*m.fwd_free[l % 2], *m.d2h);
    }
  }

  // Head.
  const Tensor xL = m.act_at(m.fwd_acts, L % 2, N);
  const int kh = m.acquire(head_blob, true);
  const int ke = spec_.tie_embeddings ? m.acquire(0, true, kh) : -1;
  const Tensor norm_w = entry(kh, head_blob, 0);
  const Tensor w_head = spec_.tie_embeddings ? entry(ke, 0, 0) : entry(kh, head_blob, 1);
  Tensor loss_sum(m.scalars.data(), DType::F32, {1});
  const HeadBuffers hb = m.ws->head(d);
  if (!backward) {
    m.program.head_forward_backward(xL, norm_w, w_head, tok.targets, loss_sum, Tensor(), Tensor(), Tensor(), grad_scale,
                                    hb, d, c);
    m.release(kh);
    m.release(ke);
    m.tokens->done(c);
    return;
  }
  if (L > 0) m.fetch_checkpoint(L - 1, N);
  const Tensor g_emb = entry_view(layout_.embedding().entries[0], m.fresh_grads(m.emb_grads, 0).data, DType::F32);
  const void* g_headblob = m.fresh_grads(m.head_grads, head_blob).data;
  const BlobLayout& hl = layout_.head();
  Tensor g_norm = entry_view(hl.entries[0], const_cast<void*>(g_headblob), DType::F32);
  Tensor g_w_head = spec_.tie_embeddings ? g_emb : entry_view(hl.entries[1], const_cast<void*>(g_headblob), DType::F32);
  Tensor dy = m.act_at(m.dbuf, 0, N), dx = m.act_at(m.dbuf, 1, N), scratch = m.act_at(m.dbuf, 2, N);
  m.program.head_forward_backward(xL, norm_w, w_head, tok.targets, loss_sum, dy, g_norm, g_w_head, grad_scale, hb, d,
                                  c);
  m.release(kh);
  m.release(ke);
  m.send_grads(m.head_grads, head_blob);

  // Backward: layer l recomputes from its fetched checkpoint; its gradient leaves at once.
  for (int l = L - 1; l >= 0; --l) {
    k = m.acquire(1 + l, true);
    if (l > 0) {
      m.acquire(l, false, k);  // prefetch layer l-1's parameters and checkpoint
      m.fetch_checkpoint(l - 1, N);
    }
    dev_.wait(c, *m.bwd_ready[l % 2]);
    Tensor x = m.act_at(m.bwd_acts, l % 2, N);
    Impl::GradBuf& gb = m.layer_grads[m.next_grad];
    m.next_grad ^= 1;
    Tensor g = m.fresh_grads(gb, 1 + l);
    LayerBuffers w = m.ws->layer(d);
    m.program.layer_forward(params(k, 1 + l), x, scratch, w, d, m.rope->tables, c);
    m.program.layer_backward(params(k, 1 + l), layer_views(layout_.layer(l), g.data, DType::F32), x, dy, dx, w, d,
                             m.rope->tables, c);
    std::swap(dy, dx);
    m.release(k);
    dev_.record(*m.bwd_free[l % 2], c);
    m.send_grads(gb, 1 + l);
  }
  m.program.embed_backward(g_emb, dy, tok.ids, c);
  m.tokens->done(c);
  m.send_grads(m.emb_grads, 0);
  if (m.update_armed) {
    m.update_armed = false;
    m.update_applied = true;
    m.slots_stale = true;
  }
}

void SlidingEngine::schedule_update(const AdamWParams& p) {
  SF_CHECK(p.grad_scale == 1.f, "an overlapped update cannot depend on the gradient norm");
  impl_->update = p;
  impl_->update_armed = true;
}

double SlidingEngine::take_loss_sum() {
  Impl& m = *impl_;
  dev_.copy(&m.host_loss, m.scalars.data(), 4, CopyKind::DeviceToHost, *m.compute);
  dev_.ops().zero(Tensor(m.scalars.data(), DType::F32, {1}), *m.compute);
  dev_.synchronize(*m.compute);
  return m.host_loss;
}

double SlidingEngine::grad_sq_norm() {
  Impl& m = *impl_;
  dev_.synchronize(*m.d2h);  // every gradient has been added on the host
  m.clear_fresh_grads();
  if (m.gpu_total > 0) {  // the GPU blobs' norms, each into its own zeroed scalar
    const int nb = int(layout_.blobs.size());
    float* norms = static_cast<float*>(m.scalars.data()) + 2;  // [blobs]
    dev_.ops().zero(Tensor(norms, DType::F32, {nb}), *m.compute);
    for (int b = 0; b < nb; ++b)
      if (m.on_gpu(b))
        dev_.ops().sq_norm(Tensor(norms + b, DType::F32, {1}), m.gpu_tensor(m.gpu_grads, b, DType::F32), *m.compute);
    dev_.copy(m.gpu_norms.data(), norms, size_t(nb) * 4, CopyKind::DeviceToHost, *m.compute);
    dev_.synchronize(*m.compute);
    for (int b = 0; b < nb; ++b)
      if (m.on_gpu(b)) m.blob_sq[size_t(b)] = m.gpu_norms[size_t(b)];
  }
  return sum_blob_norms(m.blob_sq);
}

void SlidingEngine::adamw_step(const AdamWParams& p) {
  Impl& m = *impl_;
  if (m.update_applied) {
    // The backward queued every blob's update on the opt stream; the next forward's uploads wait
    // for them blob by blob (`updated`), so nothing waits here.
    SF_CHECK(p.lr == m.update.lr && p.step == m.update.step && p.grad_scale == m.update.grad_scale,
             "adamw_step differs from the scheduled update");
    m.update_applied = false;
    return;
  }
  // (Clipping, or no update scheduled.) Every blob's AdamW is queued on the opt stream in forward
  // order, after the blob's gradient is in; the next forward's upload of a blob waits for its
  // update only, so the update overlaps that forward. Nothing waits here.
  m.update_armed = false;
  m.clear_fresh_grads();
  for (int b = 0; b < int(layout_.blobs.size()); ++b) {
    if (m.on_gpu(b))
      m.gpu_update(b, p);  // compute stream: before the next forward reads the blob
    else
      m.queue_update(b, p);
  }
  m.slots_stale = true;
}

void SlidingEngine::synchronize() { impl_->sync_all(); }

std::vector<SlidingEngine::HostTensor> SlidingEngine::export_state(State which) {
  Impl& m = *impl_;
  m.sync_all();
  if (which == State::Grads) m.clear_fresh_grads();
  void* base = m.host_state(which);
  const DeviceBuffer& gbase = m.gpu_state(which);
  std::vector<HostTensor> out;
  std::vector<float> tmp;
  for (size_t b = 0; b < layout_.blobs.size(); ++b) {
    const float* blob = nullptr;
    if (m.on_gpu(int(b))) {
      tmp.resize(size_t(layout_.blobs[b].numel));
      dev_.copy(tmp.data(), m.gpu_at(gbase, int(b), DType::F32), tmp.size() * 4, CopyKind::DeviceToHost, *m.compute);
      dev_.synchronize(*m.compute);
      blob = tmp.data();
    } else {
      blob = m.host_f32(base, int(b));
    }
    for (const BlobEntry& e : layout_.blobs[b].entries) {
      out.push_back(HostTensor{e.name, e.shape, std::vector<float>(blob + e.offset, blob + e.offset + e.numel)});
    }
  }
  return out;
}

void SlidingEngine::import_state(State which, const std::vector<HostTensor>& tensors) {
  Impl& m = *impl_;
  m.sync_all();
  void* base = m.host_state(which);
  std::map<std::string, const HostTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  if (which == State::Grads) m.grads_fresh.assign(layout_.blobs.size(), false);
  const DeviceBuffer& gbase = m.gpu_state(which);
  std::vector<float> tmp;
  for (size_t b = 0; b < layout_.blobs.size(); ++b) {
    const bool gpu = m.on_gpu(int(b));
    if (gpu) tmp.assign(size_t(layout_.blobs[b].numel), 0.f);  // padding between tensors stays 0
    float* blob = gpu ? tmp.data() : m.host_f32(base, int(b));
    for (const BlobEntry& e : layout_.blobs[b].entries) {
      auto it = by_name.find(e.name);
      SF_CHECK(it != by_name.end(), "import_state: missing " + e.name);
      SF_CHECK(it->second->shape == e.shape, "import_state: shape mismatch for " + e.name);
      std::copy(it->second->data.begin(), it->second->data.end(), blob + e.offset);
    }
    if (gpu) {
      dev_.copy(m.gpu_at(gbase, int(b), DType::F32), tmp.data(), tmp.size() * 4, CopyKind::HostToDevice, *m.compute);
      if (which == State::Params) m.gpu_refresh(int(b));
      dev_.synchronize(*m.compute);
    }
  }
  if (which == State::Params) {
    m.refresh_upload_copy();
    m.invalidate_slots();
  }
}

size_t SlidingEngine::device_bytes() const {
  const Impl& m = *impl_;
  size_t n = m.slot_mem.size() + m.fwd_acts.size() + m.bwd_acts.size() + m.dbuf.size() + m.scalars.size() +
             m.rope->buf.size() + m.ws->bytes() + m.tokens->device_bytes() + m.emb_grads.dev.size() +
             m.head_grads.dev.size() + m.gpu_params.size() + m.gpu_master.size() + m.gpu_m.size() + m.gpu_v.size() +
             m.gpu_grads.size();
  for (const auto& g : m.layer_grads) n += g.dev.size();
  return n;
}

void SlidingEngine::read_state(State which, int blob, int entry, float* dst) {
  Impl& m = *impl_;
  m.sync_all();
  if (which == State::Grads) m.clear_fresh_grads();
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  if (m.on_gpu(blob)) {
    const char* src = static_cast<const char*>(m.gpu_at(m.gpu_state(which), blob, DType::F32)) + e.offset * 4;
    dev_.copy(dst, src, size_t(e.numel) * 4, CopyKind::DeviceToHost, *m.compute);
    dev_.synchronize(*m.compute);
    return;
  }
  void* base = m.host_state(which);
  std::memcpy(dst, m.host_f32(base, blob) + e.offset, size_t(e.numel) * 4);
}

void SlidingEngine::write_state(State which, int blob, int entry, const float* src) {
  Impl& m = *impl_;
  m.sync_all();
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  if (m.on_gpu(blob)) {
    char* dst = static_cast<char*>(m.gpu_at(m.gpu_state(which), blob, DType::F32)) + e.offset * 4;
    dev_.copy(dst, src, size_t(e.numel) * 4, CopyKind::HostToDevice, *m.compute);
    if (which == State::Params) m.gpu_refresh(blob);
    dev_.synchronize(*m.compute);
    return;
  }
  void* base = m.host_state(which);
  float* dst = m.host_f32(base, blob) + e.offset;
  std::memcpy(dst, src, size_t(e.numel) * 4);
  if (which == State::Grads) m.grads_fresh[size_t(blob)] = false;  // (the blob's other tensors keep theirs)
  if (which == State::Params) {
    if (m.act != DType::F32) {
      char* up = static_cast<char*>(m.upload.data()) + size_t(m.blob_off[size_t(blob)] + e.offset) * 2;
      cpu::cast(Tensor(up, m.act, {e.numel}), Tensor(dst, DType::F32, {e.numel}));
    }
    m.invalidate_slots();
  }
}

size_t SlidingEngine::host_bytes() const {
  const Impl& m = *impl_;
  size_t n = m.master.size() + m.upload.size() + m.grads.size() + m.adam_m.size() + m.adam_v.size() +
             m.host_ckpt.size() + m.tokens->host_bytes() + m.emb_grads.host.size() + m.head_grads.host.size();
  for (const auto& g : m.layer_grads) n += g.host.size();
  return n;
}

int64_t SlidingEngine::uploads() const { return impl_->uploads; }

Engine::Stats SlidingEngine::stats() const {
  return Stats{double(impl_->grad_ns.load()) * 1e-9, double(impl_->update_ns.load()) * 1e-9, impl_->uploads};
}

}  // namespace sf
