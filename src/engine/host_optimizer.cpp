#include "engine/host_optimizer.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/kernels.h"
#include "core/env.h"
#include "core/error.h"

namespace sf {

namespace {
// Whether blob b's gradient is held in its own place (without keep_grads).
bool holds(const std::vector<int64_t>& blob_numel, bool keep_grads, const std::vector<bool>& held, size_t b) {
  return !keep_grads && b < held.size() && held[b] && blob_numel[b] > 0;
}
}  // namespace

MemoryItems HostOptimizer::buffers(const std::vector<int64_t>& blob_numel, DType gd, bool keep_grads, int64_t chunk,
                                   int ring, const std::vector<bool>& held, DType sd) {
  int64_t total = 0, held_total = 0;
  for (size_t b = 0; b < blob_numel.size(); ++b) {
    total += blob_numel[b];
    if (holds(blob_numel, keep_grads, held, b)) held_total += blob_numel[b];
  }
  const size_t g =
      keep_grads
          ? size_t(total) * dtype_size(gd)
          : (size_t(ring) * size_t(std::min(chunk, std::max<int64_t>(total, 1))) + size_t(held_total)) * dtype_size(gd);
  MemoryItems m = {{"fp32 master weights", size_t(total) * 4, Place::Pinned, "host.master"}};
  if (total > 0 && g > 0)
    m.push_back({keep_grads ? "gradients of the step (held for the norm)"
                            : "gradient ring (" + std::to_string(ring) + " chunks)",
                 g, Place::Pinned, "host.grads"});
  const std::string mv = sd == DType::F32 ? "AdamW m and v" : "AdamW m and v (bf16)";
  m.push_back({mv, size_t(total) * dtype_size(sd), Place::Host, "host.m"});
  m.push_back({mv, size_t(total) * dtype_size(sd), Place::Host, "host.v"});
  return m;
}

HostOptimizer::HostOptimizer(Device& dev, const std::vector<int64_t>& blob_numel, DType gd, bool keep_grads,
                             int64_t chunk, int ring, const std::vector<bool>& held, DType sd)
    : dev_(dev), gd_(gd), sd_(sd), keep_(keep_grads) {
  for (int64_t n : blob_numel) {
    off_.push_back(n > 0 ? total_ : -1);
    total_ += n;
  }
  chunk_ = std::max<int64_t>(1, std::min(chunk, std::max<int64_t>(total_, 1)));
  const int64_t ring_elems = keep_grads ? 0 : int64_t(ring) * chunk_;
  int64_t held_total = 0;
  held_off_.assign(blob_numel.size(), -1);
  for (size_t b = 0; b < blob_numel.size(); ++b)
    if (holds(blob_numel, keep_grads, held, b)) {
      held_off_[b] = ring_elems + held_total;
      held_total += blob_numel[b];
    }
  BufferSource src(dev, buffers(blob_numel, gd, keep_grads, chunk, ring, held, sd));
  master_ = src.buffer("host.master");
  m_ = HostBuffer(src.take("host.m").bytes);
  v_ = HostBuffer(src.take("host.v").bytes);
  // The AdamW pass streams through m and v every step: transparent huge pages spare the TLB
  // (SF_HUGEPAGES=0 turns this off, to measure it).
  static const bool huge = env_switch("SF_HUGEPAGES", true);
  if (huge)
    for (const HostBuffer* b : {&m_, &v_})
      if (b->size() >= (size_t(4) << 20)) {  // page-aligned inside the buffer; a hint, failure is harmless
        const uintptr_t lo = (reinterpret_cast<uintptr_t>(b->data()) + 4095) / 4096 * 4096;
        const uintptr_t hi = (reinterpret_cast<uintptr_t>(b->data()) + b->size()) / 4096 * 4096;
        ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
      }
  if (total_ > 0) {
    std::memset(master_.data(), 0, master_.size());  // padding between tensors stays 0
    std::memset(m_.data(), 0, size_t(total_) * dtype_size(sd_));
    std::memset(v_.data(), 0, size_t(total_) * dtype_size(sd_));
  }
  store_ = src.buffer_if("host.grads");
  if (!keep_grads)
    for (int r = 0; r < ring; ++r) ring_free_.push_back(dev.create_event());
}

void* HostOptimizer::state(int which, int blob) {
  if (which == 0) return master(blob);
  return static_cast<char*>(which == 1 ? m_.data() : v_.data()) + size_t(off_[size_t(blob)]) * dtype_size(sd_);
}

const void* HostOptimizer::grads(int blob) const {
  SF_CHECK(held(blob), "gradients are not kept (the engine was built for updates during the backward)");
  const int64_t at = keep_ ? off_[size_t(blob)] : held_off_[size_t(blob)];
  return static_cast<const char*>(store_.data()) + size_t(at) * dtype_size(gd_);
}

HostOptimizer::Landing HostOptimizer::land(int blob, int64_t i0, Stream& stream) {
  if (held(blob))
    return Landing{const_cast<char*>(static_cast<const char*>(grads(blob))) + size_t(i0) * dtype_size(gd_), -1};
  const int r = ring_next_;
  ring_next_ = (ring_next_ + 1) % int(ring_free_.size());
  dev_.wait(stream, *ring_free_[size_t(r)]);
  return Landing{static_cast<char*>(store_.data()) + size_t(r) * size_t(chunk_) * dtype_size(gd_), r};
}

void HostOptimizer::queue_update(int blob, int64_t i0, int64_t n, const Landing& at, const AdamWParams& p, Stream& opt,
                                 cpu::AdamWPart part) {
  const int64_t off = off_[size_t(blob)] + i0;
  // p by value: the next step's parameters may differ by the time this runs.
  AdamWParams q = p;  // the rounding stream's coordinates: blob, and i0 within it
  q.blob = blob;
  q.first = i0;
  dev_.host_fn(opt, [this, off, n, g = at.ptr, q, part] {
    const auto t0 = std::chrono::steady_clock::now();
    auto moment = [&](const HostBuffer& b) {
      return Tensor(static_cast<char*>(b.data()) + size_t(off) * dtype_size(sd_), sd_, {n});
    };
    cpu::adamw(Tensor(static_cast<float*>(master_.data()) + off, DType::F32, {n}), Tensor(g, gd_, {n}), moment(m_),
               moment(v_), Tensor(), q, part);
    update_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  if (at.ring >= 0) dev_.record(*ring_free_[size_t(at.ring)], opt);
}

}  // namespace sf
