#include <cmath>
#include <type_traits>

#include "backend/cuda/adamw.cuh"
#include "backend/cuda/kernel_utils.cuh"
#include "core/stochastic_round.h"

namespace sf::cuda {
namespace {

// PyTorch's formulation (and the CPU twin's): denom = sqrt(v) / sqrt(1 - b2^t) + eps;
// p = p * (1 - lr*wd) - lr / (1 - b1^t) * m / denom.
// m is updated as at::lerp(m, g, 1 - b1), v as v*b2 + ((1-b2)*g)*g, like torch (and the CPU twin).
struct AdamConsts {
  float w1, b2, c2, eps;  // w1 = 1 - b1, c2 = 1 - b2
  float decay;            // 1 - lr * weight_decay
  float bc2_sqrt;         // sqrt(1 - b2^t)
  float neg_step;         // -lr / (1 - b1^t)
  float grad_scale;
};

__device__ __forceinline__ float adam_one(float& p, float g, float& m, float& v, const AdamConsts& c) {
  g *= c.grad_scale;
  m = fabsf(c.w1) < 0.5f ? m + c.w1 * (g - m) : g - (g - m) * (1.f - c.w1);
  v = v * c.b2 + (c.c2 * g) * g;
  const float denom = sqrtf(v) / c.bc2_sqrt + c.eps;
  p = p * c.decay + c.neg_step * (m / denom);
  return p;
}

// Compact state (m, v BF16): the CPU twin's arithmetic operation for operation with the
// round-to-nearest intrinsics, which nvcc never contracts into FMAs (the fp32 path (adam_one) may be
// contracted: it matches the CPU within an ulp), so p and the fp32 m, v are the CPU's bits and the
// stochastic rounding, the same function of the same values and index, stores the same bf16 bits.
__device__ __forceinline__ void adam_one_exact(float& p, float g, float& m, float& v, const AdamConsts& c) {
  g = __fmul_rn(g, c.grad_scale);
  m = fabsf(c.w1) < 0.5f ? __fadd_rn(m, __fmul_rn(c.w1, __fsub_rn(g, m)))
                         : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), __fsub_rn(1.f, c.w1)));
  v = __fadd_rn(__fmul_rn(v, c.b2), __fmul_rn(__fmul_rn(c.c2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  p = __fadd_rn(__fmul_rn(p, c.decay), __fmul_rn(c.neg_step, __fdiv_rn(m, denom)));
}

// N bf16 bits to p (N = 4: one 8-byte store; the caller checked the alignment).
template <int N>
__device__ __forceinline__ void store_bits(bf16_t* p, const uint16_t (&h)[N]) {
  if constexpr (N == 4) {
    uint2 x;
    x.x = uint32_t(h[0]) | (uint32_t(h[1]) << 16);
    x.y = uint32_t(h[2]) | (uint32_t(h[3]) << 16);
    *reinterpret_cast<uint2*>(p) = x;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) reinterpret_cast<uint16_t*>(p)[k] = h[k];
  }
}

// The functor of for_each (kernel_utils.cuh): N elements from o. StateT float: m and v fp32;
// bf16_t: compact state, element o + k drawing round_bits(key, first + o + k).
template <class StateT>
struct AdamWOp {
  float* __restrict__ param;
  DIn grad;
  StateT* __restrict__ m;
  StateT* __restrict__ v;
  DOut copy;
  int has_copy;
  AdamConsts c;
  uint64_t key = 0;
  int64_t first = 0;
  template <int N>
  __device__ void apply(int64_t o) const {
    float p[N], g[N], mm[N], vv[N];
    load_vec<N>(param + o, p);
    ldv<N>(grad, o, g);
    load_vec<N>(m + o, mm);
    load_vec<N>(v + o, vv);
    if constexpr (std::is_same_v<StateT, float>) {
#pragma unroll
      for (int k = 0; k < N; ++k) adam_one(p[k], g[k], mm[k], vv[k], c);
      store_vec<N>(m + o, mm);
      store_vec<N>(v + o, vv);
    } else {
      uint16_t hm[N], hv[N];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        adam_one_exact(p[k], g[k], mm[k], vv[k], c);
        const uint32_t r = round_bits(key, uint64_t(first + o + k));
        hm[k] = bf16_bits_stochastic(float_bits(mm[k]), r);
        hv[k] = bf16_bits_stochastic(float_bits(vv[k]), r >> 16);
      }
      store_bits<N>(m + o, hm);
      store_bits<N>(v + o, hv);
    }
    store_vec<N>(param + o, p);
    if (has_copy) stv<N>(copy, o, p);
  }
};

}  // namespace

void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor param_copy, const AdamWParams& p, const Launch& L) {
  const int64_t n = param.numel();
  const bool has_copy = !param_copy.empty();
  if (n == 0) return;
  AdamConsts c;
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  c.w1 = float(1.0 - double(p.beta1)), c.b2 = p.beta2, c.c2 = float(1.0 - double(p.beta2)), c.eps = p.eps;
  c.decay = float(1.0 - double(p.lr) * double(p.weight_decay));
  c.bc2_sqrt = float(std::sqrt(bc2));
  c.neg_step = float(-(double(p.lr) / bc1));
  c.grad_scale = p.grad_scale;
  DOut copy = has_copy ? dout_(param_copy) : DOut{nullptr, 0};
  const bool al = aligned16(param.data) && aligned16(grad.data) && aligned16(m.data) && aligned16(v.data) &&
                  (!has_copy || aligned16(param_copy.data));
  if (m.dtype == DType::BF16) {
    for_each<4>(
        AdamWOp<bf16_t>{param.ptr<float>(), din(grad), static_cast<bf16_t*>(m.data), static_cast<bf16_t*>(v.data), copy,
                        has_copy ? 1 : 0, c, round_key(p.round_seed, p.step, p.blob), p.first},
        n, al, L);
    return;
  }
  for_each<4>(AdamWOp<float>{param.ptr<float>(), din(grad), m.ptr<float>(), v.ptr<float>(), copy, has_copy ? 1 : 0, c},
              n, al, L);
}

}  // namespace sf::cuda
