// The resident engine: the whole model (parameters, gradients, AdamW state, activation
// checkpoints) lives in one Device's memory. It is the in-memory reference the sliding engine
// is tested against, and the engine for models that fit (CPU backend, or a GPU without offload).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "data/dataset.h"
#include "model/layout.h"
#include "model/program.h"
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

class ResidentEngine {
 public:
  ResidentEngine(Device& dev, const ModelSpec& spec, const EngineOptions& opt);
  ~ResidentEngine();

  const ModelSpec& spec() const { return spec_; }
  const ModelLayout& layout() const { return layout_; }
  Device& device() { return dev_; }
  // Device memory this engine holds (parameters, gradients, optimizer state, activations, workspace).
  size_t device_bytes() const;

  // Parameters from a checkpoint (any of F32/BF16/F16; converted to fp32 masters).
  void load(const CheckpointReader& ckpt);
  // HF-style random init: normal(0, initializer_range) weights, 1 for norms, 0 for biases.
  void init_random(uint64_t seed);

  void zero_grads();
  // Adds one micro-batch: forward, loss, and (if training) backward with gradients scaled by
  // grad_scale (1 / trained tokens of the optimizer step). Asynchronous; read the summed loss
  // with take_loss_sum().
  void forward_backward(const Batch& b, float grad_scale, bool backward);
  // Full logits [B*T, V] of a batch, to host (evaluation helper; allocates, not for the hot path).
  std::vector<float> logits(const Batch& b);
  // Sum of the micro-batches' cross-entropy since the last call (waits for the device).
  double take_loss_sum();
  // Waits until everything queued so far has run.
  void synchronize();
  // Squared L2 norm of all gradients (waits for the device).
  double grad_sq_norm();
  // One AdamW step on every parameter; grads multiplied by grad_scale first (clipping).
  void adamw_step(const AdamWParams& p);

  // fp32 copies in host memory, in HF names and shapes.
  struct HostTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  // What a flat per-parameter buffer holds: fp32 masters, gradients, AdamW moments.
  enum class State { Params, Grads, AdamM, AdamV };
  std::vector<HostTensor> export_state(State which);
  // Sets one state by HF name (every parameter must be given, shapes must match). Params also
  // refresh the compute copy.
  void import_state(State which, const std::vector<HostTensor>& tensors);
  std::vector<HostTensor> export_params() { return export_state(State::Params); }
  std::vector<HostTensor> export_grads() { return export_state(State::Grads); }
  void import_params(const std::vector<HostTensor>& params) { import_state(State::Params, params); }

 private:
  struct Impl;
  void forward_backward(const Batch& b, float grad_scale, bool backward, bool want_logits);
  Device& dev_;
  ModelSpec spec_;
  ModelLayout layout_;
  EngineOptions opt_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sf
