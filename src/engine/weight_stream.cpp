#include "engine/weight_stream.h"

#include <cstdint>
#include <string>

#include "core/error.h"

namespace sf {

MemoryItems WeightStream::buffers(int ring, size_t max_bytes) {
  if (ring <= 0 || max_bytes == 0) return {};
  return {{"working copies read from the offload dir for the uploads (" + std::to_string(ring) + " blobs)",
           size_t(ring) * size_t(NvmeStore::aligned(max_bytes)) + NvmeStore::kAlign, Place::Pinned, "disk.wring"}};
}

WeightStream::WeightStream(Device& dev, NvmeStore& store, StateStream& state, int ring, size_t max_bytes,
                           BufferSource& src)
    : dev_(dev), store_(store), state_(state), ring_(ring), stride_(size_t(NvmeStore::aligned(max_bytes))) {
  SF_CHECK(ring >= 1 && max_bytes > 0, "the weight ring needs a buffer");
  mem_ = src.buffer("disk.wring");
  reg_ = RegisteredBuffer(&store, slot(0), size_t(ring) * stride_);
  io_ = dev.create_stream();
  for (int i = 0; i < ring; ++i) {
    ready_.push_back(dev.create_event());
    free_.push_back(dev.create_event());
  }
}

WeightStream::~WeightStream() {
  if (io_) dev_.synchronize(*io_);
}

char* WeightStream::slot(int i) const {
  const uintptr_t base =
      (reinterpret_cast<uintptr_t>(mem_.data()) + NvmeStore::kAlign - 1) / NvmeStore::kAlign * NvmeStore::kAlign;
  return reinterpret_cast<char*>(base) + size_t(i) * stride_;
}

const void* WeightStream::begin(int blob, Event& updated, Stream& h2d) {
  SF_CHECK(state_.has_work(blob), "weight stream: blob " + std::to_string(blob) + " has no working copy on disk");
  const int r = next_;
  next_ = (next_ + 1) % ring_;
  cur_ = r;
  char* buf = slot(r);
  const uint64_t at = state_.work_offset(blob);
  const size_t n = size_t(state_.work_span(blob));
  SF_CHECK(n <= stride_, "weight stream: a working copy larger than the ring's buffers");
  dev_.wait(*io_, *free_[size_t(r)]);  // h2d copied out what it held
  dev_.wait(*io_, updated);            // the update that wrote it has run (its write-back may be in flight)
  NvmeStore* store = &store_;
  StateStream* state = &state_;
  dev_.host_fn(*io_, [store, state, blob, at, buf, n] {
    state->wait_written(blob);
    store->read_wait(at, buf, n);
  });
  dev_.record(*ready_[size_t(r)], *io_);
  dev_.wait(h2d, *ready_[size_t(r)]);
  return buf;
}

void WeightStream::end(Stream& h2d) {
  SF_CHECK(cur_ >= 0, "weight stream: end without begin");
  dev_.record(*free_[size_t(cur_)], h2d);
  cur_ = -1;
}

}  // namespace sf
