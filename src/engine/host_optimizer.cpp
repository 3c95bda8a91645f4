#include "engine/host_optimizer.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/error.h"
#include "core/split_master.h"
#include "core/thread_pool.h"

namespace sf {

namespace {
// Whether blob b's gradient is held in its own place (without keep_grads).
bool holds(const HostOptimizerOptions& o, size_t b) {
  return !o.keep_grads && b < o.held.size() && o.held[b] && o.blob_numel[b] > 0;
}
bool in_store(const HostOptimizerOptions& o, size_t b) { return b < o.disk.size() && o.disk[b] && o.blob_numel[b] > 0; }
bool master_in_store(const HostOptimizerOptions& o, size_t b) {
  return in_store(o, b) && b < o.disk_master.size() && o.disk_master[b];
}
bool grad_in_store(const HostOptimizerOptions& o, size_t b) {
  return o.keep_grads && in_store(o, b) && b < o.disk_grads.size() && o.disk_grads[b];
}
bool work_in_store(const HostOptimizerOptions& o, size_t b) {
  return master_in_store(o, b) && b < o.disk_work.size() && o.disk_work[b];
}
// An upload copy: the master in host memory with a working copy beside it.
bool copy_in_ram(const HostOptimizerOptions& o, size_t b) {
  if (b >= o.ram_work.size() || !o.ram_work[b] || o.blob_numel[b] <= 0) return false;
  SF_CHECK(!in_store(o, b),
           "blob " + std::to_string(b) + ": an upload copy is for a blob whose state is in host memory");
  return true;
}
// An upload copy in bf16: the master stored split (core/split_master.h), the copy its high half.
bool split_master(const HostOptimizerOptions& o, size_t b) {
  return copy_in_ram(o, b) && upload_copy_splits(o.work_dtype);
}
// Whether blob b has a working copy in host memory (of a master in the store, or an upload copy).
bool work_in_ram(const HostOptimizerOptions& o, size_t b) {
  return (master_in_store(o, b) && !work_in_store(o, b)) || copy_in_ram(o, b);
}
// Elements of the masters in host memory, fp32 (`ram`) or split (`split`, with their tie bitmaps'
// bytes, each blob's from a byte), and of the working copies there (of which upload copies).
struct MasterSplit {
  int64_t ram = 0, split = 0, work = 0, copies = 0;
  uint64_t tie_bytes = 0;
};
MasterSplit master_split(const HostOptimizerOptions& o) {
  MasterSplit m;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) {
    if (split_master(o, b)) {
      m.split += o.blob_numel[b];
      m.tie_bytes += split_tie_bytes(o.blob_numel[b]);
    } else if (!master_in_store(o, b)) {
      m.ram += o.blob_numel[b];
    }
    if (work_in_ram(o, b)) m.work += o.blob_numel[b];
    if (copy_in_ram(o, b)) m.copies += o.blob_numel[b];
  }
  return m;
}

// The working copies in the store, read for the uploads in pieces of the state ring's size.
WeightStream::Config weight_config(const HostOptimizerOptions& o) {
  WeightStream::Config c;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) c.numel.push_back(work_in_store(o, b) ? o.blob_numel[b] : 0);
  c.elem_bytes = dtype_size(o.work_dtype);
  c.piece = o.disk_piece;
  c.ring = o.weight_ring;
  return c;
}

StateStream::Config stream_config(const HostOptimizerOptions& o) {
  StateStream::Config c;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) c.numel.push_back(in_store(o, b) ? o.blob_numel[b] : 0);
  c.elem_bytes = dtype_size(o.state_dtype);
  c.order = HostOptimizer::update_order(o);
  c.ring = o.disk_ring;
  c.piece = o.disk_piece;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) {
    c.master.push_back(master_in_store(o, b));
    c.work.push_back(work_in_store(o, b));
  }
  c.work_bytes = dtype_size(o.work_dtype);
  for (size_t b = 0; b < o.blob_numel.size(); ++b) c.grads.push_back(grad_in_store(o, b));
  c.grad_bytes = dtype_size(o.grad_dtype);
  return c;
}
// Bytes of one chunk of the ring of gradients on their way to the store: block-aligned, so that
// each chunk starts on a block and the store writes it in place (StateStream::write_grad).
size_t gring_stride(const HostOptimizerOptions& o) {
  int64_t total = 0;
  for (int64_t n : o.blob_numel) total += n;
  return size_t(
      NvmeStore::aligned(uint64_t(std::min(o.chunk, std::max<int64_t>(total, 1))) * dtype_size(o.grad_dtype)));
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
  int64_t total = 0, held_total = 0, ram_state = 0, disk_grads = 0;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) {
    total += o.blob_numel[b];
    if (grad_in_store(o, b)) disk_grads += o.blob_numel[b];
    if (holds(o, b)) held_total += o.blob_numel[b];
    if (!in_store(o, b)) ram_state += o.blob_numel[b];
  }
  const size_t g =
      o.keep_grads ? size_t(total - disk_grads) * dtype_size(o.grad_dtype)
                   : (size_t(o.ring) * size_t(std::min(o.chunk, std::max<int64_t>(total, 1))) + size_t(held_total)) *
                         dtype_size(o.grad_dtype);
  const MasterSplit ms = master_split(o);
  MemoryItems m = {{"fp32 master weights", size_t(ms.ram) * 4, Place::Pinned, "host.master"}};
  if (ms.work > 0)  // (one buffer: the name says what it holds)
    m.push_back({ms.copies == 0         ? "working copies of the masters in the offload dir (the upload source)"
                 : ms.split == ms.work  ? "split masters' bf16 halves (the upload source)"
                 : ms.copies == ms.work ? "upload copies of the fp32 masters in the compute dtype (the upload source)"
                                        : "working copies (the upload source): of the masters in the offload dir, "
                                          "and upload copies of those in RAM",
                 size_t(ms.work) * dtype_size(o.work_dtype), Place::Pinned, "host.work"});
  if (ms.split > 0) {  // (never DMA'd: pageable)
    m.push_back({"split masters' low halves", size_t(ms.split) * 2, Place::Host, "host.lo"});
    m.push_back({"split masters' tie bits", size_t(ms.tie_bytes), Place::Host, "host.ties"});
  }
  if (total > 0 && g > 0)
    m.push_back({o.keep_grads     ? "gradients of the step (held for the norm)"
                 : held_total > 0 ? "gradient ring (" + std::to_string(o.ring) + " chunks) + held gradients"
                                  : "gradient ring (" + std::to_string(o.ring) + " chunks)",
                 g, Place::Pinned, "host.grads"});
  const std::string mv = o.state_dtype == DType::F32 ? "AdamW m and v" : "AdamW m and v (bf16)";
  m.push_back({mv, size_t(ram_state) * dtype_size(o.state_dtype), Place::Host, "host.m"});
  m.push_back({mv, size_t(ram_state) * dtype_size(o.state_dtype), Place::Host, "host.v"});
  append(m, StateStream::buffers(stream_config(o)));
  if (disk_grads > 0)  // (+ a block: each chunk starts block-aligned, so the store writes it in place)
    m.push_back({"gradients to the offload dir (2 chunks)", 2 * gring_stride(o) + NvmeStore::kAlign, Place::Pinned,
                 "disk.gring"});
  append(m, WeightStream::buffers(weight_config(o)));
  return m;
}

HostOptimizer::HostOptimizer(Device& dev, const HostOptimizerOptions& o, NvmeStore* store)
    : dev_(dev), gd_(o.grad_dtype), sd_(o.state_dtype), keep_(o.keep_grads), wd_(o.work_dtype) {
  int64_t ram_state = 0, ram_master = 0, ram_work = 0, kept_grads = 0, ram_lo = 0, ram_ties = 0;
  for (size_t b = 0; b < o.blob_numel.size(); ++b) {
    const int64_t n = o.blob_numel[b];
    off_.push_back(n > 0 ? total_ : -1);
    const bool split = n > 0 && split_master(o, b);
    poff_.push_back(n > 0 && !master_in_store(o, b) && !split ? ram_master : -1);
    loff_.push_back(split ? ram_lo : -1);
    toff_.push_back(split ? ram_ties : -1);
    woff_.push_back(n > 0 && work_in_ram(o, b) ? ram_work : -1);
    if (poff_.back() >= 0) ram_master += n;
    if (split) {
      ram_lo += n;
      ram_ties += int64_t(split_tie_bytes(n));
    }
    if (woff_.back() >= 0) ram_work += n;
    moff_.push_back(n > 0 && !in_store(o, b) ? ram_state : -1);
    numel_.push_back(n);
    goff_.push_back(n > 0 && o.keep_grads && !grad_in_store(o, b) ? kept_grads : -1);
    if (goff_.back() >= 0) kept_grads += n;
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
  PhaseClock clock(setup_);
  BufferSource src(dev, buffers(o));
  master_ = src.buffer("host.master");
  work_ = src.buffer_if("host.work");
  m_ = HostBuffer(src.take("host.m").bytes);
  v_ = HostBuffer(src.take("host.v").bytes);
  if (src.has("host.lo")) {
    lo_ = HostBuffer(src.take("host.lo").bytes);
    ties_ = HostBuffer(src.take("host.ties").bytes);
  }
  clock.mark("host masters allocated (page-locked)");
  // The AdamW pass streams through m and v every step: transparent huge pages spare the TLB
  // (measured within the spread, kept: docs/DECISIONS.md, "Transparent huge pages").
  for (const HostBuffer* b : {&m_, &v_, &lo_})
    if (b->size() >= (size_t(4) << 20)) {  // page-aligned inside the buffer; a hint, failure is harmless
      const uintptr_t lo = (reinterpret_cast<uintptr_t>(b->data()) + 4095) / 4096 * 4096;
      const uintptr_t hi = (reinterpret_cast<uintptr_t>(b->data()) + b->size()) / 4096 * 4096;
      ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
    }
  // (the first touch of tens of GB: on every core, core/thread_pool.h)
  if (master_.size() > 0) zero_parallel(master_.data(), master_.size());  // padding between tensors stays 0
  if (work_.size() > 0) zero_parallel(work_.data(), work_.size());
  if (lo_.size() > 0) zero_parallel(lo_.data(), lo_.size());
  if (ties_.size() > 0) zero_parallel(ties_.data(), ties_.size());
  if (ram_state > 0) {
    zero_parallel(m_.data(), size_t(ram_state) * dtype_size(sd_));
    zero_parallel(v_.data(), size_t(ram_state) * dtype_size(sd_));
  }
  clock.mark("host masters and AdamW m, v zeroed (first touch)");
  store_ = src.buffer_if("host.grads");
  const StateStream::Config sc = stream_config(o);
  if (!sc.order.empty()) {
    SF_CHECK(store != nullptr, "blobs in the NVMe store, but no store");
    disk_ = std::make_unique<StateStream>(*store, sc, src);
    const WeightStream::Config wc = weight_config(o);
    if (WeightStream::piece_of(wc) > 0) {
      weights_ = std::make_unique<WeightStream>(dev, *store, *disk_, wc, src);
      wring_bytes_ = weights_->pinned_bytes();
    }
    if (src.has("disk.gring")) {
      gring_ = src.buffer("disk.gring");
      gstride_ = gring_stride(o);
      gio_ = dev.create_stream();
      for (int i = 0; i < 2; ++i) {
        g_copied_.push_back(dev.create_event());
        g_free_.push_back(dev.create_event());
      }
    }
  }
  if (!o.keep_grads)
    for (int r = 0; r < o.ring; ++r) ring_free_.push_back(dev.create_event());
  clock.mark("host gradient buffers, NVMe streams");
}

void HostOptimizer::quiesce() {
  if (gio_) dev_.synchronize(*gio_);
  if (disk_) disk_->quiesce();
}

namespace {
// n elements between fp32 and the state dtype (m and v of a bf16 state: rounded to nearest when
// written, as a resumed run's state; the updates themselves round stochastically).
void to_f32(float* dst, const void* src, DType t, int64_t n) {
  cpu::cast(Tensor(dst, DType::F32, {n}), Tensor(const_cast<void*>(src), t, {n}));
}
}  // namespace

void HostOptimizer::read_state(int which, int blob, int64_t off, int64_t n, float* dst) {
  SF_CHECK(off_[size_t(blob)] >= 0 && off >= 0 && off + n <= numel_[size_t(blob)], "read_state: bad range");
  if (which == 0 && master_on_disk(blob)) {
    disk_->read(StateStream::Master, blob, off, n, dst);
    return;
  }
  if (which == 0 && is_split(blob)) {
    const SplitMaster sm = split(blob).at(off);
    cpu_pool().parallel_pieces(
        n,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) dst[i] = split_join(sm, i);
        },
        int64_t(1) << 16);
    return;
  }
  if (which == 0) {
    std::memcpy(dst, master(blob) + off, size_t(n) * 4);
    return;
  }
  if (on_disk(blob)) {
    std::vector<char> tmp(size_t(n) * dtype_size(sd_));
    disk_->read(which, blob, off, n, tmp.data());
    to_f32(dst, tmp.data(), sd_, n);
    return;
  }
  to_f32(dst,
         static_cast<const char*>((which == 1 ? m_ : v_).data()) + size_t(moff_[size_t(blob)] + off) * dtype_size(sd_),
         sd_, n);
}

void HostOptimizer::write_state(int which, int blob, int64_t off, int64_t n, const float* src) {
  SF_CHECK(off_[size_t(blob)] >= 0 && off >= 0 && off + n <= numel_[size_t(blob)], "write_state: bad range");
  if (which == 0 && master_on_disk(blob)) {  // the master, and the working copy the uploads read
    disk_->write(StateStream::Master, blob, off, n, src);
    std::vector<char> w(size_t(n) * dtype_size(wd_));
    cpu::cast(Tensor(w.data(), wd_, {n}), Tensor(const_cast<float*>(src), DType::F32, {n}));
    if (disk_->has_work(blob))
      disk_->write(StateStream::Work, blob, off, n, w.data());
    else
      std::memcpy(static_cast<char*>(work_.data()) + size_t(woff_[size_t(blob)] + off) * dtype_size(wd_), w.data(),
                  w.size());
    return;
  }
  if (which == 0 && is_split(blob)) {
    const SplitMaster sm = split(blob).at(off);
    cpu_pool().parallel_pieces(
        n,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) split_store(sm, i, src[i]);
        },
        int64_t(1) << 16);
    return;
  }
  if (which == 0) {
    std::memcpy(master(blob) + off, src, size_t(n) * 4);
    if (has_upload_copy(blob))  // the upload copy: the GPU's cast of the master on upload
      cpu::cast(
          Tensor(static_cast<char*>(work_.data()) + size_t(woff_[size_t(blob)] + off) * dtype_size(wd_), wd_, {n}),
          Tensor(master(blob) + off, DType::F32, {n}));
    return;
  }
  std::vector<char> tmp;
  char* dst;
  if (on_disk(blob)) {
    tmp.resize(size_t(n) * dtype_size(sd_));
    dst = tmp.data();
  } else {
    dst = static_cast<char*>((which == 1 ? m_ : v_).data()) + size_t(moff_[size_t(blob)] + off) * dtype_size(sd_);
  }
  cpu::cast(Tensor(dst, sd_, {n}), Tensor(const_cast<float*>(src), DType::F32, {n}));
  if (on_disk(blob)) disk_->write(which, blob, off, n, tmp.data());
}

float* HostOptimizer::master(int blob) {
  SF_CHECK(poff_[size_t(blob)] >= 0, "blob " + std::to_string(blob) + " has no master in host memory");
  return static_cast<float*>(master_.data()) + poff_[size_t(blob)];
}

SplitMaster HostOptimizer::split(int blob) {
  SF_CHECK(is_split(blob), "blob " + std::to_string(blob) + " has no split master");
  return SplitMaster{static_cast<uint16_t*>(work_.data()) + woff_[size_t(blob)],
                     static_cast<uint16_t*>(lo_.data()) + loff_[size_t(blob)],
                     static_cast<uint8_t*>(ties_.data()) + toff_[size_t(blob)], 0};
}

UploadSource HostOptimizer::upload_source(int blob, Event& updated) {
  if (has_upload_copy(blob))
    return UploadSource{
        static_cast<const char*>(work_.data()) + size_t(woff_[size_t(blob)]) * dtype_size(wd_), wd_, 0, {}, {}};
  if (!master_on_disk(blob)) return UploadSource{master(blob), DType::F32, 0, {}, {}};
  if (!disk_->has_work(blob))
    return UploadSource{
        static_cast<const char*>(work_.data()) + size_t(woff_[size_t(blob)]) * dtype_size(wd_), wd_, 0, {}, {}};
  WeightStream* w = weights_.get();
  Event* upd = &updated;
  return UploadSource{
      nullptr, wd_, w->piece(),
      [w, blob, upd](Stream& h2d, int64_t first, int64_t n) { return w->begin(blob, first, n, *upd, h2d); },
      [w](Stream& h2d) { w->end(h2d); }};
}

const void* HostOptimizer::grads(int blob) const {
  SF_CHECK(held(blob), "gradients are not kept (the engine was built for updates during the backward)");
  const int64_t at = keep_ ? goff_[size_t(blob)] : held_off_[size_t(blob)];
  if (at < 0) return nullptr;  // in the NVMe store
  return static_cast<const char*>(store_.data()) + size_t(at) * dtype_size(gd_);
}

// Elements [i0, i0 + n) of a disk blob, piece by piece as the state stream brings them in (a
// chunk may start or end inside a piece: the piece stays acquired until its last element is
// updated). `g`: the landed chunk, unless the gradient waits in the store (the piece has it).
void HostOptimizer::update_disk(int blob, int64_t i0, int64_t n, const void* g, AdamWParams q) {
  const size_t es = dtype_size(sd_), gs = dtype_size(gd_), ws = dtype_size(wd_);
  for (int64_t e = i0; e < i0 + n;) {
    if (!disk_open_) {
      disk_view_ = disk_->acquire(blob);
      disk_open_ = true;
    }
    const StateStream::View& d = disk_view_;
    SF_CHECK(e >= d.first && e < d.first + d.n, "state stream: a piece out of the update's order");
    const int64_t k = e - d.first, c = std::min(i0 + n, d.first + d.n) - e;
    const void* gp =
        d.grad ? static_cast<const char*>(d.grad) + size_t(k) * gs : static_cast<const char*>(g) + size_t(e - i0) * gs;
    float* pm = d.master ? d.master + k : static_cast<float*>(master_.data()) + poff_[size_t(blob)] + e;
    q.first = e;  // the rounding stream's element index within the blob
    cpu::adamw(Tensor(pm, DType::F32, {c}), Tensor(const_cast<void*>(gp), gd_, {c}),
               Tensor(static_cast<char*>(d.m) + size_t(k) * es, sd_, {c}),
               Tensor(static_cast<char*>(d.v) + size_t(k) * es, sd_, {c}), Tensor(), q, cpu::AdamWPart::All);
    if (d.master) {  // the working copy from the new master (the GPU's upload cast)
      char* w = d.work ? static_cast<char*>(d.work) + size_t(k) * ws
                       : static_cast<char*>(work_.data()) + size_t(woff_[size_t(blob)] + e) * ws;
      cpu::cast(Tensor(w, wd_, {c}), Tensor(pm, DType::F32, {c}));
    }
    e += c;
    if (e == d.first + d.n) {
      disk_->release(blob);
      disk_open_ = false;
    }
  }
}

char* HostOptimizer::gring_at(int r) const {
  const uintptr_t base =
      (reinterpret_cast<uintptr_t>(gring_.data()) + NvmeStore::kAlign - 1) / NvmeStore::kAlign * NvmeStore::kAlign;
  return reinterpret_cast<char*>(base) + size_t(r) * gstride_;
}

HostOptimizer::Landing HostOptimizer::land(int blob, int64_t i0, Stream& stream) {
  if (disk_ && disk_->has_grad(blob)) {  // into the ring, then to the store (landed)
    const int r = gnext_;
    gnext_ ^= 1;
    dev_.wait(stream, *g_free_[size_t(r)]);
    return Landing{gring_at(r), -1, r};
  }
  if (held(blob))
    return Landing{const_cast<char*>(static_cast<const char*>(grads(blob))) + size_t(i0) * dtype_size(gd_), -1};
  const int r = ring_next_;
  ring_next_ = (ring_next_ + 1) % int(ring_free_.size());
  dev_.wait(stream, *ring_free_[size_t(r)]);
  return Landing{static_cast<char*>(store_.data()) + size_t(r) * size_t(chunk_) * dtype_size(gd_), r};
}

void HostOptimizer::landed(int blob, int64_t i0, int64_t n, const Landing& at, Stream& d2h) {
  if (at.gring < 0) return;
  const int r = at.gring;
  dev_.record(*g_copied_[size_t(r)], d2h);
  dev_.wait(*gio_, *g_copied_[size_t(r)]);
  StateStream* st = disk_.get();
  const bool last = i0 + n == numel_[size_t(blob)];
  // Written while the other buffer's write finishes (two in flight: the disk always has the next
  // queued); after a blob's last chunk both are waited for, so that no landing, of this step or
  // the next, finds a buffer whose `g_free` was recorded before its last write.
  dev_.host_fn(*gio_, [st, blob, i0, n, p = at.ptr, last, r] {
    st->write_grad_async(blob, i0, n, p, last, r);
    st->wait_grad(r ^ 1);
    if (last) st->wait_grad(r);
  });
  dev_.record(*g_free_[size_t(r ^ 1)], *gio_);
  if (last) dev_.record(*g_free_[size_t(r)], *gio_);
}

void HostOptimizer::queue_update(int blob, int64_t i0, int64_t n, const Landing& at, const AdamWParams& p, Stream& opt,
                                 cpu::AdamWPart part, const UpdateRows& rows) {
  const bool disk = on_disk(blob);
  SF_CHECK(!disk || !rows.flags, "an update of some rows needs the blob's state in host memory");
  if (disk && part == cpu::AdamWPart::Moments) return;  // the fused pass ran with the parameters
  if (disk) part = cpu::AdamWPart::All;
  const int64_t off = poff_[size_t(blob)] + i0;  // (a master in the store: unused)
  const int64_t moff = moff_[size_t(blob)] + i0;
  // An upload copy is written with the parameters (the fused pass or the split's parameter pass).
  const bool split_p = is_split(blob);
  const int64_t woff =
      !disk && !split_p && part != cpu::AdamWPart::Moments && has_upload_copy(blob) ? woff_[size_t(blob)] + i0 : -1;
  const SplitMaster sm = split_p ? split(blob).at(i0) : SplitMaster{};
  const bool first = i0 == 0, last = i0 + n == numel_[size_t(blob)];
  // p by value: the next step's parameters may differ by the time this runs.
  AdamWParams q = p;  // the rounding stream's coordinates: blob, and i0 within it
  q.blob = blob;
  q.first = i0;
  dev_.host_fn(opt, [this, blob, i0, off, moff, woff, n, g = static_cast<const void*>(at.ptr), q, part, disk, first,
                     last, rows, split_p, sm]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t es = dtype_size(sd_);
    if (disk) {
      SF_CHECK(!first || !disk_open_, "state stream: a blob's update began inside another's piece");
      update_disk(blob, i0, n, g, q);
      SF_CHECK(!last || !disk_open_, "state stream: a blob's update ended inside a piece");
    } else {
      char* m = static_cast<char*>(m_.data()) + size_t(moff) * es;
      char* v = static_cast<char*>(v_.data()) + size_t(moff) * es;
      const cpu::RowSelect sel{rows.flags ? rows.flags->data() : nullptr, rows.row_len, rows.want};
      if (split_p) {
        cpu::adamw_split(sm, Tensor(const_cast<void*>(g), gd_, {n}), Tensor(m, sd_, {n}), Tensor(v, sd_, {n}), q, part,
                         rows.flags ? &sel : nullptr);
      } else {
        float* pm = static_cast<float*>(master_.data()) + off;
        const Tensor copy =
            woff >= 0 ? Tensor(static_cast<char*>(work_.data()) + size_t(woff) * dtype_size(wd_), wd_, {n}) : Tensor();
        cpu::adamw(Tensor(pm, DType::F32, {n}), Tensor(const_cast<void*>(g), gd_, {n}), Tensor(m, sd_, {n}),
                   Tensor(v, sd_, {n}), copy, q, part, rows.flags ? &sel : nullptr);
      }
    }
    update_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  if (at.ring >= 0) dev_.record(*ring_free_[size_t(at.ring)], opt);
}

}  // namespace sf
