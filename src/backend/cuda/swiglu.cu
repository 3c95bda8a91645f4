#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/swiglu.cuh"

namespace sf::cuda {
namespace {

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }

// silu(gate) * up, the element function of Map2 (kernel_utils.cuh).
struct SiluTimes {
  __device__ float operator()(float g, float u) const { return g * sigmoidf_(g) * u; }
};

struct SwigluBwdOp {
  DOut dgate, dup;
  DIn dout, gate, up;
  template <int N>
  __device__ void apply(int64_t i) const {
    float d[N], g[N], u[N], dg[N], du[N];
    ldv<N>(dout, i, d);
    ldv<N>(gate, i, g);
    ldv<N>(up, i, u);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float s = sigmoidf_(g[k]);
      du[k] = d[k] * g[k] * s;
      dg[k] = d[k] * u[k] * s * (1.f + g[k] * (1.f - s));
    }
    stv<N>(dgate, i, dg);
    stv<N>(dup, i, du);
  }
};

}  // namespace

void swiglu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L) {
  const int64_t n = out.numel();
  for_each<8>(Map2<SiluTimes>{dout_(out), din(gate), din(up), SiluTimes{}}, n,
              aligned16(out.data) && aligned16(gate.data) && aligned16(up.data), L);
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L) {
  const int64_t n = gate.numel();
  const bool vec = aligned16(dgate.data) && aligned16(dup.data) && aligned16(dout.data) && aligned16(gate.data) &&
                   aligned16(up.data);
  for_each<8>(SwigluBwdOp{dout_(dgate), dout_(dup), din(dout), din(gate), din(up)}, n, vec, L);
}

}  // namespace sf::cuda
