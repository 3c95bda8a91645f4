// The sliding engine (DESIGN.md §3-4): the GPU holds a ring of parameter slots through which the
// blobs slide, layer by layer; fp32 master weights, AdamW state and gradients live in host
// memory; activation checkpoints (each layer's input) are offloaded to pinned host memory after
// the layer's forward and prefetched back before its backward. Uploads, offloads and compute run
// on three streams ordered by events only.
//
// This first version keeps the optimizer step after the backward (the "clipping" schedule of
// DESIGN.md §4: exact, no overlap of AdamW with the next forward yet) and the CPU AdamW on the
// host's thread pool. On the cpu backend it is bit for bit the resident engine (tested).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "data/dataset.h"
#include "engine/engine.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {

struct SlidingOptions {
  EngineOptions base;  // batch limits, compute dtype (training and optimizer are always on)
  int slots = 3;       // GPU parameter slots (>= 3: the one in use, the next, the tied embedding)
  // Blobs kept whole on the GPU: compute copy, fp32 master, AdamW state and gradients live there,
  // updated by the GPU's AdamW; they take no slot, no transfer and no host memory.
  std::vector<int> gpu_blobs;
};

class SlidingEngine final : public Engine {
 public:
  SlidingEngine(Device& dev, const ModelSpec& spec, const SlidingOptions& opt);
  ~SlidingEngine() override;

  const ModelSpec& spec() const override { return spec_; }
  void load(const CheckpointReader& ckpt) override;
  void init_random(uint64_t seed) override;
  void zero_grads() override;
  void forward_backward(const Batch& b, float grad_scale, bool backward) override;
  double take_loss_sum() override;
  double grad_sq_norm() override;
  void adamw_step(const AdamWParams& p) override;
  void schedule_update(const AdamWParams& p) override;
  void synchronize() override;
  std::vector<HostTensor> export_state(State which) override;
  void import_state(State which, const std::vector<HostTensor>& tensors) override;
  size_t device_bytes() const override;
  size_t host_bytes() const override;
  void read_state(State which, int blob, int entry, float* dst) override;
  void write_state(State which, int blob, int entry, const float* src) override;
  // Uploads of parameter blobs since construction (for tests of the slot policy).
  int64_t uploads() const;
  Stats stats() const override;

 private:
  struct Impl;
  Device& dev_;
  ModelSpec spec_;
  ModelLayout layout_;
  SlidingOptions opt_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sf
