// The CUDA backend against its CPU twin (sf::cpu kernels), op by op, on fresh random inputs and odd
// shapes. Every output that an op overwrites is poisoned with NaN first (on both backends), so an
// element the kernel forgot to write fails the check; NaN never passes.
//
// Tolerance rule (bf16 paths). All runs see the same input values (random, rounded to bf16). Three
// runs: the CPU fp32 path (F32 tensors, F32 outputs: the reference), the CPU bf16 path (BF16
// tensors, BF16 outputs) and the CUDA bf16 path. With err = ||x - ref|| / ||ref|| (relative L2):
//     err(cuda bf16) <= max(2 * err(cpu bf16), floor)
// The floor only matters where the CPU bf16 path has (almost) no error of its own, i.e. F32
// outputs (rstd, lse, loss, sums): there it is 1e-5 (fp32 summation order, fast exp), unless a
// test says otherwise in a comment. F32 CUDA paths are compared with the CPU fp32 path directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/device.h"
#include "core/dtype.h"

namespace sf {
namespace {

#define REQUIRE_GPU() \
  if (!::sf::cuda_available()) GTEST_SKIP() << "no GPU"

constexpr DType F32 = DType::F32;
constexpr DType BF16 = DType::BF16;
constexpr double kF32Floor = 1e-5;

Device& gpu() {
  static std::unique_ptr<Device> d = make_cuda_device(size_t(4) << 30);
  return *d;
}
Stream& gpu_stream() {
  static std::unique_ptr<Stream> s = gpu().create_stream();
  return *s;
}

// ---- data ------------------------------------------------------------------------------------
std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.f, float mean = 0.f) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 12345);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<float> bf16r(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}
std::vector<float> rnd(size_t n, uint64_t seed, float sd = 1.f, float mean = 0.f) {
  return bf16r(randn(n, seed, sd, mean));
}
std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t lo, int32_t hi) {
  std::mt19937_64 rng(seed * 31 + 7);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Packed rows (ops.h AttnDims::pos): pos [B*T] of rows holding records of random lengths in
// [1, max_len] (the last one of a row cut to fit), seeded.
std::vector<int32_t> packed_positions(int B, int T, int max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> pos;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T;) {
      const int n = std::min(T - t, 1 + int(rng() % uint64_t(max_len)));
      for (int i = 0; i < n; ++i) pos.push_back(i);
      t += n;
    }
  return pos;
}
// pos of rows holding records of the given lengths.
std::vector<int32_t> positions_of(const std::vector<std::vector<int>>& rows) {
  std::vector<int32_t> pos;
  for (const auto& row : rows)
    for (int n : row)
      for (int i = 0; i < n; ++i) pos.push_back(i);
  return pos;
}
// pos of B rows of T tokens, each row records of len[b % len.size()] tokens (the last one cut).
std::vector<int32_t> records_of_length(int B, int T, const std::vector<int>& len) {
  std::vector<int32_t> pos;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) pos.push_back(int32_t(t % len[size_t(b) % len.size()]));
  return pos;
}

// ---- error measures ----------------------------------------------------------------------------
// Relative L2 error; +inf when x has a non-finite value (NaN never passes).
double rel_err(const std::vector<float>& x, const std::vector<float>& ref) {
  EXPECT_EQ(x.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(x.size(), ref.size()); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    const double d = double(x[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  // An all-zero reference (a gradient that is exactly 0): the root mean square of the difference, so
  // that the floor is per element, whatever the tensor's size.
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num / double(std::max<size_t>(x.size(), 1)));
}
bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// The tolerance rule of this file (see the top).
void check_bf16(const std::string& what, const std::vector<float>& cuda_bf, const std::vector<float>& cpu_bf,
                const std::vector<float>& ref, double floor = 0.0) {
  ASSERT_TRUE(all_finite(ref)) << what << ": reference has non-finite values";
  const double e_cuda = rel_err(cuda_bf, ref), e_cpu = rel_err(cpu_bf, ref);
  const double tol = std::max(2.0 * e_cpu, floor);
  EXPECT_LE(e_cuda, tol) << what << ": cuda bf16 error " << e_cuda << ", cpu bf16 error " << e_cpu << ", floor "
                         << floor;
}
void check_f32(const std::string& what, const std::vector<float>& cuda, const std::vector<float>& ref,
               double tol = kF32Floor) {
  ASSERT_TRUE(all_finite(ref)) << what << ": reference has non-finite values";
  const double e = rel_err(cuda, ref);
  EXPECT_LE(e, tol) << what << ": cuda f32 error " << e;
}

// ---- one run on one backend ----------------------------------------------------------------------
// Owns the buffers of one run, on the host (CPU twin) or in the CUDA arena.
class Backend {
 public:
  explicit Backend(bool on_gpu) : gpu_(on_gpu) {}
  ~Backend() {
    if (gpu_) {
      gpu().synchronize(gpu_stream());
      for (void* p : dev_) gpu().free(p);
    }
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  bool on_gpu() const { return gpu_; }

  // Input (or "+=" output) with these values.
  Tensor in(const std::vector<float>& v, DType dt, std::initializer_list<int64_t> shape, size_t offset_bytes = 0) {
    Tensor t(nullptr, dt, shape);
    EXPECT_EQ(int64_t(v.size()), t.numel());
    std::vector<uint8_t> bytes(t.bytes());
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == F32) {
        std::memcpy(&bytes[i * 4], &v[i], 4);
      } else {
        const bf16 h = float_to_bf16(v[i]);
        std::memcpy(&bytes[i * 2], &h, 2);
      }
    }
    t.data = static_cast<char*>(raw(t.bytes() + offset_bytes)) + offset_bytes;
    put(t.data, bytes.data(), bytes.size());
    return t;
  }
  Tensor in_i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape, size_t offset_bytes = 0) {
    Tensor t(nullptr, DType::I32, shape);
    EXPECT_EQ(int64_t(v.size()), t.numel());
    t.data = static_cast<char*>(raw(t.bytes() + offset_bytes)) + offset_bytes;
    put(t.data, v.data(), t.bytes());
    return t;
  }
  // Output poisoned with NaN (all-ones bytes are NaN in F32 and BF16).
  Tensor out(DType dt, std::initializer_list<int64_t> shape, size_t offset_bytes = 0) {
    Tensor t(nullptr, dt, shape);
    t.data = static_cast<char*>(raw(t.bytes() + offset_bytes)) + offset_bytes;
    std::vector<uint8_t> nan(t.bytes(), 0xff);
    put(t.data, nan.data(), nan.size());
    return t;
  }
  Tensor scratch(size_t bytes) {
    bytes = std::max<size_t>(bytes, 256);
    return Tensor(raw(bytes), DType::F32, {int64_t(bytes / 4)});
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<uint8_t> bytes(t.bytes());
    if (gpu_) {
      gpu().copy(bytes.data(), t.data, bytes.size(), CopyKind::DeviceToHost, gpu_stream());
      gpu().synchronize(gpu_stream());
    } else {
      std::memcpy(bytes.data(), t.data, bytes.size());
    }
    std::vector<float> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.dtype == F32) {
        std::memcpy(&v[i], &bytes[i * 4], 4);
      } else {
        bf16 h;
        std::memcpy(&h, &bytes[i * 2], 2);
        v[i] = bf16_to_float(h);
      }
    }
    return v;
  }

 private:
  void* raw(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    if (gpu_) {
      void* p = gpu().alloc(bytes);
      dev_.push_back(p);
      return p;
    }
    host_.emplace_back(std::make_unique<uint64_t[]>((bytes + 255) / 8 + 32));
    auto a = reinterpret_cast<uintptr_t>(host_.back().get());
    return reinterpret_cast<void*>((a + 255) / 256 * 256);
  }
  void put(void* dst, const void* src, size_t bytes) {
    if (gpu_) {
      gpu().copy(dst, src, bytes, CopyKind::HostToDevice, gpu_stream());
      gpu().synchronize(gpu_stream());  // src is a temporary
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  bool gpu_;
  std::vector<void*> dev_;
  std::vector<std::unique_ptr<uint64_t[]>> host_;
};

// The same call on either backend: the CPU twin directly, or the CUDA kernel table on a stream.
#define CALL(run, op, ...)                       \
  do {                                           \
    if ((run).on_gpu())                          \
      gpu().ops().op(__VA_ARGS__, gpu_stream()); \
    else                                         \
      cpu::op(__VA_ARGS__);                      \
  } while (0)

using Outs = std::vector<std::vector<float>>;
// The four runs of a test: CPU fp32 (reference), CPU bf16, CUDA bf16, CUDA fp32.
struct Four {
  Outs ref, cpu_bf, cuda_bf, cuda_f32;
};
Four run4(const std::function<Outs(Backend&, DType)>& f) {
  Four r;
  {
    Backend a(false);
    r.ref = f(a, F32);
  }
  {
    Backend a(false);
    r.cpu_bf = f(a, BF16);
  }
  {
    Backend a(true);
    r.cuda_bf = f(a, BF16);
  }
  {
    Backend a(true);
    r.cuda_f32 = f(a, F32);
  }
  return r;
}

// ================================================================================================
// matmul
// ================================================================================================
TEST(CudaOps, Matmul) {
  REQUIRE_GPU();
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {127, 65, 300}, {256, 512, 1024}, {1000, 96, 33}};
  uint64_t seed = 1;
  for (const Shape& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.f, 1.f}) {
          SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta << " tb=" << tb
                                          << " beta=" << beta);
          const auto av = rnd(size_t(s.M * s.K), ++seed), bv = rnd(size_t(s.K * s.N), ++seed);
          const auto cv = rnd(size_t(s.M * s.N), ++seed);
          // out_dt: the output dtype of the bf16 runs (BF16, or F32 with BF16 inputs).
          auto f = [&](Backend& r, DType dt, DType out_dt) -> Outs {
            Tensor a = ta ? r.in(av, dt, {s.K, s.M}) : r.in(av, dt, {s.M, s.K});
            Tensor b = tb ? r.in(bv, dt, {s.N, s.K}) : r.in(bv, dt, {s.K, s.N});
            Tensor o = beta != 0.f ? r.in(cv, out_dt, {s.M, s.N}) : r.out(out_dt, {s.M, s.N});
            CALL(r, matmul, o, a, b, ta != 0, tb != 0, 0.75f, beta);
            return {r.get(o)};
          };
          auto four = run4([&](Backend& r, DType dt) { return f(r, dt, dt); });
          check_bf16("matmul bf16", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
          // All-F32 must be true fp32 (no TF32: that would be ~1e-3 off).
          check_f32("matmul f32", four.cuda_f32[0], four.ref[0]);
          // BF16 inputs, F32 output: no storage rounding anywhere, so compare with the CPU directly.
          Backend rc(false), rg(true);
          auto c = f(rc, BF16, F32);
          auto g = f(rg, BF16, F32);
          check_f32("matmul bf16->f32", g[0], c[0]);
        }
}

// Views whose start is only 16-byte aligned (not 256): the cached cuBLASLt plan is per alignment.
TEST(CudaOps, MatmulOffsetViews) {
  REQUIRE_GPU();
  const int64_t M = 33, N = 48, K = 64;
  const auto av = rnd(size_t(M * K), 71), bv = rnd(size_t(N * K), 72);
  auto f = [&](Backend& r, DType dt) -> Outs {
    Tensor a = r.in(av, dt, {M, K}, 16), b = r.in(bv, dt, {N, K}, 32), o = r.out(dt, {M, N}, 16);
    CALL(r, matmul, o, a, b, false, true, 1.f, 0.f);
    return {r.get(o)};
  };
  auto four = run4(f);
  check_bf16("matmul offset bf16", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
  check_f32("matmul offset f32", four.cuda_f32[0], four.ref[0]);
}

// A linear layer with its residual in the GEMM's epilogue: out = op(a) @ op(b) + c, with c a separate
// tensor and c == out, odd shapes, offset views. The CUDA path rounds once (the CPU bf16 twin
// rounds the product, then the sum), so it may only be closer to the reference.
TEST(CudaOps, MatmulAdd) {
  REQUIRE_GPU();
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {127, 65, 300}, {1000, 96, 33}, {333, 257, 129}};
  uint64_t seed = 500;
  for (const Shape& s : shapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int in_place = 0; in_place < 2; ++in_place) {
          SCOPED_TRACE(testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta << " tb=" << tb
                                          << " in_place=" << in_place);
          const auto av = rnd(size_t(s.M * s.K), ++seed), bv = rnd(size_t(s.K * s.N), ++seed);
          const auto cv = rnd(size_t(s.M * s.N), ++seed, 2.f);
          auto f = [&](Backend& r, DType dt, DType out_dt) -> Outs {
            Tensor a = ta ? r.in(av, dt, {s.K, s.M}) : r.in(av, dt, {s.M, s.K}, 16);
            Tensor b = tb ? r.in(bv, dt, {s.N, s.K}) : r.in(bv, dt, {s.K, s.N});
            Tensor c = r.in(cv, out_dt, {s.M, s.N}, in_place ? 0 : 32);
            Tensor o = in_place ? c : r.out(out_dt, {s.M, s.N});
            CALL(r, matmul_add, o, a, b, ta != 0, tb != 0, c);
            Outs res{r.get(o)};
            if (!in_place) res.push_back(r.get(c));  // c is read, never written
            return res;
          };
          auto four = run4([&](Backend& r, DType dt) { return f(r, dt, dt); });
          check_bf16("matmul_add bf16", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
          check_f32("matmul_add f32", four.cuda_f32[0], four.ref[0]);
          if (!in_place) {
            EXPECT_EQ(four.cuda_bf[1], four.cpu_bf[1]) << "c changed";
            EXPECT_EQ(four.cuda_f32[1], four.ref[1]) << "c changed";
          }
          Backend rc(false), rg(true);
          auto c = f(rc, BF16, F32);
          auto g = f(rg, BF16, F32);
          check_f32("matmul_add bf16->f32", g[0], c[0]);
        }
}

// ================================================================================================
// bias
// ================================================================================================
TEST(CudaOps, BiasForwardBackward) {
  REQUIRE_GPU();
  for (auto [M, N] : {std::pair<int64_t, int64_t>{127, 65}, {1000, 256}, {1, 8}}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N);
    const auto xv = rnd(size_t(M * N), M + 1), bv = rnd(size_t(N), M + 2), gv = rnd(size_t(M * N), M + 3);
    const auto dbv = rnd(size_t(N), M + 4);
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor x = r.in(xv, dt, {M, N}), b = r.in(bv, dt, {N}), g = r.in(gv, dt, {M, N}), db = r.in(dbv, dt, {N});
      CALL(r, add_bias, x, b);
      CALL(r, bias_backward, db, g);
      return {r.get(x), r.get(db)};
    });
    check_bf16("add_bias", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
    check_bf16("bias_backward", four.cuda_bf[1], four.cpu_bf[1], four.ref[1]);
    check_f32("add_bias f32", four.cuda_f32[0], four.ref[0]);
    check_f32("bias_backward f32", four.cuda_f32[1], four.ref[1]);
  }
}

// ================================================================================================
// rmsnorm
// ================================================================================================
// one_plus: Gemma's rmsnorm_1p_* (weights around 0; the CPU twin is cpu::rmsnorm_* with w_offset 1).
void rmsnorm_case(int64_t R, int64_t C, bool acc, bool one_plus = false) {
  SCOPED_TRACE(testing::Message() << "R=" << R << " C=" << C << " accumulate=" << acc << " 1+w=" << one_plus);
  const uint64_t s = uint64_t(R * 131 + C + acc + 7 * one_plus);
  const auto xv = rnd(size_t(R * C), s, 1.f), wv = rnd(size_t(C), s + 1, one_plus ? 0.3f : 0.1f, one_plus ? 0.f : 1.f);
  const auto gv = rnd(size_t(R * C), s + 2), dxv = rnd(size_t(R * C), s + 3), dwv = rnd(size_t(C), s + 4);
  auto four = run4([&](Backend& r, DType dt) -> Outs {
    Tensor x = r.in(xv, dt, {R, C}), w = r.in(wv, dt, {C}), g = r.in(gv, dt, {R, C});
    Tensor out = r.out(dt, {R, C}), rstd = r.out(F32, {R});
    Tensor dx = acc ? r.in(dxv, dt, {R, C}) : r.out(dt, {R, C});
    Tensor dw = r.in(dwv, dt, {C});
    if (!one_plus) {
      CALL(r, rmsnorm_forward, out, rstd, x, w, 1e-5f);
      CALL(r, rmsnorm_backward, dx, dw, g, x, w, rstd, acc);
    } else if (r.on_gpu()) {
      gpu().ops().rmsnorm_1p_forward(out, rstd, x, w, 1e-5f, gpu_stream());
      gpu().ops().rmsnorm_1p_backward(dx, dw, g, x, w, rstd, acc, gpu_stream());
    } else {
      cpu::rmsnorm_forward(out, rstd, x, w, 1e-5f, 1.f);
      cpu::rmsnorm_backward(dx, dw, g, x, w, rstd, acc, 1.f);
    }
    return {r.get(out), r.get(rstd), r.get(dx), r.get(dw)};
  });
  check_bf16("rmsnorm out", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
  check_bf16("rmsnorm rstd (F32)", four.cuda_bf[1], four.cpu_bf[1], four.ref[1], kF32Floor);
  check_bf16("rmsnorm dx", four.cuda_bf[2], four.cpu_bf[2], four.ref[2]);
  check_bf16("rmsnorm dw", four.cuda_bf[3], four.cpu_bf[3], four.ref[3]);
  for (int i = 0; i < 4; ++i) check_f32("rmsnorm f32 #" + std::to_string(i), four.cuda_f32[i], four.ref[i]);
}

// Mixed storage (F32 residual x, BF16 weight and output; with and without dw) and unaligned views
// (scalar path).
void rmsnorm_mixed_case() {
  const int64_t R = 33, C = 256;
  const auto xv = rnd(size_t(R * C), 5), wv = rnd(size_t(C), 6, 0.1f, 1.f), gv = rnd(size_t(R * C), 7);
  const auto dwv = rnd(size_t(C), 8);
  for (size_t off : {size_t(0), size_t(4)})
    for (bool with_dw : {false, true}) {
      SCOPED_TRACE(testing::Message() << "offset=" << off << " dw=" << with_dw);
      auto f = [&](Backend& r, DType dt) -> Outs {
        Tensor x = r.in(xv, F32, {R, C}, off), w = r.in(wv, dt, {C}), g = r.in(gv, dt, {R, C}, off);
        Tensor out = r.out(dt, {R, C}, off), rstd = r.out(F32, {R}), dx = r.out(F32, {R, C}, off);
        Tensor dw = with_dw ? r.in(dwv, F32, {C}) : Tensor();
        CALL(r, rmsnorm_forward, out, rstd, x, w, 1e-6f);
        CALL(r, rmsnorm_backward, dx, dw, g, x, w, rstd, false);
        if (with_dw) return {r.get(out), r.get(dx), r.get(dw)};
        return {r.get(out), r.get(dx)};
      };
      auto four = run4(f);
      check_bf16("rmsnorm mixed out", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
      check_bf16("rmsnorm mixed dx (F32)", four.cuda_bf[1], four.cpu_bf[1], four.ref[1], kF32Floor);
      if (with_dw) check_bf16("rmsnorm mixed dw (F32)", four.cuda_bf[2], four.cpu_bf[2], four.ref[2], kF32Floor);
      check_f32("rmsnorm unaligned f32", four.cuda_f32[0], four.ref[0]);
    }
}

TEST(CudaOps, RmsNorm) {
  REQUIRE_GPU();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 64}, {7, 4096}, {129, 100}, {1000, 2048}, {3, 8192}})
    for (bool acc : {false, true}) rmsnorm_case(R, C, acc);
}

TEST(CudaOps, RmsNormMixedAndUnaligned) {
  REQUIRE_GPU();
  rmsnorm_mixed_case();
}

// The backward on more shapes: many rows per block and a partial last round (3001 rows), tiny C
// (16, 64), C not a multiple of 8 (generic kernel), C = 8192; then mixed storage and unaligned views.
TEST(CudaOps, RmsNormBackward) {
  REQUIRE_GPU();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 64}, {5, 16}, {7, 4096}, {129, 100}, {3001, 4096}, {2, 8192}})
    for (bool acc : {false, true}) rmsnorm_case(R, C, acc);
  rmsnorm_mixed_case();
}

// ================================================================================================
// rope
// ================================================================================================
TEST(CudaOps, Rope) {
  REQUIRE_GPU();
  struct Cfg {
    int B, T, nh, hd;
  };
  for (Cfg c : {Cfg{3, 7, 4, 64}, Cfg{2, 129, 2, 128}, Cfg{1, 5, 3, 6}, Cfg{2, 1, 8, 128}}) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " T=" << c.T << " nh=" << c.nh << " hd=" << c.hd);
    const int64_t R = int64_t(c.B) * c.T, W = int64_t(c.nh) * c.hd, Tmax = c.T + 3, half = c.hd / 2;
    std::vector<float> cosv(size_t(Tmax * half)), sinv(size_t(Tmax * half));
    const auto ang = randn(cosv.size(), uint64_t(c.T + c.hd), 2.f);
    for (size_t i = 0; i < ang.size(); ++i) cosv[i] = std::cos(ang[i]), sinv[i] = std::sin(ang[i]);
    const auto xv = rnd(size_t(R * W), uint64_t(c.nh * 7 + c.hd)), gv = rnd(size_t(R * W), uint64_t(c.hd * 3));
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor x = r.in(xv, dt, {R, W}), g = r.in(gv, dt, {R, W});
      Tensor cs = r.in(cosv, F32, {Tmax, half}), sn = r.in(sinv, F32, {Tmax, half});
      CALL(r, rope_forward, x, cs, sn, c.T, c.nh, c.hd, Tensor());
      CALL(r, rope_backward, g, cs, sn, c.T, c.nh, c.hd, Tensor());
      return {r.get(x), r.get(g)};
    });
    check_bf16("rope fwd", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
    check_bf16("rope bwd", four.cuda_bf[1], four.cpu_bf[1], four.ref[1]);
    check_f32("rope fwd f32", four.cuda_f32[0], four.ref[0]);
    check_f32("rope bwd f32", four.cuda_f32[1], four.ref[1]);
  }
}

// RoPE of packed rows: the position of each token is its place in its record (pos), not r % T.
TEST(CudaOps, RopePackedPositions) {
  REQUIRE_GPU();
  struct Cfg {
    int B, T, nh, hd, max_len;
  };
  for (Cfg c : {Cfg{3, 7, 4, 64, 3}, Cfg{2, 129, 2, 128, 50}, Cfg{1, 5, 3, 6, 2}, Cfg{2, 300, 8, 128, 120}}) {
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " T=" << c.T << " nh=" << c.nh << " hd=" << c.hd);
    const int64_t R = int64_t(c.B) * c.T, W = int64_t(c.nh) * c.hd, Tmax = c.T + 3, half = c.hd / 2;
    std::vector<float> cosv(size_t(Tmax * half)), sinv(size_t(Tmax * half));
    const auto ang = randn(cosv.size(), uint64_t(c.T + c.hd + 1), 2.f);
    for (size_t i = 0; i < ang.size(); ++i) cosv[i] = std::cos(ang[i]), sinv[i] = std::sin(ang[i]);
    const auto xv = rnd(size_t(R * W), uint64_t(c.nh * 7 + c.hd + 1)), gv = rnd(size_t(R * W), uint64_t(c.hd * 5));
    const auto pos = packed_positions(c.B, c.T, c.max_len, uint64_t(c.T));
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor x = r.in(xv, dt, {R, W}), g = r.in(gv, dt, {R, W});
      Tensor cs = r.in(cosv, F32, {Tmax, half}), sn = r.in(sinv, F32, {Tmax, half}), p = r.in_i32(pos, {R});
      CALL(r, rope_forward, x, cs, sn, c.T, c.nh, c.hd, p);
      CALL(r, rope_backward, g, cs, sn, c.T, c.nh, c.hd, p);
      return {r.get(x), r.get(g)};
    });
    check_bf16("rope fwd", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
    check_bf16("rope bwd", four.cuda_bf[1], four.cpu_bf[1], four.ref[1]);
    check_f32("rope fwd f32", four.cuda_f32[0], four.ref[0]);
    check_f32("rope bwd f32", four.cuda_f32[1], four.ref[1]);
  }
}

// ================================================================================================
// swiglu
// ================================================================================================
// The gated units (SwiGLU, and Gemma's GeGLU): forward and backward on odd shapes.
void glu_case(bool gelu) {
  const char* op = gelu ? "geglu" : "swiglu";
  for (auto [R, I] : {std::pair<int64_t, int64_t>{37, 1001}, {64, 512}, {1, 3}}) {
    SCOPED_TRACE(testing::Message() << op << " R=" << R << " I=" << I);
    const auto gv = rnd(size_t(R * I), uint64_t(R + I), 2.f), uv = rnd(size_t(R * I), uint64_t(R * I));
    const auto dv = rnd(size_t(R * I), uint64_t(R + 3 * I));
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor g = r.in(gv, dt, {R, I}), u = r.in(uv, dt, {R, I}), d = r.in(dv, dt, {R, I});
      Tensor out = r.out(dt, {R, I}), dg = r.out(dt, {R, I}), du = r.out(dt, {R, I});
      // In place too (dgate = gate, dup = up): the model's backward writes them over their inputs.
      Tensor g2 = r.in(gv, dt, {R, I}), u2 = r.in(uv, dt, {R, I});
      if (gelu) {
        CALL(r, geglu_forward, out, g, u);
        CALL(r, geglu_backward, dg, du, d, g, u);
        CALL(r, geglu_backward, g2, u2, d, g2, u2);
      } else {
        CALL(r, swiglu_forward, out, g, u);
        CALL(r, swiglu_backward, dg, du, d, g, u);
        CALL(r, swiglu_backward, g2, u2, d, g2, u2);
      }
      return {r.get(out), r.get(dg), r.get(du), r.get(g2), r.get(u2)};
    });
    const char* names[] = {"out", "dgate", "dup"};
    for (int i = 0; i < 3; ++i) {
      check_bf16(std::string(op) + " " + names[i], four.cuda_bf[i], four.cpu_bf[i], four.ref[i]);
      check_f32(std::string(op) + " " + names[i] + " f32", four.cuda_f32[i], four.ref[i]);
    }
    for (const Outs* o : {&four.cuda_bf, &four.cuda_f32, &four.cpu_bf}) {  // in place: the same bits
      EXPECT_EQ((*o)[3], (*o)[1]) << op << " dgate in place";
      EXPECT_EQ((*o)[4], (*o)[2]) << op << " dup in place";
    }
  }
}

TEST(CudaOps, SwiGlu) {
  REQUIRE_GPU();
  glu_case(false);
}

TEST(CudaOps, GeGlu) {
  REQUIRE_GPU();
  glu_case(true);
}

// ================================================================================================
// attention
// ================================================================================================
struct AttnCfg {
  int B, T, H, KVH, hd;
  int window = 0;         // sliding window (AttnDims::window), 0 = none
  float q_scale = 1.f;    // q's standard deviation: large values make rows change their max mid-row
  size_t ws_offset = 0;   // the backward's workspace this many bytes past an aligned start
  size_t pos_offset = 0;  // pos (packed rows) this many bytes past an aligned start
};

// Forward and backward of one configuration. The backward of every run gets the same inputs:
// out = the CPU fp32 forward's output rounded to bf16, lse = its lse. pos: packed rows (each run
// gets its own copy of it) or empty.
void attention_case(const AttnCfg& c, bool check_f32_path, const std::vector<int32_t>& pos = {}) {
  SCOPED_TRACE(testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H << " KVH=" << c.KVH << " hd=" << c.hd
                                  << (pos.empty() ? "" : " packed") << " window=" << c.window
                                  << " q_scale=" << c.q_scale);
  ASSERT_TRUE(pos.empty() || int64_t(pos.size()) == int64_t(c.B) * c.T);
  AttnDims d0;
  d0.B = c.B, d0.T = c.T, d0.n_head = c.H, d0.n_kv_head = c.KVH, d0.head_dim = c.hd;
  d0.scale = 1.f / std::sqrt(float(c.hd));
  d0.window = c.window;
  const int64_t N = int64_t(c.B) * c.T, QW = int64_t(c.H) * c.hd, KW = int64_t(c.KVH) * c.hd;
  const uint64_t s = uint64_t(c.T * 1000 + c.H * 10 + c.hd);
  const auto qv = rnd(size_t(N * QW), s, c.q_scale), kv = rnd(size_t(N * KW), s + 1), vv = rnd(size_t(N * KW), s + 2);
  const auto gv = rnd(size_t(N * QW), s + 3);
  std::vector<float> out_ref, lse_ref;
  auto fwd = [&](Backend& r, DType dt) -> Outs {
    AttnDims d = d0;
    if (!pos.empty()) d.pos = r.in_i32(pos, {N}, c.pos_offset);
    Tensor q = r.in(qv, dt, {N, QW}), k = r.in(kv, dt, {N, KW}), v = r.in(vv, dt, {N, KW});
    Tensor o = r.out(dt, {N, QW}), lse = r.out(F32, {c.B, c.H, c.T});
    CALL(r, attention_forward, o, lse, q, k, v, d);
    return {r.get(o), r.get(lse)};
  };
  auto bwd = [&](Backend& r, DType dt) -> Outs {
    AttnDims d = d0;
    if (!pos.empty()) d.pos = r.in_i32(pos, {N}, c.pos_offset);
    Tensor q = r.in(qv, dt, {N, QW}), k = r.in(kv, dt, {N, KW}), v = r.in(vv, dt, {N, KW});
    Tensor o = r.in(out_ref, dt, {N, QW}), lse = r.in(lse_ref, F32, {c.B, c.H, c.T}), g = r.in(gv, dt, {N, QW});
    Tensor dq = r.out(dt, {N, QW}), dk = r.out(dt, {N, KW}), dv = r.out(dt, {N, KW});
    const size_t wsb = r.on_gpu() ? gpu().ops().attention_workspace_bytes(d) : cpu::attention_workspace_bytes(d);
    Tensor ws = r.scratch(wsb + c.ws_offset);
    if (c.ws_offset > 0)
      ws = Tensor(static_cast<char*>(ws.data) + c.ws_offset, F32, {ws.numel() - int64_t(c.ws_offset / 4)});
    CALL(r, attention_backward, dq, dk, dv, g, q, k, v, o, lse, d, ws);
    return {r.get(dq), r.get(dk), r.get(dv)};
  };
  Backend r0(false), r1(false), r2(true);
  const Outs ref = fwd(r0, F32), cpu_bf = fwd(r1, BF16), cuda_bf = fwd(r2, BF16);
  check_bf16("attention out", cuda_bf[0], cpu_bf[0], ref[0]);
  check_bf16("attention lse (F32)", cuda_bf[1], cpu_bf[1], ref[1], kF32Floor);
  out_ref = bf16r(ref[0]);
  lse_ref = ref[1];
  Backend b0(false), b1(false), b2(true);
  const Outs bref = bwd(b0, F32), bcpu = bwd(b1, BF16), bcuda = bwd(b2, BF16);
  // Where each query sees one key (T = 1, a window of 1) the softmax has one key, so dq = dk = 0
  // exactly: the CPU paths give 0 and the CUDA path leaves fp32 rounding (rel_err is then the
  // per-element RMS: ~6e-7 at head dim 256, H200 run of session 7). The 1e-5 floor covers that and
  // is far below any bf16 rounding elsewhere.
  check_bf16("attention dq", bcuda[0], bcpu[0], bref[0], kF32Floor);
  check_bf16("attention dk", bcuda[1], bcpu[1], bref[1], kF32Floor);
  check_bf16("attention dv", bcuda[2], bcpu[2], bref[2], kF32Floor);
  if (check_f32_path) {
    Backend g0(true), g1(true);
    const Outs f = fwd(g0, F32), b = bwd(g1, F32);
    check_f32("attention out f32", f[0], ref[0], 2e-5);
    check_f32("attention lse f32", f[1], ref[1], 2e-5);
    check_f32("attention dq f32", b[0], bref[0], 2e-5);
    check_f32("attention dk f32", b[1], bref[1], 2e-5);
    check_f32("attention dv f32", b[2], bref[2], 2e-5);
  }
}

// On Hopper these run the sm_90 kernels (Auto) at every shape class: T = 1, tails, GQA 1 / 4 / 8,
// long rows (and packed rows, windows, both at once below): at hd 128 the backward's TMA dQ,
// at hd 64 its atomics.
void short_cases() {
  attention_case({2, 1, 2, 2, 64}, true);    // T = 1, GQA 1
  attention_case({2, 7, 8, 1, 128}, true);   // GQA 8
  attention_case({2, 127, 4, 1, 64}, true);  // GQA 4, T not a multiple of any tile
  attention_case({1, 127, 2, 2, 128}, false);
  attention_case({2, 300, 8, 2, 128}, false);  // GQA 4
}
void long_cases() {
  attention_case({1, 1000, 4, 1, 128}, true);  // GQA 4
  attention_case({1, 2049, 8, 1, 64}, false);  // GQA 8
  attention_case({1, 2049, 2, 2, 128}, false);
}
TEST(CudaOps, AttentionShortSequences) {
  REQUIRE_GPU();
  short_cases();
}
TEST(CudaOps, AttentionLongSequences) {
  REQUIRE_GPU();
  long_cases();
}

// cases() under each flash kernel family the device can run: Auto (on Hopper the sm_90 kernels
// where they apply), the sm_80 kernels forced, so the fallback stays tested on Hopper too, and
// the sm_80 kernels with the small tiles of GPUs with 99 KiB of shared memory a block.
void each_flash_path(const std::function<void()>& cases) {
  for (cuda::AttnPath p : {cuda::AttnPath::Auto, cuda::AttnPath::Sm80, cuda::AttnPath::Sm80Small}) {
    SCOPED_TRACE(testing::Message() << "path "
                                    << (p == cuda::AttnPath::Auto   ? "auto"
                                        : p == cuda::AttnPath::Sm80 ? "sm80"
                                                                    : "sm80small"));
    cuda::attention_force_path(p);
    cases();
  }
  cuda::attention_force_path(cuda::AttnPath::Auto);
}

// Both kernel families on odd shapes: T not a multiple of any tile (the sm_90 tiles are 128 rows,
// the sm_80 ones 32 to 128), T = 1, GQA 1 / 4 / 8, sequences spanning many tiles.
TEST(CudaOps, AttentionKernelFamilies) {
  REQUIRE_GPU();
  each_flash_path([] {
    attention_case({2, 300, 8, 2, 128}, false);
    attention_case({3, 257, 4, 1, 64}, false);
    attention_case({1, 1, 2, 1, 128}, false);
    attention_case({2, 129, 8, 1, 64}, false);
    attention_case({1, 383, 4, 4, 128}, false);
    attention_case({1, 1000, 4, 1, 128}, false);
  });
}

// The persistent sm_90 forward where its CTAs take many tiles each (more query tiles than
// the H200's 132 SMs): Q buffers, K/V stages and the ping-pong carried across tiles, tiles of
// every length; T not a multiple of 128; GQA 4 / 8; and q scaled up so that rows raise their max
// past the lazy-rescale threshold (2^8) mid-row, which the plain inputs rarely do; packed rows and
// a window with it.
TEST(CudaOps, AttentionPersistentForward) {
  REQUIRE_GPU();
  each_flash_path([] {
    attention_case({4, 520, 16, 4, 128}, false);  // 5 query tiles x 64 heads = 320 tiles, ~2.4 a CTA
    attention_case({8, 300, 32, 8, 64}, false);   // 3 x 256 = 768 tiles, ~6 a CTA
    // q_scale 4: scores of sd 4, a row's max over its whole span ~2 sd above its first keys' (> 8 in log2)
    attention_case({2, 700, 8, 1, 128, 0, 4.f}, false);
    attention_case({2, 700, 8, 2, 64, 0, 4.f}, false, packed_positions(2, 700, 250, 7));
    attention_case({1, 900, 8, 2, 128, 200, 4.f}, false);
  });
}

// A backward workspace only 4-byte aligned: the flash kernels add dQ 16 bytes at a time (float4
// atomics, TMA reduce-add), so the simple kernels run, and agree with the CPU twin.
TEST(CudaOps, AttentionUnalignedWorkspace) {
  REQUIRE_GPU();
  attention_case({2, 129, 4, 2, 128, 0, 1.f, 4}, false);
  attention_case({1, 70, 4, 1, 64, 0, 1.f, 12}, false);
}

// Packed rows whose pos is only 4-byte aligned (a slice of a larger id buffer): the kernels read
// pos element by element (on Hopper the sm_90 kernels too: ordinary loads, no tensor map), and
// agree with the CPU twin; records on tile boundaries too (the sm_90 kernels' fast paths).
TEST(CudaOps, AttentionPackedRowsUnalignedPos) {
  REQUIRE_GPU();
  attention_case({2, 300, 8, 2, 128, 0, 1.f, 0, 4}, false, positions_of({{1, 63, 64, 100, 72}, {150, 3, 147}}));
  attention_case({3, 257, 4, 1, 64, 31, 1.f, 0, 12}, false, packed_positions(3, 257, 90, 5));
  attention_case({2, 512, 8, 2, 64, 0, 1.f, 0, 4}, false, records_of_length(2, 512, {128, 64}));
  attention_case({1, 333, 4, 2, 128, 0, 1.f, 0, 8}, false, records_of_length(1, 333, {128}));
}

// head_dim 32 (not a flash size) and the forced simple path run the generic kernels on BF16.
TEST(CudaOps, AttentionSimpleKernels) {
  REQUIRE_GPU();
  attention_case({2, 33, 4, 2, 32}, false);
  cuda::attention_force_path(cuda::AttnPath::Simple);
  attention_case({2, 65, 4, 1, 128}, false);
  cuda::attention_force_path(cuda::AttnPath::Auto);
}

// Packed rows (block-diagonal causal mask, FlashAttention varlen-style): records that start and
// end inside tiles, on tile boundaries (64, 128), one-token records, rows that are one record,
// records longer than a tile; the flash kernels (bf16, hd 64 / 128) skip the key tiles before a
// query tile's first record and the query tiles after a key block's last; the f32 runs check the
// simple kernels with the same mask.
void packed_cases() {
  attention_case({2, 7, 8, 1, 128}, true, positions_of({{3, 4}, {1, 1, 1, 1, 1, 1, 1}}));
  attention_case({2, 127, 4, 1, 64}, true, packed_positions(2, 127, 40, 1));
  attention_case({2, 300, 8, 2, 128}, true, positions_of({{1, 63, 64, 100, 72}, {150, 3, 147}}));
  attention_case({3, 257, 4, 1, 64}, false, positions_of({{257}, {200, 57}, {1, 1, 255}}));
  attention_case({1, 1000, 4, 1, 128}, true, packed_positions(1, 1000, 300, 2));
  attention_case({2, 2049, 8, 2, 64}, false, packed_positions(2, 2049, 700, 3));
  attention_case({2, 33, 4, 2, 32}, false, packed_positions(2, 33, 9, 4));  // simple kernels on BF16
}
TEST(CudaOps, AttentionPackedRows) {
  REQUIRE_GPU();
  packed_cases();
}

// The packed cases through each flash kernel family (on Hopper: the sm_90 kernels and the sm_80
// ones forced).
TEST(CudaOps, AttentionPackedRowsKernelFamilies) {
  REQUIRE_GPU();
  each_flash_path([] {
    attention_case({2, 300, 8, 2, 128}, false, positions_of({{1, 63, 64, 100, 72}, {150, 3, 147}}));
    attention_case({3, 257, 4, 1, 64}, false, packed_positions(3, 257, 90, 5));
  });
}

// Packed rows whose records start on tile boundaries (the sm_90 forward's query and key tiles are
// 128 rows, the backward's query tiles 64): most tiles lie inside one record, where the bounded
// sm_90 kernels take no first-key pass (the forward's tile of one record needs no pos load, the
// backward masks only tiles where a record starts) and a key block's query tiles end at its
// record's end. Records of 512 as attn_bench --pack 512 (B 8 x T 2048), of 128 and 64, of 192
// (starts inside a forward tile, on a backward tile), B > 1 with a different layout in each row,
// T not a multiple of the records or of 64, one-token records on and beside boundaries, more
// query tiles than SMs, windows on top.
TEST(CudaOps, AttentionPackedRowsOnTileBoundaries) {
  REQUIRE_GPU();
  attention_case({2, 1024, 4, 2, 128}, false, records_of_length(2, 1024, {512}));
  attention_case({3, 1000, 4, 1, 64}, false, records_of_length(3, 1000, {512, 128, 192}));
  attention_case({2, 700, 8, 2, 128}, false, records_of_length(2, 700, {64, 192}));
  attention_case({8, 512, 8, 2, 64}, false, records_of_length(8, 512, {128, 256, 64, 512}));  // 256 tiles
  attention_case({2, 449, 4, 2, 128}, false,
                 positions_of({{127, 1, 1, 126, 1, 64, 128, 1}, {1, 1, 62, 1, 1, 1, 253, 128, 1}}));
  attention_case({2, 1024, 4, 2, 64, 200}, false, records_of_length(2, 1024, {512, 256}));
  attention_case({1, 777, 4, 4, 128, 64}, false, records_of_length(1, 777, {128}));
  each_flash_path([] {
    attention_case({2, 1024, 4, 1, 64}, false, records_of_length(2, 1024, {512, 128}));
    attention_case({2, 640, 4, 1, 128}, false, records_of_length(2, 640, {192, 64}));
  });
}

// Sliding-window attention (Gemma 3's local layers): windows of 1, shorter than a tile, across tile
// boundaries, longer than T; with GQA and packed rows (both lower bounds at once). The flash kernels
// skip the key tiles before a query tile's window and the query tiles past a key block's; the f32
// runs check the simple kernels with the same mask.
void window_cases() {
  attention_case({2, 7, 8, 1, 128, 1}, true);
  attention_case({2, 127, 4, 1, 64, 5}, true);
  attention_case({2, 300, 8, 2, 128, 64}, true);
  attention_case({1, 1000, 4, 1, 128, 100}, false);
  attention_case({2, 2049, 8, 2, 64, 1024}, false);
  attention_case({2, 33, 4, 2, 32, 9}, false);      // simple kernels on BF16
  attention_case({1, 127, 2, 2, 128, 500}, false);  // window longer than T: the causal result
  attention_case({2, 300, 8, 2, 128, 50}, true, positions_of({{1, 63, 64, 100, 72}, {150, 3, 147}}));
  attention_case({2, 2049, 8, 2, 64, 333}, false, packed_positions(2, 2049, 700, 3));
}
TEST(CudaOps, AttentionSlidingWindow) {
  REQUIRE_GPU();
  window_cases();
  each_flash_path([] {
    attention_case({2, 300, 8, 2, 128, 70}, false);
    attention_case({3, 257, 4, 1, 64, 31}, false, packed_positions(3, 257, 90, 5));
  });
}

// Head dim 256 (Gemma 3) in the flash kernels: T = 1, tails of every tile size, GQA 1/2/4/8, long
// rows, windows and packed rows (records inside and on the tiles' boundaries); f32 runs check the
// simple kernels at 256. On Hopper under both families: Auto runs the sm_90 backward (64-key
// blocks, columns split between the consumers, P^T / dS^T through shared memory) beside the
// sm_80 forward; GQA 8 at T 520 walks 72 query tiles a block, so both P^T / dS^T buffers and
// both Q / dO stages are reused many times.
TEST(CudaOps, AttentionHeadDim256) {
  REQUIRE_GPU();
  attention_case({2, 1, 2, 2, 256}, true);
  attention_case({2, 7, 8, 4, 256}, true);
  attention_case({2, 127, 4, 1, 256}, true);
  attention_case({1, 300, 8, 2, 256, 64}, true);
  each_flash_path([] {
    attention_case({2, 127, 4, 1, 256}, false);
    attention_case({1, 1000, 8, 4, 256, 100}, false);
    attention_case({1, 2049, 4, 2, 256}, false);
    attention_case({2, 300, 4, 2, 256, 40}, false, positions_of({{1, 63, 64, 100, 72}, {150, 3, 147}}));
    attention_case({2, 520, 16, 2, 256, 0, 4.f}, false);
    attention_case({2, 640, 4, 1, 256}, false, records_of_length(2, 640, {192, 64}));
    attention_case({1, 333, 4, 2, 256, 65}, false, records_of_length(1, 333, {128}));
  });
}

// Head dim 512 (Gemma 4's global layers) and other widths above 256 (up to 512): the
// simple kernels with 16 elements a lane, BF16 and F32, GQA 1/2/4, windows, packed rows.
TEST(CudaOps, AttentionHeadDim512) {
  REQUIRE_GPU();
  attention_case({2, 1, 2, 2, 512}, true);
  attention_case({2, 7, 8, 4, 512}, true);
  attention_case({1, 131, 4, 1, 512}, true);
  attention_case({2, 77, 4, 2, 512, 9}, true);
  attention_case({1, 300, 2, 1, 512}, false, positions_of({{1, 63, 64, 100, 72}}));
  attention_case({2, 45, 4, 2, 384}, true);
  attention_case({1, 33, 2, 1, 258}, true);
}

// ================================================================================================
// Gemma 3: the (1 + w) RMSNorm (GeGLU: glu_case above)
// ================================================================================================
// rmsnorm_1p_* on the cuda table against the CPU twin: every kernel path (register fast path,
// vector, scalar for C % 8 != 0), hidden sizes and head_dim-sized rows (q/k norms).
TEST(CudaOps, RmsNorm1p) {
  REQUIRE_GPU();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 64}, {7, 2560}, {129, 100}, {1000, 256}, {3001, 256}})
    for (bool acc : {false, true}) rmsnorm_case(R, C, acc, true);
}

// ================================================================================================
// linear cross-entropy
// ================================================================================================
struct CeCfg {
  int64_t N, H, V;
  float softcap = 0.f;  // > 0: Gemma 4's capped head (linear_cross_entropy_capped)
};

void linear_ce_case(const CeCfg& c) {
  SCOPED_TRACE(testing::Message() << "N=" << c.N << " H=" << c.H << " V=" << c.V << " softcap=" << c.softcap);
  const uint64_t s = uint64_t(c.N * 7 + c.V);
  const auto xv = rnd(size_t(c.N * c.H), s), wv = rnd(size_t(c.V * c.H), s + 1, 0.3f);
  const auto dwv = rnd(size_t(c.V * c.H), s + 2, 0.01f);
  auto labels = randint(size_t(c.N), s + 3, 0, int32_t(c.V));
  const auto drop = randint(size_t(c.N), s + 4, 0, 5);
  int valid = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (drop[i] == 0 && c.N > 1) labels[i] = -100;  // ~20% ignored
    valid += labels[i] != -100;
  }
  const float gscale = 1.f / float(std::max(valid, 1));
  // dw_dt: dtype of dw (BF16 like the model's gradient blobs, or F32).
  auto f = [&](Backend& r, DType dt, DType dw_dt, bool grads) -> Outs {
    Tensor x = r.in(xv, dt, {c.N, c.H}), w = r.in(wv, dt, {c.V, c.H}), lab = r.in_i32(labels, {c.N});
    Tensor loss = r.in({0.5f}, F32, {1});
    Tensor dx = grads ? r.out(dt, {c.N, c.H}) : Tensor();
    Tensor dw = grads ? r.in(dwv, dw_dt, {c.V, c.H}) : Tensor();
    const size_t wsb = r.on_gpu() ? gpu().ops().linear_ce_workspace_bytes(c.N, c.H, c.V)
                                  : cpu::linear_ce_workspace_bytes(c.N, c.H, c.V);
    Tensor ws = r.scratch(wsb);
    if (c.softcap == 0.f)
      CALL(r, linear_cross_entropy, loss, dx, dw, x, w, lab, gscale, ws);
    else if (r.on_gpu())
      gpu().ops().linear_cross_entropy_capped(loss, dx, dw, x, w, lab, gscale, c.softcap, ws, gpu_stream());
    else
      cpu::linear_cross_entropy(loss, dx, dw, x, w, lab, gscale, ws, c.softcap);
    if (!grads) return {r.get(loss)};
    return {r.get(loss), r.get(dx), r.get(dw)};
  };
  auto four = run4([&](Backend& r, DType dt) { return f(r, dt, dt, true); });
  check_bf16("linear_ce loss (F32)", four.cuda_bf[0], four.cpu_bf[0], four.ref[0], kF32Floor);
  check_bf16("linear_ce dx", four.cuda_bf[1], four.cpu_bf[1], four.ref[1]);
  check_bf16("linear_ce dw", four.cuda_bf[2], four.cpu_bf[2], four.ref[2]);
  check_f32("linear_ce loss f32", four.cuda_f32[0], four.ref[0]);
  check_f32("linear_ce dx f32", four.cuda_f32[1], four.ref[1]);
  check_f32("linear_ce dw f32", four.cuda_f32[2], four.ref[2]);
  // Loss only (no gradients wanted).
  {
    Backend rc(false), rg(true);
    check_f32("linear_ce loss-only", f(rg, BF16, BF16, false)[0], f(rc, BF16, BF16, false)[0]);
  }
  // BF16 x/w with an F32 dw: the CUDA path feeds the tensor cores the softmax gradient rounded to
  // bf16 (the CPU keeps it fp32), so an F32 dw is off by about one bf16 rounding of g: floor 4e-3.
  {
    Backend r0(false), r1(true);
    const Outs ref = f(r0, F32, F32, true), g = f(r1, BF16, F32, true);
    check_f32("linear_ce bf16 x, f32 dw", g[2], ref[2], 4e-3);
  }
}

TEST(CudaOps, LinearCrossEntropy) {
  REQUIRE_GPU();
  linear_ce_case({7, 64, 1000});
  linear_ce_case({1, 32, 77});
  linear_ce_case({300, 128, 5003});  // V odd: scalar row kernel
  linear_ce_case({2000, 64, 5004});  // two token chunks (the second one partial)
}

// Gemma 4's soft-capped head (c tanh(z / c) before the loss) against the CPU twin: caps that bind
// hard (logits' sd ~ 2.4 at H = 64) and loosely, both row kernels, a second token chunk.
TEST(CudaOps, LinearCrossEntropyCapped) {
  REQUIRE_GPU();
  linear_ce_case({7, 64, 1000, 3.f});
  linear_ce_case({1, 32, 77, 30.f});
  linear_ce_case({301, 96, 5003, 2.f});   // V odd: scalar row kernel
  linear_ce_case({2000, 64, 5004, 5.f});  // two token chunks
}

// ================================================================================================
// embedding
// ================================================================================================
TEST(CudaOps, Embedding) {
  REQUIRE_GPU();
  for (auto [N, H, V] : {std::tuple<int64_t, int64_t, int64_t>{300, 64, 50}, {77, 100, 1000}, {1, 8, 3}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " H=" << H << " V=" << V);
    const auto ids = randint(size_t(N), uint64_t(N + V), 0, int32_t(V));
    const auto tv = rnd(size_t(V * H), uint64_t(H)), gv = rnd(size_t(N * H), uint64_t(H + 1));
    const auto dtv = rnd(size_t(V * H), uint64_t(H + 2));
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor id = r.in_i32(ids, {N}), table = r.in(tv, dt, {V, H}), g = r.in(gv, dt, {N, H});
      Tensor out = r.out(dt, {N, H}), dtab = r.in(dtv, dt, {V, H});
      CALL(r, embedding_forward, out, id, table);
      CALL(r, embedding_backward, dtab, g, id);
      return {r.get(out), r.get(dtab)};
    });
    check_bf16("embedding fwd", four.cuda_bf[0], four.cpu_bf[0], four.ref[0]);
    check_bf16("embedding bwd", four.cuda_bf[1], four.cpu_bf[1], four.ref[1]);
    check_f32("embedding fwd f32", four.cuda_f32[0], four.ref[0], 0.0);
    check_f32("embedding bwd f32", four.cuda_f32[1], four.ref[1]);
  }
}

// ================================================================================================
// element-wise, norms, optimizer
// ================================================================================================
TEST(CudaOps, AddScaleCastZero) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(1003), int64_t(1 << 16)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto av = rnd(size_t(n), uint64_t(n)), bv = rnd(size_t(n), uint64_t(n + 1));
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor a = r.in(av, dt, {n}), b = r.in(bv, dt, {n}), o = r.out(dt, {n});
      CALL(r, add, o, a, b);
      CALL(r, add, a, a, b);  // out aliases a
      CALL(r, scale, b, 0.3f);
      Tensor c1 = r.out(BF16, {n}), c2 = r.out(F32, {n}), z = r.in(av, dt, {n});
      CALL(r, cast, c1, o);
      CALL(r, cast, c2, o);
      CALL(r, zero, z);
      return {r.get(o), r.get(a), r.get(b), r.get(c1), r.get(c2), r.get(z)};
    });
    const char* names[] = {"add", "add aliased", "scale", "cast to bf16", "cast to f32", "zero"};
    for (int i = 0; i < 6; ++i) {
      check_bf16(names[i], four.cuda_bf[i], four.cpu_bf[i], four.ref[i]);
      check_f32(std::string(names[i]) + " f32", four.cuda_f32[i], four.ref[i], 0.0);
    }
  }
  // Mixed dtypes and unaligned views.
  const int64_t n = 999;
  const auto av = rnd(size_t(n), 3), bv = rnd(size_t(n), 4);
  Backend rc(false), rg(true);
  auto f = [&](Backend& r) -> Outs {
    Tensor a = r.in(av, F32, {n}, 4), b = r.in(bv, BF16, {n}, 2), o = r.out(BF16, {n}, 6);
    CALL(r, add, o, a, b);
    return {r.get(o)};
  };
  check_f32("add mixed/unaligned", f(rg)[0], f(rc)[0], 0.0);
}

TEST(CudaOps, SqNorm) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(1000003), int64_t(4096)}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    const auto xv = rnd(size_t(n), uint64_t(n + 5));
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor x = r.in(xv, dt, {n}), o = r.in({1.5f}, F32, {1});
      CALL(r, sq_norm, o, x);
      return {r.get(o)};
    });
    check_bf16("sq_norm (F32)", four.cuda_bf[0], four.cpu_bf[0], four.ref[0], kF32Floor);
    check_f32("sq_norm f32", four.cuda_f32[0], four.ref[0]);
  }
}

TEST(CudaOps, AdamW) {
  REQUIRE_GPU();
  const int64_t n = 10007;
  const auto pv = randn(size_t(n), 1), gv = rnd(size_t(n), 2), mv = randn(size_t(n), 3, 0.1f);
  auto vv = randn(size_t(n), 4, 0.01f);
  for (auto& x : vv) x = x * x;
  AdamWParams p;
  p.lr = 1e-3f, p.beta1 = 0.9f, p.beta2 = 0.95f, p.eps = 1e-8f, p.weight_decay = 0.1f, p.step = 3, p.grad_scale = 0.5f;
  for (DType gdt : {F32, BF16})
    for (int copy = 0; copy < 3; ++copy) {
      SCOPED_TRACE(testing::Message() << "grad " << (gdt == F32 ? "F32" : "BF16") << " copy " << copy);
      auto f = [&](Backend& r) -> Outs {
        Tensor pp = r.in(pv, F32, {n}), g = r.in(gv, gdt, {n}), m = r.in(mv, F32, {n}), v = r.in(vv, F32, {n});
        Tensor c = copy == 0 ? Tensor() : r.out(copy == 1 ? BF16 : F32, {n});
        CALL(r, adamw, pp, g, m, v, c, p);
        Outs o = {r.get(pp), r.get(m), r.get(v)};
        if (copy) o.push_back(r.get(c));
        return o;
      };
      Backend rc(false), rg(true);
      const Outs a = f(rc), b = f(rg);
      for (size_t i = 0; i < a.size(); ++i) {
        // fp32 both sides; a BF16 copy may round a last-bit fp32 difference the other way.
        check_f32("adamw out #" + std::to_string(i), b[i], a[i], i == 3 && copy == 1 ? 4e-3 : 1e-6);
      }
    }
}

// Compact optimizer state: BF16 m and v, stochastically rounded with the stream keyed by (seed,
// step, blob, index). The CUDA kernel does the CPU twin's fp32 operations without FMA contraction,
// so p, m and v are bit-identical, over three steps (the rounded moments feed back), for odd
// lengths, a misaligned start (the one-element path), a call starting inside its blob, both lerp
// branches and F32 / BF16 gradients.
TEST(CudaOps, AdamWBf16StateBitIdentical) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(10007), int64_t(13)}) {
    const auto pv = randn(size_t(n), 11), mv = randn(size_t(n), 13, 0.1f);
    auto vv = randn(size_t(n), 14, 0.01f);
    for (auto& x : vv) x = x * x;
    for (size_t off : {size_t(0), size_t(4)})
      for (float beta1 : {0.9f, 0.3f})
        for (DType gdt : {F32, BF16}) {
          SCOPED_TRACE(testing::Message() << "n " << n << " offset " << off << " beta1 " << beta1 << " grad "
                                          << (gdt == F32 ? "F32" : "BF16"));
          auto f = [&](Backend& r) -> Outs {
            Tensor pp = r.in(pv, F32, {n}, off), m = r.in(mv, BF16, {n}, off / 2), v = r.in(vv, BF16, {n}, off / 2);
            Tensor c = r.out(BF16, {n}, off / 2);
            for (int t = 1; t <= 3; ++t) {
              Tensor g = r.in(rnd(size_t(n), 20 + t), gdt, {n});
              AdamWParams p;
              p.lr = 1e-3f, p.beta1 = beta1, p.beta2 = 0.95f, p.weight_decay = 0.1f, p.step = t, p.grad_scale = 0.5f;
              p.round_seed = 99, p.blob = 4, p.first = 12345;
              CALL(r, adamw, pp, g, m, v, c, p);
            }
            return {r.get(pp), r.get(m), r.get(v), r.get(c)};
          };
          Backend rc(false), rg(true);
          const Outs a = f(rc), b = f(rg);
          for (size_t i = 0; i < a.size(); ++i) {
            size_t differ = 0;
            for (size_t k = 0; k < a[i].size(); ++k) differ += std::memcmp(&a[i][k], &b[i][k], 4) != 0;
            EXPECT_EQ(differ, 0u) << "adamw (bf16 state) out #" << i;
          }
        }
  }
}

// ================================================================================================
// device: arena, streams, events, copies, host callbacks
// ================================================================================================
// ================================================================================================
// mixture of experts (the cpu twins: backend/cpu/moe.cpp)
// ================================================================================================
std::vector<int32_t> get_i32(Backend& r, const Tensor& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  if (r.on_gpu()) {
    gpu().copy(v.data(), t.data, t.bytes(), CopyKind::DeviceToHost, gpu_stream());
    gpu().synchronize(gpu_stream());
  } else {
    std::memcpy(v.data(), t.data, t.bytes());
  }
  return v;
}

// ids_or_zero (Gemma 4's per-layer table shorter than the vocabulary): ids in [0, limit) kept,
// the rest 0, negative ones too; in place as well; against the cpu twin and the definition.
TEST(CudaOps, IdsOrZero) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(1001), int64_t(1) << 17}) {
    SCOPED_TRACE(n);
    std::vector<int32_t> ids = randint(size_t(n), uint64_t(n), -5, 300);
    ids[0] = 299;
    std::vector<int32_t> want(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) want[i] = ids[i] >= 0 && ids[i] < 200 ? ids[i] : 0;
    for (bool gpu_run : {false, true}) {
      Backend r(gpu_run);
      Tensor in = r.in_i32(ids, {n}), out = r.in_i32(std::vector<int32_t>(size_t(n), -7), {n});
      CALL(r, ids_or_zero, out, in, 200);
      CALL(r, ids_or_zero, in, in, 200);  // in place
      EXPECT_EQ(get_i32(r, out), want) << (gpu_run ? "cuda" : "cpu");
      EXPECT_EQ(get_i32(r, in), want) << (gpu_run ? "cuda in place" : "cpu in place");
    }
  }
}

// Router logits [N, E]; `hot` >= 0 biases every token towards that expert (one expert gets all).
std::vector<float> moe_logits(int64_t N, int64_t E, uint64_t seed, int hot) {
  auto v = rnd(size_t(N * E), seed, 2.f);
  if (hot >= 0)
    for (int64_t n = 0; n < N; ++n) v[size_t(n * E + hot)] += 50.f;
  return v;
}

// Expert choices [N, k] as the router gives them (k distinct experts a row); `hot` as above.
std::vector<int32_t> moe_choices(int64_t N, int64_t E, int64_t k, uint64_t seed, int hot) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> idx;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    if (hot >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), hot));
    idx.insert(idx.end(), all.begin(), all.begin() + k);
  }
  return idx;
}

struct MoeCfg {
  int64_t N, E, k;
  int hot;  // -1: random routing
};
const MoeCfg kMoeCfgs[] = {{300, 37, 5, -1}, {1, 3, 3, -1}, {129, 128, 8, -1}, {77, 9, 1, 4}, {50, 6, 2, 0}};

TEST(CudaOps, MoeRouteAndBackward) {
  REQUIRE_GPU();
  for (const MoeCfg& c : kMoeCfgs) {
    for (bool renorm : {false, true}) {
      SCOPED_TRACE(testing::Message() << "N=" << c.N << " E=" << c.E << " k=" << c.k << " hot=" << c.hot
                                      << " renorm=" << renorm);
      const auto lv = moe_logits(c.N, c.E, uint64_t(c.N * 7 + c.E), c.hot);
      const auto dwv = randn(size_t(c.N * c.k), uint64_t(c.E + 5));
      const auto cntv = randn(size_t(c.E), 3);
      std::vector<std::vector<float>> f[2];
      std::vector<std::vector<int32_t>> ix[2];
      for (int g = 0; g < 2; ++g) {
        Backend r(g == 1);
        Tensor logits = r.in(lv, F32, {c.N, c.E}), probs = r.out(F32, {c.N, c.E}), wt = r.out(F32, {c.N, c.k});
        Tensor idx = r.in_i32(std::vector<int32_t>(size_t(c.N * c.k), -1), {c.N, c.k});
        Tensor stats = r.in(std::vector<float>(size_t(2 * c.E), 0.5f), F32, {2 * c.E});
        CALL(r, moe_route, probs, idx, wt, stats, logits, renorm);
        // The backward on the cpu's routing, so both sides differentiate the same choice.
        Tensor dl = r.out(F32, {c.N, c.E}), dlb = r.out(BF16, {c.N, c.E}), dw = r.in(dwv, F32, {c.N, c.k});
        Tensor counts = r.in(cntv, F32, {c.E});
        Tensor idx_cpu = g == 0 ? idx : r.in_i32(ix[0][0], {c.N, c.k});
        Tensor probs_cpu = g == 0 ? probs : r.in(f[0][0], F32, {c.N, c.E});
        CALL(r, moe_route_backward, dl, dw, probs_cpu, idx_cpu, renorm, counts, 0.3f);
        CALL(r, moe_route_backward, dlb, dw, probs_cpu, idx_cpu, renorm, Tensor(), 0.f);
        f[g] = {r.get(probs), r.get(wt), r.get(stats), r.get(dl), r.get(dlb)};
        ix[g] = {get_i32(r, idx)};
      }
      EXPECT_EQ(ix[1][0], ix[0][0]) << "top-k choices differ";
      const char* names[] = {"probs", "weights", "stats", "dlogits (aux)", "dlogits bf16"};
      for (int i = 0; i < 5; ++i) check_f32(names[i], f[1][size_t(i)], f[0][size_t(i)], i == 4 ? 8e-3 : 1e-5);
    }
  }
}

TEST(CudaOps, MoePermuteGatherCombine) {
  REQUIRE_GPU();
  const int64_t H = 23;
  for (const MoeCfg& c : kMoeCfgs) {
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " E=" << c.E << " k=" << c.k << " hot=" << c.hot);
    const int64_t S = c.N * c.k;
    const auto iv = moe_choices(c.N, c.E, c.k, uint64_t(S), c.hot);
    const auto xv = rnd(size_t(c.N * H), 11), ysv = rnd(size_t(S * H), 12), dyv = rnd(size_t(c.N * H), 13);
    const auto wv = randn(size_t(S), 14);
    std::vector<int32_t> perm[2][3];
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor idx = r.in_i32(iv, {c.N, c.k}), offs = r.in_i32(std::vector<int32_t>(size_t(c.E + 1), -1), {c.E + 1});
      Tensor ss = r.in_i32(std::vector<int32_t>(size_t(S), -1), {S}),
             sp = r.in_i32(std::vector<int32_t>(size_t(S), -1), {S});
      CALL(r, moe_permute, offs, ss, sp, idx);
      if (dt == F32) {
        const int g = r.on_gpu() ? 1 : 0;
        perm[g][0] = get_i32(r, offs), perm[g][1] = get_i32(r, ss), perm[g][2] = get_i32(r, sp);
      }
      Tensor x = r.in(xv, dt, {c.N, H}), ys = r.in(ysv, dt, {S, H}), dy = r.in(dyv, dt, {c.N, H});
      Tensor w = r.in(wv, F32, {c.N, c.k});
      Tensor xs = r.out(dt, {S, H}), dx = r.out(dt, {c.N, H}), y = r.out(dt, {c.N, H}), dys = r.out(dt, {S, H});
      Tensor dw = r.out(F32, {c.N, c.k});
      CALL(r, moe_gather, xs, x, ss, int(c.k));
      CALL(r, moe_gather_backward, dx, ys, sp, int(c.k));
      CALL(r, moe_combine, y, ys, w, sp);
      CALL(r, moe_combine_backward, dys, dw, dy, ys, w, sp);
      return {r.get(xs), r.get(dx), r.get(y), r.get(dys), r.get(dw)};
    });
    for (int i = 0; i < 3; ++i) EXPECT_EQ(perm[1][i], perm[0][i]) << "permutation output " << i;
    const char* names[] = {"gather", "gather backward", "combine", "combine backward dys", "combine backward dw"};
    for (int i = 0; i < 5; ++i) {
      check_bf16(names[i], four.cuda_bf[size_t(i)], four.cpu_bf[size_t(i)], four.ref[size_t(i)], kF32Floor);
      check_f32(std::string(names[i]) + " f32", four.cuda_f32[size_t(i)], four.ref[size_t(i)]);
    }
  }
}

// Gemma 4's per-expert scale against the cpu twin: routings of every kind (an expert with every
// slot, experts no slot chose), F32 and BF16 scales and their gradients, dw aliasing dout.
TEST(CudaOps, MoeExpertScale) {
  REQUIRE_GPU();
  for (const MoeCfg& c : kMoeCfgs) {
    for (DType sdt : {F32, BF16}) {
      SCOPED_TRACE(testing::Message() << "N=" << c.N << " E=" << c.E << " k=" << c.k << " hot=" << c.hot
                                      << (sdt == F32 ? " F32" : " BF16"));
      const int64_t S = c.N * c.k;
      const auto iv = moe_choices(c.N, c.E, c.k, uint64_t(S + 3), c.hot);
      const auto wv = randn(size_t(S), 41), gv = randn(size_t(S), 42), sv = randn(size_t(c.E), 43);
      std::vector<std::vector<float>> f[2];
      for (int g = 0; g < 2; ++g) {
        Backend r(g == 1);
        Tensor idx = r.in_i32(iv, {c.N, c.k}), w = r.in(wv, F32, {c.N, c.k}), scale = r.in(sv, sdt, {c.E});
        Tensor out = r.out(F32, {c.N, c.k}), dout = r.in(gv, F32, {c.N, c.k});
        Tensor dscale = r.in(std::vector<float>(size_t(c.E), 0.25f), sdt, {c.E});
        CALL(r, moe_expert_scale, out, w, idx, scale);
        CALL(r, moe_expert_scale_backward, dout, dscale, dout, w, idx, scale);
        f[g] = {r.get(out), r.get(dout), r.get(dscale)};
      }
      EXPECT_EQ(f[1][0], f[0][0]) << "forward: one product each, the same bits";
      EXPECT_EQ(f[1][1], f[0][1]) << "dw: one product each, the same bits";
      check_f32("dscale", f[1][2], f[0][2], sdt == BF16 ? 8e-3 : 1e-5);
    }
  }
}

TEST(CudaOps, MoeGroupedMatmul) {
  REQUIRE_GPU();
  struct G {
    int64_t K, Nout;
    std::vector<int32_t> offsets;  // M = offsets.back() + a few rows past the last expert
  };
  const G cases[] = {{37, 29, {0, 5, 5, 70, 71, 130}},  // an expert with no rows
                     {64, 128, {0, 0, 200, 200}},       // one expert with every row
                     {130, 67, {0, 0, 0}},              // no rows at all
                     {16, 1, {0, 1, 2, 3, 4}},
                     {256, 136, {0, 130, 130, 400}}};  // row counts of two plan size classes
  // cuBLASLt per expert on uploaded offsets (read afresh at each call), over the expert streams and
  // on one stream (the test hook).
  for (const bool one : {false, true}) {
    cuda::moe_gemm_force_one_stream(one);
    for (const G& c : cases) {
      const int64_t E = int64_t(c.offsets.size()) - 1, M = c.offsets.back() + 3, stride = c.K * c.Nout + 8;
      SCOPED_TRACE(testing::Message() << "K=" << c.K << " Nout=" << c.Nout << " E=" << E << " one stream=" << one);
      const auto av = rnd(size_t(M * c.K), 31), wv = rnd(size_t(E * stride), 32), ov = rnd(size_t(M * c.Nout), 33);
      const auto dyv = rnd(size_t(M * c.Nout), 34), dwv = rnd(size_t(E * stride), 35), dxv = rnd(size_t(M * c.K), 36);
      auto four = run4([&](Backend& r, DType dt) -> Outs {
        Tensor offs = r.in_i32(c.offsets, {E + 1});
        Tensor a = r.in(av, dt, {M, c.K}), w = r.in(wv, dt, {E, stride}), dy = r.in(dyv, dt, {M, c.Nout});
        Tensor y = r.in(ov, dt, {M, c.Nout}), dx = r.in(dxv, dt, {M, c.K});
        Tensor dw = r.in(dwv, F32, {E, stride}), dwb = r.in(dwv, dt, {E, stride});
        CALL(r, moe_grouped_matmul, y, a, w, offs, true, 0.f);     // y = x W_e^T, W_e [Nout, K]
        CALL(r, moe_grouped_matmul, dx, dy, w, offs, false, 1.f);  // dx += dy W_e
        CALL(r, moe_grouped_matmul_wgrad, dw, dy, a, offs);
        CALL(r, moe_grouped_matmul_wgrad, dwb, dy, a, offs);
        return {r.get(y), r.get(dx), r.get(dw), r.get(dwb)};
      });
      const char* names[] = {"grouped x W^T", "grouped += dy W", "wgrad f32 accumulator", "wgrad storage dtype"};
      for (int i = 0; i < 4; ++i) {
        check_bf16(names[i], four.cuda_bf[size_t(i)], four.cpu_bf[size_t(i)], four.ref[size_t(i)], kF32Floor);
        check_f32(std::string(names[i]) + " f32", four.cuda_f32[size_t(i)], four.ref[size_t(i)]);
      }
    }
  }
  cuda::moe_gemm_force_one_stream(false);
}

// The default path as the MoE layer runs it: offsets written by moe_permute (their host copy taken
// there, waited for once, reused by every GEMM on them), at odd sizes: experts with 0 and 1 rows,
// one expert with most rows, M not a multiple of any tile, beta 0 and 1, F32 and BF16 dw; then a
// second routing permuted into the same offsets tensor (the host copy must follow it), then
// offsets uploaded over it (a copy that must drop the permuted host copy).
TEST(CudaOps, MoeGroupedMatmulOnPermutedOffsets) {
  REQUIRE_GPU();
  struct G {
    int64_t N, E, k, K, Nout;
    int hot;
  };
  const G cases[] = {{67, 9, 2, 72, 40, -1}, {301, 13, 3, 40, 136, 5}, {5, 11, 2, 24, 33, -1}, {130, 4, 4, 64, 96, -1}};
  for (const G& c : cases) {
    const int64_t S = c.N * c.k, stride = c.K * c.Nout + 16;
    SCOPED_TRACE(testing::Message() << "N=" << c.N << " E=" << c.E << " k=" << c.k << " K=" << c.K
                                    << " Nout=" << c.Nout);
    const auto iv1 = moe_choices(c.N, c.E, c.k, 71, c.hot), iv2 = moe_choices(c.N, c.E, c.k, 72, -1);
    // A third routing, uploaded: experts 0 and 2 without rows, expert 1 with one, the rest spread.
    std::vector<int32_t> up(size_t(c.E + 1), 0);
    up[2] = up[3] = 1;
    for (int64_t e = 4; e <= c.E; ++e) up[size_t(e)] = int32_t(1 + (S - 1) * (e - 3) / (c.E - 3));
    const auto av = rnd(size_t(S * c.K), 81), wv = rnd(size_t(c.E * stride), 82), ov = rnd(size_t(S * c.Nout), 83);
    const auto dyv = rnd(size_t(S * c.Nout), 84), dwv = rnd(size_t(c.E * stride), 85), dxv = rnd(size_t(S * c.K), 86);
    auto four = run4([&](Backend& r, DType dt) -> Outs {
      Tensor offs = r.in_i32(std::vector<int32_t>(size_t(c.E + 1), -1), {c.E + 1});
      Tensor ss = r.in_i32(std::vector<int32_t>(size_t(S), -1), {S}),
             sp = r.in_i32(std::vector<int32_t>(size_t(S), -1), {S});
      Tensor a = r.in(av, dt, {S, c.K}), w = r.in(wv, dt, {c.E, stride}), dy = r.in(dyv, dt, {S, c.Nout});
      Outs outs;
      for (int round = 0; round < 3; ++round) {
        if (round < 2) {
          Tensor idx = r.in_i32(round == 0 ? iv1 : iv2, {c.N, c.k});
          CALL(r, moe_permute, offs, ss, sp, idx);
        } else if (r.on_gpu()) {  // over the permuted offsets, through the device's copy
          gpu().copy(offs.data, up.data(), offs.bytes(), CopyKind::HostToDevice, gpu_stream());
          gpu().synchronize(gpu_stream());
        } else {
          std::memcpy(offs.data, up.data(), offs.bytes());
        }
        Tensor y = r.out(dt, {S, c.Nout}), y1 = r.in(ov, dt, {S, c.Nout}), dx = r.in(dxv, dt, {S, c.K});
        Tensor dw = r.in(dwv, F32, {c.E, stride}), dwb = r.in(dwv, dt, {c.E, stride});
        CALL(r, moe_grouped_matmul, y, a, w, offs, true, 0.f);     // y = x W_e^T (NaN-poisoned y: beta 0)
        CALL(r, moe_grouped_matmul, y1, a, w, offs, true, 1.f);    // y1 += x W_e^T
        CALL(r, moe_grouped_matmul, dx, dy, w, offs, false, 1.f);  // dx += dy W_e
        CALL(r, moe_grouped_matmul_wgrad, dw, dy, a, offs);
        CALL(r, moe_grouped_matmul_wgrad, dwb, dy, a, offs);
        for (const Tensor& t : {y, y1, dx, dw, dwb}) outs.push_back(r.get(t));
      }
      return outs;
    });
    const char* names[] = {"x W^T", "+= x W^T", "+= dy W", "wgrad f32 accumulator", "wgrad storage dtype"};
    for (size_t i = 0; i < four.ref.size(); ++i) {
      const std::string what = std::string(names[i % 5]) + " routing " + std::to_string(i / 5);
      check_bf16(what, four.cuda_bf[i], four.cpu_bf[i], four.ref[i], kF32Floor);
      check_f32(what + " f32", four.cuda_f32[i], four.ref[i]);
    }
  }
}

// The experts' GEMMs spread over four streams give the bits of one stream (the test hook):
// every expert's GEMM runs on the same plan either way, and the join must hold back the reads of
// the outputs until every stream is done (a missing join shows as NaN: the outputs are poisoned).
TEST(CudaOps, MoeGroupedMatmulSameBitsOnOneOrFourStreams) {
  REQUIRE_GPU();
  const int64_t N = 257, E = 11, k = 3, S = N * k, K = 136, Nout = 200;
  const auto iv = moe_choices(N, E, k, 91, -1);
  const auto av = rnd(size_t(S * K), 92), wv = rnd(size_t(E * K * Nout), 93), dyv = rnd(size_t(S * Nout), 94);
  std::vector<float> got[2][3];
  for (int one = 0; one < 2; ++one) {
    cuda::moe_gemm_force_one_stream(one == 1);
    Backend r(true);
    Tensor offs = r.in_i32(std::vector<int32_t>(size_t(E + 1), -1), {E + 1});
    Tensor ss = r.out(DType::I32, {S}), sp = r.out(DType::I32, {S}), idx = r.in_i32(iv, {N, k});
    Tensor a = r.in(av, BF16, {S, K}), w = r.in(wv, BF16, {E, K * Nout}), dy = r.in(dyv, BF16, {S, Nout});
    Tensor y = r.out(BF16, {S, Nout}), dx = r.out(BF16, {S, K});
    Tensor dw = r.in(std::vector<float>(size_t(E * K * Nout), 0.f), F32, {E, K * Nout});
    CALL(r, moe_permute, offs, ss, sp, idx);
    CALL(r, moe_grouped_matmul, y, a, w, offs, true, 0.f);
    CALL(r, moe_grouped_matmul, dx, dy, w, offs, false, 0.f);
    CALL(r, moe_grouped_matmul_wgrad, dw, dy, a, offs);
    got[one][0] = r.get(y), got[one][1] = r.get(dx), got[one][2] = r.get(dw);
  }
  cuda::moe_gemm_force_one_stream(false);
  const char* names[] = {"x W^T", "dy W", "wgrad"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(all_finite(got[0][i])) << names[i] << ": an output the four streams did not write";
    EXPECT_TRUE(std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4) == 0)
        << names[i] << ": four streams and one differ";
  }
}

// The same offsets pointer reused after a new routing, on the device alone: the GEMM must see the
// routing permuted last, not the first one's host copy (two routings, one buffer, many rounds).
TEST(CudaOps, MoeGroupedMatmulFollowsEachRouting) {
  REQUIRE_GPU();
  const int64_t N = 40, E = 6, k = 2, S = N * k, K = 16, Nout = 8;
  Backend r(true);
  Tensor offs = r.in_i32(std::vector<int32_t>(size_t(E + 1), -1), {E + 1});
  Tensor ss = r.out(DType::I32, {S}), sp = r.out(DType::I32, {S});
  // Routing A: every token to experts 0 and 1; routing B: every token to experts 4 and 5.
  std::vector<int32_t> ia, ib;
  for (int64_t n = 0; n < N; ++n) ia.insert(ia.end(), {0, 1}), ib.insert(ib.end(), {4, 5});
  Tensor idx_a = r.in_i32(ia, {N, k}), idx_b = r.in_i32(ib, {N, k});
  // W_e = e + 1 everywhere, a = 1: y row = K * (e + 1) for its expert e.
  std::vector<float> wv(size_t(E * K * Nout));
  for (int64_t e = 0; e < E; ++e) std::fill(wv.begin() + e * K * Nout, wv.begin() + (e + 1) * K * Nout, float(e + 1));
  Tensor a = r.in(std::vector<float>(size_t(S * K), 1.f), F32, {S, K}), w = r.in(wv, F32, {E, K * Nout});
  for (int round = 0; round < 6; ++round) {
    const bool b = round % 2 == 1;
    CALL(r, moe_permute, offs, ss, sp, b ? idx_b : idx_a);
    Tensor y = r.out(F32, {S, Nout});
    CALL(r, moe_grouped_matmul, y, a, w, offs, true, 0.f);
    const auto got = r.get(y);
    // Sorted rows: the first N on the lower expert of the routing, the next N on the higher.
    const float lo = float(K * (b ? 5 : 1)), hi = float(K * (b ? 6 : 2));
    for (int64_t i = 0; i < S; ++i)
      ASSERT_EQ(got[size_t(i * Nout)], i < N ? lo : hi) << "round " << round << " row " << i;
  }
}

TEST(CudaOps, MoeAuxLoss) {
  REQUIRE_GPU();
  const int64_t E = 77;
  const auto sv = randn(size_t(2 * E), 41);
  std::vector<float> got[2];
  for (int g = 0; g < 2; ++g) {
    Backend r(g == 1);
    Tensor loss = r.in({1.5f}, F32, {1}), stats = r.in(sv, F32, {2 * E});
    CALL(r, moe_aux_loss, loss, stats, 0.7f);
    got[g] = r.get(loss);
  }
  check_f32("aux loss", got[1], got[0]);
}

TEST(CudaDevice, ArenaFirstFitAndCoalescing) {
  REQUIRE_GPU();
  auto dev = make_cuda_device(size_t(256) << 20);
  const size_t mb = size_t(1) << 20;
  void* a = dev->alloc(64 * mb);
  void* b = dev->alloc(64 * mb);
  void* c = dev->alloc(64 * mb);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), std::ptrdiff_t(64 * mb));
  dev->free(b);
  void* b2 = dev->alloc(10);  // first fit: the hole left by b
  EXPECT_EQ(b2, b);
  void* e = dev->alloc(1000);
  EXPECT_EQ(static_cast<char*>(e) - static_cast<char*>(b2), 256);
  dev->free(b2);
  dev->free(e);
  dev->free(a);
  dev->free(c);
  void* all = dev->alloc(250 * mb);  // everything coalesced again
  EXPECT_EQ(all, a);
  EXPECT_THROW(dev->alloc(10 * mb), std::exception);
  dev->free(all);
}

TEST(CudaDevice, StreamsEventsCopiesHostFn) {
  REQUIRE_GPU();
  Device& d = gpu();
  auto s1 = d.create_stream(), s2 = d.create_stream();
  auto ev = d.create_event();
  const int64_t n = 1 << 20;
  float* host = static_cast<float*>(d.alloc_pinned(n * 4));
  for (int64_t i = 0; i < n; ++i) host[i] = float(i % 1000);
  void* dev = d.alloc(n * 4);
  d.copy(dev, host, n * 4, CopyKind::HostToDevice, *s1);
  d.record(*ev, *s1);
  d.wait(*s2, *ev);
  d.ops().scale(Tensor(dev, F32, {n}), 2.f, *s2);
  d.copy(host, dev, n * 4, CopyKind::DeviceToHost, *s2);
  bool seen = false;
  float first = -1.f;
  d.host_fn(*s2, [&] {
    seen = true;
    first = host[999];
  });
  d.record(*ev, *s2);
  d.synchronize(*ev);
  EXPECT_TRUE(d.query(*ev));
  d.synchronize(*s2);
  EXPECT_TRUE(seen);
  EXPECT_EQ(first, 1998.f);
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(host[i], 2.f * float(i % 1000));
  // A failing host function surfaces at synchronize(stream).
  d.host_fn(*s1, [] { throw std::runtime_error("boom"); });
  EXPECT_THROW(d.synchronize(*s1), std::runtime_error);
  d.synchronize(*s1);  // reported once
  d.free(dev);
  d.free_pinned(host);
}

}  // namespace
}  // namespace sf
