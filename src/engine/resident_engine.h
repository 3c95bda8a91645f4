// The resident engine: the whole model (parameters, gradients, AdamW state, activation
// checkpoints) lives in one Device's memory. It is the in-memory reference the sliding engine
// is tested against, and the engine for models that fit (CPU backend, or a GPU without offload).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "data/dataset/dataset.h"
#include "engine/buffers.h"
#include "engine/engine.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/spec.h"

namespace sf {

class CheckpointReader;

class ResidentEngine final : public Engine {
 public:
  ResidentEngine(Device& dev, const ModelSpec& spec, const EngineOptions& opt);
  ~ResidentEngine() override;
  // Every buffer the engine allocates for these options, by place (its own, the workspace, the
  // token uploader's, the RoPE tables, the backend's per-stream scratch): the constructor
  // allocates from this list and the planner sums it (engine/buffers.h). `be.act` stands for the
  // options' compute dtype.
  static MemoryItems buffers(const ModelSpec& spec, const EngineOptions& opt, const BackendSizes& be);

  const ModelSpec& spec() const override { return spec_; }
  const ModelLayout& layout() const override { return layout_; }
  Device& device() { return dev_; }
  // Device memory this engine holds (parameters, gradients, optimizer state, activations, workspace).
  size_t device_bytes() const override;
  size_t host_bytes() const override;
  void read_state_part(State which, int blob, int entry, int64_t first, int64_t count, float* dst) override;
  void write_state_part(State which, int blob, int entry, int64_t first, int64_t count, const float* src) override;

  void load(const CheckpointReader& ckpt) override;
  void init_random(uint64_t seed) override;
  StepResult step(const std::vector<Batch>& micro_batches, const StepParams& p) override;
  double loss_sum(const std::vector<Batch>& batches) override;
  double compute_grads(const std::vector<Batch>& batches) override;
  void synchronize() override;

  // The parts of a step (tests use them one by one).
  void zero_grads();
  // Adds one micro-batch: forward, loss, and (if backward) the gradients scaled by grad_scale.
  void forward_backward(const Batch& b, float grad_scale, bool backward);
  double take_loss_sum();  // sum of the micro-batches' cross-entropy since the last call
  // With a compute dtype below fp32: every gradient rounded to it (nearest-even), in place.
  void round_grads();
  double grad_sq_norm();  // blob by blob (sum_blob_norms)
  void adamw_step(const AdamWParams& p);
  // Full logits [B*T, V] of a batch, to host (evaluation helper; allocates, not for the hot path).
  std::vector<float> logits(const Batch& b);

 private:
  struct Impl;
  void forward_backward(const Batch& b, float grad_scale, bool backward, bool want_logits);
  // The gradients of a step's micro-batches: every embedding backward after every head (the
  // sliding engine's order), so that both engines add into a tied embedding alike.
  void accumulate(const std::vector<Batch>& mbs, float scale);
  Device& dev_;
  ModelSpec spec_;
  ModelLayout layout_;
  EngineOptions opt_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sf
