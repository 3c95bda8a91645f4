// The cpu backend's Device: host memory, streams emulated by one worker thread each (FIFO),
// events with CUDA's record / stream-wait / host-wait semantics.
#pragma once
#include "backend/device.h"

namespace sf {

struct CpuDeviceOptions {
  // Race testing: each stream task sleeps a random 0..max_delay_us first (seeded, per stream).
  int max_delay_us = 0;
  // ...and one task in stall_every (0 = never) stalls for stall_us more: a stream that falls far
  // behind the others exposes a missing wait that uniform small delays rarely do.
  int stall_us = 0;
  int stall_every = 0;
  uint64_t stall_streams = ~uint64_t(0);  // bit i: the i-th stream created stalls
  uint64_t delay_seed = 1;
};

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& opt);

}  // namespace sf
