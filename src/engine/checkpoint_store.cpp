#include "engine/checkpoint_store.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace sf {

namespace {
size_t disk_stride(const CheckpointOptions& o) { return size_t(NvmeStore::aligned(o.stride)); }
}  // namespace

MemoryItems CheckpointStore::buffers(const CheckpointOptions& o) {
  const int layers = std::max(o.layers, 1);
  const int disk = std::clamp(o.disk_layers, 0, layers);
  MemoryItems m = {{"checkpoints fetched for the backward", 2 * o.stride, Place::Device, "ckpt.fetch"},
                   {"layer-input checkpoints (" + std::to_string(o.micro) + " micro-batches)",
                    size_t(o.micro) * size_t(layers - disk) * o.stride, Place::Pinned, "ckpt.host"}};
  if (disk > 0 && !o.gpu_direct) {
    const size_t ring = size_t(o.write_ring + o.read_ahead) * disk_stride(o) + NvmeStore::kAlign;
    m.push_back({"checkpoints to and from the offload dir (" + std::to_string(o.write_ring + o.read_ahead) +
                     " buffers)",
                 ring, Place::Pinned, "ckpt.ring"});
  }
  if (disk > 0)
    m.push_back({"layer-input checkpoints of " + std::to_string(disk) + " layers",
                 size_t(o.micro) * size_t(disk) * disk_stride(o), Place::Disk, "ckpt.disk"});
  return m;
}

CheckpointStore::CheckpointStore(Device& dev, const CheckpointOptions& o, NvmeStore* store, uint64_t store_offset,
                                 Stream* io)
    : dev_(dev), o_(o), dstride_(disk_stride(o)), store_(store), store_off_(store_offset), io_(io) {
  o_.layers = std::max(o.layers, 1);
  o_.disk_layers = std::clamp(o.disk_layers, 0, o_.layers);
  BufferSource src(dev, buffers(o));
  gpu_ = src.buffer("ckpt.fetch");
  host_ = src.buffer("ckpt.host");
  for (int i = 0; i < 2; ++i) {
    ready_[i] = dev.create_event();
    free_[i] = dev.create_event();
  }
  offloaded_ = dev.create_event();
  lent_.assign(size_t(std::max(o_.micro, 1)) * size_t(o_.layers), 0);
  if (o_.disk_layers == 0) return;
  SF_CHECK(store && io && o.write_ring >= 1 && o.read_ahead >= 1, "checkpoints on disk need the store and a stream");
  src.take("ckpt.disk");
  if (o_.gpu_direct) {
    SF_CHECK(store->gpu_direct(), "checkpoints through cuFile, but the store has no GPUDirect Storage");
    o_.write_ring = 2;  // the two fetch buffers
    gpu_reg_ = store->gpu_register(gpu_.data(), gpu_.size());
    written_ = dev.create_event();
  } else {
    ring_ = src.buffer("ckpt.ring");
    ring_reg_ = RegisteredBuffer(store, ring_.data(), ring_.size());
  }
  for (int i = 0; i < o_.write_ring; ++i) {
    w_free_.push_back(dev.create_event());
    w_copied_.push_back(dev.create_event());
  }
  for (int i = 0; i < o.read_ahead && !o_.gpu_direct; ++i) {
    r_ready_.push_back(dev.create_event());
    r_free_.push_back(dev.create_event());
  }
  for (int l = o_.disk_layers - 1; l >= 0; --l)
    for (int j = 0; j < o_.micro; ++j) disk_order_.emplace_back(j, l);
}

CheckpointStore::~CheckpointStore() {
  if (gpu_reg_) store_->gpu_unregister(gpu_.data());
}

char* CheckpointStore::at(int j, int l) const {
  const int ram_layers = o_.layers - o_.disk_layers;
  return static_cast<char*>(host_.data()) + (size_t(j) * size_t(ram_layers) + size_t(l - o_.disk_layers)) * o_.stride;
}

uint64_t CheckpointStore::disk_at(int j, int l) const {
  return store_off_ + (uint64_t(j) * uint64_t(o_.disk_layers) + uint64_t(l)) * dstride_;
}

char* CheckpointStore::ring_slot(int i) const {
  const uintptr_t base = (reinterpret_cast<uintptr_t>(ring_.data()) + NvmeStore::kAlign - 1) / NvmeStore::kAlign *
                         NvmeStore::kAlign;
  return reinterpret_cast<char*>(base) + size_t(i) * dstride_;
}

void CheckpointStore::offload(int j, int l, const void* src, size_t bytes, Stream& d2h) {
  fwd_micro_ = std::max(fwd_micro_, j + 1);
  if (!on_disk(l)) {
    if (reclaim_ && j == 0) reclaim_layer(l, d2h);
    dev_.copy(at(j, l), src, bytes, CopyKind::DeviceToHost, d2h);
    return;
  }
  if (o_.gpu_direct) return offload_direct(j, l, src, bytes, d2h);
  const int w = next_w_;
  next_w_ = (next_w_ + 1) % o_.write_ring;
  char* slot = ring_slot(w);
  dev_.wait(d2h, *w_free_[size_t(w)]);  // its last write is done
  dev_.copy(slot, src, bytes, CopyKind::DeviceToHost, d2h);
  dev_.record(*w_copied_[size_t(w)], d2h);
  dev_.wait(*io_, *w_copied_[size_t(w)]);
  NvmeStore* store = store_;
  const uint64_t at = disk_at(j, l);
  const size_t n = size_t(NvmeStore::aligned(bytes));
  dev_.host_fn(*io_, [store, at, slot, n] { store->write_wait(at, slot, n); });
  dev_.record(*w_free_[size_t(w)], *io_);
}

// Down without a bounce: a copy on the GPU into fetch buffer w (free in the forward once cuFile
// wrote what it held), then cuFile writes it out on the io stream.
void CheckpointStore::offload_direct(int j, int l, const void* src, size_t bytes, Stream& d2h) {
  const int w = next_w_;
  next_w_ = (next_w_ + 1) % 2;
  char* buf = static_cast<char*>(gpu_.data()) + size_t(w) * o_.stride;
  dev_.wait(d2h, *w_free_[size_t(w)]);
  dev_.wait(d2h, *free_[w]);  // the last backward's compute is done with it
  dev_.copy(buf, src, bytes, CopyKind::DeviceToDevice, d2h);
  dev_.record(*w_copied_[size_t(w)], d2h);
  dev_.wait(*io_, *w_copied_[size_t(w)]);
  NvmeStore* store = store_;
  const uint64_t at = disk_at(j, l);
  dev_.host_fn(*io_, [store, at, buf, bytes] { store->gpu_write_wait(at, buf, bytes); });
  dev_.record(*w_free_[size_t(w)], *io_);
}

// Up without a bounce: cuFile reads into fetch buffer i on the io stream, once the compute stream
// is done with what it held and the forward's writes from it are done.
void CheckpointStore::fetch_direct(int i, int j, int l, size_t bytes) {
  const size_t u = reads_used_++;
  SF_CHECK(u < disk_order_.size() && disk_order_[u] == std::make_pair(j, l), "checkpoint fetched out of order");
  dev_.wait(*io_, *free_[i]);
  char* buf = static_cast<char*>(gpu_.data()) + size_t(i) * o_.stride;
  NvmeStore* store = store_;
  const uint64_t at = disk_at(j, l);
  dev_.host_fn(*io_, [store, at, buf, bytes] { store->gpu_read_wait(at, buf, bytes); });
  dev_.record(*ready_[i], *io_);
}

// Layer l's lent checkpoints (every micro-batch's) taken back before the forward's first offload of
// the layer writes one: d2h has waited for the layer's compute of micro-batch 0, which waited for
// the uploads of blobs 0 .. l + 1 and so for their updates, the only pieces lent memory of layer l
// may hold. Those with nothing in them now, at once; the rest in one host function on d2h.
void CheckpointStore::reclaim_layer(int l, Stream& d2h) {
  std::vector<int> keys;
  for (int j = 0; j < o_.micro; ++j) {
    const int key = j * o_.layers + l;
    if (!lent_[size_t(key)]) continue;
    lent_[size_t(key)] = 0;
    keys.push_back(key);
  }
  if (keys.empty()) return;
  const bool settled = try_reclaim_ && lends_run_->load() == lends_queued_;
  std::vector<int> later;
  for (int key : keys)
    if (!settled || !try_reclaim_(key)) later.push_back(key);
  if (!later.empty())
    dev_.host_fn(d2h, [r = reclaim_, later] {
      for (int key : later) r(key);
    });
}

// The checkpoints fetched so far lent in one host function on h2d, before the last fetch's `ready`.
void CheckpointStore::queue_lends(Stream& h2d) {
  if (to_lend_.empty()) return;
  for (const auto& kl : to_lend_) lent_[size_t(kl.first)] = 1;
  ++lends_queued_;
  dev_.host_fn(h2d, [f = lend_, run = lends_run_, ks = std::move(to_lend_), n = o_.stride, layers = o_.layers] {
    for (const auto& [key, mem] : ks) f(key, mem, n, key % layers);
    ++*run;
  });
  to_lend_.clear();
}

void CheckpointStore::forward_done(Stream& d2h) {
  dev_.record(*offloaded_, d2h);
  pass_micro_ = fwd_micro_;
  fwd_micro_ = 0;
  reads_queued_ = reads_used_ = 0;
  if (o_.gpu_direct) {
    dev_.wait(*io_, *offloaded_);
    dev_.record(*written_, *io_);  // every write of this forward from the fetch buffers is done
    return;
  }
  // The backward's first disk fetches read ahead from now on (the io stream runs the forward's
  // writes first, in its order).
  while (reads_queued_ < disk_order_.size() && reads_queued_ < size_t(o_.read_ahead)) queue_read();
}

void CheckpointStore::queue_read() {
  const size_t q = reads_queued_++;
  const int r = int(q % size_t(o_.read_ahead));
  char* slot = ring_slot(o_.write_ring + r);
  dev_.wait(*io_, *r_free_[size_t(r)]);  // h2d copied out what it held (an event never recorded: no wait)
  NvmeStore* store = store_;
  const auto [j, l] = disk_order_[q];
  const uint64_t at = disk_at(j, l);
  const size_t n = dstride_;
  dev_.host_fn(*io_, [store, at, slot, n] { store->read_wait(at, slot, n); });
  dev_.record(*r_ready_[size_t(r)], *io_);
}

void CheckpointStore::fetch(int k, int j, int l, size_t bytes, Stream& h2d) {
  const int i = k % 2;
  char* gpu = static_cast<char*>(gpu_.data()) + size_t(i) * o_.stride;
  if (o_.gpu_direct && on_disk(l)) return fetch_direct(i, j, l, bytes);
  dev_.wait(h2d, *free_[i]);
  dev_.wait(h2d, *offloaded_);
  if (written_) dev_.wait(h2d, *written_);
  if (!on_disk(l)) {
    dev_.copy(gpu, at(j, l), bytes, CopyKind::HostToDevice, h2d);
    // Read: its host memory is free until the next forward's offload of it, which follows this
    // fetch's `ready` through the compute stream. Lent once the layer's last micro-batch is fetched.
    if (lend_) {
      to_lend_.emplace_back(j * o_.layers + l, at(j, l));
      if (j + 1 >= pass_micro_) queue_lends(h2d);
    }
  } else {
    const size_t u = reads_used_++;
    SF_CHECK(u < disk_order_.size() && disk_order_[u] == std::make_pair(j, l), "checkpoint fetched out of order");
    while (reads_queued_ < disk_order_.size() && reads_queued_ < u + size_t(o_.read_ahead)) queue_read();
    const int r = int(u % size_t(o_.read_ahead));
    dev_.wait(h2d, *r_ready_[size_t(r)]);
    dev_.copy(gpu, ring_slot(o_.write_ring + r), bytes, CopyKind::HostToDevice, h2d);
    dev_.record(*r_free_[size_t(r)], h2d);
  }
  dev_.record(*ready_[i], h2d);
}

void* CheckpointStore::use(int k, Stream& compute) {
  dev_.wait(compute, *ready_[k % 2]);
  return static_cast<char*>(gpu_.data()) + size_t(k % 2) * o_.stride;
}

void CheckpointStore::done(int k, Stream& compute) { dev_.record(*free_[k % 2], compute); }

}  // namespace sf
