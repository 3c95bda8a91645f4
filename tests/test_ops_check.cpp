// The front of the kernel table (backend/ops_check.h) on the cpu device: every kind of bad argument
// of every operation is refused on the caller's thread with the op and the argument named, and
// valid calls still reach the kernels. The cuda device runs the same list (gpu/test_cuda_ops_check.cpp).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/device.h"
#include "backend/ops_check.h"
#include "ops_check_cases.h"

namespace sf {
namespace {

TEST(OpsCheck, CpuDeviceRefusesEveryBadCall) {
  auto dev = make_cpu_device();
  test_ops_check::expect_all_refused(*dev);
}

TEST(OpsCheck, ValidCallsAreForwarded) {
  auto dev = make_cpu_device();
  auto s = dev->create_stream();
  std::vector<float> a = {1, 2, 3}, b = {10, 20, 30}, out(3);
  dev->ops().add(Tensor(out.data(), DType::F32, {3}), Tensor(a.data(), DType::F32, {3}),
                 Tensor(b.data(), DType::F32, {3}), *s);
  dev->synchronize(*s);
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33}));
}

TEST(OpsCheck, MessageNamesOpArgumentAndExpectation) {
  std::vector<float> buf(64);
  const Tensor x(buf.data(), DType::F32, {4, 8}), w(buf.data() + 32, DType::F32, {7});
  try {
    opcheck::rmsnorm_forward(x, Tensor(), x, w);
    FAIL() << "not refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm_forward: w [7] F32 has 7 elements, expected C = 8"),
              std::string::npos)
        << e.what();
  }
  // An exact alias of dx and x is allowed for the fused head (ops.h); a partial overlap is not.
  std::vector<int32_t> labels(4);
  const Tensor loss(buf.data() + 40, DType::F32, {1}), wv(buf.data() + 41, DType::F32, {2, 8});
  EXPECT_NO_THROW(opcheck::linear_cross_entropy(loss, Tensor(), Tensor(), Tensor(buf.data(), DType::F32, {0, 8}), wv,
                                                Tensor(labels.data(), DType::I32, {0}), Tensor(), 0));
  const Tensor x4(buf.data(), DType::F32, {1, 8}), dx_shift(buf.data() + 1, DType::F32, {1, 8});
  const Tensor lab1(labels.data(), DType::I32, {1});
  EXPECT_NO_THROW(
      opcheck::linear_cross_entropy(loss, x4, Tensor(), x4, wv, lab1, Tensor(buf.data(), DType::F32, {1}), 4));
  EXPECT_THROW(
      opcheck::linear_cross_entropy(loss, dx_shift, Tensor(), x4, wv, lab1, Tensor(buf.data(), DType::F32, {1}), 4),
      std::runtime_error);
}

}  // namespace
}  // namespace sf
