// The router statistics of the load-balancing loss (model/program.h BatchDims::moe_stats): one
// F32 [2, E] block per micro-batch of a step, on the device, listed like every engine buffer.
#pragma once
#include "backend/device.h"
#include "engine/buffers.h"
#include "model/program.h"
#include "model/spec.h"

namespace sf {

// Empty unless the model has MoE layers with the loss on (output_router_logits).
MemoryItems moe_stats_buffers(const ModelSpec& s, int micro_batches);

// Points d at block j of `buf` (from moe_stats_buffers), weighted for a step of K micro-batches
// (each micro-batch's loss counts 1/K, as its cross-entropy's share does on average), and zeroes
// the block on `st`. Leaves d alone when buf is empty.
void bind_moe_stats(BatchDims& d, const ModelSpec& s, const DeviceBuffer& buf, int j, int K, Ops& ops, Stream& st);

}  // namespace sf
