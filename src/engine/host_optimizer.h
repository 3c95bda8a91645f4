// The sliding engine's host state and host AdamW (DESIGN.md §3-4). Per parameter of the blobs kept
// on the host: the fp32 master (page-locked: the upload source), AdamW m and v in the state dtype
// (F32, or BF16 stochastically rounded) — 12 or 8 bytes — and
// the gradients as they come down from the GPU, in the compute dtype (bf16 on cuda):
// - `keep_grads` (clipping, or gradients read back): every gradient of the step is held until the
//   norm is known (+2 bytes a parameter);
// - otherwise a ring of a few chunk-sized page-locked buffers: each chunk is consumed by its AdamW
//   as soon as it lands and the buffer goes back to the ring; except the blobs marked `held` (the
//   first ones in forward order), whose gradients wait in their own place to be updated after the
//   backward, in forward order, while the next forward runs (the host would idle there otherwise).
// One fused pass per chunk (cpu::adamw): reads the gradient, p, m, v; writes p, m, v; or, split,
// a parameter pass (reads g, p, m, v; writes p) and later a moment pass (reads g, m, v; writes m, v).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "core/host_memory.h"
#include "engine/buffers.h"

namespace sf {

class HostOptimizer {
 public:
  // blob_numel[b] (0: the blob is not on the host); `gd` the gradients' dtype; `chunk` elements a
  // gradient chunk; `ring` buffers when not keep_grads; held[b]: the blob's gradient waits in place;
  // `sd` the dtype of m and v (EngineOptions::state_dtype).
  HostOptimizer(Device& dev, const std::vector<int64_t>& blob_numel, DType gd, bool keep_grads, int64_t chunk, int ring,
                const std::vector<bool>& held = {}, DType sd = DType::F32);

  int64_t total() const { return total_; }
  float* master(int blob) { return static_cast<float*>(master_.data()) + off_[size_t(blob)]; }
  void* state(int which, int blob);  // 0 master (F32), 1 m, 2 v (state_dtype())
  DType state_dtype() const { return sd_; }
  bool keep_grads() const { return keep_; }
  DType grad_dtype() const { return gd_; }

  // Where chunk [i0, i0 + n) of blob's gradient lands. With keep_grads (or a held blob): its place
  // in the store; else the next ring buffer, once `stream` has waited for it to be free (its last
  // update done).
  struct Landing {
    void* ptr = nullptr;
    int ring = -1;  // the ring buffer, or -1
  };
  Landing land(int blob, int64_t i0, Stream& stream);
  // The chunk's AdamW on `opt` (after the work queued there so far); a ring buffer is free after.
  // `part`: both passes (All) or one of the two of a split update (cpu::AdamWPart).
  void queue_update(int blob, int64_t i0, int64_t n, const Landing& at, const AdamWParams& p, Stream& opt,
                    cpu::AdamWPart part = cpu::AdamWPart::All);
  // The gradient store of a blob (keep_grads, or held), [numel] in grad_dtype().
  const void* grads(int blob) const;
  bool held(int blob) const { return keep_ || held_off_[size_t(blob)] >= 0; }

  double update_seconds() const { return double(update_ns_.load()) * 1e-9; }
  size_t pinned_bytes() const { return master_.size() + store_.size(); }
  size_t host_bytes() const { return pinned_bytes() + m_.size() + v_.size(); }
  // What the constructor allocates, from the same arguments: "host.master" and "host.grads" (the
  // store or the ring, when there is a gradient on the host) page-locked, "host.m", "host.v" pageable.
  static MemoryItems buffers(const std::vector<int64_t>& blob_numel, DType gd, bool keep_grads, int64_t chunk, int ring,
                             const std::vector<bool>& held = {}, DType sd = DType::F32);

 private:
  Device& dev_;
  DType gd_;
  DType sd_;
  bool keep_;
  int64_t chunk_;
  std::vector<int64_t> off_;  // [blobs] element offset in the flat buffers (-1: not on the host)
  int64_t total_ = 0;
  DeviceBuffer master_;                            // [total] F32 pinned
  HostBuffer m_, v_;                               // [total] sd_
  DeviceBuffer store_;                             // keep_grads: [total] gd; else [ring, chunk] + [held] gd; pinned
  std::vector<int64_t> held_off_;                  // [blobs] element offset of a held blob in store_ (-1: not held)
  std::vector<std::unique_ptr<Event>> ring_free_;  // [ring] opt: the buffer's update is done
  int ring_next_ = 0;
  std::atomic<int64_t> update_ns_{0};
};

}  // namespace sf
