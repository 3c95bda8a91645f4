// The sliding engine (docs/ARCHITECTURE.md §2-3): the GPU holds a ring of parameter slots through which the
// blobs slide, layer by layer; fp32 master weights and AdamW state live in host memory (12 bytes
// a parameter, + 2 for the held gradients with clipping); activation checkpoints (each layer's
// input, per micro-batch) are offloaded to pinned host memory after the layer's forward and
// fetched back before its backward. The micro-batches of a step run layer-major: a layer runs its
// forward (and later its backward) for every micro-batch while its parameters sit in the slot, and
// its gradient accumulates on the GPU, so weights cross PCIe and the host AdamW runs once a step
// whatever the number of micro-batches. Work runs on five streams (compute, uploads, downloads,
// token uploads, the host optimizer's host functions) ordered by events only. Without clipping
// each gradient chunk is updated as it lands; with clipping every blob's update waits for the
// norm and is split in a parameter pass (forward order, what the next forward waits for) and a
// moment pass (queued after the next forward) — docs/ENGINE.md.
//
// The parts: engine/slot_cache.* (slots and uploads), engine/host_optimizer.* (host state, the
// gradient store, host AdamW), engine/gradient_path.* (gradients from the backward to the host
// AdamW), engine/checkpoint_store.* (layer inputs down and back), engine/token_uploader.*; every
// buffer of them all is listed by SlidingEngine::buffers (engine/buffers.h). The schedule of one
// pass is data (engine/step_schedule.h, SlidingEngine::schedule), which SlidingEngine::Impl::execute
// runs operation by operation; the step protocol is SlidingEngine::step.
// SF_TRACE=FILE writes a timeline (engine/step_trace.h).
// On the cpu backend it is bit for bit the resident engine (tests/test_sliding_engine.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/blob_init.h"
#include "engine/buffers.h"
#include "engine/engine.h"
#include "engine/step_schedule.h"
#include "io/nvme_store.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {

struct SlidingOptions {
  // Batch limits, micro-batches a step, compute dtype; selective recompute (whole_layers,
  // kept_layers: the first layers' activations stay on the GPU for each micro-batch, engine/kept_activations.h).
  EngineOptions base;
  int slots = 3;       // GPU parameter slots (>= 2: a layer and the next; the tied head needs 2)
  // Blobs kept whole on the GPU: compute copy, fp32 master, AdamW state and gradients live there,
  // updated by the GPU's AdamW; they take no slot, no transfer and no host memory.
  std::vector<int> gpu_blobs;
  // Hold a whole step's gradients in host memory (needed for clipping and compute_grads); else
  // each gradient chunk is consumed by its AdamW as it lands (no clipping).
  bool keep_grads = true;
  // Without keep_grads: the gradients of the last host blobs in forward order (the head, the last
  // layer, the one below, ... until this many parameters; never the embedding) are held and
  // updated after the backward, in forward order, overlapped with the next forward, which needs
  // them last; the others are updated as they land, during the backward. The host would idle
  // through the forward otherwise, and a backward bound by the host AdamW ends sooner by what the
  // held blobs' updates cost beyond their layers' backward (Planner::add_hold sizes it).
  int64_t hold_grads = 0;
  // Of each held blob whose state is in host memory, this share of its update runs as soon as its
  // gradient has landed, during the backward (the host would wait there for the first gradient
  // not held), the rest after the backward as above (docs/ENGINE.md "Held updates begun early";
  // Planner::add_hold picks it with the count).
  double hold_early = 0;
  // With keep_grads and clipping: each host blob's update in two passes of the same arithmetic
  // (cpu::AdamWPart): the parameters as soon as the clip factor is known, in forward order, and
  // the moments after every parameter pass, overlapping the next step until its backward needs the
  // blob's gradient store again. The next forward then waits for 18 bytes of host traffic a
  // parameter instead of 26 (false: one fused pass, kept for tests; docs/DECISIONS.md "The split update").
  bool split_update = true;
  // Without keep_grads: the embedding's rows that the step's tokens do not touch are updated
  // during the backward, right after the head's (their gradient is complete there), the touched
  // rows at its end — when the last layer's gradient is held or kept on the GPU (the host idles
  // after the head then). The same bits; the step's end waits for a few rows' AdamW instead of the
  // whole table's (docs/ENGINE.md "The embedding's rows").
  bool split_embedding_rows = true;
  int64_t chunk = int64_t(1) << 25;  // elements per upload / gradient transfer chunk
  int grad_ring = 4;                 // host buffers of a chunk each, without keep_grads
  // The NVMe tier (docs/ENGINE.md): host blobs whose AdamW m and v live in the offload file,
  // read a piece at a time into `disk_ring` host buffers ahead of their update and written back
  // after it (engine/state_stream.h). `store.dir` is the offload directory; the engine sizes the file.
  std::vector<int> disk_blobs;
  int disk_ring = 4;
  // Elements a piece of that ring: 0, the transfer chunk (an update without clipping consumes a
  // piece a chunk); rounded up to StateStream::kPieceAlign.
  int64_t disk_piece = 0;
  // The layer-input checkpoints of the first this many layers live in the offload file too
  // (engine/checkpoint_store.h), moved by an I/O stream of their own.
  int ckpt_disk_layers = 0;
  // Levels 3 and 4 of the tier (docs/ENGINE.md "NVMe tier"; subsets of disk_blobs): blobs whose
  // fp32 master lives in the offload file too, the uploads reading a working copy in the compute
  // dtype that the update writes (in page-locked memory); of those, blobs whose working copy
  // lives in the file as well, read for each upload a piece at a time (`disk_piece`, as the state
  // ring) through `weight_ring` pinned buffers (2: the disk reads one piece while PCIe, faster,
  // copies the other; the state ring needs more, its buffers also wait for write-backs).
  std::vector<int> disk_masters;
  std::vector<int> disk_weights;
  int weight_ring = 2;
  // Elements of a blob that set-up (init_random, load) fills at a time (engine/blob_init.h's
  // kBlobFillWindow; tests: small and odd, the windows then cut entries and pieces).
  int64_t fill_window = kBlobFillWindow;
  // With keep_grads: of disk_blobs, those whose gradient of the step waits for the update in the
  // offload file instead of page-locked memory (clipping holds it until the norm is known).
  std::vector<int> disk_grads;
  // Upload copies (docs/ENGINE.md "Uploads"): host blobs (their state not in the offload file)
  // whose fp32 master stays in host memory with a page-locked working copy in the compute dtype
  // beside it, which the update writes in the same pass and the uploads read (on cuda 2 bytes a
  // parameter over PCIe instead of 4, for 2 bytes of RAM; on the cpu backend, fp32, a second master).
  std::vector<int> upload_copies;
  // The state ring reads ahead into the host checkpoints the backward has consumed, until the next
  // forward writes them (docs/ENGINE.md "Read-ahead into freed checkpoints"; with AdamW state in
  // the store and checkpoints in host memory).
  bool lend_checkpoints = true;
  // Tests: each checkpoint buffer at least this many bytes (a tiny model's layer input is smaller
  // than a piece of the state ring, which could then never be read into one).
  size_t ckpt_stride_min = 0;
  StoreOptions store;
};

// Which host blobs SlidingOptions::hold_grads holds (the planner's figure and the engine's choice).
std::vector<bool> held_grad_blobs(const ModelLayout& layout, const std::vector<int>& gpu_blobs, int64_t hold);

class SlidingEngine final : public Engine {
 public:
  SlidingEngine(Device& dev, const ModelSpec& spec, const SlidingOptions& opt);
  ~SlidingEngine() override;
  // Every buffer the engine allocates for these options, by place: its own, and its parts'
  // (slot cache, host optimizer, gradient path, checkpoint store, token uploader, RoPE tables,
  // workspace), plus the backend's per-stream scratch. The constructor allocates from this list
  // and the planner sums it (engine/buffers.h). `be.act` stands for the options' compute dtype.
  static MemoryItems buffers(const ModelSpec& spec, const SlidingOptions& opt, const BackendSizes& be);
  // The same from the model's layout (the planner lays a model out once for every placement it tries).
  static MemoryItems buffers(const ModelSpec& spec, const ModelLayout& layout, const SlidingOptions& opt,
                             const BackendSizes& be);
  // The schedule of one pass that the engine built for these options executes (engine/step_schedule.h):
  // a step without clipping (AsLanded) or with it (Clipped, needs keep_grads), the gradients alone
  // (None with the backward, needs keep_grads), the loss alone (None without).
  static StepSchedule schedule(const ModelSpec& spec, const SlidingOptions& opt, UpdateMode mode, bool backward);
  // The uploads of one training pass in the steady state, in order: every update makes the slots
  // stale, so a pass starts with none holding anything; the slots keep the forward's last blobs
  // for the backward (each slot beyond two saves about one upload there). The slot policy
  // (SlotTable) replayed over the schedule's requests (slot_requests): what the planner counts.
  struct Upload {
    int blob = -1;
    Phase phase = Phase::Forward;  // of the operation that uploads it
  };
  static std::vector<Upload> pass_uploads(const ModelSpec& spec, const ModelLayout& layout, const SlidingOptions& opt);

  const ModelSpec& spec() const override { return spec_; }
  void load(const CheckpointReader& ckpt) override;
  void init_random(uint64_t seed) override;
  StepResult step(const std::vector<Batch>& micro_batches, const StepParams& p) override;
  double loss_sum(const std::vector<Batch>& batches) override;
  double compute_grads(const std::vector<Batch>& batches) override;
  void synchronize() override;
  size_t device_bytes() const override;
  size_t host_bytes() const override;
  const ModelLayout& layout() const override { return layout_; }
  void read_state_part(State which, int blob, int entry, int64_t first, int64_t count, float* dst) override;
  void write_state_part(State which, int blob, int entry, int64_t first, int64_t count, const float* src) override;
  // Uploads of parameter blobs since construction (for tests of the slot policy).
  int64_t uploads() const;
  Stats stats() const override;
  PhaseTimes setup_times() const override;

 private:
  struct Impl;
  Device& dev_;
  ModelSpec spec_;
  ModelLayout layout_;
  SlidingOptions opt_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sf
