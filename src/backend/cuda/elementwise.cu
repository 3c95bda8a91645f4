#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernel_utils.cuh"

namespace sf::cuda {
namespace {

constexpr int kThreads = 256;

// VEC elements per thread and step (VEC = 8: 16-byte bf16 / 2x16-byte f32 accesses), scalar tail.
template <int VEC>
__global__ void add_kernel(DOut out, DIn a, DIn b, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t i = tid; i < nv; i += stride) {
    float x[VEC], y[VEC];
    ldv<VEC>(a, i * VEC, x);
    ldv<VEC>(b, i * VEC, y);
#pragma unroll
    for (int k = 0; k < VEC; ++k) x[k] += y[k];
    stv<VEC>(out, i * VEC, x);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) st1(out, i, ld1(a, i) + ld1(b, i));
}

template <int VEC>
__global__ void scale_kernel(DOut x, float alpha, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t i = tid; i < nv; i += stride) {
    float v[VEC];
    ldv<VEC>(x, i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] *= alpha;
    stv<VEC>(x, i * VEC, v);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) st1(x, i, ld1(x, i) * alpha);
}

template <int VEC>
__global__ void cast_kernel(DOut out, DIn in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t i = tid; i < nv; i += stride) {
    float v[VEC];
    ldv<VEC>(in, i * VEC, v);
    stv<VEC>(out, i * VEC, v);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) st1(out, i, ld1(in, i));
}

}  // namespace

void add(Tensor out, Tensor a, Tensor b, const Launch& L) {
  const int64_t n = out.numel();
  SF_CUDA_REQUIRE(a.numel() == n && b.numel() == n, "cuda add: numel mismatch");
  if (n == 0) return;
  const unsigned grid = grid_for((n + 7) / 8, kThreads, L.num_sms);
  if (aligned16(out.data) && aligned16(a.data) && aligned16(b.data))
    add_kernel<8><<<grid, kThreads, 0, L.stream>>>(dout_(out), din(a), din(b), n);
  else
    add_kernel<1><<<grid, kThreads, 0, L.stream>>>(dout_(out), din(a), din(b), n);
  CUDA_CHECK_LAUNCH();
}

void scale(Tensor x, float alpha, const Launch& L) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const unsigned grid = grid_for((n + 7) / 8, kThreads, L.num_sms);
  if (aligned16(x.data))
    scale_kernel<8><<<grid, kThreads, 0, L.stream>>>(dout_(x), alpha, n);
  else
    scale_kernel<1><<<grid, kThreads, 0, L.stream>>>(dout_(x), alpha, n);
  CUDA_CHECK_LAUNCH();
}

void cast(Tensor out, Tensor in, const Launch& L) {
  const int64_t n = out.numel();
  SF_CUDA_REQUIRE(in.numel() == n, "cuda cast: numel mismatch");
  if (n == 0) return;
  if (out.dtype == in.dtype) {
    if (out.data != in.data)
      CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice, L.stream));
    return;
  }
  const unsigned grid = grid_for((n + 7) / 8, kThreads, L.num_sms);
  if (aligned16(out.data) && aligned16(in.data))
    cast_kernel<8><<<grid, kThreads, 0, L.stream>>>(dout_(out), din(in), n);
  else
    cast_kernel<1><<<grid, kThreads, 0, L.stream>>>(dout_(out), din(in), n);
  CUDA_CHECK_LAUNCH();
}

void zero(Tensor x, const Launch& L) {
  if (x.numel() == 0) return;
  CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.bytes(), L.stream));
}

}  // namespace sf::cuda
