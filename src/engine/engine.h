// What the trainer needs of an engine: where the model's state lives and how one training step
// runs over it. ResidentEngine keeps everything in one device's memory; SlidingEngine slides the
// layers through a ring of GPU slots with host-resident state.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "data/dataset.h"
#include "model/spec.h"

namespace sf {

class CheckpointReader;

struct EngineOptions {
  int max_batch = 1;     // sequences per micro-batch
  int max_seq = 1;       // tokens per sequence
  bool training = true;  // allocate gradients (and AdamW state when optimizer is true)
  bool optimizer = true;
  // Storage of activations and of the compute copy of the parameters: "" = the device's natural
  // one (F32 on cpu, BF16 on cuda); "bf16" on the cpu mirrors the GPU's rounding.
  std::string compute_dtype;
};

// Device scalars of an engine: [0] loss sum, [1] spare, [2, 2 + blobs) per-blob squared norms (F32).
inline size_t engine_scalar_bytes(size_t blobs) { return (4 * (2 + blobs) + 255) / 256 * 256; }
inline double sum_blob_norms(const std::vector<float>& per_blob) {
  double s = 0.0;
  for (float v : per_blob) s += double(v);
  return s;
}

class Engine {
 public:
  virtual ~Engine() = default;

  // fp32 copies in host memory, in HF names and shapes.
  struct HostTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  // What a per-parameter state holds: fp32 masters, gradients, AdamW moments.
  enum class State { Params, Grads, AdamM, AdamV };

  virtual const ModelSpec& spec() const = 0;
  // Device memory the engine holds.
  virtual size_t device_bytes() const = 0;
  // Host memory the engine holds (pinned and pageable buffers; the planner predicts both).
  virtual size_t host_bytes() const = 0;

  // Parameters from a checkpoint (any of F32/BF16/F16; converted to fp32 masters).
  virtual void load(const CheckpointReader& ckpt) = 0;
  // HF-style random init: normal(0, initializer_range) weights, 1 for norms, 0 for biases.
  virtual void init_random(uint64_t seed) = 0;

  virtual void zero_grads() = 0;
  // Adds one micro-batch: forward, loss, and (if backward) the gradients scaled by grad_scale
  // (1 / trained tokens of the optimizer step). Asynchronous; read the loss with take_loss_sum().
  virtual void forward_backward(const Batch& b, float grad_scale, bool backward) = 0;
  // Sum of the micro-batches' cross-entropy since the last call (waits for the device).
  virtual double take_loss_sum() = 0;
  // Squared L2 norm of all gradients (waits for them), defined blob by blob so that engines that
  // keep blobs in different places agree to the bit: each blob's sq_norm (the backend's, into a
  // zeroed fp32 scalar), summed in fp64 in blob order (sum_blob_norms).
  virtual double grad_sq_norm() = 0;
  // One AdamW step on every parameter; grads multiplied by p.grad_scale first (clipping).
  virtual void adamw_step(const AdamWParams& p) = 0;
  // Optional, before the last micro-batch of a step: the update that adamw_step(p) will make. An
  // engine may then update each blob as soon as its gradient is complete, overlapped with the
  // rest of the backward (SlideFormer's schedule); adamw_step(p) then only completes it. Only when
  // p is known before the gradients are (no clipping).
  virtual void schedule_update(const AdamWParams& p) {}
  // Waits until everything queued so far has run.
  virtual void synchronize() = 0;

  // Cumulative counters for benchmarks (what an engine does not track stays 0).
  struct Stats {
    double host_grad_s = 0;    // wall time of the host gradient additions (sum over calls)
    double host_update_s = 0;  // wall time of the host AdamW
    int64_t uploads = 0;       // parameter blobs copied to the device
  };
  virtual Stats stats() const { return {}; }

  virtual std::vector<HostTensor> export_state(State which) = 0;
  // One tensor of a state (entry `entry` of blob `blob` in make_layout(spec()) order) into dst
  // [numel] fp32: saving a large model this way holds one tensor at a time. Waits for the device.
  virtual void read_state(State which, int blob, int entry, float* dst) = 0;
  // The reverse: src [numel] fp32 into one tensor of a state (Params also refreshes the compute
  // copy). Waits for the device.
  virtual void write_state(State which, int blob, int entry, const float* src) = 0;
  // Sets one state by HF name (every parameter must be given, shapes must match).
  virtual void import_state(State which, const std::vector<HostTensor>& tensors) = 0;
  std::vector<HostTensor> export_params() { return export_state(State::Params); }
  std::vector<HostTensor> export_grads() { return export_state(State::Grads); }
  void import_params(const std::vector<HostTensor>& params) { import_state(State::Params, params); }
};

}  // namespace sf
