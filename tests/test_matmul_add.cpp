// Ops::matmul_add on the cpu device (the CUDA kernel's twin): out = op(a) @ op(b) + c is, bit for
// bit, the product rounded to out's dtype and then the add (the two ops the layer program ran
// before), with c a separate tensor (left as it was) or out itself, F32 and BF16, odd shapes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/device.h"
#include "test_util.h"

namespace sf {
namespace {

// The values of v stored as dtype dt in a fresh host buffer (bf16: rounded), as a tensor.
struct StoredValues {
  std::vector<uint8_t> bytes;
  Tensor t;
  StoredValues(const std::vector<float>& v, DType dt, std::initializer_list<int64_t> shape)
      : bytes(v.size() * dtype_size(dt)), t(nullptr, dt, shape) {
    t.data = bytes.data();
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::F32) {
        std::memcpy(&bytes[i * 4], &v[i], 4);
      } else {
        const bf16 h = float_to_bf16(v[i]);
        std::memcpy(&bytes[i * 2], &h, 2);
      }
    }
  }
};

TEST(MatmulAdd, EqualsMatmulThenAddOnTheCpuDevice) {
  auto dev = make_cpu_device();
  auto s = dev->create_stream();
  Ops& ops = dev->ops();
  struct Shape {
    int64_t M, N, K;
  };
  uint64_t seed = 10;
  for (const Shape sh : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{33, 65, 17}})
    for (DType dt : {DType::F32, DType::BF16})
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (int in_place = 0; in_place < 2; ++in_place) {
            SCOPED_TRACE(testing::Message() << sh.M << "x" << sh.N << "x" << sh.K << " " << dtype_name(dt)
                                            << " ta=" << ta << " tb=" << tb << " in_place=" << in_place);
            const auto av = test::randn(size_t(sh.M * sh.K), ++seed), bv = test::randn(size_t(sh.K * sh.N), ++seed);
            const auto cv = test::randn(size_t(sh.M * sh.N), ++seed, 2.f);
            StoredValues a(av, dt, {ta ? sh.K : sh.M, ta ? sh.M : sh.K});
            StoredValues b(bv, dt, {tb ? sh.N : sh.K, tb ? sh.K : sh.N});
            StoredValues c(cv, dt, {sh.M, sh.N}), c_before(cv, dt, {sh.M, sh.N});
            StoredValues fused(std::vector<float>(cv.size(), NAN), dt, {sh.M, sh.N});
            StoredValues two(std::vector<float>(cv.size(), NAN), dt, {sh.M, sh.N});
            // the two ops
            ops.matmul(two.t, a.t, b.t, ta != 0, tb != 0, 1.f, 0.f, *s);
            ops.add(two.t, two.t, c.t, *s);
            // fused, into a separate out or into c itself
            Tensor out = in_place ? c.t : fused.t;
            ops.matmul_add(out, a.t, b.t, ta != 0, tb != 0, c.t, *s);
            dev->synchronize(*s);
            if (!in_place) {
              EXPECT_EQ(c.bytes, c_before.bytes) << "c was written";
              EXPECT_EQ(fused.bytes, two.bytes);
            } else if (dt == DType::F32) {
              EXPECT_EQ(c.bytes, two.bytes);  // beta = 1: acc + c, the add's one fp32 rounding
            } else {
              // in place in bf16 the product meets c before its rounding (one rounding, not two)
              std::vector<float> x(cv.size()), y(cv.size());
              for (size_t i = 0; i < cv.size(); ++i) {
                bf16 hx, hy;
                std::memcpy(&hx, &c.bytes[i * 2], 2);
                std::memcpy(&hy, &two.bytes[i * 2], 2);
                x[i] = bf16_to_float(hx), y[i] = bf16_to_float(hy);
              }
              EXPECT_LE(test::rel_err(test::to_double(x), test::to_double(y)), 2e-2);
            }
          }
}

}  // namespace
}  // namespace sf
