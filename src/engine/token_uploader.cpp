#include "engine/token_uploader.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace sf {

TokenUploader::TokenUploader(Device& dev, const TokenUploaderOptions& o)
    : dev_(dev), max_tokens_(o.max_tokens), h2d_(dev.create_stream()), slots_(size_t(std::max(o.slots, 1))) {
  BufferSource src(dev, buffers(o));
  for (Slot& s : slots_) {
    s.host = src.buffer("tokens.staging");
    s.dev = src.buffer("tokens.device");
    s.uploaded = dev.create_event();
    s.consumed = dev.create_event();
  }
}

MemoryItems TokenUploader::buffers(const TokenUploaderOptions& o) {
  const size_t bytes = size_t(o.max_tokens) * kBytesPerToken, n = size_t(std::max(o.slots, 1));
  return {{"token ids / targets / positions", bytes, Place::Device, "tokens.device", n},
          {"token staging", bytes, Place::Pinned, "tokens.staging", n}};
}

TokenUploader::Tokens TokenUploader::upload(const Batch& b, Stream& compute) {
  const int64_t N = b.N();
  SF_CHECK(N <= max_tokens_, "batch larger than the token buffers");
  SF_CHECK(
      int64_t(b.ids.size()) == N && int64_t(b.targets.size()) == N && (b.pos.empty() || int64_t(b.pos.size()) == N),
      "batch arrays are not [B*T]");
  const bool packed = !b.pos.empty();
  current_ = next_;
  next_ = (next_ + 1) % int(slots_.size());
  Slot& s = slots_[current_];
  // Staging is rewritten once its previous copy is done; the device slot once the compute that
  // read it (two micro-batches ago) is done.
  dev_.synchronize(*s.uploaded);
  int32_t* staged = static_cast<int32_t*>(s.host.data());
  std::memcpy(staged, b.ids.data(), size_t(N) * 4);
  std::memcpy(staged + max_tokens_, b.targets.data(), size_t(N) * 4);
  if (packed) std::memcpy(staged + 2 * max_tokens_, b.pos.data(), size_t(N) * 4);
  int32_t* on_dev = static_cast<int32_t*>(s.dev.data());
  dev_.wait(*h2d_, *s.consumed);
  dev_.copy(on_dev, staged, size_t(N) * 4, CopyKind::HostToDevice, *h2d_);
  dev_.copy(on_dev + max_tokens_, staged + max_tokens_, size_t(N) * 4, CopyKind::HostToDevice, *h2d_);
  if (packed)
    dev_.copy(on_dev + 2 * max_tokens_, staged + 2 * max_tokens_, size_t(N) * 4, CopyKind::HostToDevice, *h2d_);
  dev_.record(*s.uploaded, *h2d_);
  dev_.wait(compute, *s.uploaded);
  return Tokens{Tensor(on_dev, DType::I32, {N}), Tensor(on_dev + max_tokens_, DType::I32, {N}),
                packed ? Tensor(on_dev + 2 * max_tokens_, DType::I32, {N}) : Tensor(), current_};
}

void TokenUploader::done(Stream& compute) {
  if (current_ >= 0) dev_.record(*slots_[current_].consumed, compute);
}

void TokenUploader::done(int slot, Stream& compute) { dev_.record(*slots_[size_t(slot)].consumed, compute); }

void TokenUploader::synchronize() { dev_.synchronize(*h2d_); }

}  // namespace sf
