// The cpu device's kernel table for the CPU kernel tests (test_cpu_kernels*.cpp).
#pragma once
#include <limits>
#include <memory>

#include "backend/device.h"

namespace sf::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Argument checks live in the front of the kernel table (backend/ops_check.h), which every Device
// hands out: the calls that must be refused go through the cpu device's table. The front throws on
// the caller's thread, before anything is queued.
struct CpuFront {
  std::unique_ptr<Device> dev = make_cpu_device();
  std::unique_ptr<Stream> s = dev->create_stream();
  Ops& ops() { return dev->ops(); }
};

}  // namespace sf::test
