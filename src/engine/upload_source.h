// Where the upload of a host blob into a GPU slot reads from (engine/slot_cache.h). Most blobs go
// up from their fp32 master (cast to the compute dtype on the GPU). A blob whose master lives in
// the NVMe store (docs/ENGINE.md "NVMe tier", level 3) goes up from its working copy, already in
// the compute dtype and copied as is; at level 4 that copy is in the store too and is read into a
// pinned ring first (engine/weight_stream.h): `begin` queues the read and h2d's wait for it and
// returns the buffer, `end` frees the buffer once h2d has copied it out. The slot cache calls them
// only when it really uploads (not for a blob still in a slot).
#pragma once
#include <functional>

#include "backend/device.h"
#include "core/dtype.h"

namespace sf {

struct UploadSource {
  const void* data = nullptr;  // [numel] in dtype (with `begin`: what begin returns)
  DType dtype = DType::F32;    // F32 (cast on the GPU) or the compute dtype (copied as is)
  std::function<const void*(Stream& h2d)> begin;
  std::function<void(Stream& h2d)> end;
};

}  // namespace sf
