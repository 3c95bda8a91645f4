#include <cmath>

#include "backend/cuda/adamw.cuh"
#include "backend/cuda/kernel_utils.cuh"

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

// The functor of for_each (kernel_utils.cuh): N elements from o.
struct AdamWOp {
  float* __restrict__ param;
  DIn grad;
  float* __restrict__ m;
  float* __restrict__ v;
  DOut copy;
  int has_copy;
  AdamConsts c;
  template <int N>
  __device__ void apply(int64_t o) const {
    float p[N], g[N], mm[N], vv[N];
    load_vec<N>(param + o, p);
    ldv<N>(grad, o, g);
    load_vec<N>(m + o, mm);
    load_vec<N>(v + o, vv);
#pragma unroll
    for (int k = 0; k < N; ++k) adam_one(p[k], g[k], mm[k], vv[k], c);
    store_vec<N>(param + o, p);
    store_vec<N>(m + o, mm);
    store_vec<N>(v + o, vv);
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
  for_each<4>(AdamWOp{param.ptr<float>(), din(grad), m.ptr<float>(), v.ptr<float>(), copy, has_copy ? 1 : 0, c}, n, al,
              L);
}

}  // namespace sf::cuda
