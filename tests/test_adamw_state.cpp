// Compact optimizer state: cpu::adamw with bf16 m and v, written back with unbiased stochastic
// rounding (core/stochastic_round.h). Every path of the kernel (AVX2, SSE2, scalar; fused and
// split passes) against a plain scalar reference, chunking, reproducibility, unbiasedness, and the
// reason it exists: round-to-nearest stalls v where stochastic rounding keeps it moving.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/kernels.h"
#include "core/stochastic_round.h"
#include "test_util.h"

namespace sf {
namespace {

using test::HostTensor;

uint16_t bits_of(const HostTensor& t, int64_t i) { return t.t().ptr<bf16>()[i].bits; }

// The reference: the documented update in fp32, one element at a time, written plainly (no
// templates, no vectors), with the rounding of core/stochastic_round.h.
struct Ref {
  std::vector<float> p;
  std::vector<uint16_t> m, v;  // bf16 bits
  void step(const std::vector<float>& g, const AdamWParams& a, int64_t first = 0) {
    const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
    const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
    const float w1 = float(1.0 - double(a.beta1)), c2 = float(1.0 - double(a.beta2));
    const float decay = float(1.0 - double(a.lr) * double(a.weight_decay)), bc2s = float(std::sqrt(bc2));
    const float neg_step = float(-(double(a.lr) / bc1));
    const uint64_t key = round_key(a.round_seed, a.step, a.blob);
    for (size_t i = 0; i < p.size(); ++i) {
      const float gi = g[i] * a.grad_scale;
      const float mo = bf16_to_float(bf16{m[i]}), vo = bf16_to_float(bf16{v[i]});
      const float mn = std::fabs(w1) < 0.5f ? mo + w1 * (gi - mo) : gi - (gi - mo) * (1.f - w1);
      const float vn = vo * a.beta2 + (c2 * gi) * gi;
      const float denom = std::sqrt(vn) / bc2s + a.eps;
      p[i] = p[i] * decay + neg_step * (mn / denom);
      const uint32_t r = round_bits(key, uint64_t(first + int64_t(i)));
      m[i] = bf16_bits_stochastic(float_bits(mn), r & 0xffffu);
      v[i] = bf16_bits_stochastic(float_bits(vn), r >> 16);
    }
  }
};

struct State {
  std::vector<float> p;
  HostTensor m, v;
  State(const std::vector<float>& p0, const std::vector<float>& m0, const std::vector<float>& v0)
      : p(p0), m(m0, DType::BF16, {int64_t(m0.size())}), v(v0, DType::BF16, {int64_t(v0.size())}) {}
  Tensor pt() { return test::view_of(p, {int64_t(p.size())}); }
};

// Every path, fused and split, both lerp branches, fp32 and bf16 gradients, several lengths (odd,
// shorter than a vector, across the thread pool's pieces): the bytes of the reference.
TEST(AdamWBf16State, EveryPathEqualsTheScalarReference) {
  for (int n : {1, 7, 37, 70001}) {
    const auto p0 = test::randn(size_t(n), 301), g = test::randn(size_t(n), 302, 1e-2f);
    auto m0 = test::randn(size_t(n), 303, 1e-3f);
    std::vector<float> v0(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) v0[size_t(i)] = m0[size_t(i)] * m0[size_t(i)] * 3.f;
    const auto gr = test::round_bf16(g);
    HostTensor gb(gr, DType::BF16, {n});
    for (float beta1 : {0.9f, 0.3f})
      for (bool bf16_grads : {false, true}) {
        AdamWParams a;
        a.lr = 1e-3f, a.beta1 = beta1, a.beta2 = 0.95f, a.weight_decay = 0.1f, a.grad_scale = 0.37f, a.step = 4;
        a.round_seed = 11, a.blob = 3, a.first = 1000;
        Ref ref{p0, {}, {}};
        for (int i = 0; i < n; ++i) {
          ref.m.push_back(float_to_bf16(m0[size_t(i)]).bits);
          ref.v.push_back(float_to_bf16(v0[size_t(i)]).bits);
        }
        ref.step(bf16_grads ? gr : g, a, a.first);
        for (const char* isa : test::kAdamwIsas) {
          SCOPED_TRACE(std::string("n ") + std::to_string(n) + " isa " + (isa ? isa : "best") + " beta1 " +
                       std::to_string(beta1) + " bf16 grads " + std::to_string(bf16_grads));
          test::AdamwIsaScope scope(isa);
          std::vector<float> g32 = g;
          const Tensor gt = bf16_grads ? gb.t() : test::view_of(g32, {n});
          State f(p0, m0, v0), s(p0, m0, v0);
          HostTensor cf(DType::BF16, {n});
          cpu::adamw(f.pt(), gt, f.m.t(), f.v.t(), cf.t(), a);
          EXPECT_EQ(f.p, ref.p);
          for (int i = 0; i < n; ++i) {
            ASSERT_EQ(bits_of(f.m, i), ref.m[size_t(i)]) << "m " << i;
            ASSERT_EQ(bits_of(f.v, i), ref.v[size_t(i)]) << "v " << i;
            ASSERT_EQ(bits_of(cf, i), float_to_bf16(f.p[size_t(i)]).bits) << "copy " << i;
          }
          // The split update: the parameter pass leaves m, v alone, the moment pass p; together the
          // fused pass's bits (the parameter pass used the unrounded m and v, as the fused one).
          const HostTensor m_before(s.m.f(), DType::BF16, {n}), v_before(s.v.f(), DType::BF16, {n});
          cpu::adamw(s.pt(), gt, s.m.t(), s.v.t(), Tensor(), a, cpu::AdamWPart::Params);
          EXPECT_EQ(s.p, f.p);
          EXPECT_EQ(std::memcmp(s.m.t().data, m_before.t().data, size_t(n) * 2), 0);
          EXPECT_EQ(std::memcmp(s.v.t().data, v_before.t().data, size_t(n) * 2), 0);
          cpu::adamw(s.pt(), gt, s.m.t(), s.v.t(), Tensor(), a, cpu::AdamWPart::Moments);
          EXPECT_EQ(s.p, f.p);
          EXPECT_EQ(std::memcmp(s.m.t().data, f.m.t().data, size_t(n) * 2), 0);
          EXPECT_EQ(std::memcmp(s.v.t().data, f.v.t().data, size_t(n) * 2), 0);
        }
      }
  }
}

// Non-finite values through every path: a NaN moment stays a NaN (the vector paths test NaN lanes
// apart from the draw, core/stochastic_round.h adds none), infinities stay infinite; the bits are
// the scalar reference's in every lane position (NaN and inf gradients at lanes 0..15 of a vector).
TEST(AdamWBf16State, NonFiniteValuesRoundAsTheScalarFunction) {
  const int n = 101;
  const auto p0 = test::randn(size_t(n), 321);
  auto g = test::randn(size_t(n), 322, 1e-2f);
  // NaNs with every payload bit set (0x7fffffff, 0xffffffff): the payload survives the arithmetic,
  // and adding a draw to it would carry into the sign (or out of 32 bits) and give a zero.
  const auto nan_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (int i = 0; i < n; i += 7)
    g[size_t(i)] = i % 2 ? nan_bits(i % 3 ? 0x7fffffffu : 0xffffffffu) : (i % 3 ? INFINITY : -INFINITY);
  auto m0 = test::randn(size_t(n), 323, 1e-3f);
  std::vector<float> v0(size_t(n), 1e-6f);
  m0[3] = NAN, v0[5] = NAN;  // NaN already in the state
  AdamWParams a;
  a.lr = 1e-3f, a.beta2 = 0.95f, a.step = 2, a.round_seed = 4, a.blob = 1;
  Ref ref{p0, {}, {}};
  for (int i = 0; i < n; ++i) {
    ref.m.push_back(float_to_bf16(m0[size_t(i)]).bits);
    ref.v.push_back(float_to_bf16(v0[size_t(i)]).bits);
  }
  ref.step(g, a);
  for (const char* isa : test::kAdamwIsas) {
    SCOPED_TRACE(isa ? isa : "best");
    test::AdamwIsaScope scope(isa);
    State f(p0, m0, v0);
    cpu::adamw(f.pt(), test::view_of(g, {n}), f.m.t(), f.v.t(), Tensor(), a);
    EXPECT_EQ(std::memcmp(f.p.data(), ref.p.data(), size_t(n) * 4), 0);
    int nan_m = 0;
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(bits_of(f.m, i), ref.m[size_t(i)]) << "m " << i;
      ASSERT_EQ(bits_of(f.v, i), ref.v[size_t(i)]) << "v " << i;
      nan_m += std::isnan(bf16_to_float(bf16{bits_of(f.m, i)}));
    }
    EXPECT_GE(nan_m, 8);  // the NaN gradients' and m0[3]'s
  }
}

// The kernel's rounding is unbiased where it matters, in the vector loops: one value between two
// bf16 neighbours in every element of a long moment pass; the mean of the stored m and v is that
// value within the sampling error (round-to-nearest would be off by 20 sigma).
TEST(AdamWBf16State, TheKernelsRoundingIsUnbiased) {
  const int n = 1 << 17;
  const float ulp = 1.f / 128;  // bf16 spacing in [1, 2)
  for (float frac : {0.2f, 0.7f})
    for (const char* isa : test::kAdamwIsas) {
      SCOPED_TRACE(std::string(isa ? isa : "best") + " frac " + std::to_string(frac));
      test::AdamwIsaScope scope(isa);
      // beta1 = beta2 = 0 and g = x: the new m is x and the new v is x * x exactly in fp32.
      const float x = 1.25f + frac * ulp;
      std::vector<float> p(size_t(n), 0.f), g(size_t(n), x);
      State s(p, std::vector<float>(size_t(n), 0.f), std::vector<float>(size_t(n), 0.f));
      AdamWParams a;
      a.beta1 = 0.f, a.beta2 = 0.f, a.step = 1, a.round_seed = 17, a.blob = 2;
      cpu::adamw(s.pt(), test::view_of(g, {n}), s.m.t(), s.v.t(), Tensor(), a, cpu::AdamWPart::Moments);
      double sm = 0, sv = 0;
      for (int i = 0; i < n; ++i) sm += s.m.get(i), sv += s.v.get(i);
      const double xv = double(x) * double(x);  // in [1.5625, 1.583): exact in fp32, same spacing as x
      const double fv = std::fmod(xv, ulp) / ulp;
      const double sigma_m = ulp * std::sqrt(frac * (1 - frac) / n);
      const double sigma_v = ulp * std::sqrt(std::max(fv * (1 - fv), 1e-4) / n);
      EXPECT_NEAR(sm / n, x, 5 * sigma_m);
      EXPECT_NEAR(sv / n, xv, 5 * sigma_v);
      EXPECT_GT(std::fabs(test::round_bf16(x) - x), 20 * sigma_m);
    }
}

// The stream is keyed by (seed, step, blob, index within the blob): the same call gives the same
// bytes; a blob updated in chunks (AdamWParams::first) gives the bytes of one call; another seed,
// step or blob draws other bits.
TEST(AdamWBf16State, ReproducibleAndIndependentOfChunking) {
  const int n = 50021;
  const auto p0 = test::randn(size_t(n), 311), g = test::randn(size_t(n), 312, 1e-2f);
  const std::vector<float> z(size_t(n), 0.f);
  AdamWParams a;
  a.lr = 1e-3f, a.step = 1, a.round_seed = 5, a.blob = 2;
  auto run = [&](const AdamWParams& q, std::vector<int> cuts) {
    State s(p0, z, z);
    std::vector<float> gg = g;
    cuts.insert(cuts.begin(), 0);
    cuts.push_back(n);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int i0 = cuts[c], len = cuts[c + 1] - cuts[c];
      AdamWParams part = q;
      part.first = i0;
      cpu::adamw(Tensor(s.p.data() + i0, DType::F32, {len}), Tensor(gg.data() + i0, DType::F32, {len}),
                 Tensor(s.m.t().ptr<bf16>() + i0, DType::BF16, {len}),
                 Tensor(s.v.t().ptr<bf16>() + i0, DType::BF16, {len}), Tensor(), part);
    }
    std::vector<uint16_t> out(size_t(2 * n));
    std::memcpy(out.data(), s.m.t().data, size_t(n) * 2);
    std::memcpy(out.data() + n, s.v.t().data, size_t(n) * 2);
    return out;
  };
  const auto whole = run(a, {});
  EXPECT_EQ(run(a, {}), whole);
  EXPECT_EQ(run(a, {37}), whole);
  EXPECT_EQ(run(a, {1, 2, 3, 4097, 33333}), whole);
  // Another seed, blob or step: other draws (m and v do not depend on the step's bias corrections,
  // so their fp32 values are the same in all four runs). A value rounds the other way in about a
  // third of the elements.
  for (int which = 0; which < 3; ++which) {
    AdamWParams b = a;
    if (which == 0) b.round_seed += 1;
    if (which == 1) b.blob += 1;
    if (which == 2) b.step += 1;
    const auto other = run(b, {});
    size_t differ = 0;
    for (size_t i = 0; i < whole.size(); ++i) differ += whole[i] != other[i];
    EXPECT_GT(differ, whole.size() / 8) << "seed, blob, step: " << which;
  }
}

// cpu::RowSelect (the sliding engine's embedding, updated in two parts a step): the selected rows'
// elements get exactly the bits of the whole update, the others keep theirs, and the two parts
// together equal the whole update — on every path, fp32 and bf16 state, with a parameter copy,
// odd rows (97) over calls that start inside a row (first 1000), runs of selected rows that cross
// the thread pool's pieces.
TEST(AdamWBf16State, RowSelectUpdatesExactlyTheSelectedRows) {
  const int n = 50021, len = 97, first = 1000;  // rows (first + i) / len
  const int rows = (first + n + len - 1) / len;
  const auto p0 = test::randn(size_t(n), 321), g = test::randn(size_t(n), 322, 1e-2f);
  const auto m0 = test::randn(size_t(n), 323, 1e-3f);
  std::vector<float> v0 = test::randn(size_t(n), 324, 1e-3f);
  for (float& x : v0) x = x * x;
  std::vector<uint8_t> flags(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) flags[size_t(r)] = uint8_t((r % 7 == 0) || (r > 200 && r < 300));  // runs too
  AdamWParams a;
  a.lr = 1e-3f, a.step = 3, a.round_seed = 9, a.blob = 0, a.first = first, a.weight_decay = 0.1f;
  struct Out {
    std::vector<float> p;
    std::vector<uint8_t> m, v, copy;
  };
  for (const char* isa : test::kAdamwIsas)
    for (const DType sd : {DType::F32, DType::BF16}) {
      test::AdamwIsaScope scope(isa);
      // Parts given by `want`s (empty: one call, no selection).
      auto run = [&](const std::vector<int>& wants) {
        HostTensor m(m0, sd, {n}), v(v0, sd, {n});
        std::vector<float> p = p0, gg = g;
        std::vector<uint16_t> copy(size_t(n), 0);
        const Tensor ct(copy.data(), DType::BF16, {n});
        auto call = [&](const cpu::RowSelect* sel) {
          cpu::adamw(test::view_of(p, {n}), test::view_of(gg, {n}), m.t(), v.t(), ct, a, cpu::AdamWPart::All, sel);
        };
        if (wants.empty()) call(nullptr);
        for (const int w : wants) {
          const cpu::RowSelect sel{flags.data(), len, uint8_t(w)};
          call(&sel);
        }
        const size_t sb = dtype_size(sd);
        Out o{p, std::vector<uint8_t>(size_t(n) * sb), std::vector<uint8_t>(size_t(n) * sb),
              std::vector<uint8_t>(size_t(n) * 2)};
        std::memcpy(o.m.data(), m.t().data, o.m.size());
        std::memcpy(o.v.data(), v.t().data, o.v.size());
        std::memcpy(o.copy.data(), copy.data(), o.copy.size());
        return o;
      };
      const Out whole = run({}), both = run({0, 1}), touched = run({1});
      const std::string at = std::string(isa ? isa : "widest") + (sd == DType::BF16 ? " bf16" : " fp32");
      EXPECT_EQ(both.p, whole.p) << at;
      EXPECT_EQ(both.m, whole.m) << at;
      EXPECT_EQ(both.v, whole.v) << at;
      EXPECT_EQ(both.copy, whole.copy) << at;
      const HostTensor m_in(m0, sd, {n}), v_in(v0, sd, {n});
      const size_t sb = dtype_size(sd);
      int selected = 0, kept = 0;
      for (int i = 0; i < n; ++i) {
        const bool sel = flags[size_t((first + i) / len)] == 1;
        selected += sel;
        kept += !sel;
        const float want_p = sel ? whole.p[size_t(i)] : p0[size_t(i)];
        ASSERT_EQ(std::memcmp(&touched.p[size_t(i)], &want_p, 4), 0) << at << " element " << i;
        const uint8_t* wm =
            sel ? &whole.m[size_t(i) * sb] : static_cast<const uint8_t*>(m_in.t().data) + size_t(i) * sb;
        const uint8_t* wv =
            sel ? &whole.v[size_t(i) * sb] : static_cast<const uint8_t*>(v_in.t().data) + size_t(i) * sb;
        ASSERT_EQ(std::memcmp(&touched.m[size_t(i) * sb], wm, sb), 0) << at << " m element " << i;
        ASSERT_EQ(std::memcmp(&touched.v[size_t(i) * sb], wv, sb), 0) << at << " v element " << i;
        const uint16_t zero = 0;
        ASSERT_EQ(std::memcmp(&touched.copy[size_t(i) * 2],
                              sel ? &whole.copy[size_t(i) * 2] : reinterpret_cast<const uint8_t*>(&zero), 2),
                  0)
            << at << " copy element " << i;
      }
      EXPECT_GT(selected, n / 4) << at;
      EXPECT_GT(kept, n / 4) << at;
    }
}

// The draws: each 16-bit half uniform, and the rounding unbiased: the mean of many roundings of one
// value is that value (within the sampling error), where round-to-nearest is off by its offset.
TEST(StochasticRounding, UnbiasedAndUniform) {
  // Uniformity of the two halves of round_bits over consecutive indices and several keys: a
  // chi-square over 64 buckets (63 degrees of freedom: mean 63, sd ~11; 150 is far out).
  for (uint64_t key : {round_key(0, 1, 0), round_key(1, 1, 0), round_key(0, 2, 7)}) {
    for (int half = 0; half < 2; ++half) {
      std::vector<double> bucket(64, 0.0);
      const int N = 1 << 18;
      for (int i = 0; i < N; ++i) {
        const uint32_t r = round_bits(key, uint64_t(i));
        bucket[((half ? r >> 16 : r) & 0xffffu) >> 10] += 1;
      }
      double chi = 0;
      for (double b : bucket) chi += (b - N / 64.0) * (b - N / 64.0) / (N / 64.0);
      EXPECT_LT(chi, 150.0) << "half " << half;
    }
  }
  // No correlation between neighbouring elements' draws, between the m and v halves of one draw,
  // nor between one element's draws at consecutive steps; that element's draws over the steps are
  // uniform too (N = 2^18: a correlation's sampling sd is 0.002).
  {
    const int N = 1 << 18;
    auto corr = [&](auto x, auto y) {
      double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
      for (int i = 0; i < N; ++i) {
        const double a = x(i), b = y(i);
        sx += a, sy += b, sxx += a * a, syy += b * b, sxy += a * b;
      }
      const double cov = sxy / N - sx / N * sy / N;
      return cov / std::sqrt((sxx / N - sx / N * sx / N) * (syy / N - sy / N * sy / N));
    };
    const uint64_t key = round_key(3, 10, 2);
    auto lo16 = [&](uint64_t k, uint64_t i) { return double(round_bits(k, i) & 0xffffu); };
    auto hi16 = [&](uint64_t k, uint64_t i) { return double(round_bits(k, i) >> 16); };
    EXPECT_LT(std::fabs(corr([&](int i) { return lo16(key, i); }, [&](int i) { return lo16(key, i + 1); })), 0.01);
    EXPECT_LT(std::fabs(corr([&](int i) { return lo16(key, i); }, [&](int i) { return hi16(key, i); })), 0.01);
    auto at_step = [&](int t) { return round_key(3, t + 1, 2); };
    EXPECT_LT(
        std::fabs(corr([&](int t) { return lo16(at_step(t), 77); }, [&](int t) { return lo16(at_step(t + 1), 77); })),
        0.01);
    std::vector<double> bucket(64, 0.0);
    for (int t = 0; t < N; ++t) bucket[size_t(lo16(at_step(t), 77)) >> 10] += 1;
    double chi = 0;
    for (double b : bucket) chi += (b - N / 64.0) * (b - N / 64.0) / (N / 64.0);
    EXPECT_LT(chi, 150.0);
  }
  // Means: x between two bf16 neighbours, at 0.3, 0.5 and 0.9 of the gap (and negative).
  for (float frac : {0.3f, 0.5f, 0.9f})
    for (float sign : {1.f, -1.f}) {
      const float lo = 1.5f, ulp = 1.f / 128;  // bf16 spacing in [1, 2)
      const float x = sign * (lo + frac * ulp);
      const int N = 200000;
      double sum = 0;
      const uint64_t key = round_key(42, 3, 1);
      for (int i = 0; i < N; ++i) {
        const uint32_t r = round_bits(key, uint64_t(i));
        sum += bf16_to_float(bf16{bf16_bits_stochastic(float_bits(x), r >> (i % 2 ? 16 : 0))});
      }
      const double mean = sum / N;
      const double sigma = ulp * std::sqrt(frac * (1 - frac) / N);
      EXPECT_NEAR(mean, x, 5 * sigma) << "frac " << frac;
      EXPECT_GT(std::fabs(test::round_bf16(x) - x), 20 * sigma);  // nearest is biased by far more
    }
  // Exact values stay exact; NaN stays NaN; infinities stay.
  for (float x : {0.f, -0.f, 1.f, -3.5f, 1e30f, INFINITY, -INFINITY}) {
    const uint16_t want = float_to_bf16(x).bits;
    if (std::isfinite(x) && test::round_bf16(x) != x) continue;
    for (uint32_t r : {0u, 1u, 0x7fffu, 0xffffu}) EXPECT_EQ(bf16_bits_stochastic(float_bits(x), r), want) << x;
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16{bf16_bits_stochastic(float_bits(NAN), 0xffffu)})));
}

// Why the rounding is stochastic: with beta2 = 0.999, v = 1 and g^2 = 1.2, v moves by 2e-4 a step,
// under half a bf16 ulp of v (2^-8 = 0.0039): round-to-nearest writes 1 back every step and v never
// moves; with stochastic rounding v follows the fp32 trajectory on average.
TEST(AdamWBf16State, RoundToNearestStallsAndStochasticRoundingDoesNot) {
  const int n = 4096, steps = 1000;
  const float b2 = 0.999f, g = std::sqrt(1.2f);
  const std::vector<float> p0(size_t(n), 0.f), gv(size_t(n), g);
  State s(p0, std::vector<float>(size_t(n), 0.f), std::vector<float>(size_t(n), 1.f));
  float v_rtn = 1.f;  // the same update rounded to nearest (as a bf16 store would)
  double v_fp32 = 1.0;
  AdamWParams a;
  a.lr = 0.f, a.beta2 = b2, a.round_seed = 9;
  std::vector<float> gg = gv;
  for (int t = 1; t <= steps; ++t) {
    a.step = t;
    cpu::adamw(s.pt(), test::view_of(gg, {n}), s.m.t(), s.v.t(), Tensor(), a);
    v_rtn = test::round_bf16(v_rtn * b2 + (float(1.0 - double(b2)) * g) * g);
    v_fp32 = v_fp32 * b2 + (1.0 - double(b2)) * double(g) * g;
  }
  EXPECT_EQ(v_rtn, 1.f);  // stalled
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += s.v.get(i);
  mean /= n;
  // fp32: 1.2 - 0.2 * 0.999^1000 = 1.1264. Each element's v is within a few bf16 ulps of it; the
  // mean over 4096 elements much closer.
  EXPECT_NEAR(v_fp32, 1.2 - 0.2 * std::pow(0.999, 1000), 1e-3);
  EXPECT_NEAR(mean, v_fp32, 0.002 * v_fp32);
  EXPECT_GT(mean, 1.1);
}

// The front refuses m and v of different dtypes, and a dtype other than F32 and BF16.
TEST(AdamWBf16State, OpsCheckValidatesTheMomentDtypes) {
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int n = 5;
  std::vector<float> p(n, 0.f), g(n, 0.f), v32(n, 0.f);
  HostTensor m16(DType::BF16, {n}), v16(DType::BF16, {n}), m_f16(DType::F16, {n}), v_f16(DType::F16, {n});
  AdamWParams a;
  test::expect_check_failure(
      [&] {
        dev->ops().adamw(test::view_of(p, {n}), test::view_of(g, {n}), m16.t(), test::view_of(v32, {n}), Tensor(), a,
                         *st);
      },
      "ops_check.h", "BF16");
  test::expect_check_failure(
      [&] { dev->ops().adamw(test::view_of(p, {n}), test::view_of(g, {n}), m_f16.t(), v_f16.t(), Tensor(), a, *st); },
      "ops_check.h", "m");
  dev->ops().adamw(test::view_of(p, {n}), test::view_of(g, {n}), m16.t(), v16.t(), Tensor(), a, *st);
  dev->synchronize(*st);
}

}  // namespace
}  // namespace sf
