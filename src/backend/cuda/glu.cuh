// Gated linear units out = act(gate) * up on the GPU, for an activation Act with
// __device__ static float value(float g) and static void value_grad(float g, float& v, float& d)
// (act and d act / d g): swiglu.cu (SiLU), geglu.cu (gelu_tanh). Device code: include from .cu only.
#pragma once
#include "backend/cuda/kernel_utils.cuh"

namespace sf::cuda {

template <class Act>
void glu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L);
template <class Act>
void glu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L);

namespace glu_detail {

// act(gate) * up, the element function of Map2 (kernel_utils.cuh).
template <class Act>
struct ActTimes {
  __device__ float operator()(float g, float u) const { return Act::value(g) * u; }
};

// dup = dout * act(gate); dgate = dout * up * act'(gate).
template <class Act>
struct BwdOp {
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
      float v, grad;
      Act::value_grad(g[k], v, grad);
      du[k] = d[k] * v;
      dg[k] = d[k] * u[k] * grad;
    }
    stv<N>(dgate, i, dg);
    stv<N>(dup, i, du);
  }
};

}  // namespace glu_detail

template <class Act>
void glu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L) {
  const int64_t n = out.numel();
  for_each<8>(Map2<glu_detail::ActTimes<Act>>{dout_(out), din(gate), din(up), glu_detail::ActTimes<Act>{}}, n,
              aligned16(out.data) && aligned16(gate.data) && aligned16(up.data), L);
}

template <class Act>
void glu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L) {
  const int64_t n = gate.numel();
  const bool vec = aligned16(dgate.data) && aligned16(dup.data) && aligned16(dout.data) && aligned16(gate.data) &&
                   aligned16(up.data);
  for_each<8>(glu_detail::BwdOp<Act>{dout_(dgate), dout_(dup), din(dout), din(gate), din(up)}, n, vec, L);
}

}  // namespace sf::cuda
