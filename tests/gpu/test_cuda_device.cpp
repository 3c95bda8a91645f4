// The cuda device's creation: the GPU chosen by its ordinal, an ordinal that names no GPU refused as
// the user's input, the backend identified by its kind, and the default arena sized by the same
// function as the planner's default GPU budget.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backend/device.h"
#include "core/error.h"

namespace sf {
namespace {

TEST(CudaDevice, OrdinalChoosesTheGpuAndAMissingOneIsRefused) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  for (int ordinal = 0; ordinal < n; ++ordinal) {
    auto dev = make_device("cuda", size_t(256) << 20, ordinal);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, ordinal);
    EXPECT_FALSE(dev->is_host());
  }
  for (const int bad : {n, n + 7, -1}) {
    try {
      make_cuda_device(size_t(256) << 20, bad);
      ADD_FAILURE() << "ordinal " << bad << " accepted with " << n << " GPUs";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("no CUDA GPU " + std::to_string(bad)), std::string::npos) << what;
    }
  }
}

TEST(CudaDevice, KindAndDefaultBudget) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const BackendInfo be = backend_info("cuda", 0);
  EXPECT_EQ(be.kind, DeviceKind::Cuda);
  EXPECT_STREQ(device_kind_name(be.kind), "cuda");
  EXPECT_EQ(backend_info("cpu").kind, DeviceKind::Cpu);
  ASSERT_GT(be.device_free, size_t(0));
  const size_t budget = default_gpu_budget(be.device_free);
  EXPECT_EQ(budget % 256, size_t(0));
  EXPECT_LE(budget, be.device_free);
  EXPECT_GE(double(budget), 0.9 * double(be.device_free) - 256);
}

}  // namespace
}  // namespace sf
