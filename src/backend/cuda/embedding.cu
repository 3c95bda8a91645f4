#include <algorithm>

#include "backend/cuda/embedding.cuh"
#include "backend/cuda/kernel_utils.cuh"

namespace sf::cuda {
namespace {

template <int VEC>
__global__ void embedding_fwd_kernel(DOut out, const int* __restrict__ ids, DIn table, int64_t N, int H, int64_t V) {
  const int nv = H / VEC;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t id = ids[n];
    const bool ok = id >= 0 && id < V;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      float v[VEC];
      if (ok) {
        ldv<VEC>(table, id * H + int64_t(i) * VEC, v);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = __int_as_float(0x7fc00000);
      }
      stv<VEC>(out, n * H + int64_t(i) * VEC, v);
    }
  }
}

constexpr int kBwdThreads = 256;

template <int VEC>
__global__ void __launch_bounds__(kBwdThreads)
    embedding_bwd_kernel(DOut dtable, DIn dout, const int* __restrict__ ids, int N, int H, int64_t V) {
  extern __shared__ float acc[];  // [H]; thread t owns the packs t, t + blockDim, ...
  __shared__ int list[kBwdThreads];
  __shared__ int wcount[kBwdThreads / 32];
  __shared__ int seen;
  const int n = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int id = ids[n];
  if (id < 0 || id >= V) return;
  // 1. Only the block of the first token with this id does the work.
  if (tid == 0) seen = 0;
  __syncthreads();
  for (int m = tid; m < n; m += kBwdThreads)
    if (ids[m] == id) seen = 1;
  __syncthreads();
  if (seen) return;
  const int nv = H / VEC;
  for (int i = tid; i < nv; i += kBwdThreads)
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[i * VEC + k] = 0.f;
  // 2. Tiles of ids from n on: an ordered list of matches per tile, then add their rows in order.
  for (int m0 = n; m0 < N; m0 += kBwdThreads) {
    const int m = m0 + tid;
    const bool match = m < N && ids[m] == id;
    const unsigned ball = __ballot_sync(0xffffffffu, match);
    if (lane == 0) wcount[warp] = __popc(ball);
    __syncthreads();
    int off = 0, total = 0;
#pragma unroll
    for (int w = 0; w < kBwdThreads / 32; ++w) {
      off += w < warp ? wcount[w] : 0;
      total += wcount[w];
    }
    if (match) list[off + __popc(ball & ((1u << lane) - 1u))] = m;
    __syncthreads();
    for (int j = 0; j < total; ++j) {
      const int64_t row = int64_t(list[j]) * H;
      for (int i = tid; i < nv; i += kBwdThreads) {
        float v[VEC];
        ldv<VEC>(dout, row + int64_t(i) * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[i * VEC + k] += v[k];
      }
    }
    __syncthreads();  // list / wcount are rewritten by the next tile
  }
  const int64_t trow = int64_t(id) * H;
  for (int i = tid; i < nv; i += kBwdThreads) {
    float v[VEC];
    ldv<VEC>(dtable, trow + int64_t(i) * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] += acc[i * VEC + k];
    stv<VEC>(dtable, trow + int64_t(i) * VEC, v);
  }
}

// ids_or_zero: one id a thread, grid-stride.
__global__ void ids_or_zero_kernel(int32_t* __restrict__ out, const int32_t* __restrict__ ids, int64_t N,
                                   int64_t limit) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += stride) {
    const int32_t id = ids[i];
    out[i] = id >= 0 && id < limit ? id : 0;
  }
}

}  // namespace

void ids_or_zero(Tensor out, Tensor ids, int64_t limit, const Launch& L) {
  const int64_t N = ids.numel();
  if (N == 0) return;
  ids_or_zero_kernel<<<grid_for(N, 256, L.num_sms), 256, 0, L.stream>>>(out.ptr<int32_t>(), ids.ptr<int32_t>(), N,
                                                                        limit);
  CUDA_CHECK_LAUNCH();
}

void embedding_forward(Tensor out, Tensor ids, Tensor table, const Launch& L) {
  const int64_t H = table.cols(), V = table.rows(), N = ids.numel();
  if (N == 0 || H == 0) return;
  const bool vec = H % 8 == 0 && aligned16(out.data) && aligned16(table.data);
  const int threads = std::clamp(int((vec ? H / 8 : H) + 31) / 32 * 32, 32, 256);
  const unsigned grid = unsigned(std::min<int64_t>(N, int64_t(L.num_sms) * (2048 / threads)));
  if (vec)
    embedding_fwd_kernel<8><<<grid, threads, 0, L.stream>>>(dout_(out), ids.ptr<int>(), din(table), N, int(H), V);
  else
    embedding_fwd_kernel<1><<<grid, threads, 0, L.stream>>>(dout_(out), ids.ptr<int>(), din(table), N, int(H), V);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, const Launch& L) {
  const int64_t H = dtable.cols(), V = dtable.rows(), N = ids.numel();
  SF_CHECK(N < (int64_t(1) << 31),
           "embedding_backward: N = " + std::to_string(N) + " tokens, the cuda kernel takes fewer than 2^31");
  if (N == 0 || H == 0) return;
  const size_t smem = size_t(H) * sizeof(float);
  SF_CHECK(smem <= 200 * 1024, "embedding_backward: H = " + std::to_string(H) +
                                   " is too large for the cuda kernel's shared memory (at most 51200)");
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<unsigned(N), kBwdThreads, smem, L.stream>>>(dout_(dtable), din(dout), ids.ptr<int>(), int(N), int(H), V);
    CUDA_CHECK_LAUNCH();
  };
  if (H % 8 == 0 && aligned16(dtable.data) && aligned16(dout.data))
    launch(embedding_bwd_kernel<8>);
  else
    launch(embedding_bwd_kernel<1>);
}

}  // namespace sf::cuda
