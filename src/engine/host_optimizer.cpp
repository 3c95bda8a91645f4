#include "engine/host_optimizer.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace sf {

namespace {
// Whether blob b's gradient is held in its own place (without keep_grads).
bool holds(const HostOptimizerOptions& o, size_t b) {
  return !o.keep_grads && b < o.held.size() && o.held[b] && o.blob_numel[b] > 0;
}
bool in_store(const HostOptimizerOptions& o, size_t b) { return b < o.disk.size() && o.disk[b] && o.blob_numel[b] > 0; }

StateStream::Config stream_config(const HostOptimizerOptions& o) {
  StateStream::Config c;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) c.numel.push_back(in_store(o, b) ? o.blob_numel[b] : 0);
  c.elem_bytes = 4;
  c.order = HostOptimizer::update_order(o);
  c.ring = o.disk_ring;
  return c;
}
}  // namespace

std::vector<int> HostOptimizer::update_order(const HostOptimizerOptions& o) {
  const int nb = int(o.blob_numel.size());
  std::vector<int> order;
  if (!o.keep_grads)
    for (int b = nb - 1; b >= 0; --b)
      if (in_store(o, size_t(b)) && !holds(o, size_t(b))) order.push_back(b);
  for (int b = 0; b < nb; ++b)
    if (in_store(o, size_t(b)) && (o.keep_grads || holds(o, size_t(b)))) order.push_back(b);
  return order;
}

MemoryItems HostOptimizer::buffers(const HostOptimizerOptions& o) {
  int64_t total = 0, held_total = 0, ram_state = 0;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) {
    total += o.blob_numel[b];
    if (holds(o, b)) held_total += o.blob_numel[b];
    if (!in_store(o, b)) ram_state += o.blob_numel[b];
  }
  const size_t g = o.keep_grads ? size_t(total) * dtype_size(o.grad_dtype)
                                : (size_t(o.ring) * size_t(std::min(o.chunk, std::max<int64_t>(total, 1))) +
                                   size_t(held_total)) *
                                      dtype_size(o.grad_dtype);
  MemoryItems m = {{"fp32 master weights", size_t(total) * 4, Place::Pinned, "host.master"}};
  if (total > 0 && g > 0)
    m.push_back({o.keep_grads ? "gradients of the step (held for the norm)"
                              : "gradient ring (" + std::to_string(o.ring) + " chunks)",
                 g, Place::Pinned, "host.grads"});
  m.push_back({"AdamW m and v", size_t(ram_state) * 4, Place::Host, "host.m"});
  m.push_back({"AdamW m and v", size_t(ram_state) * 4, Place::Host, "host.v"});
  append(m, StateStream::buffers(stream_config(o)));
  return m;
}

HostOptimizer::HostOptimizer(Device& dev, const HostOptimizerOptions& o, NvmeStore* store)
    : dev_(dev), gd_(o.grad_dtype), keep_(o.keep_grads) {
  int64_t ram_state = 0;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) {
    const int64_t n = o.blob_numel[b];
    off_.push_back(n > 0 ? total_ : -1);
    moff_.push_back(n > 0 && !in_store(o, b) ? ram_state : -1);
    numel_.push_back(n);
    total_ += n;
    if (!in_store(o, b)) ram_state += n;
  }
  chunk_ = std::max<int64_t>(1, std::min(o.chunk, std::max<int64_t>(total_, 1)));
  const int64_t ring_elems = o.keep_grads ? 0 : int64_t(o.ring) * chunk_;
  int64_t held_total = 0;
  held_off_.assign(o.blob_numel.size(), -1);
  for (size_t b = 0; b < o.blob_numel.size(); ++b)
    if (holds(o, b)) {
      held_off_[b] = ring_elems + held_total;
      held_total += o.blob_numel[b];
    }
  BufferSource src(dev, buffers(o));
  master_ = src.buffer("host.master");
  m_ = HostBuffer(src.take("host.m").bytes);
  v_ = HostBuffer(src.take("host.v").bytes);
  // The AdamW pass streams through m and v every step: transparent huge pages spare the TLB
  // (measured within the spread, kept: docs/DECISIONS.md, "Transparent huge pages").
  for (const HostBuffer* b : {&m_, &v_})
      if (b->size() >= (size_t(4) << 20)) {  // page-aligned inside the buffer; a hint, failure is harmless
        const uintptr_t lo = (reinterpret_cast<uintptr_t>(b->data()) + 4095) / 4096 * 4096;
        const uintptr_t hi = (reinterpret_cast<uintptr_t>(b->data()) + b->size()) / 4096 * 4096;
        ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
      }
  if (total_ > 0) std::memset(master_.data(), 0, master_.size());  // padding between tensors stays 0
  if (ram_state > 0) {
    std::memset(m_.data(), 0, size_t(ram_state) * 4);
    std::memset(v_.data(), 0, size_t(ram_state) * 4);
  }
  store_ = src.buffer_if("host.grads");
  const StateStream::Config sc = stream_config(o);
  if (!sc.order.empty()) {
    SF_CHECK(store != nullptr, "blobs in the NVMe store, but no store");
    disk_ = std::make_unique<StateStream>(*store, sc, src);
  }
  if (!o.keep_grads)
    for (int r = 0; r < o.ring; ++r) ring_free_.push_back(dev.create_event());
}

void HostOptimizer::quiesce() {
  if (disk_) disk_->quiesce();
}

void HostOptimizer::read_state(int which, int blob, int64_t off, int64_t n, float* dst) {
  SF_CHECK(off_[size_t(blob)] >= 0 && off >= 0 && off + n <= numel_[size_t(blob)], "read_state: bad range");
  if (which != 0 && on_disk(blob)) return disk_->read(which, blob, off, n, dst);
  const float* base = which == 0 ? static_cast<const float*>(master_.data()) + off_[size_t(blob)]
                                 : (which == 1 ? m_ : v_).as<float>() + moff_[size_t(blob)];
  std::memcpy(dst, base + off, size_t(n) * 4);
}

void HostOptimizer::write_state(int which, int blob, int64_t off, int64_t n, const float* src) {
  SF_CHECK(off_[size_t(blob)] >= 0 && off >= 0 && off + n <= numel_[size_t(blob)], "write_state: bad range");
  if (which != 0 && on_disk(blob)) return disk_->write(which, blob, off, n, src);
  float* base = which == 0 ? static_cast<float*>(master_.data()) + off_[size_t(blob)]
                           : (which == 1 ? m_ : v_).as<float>() + moff_[size_t(blob)];
  std::memcpy(base + off, src, size_t(n) * 4);
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
  const bool disk = on_disk(blob);
  if (disk && part == cpu::AdamWPart::Moments) return;  // the fused pass ran with the parameters
  if (disk) part = cpu::AdamWPart::All;
  const int64_t off = off_[size_t(blob)] + i0;
  const int64_t moff = moff_[size_t(blob)] + i0;
  const bool first = i0 == 0, last = i0 + n == numel_[size_t(blob)];
  // p by value: the next step's parameters may differ by the time this runs.
  dev_.host_fn(opt, [this, blob, i0, off, moff, n, g = at.ptr, p, part, disk, first, last] {
    const auto t0 = std::chrono::steady_clock::now();
    float *m, *v;
    if (disk) {
      if (first) disk_view_ = disk_->acquire(blob);
      m = static_cast<float*>(disk_view_.m) + i0;
      v = static_cast<float*>(disk_view_.v) + i0;
    } else {
      m = m_.as<float>() + moff;
      v = v_.as<float>() + moff;
    }
    cpu::adamw(Tensor(static_cast<float*>(master_.data()) + off, DType::F32, {n}), Tensor(g, gd_, {n}),
               Tensor(m, DType::F32, {n}), Tensor(v, DType::F32, {n}), Tensor(), p, part);
    if (disk && last) disk_->release(blob);
    update_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  if (at.ring >= 0) dev_.record(*ring_free_[size_t(at.ring)], opt);
}

}  // namespace sf
