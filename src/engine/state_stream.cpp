#include "engine/state_stream.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace sf {

namespace {
uint64_t region_bytes(const StateStream::Config& c, size_t b) {
  return NvmeStore::aligned(uint64_t(c.numel[b]) * c.elem_bytes);
}
}  // namespace

uint64_t StateStream::store_bytes(const Config& c) {
  uint64_t n = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) n += 2 * region_bytes(c, b);
  return n;
}

MemoryItems StateStream::buffers(const Config& c) {
  uint64_t slot = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) slot = std::max(slot, 2 * region_bytes(c, b));
  if (slot == 0) return {};
  const std::string ring = "AdamW state read from the offload dir (" + std::to_string(c.ring) + " blobs)";
  return {{ring, size_t(slot) * size_t(c.ring) + NvmeStore::kAlign, Place::Host, "disk.ring"},
          {"AdamW m and v of " + std::to_string(c.order.size()) + " blobs", size_t(store_bytes(c)), Place::Disk,
           "disk.state"}};
}

StateStream::StateStream(NvmeStore& store, const Config& c, BufferSource& src) : store_(store), cfg_(c) {
  SF_CHECK(c.ring >= 1, "the state ring needs a buffer");
  uint64_t at = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) {
    off_.push_back(at);
    at += 2 * region_bytes(c, b);
    slot_bytes_ = std::max(slot_bytes_, size_t(2 * region_bytes(c, b)));
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
  if (slot_bytes_ == 0) return;
  SF_CHECK(at <= store.capacity(), "the offload file is smaller than the state");
  ring_mem_ = HostBuffer(src.take("disk.ring").bytes);
  src.take("disk.state");
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
    Slot* s = nullptr;
    for (Slot& c : slots_)
      if (c.st == St::Free) {
        s = &c;
        break;
      }
    if (!s) return;
    s->st = St::Reading;
    s->pos = next_read_++;
    store_.read(off_[size_t(b)], s->mem, size_t(2 * region(b)), [this, s](int err) {
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
  return View{s->mem, s->mem + region(blob)};
}

void StateStream::release(int blob) {
  std::lock_guard<std::mutex> lk(mu_);
  Slot* s = slot_at(next_use_);
  SF_CHECK(s && s->st == St::InUse && cfg_.order[size_t(next_use_ % int64_t(cfg_.order.size()))] == blob,
           "state stream: release of a blob not acquired");
  s->st = St::Writing;
  ++writing_[size_t(blob)];
  ++next_use_;
  store_.write(off_[size_t(blob)], s->mem, size_t(2 * region(blob)), [this, s, blob](int err) {
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
    s.st = St::Free;
    s.pos = -1;
  }
  next_read_ = next_use_;
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
}

void StateStream::read(int which, int blob, int64_t off, int64_t n, void* dst) {
  SF_CHECK(has(blob) && (which == 1 || which == 2) && off >= 0 && off + n <= cfg_.numel[size_t(blob)],
           "state stream: bad read");
  const uint64_t at = off_[size_t(blob)] + (which == 2 ? region(blob) : 0) + uint64_t(off) * cfg_.elem_bytes;
  store_.read_sync(at, dst, size_t(n) * cfg_.elem_bytes);
}

void StateStream::write(int which, int blob, int64_t off, int64_t n, const void* src) {
  SF_CHECK(has(blob) && (which == 1 || which == 2) && off >= 0 && off + n <= cfg_.numel[size_t(blob)],
           "state stream: bad write");
  const uint64_t at = off_[size_t(blob)] + (which == 2 ? region(blob) : 0) + uint64_t(off) * cfg_.elem_bytes;
  store_.write_sync(at, src, size_t(n) * cfg_.elem_bytes);
}

}  // namespace sf
