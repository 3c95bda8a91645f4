// Element-wise ops and small reductions: add, scale, cast, zero, sq_norm, add_bias, bias_backward.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

namespace sf::cpu {

using namespace detail;

namespace {
// Elements per pool chunk below which threading costs more than it saves.
constexpr int64_t kGrain = 1 << 15;
}  // namespace

void add(Tensor out, Tensor a, Tensor b) {
  const int64_t n = out.numel();
  // Element i is read before it is written, so out may alias a or b.
  visit_all(
      [&](auto* o, auto* pa, auto* pb) {
        cpu_pool().parallel_for(
            n,
            [&](int64_t i0, int64_t i1) {
              for (int64_t i = i0; i < i1; ++i) st(o, i, ld(pa, i) + ld(pb, i));
            },
            kGrain);
      },
      out, a, b);
}

void scale(Tensor x, float alpha) {
  visit(x, [&](auto* p) {
    cpu_pool().parallel_for(
        x.numel(),
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) st(p, i, ld(p, i) * alpha);
        },
        kGrain);
  });
}

void cast(Tensor out, Tensor in) {
  const int64_t n = out.numel();
  if (out.dtype == in.dtype) {  // plain copy (memmove: an exact alias is harmless)
    std::memmove(out.data, in.data, out.bytes());
    return;
  }
  // F32, BF16 or F16 each (I32 only copies to I32, above), not overlapping (ops_check.h).
  cpu_pool().parallel_for(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          float v = in.dtype == DType::F32    ? in.ptr<float>()[i]
                    : in.dtype == DType::BF16 ? bf16_bits_to_float(in.ptr<uint16_t>()[i])
                                              : f16_to_float(in.ptr<uint16_t>()[i]);
          if (out.dtype == DType::F32) {
            out.ptr<float>()[i] = v;
          } else if (out.dtype == DType::BF16) {
            out.ptr<bf16>()[i] = float_to_bf16(v);
          } else {
            out.ptr<uint16_t>()[i] = float_to_f16(v);
          }
        }
      },
      kGrain);
}

void zero(Tensor x) {
  if (x.numel() == 0) return;
  std::memset(x.data, 0, x.bytes());
}

namespace {
// Eight independent fp64 sums (vectorisable; one serial chain ran at ~1 value per 4 cycles),
// combined in a fixed order.
template <class T>
double sq_sum_t(const T* p, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double v = ld(p, i + j);
      acc[j] += v * v;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = ld(p, i);
    acc[j] += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

double sq_sum(const float* x, int64_t n) { return sq_sum_t(x, n); }

void sq_norm(Tensor out, Tensor x) {
  const int64_t n = x.numel(), nblocks = (n + kSqNormBlock - 1) / kSqNormBlock;
  std::vector<double> partial(size_t(nblocks), 0.0);  // [nblocks]
  visit(x, [&](auto* p) {
    cpu_pool().parallel_for(
        nblocks,
        [&](int64_t b0, int64_t b1) {
          for (int64_t blk = b0; blk < b1; ++blk) {
            const int64_t i0 = blk * kSqNormBlock;
            partial[size_t(blk)] = sq_sum_t(p + i0, std::min(n, i0 + kSqNormBlock) - i0);
          }
        },
        2);
  });
  double total = 0.0;
  for (double s : partial) total += s;
  out.ptr<float>()[0] = float(double(out.ptr<float>()[0]) + total);
}

void add_bias(Tensor out, Tensor bias) {
  const int64_t M = out.rows(), N = out.cols();
  visit_all(
      [&](auto* o, auto* bp) {
        cpu_pool().parallel_for(
            M,
            [&](int64_t r0, int64_t r1) {
              for (int64_t r = r0; r < r1; ++r) {
                for (int64_t j = 0; j < N; ++j) st(o, r * N + j, ld(o, r * N + j) + ld(bp, j));
              }
            },
            std::max<int64_t>(1, kGrain / std::max<int64_t>(1, N)));
      },
      out, bias);
}

void bias_backward(Tensor dbias, Tensor dout) {
  const int64_t M = dout.rows(), N = dout.cols();
  // Threads split the columns; each column is summed over rows in order, in fp64.
  visit_all(
      [&](auto* db, auto* d) {
        cpu_pool().parallel_for(
            N,
            [&](int64_t c0, int64_t c1) {
              std::vector<double> acc(size_t(c1 - c0), 0.0);  // [c1 - c0]
              for (int64_t r = 0; r < M; ++r) {
                for (int64_t j = c0; j < c1; ++j) acc[size_t(j - c0)] += ld(d, r * N + j);
              }
              for (int64_t j = c0; j < c1; ++j) st(db, j, float(double(ld(db, j)) + acc[size_t(j - c0)]));
            },
            64);
      },
      dbias, dout);
}

}  // namespace sf::cpu
