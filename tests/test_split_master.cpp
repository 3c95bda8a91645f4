// Split masters (core/split_master.h): an fp32 master stored as its bf16 rounding, its low 16 bits
// and a tie bit. The round trip over every low half (ties of odd and even high halves, signs,
// subnormals, the largest finite values that round to infinity, infinities, NaN), and
// cpu::adamw_split against cpu::adamw on the joined master with a bf16 copy: every kernel path,
// both passes of the split update, rows, fp32 and bf16 state, many ties, threads sharing tie bytes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/split_master.h"
#include "test_util.h"

namespace sf {
namespace {

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t to_bits(float f) { return std::bit_cast<uint32_t>(f); }

// A split master of n elements whose tie bits start at bit `tie_first` of its bitmap.
struct Split {
  std::vector<uint16_t> hi, lo;
  std::vector<uint8_t> ties;
  int64_t tie_first;
  Split(int64_t n, int64_t first) : hi(size_t(n)), lo(size_t(n)), ties(split_tie_bytes(n + first)), tie_first(first) {}
  SplitMaster view() { return {hi.data(), lo.data(), ties.data(), tie_first}; }
  void store(const std::vector<float>& x) {
    for (size_t i = 0; i < x.size(); ++i) split_store(view(), int64_t(i), x[i]);
  }
  std::vector<float> join() {
    std::vector<float> x(hi.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = split_join(view(), int64_t(i));
    return x;
  }
};

// Every low half under high halves of both parities and signs, subnormal and near the top: the
// pattern comes back exactly and `hi` is the nearest-even bf16 (the upload's cast).
TEST(SplitMaster, EveryPatternComesBack) {
  const uint32_t highs[] = {0x0000, 0x0001, 0x0002, 0x3f80, 0x3f81, 0x7f7f,
                            0x7f7e, 0x8000, 0x8001, 0xbf80, 0xbf81, 0xff7f};
  std::vector<float> x;
  for (uint32_t h : highs)
    for (uint32_t l = 0; l < 0x10000; ++l) x.push_back(from_bits((h << 16) | l));
  x.push_back(INFINITY);
  x.push_back(-INFINITY);
  Split s(int64_t(x.size()), 5);
  // A stale tie bit under a low half that is not a tie is never read: set them all first.
  std::fill(s.ties.begin(), s.ties.end(), uint8_t(0xff));
  s.store(x);
  const std::vector<float> y = s.join();
  int64_t ties = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(to_bits(y[i]), to_bits(x[i])) << std::hex << to_bits(x[i]);
    ASSERT_EQ(s.hi[i], float_to_bf16(x[i]).bits) << std::hex << to_bits(x[i]);
    ties += (to_bits(x[i]) & 0xffffu) == 0x8000u;
  }
  EXPECT_EQ(ties, int64_t(std::size(highs)));  // every high half had its tie
  // 0x7f7f8000 and above round to infinity: hi says so, the pattern is kept.
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7fffffu)).bits, 0x7f80u);
  // NaN: a NaN comes back (not its payload), hi the quiet NaN of the cast.
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fff8000u, 0x7f808000u}) {
    Split n(1, 3);
    n.store({from_bits(u)});
    EXPECT_TRUE(std::isnan(n.join()[0])) << std::hex << u;
    EXPECT_EQ(n.hi[0], float_to_bf16(from_bits(u)).bits);
  }
}

// Masters of which a quarter are ties (of both parities), the rest random; gradients random.
std::vector<float> masters(int64_t n, uint32_t seed) {
  std::vector<float> p = test::randn(size_t(n), seed);
  std::mt19937 r(seed);
  for (auto& x : p)
    if (r() % 4 == 0) x = from_bits((to_bits(x) & 0xffff0000u) | 0x8000u);
  return p;
}

// adamw_split = adamw on the fp32 master with a bf16 copy, bit for bit: the joined master, the
// high half against the copy, m and v. Lengths across the thread pool's pieces (whose bounds do
// not fall on tie bytes: `tie_first` odd), steps with lr 0 (every tie stays a tie) and without.
TEST(SplitMaster, AdamWGivesTheBitsOfTheFp32Master) {
  for (int64_t n : {int64_t(1), int64_t(13), int64_t(37), int64_t(300007)})
    for (DType sd : {DType::F32, DType::BF16})
      for (const char* isa : test::kAdamwIsas) {
        SCOPED_TRACE("n " + std::to_string(n) + " state " + dtype_name(sd) + " isa " + (isa ? isa : "best"));
        test::AdamwIsaScope scope(isa);
        std::vector<float> p = masters(n, 71);
        Split s(n, 3);
        s.store(p);
        const std::vector<float> m0 = test::randn(size_t(n), 72, 1e-3f);
        std::vector<float> v0(static_cast<size_t>(n));
        for (size_t i = 0; i < v0.size(); ++i) v0[i] = m0[i] * m0[i] * 3.f;
        test::HostTensor m(m0, sd, {n}), v(v0, sd, {n}), ms(m0, sd, {n}), vs(v0, sd, {n});
        test::HostTensor copy(DType::BF16, {n});
        for (int step = 1; step <= 4; ++step) {
          const auto g = test::randn(size_t(n), uint32_t(80 + step), 1e-2f);
          test::HostTensor gb(test::round_bf16(g), DType::BF16, {n});
          AdamWParams a;
          a.lr = step == 2 ? 0.f : 1e-3f, a.weight_decay = 0.1f, a.step = step, a.grad_scale = 0.7f;
          a.round_seed = 9, a.blob = 2, a.first = 11;
          cpu::adamw(test::view_of(p, {n}), gb.t(), m.t(), v.t(), copy.t(), a);
          if (step == 3) {  // the split update's two passes
            cpu::adamw_split(s.view(), gb.t(), ms.t(), vs.t(), a, cpu::AdamWPart::Params);
            cpu::adamw_split(s.view(), gb.t(), ms.t(), vs.t(), a, cpu::AdamWPart::Moments);
          } else {
            cpu::adamw_split(s.view(), gb.t(), ms.t(), vs.t(), a);
          }
          const std::vector<float> joined = s.join();
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(to_bits(joined[size_t(i)]), to_bits(p[size_t(i)])) << "step " << step << " element " << i;
            ASSERT_EQ(s.hi[size_t(i)], copy.t().ptr<bf16>()[i].bits) << "step " << step << " element " << i;
          }
          ASSERT_EQ(std::memcmp(ms.t().data, m.t().data, size_t(n) * dtype_size(sd)), 0) << "step " << step;
          ASSERT_EQ(std::memcmp(vs.t().data, v.t().data, size_t(n) * dtype_size(sd)), 0) << "step " << step;
        }
      }
}

// Some rows only (the embedding's two parts): the rows not selected keep their halves and tie
// bits; the selected ones get the fp32 master's bits.
TEST(SplitMaster, AdamWOfSomeRows) {
  const int64_t row = 24, rows = 41, n = row * rows;
  std::vector<float> p = masters(n, 90);
  Split s(n, 0);
  s.store(p);
  std::vector<uint8_t> flags(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) flags[size_t(r)] = uint8_t(r % 3 == 1);
  const cpu::RowSelect sel{flags.data(), row, 1};
  test::HostTensor m(DType::F32, {n}), v(DType::F32, {n}), ms(DType::F32, {n}), vs(DType::F32, {n});
  test::HostTensor copy(std::vector<float>(p), DType::BF16, {n});
  const auto g = test::randn(size_t(n), 91, 1e-2f);
  AdamWParams a;
  a.lr = 1e-2f, a.step = 1;
  std::vector<float> g1 = g, g2 = g;
  cpu::adamw(test::view_of(p, {n}), test::view_of(g1, {n}), m.t(), v.t(), copy.t(), a, cpu::AdamWPart::All, &sel);
  cpu::adamw_split(s.view(), test::view_of(g2, {n}), ms.t(), vs.t(), a, cpu::AdamWPart::All, &sel);
  const std::vector<float> joined = s.join();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(to_bits(joined[size_t(i)]), to_bits(p[size_t(i)])) << i;
    ASSERT_EQ(s.hi[size_t(i)], copy.t().ptr<bf16>()[i].bits) << i;
  }
}

}  // namespace
}  // namespace sf
