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
#include "engine/gradient_path.h"
#include "engine/host_optimizer.h"
#include "engine/kept_activations.h"
#include "engine/kv_share_store.h"
#include "engine/ple_store.h"
#include "engine/moe_stats.h"
#include "engine/slot_cache.h"
#include "engine/state_copy.h"
#include "engine/step_schedule.h"
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
  setting_error(Setting::ComputeDtype, "'" + name + "' is not available here (fp32 on the cpu backend, or bf16)");
}

}  // namespace

std::vector<bool> held_grad_blobs(const ModelLayout& layout, const std::vector<int>& gpu_blobs, int64_t hold) {
  const int nb = int(layout.blobs.size());
  std::vector<bool> held(size_t(nb), false);
  int64_t n = 0;
  // From the top of the forward order (the head, the last layer, ...): their gradients land first
  // and the next forward needs them last. Never the embedding: its gradient lands last and the
  // forward needs it first, so holding it moves nothing.
  for (int b = nb - 1; b >= 1 && n < hold; --b) {
    if (std::find(gpu_blobs.begin(), gpu_blobs.end(), b) != gpu_blobs.end()) continue;
    held[size_t(b)] = true;
    n += layout.blobs[size_t(b)].numel;
  }
  return held;
}

// The blobs kept whole on the GPU (SlidingOptions::gpu_blobs): every state in place, each buffer
// [total] in `off`'s layout, the gradients in `goff`'s; their AdamW runs on the compute stream.
// Gradients: a kept layer's in the compute dtype when it is below fp32 (accumulated in the gradient
// path's fp32 layer accumulators and rounded there, as every gradient is, so the same values: 2
// bytes a parameter less on the GPU); the embedding's and the head's F32 (they accumulate in place
// over the whole backward).
struct GpuBlobs {
  std::vector<int64_t> off;   // [blobs] element offset (-1: on the host)
  std::vector<int64_t> goff;  // [blobs] element offset in grads or grads_low (-1: on the host)
  std::vector<bool> low;      // [blobs] the gradient in grads_low
  int64_t total = 0, grads_total = 0;
  DType sd = DType::F32;       // m and v (EngineOptions::state_dtype)
  DType act = DType::F32;      // the compute dtype: the compute copy, grads_low
  DeviceBuffer params;         // act (act != F32): the compute copy
  DeviceBuffer master, grads;  // F32; grads [grads_total] accumulate over the step's micro-batches
  DeviceBuffer grads_low;      // act: the kept layers' rounded gradients (act != F32)
  DeviceBuffer m, v;           // sd
  bool has(int b) const { return off[size_t(b)] >= 0; }
  float* at(const DeviceBuffer& buf, int b) const { return static_cast<float*>(buf.data()) + off[size_t(b)]; }
  bool is_moment(Engine::State s) const { return s == Engine::State::AdamM || s == Engine::State::AdamV; }
  const DeviceBuffer& state(Engine::State s, int b) const {
    if (s == Engine::State::Grads) return low[size_t(b)] ? grads_low : grads;
    return s == Engine::State::Params ? master : s == Engine::State::AdamM ? m : v;
  }
  // Element e of blob b's `s`, and its dtype.
  void* at(Engine::State s, int b, int64_t e) const {
    const int64_t o = s == Engine::State::Grads ? goff[size_t(b)] : off[size_t(b)];
    return static_cast<char*>(state(s, b).data()) + size_t(o + e) * dtype_size(dtype(s, b));
  }
  DType dtype(Engine::State s, int b) const {
    if (s == Engine::State::Grads) return low[size_t(b)] ? act : DType::F32;
    return is_moment(s) ? sd : DType::F32;
  }
};

// Where a blob's compute-dtype parameters are while kernels read them.
struct ParamsRef {
  void* data = nullptr;
  int slot = -1;  // the slot to release, or -1 for a blob kept on the GPU
};

namespace {

// What the options fix of the sliding engine's buffers; the constructor and buffers() both start
// here, so that the list and the allocations agree.
struct SlidingShape {
  int K = 1;                                 // micro-batches a step
  std::vector<int64_t> gpu_off;              // [blobs] element offset among the kept blobs (-1: on the host)
  int64_t gpu_total = 0;                     // elements of the kept blobs
  std::vector<int64_t> gpu_goff;             // [blobs] element offset of a kept blob's gradient (GpuBlobs)
  std::vector<bool> gpu_low;                 // [blobs] a kept layer's gradient in the compute dtype
  int64_t gpu_grads = 0, gpu_grads_low = 0;  // elements of the kept F32 and compute-dtype gradients
  std::vector<int64_t> host_numel;           // [blobs] elements on the host (0: kept on the GPU)
  std::vector<bool> is_layer;                // [blobs]
  std::vector<bool> held;                    // [blobs] SlidingOptions::hold_grads' blobs
  std::vector<bool> disk;                    // [blobs] m and v in the NVMe store
  std::vector<bool> disk_master, disk_work;  // [blobs] the master too; the working copy too
  std::vector<bool> disk_grad;               // [blobs] the step's gradient too
  std::vector<bool> ram_work;                // [blobs] an upload copy beside the master in host memory
  int64_t max_layer = 0, emb = 0, head = 0;  // the gradient accumulators' elements (host blobs, kept low layers)
  bool emb_rows = false;                     // SlidingOptions::split_embedding_rows, where it applies
  int64_t chunk = 0;                         // elements a transfer chunk
  int64_t max_tokens = 0;
  size_t stride_nh = 0;  // bytes of one [max N, H] activation, 256-aligned
};

SlidingShape sliding_shape(const ModelSpec& spec, const ModelLayout& layout, const SlidingOptions& o, DType act) {
  const int nb = int(layout.blobs.size());
  SlidingShape z;
  z.K = std::max(o.base.max_micro, 1);
  z.gpu_off.assign(size_t(nb), -1);
  z.gpu_goff.assign(size_t(nb), -1);
  z.gpu_low.assign(size_t(nb), false);
  for (int b : o.gpu_blobs) {
    SF_CHECK(b >= 0 && b < nb, "gpu_blobs: no blob " + std::to_string(b));
    z.gpu_off[size_t(b)] = 0;
  }
  int64_t max_blob = 0;
  for (int b = 0; b < nb; ++b) {
    const BlobLayout& bl = layout.blobs[size_t(b)];
    z.is_layer.push_back(bl.kind == BlobKind::Layer);
    if (z.gpu_off[size_t(b)] >= 0) {
      z.gpu_off[size_t(b)] = z.gpu_total;
      z.gpu_total += bl.numel;
      z.host_numel.push_back(0);
      const bool low = act != DType::F32 && bl.kind == BlobKind::Layer;
      z.gpu_low[size_t(b)] = low;
      int64_t& n = low ? z.gpu_grads_low : z.gpu_grads;
      z.gpu_goff[size_t(b)] = n;
      n += bl.numel;
      if (low) z.max_layer = std::max(z.max_layer, bl.numel);
      continue;
    }
    z.host_numel.push_back(bl.numel);
    max_blob = std::max(max_blob, bl.numel);
    if (bl.kind == BlobKind::Layer) z.max_layer = std::max(z.max_layer, bl.numel);
  }
  z.emb = z.host_numel.front();
  z.head = z.host_numel.back();
  z.held = held_grad_blobs(layout, o.gpu_blobs, o.keep_grads ? 0 : o.hold_grads);
  z.disk.assign(size_t(nb), false);
  for (int b : o.disk_blobs) {
    SF_CHECK(b >= 0 && b < nb && z.host_numel[size_t(b)] > 0, "disk_blobs: no host blob " + std::to_string(b));
    z.disk[size_t(b)] = true;
  }
  z.disk_master.assign(size_t(nb), false);
  z.disk_work.assign(size_t(nb), false);
  for (int b : o.disk_masters) {
    SF_CHECK(b >= 0 && b < nb && z.disk[size_t(b)], "disk_masters: blob " + std::to_string(b) + " has no state on disk");
    z.disk_master[size_t(b)] = true;
  }
  for (int b : o.disk_weights) {
    SF_CHECK(b >= 0 && b < nb && z.disk_master[size_t(b)],
             "disk_weights: blob " + std::to_string(b) + " has no master on disk");
    z.disk_work[size_t(b)] = true;
  }
  z.disk_grad.assign(size_t(nb), false);
  for (int b : o.disk_grads) {
    SF_CHECK(b >= 0 && b < nb && z.disk[size_t(b)], "disk_grads: blob " + std::to_string(b) + " has no state on disk");
    z.disk_grad[size_t(b)] = o.keep_grads;
  }
  z.ram_work.assign(size_t(nb), false);
  for (int b : o.upload_copies) {
    SF_CHECK(b >= 0 && b < nb && z.host_numel[size_t(b)] > 0 && !z.disk[size_t(b)],
             "upload_copies: blob " + std::to_string(b) + " is not a host blob with its state in host memory");
    z.ram_work[size_t(b)] = true;
  }
  z.chunk = std::max<int64_t>(1, std::min(o.chunk, std::max(max_blob, z.gpu_total)));
  // The embedding's rows in two parts: a host embedding that is its token table alone, whose
  // gradient is not held (or kept for clipping) and whose state is in memory; and the host idle
  // after the head (the last layer held or on the GPU), where its first part's AdamW runs.
  const BlobLayout& emb = layout.embedding();
  const int last = int(layout.blobs.size()) - 2;
  z.emb_rows = o.split_embedding_rows && !o.keep_grads && z.host_numel[0] > 0 && !z.held[0] && !z.disk[0] &&
               emb.entries.size() == 1 && emb.entries[0].offset == 0 &&
               emb.entries[0].numel == spec.vocab * spec.hidden && last >= 1 &&
               (z.gpu_off[size_t(last)] >= 0 || z.held[size_t(last)]);
  z.max_tokens = int64_t(o.base.max_batch) * o.base.max_seq;
  z.stride_nh = activation_stride(spec, z.max_tokens, act);
  return z;
}

const char* const kFetchedName = "checkpoints fetched for the backward + recompute output";

// [rows of the blob: the vocabulary, then the padding's] 1 for each row of the embedding that a
// token of the pass looks up (ids outside the vocabulary are the lookup's to refuse). Made each
// pass: the queued host updates share it.
std::shared_ptr<const std::vector<uint8_t>> touched_rows(const std::vector<Batch>& mbs, int64_t vocab, int64_t rows) {
  auto f = std::make_shared<std::vector<uint8_t>>(size_t(rows), uint8_t(0));
  for (const Batch& b : mbs)
    for (const int32_t id : b.ids)
      if (id >= 0 && id < vocab) (*f)[size_t(id)] = 1;
  return f;
}

// Every part's options, made once from the engine's: buffers() lists the parts' buffers from them
// and the constructor builds the parts from the same.
struct PartOptions {
  SlotCacheOptions slots;
  HostOptimizerOptions host;
  GradientPathOptions grads;
  CheckpointOptions ckpt;
  TokenUploaderOptions tokens;
};

PartOptions part_options(const ModelSpec& spec, const SlidingShape& z, const SlidingOptions& o, DType act) {
  PartOptions p;
  p.slots = {SlotCache::capacities(o.slots, z.host_numel, z.is_layer), act, z.chunk};

  HostOptimizerOptions& h = p.host;
  h.blob_numel = z.host_numel;
  h.grad_dtype = act;
  h.keep_grads = o.keep_grads;
  h.chunk = z.chunk;
  h.ring = o.grad_ring;
  h.held = z.held;
  h.disk = z.disk;
  h.disk_ring = std::max(1, o.disk_ring);  // (no more buffers than pieces: StateStream::buffers)
  h.disk_piece = StateStream::piece_for(o.disk_piece > 0 ? o.disk_piece : z.chunk);
  h.state_dtype = o.base.state_dtype;
  h.disk_master = z.disk_master;
  h.disk_work = z.disk_work;
  h.work_dtype = act;
  h.disk_grads = z.disk_grad;
  h.ram_work = z.ram_work;
  h.weight_ring = std::max(1, o.weight_ring);  // (pieces of disk_piece; no more than pieces: WeightStream::buffers)

  // The embedding's first part in chunks of at most 8 Mi elements: its staging is extra GPU memory.
  p.grads = {z.max_layer, z.emb, z.head, act, z.chunk, z.emb_rows ? std::min<int64_t>(z.chunk, int64_t(1) << 23) : 0};

  CheckpointOptions& c = p.ckpt;
  c.micro = z.K;
  c.layers = spec.n_layer;
  c.stride = std::max(z.stride_nh, o.ckpt_stride_min);
  c.disk_layers = o.ckpt_disk_layers;
  c.gpu_direct = !o.store.cufile.empty();  // GPUDirect Storage chosen at start-up (io/gds.h)
  const int on_disk = z.K * std::clamp(o.ckpt_disk_layers, 0, spec.n_layer);  // no more buffers than checkpoints there
  c.write_ring = std::clamp(on_disk, 1, c.write_ring);
  c.read_ahead = std::clamp(on_disk, 1, c.read_ahead);

  p.tokens = {z.max_tokens, 2 * z.K};
  return p;
}

// What each blob is to the schedule (engine/step_schedule.h).
ScheduleConfig schedule_config(const ModelSpec& spec, const SlidingShape& z, const SlidingOptions& o, UpdateMode mode,
                               bool backward) {
  ScheduleConfig c;
  c.layers = spec.n_layer;
  c.tied = spec.tie_embeddings;
  for (size_t b = 0; b < z.gpu_off.size(); ++b) {
    BlobRole r;
    r.kept = z.gpu_off[b] >= 0;
    r.held = !r.kept && (o.keep_grads || z.held[b]);  // HostOptimizer::held
    r.disk = z.disk[b];
    c.roles.push_back(r);
  }
  c.split_update = o.split_update;
  c.emb_rows = z.emb_rows;
  c.hold_early = o.keep_grads ? 0.0 : std::clamp(o.hold_early, 0.0, 1.0);
  c.backward = backward;
  c.mode = mode;
  return c;
}

}  // namespace

StepSchedule SlidingEngine::schedule(const ModelSpec& spec, const SlidingOptions& o, UpdateMode mode, bool backward) {
  const ModelLayout layout = make_layout(spec);
  return make_step_schedule(schedule_config(spec, sliding_shape(spec, layout, o, DType::F32), o, mode, backward));
}

std::vector<SlidingEngine::Upload> SlidingEngine::pass_uploads(const ModelSpec& spec, const ModelLayout& layout,
                                                               const SlidingOptions& o) {
  const SlidingShape z = sliding_shape(spec, layout, o, DType::F32);
  const StepSchedule sched = make_step_schedule(
      schedule_config(spec, z, o, o.keep_grads ? UpdateMode::Clipped : UpdateMode::AsLanded, true));
  SlotTable table(SlotCache::capacities(o.slots, z.host_numel, z.is_layer));
  std::vector<Upload> ups;
  for (const ScheduleOp& op : sched.ops) {
    int first = -1;
    for (const SlotRequest& q : slot_requests(op)) {
      if (z.gpu_off[size_t(q.blob)] >= 0) continue;  // kept on the GPU: no slot
      int k = table.find(q.blob);
      if (k < 0) {
        k = table.victim(z.host_numel[size_t(q.blob)], q.keep_first ? first : -1);
        if (k < 0 && !q.use) continue;  // a prefetch skipped: the blob goes up when used
        SF_CHECK(k >= 0, "no parameter slot can hold blob " + std::to_string(q.blob));
        table.assign(k, q.blob);
        ups.push_back({q.blob, op.phase});
      }
      if (first < 0) first = k;
    }
  }
  return ups;
}

MemoryItems SlidingEngine::buffers(const ModelSpec& spec, const SlidingOptions& o, const BackendSizes& be) {
  return buffers(spec, make_layout(spec), o, be);
}

MemoryItems SlidingEngine::buffers(const ModelSpec& spec, const ModelLayout& layout, const SlidingOptions& o,
                                   const BackendSizes& be) {
  const DType act = be.act;
  const SlidingShape z = sliding_shape(spec, layout, o, act);
  const PartOptions po = part_options(spec, z, o, act);
  const size_t K = size_t(z.K);
  // In the order `slideformer plan` prints them (by place, an item's first appearance).
  MemoryItems m = SlotCache::buffers(po.slots);
  append(m, HostOptimizer::buffers(po.host));
  const MemoryItems grads = GradientPath::buffers(po.grads);
  append(m, items_with(grads, "acc."));
  m.push_back({"activations (" + std::to_string(K + 1) + " buffers: one per micro-batch + 1)", (K + 1) * z.stride_nh,
               Place::Device, "acts"});
  for (MemoryItem& c : CheckpointStore::buffers(po.ckpt)) {
    if (c.key == "ckpt.fetch") c.name = kFetchedName;  // one line with the recompute output
    m.push_back(c);
  }
  m.push_back({kFetchedName, z.stride_nh, Place::Device, "scratch"});
  // Selective recompute: the kept layers' activations of every micro-batch, from its forward to its backward.
  append(m, KeptActivations::buffers(spec, o.base, act, z.K));
  append(m, KvShareStore::buffers(spec, o.base, act, z.K));
  append(m, PleStore::buffers(spec, o.base, act, z.K));
  m.push_back({"workspace (one layer's recompute + backward; chunked head)", be.workspace, Place::Device, "workspace"});
  append(m, TokenUploader::buffers(po.tokens));
  append(m, DeviceRope::buffers(spec, o.base.max_seq));
  m.push_back({"scalars", engine_scalar_bytes(layout.blobs.size()), Place::Device, "scalars"});
  append(m, moe_stats_buffers(spec, z.K));
  append(m, items_with(grads, "grad.staging"));
  append(m, items_with(grads, "grad.early_staging"));
  if (z.gpu_total > 0) {
    const bool low = act != DType::F32;
    const std::string kept = std::to_string(o.gpu_blobs.size()) + " blobs kept on the GPU: fp32 master, AdamW m and v" +
                             (o.base.state_dtype == DType::F32 ? "" : " (bf16)") + ", gradients" +
                             (low ? ", compute copy" : "");
    const size_t G = size_t(z.gpu_total);
    if (low) m.push_back({kept, G * dtype_size(act), Place::Device, "gpu.params"});
    for (const char* key : {"gpu.master", "gpu.m", "gpu.v"}) {
      const bool moment = std::string(key) == "gpu.m" || std::string(key) == "gpu.v";
      m.push_back({kept, G * (moment ? dtype_size(o.base.state_dtype) : 4), Place::Device, key});
    }
    if (z.gpu_grads > 0) m.push_back({kept, size_t(z.gpu_grads) * 4, Place::Device, "gpu.grads"});
    if (z.gpu_grads_low > 0)
      m.push_back({kept, size_t(z.gpu_grads_low) * dtype_size(act), Place::Device, "gpu.grads_low"});
  }
  if (be.stream_scratch) m.push_back({"kernel scratch (compute stream)", be.stream_scratch, Place::Device});
  return m;
}

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
  std::unique_ptr<NvmeStore> store;  // the offload file, when a blob's state is on disk
  std::unique_ptr<HostOptimizer> host;
  std::unique_ptr<SlotCache> slots;
  PhaseTimes setup;  // the constructor's phases (SlidingEngine::setup_times)
  bool slots_stale = false;  // an update was queued: the next forward re-uploads every blob
  uint64_t row_splits = 0;   // Stats::embedding_row_splits
  uint64_t early_updates = 0;  // Stats::early_updates

  // Activations: a ring of K+1 [N, H] buffers holds each micro-batch's current hidden state (or
  // gradient); a layer writes micro-batch j's output into the spare one.
  DeviceBuffer acts;                             // [K + 1, N, H] act
  std::vector<std::unique_ptr<Event>> act_read;  // [K + 1] compute: the layer reading it is queued
  std::vector<std::unique_ptr<Event>> act_free;  // [K + 1] d2h: its checkpoint offload is done
  DeviceBuffer scratch;                          // [N, H] act: the recompute's output
  std::unique_ptr<CheckpointStore> ckpts;        // each layer's input per micro-batch ([K, L, N, H] act)
  // Selective recompute (EngineOptions::whole_layers, kept_layers): the first layers' activations
  // (or attention outputs) of each micro-batch stay on the GPU from the forward to the backward.
  KeptActivations kept;
  KvShareStore kv_share;  // Gemma 4 K/V sharing: every micro-batch's, from its forward to its backward
  PleStore ple;           // Gemma 4 per-layer inputs: every micro-batch's, from its forward to its backward

  DeviceBuffer scalars;    // engine_scalar_bytes: loss sum, per-blob squared norms
  DeviceBuffer moe_stats;  // [K][2, E] F32 router statistics per micro-batch (engine/moe_stats.h)
  std::vector<float> host_scalars;
  std::unique_ptr<DeviceRope> rope;
  std::unique_ptr<Workspace> ws;
  // Layer l's buffers for micro-batch j: a kept layer's own (when its backward follows) or the shared
  // workspace, with Gemma 4's shared K/V and per-layer inputs bound (no-ops for other families).
  LayerBuffers layer_buffers(int l, int j, const BatchDims& d, bool backward) const {
    const LayerBuffers w = backward ? kept.layer(*ws, l, j, d) : ws->layer(d);
    return ple.bind(kv_share.bind(w, l, j, d), l, j, d);
  }
  std::unique_ptr<TokenUploader> tokens;
  // Host optimizer work in its own stream, so that gradient and checkpoint copies on d2h never
  // queue behind it. Created last (stream indices of the race tests).
  std::unique_ptr<Stream> opt_stream;
  std::unique_ptr<Stream> io;  // the checkpoints' transfers to and from the offload file (NVMe tier)
  Program program;
  std::unique_ptr<StepTrace> trace;  // SF_TRACE: a timeline of the streams
  // Gradients from the backward to the host optimizer (engine/gradient_path.*): accumulators,
  // rounding, norms, the copies down, the host updates' queuing.
  std::unique_ptr<GradientPath> grads;

  // ---- the schedule (engine/step_schedule.h): the passes this engine runs, made at start-up, and
  // the events between the parts that they name, [EventId][blob].
  std::vector<StepSchedule> schedules;
  std::vector<std::unique_ptr<Event>> events[3];
  EventId upload_gate = EventId::Updated;
  // The deferred operations of the last pass that had any (the split update's moment passes) and
  // their parameters, queued at the next pass's FlushMoments or before a synchronisation: CUDA
  // blocks the queuing thread when a stream holds too many operations, and at the norm 60 passes
  // would (measured: the next forward was queued ~110 ms late, docs/PERFORMANCE.md session 4).
  const std::vector<ScheduleOp>* deferred = nullptr;
  AdamWParams deferred_p;

  const StepSchedule& schedule(UpdateMode mode, bool backward) const {
    for (const StepSchedule& s : schedules)
      if (s.config.mode == mode && s.config.backward == backward) return s;
    internal_error(__FILE__, __LINE__, "the sliding engine was not built for this pass (clipping and kept gradients need keep_grads)");
  }
  Event& event(const EventRef& e) { return *events[int(e.id)][size_t(e.blob)]; }
  Stream& stream(StreamId s) {
    switch (s) {
      case StreamId::Compute:
        return *compute;
      case StreamId::H2D:
        return *h2d;
      case StreamId::D2H:
        return *d2h;
      case StreamId::Opt:
        return *opt_stream;
      case StreamId::Host:
        break;
    }
    internal_error(__FILE__, __LINE__, "the host is not a stream");
  }

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
    Event& gate = event({upload_gate, blob});
    const int k = slots->acquire(blob, host->upload_source(blob, gate), layout.blobs[size_t(blob)].numel, gate, use,
                                 keep);
    if (slots->uploads() != before) mark(*h2d, "h2d", "uploaded", blob);
    return k >= 0 ? ParamsRef{slots->data(k), k} : ParamsRef{};  // (-1: a prefetch that was skipped)
  }
  void release(const ParamsRef& p) {
    if (p.slot >= 0) slots->release(p.slot);
  }
  LayerParams layer_params(const ParamsRef& p, int blob) const {
    return layer_views(layout.blobs[size_t(blob)], p.data, act);
  }
  Tensor entry(const ParamsRef& p, int blob, int i) const {
    return entry_view(layout.blobs[size_t(blob)].entries[size_t(i)], p.data, act);
  }
  void* gpu_params(int blob) const {
    return static_cast<char*>(gpu.params.data()) + size_t(gpu.off[size_t(blob)]) * dtype_size(act);
  }
  void gpu_update(int blob, const AdamWParams& p) {
    const int64_t n = layout.blobs[size_t(blob)].numel;
    auto f32 = [&](const DeviceBuffer& b) { return Tensor(gpu.at(b, blob), DType::F32, {n}); };
    auto state = [&](Engine::State s) { return Tensor(gpu.at(s, blob, 0), gpu.dtype(s, blob), {n}); };
    AdamWParams q = p;  // the rounding stream's coordinates: the whole blob
    q.blob = blob;
    q.first = 0;
    dev.ops().adamw(f32(gpu.master), state(Engine::State::Grads), state(Engine::State::AdamM),
                    state(Engine::State::AdamV), act == DType::F32 ? Tensor() : Tensor(gpu_params(blob), act, {n}), q,
                    *compute);
  }
  // The compute copy of a kept blob from its master (after load / import): elements
  // [first, first + count) of the blob, count < 0 to its end (a resumed part refreshes only itself).
  void gpu_refresh(int blob, int64_t first = 0, int64_t count = -1) {
    if (act == DType::F32) return;
    const int64_t n = count < 0 ? layout.blobs[size_t(blob)].numel - first : count;
    dev.ops().cast(Tensor(static_cast<char*>(gpu_params(blob)) + size_t(first) * dtype_size(act), act, {n}),
                   Tensor(gpu.at(gpu.master, blob) + first, DType::F32, {n}), *compute);
  }

  // Every blob's master (and what follows from it: the compute copy, the working copy or the
  // split halves) from fill(blob layout, blob, w0, w1, dst): elements [w0, w1) into dst, a window
  // (SlidingOptions::fill_window) at a time, so that set-up holds one window beside the engine's
  // memory, not the largest blob (8B's head: 2.1 GB; measured on the H200 machine, peak RSS was
  // the plan's host bytes + 1.85 GB at 3B, + 4.48 GB at 8B, with whole-blob fills).
  template <class Fill>
  void fill_masters(const ModelLayout& lay, int64_t window, Fill fill, ProgressLog& progress) {
    SF_CHECK(window > 0, "fill window must be positive");
    std::vector<float> tmp;
    for (int b = 0; b < nb; ++b) {
      const BlobLayout& bl = lay.blobs[size_t(b)];
      tmp.resize(size_t(std::min(bl.numel, window)));
      for (int64_t w0 = 0; w0 < bl.numel; w0 += window) {
        const int64_t w1 = std::min(bl.numel, w0 + window);
        fill(bl, b, w0, w1, tmp.data());
        if (gpu.has(b)) {
          dev.copy(gpu.at(gpu.master, b) + w0, tmp.data(), size_t(w1 - w0) * 4, CopyKind::HostToDevice, *compute);
          dev.synchronize(*compute);  // tmp is the next window's
        } else {  // host memory or the NVMe tier: the master and its working copy (or its halves)
          host->write_state(0, b, w0, w1 - w0, tmp.data());
        }
        progress.add(double(w1 - w0) * 4);
      }
      if (gpu.has(b)) {
        gpu_refresh(b);
        dev.synchronize(*compute);
      }
    }
    slots->invalidate();
  }

  // ---- gradients (engine/gradient_path.*)
  GradientPath::Grad fresh_grads(GradientPath::Acc which, int blob) {
    const int64_t n = layout.blobs[size_t(blob)].numel;
    if (!gpu.has(blob)) return grads->fresh(which, n, nullptr);
    if (gpu.low[size_t(blob)]) return grads->fresh(which, n, nullptr, gpu.at(Engine::State::Grads, blob, 0));
    return grads->fresh(which, n, static_cast<float*>(gpu.at(Engine::State::Grads, blob, 0)));
  }

  // ---- checkpoints: the k-th fetch of a backward goes to buffer k % 2.
  void fetch(int k, int j, int l, int64_t N) { ckpts->fetch(k, j, l, size_t(N * spec.hidden) * dtype_size(act), *h2d); }

  // ---- one pass: the schedule's operations, executed in order (execute)
  // The pass's micro-batches: their tokens and shapes, the activation ring (cur[j] holds
  // micro-batch j's current activation, `spare` is free), each blob's gradient between its
  // backward and its SendGrad, and the checkpoint fetches queued so far.
  struct Pass {
    std::vector<TokenUploader::Tokens> tok;
    std::vector<BatchDims> dims;
    std::vector<int> cur;
    int spare = 0;
    std::vector<GradientPath::Grad> grad;  // [blobs]
    int k = 0;  // the k-th checkpoint fetch (layer l, micro-batch j in this order) is queued while k-1 is in use
    // [vocab] 1 for the rows the pass's tokens touch (the embedding's gradient in two parts), shared
    // with the host updates queued on opt
    std::shared_ptr<const std::vector<uint8_t>> touched;
    bool backward = false;  // a training pass (the per-layer inputs keep what their backward reads)
    int K() const { return int(dims.size()); }
    int64_t N(int j) const { return dims[size_t(j)].N(); }
  };
  // What a pass is given, and what its ReadNorms finds.
  struct Run {
    const std::vector<Batch>* mbs = nullptr;
    float scale = 0.f;          // the loss's 1 / trained tokens
    AdamWParams p;              // the updates' parameters (grad_scale: the clip factor once known)
    double max_grad_norm = 0;   // clipping
  };
  // The head's parameters (with a tied embedding, the embedding's table as its weight).
  struct HeadParams {
    ParamsRef head, emb;
    Tensor norm_w, w;
  };
  bool execute(const StepSchedule& s, Run& r);
  void begin_op(const ScheduleOp& op) {
    for (const StreamEvent& w : op.waits) dev.wait(stream(w.stream), event(w.ev));
  }
  void end_op(const ScheduleOp& op) {
    for (const StreamEvent& e : op.records) dev.record(event(e.ev), stream(e.stream));
  }
  Pass begin_pass(const std::vector<Batch>& mbs, bool backward);
  void embed_forward(Pass& ps, const ScheduleOp& op);
  void forward_layer(Pass& ps, const ScheduleOp& op, bool backward);
  HeadParams acquire_head(const ScheduleOp& op);
  void release_head(const HeadParams& h) {
    release(h.head);
    release(h.emb);
  }
  void head_loss(Pass& ps, const ScheduleOp& op, float scale);
  void head_backward(Pass& ps, const ScheduleOp& op, float scale);
  void backward_layer(Pass& ps, const ScheduleOp& op);
  void embedding_backward(Pass& ps);
  void update(const ScheduleOp& op, double hold_early, const AdamWParams& p);
  Tensor out_buf(const Pass& ps, int j) {  // the spare buffer, once its checkpoint offload is done
    dev.wait(*compute, *act_free[size_t(ps.spare)]);
    return act_at(acts, ps.spare, ps.N(j));
  }
  static void advance(Pass& ps, int j) { std::swap(ps.spare, ps.cur[size_t(j)]); }  // the output becomes current

  // The deferred operations (their order is the schedule's: after every parameter pass, before the
  // next gradients land, which wait for `moved`).
  void flush_deferred() {
    if (!deferred) return;
    const std::vector<ScheduleOp>& ops = *deferred;
    deferred = nullptr;
    for (const ScheduleOp& op : ops) {
      begin_op(op);
      update(op, 0.0, deferred_p);  // moment passes: whole blobs
      end_op(op);
    }
  }
  // The state stream may still read into checkpoint memory lent to it (StateStream::lend) when a
  // failed synchronisation skipped sync_all's quiesce: nothing in flight before the members go.
  ~Impl() {
    if (host) quietly([&] { host->quiesce(); });
  }
  void sync_all() {
    flush_deferred();
    tokens->synchronize();
    dev.synchronize(*h2d);
    dev.synchronize(*compute);
    dev.synchronize(*d2h);
    dev.synchronize(*opt_stream);
    if (io) dev.synchronize(*io);
    host->quiesce();
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
  SF_CHECK(o.base.state_dtype == DType::F32 || o.base.state_dtype == DType::BF16, "the optimizer state is F32 or BF16");
  const SlidingShape z = sliding_shape(spec, layout, o, act);
  const PartOptions po = part_options(spec, z, o, act);
  const int K = z.K;
  PhaseClock clock(setup);
  gpu.off = z.gpu_off;
  gpu.goff = z.gpu_goff;
  gpu.low = z.gpu_low;
  gpu.total = z.gpu_total;
  gpu.grads_total = z.gpu_grads;
  gpu.sd = o.base.state_dtype;
  gpu.act = act;
  chunk = z.chunk;
  max_tokens = z.max_tokens;
  stride_nh = z.stride_nh;
  // Every buffer comes from the engine's list (SlidingEngine::buffers); a part allocates from its
  // own list, which must be the engine's items of that part.
  ws = std::make_unique<Workspace>(dev, spec, o.base.max_batch, o.base.max_seq, act);
  BufferSource src(dev, SlidingEngine::buffers(spec, o, BackendSizes{act, ws->bytes(), 0}));
  src.allocated({{"", ws->bytes(), Place::Device, "workspace"}});

  const MemoryItems host_items = HostOptimizer::buffers(po.host);
  const MemoryItems ckpt_items = CheckpointStore::buffers(po.ckpt);
  // The offload file: the AdamW state of the blobs there, then the checkpoints of the disk layers.
  const uint64_t state_bytes = total_bytes(host_items, Place::Disk);
  if (state_bytes + total_bytes(ckpt_items, Place::Disk) > 0) {
    StoreOptions so = o.store;
    so.bytes = state_bytes + total_bytes(ckpt_items, Place::Disk);
    SF_CHECK(!so.dir.empty(), "state in the NVMe store, but no offload directory");
    store = std::make_unique<NvmeStore>(so);
  }
  clock.mark("workspace");
  host = std::make_unique<HostOptimizer>(dev, po.host, store.get());
  src.allocated(host_items);
  clock.lap();  // the host state's phases, as it timed them
  setup.append(host->setup_times());
  slots = std::make_unique<SlotCache>(dev, po.slots, *h2d, *compute);
  src.allocated(SlotCache::buffers(po.slots));
  gpu.params = src.buffer_if("gpu.params");
  gpu.master = src.buffer_if("gpu.master");
  gpu.m = src.buffer_if("gpu.m");
  gpu.v = src.buffer_if("gpu.v");
  gpu.grads = src.buffer_if("gpu.grads");
  gpu.grads_low = src.buffer_if("gpu.grads_low");
  if (gpu.total > 0)
    for (DeviceBuffer* b : {&gpu.master, &gpu.m, &gpu.v})
      dev.ops().zero(Tensor(b->data(), b == &gpu.m || b == &gpu.v ? gpu.sd : DType::F32, {gpu.total}), *compute);
  if (z.gpu_grads > 0) dev.ops().zero(Tensor(gpu.grads.data(), DType::F32, {z.gpu_grads}), *compute);
  if (z.gpu_grads_low > 0) dev.ops().zero(Tensor(gpu.grads_low.data(), act, {z.gpu_grads_low}), *compute);

  acts = src.buffer("acts");
  for (int i = 0; i <= K; ++i) {
    act_read.push_back(dev.create_event());
    act_free.push_back(dev.create_event());
  }
  scratch = src.buffer("scratch");
  kept = KeptActivations(src, spec, o.base, act, K);
  kv_share = KvShareStore(src, spec, o.base, act, K);
  ple = PleStore(src, spec, o.base, act, K);
  scalars = src.buffer("scalars");
  moe_stats = src.buffer_if("moe.stats");
  host_scalars.assign(size_t(2 + nb), 0.f);
  zero_scalars();
  rope = std::make_unique<DeviceRope>(dev, spec, o.base.max_seq, *compute);
  src.allocated(DeviceRope::buffers(spec, o.base.max_seq));
  tokens = std::make_unique<TokenUploader>(dev, po.tokens);
  src.allocated(TokenUploader::buffers(po.tokens));
  opt_stream = d.create_stream();
  if (po.ckpt.disk_layers > 0) io = d.create_stream();
  ckpts = std::make_unique<CheckpointStore>(dev, po.ckpt, store.get(), state_bytes, io.get());
  if (opt.lend_checkpoints && host->can_borrow()) {
    // The forward writes layer l's checkpoint after its uploads of blobs 0 .. l + 1, each waiting
    // for that blob's update: the pieces of those blobs may wait in it (StateStream::lend).
    // (ModelLayout: layer l is blob l + 1.)
    HostOptimizer* h = host.get();
    ckpts->lend_to([h](int key, char* mem, size_t bytes, int l) { h->lend(key, mem, bytes, l + 1); },
                   [h](int key) { h->reclaim(key); }, [h](int key) { return h->try_reclaim(key); });
  }
  src.allocated(ckpt_items);
  trace = StepTrace::from_env(dev, *compute);
  grads = std::make_unique<GradientPath>(dev, po.grads, GradientPath::Streams{*compute, *d2h, *opt_stream}, *host,
                                         static_cast<float*>(scalars.data()) + 2, trace.get());
  src.allocated(GradientPath::buffers(po.grads));

  // The passes this engine can run: the loss alone, a step without clipping, and (gradients kept)
  // a step with clipping and the gradients alone.
  schedules.push_back(make_step_schedule(schedule_config(spec, z, o, UpdateMode::None, false)));
  schedules.push_back(make_step_schedule(schedule_config(spec, z, o, UpdateMode::AsLanded, true)));
  if (o.keep_grads) {
    schedules.push_back(make_step_schedule(schedule_config(spec, z, o, UpdateMode::Clipped, true)));
    schedules.push_back(make_step_schedule(schedule_config(spec, z, o, UpdateMode::None, true)));
  }
  for (const StepSchedule& sc : schedules)  // the schedule's roles are the parts' (where gradients land)
    for (int b = 0; b < nb; ++b)
      SF_CHECK(sc.config.roles[size_t(b)].kept == gpu.has(b) &&
                   (gpu.has(b) || sc.config.roles[size_t(b)].held == host->held(b)),
               "schedule: blob " + std::to_string(b) + "'s role is not the engine's");
  for (auto& per_blob : events)
    for (int b = 0; b < nb; ++b) per_blob.push_back(dev.create_event());
  dev.synchronize(*compute);
  clock.mark("device buffers, slots, checkpoint store");
}

// One pass (docs/ARCHITECTURE.md §3): the schedule's operations in order, each with its waits before and its
// records after (engine/step_schedule.h). Returns false when a ReadNorms stopped it (a non-finite
// loss or norm with clipping: no update).
bool SlidingEngine::Impl::execute(const StepSchedule& s, Run& r) {
  upload_gate = s.upload_gate;
  Pass ps;
  for (const ScheduleOp& op : s.ops) {
    begin_op(op);
    switch (op.kind) {
      case OpKind::BeginPass:
        ps = begin_pass(*r.mbs, s.config.backward);
        break;
      case OpKind::EmbedForward:
        embed_forward(ps, op);
        break;
      case OpKind::LayerForward:
        forward_layer(ps, op, s.config.backward);
        break;
      case OpKind::ForwardDone:
        ckpts->forward_done(*d2h);
        break;
      case OpKind::FlushMoments:
        flush_deferred();
        break;
      case OpKind::HeadLoss:
        head_loss(ps, op, r.scale);
        break;
      case OpKind::HeadBackward:
        head_backward(ps, op, r.scale);
        break;
      case OpKind::LayerBackward:
        backward_layer(ps, op);
        break;
      case OpKind::EmbedBackward:
        embedding_backward(ps);
        break;
      case OpKind::SendGrad:
        if (op.rows == RowsPart::Untouched) {
          ++row_splits;
          ps.touched = touched_rows(*r.mbs, spec.vocab, (layout.embedding().numel + spec.hidden - 1) / spec.hidden);
          grads->send_early(op.blob, ps.grad[size_t(op.blob)], r.p, {ps.touched, spec.hidden, 0});
        } else {
          const UpdateRows rows{op.rows == RowsPart::Touched ? ps.touched : nullptr, spec.hidden, 1};
          grads->send(op.blob, ps.grad[size_t(op.blob)], op.chunk_updates, r.p, rows);
        }
        if (op.chunk_updates) slots_stale = true;
        break;
      case OpKind::Update:
        update(op, s.config.hold_early, r.p);
        break;
      case OpKind::ReadNorms: {
        read_scalars();
        if (s.config.backward && trace) trace->now("host", "norm known");
        if (!op.stop_if_not_finite) break;
        const double norm = std::sqrt(grad_sq_norm());
        if (!std::isfinite(host_scalars[0]) || !std::isfinite(norm)) return false;
        r.p.grad_scale = clip_factor(norm, r.max_grad_norm);
        break;
      }
    }
    end_op(op);
  }
  if (!s.deferred.empty()) {
    deferred = &s.deferred;
    deferred_p = r.p;
  }
  return true;
}

// The kept blobs' gradients (with the backward) and the scalars zeroed; the micro-batches' tokens
// go up (their own stream); a parameter update since the last pass makes every slot stale.
SlidingEngine::Impl::Pass SlidingEngine::Impl::begin_pass(const std::vector<Batch>& mbs, bool backward) {
  const int K = int(mbs.size());
  SF_CHECK(K >= 1 && K <= opt.base.max_micro, "more micro-batches than the engine was built for");
  if (backward && gpu.grads_total > 0)
    dev.ops().zero(Tensor(gpu.grads.data(), DType::F32, {gpu.grads_total}), *compute);
  if (backward)  // shared K/V's gradient accumulators, before any layer's backward
    for (int j = 0; j < K; ++j) kv_share.zero_grads(j, dev.ops(), *compute);
  zero_scalars();
  if (slots_stale) {
    slots->invalidate();
    slots_stale = false;
  }
  if (trace) trace->now("host", backward ? "run" : "run forward");
  Pass ps;
  for (const Batch& b : mbs) {
    SF_CHECK(b.B <= opt.base.max_batch && b.T <= opt.base.max_seq, "batch larger than the engine was built for");
    ps.tok.push_back(tokens->upload(b, *compute));
    ps.dims.push_back(BatchDims{b.B, b.T, ps.tok.back().pos});
    bind_moe_stats(ps.dims.back(), spec, moe_stats, int(ps.dims.size()) - 1, K, dev.ops(), *compute);
  }
  ps.cur.assign(size_t(K), 0);
  ps.backward = backward;
  ps.spare = K;
  ps.grad.resize(size_t(nb));
  return ps;
}

// The embedding for every micro-batch; then the next blob's upload starts.
void SlidingEngine::Impl::embed_forward(Pass& ps, const ScheduleOp& op) {
  Stream& c = *compute;
  const ParamsRef p = acquire(op.uses[0], true);
  for (int j = 0; j < ps.K(); ++j) {
    ps.cur[size_t(j)] = j;
    dev.wait(c, *act_free[size_t(j)]);
    program.embed_forward(act_at(acts, j, ps.N(j)), ps.tok[size_t(j)].ids, entry(p, 0, 0), c);
    ple.forward(j, ps.tok[size_t(j)].ids, act_at(acts, j, ps.N(j)), layout.embedding(), p.data, ps.backward, dev, c);
  }
  release(p);
  mark(c, "compute", "forward", 0);
  if (op.prefetch >= 0) acquire(op.prefetch, false);
}

// Layer l for every micro-batch while its parameters sit in the slot (the next blob prefetched);
// with the backward to come, each micro-batch's input goes down as its checkpoint.
void SlidingEngine::Impl::forward_layer(Pass& ps, const ScheduleOp& op, bool backward) {
  Stream& c = *compute;
  const int blob = op.blob, l = blob - 1;
  const ParamsRef p = acquire(op.uses[0], true);
  if (op.prefetch >= 0) acquire(op.prefetch, false, p.slot);
  for (int j = 0; j < ps.K(); ++j) {
    const int in = ps.cur[size_t(j)];
    BatchDims d = ps.dims[size_t(j)];
    d.moe_collect = true;  // the router statistics of this forward (not of the backward's recompute)
    Tensor y = out_buf(ps, j);
    // With the backward to come, a kept layer writes what its backward reads into its own buffers.
    const LayerBuffers w = layer_buffers(l, j, d, backward);
    program.layer_forward(layer_params(p, blob), act_at(acts, in, ps.N(j)), y, w, d, rope->tables, c,
                          backward ? kept.attention(l, j, d) : KeptActs{});
    if (backward) {  // the layer's input is micro-batch j's checkpoint of layer l
      dev.record(*act_read[size_t(in)], c);
      dev.wait(*d2h, *act_read[size_t(in)]);
      ckpts->offload(j, l, act_at(acts, in, ps.N(j)).data, size_t(ps.N(j) * spec.hidden) * dtype_size(act), *d2h);
      dev.record(*act_free[size_t(in)], *d2h);
    }
    advance(ps, j);
  }
  release(p);
  mark(c, "compute", "forward", blob);
}

SlidingEngine::Impl::HeadParams SlidingEngine::Impl::acquire_head(const ScheduleOp& op) {
  const int head_blob = op.blob;
  HeadParams h;
  if (op.uses.size() > 1) {  // tied: the table first (slot_requests)
    h.emb = acquire(op.uses[0], true);
    h.head = acquire(op.uses[1], true, h.emb.slot);
  } else {
    h.head = acquire(op.uses[0], true);
  }
  h.norm_w = entry(h.head, head_blob, 0);
  h.w = spec.tie_embeddings ? entry(h.emb, 0, 0) : entry(h.head, head_blob, 1);
  return h;
}

// Without the backward: the loss of every micro-batch, and the pass is over.
void SlidingEngine::Impl::head_loss(Pass& ps, const ScheduleOp& op, float scale) {
  const HeadParams h = acquire_head(op);
  Tensor loss(scalars.data(), DType::F32, {1});
  for (int j = 0; j < ps.K(); ++j) {
    const BatchDims& d = ps.dims[size_t(j)];
    program.head_forward_backward({.x = act_at(acts, ps.cur[size_t(j)], ps.N(j)),
                                   .norm_w = h.norm_w,
                                   .w_head = h.w,
                                   .targets = ps.tok[size_t(j)].targets,
                                   .loss_sum = loss,
                                   .grad_scale = scale},
                                  ws->head(d), d, *compute);
  }
  release_head(h);
  for (const auto& t : ps.tok) tokens->done(t.slot, *compute);
}

// The loss of every micro-batch and its gradients: dy into the ring, the head's gradient and the
// embedding's first part with a tied head (its accumulator kept for EmbedBackward).
void SlidingEngine::Impl::head_backward(Pass& ps, const ScheduleOp& op, float scale) {
  const int head_blob = op.blob;
  const HeadParams h = acquire_head(op);
  Tensor loss(scalars.data(), DType::F32, {1});
  if (L > 0) fetch(0, 0, L - 1, ps.N(0));
  GradientPath::Grad& g_emb = ps.grad[0];
  GradientPath::Grad& g_head = ps.grad[size_t(head_blob)];
  g_emb = fresh_grads(GradientPath::Acc::Embedding, 0);
  g_head = fresh_grads(GradientPath::Acc::Head, head_blob);
  const BlobLayout& hl = layout.head();
  const Tensor g_norm = entry_view(hl.entries[0], g_head.g.data, DType::F32);
  const Tensor g_table = entry_view(layout.embedding().entries[0], g_emb.g.data, DType::F32);
  const Tensor g_w_head = spec.tie_embeddings ? g_table : entry_view(hl.entries[1], g_head.g.data, DType::F32);
  for (int j = 0; j < ps.K(); ++j) {
    const BatchDims& d = ps.dims[size_t(j)];
    Tensor dy = out_buf(ps, j);
    program.head_forward_backward({act_at(acts, ps.cur[size_t(j)], ps.N(j)), h.norm_w, h.w,
                                   ps.tok[size_t(j)].targets, loss, scale, dy, g_norm, g_w_head},
                                  ws->head(d), d, *compute);
    advance(ps, j);
  }
  release_head(h);
  mark(*compute, "compute", "head");
}

// Layer l's backward for every micro-batch: each recomputed from its fetched checkpoint (fetch k
// + 1 queued while k is in use), its gradient accumulated over the micro-batches.
void SlidingEngine::Impl::backward_layer(Pass& ps, const ScheduleOp& op) {
  Stream& c = *compute;
  const int K = ps.K(), blob = op.blob, l = blob - 1;
  int& k = ps.k;
  const ParamsRef p = acquire(op.uses[0], true);
  if (op.prefetch >= 0) acquire(op.prefetch, false, p.slot);  // layer l-1's parameters
  GradientPath::Grad& g = ps.grad[size_t(blob)];
  g = fresh_grads(GradientPath::Acc::Layer, blob);
  const LayerParams gv = layer_views(layout.layer(l), g.g.data, DType::F32);
  for (int j = 0; j < K; ++j, ++k) {
    if (j + 1 < K)
      fetch(k + 1, j + 1, l, ps.N(j + 1));
    else if (l > 0)
      fetch(k + 1, 0, l - 1, ps.N(0));
    const BatchDims& d = ps.dims[size_t(j)];
    const Tensor x(ckpts->use(k, c), act, {ps.N(j), spec.hidden});
    // Selective recompute: a layer kept whole is not recomputed, one with its attention kept skips attention.
    const LayerBuffers w = layer_buffers(l, j, d, true);
    const KeptActs ka = kept.attention(l, j, d);
    if (!kept.whole(l))
      program.layer_recompute(layer_params(p, blob), x, act_at(scratch, 0, ps.N(j)), w, d, rope->tables, c, ka);
    Tensor dx = act_at(acts, ps.spare, ps.N(j));
    program.layer_backward(layer_params(p, blob), gv, x, act_at(acts, ps.cur[size_t(j)], ps.N(j)), dx, w, d,
                           rope->tables, c, ka);
    ckpts->done(k, c);
    advance(ps, j);
  }
  release(p);
  mark(c, "compute", "backward", blob);
}

// The embedding's gradient of every micro-batch (after the tied head's part).
void SlidingEngine::Impl::embedding_backward(Pass& ps) {
  const Tensor g_table = entry_view(layout.embedding().entries[0], ps.grad[0].g.data, DType::F32);
  if (ps.touched) grads->before_rows_written();  // the untouched rows' copies down have read it
  for (int j = 0; j < ps.K(); ++j) {
    // The per-layer inputs' gradient into d(e) first, as the resident engine does.
    ple.backward(j, ps.tok[size_t(j)].ids, act_at(acts, ps.cur[size_t(j)], ps.N(j)), layout.embedding(),
                 ps.grad[0].g.data, dev, *compute);
    program.embed_backward(g_table, act_at(acts, ps.cur[size_t(j)], ps.N(j)), ps.tok[size_t(j)].ids,
                           Tensor(scratch.data(), DType::F32, {int64_t(scratch.size() / 4)}), *compute);
  }
  for (const auto& t : ps.tok) tokens->done(t.slot, *compute);
  mark(*compute, "compute", "backward", 0);
}

// A blob's AdamW as the operation says: a kept blob's on the compute stream, a host blob's (or one
// pass of it, or one span of its elements) on opt from its gradient store.
void SlidingEngine::Impl::update(const ScheduleOp& op, double hold_early, const AdamWParams& p) {
  SF_CHECK(gpu.has(op.blob) == (op.stream == StreamId::Compute), "schedule: a kept blob updates on compute, a host blob on opt");
  slots_stale = true;
  if (gpu.has(op.blob)) {
    gpu_update(op.blob, p);
    return;
  }
  const int64_t n = layout.blobs[size_t(op.blob)].numel;
  const int64_t e = op.span == Span::Whole ? n : early_elements(n, hold_early);
  const int64_t i0 = op.span == Span::Rest ? e : 0, i1 = op.span == Span::Early ? e : n;
  if (i1 <= i0) return;
  grads->queue_update(op.blob, i0, i1 - i0, p, op.part);
  if (op.span == Span::Early) ++early_updates;
}

SlidingEngine::SlidingEngine(Device& dev, const ModelSpec& spec, const SlidingOptions& opt)
    : dev_(dev), spec_(spec), layout_(make_layout(spec)), opt_(opt) {
  impl_ = std::make_unique<Impl>(dev_, spec_, layout_, opt_);
}

SlidingEngine::~SlidingEngine() {
  if (impl_) quietly([&] { impl_->sync_all(); });
}

void SlidingEngine::load(const CheckpointReader& ckpt) {
  Impl& m = *impl_;
  m.sync_all();  // no update in flight writes the masters
  ProgressLog progress("loading weights", double(layout_.total_numel()) * 4);
  m.fill_masters(
      layout_, opt_.fill_window,
      [&](const BlobLayout& bl, int, int64_t w0, int64_t w1, float* dst) { read_blob_window(ckpt, bl, w0, w1, dst); },
      progress);
}

void SlidingEngine::init_random(uint64_t seed) {
  Impl& m = *impl_;
  m.sync_all();
  ProgressLog progress("random weights", double(layout_.total_numel()) * 4);
  const double range = spec_.initializer_range;
  m.fill_masters(
      layout_, opt_.fill_window,
      [&](const BlobLayout& bl, int b, int64_t w0, int64_t w1, float* dst) {
        random_blob_window(bl, b, seed, range, w0, w1, dst);
      },
      progress);
}

// The step protocol: the schedule of a step with or without clipping (engine/step_schedule.h) —
// without clipping each blob is updated as soon as its gradient lands, overlapped with the rest of
// the backward (SlideFormer's schedule); with clipping after the norm, overlapped with the next
// forward. Nothing waits here but the schedule's ReadNorms.
Engine::StepResult SlidingEngine::step(const std::vector<Batch>& mbs, const StepParams& sp) {
  Impl& m = *impl_;
  StepResult r;
  for (const Batch& b : mbs) r.trained += b.trained;
  const bool clip = sp.max_grad_norm > 0;
  SF_CHECK(!clip || opt_.keep_grads, "clipping needs an engine built with keep_grads");
  if (m.store) m.store->check();  // a failed transfer of the NVMe store stops the run at the next step
  Impl::Run run;
  run.mbs = &mbs;
  run.scale = r.trained > 0 ? float(1.0 / double(r.trained)) : 0.f;
  run.p = sp.adamw;
  run.p.grad_scale = 1.f;
  run.max_grad_norm = sp.max_grad_norm;
  r.updated = m.execute(m.schedule(clip ? UpdateMode::Clipped : UpdateMode::AsLanded, true), run);
  r.loss = r.trained > 0 ? double(m.host_scalars[0]) / double(r.trained) : 0.0;
  r.grad_norm = std::sqrt(m.grad_sq_norm());
  return r;
}

double SlidingEngine::loss_sum(const std::vector<Batch>& batches) {
  Impl& m = *impl_;
  const StepSchedule& s = m.schedule(UpdateMode::None, false);
  double sum = 0;
  for (const Batch& b : batches) {
    const std::vector<Batch> one{b};
    Impl::Run run;
    run.mbs = &one;
    run.scale = 1.f;
    m.execute(s, run);
    sum += m.host_scalars[0];
  }
  return sum;
}

double SlidingEngine::compute_grads(const std::vector<Batch>& batches) {
  Impl& m = *impl_;
  SF_CHECK(opt_.keep_grads, "compute_grads needs an engine built with keep_grads");
  int64_t trained = 0;
  for (const Batch& b : batches) trained += b.trained;
  Impl::Run run;
  run.mbs = &batches;
  run.scale = trained > 0 ? float(1.0 / double(trained)) : 0.f;
  m.execute(m.schedule(UpdateMode::None, true), run);
  m.sync_all();
  return trained > 0 ? double(m.host_scalars[0]) / double(trained) : 0.0;
}

void SlidingEngine::synchronize() { impl_->sync_all(); }

void SlidingEngine::read_state_part(State which, int blob, int entry, int64_t first, int64_t count, float* dst) {
  Impl& m = *impl_;
  m.sync_all();
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  check_state_part(e, first, count);
  const int64_t at = e.offset + first;
  if (m.gpu.has(blob)) {
    state_to_f32(dev_, *m.compute, m.gpu.at(which, blob, at), m.gpu.dtype(which, blob), count, dst);
    return;
  }
  if (which == State::Grads) {
    SF_CHECK(m.host->grads(blob) != nullptr, "the gradients of blob " + std::to_string(blob) + " are in the offload file");
    const char* g = static_cast<const char*>(m.host->grads(blob)) + size_t(at) * dtype_size(m.act);
    cpu::cast(Tensor(dst, DType::F32, {count}), Tensor(const_cast<char*>(g), m.act, {count}));
    return;
  }
  const int s = which == State::Params ? 0 : which == State::AdamM ? 1 : 2;
  m.host->read_state(s, blob, at, count, dst);
}

void SlidingEngine::write_state_part(State which, int blob, int entry, int64_t first, int64_t count,
                                     const float* src) {
  Impl& m = *impl_;
  SF_CHECK(which != State::Grads, "gradients are not written back");
  m.sync_all();
  const BlobEntry& e = layout_.blobs.at(size_t(blob)).entries.at(size_t(entry));
  check_state_part(e, first, count);
  const int64_t at = e.offset + first;
  if (m.gpu.has(blob)) {
    state_from_f32(dev_, *m.compute, m.gpu.at(which, blob, at), m.gpu.dtype(which, blob), count, src);
    if (which == State::Params) m.gpu_refresh(blob, at, count);
    dev_.synchronize(*m.compute);
    return;
  }
  const int s = which == State::Params ? 0 : which == State::AdamM ? 1 : 2;
  m.host->write_state(s, blob, at, count, src);
  if (which == State::Params) m.slots->invalidate();
}

size_t SlidingEngine::device_bytes() const {
  const Impl& m = *impl_;
  return m.slots->device_bytes() + m.grads->device_bytes() + m.acts.size() + m.ckpts->device_bytes() +
         m.scratch.size() + m.kept.device_bytes() + m.scalars.size() + m.rope->buf.size() + m.ws->bytes() +
         m.tokens->device_bytes() + m.gpu.params.size() + m.gpu.master.size() + m.gpu.m.size() + m.gpu.v.size() +
         m.gpu.grads.size() + m.gpu.grads_low.size();
}

size_t SlidingEngine::host_bytes() const {
  const Impl& m = *impl_;
  return m.host->host_bytes() + m.ckpts->host_bytes() + m.tokens->host_bytes();
}

int64_t SlidingEngine::uploads() const { return impl_->slots->uploads(); }

PhaseTimes SlidingEngine::setup_times() const { return impl_->setup; }

Engine::Stats SlidingEngine::stats() const {
  const Impl& m = *impl_;
  Stats st;
  st.host_update_s = m.host->update_seconds();
  st.uploads = m.slots->uploads();
  st.uploaded_bytes = m.slots->uploaded_bytes();
  st.pinned_bytes = m.host->pinned_bytes() + m.ckpts->host_bytes() + m.tokens->host_bytes();
  st.embedding_row_splits = m.row_splits;
  st.early_updates = m.early_updates;
  if (m.store) {
    st.disk_read = m.store->bytes_read();
    st.disk_written = m.store->bytes_written();
    st.disk_busy_s = m.store->busy_seconds();
    st.disk_gpu_direct = m.store->gpu_bytes();
    st.disk_state_lent = m.host->lent_reads();
    st.disk_io = m.store->how() + (m.store->gpu_direct() ? "; checkpoints: " + m.store->gpu_how() : "");
  }
  return st;
}

}  // namespace sf
