// Where the upload of a host blob into a GPU slot reads from (engine/slot_cache.h). Most blobs go
// up from their fp32 master (cast to the compute dtype on the GPU). A blob whose master lives in
// the NVMe store (docs/ENGINE.md "NVMe tier", level 4) goes up from its working copy, already in
// the compute dtype and copied as is; at level 5 that copy is in the store too and goes up a piece
// at a time through a small pinned ring (engine/weight_stream.h): for each piece [first, first + n)
// of `piece` elements (the last may be shorter), `begin` queues its read and h2d's wait for it and
// returns the buffer, h2d copies it into the slot, and `end` frees the buffer once that copy is
// queued. The slot cache calls them only when it really uploads (not for a blob still in a slot).
#pragma once
#include <cstdint>
#include <functional>

#include "backend/device.h"
#include "core/dtype.h"

namespace sf {

struct UploadSource {
  const void* data = nullptr;  // [numel] in dtype (unused with `begin`)
  DType dtype = DType::F32;    // F32 (cast on the GPU) or the compute dtype (copied as is)
  int64_t piece = 0;           // with `begin`: elements a piece
  std::function<const void*(Stream& h2d, int64_t first, int64_t n)> begin;  // [n] in dtype
  std::function<void(Stream& h2d)> end;
};

}  // namespace sf
