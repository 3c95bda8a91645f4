// The front of the kernel table (backend/ops_check.h) on the cuda device: the same bad calls as the
// cpu test (tests/ops_check_cases.h), each refused before anything is launched.
#include <gtest/gtest.h>

#include <memory>

#include "../ops_check_cases.h"
#include "../test_util.h"
#include "backend/device.h"

namespace sf {
namespace {

TEST(CudaOpsCheck, CudaDeviceRefusesEveryBadCall) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto dev = make_cuda_device(size_t(64) << 20);
  test_ops_check::expect_all_refused(*dev);
}

// What the front lets through but the cuda kernels cannot do: refused by the kernels' own checks,
// before anything is launched.
TEST(CudaOpsCheck, CudaOwnLimitsAreRefused) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  // 256 MiB: a stream's 64 MiB of scratch (cuBLASLt workspace, kernel scratch) is taken at its first op.
  auto dev = make_cuda_device(size_t(256) << 20);
  auto s = dev->create_stream();
  char* base = static_cast<char*>(dev->alloc(size_t(1) << 20));
  auto at = [base](int slot, DType t, std::initializer_list<int64_t> dims) {
    return Tensor(base + size_t(slot) * 32768, t, dims);
  };
  AttnDims d;
  d.B = 1, d.T = 2, d.n_head = 1, d.n_kv_head = 1, d.head_dim = 520, d.scale = 0.06f;
  test::expect_check_failure(
      [&] {
        dev->ops().attention_forward(at(0, DType::BF16, {2, 520}), at(1, DType::F32, {2}), at(2, DType::BF16, {2, 520}),
                                     at(3, DType::BF16, {2, 520}), at(4, DType::BF16, {2, 520}), d, *s);
      },
      "attention.cu", "attention_forward: head_dim = 520");
  test::expect_check_failure([&] { dev->ops().cast(at(0, DType::F16, {8}), at(1, DType::F32, {8}), *s); },
                             "elementwise.cu", "cast: the cuda backend converts only between F32 and BF16");
  test::expect_check_failure(
      [&] {
        dev->ops().rmsnorm_backward(Tensor(), at(0, DType::F32, {8}), at(1, DType::F32, {4, 8}),
                                    at(2, DType::F32, {4, 8}), at(3, DType::F32, {8}), at(4, DType::F32, {4}), false,
                                    *s);
      },
      "rmsnorm.cu", "dx is required");
  test::expect_check_failure(
      [&] {
        dev->ops().matmul(at(0, DType::F32, {2, 2}), at(1, DType::BF16, {2, 3}), at(2, DType::F32, {3, 2}), false,
                          false, 1.f, 0.f, *s);
      },
      "matmul.cu", "does not support the dtypes a=BF16 b=F32");
  // The MoE grouped GEMMs take the dense matmul's dtypes (cuBLASLt per expert), refused before
  // their offsets are read.
  test::expect_check_failure(
      [&] {
        dev->ops().moe_grouped_matmul(at(0, DType::F32, {2, 2}), at(1, DType::BF16, {2, 3}), at(2, DType::F32, {1, 6}),
                                      at(3, DType::I32, {2}), true, 0.f, *s);
      },
      "matmul.cu", "moe_grouped_matmul: the cuda backend does not support the dtypes a=BF16 b=F32");
  test::expect_check_failure(
      [&] {
        dev->ops().moe_grouped_matmul_wgrad(at(0, DType::BF16, {1, 6}), at(1, DType::F32, {2, 2}),
                                            at(2, DType::F32, {2, 3}), at(3, DType::I32, {2}), *s);
      },
      "matmul.cu", "moe_grouped_matmul_wgrad: the cuda backend does not support the dtypes a=F32 b=F32 out=BF16");
  dev->synchronize(*s);
  dev->free(base);
}

}  // namespace
}  // namespace sf
