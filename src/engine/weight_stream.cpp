#include "engine/weight_stream.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>

#include "core/error.h"

namespace sf {

namespace {
int64_t largest(const WeightStream::Config& c) {
  int64_t n = 0;
  for (int64_t x : c.numel) n = std::max(n, x);
  return n;
}
// Pieces of all the blobs (a ring deeper than that would only hold a piece twice).
int64_t pieces(const WeightStream::Config& c, int64_t piece) {
  int64_t k = 0;
  for (int64_t x : c.numel)
    if (x > 0) k += (x + piece - 1) / piece;
  return k;
}
int ring_of(const WeightStream::Config& c, int64_t piece) {
  return int(std::clamp<int64_t>(pieces(c, piece), 1, std::max(c.ring, 1)));
}
}  // namespace

int64_t WeightStream::piece_of(const Config& c) {
  const int64_t n = largest(c);
  return c.piece > 0 ? std::min(c.piece, n) : n;
}

MemoryItems WeightStream::buffers(const Config& c) {
  const int64_t piece = piece_of(c);
  if (piece == 0) return {};
  const int ring = ring_of(c, piece);
  return {{"working copies read from the offload dir for the uploads (" + std::to_string(ring) + " pieces of " +
               std::to_string(piece) + " elements)",
           size_t(ring) * size_t(NvmeStore::aligned(uint64_t(piece) * c.elem_bytes)) + NvmeStore::kAlign,
           Place::Pinned, "disk.wring"}};
}

WeightStream::WeightStream(Device& dev, NvmeStore& store, StateStream& state, const Config& c, BufferSource& src)
    : dev_(dev), store_(store), state_(state), elem_(c.elem_bytes), piece_(piece_of(c)) {
  SF_CHECK(piece_ > 0, "the weight ring needs a working copy in the store");
  // A piece of a blob starts at piece_ elements into its part: block-aligned unless it is the
  // whole blob (the part itself is aligned).
  SF_CHECK(piece_ == largest(c) || uint64_t(piece_) * elem_ % NvmeStore::kAlign == 0,
           "weight stream: a piece is a whole number of blocks");
  ring_ = ring_of(c, piece_);
  stride_ = size_t(NvmeStore::aligned(uint64_t(piece_) * elem_));
  mem_ = src.buffer("disk.wring");
  SF_CHECK(mem_.size() >= size_t(ring_) * stride_ + NvmeStore::kAlign, "weight stream: the ring is not as listed");
  reg_ = RegisteredBuffer(&store, slot(0), size_t(ring_) * stride_);
  io_ = dev.create_stream();
  for (int i = 0; i < ring_; ++i) {
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

const void* WeightStream::begin(int blob, int64_t first, int64_t n, Event& updated, Stream& h2d) {
  SF_CHECK(state_.has_work(blob), "weight stream: blob " + std::to_string(blob) + " has no working copy on disk");
  SF_CHECK(cur_ < 0, "weight stream: begin before the last piece's end");
  SF_CHECK(n > 0 && n <= piece_ && first >= 0 && first % piece_ == 0, "weight stream: not a piece");
  const uint64_t at = state_.work_offset(blob) + uint64_t(first) * elem_;
  // The last piece's bytes round up to a block inside the (aligned) part.
  const size_t bytes = size_t(NvmeStore::aligned(uint64_t(n) * elem_));
  SF_CHECK(uint64_t(first) * elem_ + bytes <= state_.work_span(blob), "weight stream: a piece past the working copy");
  const int r = next_;
  next_ = (next_ + 1) % ring_;
  cur_ = r;
  char* buf = slot(r);
  dev_.wait(*io_, *free_[size_t(r)]);  // h2d copied out what it held
  dev_.wait(*io_, updated);            // the update that wrote it has run (its write-back may be in flight)
  NvmeStore* store = &store_;
  StateStream* state = &state_;
  dev_.host_fn(*io_, [store, state, blob, at, buf, bytes] {
    // A failure is the store's (NvmeStore::check, which stops the run at its next step): kept
    // there, not in this stream, whose synchronisation in the destructor must not throw.
    try {
      state->wait_written(blob);
      store->read_wait(at, buf, bytes);
    } catch (const std::exception&) {
    }
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
