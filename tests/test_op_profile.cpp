// ProfiledDevice (backend/op_profile.h) on the cpu backend: every call reaches the wrapped device
// with its results unchanged, each op is counted once a call with its FLOPs and bytes, the times
// add up per stream, and reset drops what was recorded.
#include <gtest/gtest.h>

#include <vector>

#include "backend/op_profile.h"
#include "test_util.h"

namespace sf {
namespace {

const OpRow* find_row(const std::vector<OpRow>& rows, const std::string& key) {
  for (const OpRow& r : rows)
    if (r.key == key) return &r;
  return nullptr;
}

TEST(OpProfile, CountsEveryCallAndForwardsIt) {
  ProfiledDevice dev(make_cpu_device());
  auto s = dev.create_stream();
  const int64_t M = 5, N = 7, K = 3;
  auto a = test::randn(size_t(M * K), 1), b = test::randn(size_t(N * K), 2);
  std::vector<float> out(size_t(M * N), 0.f), ref(size_t(M * N), 0.f), sum(size_t(M * N));
  auto direct = make_cpu_device();
  auto ds = direct->create_stream();
  direct->ops().matmul(test::view_of(ref, {M, N}), test::view_of(a, {M, K}), test::view_of(b, {N, K}), false, true,
                       1.f, 0.f, *ds);
  direct->synchronize(*ds);

  for (int i = 0; i < 3; ++i)
    dev.ops().matmul(test::view_of(out, {M, N}), test::view_of(a, {M, K}), test::view_of(b, {N, K}), false, true, 1.f,
                     0.f, *s);
  dev.ops().add(test::view_of(sum, {M, N}), test::view_of(out, {M, N}), test::view_of(ref, {M, N}), *s);
  dev.synchronize(*s);
  EXPECT_EQ(out, ref) << "the profiled table must compute what the device's own does";
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(sum[i], out[i] + ref[i]);

  dev.collect();
  const std::vector<OpRow> rows = dev.rows();
  ASSERT_EQ(rows.size(), 2u);
  const OpRow* mm = find_row(rows, "matmul 5x7 K3 NT f32");
  const OpRow* add = find_row(rows, "add 5x7");
  ASSERT_NE(mm, nullptr);
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(mm->calls, 3);
  EXPECT_DOUBLE_EQ(mm->flops, 3 * 2.0 * M * N * K);
  EXPECT_DOUBLE_EQ(mm->bytes, 3 * 4.0 * (M * K + N * K + M * N));  // a, b read; out written
  EXPECT_EQ(add->calls, 1);
  EXPECT_DOUBLE_EQ(add->flops, 0.0);
  EXPECT_DOUBLE_EQ(add->bytes, 3 * 4.0 * M * N);
  EXPECT_GE(mm->seconds, 0.0);
  const std::vector<double> per_stream = dev.stream_seconds();
  ASSERT_EQ(per_stream.size(), 1u);
  EXPECT_NEAR(per_stream[0], mm->seconds + add->seconds, 1e-12);

  const OpCeilings c;
  EXPECT_DOUBLE_EQ(mm->floor_seconds(c), std::max(mm->flops / c.matrix_flops, mm->bytes / c.memory_bytes));
  const std::string table = dev.table(c, 1, 1e-3);
  EXPECT_NE(table.find("matmul 5x7 K3 NT f32"), std::string::npos) << table;
  EXPECT_NE(table.find("sum of ops"), std::string::npos) << table;
  const nlohmann::json j = dev.json(c, 1, 1e-3);
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["calls_per_step"].get<double>() + j["rows"][1]["calls_per_step"].get<double>(), 4.0);

  // reset: the rows recorded so far are gone; later calls count from zero.
  dev.reset();
  EXPECT_TRUE(dev.rows().empty());
  dev.ops().add(test::view_of(sum, {M, N}), test::view_of(out, {M, N}), test::view_of(ref, {M, N}), *s);
  dev.collect();
  ASSERT_EQ(dev.rows().size(), 1u);
  EXPECT_EQ(dev.rows()[0].calls, 1);
}

// A call the checking front refuses records no time and no row, and the profile goes on.
TEST(OpProfile, RefusedCallLeavesNoRow) {
  ProfiledDevice dev(make_cpu_device());
  auto s = dev.create_stream();
  std::vector<float> x(6), y(4);
  EXPECT_ANY_THROW(dev.ops().add(test::view_of(x, {2, 3}), test::view_of(x, {2, 3}), test::view_of(y, {2, 2}), *s));
  dev.synchronize(*s);
  dev.collect();
  EXPECT_TRUE(dev.rows().empty());
}

}  // namespace
}  // namespace sf
