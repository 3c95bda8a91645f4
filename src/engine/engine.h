// What the trainer needs of an engine: where the model's state lives and how one training step
// runs over it. ResidentEngine keeps everything in one device's memory; SlidingEngine slides the
// layers through a ring of GPU slots with host-resident state.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/align.h"
#include "core/phase_times.h"
#include "data/dataset/dataset.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {

class CheckpointReader;

struct EngineOptions {
  int max_batch = 1;     // sequences per micro-batch
  int max_seq = 1;       // tokens per sequence
  int max_micro = 1;     // micro-batches per optimizer step (the sliding engine runs them layer-major)
  bool training = true;  // allocate gradients (and AdamW state when optimizer is true)
  bool optimizer = true;
  // Storage of activations and of the compute copy of the parameters: "" = the device's natural
  // one (F32 on cpu, BF16 on cuda); "bf16" on the cpu mirrors the GPU's rounding.
  std::string compute_dtype;
  // AdamW m and v: F32 (exact), or BF16 written back with unbiased stochastic rounding (8 instead of
  // 12 bytes of state a parameter with the fp32 master; AdamWParams::round_seed seeds the rounding).
  DType state_dtype = DType::F32;
  // Selective recompute (training, both engines — the sliding engine keeps them for each
  // micro-batch; the planner sets both, engine/kept_activations.h): the first whole_layers decoder
  // layers keep every activation their backward reads
  // (Workspace::layer_kept: no recompute); the next kept_layers keep their attention output and
  // softmax statistics (KeptActs, model/program.h: their recompute skips attention).
  int whole_layers = 0;
  int kept_layers = 0;
};

// Bytes of one [tokens, hidden] activation in `act`, 256-aligned (both engines' activation stride).
inline size_t activation_stride(const ModelSpec& s, int64_t tokens, DType act) {
  return round256(size_t(tokens * s.hidden) * dtype_size(act));
}
// Device scalars of an engine: [0] loss sum, [1] spare, [2, 2 + blobs) per-blob squared norms (F32).
inline size_t engine_scalar_bytes(size_t blobs) { return round256(4 * (2 + blobs)); }
// torch.nn.utils.clip_grad_norm_'s factor (1 when max_norm is 0: no clipping).
inline float clip_factor(double norm, double max_norm) {
  return max_norm > 0 ? float(std::min(1.0, max_norm / (norm + 1e-6))) : 1.f;
}
// Elements of the chunks in which a compute dtype below fp32 rounds gradients to it (both engines:
// the same rounding, so the same bits on the cpu backend).
inline constexpr int64_t kGradRoundChunk = int64_t(1) << 22;
// An engine's destructor drains its streams with this: errors are swallowed (a destructor must not
// throw, and the error has been reported, or is moot, by then).
template <class F>
void quietly(F&& f) noexcept {
  try {
    f();
  } catch (...) {
  }
}
inline double sum_blob_norms(const std::vector<float>& per_blob) {
  double s = 0.0;
  for (float v : per_blob) s += double(v);
  return s;
}

class Engine {
 public:
  virtual ~Engine() = default;

  // What a per-parameter state holds: fp32 masters, gradients, AdamW moments.
  enum class State { Params, Grads, AdamM, AdamV };

  virtual const ModelSpec& spec() const = 0;
  // The blobs and their entries (make_layout(spec())), as the engine holds them.
  virtual const ModelLayout& layout() const = 0;
  // Device memory the engine holds.
  virtual size_t device_bytes() const = 0;
  // Host memory the engine holds (pinned and pageable buffers; the planner predicts both).
  virtual size_t host_bytes() const = 0;

  // Parameters from a checkpoint (any of F32/BF16/F16; converted to fp32 masters).
  virtual void load(const CheckpointReader& ckpt) = 0;
  // HF-style random init: normal(0, initializer_range) weights, 1 for norms, 0 for biases.
  virtual void init_random(uint64_t seed) = 0;

  // One optimizer step (docs/ARCHITECTURE.md §3, "the step protocol"): forward and backward of every
  // micro-batch, the loss normalised by the step's trained tokens (so accumulation equals one
  // large batch), the global gradient norm, clipping to max_grad_norm (> 0), AdamW. The engine
  // owns the ordering: without clipping it may update each blob as soon as its gradient is
  // complete; with clipping the update waits for the norm. The update may still be running when
  // step returns (the next step, a save or synchronize() wait for it). Nothing is updated when
  // the loss or the norm is not finite (with clipping; without, the updates have started).
  struct StepParams {
    AdamWParams adamw;         // lr, betas, eps, weight decay, 1-based step (grad_scale is set here)
    double max_grad_norm = 0;  // 0: no clipping
  };
  struct StepResult {
    double loss = 0;       // mean cross-entropy over the step's trained tokens
    int64_t trained = 0;   // trained tokens of the step
    double grad_norm = 0;  // global L2 norm of the gradients, before clipping
    bool updated = false;
  };
  virtual StepResult step(const std::vector<Batch>& micro_batches, const StepParams& p) = 0;
  // Sum of the cross-entropy over the trained tokens of the batches (forward only).
  virtual double loss_sum(const std::vector<Batch>& batches) = 0;
  // The gradient of the mean loss over all the batches' trained tokens, kept for
  // read_state(State::Grads); no update. Returns that mean loss.
  virtual double compute_grads(const std::vector<Batch>& batches) = 0;
  // Waits until everything queued so far has run.
  virtual void synchronize() = 0;

  // Cumulative counters for benchmarks (what an engine does not track stays 0).
  struct Stats {
    double host_update_s = 0;  // wall time of the host AdamW (sum over calls)
    int64_t uploads = 0;       // parameter blobs copied to the device
    uint64_t uploaded_bytes = 0;  // what those uploads carried up (fp32 masters or compute-dtype working copies)
    size_t pinned_bytes = 0;   // page-locked host memory held
    // The NVMe store (sums since the engine was built): bytes read and written, seconds with a
    // transfer in flight.
    uint64_t disk_read = 0, disk_written = 0;
    double disk_busy_s = 0;
    uint64_t disk_gpu_direct = 0;  // of those bytes, moved between disk and GPU by cuFile
    uint64_t disk_state_lent = 0;  // AdamW state pieces read ahead into lent checkpoint memory
    uint64_t embedding_row_splits = 0;  // passes whose embedding gradient went down in two parts (rows)
    uint64_t early_updates = 0;  // held blobs' updates begun as their gradient landed (SlidingOptions::hold_early)
    std::string disk_io;           // how: "io_uring, O_DIRECT, 2 registered buffers; checkpoints: cuFile (...)"
  };
  virtual Stats stats() const { return {}; }
  // Seconds of the constructor's phases (host state allocated and zeroed, device buffers), for
  // `bench`'s set-up report; empty when the engine does not time them.
  virtual PhaseTimes setup_times() const { return {}; }

  // One tensor of a state (entry `entry` of blob `blob` in layout() order) into dst [numel] fp32:
  // saving a large model this way holds one tensor at a time. Waits for the device. (The whole
  // tensor as one part of the calls below.)
  void read_state(State which, int blob, int entry, float* dst) {
    read_state_part(which, blob, entry, 0, entry_numel(blob, entry), dst);
  }
  // The reverse: src [numel] fp32 into one tensor of a state (Params also refreshes the compute
  // copy). Waits for the device.
  void write_state(State which, int blob, int entry, const float* src) {
    write_state_part(which, blob, entry, 0, entry_numel(blob, entry), src);
  }
  // The same for elements [first, first + count) of the tensor: saving and resuming a large tensor
  // a part at a time (kStatePart), so that one part's fp32 sits beside the engine, not the tensor's
  // (8B's head 2.1 GB, 70B's embedding 4.2 GB).
  virtual void read_state_part(State which, int blob, int entry, int64_t first, int64_t count, float* dst) = 0;
  virtual void write_state_part(State which, int blob, int entry, int64_t first, int64_t count, const float* src) = 0;

 private:
  int64_t entry_numel(int blob, int entry) const {
    return layout().blobs.at(size_t(blob)).entries.at(size_t(entry)).numel;
  }
};

// The part of a tensor that saving and resuming move at a time (elements: 64 MiB of fp32).
constexpr int64_t kStatePart = int64_t(1) << 24;

}  // namespace sf
