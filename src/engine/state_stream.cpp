#include "engine/state_stream.h"

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace sf {

namespace {
bool flag(const std::vector<bool>& f, size_t b) { return b < f.size() && f[b]; }
// Bytes of part `which` (StateStream::Part) of blob b's region, 0 when it is not in the store.
uint64_t part_of(const StateStream::Config& c, size_t b, int which) {
  if (c.numel[b] == 0) return 0;
  const uint64_t n = uint64_t(c.numel[b]);
  switch (which) {
    case StateStream::M:
    case StateStream::V:
      return NvmeStore::aligned(n * c.elem_bytes);
    case StateStream::Master:
      return flag(c.master, b) ? NvmeStore::aligned(n * 4) : 0;
    case StateStream::Grad:
      return flag(c.grads, b) ? NvmeStore::aligned(n * c.grad_bytes) : 0;
    default:
      return flag(c.master, b) && flag(c.work, b) ? NvmeStore::aligned(n * c.work_bytes) : 0;
  }
}
uint64_t region_bytes(const StateStream::Config& c, size_t b) {
  uint64_t n = 0;
  for (int w : {StateStream::Grad, StateStream::M, StateStream::V, StateStream::Master, StateStream::Work})
    n += part_of(c, b, w);
  return n;
}
uint64_t sum_of(const StateStream::Config& c, std::initializer_list<int> parts) {
  uint64_t n = 0;
  for (size_t b = 0; b < c.numel.size(); ++b)
    for (int w : parts) n += part_of(c, b, w);
  return n;
}
}  // namespace

uint64_t StateStream::store_bytes(const Config& c) {
  uint64_t n = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) n += region_bytes(c, b);
  return n;
}

MemoryItems StateStream::buffers(const Config& c) {
  uint64_t slot = 0;
  int masters = 0, works = 0, grads = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) {
    slot = std::max(slot, region_bytes(c, b));
    masters += part_of(c, b, Master) > 0;
    works += part_of(c, b, Work) > 0;
    grads += part_of(c, b, Grad) > 0;
  }
  if (slot == 0) return {};
  const std::string what = masters > 0 ? "AdamW state and masters" : "AdamW state";
  const std::string ring = what + " read from the offload dir (" + std::to_string(c.ring) + " blobs)";
  MemoryItems m = {{ring, size_t(slot) * size_t(c.ring) + NvmeStore::kAlign, Place::Host, "disk.ring"},
                   {"AdamW m and v of " + std::to_string(c.order.size()) + " blobs", size_t(sum_of(c, {M, V})),
                    Place::Disk, "disk.state"}};
  if (masters > 0)
    m.push_back({"fp32 masters of " + std::to_string(masters) + " blobs", size_t(sum_of(c, {Master})), Place::Disk,
                 "disk.master"});
  if (grads > 0)
    m.push_back({"gradients of the step (held for the norm) of " + std::to_string(grads) + " blobs",
                 size_t(sum_of(c, {Grad})), Place::Disk, "disk.grads"});
  if (works > 0)
    m.push_back({"working copies (read for each upload) of " + std::to_string(works) + " blobs",
                 size_t(sum_of(c, {Work})), Place::Disk, "disk.work"});
  return m;
}

uint64_t StateStream::part_bytes(int blob, int which) const { return part_of(cfg_, size_t(blob), which); }

uint64_t StateStream::part_at(int blob, int which) const {
  uint64_t at = 0;
  for (int w : {Grad, M, V, Master, Work}) {
    if (w == which) return at;
    at += part_bytes(blob, w);
  }
  return at;
}

StateStream::StateStream(NvmeStore& store, const Config& c, BufferSource& src) : store_(store), cfg_(c) {
  SF_CHECK(c.ring >= 1, "the state ring needs a buffer");
  uint64_t at = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) {
    off_.push_back(at);
    at += region_bytes(c, b);
    slot_bytes_ = std::max(slot_bytes_, size_t(region_bytes(c, b)));
  }
  size_t on_disk = 0;
  for (int b : c.order) {
    SF_CHECK(has(b), "state stream: blob " + std::to_string(b) + " of the order has no state in the store");
    ++on_disk;
  }
  for (size_t b = 0; b < c.numel.size(); ++b)
    SF_CHECK(c.numel[b] == 0 || std::count(c.order.begin(), c.order.end(), int(b)) == 1,
             "state stream: every blob in the store is updated once a cycle");
  writing_.assign(c.numel.size(), 0);
  grad_ready_.assign(c.numel.size(), 0);
  if (slot_bytes_ == 0) return;
  SF_CHECK(at <= store.capacity(), "the offload file is smaller than the state");
  ring_mem_ = HostBuffer(src.take("disk.ring").bytes);
  src.take("disk.state");
  if (sum_of(c, {Master}) > 0) src.take("disk.master");
  if (sum_of(c, {Grad}) > 0) src.take("disk.grads");
  if (sum_of(c, {Work}) > 0) src.take("disk.work");
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(ring_mem_.data()) + NvmeStore::kAlign - 1) /
                                       NvmeStore::kAlign * NvmeStore::kAlign);
  slots_.resize(size_t(c.ring));
  for (int i = 0; i < c.ring; ++i) slots_[size_t(i)].mem = base + size_t(i) * slot_bytes_;
}

StateStream::~StateStream() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] {
    for (const Slot& s : slots_)
      if (s.st == St::Reading || s.st == St::Writing) return false;
    return true;
  });
}

StateStream::Slot* StateStream::slot_at(int64_t pos) {
  for (Slot& s : slots_)
    if (s.pos == pos && s.st != St::Free) return &s;
  return nullptr;
}

// Reads ahead in the cycle while a buffer is free, never a whole cycle ahead, never past a blob
// whose last write-back is still in flight.
void StateStream::pump_locked() {
  const int64_t n = int64_t(cfg_.order.size());
  while (err_ == 0 && next_read_ < next_use_ + n) {
    const int b = cfg_.order[size_t(next_read_ % n)];
    if (writing_[size_t(b)] > 0) return;
    if (has_grad(b) && !grad_ready_[size_t(b)]) return;  // its gradient of the step is not all there yet
    Slot* s = nullptr;
    for (Slot& c : slots_)
      if (c.st == St::Free) {
        s = &c;
        break;
      }
    if (!s) return;
    s->st = St::Reading;
    s->pos = next_read_++;
    grad_ready_[size_t(b)] = 0;
    store_.read(off_[size_t(b)], s->mem, size_t(read_bytes(b)), [this, s](int err) {
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !err_) {
        err_ = err;
        err_write_ = false;
      }
      s->st = St::Ready;
      cv_.notify_all();
    });
  }
}

void StateStream::check() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
}

StateStream::View StateStream::acquire(int blob) {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t n = int64_t(cfg_.order.size());
  SF_CHECK(n > 0 && cfg_.order[size_t(next_use_ % n)] == blob,
           "state stream: blob " + std::to_string(blob) + " updated out of its order");
  pump_locked();
  Slot* s = nullptr;
  cv_.wait(lk, [&] {
    s = slot_at(next_use_);
    return err_ != 0 || (s && s->st == St::Ready);
  });
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
  s->st = St::InUse;
  View v{s->mem + part_at(blob, M), s->mem + part_at(blob, V), nullptr, nullptr, nullptr};
  if (has_grad(blob)) v.grad = s->mem + part_at(blob, Grad);
  if (has_master(blob)) v.master = reinterpret_cast<float*>(s->mem + part_at(blob, Master));
  if (has_work(blob)) v.work = s->mem + part_at(blob, Work);
  return v;
}

void StateStream::release(int blob) {
  std::lock_guard<std::mutex> lk(mu_);
  Slot* s = slot_at(next_use_);
  SF_CHECK(s && s->st == St::InUse && cfg_.order[size_t(next_use_ % int64_t(cfg_.order.size()))] == blob,
           "state stream: release of a blob not acquired");
  s->st = St::Writing;
  ++writing_[size_t(blob)];
  ++next_use_;
  const uint64_t skip = part_at(blob, M);  // the gradient is not written back
  store_.write(off_[size_t(blob)] + skip, s->mem + skip, size_t(write_bytes(blob)), [this, s, blob](int err) {
    std::lock_guard<std::mutex> lk2(mu_);
    if (err && !err_) {
      err_ = err;
      err_write_ = true;
    }
    s->st = St::Free;
    s->pos = -1;
    --writing_[size_t(blob)];
    pump_locked();
    cv_.notify_all();
  });
  pump_locked();
}

void StateStream::quiesce() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] {
    for (const Slot& s : slots_)
      if (s.st == St::Reading || s.st == St::Writing) return false;
    return true;
  });
  for (Slot& s : slots_) {
    SF_CHECK(s.st != St::InUse, "state stream: quiesced during an update");
    if (s.st == St::Ready) {  // read ahead and dropped: its gradient is still in the store, to be read again
      const int b = cfg_.order[size_t(s.pos % int64_t(cfg_.order.size()))];
      if (has_grad(b)) grad_ready_[size_t(b)] = 1;
    }
    s.st = St::Free;
    s.pos = -1;
  }
  next_read_ = next_use_;
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
}

void StateStream::wait_written(int blob) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return err_ != 0 || writing_[size_t(blob)] == 0; });
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
}

void StateStream::write_grad(int blob, int64_t i0, int64_t n, const void* src, bool last) {
  SF_CHECK(has_grad(blob) && i0 >= 0 && i0 + n <= cfg_.numel[size_t(blob)], "state stream: bad gradient write");
  const uint64_t at = off_[size_t(blob)] + part_at(blob, Grad) + uint64_t(i0) * cfg_.grad_bytes;
  try {
    store_.write_sync(at, src, size_t(n) * cfg_.grad_bytes);
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!err_) {
      err_ = EIO;
      err_write_ = true;
    }
    cv_.notify_all();
    throw;
  }
  if (!last) return;
  std::lock_guard<std::mutex> lk(mu_);
  grad_ready_[size_t(blob)] = 1;
  pump_locked();
  cv_.notify_all();
}

namespace {
bool valid_part(int which) { return which >= StateStream::Master && which <= StateStream::Grad; }
}  // namespace

void StateStream::read(int which, int blob, int64_t off, int64_t n, void* dst) {
  SF_CHECK(
      has(blob) && valid_part(which) && part_bytes(blob, which) > 0 && off >= 0 && off + n <= cfg_.numel[size_t(blob)],
      "state stream: bad read");
  const uint64_t at = off_[size_t(blob)] + part_at(blob, which) + uint64_t(off) * part_elem(which);
  store_.read_sync(at, dst, size_t(n) * part_elem(which));
}

void StateStream::write(int which, int blob, int64_t off, int64_t n, const void* src) {
  SF_CHECK(
      has(blob) && valid_part(which) && part_bytes(blob, which) > 0 && off >= 0 && off + n <= cfg_.numel[size_t(blob)],
      "state stream: bad write");
  const uint64_t at = off_[size_t(blob)] + part_at(blob, which) + uint64_t(off) * part_elem(which);
  store_.write_sync(at, src, size_t(n) * part_elem(which));
}

}  // namespace sf
