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

namespace {
// Elements of a full piece of blob b, and the bytes of a ring buffer holding one of its pieces.
int64_t piece_len(const StateStream::Config& c, size_t b) {
  return c.piece > 0 ? std::min(c.piece, c.numel[b]) : c.numel[b];
}
size_t elem_of(const StateStream::Config& c, int which) {
  return which == StateStream::Master ? 4
         : which == StateStream::Work ? c.work_bytes
         : which == StateStream::Grad ? c.grad_bytes
                                      : c.elem_bytes;
}
// A piece's part `which` in a ring buffer (0: the blob has no such part).
uint64_t slot_part(const StateStream::Config& c, size_t b, int which) {
  return part_of(c, b, which) > 0 ? NvmeStore::aligned(uint64_t(piece_len(c, b)) * elem_of(c, which)) : 0;
}
uint64_t slot_region(const StateStream::Config& c, size_t b) {
  uint64_t n = 0;
  for (int w : {StateStream::Grad, StateStream::M, StateStream::V, StateStream::Master, StateStream::Work})
    n += slot_part(c, b, w);
  return n;
}
}  // namespace

MemoryItems StateStream::buffers(const Config& c) {
  uint64_t slot = 0;
  int masters = 0, works = 0, grads = 0;
  int64_t pieces = 0;  // in a cycle
  for (size_t b = 0; b < c.numel.size(); ++b) {
    slot = std::max(slot, slot_region(c, b));
    masters += part_of(c, b, Master) > 0;
    works += part_of(c, b, Work) > 0;
    grads += part_of(c, b, Grad) > 0;
    if (c.numel[b] > 0) pieces += (c.numel[b] + piece_len(c, b) - 1) / piece_len(c, b);
  }
  if (slot == 0) return {};
  const std::string what = masters > 0 ? "AdamW state and masters" : "AdamW state";
  // No more buffers than pieces: a deeper ring would only hold a piece twice.
  const int ring = int(std::clamp<int64_t>(pieces, 1, c.ring));
  const std::string name = what + " read from the offload dir (" + std::to_string(ring) +
                           (c.piece > 0 ? " pieces of " + std::to_string(c.piece) + " elements)" : " blobs)");
  MemoryItems m = {{name, size_t(slot) * size_t(ring) + NvmeStore::kAlign, Place::Host, "disk.ring"},
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

int64_t StateStream::piece_of(int blob) const { return piece_len(cfg_, size_t(blob)); }
size_t StateStream::part_elem(int which) const { return elem_of(cfg_, which); }

uint64_t StateStream::slot_part_at(int blob, int which) const {
  uint64_t at = 0;
  for (int w : {Grad, M, V, Master, Work}) {
    if (w == which) return at;
    at += slot_part(cfg_, size_t(blob), w);
  }
  return at;
}

StateStream::StateStream(NvmeStore& store, const Config& c, BufferSource& src) : store_(store), cfg_(c) {
  SF_CHECK(c.ring >= 1, "the state ring needs a buffer");
  SF_CHECK(c.piece >= 0 && c.piece % kPieceAlign == 0,
           "state stream: a piece is a multiple of " + std::to_string(kPieceAlign) + " elements");
  uint64_t at = 0;
  for (size_t b = 0; b < c.numel.size(); ++b) {
    off_.push_back(at);
    at += region_bytes(c, b);
    slot_bytes_ = std::max(slot_bytes_, size_t(slot_region(c, b)));
  }
  for (int b : c.order) {
    SF_CHECK(has(b), "state stream: blob " + std::to_string(b) + " of the order has no state in the store");
    const int64_t p = piece_of(b);
    for (int64_t e = 0; e < c.numel[size_t(b)]; e += p) seq_.push_back({b, e, std::min(p, c.numel[size_t(b)] - e)});
  }
  for (size_t b = 0; b < c.numel.size(); ++b)
    SF_CHECK(c.numel[b] == 0 || std::count(c.order.begin(), c.order.end(), int(b)) == 1,
             "state stream: every blob in the store is updated once a cycle");
  writing_.assign(c.numel.size(), 0);
  piece_writing_.assign(seq_.size(), 0);
  grad_ready_.assign(c.numel.size(), 0);
  grad_writes_.assign(c.numel.size(), 0);
  grad_last_.assign(c.numel.size(), 0);
  if (slot_bytes_ == 0) return;
  SF_CHECK(at <= store.capacity(), "the offload file is smaller than the state");
  ring_mem_ = HostBuffer(src.take("disk.ring").bytes);
  src.take("disk.state");
  if (sum_of(c, {Master}) > 0) src.take("disk.master");
  if (sum_of(c, {Grad}) > 0) src.take("disk.grads");
  if (sum_of(c, {Work}) > 0) src.take("disk.work");
  const size_t ring = (ring_mem_.size() - NvmeStore::kAlign) / slot_bytes_;  // the list's (no more than pieces)
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(ring_mem_.data()) + NvmeStore::kAlign - 1) /
                                       NvmeStore::kAlign * NvmeStore::kAlign);
  slots_.resize(ring);
  for (size_t i = 0; i < ring; ++i) slots_[i].mem = base + i * slot_bytes_;
  // Every transfer of the stream is to or from the ring: registered, its pieces go as
  // READ_FIXED / WRITE_FIXED (or plainly, logged once, where the kernel refuses).
  ring_reg_ = RegisteredBuffer(&store, base, ring * slot_bytes_);
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

void StateStream::transfer(Slot* s, const PieceRef& p, bool write) {
  // The parts this direction moves: reads [grad | m | v | master] (the working copy is only
  // written), writes [m | v | master | work] (the gradient is not written back).
  std::vector<int> parts;
  for (int w : {Grad, M, V, Master, Work})
    if (part_bytes(p.blob, w) > 0 && (write ? w != Grad : w != Work)) parts.push_back(w);
  s->pending = int(parts.size());
  for (int w : parts) {
    // Piece k of a part starts at k full pieces of it: block-aligned (a full piece is a multiple of
    // kPieceAlign elements, or the whole blob); the last piece's bytes round up inside the part.
    const uint64_t at = off_[size_t(p.blob)] + part_at(p.blob, w) + uint64_t(p.first) * part_elem(w);
    char* mem = s->mem + slot_part_at(p.blob, w);
    const size_t bytes = size_t(NvmeStore::aligned(uint64_t(p.n) * part_elem(w)));
    auto done = [this, s, write](int err) { finished(s, err, write); };
    if (write)
      store_.write(at, mem, bytes, done);
    else
      store_.read(at, mem, bytes, done);
  }
}

void StateStream::finished(Slot* s, int err, bool write) {
  std::lock_guard<std::mutex> lk(mu_);
  if (err && !err_) {
    err_ = err;
    err_write_ = write;
  }
  if (--s->pending > 0) return;
  if (write) {
    const size_t i = size_t(s->pos % int64_t(seq_.size()));
    --writing_[size_t(seq_[i].blob)];
    piece_writing_[i] = 0;
    s->st = St::Free;
    s->pos = -1;
    if (!s->own) {  // a lent buffer serves a piece once
      --leases_[size_t(s->lease)].live;
      s->lease = -1;
    }
    pump_locked();
  } else {
    s->st = St::Ready;
  }
  cv_.notify_all();
}

// Reads ahead in the cycle while a buffer is free, never a whole cycle ahead, never past a piece
// whose last write-back is still in flight.
void StateStream::pump_locked() {
  const int64_t n = int64_t(seq_.size());
  while (err_ == 0 && !hold_reads_ && next_read_ < next_use_ + n) {
    const size_t i = size_t(next_read_ % n);
    const PieceRef& p = seq_[i];
    if (piece_writing_[i]) return;
    if (has_grad(p.blob) && !grad_ready_[size_t(p.blob)]) return;  // its gradient of the step is not all there yet
    Slot* s = nullptr;
    for (Slot& c : slots_)
      if (c.own && c.st == St::Free) {
        s = &c;
        break;
      }
    if (!s) s = carve_locked(p, next_read_);
    if (!s) return;
    s->st = St::Reading;
    s->pos = next_read_++;
    if (p.first + p.n == cfg_.numel[size_t(p.blob)]) grad_ready_[size_t(p.blob)] = 0;  // the blob's last piece
    transfer(s, p, false);
  }
}

void StateStream::check() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
}

StateStream::View StateStream::acquire(int blob) {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t n = int64_t(seq_.size());
  SF_CHECK(n > 0 && seq_[size_t(next_use_ % n)].blob == blob,
           "state stream: blob " + std::to_string(blob) + " updated out of its order");
  pump_locked();
  Slot* s = nullptr;
  cv_.wait(lk, [&] {
    s = slot_at(next_use_);
    return err_ != 0 || (s && s->st == St::Ready);
  });
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
  s->st = St::InUse;
  const PieceRef& p = seq_[size_t(next_use_ % n)];
  View v{p.first, p.n, s->mem + slot_part_at(blob, M), s->mem + slot_part_at(blob, V), nullptr, nullptr, nullptr};
  if (has_grad(blob)) v.grad = s->mem + slot_part_at(blob, Grad);
  if (has_master(blob)) v.master = reinterpret_cast<float*>(s->mem + slot_part_at(blob, Master));
  if (has_work(blob)) v.work = s->mem + slot_part_at(blob, Work);
  return v;
}

void StateStream::release(int blob) {
  std::lock_guard<std::mutex> lk(mu_);
  Slot* s = slot_at(next_use_);
  const size_t i = size_t(next_use_ % int64_t(seq_.size()));
  SF_CHECK(s && s->st == St::InUse && seq_[i].blob == blob, "state stream: release of a blob not acquired");
  s->st = St::Writing;
  ++writing_[size_t(blob)];
  piece_writing_[i] = 1;
  ++next_use_;
  transfer(s, seq_[i], true);
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
      const int b = seq_[size_t(s.pos % int64_t(seq_.size()))].blob;
      if (has_grad(b)) grad_ready_[size_t(b)] = 1;
    }
    if (!s.own && s.lease >= 0) {
      --leases_[size_t(s.lease)].live;
      s.lease = -1;
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

bool StateStream::grad_chunk(int blob, int64_t i0, int64_t n, const void* src, uint64_t& at, size_t& bytes) const {
  SF_CHECK(has_grad(blob) && i0 >= 0 && i0 + n <= cfg_.numel[size_t(blob)], "state stream: bad gradient write");
  at = off_[size_t(blob)] + part_at(blob, Grad) + uint64_t(i0) * cfg_.grad_bytes;
  bytes = size_t(n) * cfg_.grad_bytes;
  // A chunk that starts on a block, from a block-aligned buffer (the host optimizer's ring), goes
  // in place with the store's full depth of requests; the bounce of write_sync moves 16 MiB at a
  // time (two requests, the queue drained between) after a copy. The last chunk of a blob may end
  // inside a block: it is written to the block's end (the part's padding; the buffer holds a whole
  // number of blocks), which no read of the gradient uses.
  const bool last_piece = i0 + n == cfg_.numel[size_t(blob)];
  return at % NvmeStore::kAlign == 0 && reinterpret_cast<uintptr_t>(src) % NvmeStore::kAlign == 0 &&
         (bytes % NvmeStore::kAlign == 0 || last_piece);
}

void StateStream::write_grad(int blob, int64_t i0, int64_t n, const void* src, bool last) {
  uint64_t at = 0;
  size_t bytes = 0;
  const bool in_place = grad_chunk(blob, i0, n, src, at, bytes);
  try {
    if (in_place)
      store_.write_wait(at, src, size_t(NvmeStore::aligned(bytes)));
    else
      store_.write_sync(at, src, bytes);
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

void StateStream::write_grad_async(int blob, int64_t i0, int64_t n, const void* src, bool last, int ticket) {
  SF_CHECK(ticket == 0 || ticket == 1, "state stream: bad gradient buffer");
  uint64_t at = 0;
  size_t bytes = 0;
  if (!grad_chunk(blob, i0, n, src, at, bytes)) return write_grad(blob, i0, n, src, last);
  {
    std::lock_guard<std::mutex> lk(mu_);
    SF_CHECK(!ticket_busy_[ticket], "state stream: a gradient buffer reused before its write");
    ++grad_writes_[size_t(blob)];
    if (last) grad_last_[size_t(blob)] = 1;
    ticket_busy_[ticket] = 1;
  }
  store_.write(
      at, src, size_t(NvmeStore::aligned(bytes)),
      [this, blob, ticket](int err) {
        std::lock_guard<std::mutex> lk(mu_);
        if (err && !err_) {
          err_ = err;
          err_write_ = true;
        }
        ticket_busy_[ticket] = 0;
        if (--grad_writes_[size_t(blob)] == 0 && grad_last_[size_t(blob)]) {
          grad_last_[size_t(blob)] = 0;
          grad_ready_[size_t(blob)] = 1;
          pump_locked();
        }
        cv_.notify_all();
      },
      true);
}

void StateStream::wait_grad(int ticket) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return err_ != 0 || !ticket_busy_[ticket]; });
  if (err_) throw std::runtime_error(store_.error_text(err_write_, err_));
}

StateStream::Slot* StateStream::carve_locked(const PieceRef& p, int64_t pos) {
  const size_t need = size_t(slot_region(cfg_, size_t(p.blob)));
  for (size_t i = 0; i < leases_.size(); ++i) {
    Lease& l = leases_[i];
    if (!l.open || pos >= l.limit || l.cut < l.lo || size_t(l.cut - l.lo) < need) continue;
    char* at = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(l.cut) - need) / NvmeStore::kAlign *
                                       NvmeStore::kAlign);
    if (at < l.lo) continue;
    Slot* s = nullptr;
    for (Slot& c : slots_)
      if (!c.own && c.lease < 0 && c.st == St::Free) {
        s = &c;
        break;
      }
    if (!s) {
      slots_.emplace_back();
      s = &slots_.back();
      s->own = false;
    }
    s->mem = at;
    s->bytes = size_t(l.cut - at);
    s->lease = int(i);
    l.cut = at;
    ++l.live;
    ++lent_reads_;
    return s;
  }
  return nullptr;
}

void StateStream::lend(int key, char* mem, size_t bytes, int through) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t n = int64_t(seq_.size());
  if (n == 0 || slots_.empty()) return;
  // The cycle's prefix of blobs updated no later than `through`: their updates come before the
  // forward writes this checkpoint again (the uploads of blobs <= through wait for them).
  int64_t k = 0;
  while (k < n && seq_[size_t(k)].blob <= through) ++k;
  if (k == 0) return;
  const int64_t limit = next_use_ - next_use_ % n + k;
  bool all_done = true;
  for (const Lease& l : leases_) all_done &= !l.open && l.live == 0 && l.regions.empty();
  if (all_done) leases_.clear();
  for (const Lease& l : leases_)
    for (const Region& r : l.regions)
      SF_CHECK(mem + bytes <= r.lo || mem >= r.hi, "state stream: memory lent twice");
  const auto up = [](char* p) {
    return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + NvmeStore::kAlign - 1) / NvmeStore::kAlign *
                                   NvmeStore::kAlign);
  };
  Lease* into = nullptr;
  for (Lease& l : leases_)
    if (l.open && l.raw_lo == mem + bytes) into = &l;
  if (into) {  // just below an open lent buffer: one free range down from its cut
    into->lo = up(mem);
    into->raw_lo = mem;
    into->limit = std::min(into->limit, limit);
  } else {
    Lease l;
    l.lo = up(mem);
    l.cut = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(mem + bytes) / NvmeStore::kAlign * NvmeStore::kAlign);
    l.raw_lo = mem;
    l.limit = limit;
    leases_.push_back(l);
    into = &leases_.back();
  }
  into->regions.push_back({key, mem, mem + bytes});
  pump_locked();
}

void StateStream::drop_ready_from_locked(int64_t pos) {
  for (Slot& s : slots_) {
    if (s.st != St::Ready || s.pos < pos) continue;
    const int b = seq_[size_t(s.pos % int64_t(seq_.size()))].blob;
    if (has_grad(b)) grad_ready_[size_t(b)] = 1;  // its gradient is still in the store
    if (!s.own) {
      --leases_[size_t(s.lease)].live;
      s.lease = -1;
    }
    s.st = St::Free;
    s.pos = -1;
  }
  next_read_ = std::min(next_read_, pos);
  pump_locked();  // an update may be waiting for one of them already
}

void StateStream::reclaim(int key) {
  std::unique_lock<std::mutex> lk(mu_);
  int li = -1;
  Region reg{};
  for (size_t i = 0; i < leases_.size() && li < 0; ++i)
    for (size_t r = 0; r < leases_[i].regions.size(); ++r)
      if (leases_[i].regions[r].key == key) {
        li = int(i);
        reg = leases_[i].regions[r];
        leases_[i].regions.erase(leases_[i].regions.begin() + std::ptrdiff_t(r));
        break;
      }
  if (li < 0) return;
  leases_[size_t(li)].open = false;  // the forward takes its checkpoints back from here on
  const auto inside = [&](const Slot& s) {
    return !s.own && s.lease == li && s.mem < reg.hi && s.mem + s.bytes > reg.lo;
  };
  // The pieces there were updated before this (`through`); only their transfers can be in flight.
  cv_.wait(lk, [&] {
    for (const Slot& s : slots_)
      if (inside(s) && (s.st == St::Reading || s.st == St::Writing)) return false;
    return true;
  });
  const auto first_ready = [&] {
    int64_t first = -1;
    for (const Slot& s : slots_) {
      SF_CHECK(!(inside(s) && s.st == St::InUse), "state stream: lent memory taken back during its piece's update");
      if (inside(s) && s.st == St::Ready && (first < 0 || s.pos < first)) first = s.pos;
    }
    return first;
  };
  if (first_ready() < 0) return;
  // Read ahead but not updated (the step stopped before its updates): dropped with every piece
  // read after it, and read again in order, once no read is in flight (none is started meanwhile).
  hold_reads_ = true;
  cv_.wait(lk, [&] {
    for (const Slot& s : slots_)
      if (s.st == St::Reading) return false;
    return true;
  });
  hold_reads_ = false;
  const int64_t first = first_ready();
  if (first >= 0) drop_ready_from_locked(first);
  pump_locked();
  cv_.notify_all();
}

bool StateStream::try_reclaim(int key) {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < leases_.size(); ++i)
    for (size_t r = 0; r < leases_[i].regions.size(); ++r) {
      const Region reg = leases_[i].regions[r];
      if (reg.key != key) continue;
      Lease& l = leases_[i];
      l.open = false;  // carved no further: what is in it now is all there will be
      for (const Slot& s : slots_)
        if (!s.own && s.lease == int(i) && s.mem < reg.hi && s.mem + s.bytes > reg.lo && s.st != St::Free)
          return false;
      l.regions.erase(l.regions.begin() + std::ptrdiff_t(r));
      return true;
    }
  return true;
}

uint64_t StateStream::lent_reads() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lent_reads_;
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
