#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/sq_norm.cuh"

namespace sf::cuda {
namespace {

template <int VEC>
__global__ void sq_norm_kernel(float* out, DIn x, int64_t n) {
  __shared__ float sh[32];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  float acc = 0.f;
  for (int64_t i = tid; i < nv; i += stride) {
    float v[VEC];
    ldv<VEC>(x, i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc = fmaf(v[k], v[k], acc);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) {
    float v = ld1(x, i);
    acc = fmaf(v, v, acc);
  }
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

}  // namespace

void sq_norm(Tensor out, Tensor x, const Launch& L) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int threads = 256;
  const unsigned grid = grid_for((n + 7) / 8, threads, L.num_sms, 4);
  if (aligned16(x.data))
    sq_norm_kernel<8><<<grid, threads, 0, L.stream>>>(out.ptr<float>(), din(x), n);
  else
    sq_norm_kernel<1><<<grid, threads, 0, L.stream>>>(out.ptr<float>(), din(x), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
