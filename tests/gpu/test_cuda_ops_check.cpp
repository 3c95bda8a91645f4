// The front of the kernel table (backend/ops_check.h) on the cuda device: the same bad calls as the
// cpu test (tests/ops_check_cases.h), each refused before anything is launched.
#include <gtest/gtest.h>

#include <memory>

#include "../ops_check_cases.h"
#include "backend/device.h"

namespace sf {
namespace {

TEST(CudaOpsCheck, CudaDeviceRefusesEveryBadCall) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(64) << 20);
  test_ops_check::expect_all_refused(*dev);
}

}  // namespace
}  // namespace sf
