// RoPE cos/sin tables of a model, built on the host once and uploaded to a device.
#pragma once
#include "backend/device.h"
#include "engine/buffers.h"
#include "model/program.h"
#include "model/spec.h"

namespace sf {

struct DeviceRope {
  DeviceRope(Device& dev, const ModelSpec& spec, int max_T, Stream& s);  // waits for the upload
  static MemoryItems buffers(const ModelSpec& spec, int max_T);          // "rope"
  DeviceBuffer buf;  // [2 or 4 (local RoPE), max_T, head_dim/2] F32
  RopeTables tables;                                                     // views into buf
};

}  // namespace sf
