// AdamW with PyTorch's torch.optim.AdamW arithmetic (single-tensor path, amsgrad off):
//   p *= 1 - lr*wd;  m.lerp_(g, 1 - b1);  v = v*b2 + (1 - b2)*g*g;
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += -(lr / (1 - b1^t)) * (m / denom).
// Scalars are formed in fp64 and rounded to fp32 once, as PyTorch does with Python floats.
//
// Speed: the engine's host optimizer runs this over every parameter each step. The element loop
// runs on 8 lanes with AVX2 where the CPU has it (chosen at run time), else 4 lanes of baseline
// SSE2 (adamw_simd.inc), then a scalar tail. All paths do the same IEEE fp32 operations in the
// same order, so the bits do not depend on the path or the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/thread_pool.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define SF_ADAMW_SIMD 1
#endif

namespace sf::cpu {

using namespace detail;

namespace {

struct Coefs {
  float decay;     // 1 - lr*wd
  float w1;        // lerp weight 1 - b1
  float b2, c2;    // v = v*b2 + (c2*g)*g
  float bc2_sqrt;  // sqrt(1 - b2^t)
  float eps;
  float neg_step;  // -lr / (1 - b1^t)
  float gscale;
};

#ifdef SF_ADAMW_SIMD
#define SF_ADAMW_NS sse2
#define SF_ADAMW_W 4
#define SF_ADAMW_SQRT _mm_sqrt_ps
#include "backend/cpu/adamw_simd.inc"
#undef SF_ADAMW_NS
#undef SF_ADAMW_W
#undef SF_ADAMW_SQRT

#pragma GCC push_options
#pragma GCC target("avx2")
#define SF_ADAMW_NS avx2
#define SF_ADAMW_W 8
#define SF_ADAMW_SQRT _mm256_sqrt_ps
#include "backend/cpu/adamw_simd.inc"
#undef SF_ADAMW_NS
#undef SF_ADAMW_W
#undef SF_ADAMW_SQRT
#pragma GCC pop_options

bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

// CopyT = void: no copy. at::lerp: self + w (end - self) for |w| < 0.5, else
// end - (end - self)(1 - w); the branch is a template argument (it is loop-invariant).
template <bool kSmallW, AdamWPart kPart, class GradT, class CopyT>
void adamw_range(float* p, const GradT* gp, float* m, float* v, CopyT* cp, const Coefs& k, int64_t i0, int64_t i1) {
  int64_t i = i0;
#ifdef SF_ADAMW_SIMD
  // Software prefetch 2048 elements (8 KiB of fp32) ahead on every stream: the pass is bound by
  // the misses each core keeps in flight, and 16 cores streaming five arrays beside the DMA leave
  // the hardware prefetchers short (H200 machine, 3B clipped step: +3.4 % tokens/s, 0 -> 2048;
  // 512: +0.4 %; 4096 slower).
  constexpr int64_t ahead = 2048;
  i = have_avx2() ? avx2::run<kSmallW, kPart>(p, gp, m, v, cp, k, i, i1, ahead)
                  : sse2::run<kSmallW, kPart>(p, gp, m, v, cp, k, i, i1, ahead);
#endif
  for (; i < i1; ++i) {
    const float g = ld(gp, i) * k.gscale;
    const float mv = kSmallW ? m[i] + k.w1 * (g - m[i]) : g - (g - m[i]) * (1.f - k.w1);
    const float vv = v[i] * k.b2 + (k.c2 * g) * g;
    if constexpr (kPart != AdamWPart::Params) {
      m[i] = mv;
      v[i] = vv;
    }
    if constexpr (kPart != AdamWPart::Moments) {
      const float pv = p[i] * k.decay;
      const float denom = std::sqrt(vv) / k.bc2_sqrt + k.eps;
      p[i] = pv + k.neg_step * (mv / denom);
      if constexpr (!std::is_void_v<CopyT>) st(cp, i, p[i]);
    }
  }
}

}  // namespace

void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& a, AdamWPart part) {
  const int64_t n = param.numel();  // all [n]; the arguments as ops_check.h's opcheck::adamw checks them
  SF_CHECK(part != AdamWPart::Moments || param_copy.empty(), "adamw: a Moments pass writes no parameter copy");
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const Coefs k{float(1.0 - double(a.lr) * double(a.weight_decay)),
                float(1.0 - double(a.beta1)),
                a.beta2,
                float(1.0 - double(a.beta2)),
                float(std::sqrt(bc2)),
                a.eps,
                float(-(double(a.lr) / bc1)),
                a.grad_scale};
  float* p = param.ptr<float>();
  float* mp = m.ptr<float>();
  float* vp = v.ptr<float>();
  const bool small_w = std::fabs(k.w1) < 0.5f;
  auto run = [&](auto* gp, auto* cp) {
    using GradT = std::remove_pointer_t<decltype(gp)>;
    using CopyT = std::remove_pointer_t<decltype(cp)>;
    // Pieces of ~1/8 of a thread's share (at least 32 Ki elements), taken by whichever thread is
    // free: the pass is memory-bound and runs beside DMA and the CUDA driver's threads, so equal
    // static chunks would wait for the slowest core. Elementwise: the bits do not depend on it.
    const int64_t piece =
        (std::max<int64_t>(int64_t(1) << 15, n / (int64_t(cpu_pool().size()) * 8)) + 63) / 64 * 64;  // cache lines
    cpu_pool().parallel_pieces(n, [&](int64_t i0, int64_t i1) {
      auto go = [&](auto small, auto which) {
        adamw_range<decltype(small)::value, decltype(which)::value, GradT, CopyT>(p, gp, mp, vp, cp, k, i0, i1);
      };
      using S = std::true_type;
      using B = std::false_type;
      using A = std::integral_constant<AdamWPart, AdamWPart::All>;
      using P = std::integral_constant<AdamWPart, AdamWPart::Params>;
      using M = std::integral_constant<AdamWPart, AdamWPart::Moments>;
      if (part == AdamWPart::Params) {
        small_w ? go(S{}, P{}) : go(B{}, P{});
      } else if (part == AdamWPart::Moments) {
        small_w ? go(S{}, M{}) : go(B{}, M{});
      } else {
        small_w ? go(S{}, A{}) : go(B{}, A{});
      }
    }, piece);
  };
  visit(grad, [&](auto* gp) {
    if (param_copy.empty()) {
      run(gp, static_cast<void*>(nullptr));
    } else {
      visit(param_copy, [&](auto* cp) { run(gp, cp); });
    }
  });
}

}  // namespace sf::cpu
