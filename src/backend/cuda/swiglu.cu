#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/swiglu.cuh"

namespace sf::cuda {
namespace {

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }

template <int VEC>
__global__ void swiglu_fwd_kernel(DOut out, DIn gate, DIn up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t i = tid; i < nv; i += stride) {
    float g[VEC], u[VEC];
    ldv<VEC>(gate, i * VEC, g);
    ldv<VEC>(up, i * VEC, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] = g[k] * sigmoidf_(g[k]) * u[k];
    stv<VEC>(out, i * VEC, g);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) {
    const float g = ld1(gate, i);
    st1(out, i, g * sigmoidf_(g) * ld1(up, i));
  }
}

template <int VEC>
__global__ void swiglu_bwd_kernel(DOut dgate, DOut dup, DIn dout, DIn gate, DIn up, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t i = tid; i < nv; i += stride) {
    float d[VEC], g[VEC], u[VEC], dg[VEC], du[VEC];
    ldv<VEC>(dout, i * VEC, d);
    ldv<VEC>(gate, i * VEC, g);
    ldv<VEC>(up, i * VEC, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float s = sigmoidf_(g[k]);
      du[k] = d[k] * g[k] * s;
      dg[k] = d[k] * u[k] * s * (1.f + g[k] * (1.f - s));
    }
    stv<VEC>(dgate, i * VEC, dg);
    stv<VEC>(dup, i * VEC, du);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) {
    const float d = ld1(dout, i), g = ld1(gate, i), u = ld1(up, i), s = sigmoidf_(g);
    st1(dup, i, d * g * s);
    st1(dgate, i, d * u * s * (1.f + g * (1.f - s)));
  }
}

}  // namespace

void swiglu_forward(Tensor out, Tensor gate, Tensor up, const Launch& L) {
  const int64_t n = out.numel();
  SF_CUDA_REQUIRE(gate.numel() == n && up.numel() == n, "cuda swiglu_forward: numel mismatch");
  if (n == 0) return;
  const int threads = 256;
  const unsigned grid = grid_for((n + 7) / 8, threads, L.num_sms);
  if (aligned16(out.data) && aligned16(gate.data) && aligned16(up.data))
    swiglu_fwd_kernel<8><<<grid, threads, 0, L.stream>>>(dout_(out), din(gate), din(up), n);
  else
    swiglu_fwd_kernel<1><<<grid, threads, 0, L.stream>>>(dout_(out), din(gate), din(up), n);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, const Launch& L) {
  const int64_t n = gate.numel();
  SF_CUDA_REQUIRE(dgate.numel() == n && dup.numel() == n && dout.numel() == n && up.numel() == n,
                  "cuda swiglu_backward: numel mismatch");
  if (n == 0) return;
  const int threads = 256;
  const unsigned grid = grid_for((n + 7) / 8, threads, L.num_sms);
  if (aligned16(dgate.data) && aligned16(dup.data) && aligned16(dout.data) && aligned16(gate.data) &&
      aligned16(up.data))
    swiglu_bwd_kernel<8><<<grid, threads, 0, L.stream>>>(dout_(dgate), dout_(dup), din(dout), din(gate), din(up), n);
  else
    swiglu_bwd_kernel<1><<<grid, threads, 0, L.stream>>>(dout_(dgate), dout_(dup), din(dout), din(gate), din(up), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
