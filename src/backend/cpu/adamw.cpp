// AdamW with PyTorch's torch.optim.AdamW arithmetic (single-tensor path, amsgrad off):
//   p *= 1 - lr*wd;  m.lerp_(g, 1 - b1);  v = v*b2 + (1 - b2)*g*g;
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += -(lr / (1 - b1^t)) * (m / denom).
// Scalars are formed in fp64 and rounded to fp32 once, as PyTorch does with Python floats.
//
// Speed: the engine's host optimizer runs this over every parameter each step. The element loop
// runs on 8 lanes with AVX2 where the CPU has it (chosen at run time), else 4 lanes of baseline
// SSE2 (adamw_simd.inc), then a scalar tail. All paths do the same IEEE fp32 operations in the
// same order, so the bits do not depend on the path or the thread count.
//
// Compact state (m, v BF16): read exactly (bf16 -> fp32), the update in fp32 as above (the
// parameter uses the unrounded m and v), then m and v written back with stochastic rounding
// (core/stochastic_round.h; AdamWParams says whose random bits): 4 instead of 8 bytes read and
// written a parameter for each moment. The split passes round alike, so they equal the fused one.
// The rounding is instructions the fp32 path has not (a hash, NaN guards, narrowing): written
// lean (adamw_simd.inc: one widening load, one pack for m and v, a running index, the NaN guard
// only for a vector that has a NaN), the AVX2 moment pass runs 47 instructions for 8 elements
// instead of 82 (fp32 state: 29), the fused pass at most 63 instead of 91 (39). One thread, 1 Mi
// elements (in cache): fused 0.57 instead of 0.94 ns an element (fp32 state 0.57), parameter pass
// 0.49 (0.57), moment pass 0.43 instead of 0.80 (0.34); out of cache the bf16 state is the faster
// one per element, where it was slower (bench_adamw).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/kernels.h"
#include "core/env.h"
#include "core/split_master.h"
#include "core/stochastic_round.h"
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

// The element loop's path: the widest the CPU has, or a narrower one named by SF_ADAMW_ISA
// (core/env.h; read at each call: tests run every path).
enum class Isa { Avx2, Sse2, Scalar };
Isa adamw_isa() {
#ifdef SF_ADAMW_SIMD
  const Isa best = have_avx2() ? Isa::Avx2 : Isa::Sse2;
#else
  const Isa best = Isa::Scalar;
#endif
  const std::string want = env_text(Env::AdamwIsa);
  const Isa asked = want == "scalar" ? Isa::Scalar : want == "sse2" ? Isa::Sse2 : Isa::Avx2;
  return std::max(asked, best);  // never wider than the CPU allows
}

// CopyT = void: no copy. at::lerp: self + w (end - self) for |w| < 0.5, else
// end - (end - self)(1 - w); the branch is a template argument (it is loop-invariant).
// StateT: float, or bf16 (stochastic rounding with keys `rk` for element i's index lo + (i - i0)
// in its blob; [i0, i1) never crosses a 2^32 boundary of that index, see adamw_segments).
// ParamT: float* (an fp32 master) or SplitMaster (core/split_master.h).
inline float ldp(float* p, int64_t i) { return p[i]; }
inline void stp(float* p, int64_t i, float x) { p[i] = x; }
inline float ldp(const SplitMaster& s, int64_t i) { return split_join(s, i); }
inline void stp(const SplitMaster& s, int64_t i, float x) { split_store(s, i, x); }

template <bool kSmallW, AdamWPart kPart, class ParamT, class GradT, class StateT, class CopyT>
void adamw_range(Isa isa, ParamT p, const GradT* gp, StateT* m, StateT* v, CopyT* cp, const Coefs& k, RoundKeys rk,
                 uint32_t lo, int64_t i0, int64_t i1) {
  int64_t i = i0;
#ifdef SF_ADAMW_SIMD
  // Software prefetch 2048 elements (8 KiB of fp32) ahead on every stream: the pass is bound by
  // the misses each core keeps in flight, and 16 cores streaming five arrays beside the DMA leave
  // the hardware prefetchers short (H200 machine, 3B clipped step: +3.4 % tokens/s, 0 -> 2048;
  // 512: +0.4 %; 4096 slower).
  constexpr int64_t ahead = 2048;
  if (isa == Isa::Avx2) i = avx2::run<kSmallW, kPart, ParamT>(p, gp, m, v, cp, k, rk, lo, i, i1, ahead);
  if (isa == Isa::Sse2) i = sse2::run<kSmallW, kPart, ParamT>(p, gp, m, v, cp, k, rk, lo, i, i1, ahead);
#else
  (void)isa;
#endif
  for (; i < i1; ++i) {
    const float g = ld(gp, i) * k.gscale;
    const float mo = ld(m, i);
    const float mv = kSmallW ? mo + k.w1 * (g - mo) : g - (g - mo) * (1.f - k.w1);
    const float vv = ld(v, i) * k.b2 + (k.c2 * g) * g;
    if constexpr (kPart != AdamWPart::Params) {
      if constexpr (std::is_same_v<StateT, bf16>) {
        const uint32_t r = round_bits(rk, lo + uint32_t(i - i0));
        m[i].bits = bf16_bits_stochastic(float_bits(mv), r);
        v[i].bits = bf16_bits_stochastic(float_bits(vv), r >> 16);
      } else {
        m[i] = mv;
        v[i] = vv;
      }
    }
    if constexpr (kPart != AdamWPart::Moments) {
      const float pv = ldp(p, i) * k.decay;
      const float denom = std::sqrt(vv) / k.bc2_sqrt + k.eps;
      const float pn = pv + k.neg_step * (mv / denom);
      stp(p, i, pn);
      if constexpr (!std::is_void_v<CopyT>) st(cp, i, pn);
    }
  }
}

// [i0, i1) of a call whose element 0 is element `first` of its blob, cut where the blob index
// crosses a multiple of 2^32 (the keys change there: core/stochastic_round.h).
template <class F>
void adamw_segments(uint64_t key, int64_t first, int64_t i0, int64_t i1, F&& f) {
  while (i0 < i1) {
    const uint64_t at = uint64_t(first + i0);
    const int64_t room = int64_t((uint64_t(1) << 32) - (at & 0xffffffffu));
    const int64_t e = std::min(i1, i0 + room);
    f(round_keys(key, at >> 32), uint32_t(at), i0, e);
    i0 = e;
  }
}

// The pass over n elements of parameter p (ParamT: float* or SplitMaster).
template <class ParamT>
void adamw_pass(ParamT p, int64_t n, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& a,
                AdamWPart part, const RowSelect* select) {
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
  const bool small_w = std::fabs(k.w1) < 0.5f;
  const uint64_t key = round_key(a.round_seed, a.step, a.blob);
  const Isa isa = adamw_isa();
  auto run = [&](auto* gp, auto* cp, auto* mp, auto* vp) {
    using GradT = std::remove_pointer_t<decltype(gp)>;
    using CopyT = std::remove_pointer_t<decltype(cp)>;
    using StateT = std::remove_pointer_t<decltype(mp)>;
    // Pieces of ~1/8 of a thread's share (at least 32 Ki elements), taken by whichever thread is
    // free: the pass is memory-bound and runs beside DMA and the CUDA driver's threads, so equal
    // static chunks would wait for the slowest core. Elementwise: the bits do not depend on it.
    const int64_t piece =
        (std::max<int64_t>(int64_t(1) << 15, n / (int64_t(cpu_pool().size()) * 8)) + 63) / 64 * 64;  // cache lines
    cpu_pool().parallel_pieces(
        n,
        [&](int64_t i0, int64_t i1) {
          auto go = [&](auto small, auto which) {
            auto span = [&](int64_t b0, int64_t b1) {
              adamw_segments(key, a.first, b0, b1, [&](RoundKeys rk, uint32_t lo, int64_t s0, int64_t s1) {
                adamw_range<decltype(small)::value, decltype(which)::value, ParamT, GradT, StateT, CopyT>(
                    isa, p, gp, mp, vp, cp, k, rk, lo, s0, s1);
              });
            };
            if (!select) return span(i0, i1);
            // The selected rows' runs inside the piece (elementwise: a run gives the bits the
            // whole piece would).
            const int64_t len = select->row_len;
            for (int64_t e = i0; e < i1;) {
              const int64_t row = (a.first + e) / len, end = std::min(i1, (row + 1) * len - a.first);
              if (select->rows[row] == select->want) {
                int64_t f = end;
                while (f < i1 && select->rows[(a.first + f) / len] == select->want) f = std::min(i1, f + len);
                span(e, f);
                e = f;
              } else {
                e = end;
              }
            }
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
        },
        piece);
  };
  // m and v share a dtype (ops_check.h).
  auto with_state = [&](auto* gp, auto* cp) {
    if (m.dtype == DType::BF16) {
      run(gp, cp, m.ptr<bf16>(), v.ptr<bf16>());
    } else {
      run(gp, cp, m.ptr<float>(), v.ptr<float>());
    }
  };
  visit(grad, [&](auto* gp) {
    if constexpr (std::is_same_v<ParamT, SplitMaster>) {  // (its high half is the copy)
      with_state(gp, static_cast<void*>(nullptr));
    } else if (param_copy.empty()) {
      with_state(gp, static_cast<void*>(nullptr));
    } else {
      visit(param_copy, [&](auto* cp) { with_state(gp, cp); });
    }
  });
}

}  // namespace

void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& a, AdamWPart part,
           const RowSelect* select) {
  // all [n]; the arguments as ops_check.h's opcheck::adamw checks them
  adamw_pass(param.ptr<float>(), param.numel(), grad, m, v, param_copy, a, part, select);
}

void adamw_split(const SplitMaster& param, Tensor grad, Tensor m, Tensor v, const AdamWParams& a, AdamWPart part,
                 const RowSelect* select) {
  SF_CHECK(param.hi && param.lo && param.ties, "adamw_split: a split master without its parts");
  SF_CHECK(m.numel() == grad.numel() && v.numel() == grad.numel(), "adamw_split: sizes differ");
  adamw_pass(param, grad.numel(), grad, m, v, Tensor(), a, part, select);
}

}  // namespace sf::cpu
