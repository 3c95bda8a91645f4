#include <algorithm>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/linear_ce.cuh"
#include "backend/cuda/matmul.cuh"
#include "core/align.h"

namespace sf::cuda {
namespace {

constexpr int kCeThreads = 512;
constexpr int64_t kIgnore = -100;

// Online (max, sum of exp) pair merge.
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

// One block per row of the chunk. logits: F32 rows of V (row stride V floats). G: the gradient's
// element type (bf16_t: written in place with row stride 2V elements; float: in place, stride V).
// softcap > 0 (Gemma 4): the row is first replaced by s = c tanh(z / c), in place, and the
// gradient is multiplied by ds/dz = 1 - (s / c)^2 (as the CPU twin).
template <class G, int VEC>
__global__ void __launch_bounds__(kCeThreads)
    ce_rows_kernel(float* logits, const int* __restrict__ labels, float* __restrict__ row_loss, int64_t V,
                   float grad_scale, int want_grad, float softcap) {
  __shared__ float shm[32], shs[32];
  const int64_t row = blockIdx.x;
  float* lrow = logits + row * V;
  const int64_t label = labels[row];
  const bool ignored = label == kIgnore;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (softcap > 0.f) {
    const float inv = 1.f / softcap;
    for (int64_t i = tid; i < V; i += kCeThreads) lrow[i] = softcap * tanhf(lrow[i] * inv);
    __syncthreads();  // the label logit below is read by thread 0
  }

  // Pass 1: max and sum of exp (online per thread, then merged over the block).
  float m = -INFINITY, s = 0.f;
  const int64_t nv = V / VEC;
  for (int64_t i = tid; i < nv; i += kCeThreads) {
    float v[VEC];
    load_vec<VEC>(lrow + i * VEC, v);
    float mx = v[0];
#pragma unroll
    for (int k = 1; k < VEC; ++k) mx = fmaxf(mx, v[k]);
    const float mn = fmaxf(m, mx);
    float acc = s * __expf(m - mn);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc += __expf(v[k] - mn);
    m = mn, s = acc;
  }
  for (int64_t i = nv * VEC + tid; i < V; i += kCeThreads) {
    const float v = lrow[i];
    const float mn = fmaxf(m, v);
    s = s * __expf(m - mn) + __expf(v - mn);
    m = mn;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_merge(m, s, m2, s2);
  }
  if (lane == 0) shm[warp] = m, shs[warp] = s;
  __syncthreads();
  m = lane < kCeThreads / 32 ? shm[lane] : -INFINITY;
  s = lane < kCeThreads / 32 ? shs[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_merge(m, s, m2, s2);
  }
  const float lse = m + logf(s);
  const bool valid = !ignored && label >= 0 && label < V;
  if (tid == 0) {
    if (ignored)
      row_loss[row] = 0.f;
    else if (!valid)
      row_loss[row] = __int_as_float(0x7fc00000);  // a label outside [0, V): NaN, loudly
    else
      row_loss[row] = lse - lrow[label];
  }
  if (!want_grad) return;
  __syncthreads();  // the label logit was read before any thread overwrites the row

  // Pass 2: g = grad_scale * (softmax - onehot), in place, front to back in tiles.
  G* grow = reinterpret_cast<G*>(lrow);
  const float gs = valid ? grad_scale : 0.f;
  constexpr int kTile = kCeThreads * VEC;
  for (int64_t t0 = 0; t0 < V; t0 += kTile) {
    const int64_t i0 = t0 + int64_t(tid) * VEC;
    float v[VEC];
    const bool full = i0 + VEC <= V;
    if (full) {
      load_vec<VEC>(lrow + i0, v);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = i0 + k < V ? lrow[i0 + k] : 0.f;
    }
    if constexpr (sizeof(G) < sizeof(float)) __syncthreads();  // this tile's reads before its narrower writes
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float p = __expf(v[k] - lse);
      const float t = softcap > 0.f ? v[k] / softcap : 0.f;  // tanh(z / c) of the capped logit
      v[k] = gs * (p - (i0 + k == label ? 1.f : 0.f)) * (1.f - t * t);
    }
    if (full) {
      store_vec<VEC>(grow + i0, v);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (i0 + k < V) grow[i0 + k] = from_f<G>(v[k]);
    }
  }
}

// loss_sum[0] += sum(row_loss[0..n)) of one chunk, in a fixed order (deterministic).
__global__ void loss_reduce_kernel(float* loss_sum, const float* __restrict__ row_loss, int64_t n) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += row_loss[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) t += sh[w];
    loss_sum[0] = float(double(loss_sum[0]) + t);
  }
}

}  // namespace

void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float grad_scale,
                          Tensor ws, const Launch& L, float softcap) {
  const int64_t N = x.rows(), H = x.cols(), V = w.rows();
  // The arguments and the workspace size as ops_check.h checks them; the dtype mixes below are this
  // kernel's own limits (its gemms are cuBLASLt's, see matmul.cu).
  SF_CHECK(x.dtype == w.dtype, std::string("linear_cross_entropy: the cuda kernel needs x and w of one dtype, got ") +
                                   dt_name(x.dtype) + " and " + dt_name(w.dtype));
  if (x.dtype == DType::F32) {
    SF_CHECK(dx.empty() || dx.dtype == DType::F32,
             "linear_cross_entropy: the cuda kernel needs an F32 dx for an F32 x");
    SF_CHECK(dw.empty() || dw.dtype == DType::F32,
             "linear_cross_entropy: the cuda kernel needs an F32 dw for an F32 x");
  }
  if (N == 0) return;
  float* logits = static_cast<float*>(ws.data);
  // Per-row losses of a chunk [nc] F32: in the stream's kernel scratch, so ws is only the logits.
  float* row_loss = static_cast<float*>(L.scratch->buf);
  const bool bf = x.dtype == DType::BF16;
  const bool want_grad = !dx.empty() || !dw.empty();
  const int64_t nc_max = linear_ce_chunk_rows(N, V);
  SF_CHECK(size_t(nc_max) * 4 <= L.scratch->buf_bytes,
           "linear_cross_entropy: a chunk of " + std::to_string(nc_max) + " rows overflows the cuda kernel's scratch");
  const size_t xe = dtype_size(x.dtype);
  for (int64_t n0 = 0; n0 < N; n0 += nc_max) {
    const int64_t nc = std::min(nc_max, N - n0);
    const void* xc = static_cast<const char*>(x.data) + size_t(n0) * size_t(H) * xe;
    // 1. logits [nc, V] F32 = x_c @ w^T
    gemm(Gemm{logits, DType::F32, V, xc, x.dtype, H, w.data, w.dtype, H, nc, V, H, false, true, 1.f, 0.f}, L);
    // 2. per-row loss and in-place gradient
    auto rows = [&](auto kernel) {
      kernel<<<unsigned(nc), kCeThreads, 0, L.stream>>>(logits, labels.ptr<int>() + n0, row_loss, V, grad_scale,
                                                        want_grad ? 1 : 0, softcap);
      CUDA_CHECK_LAUNCH();
      loss_reduce_kernel<<<1, 1024, 0, L.stream>>>(loss_sum.ptr<float>(), row_loss, nc);
      CUDA_CHECK_LAUNCH();
    };
    const bool v4 = V % 4 == 0;
    if (bf)
      v4 ? rows(ce_rows_kernel<bf16_t, 4>) : rows(ce_rows_kernel<bf16_t, 1>);
    else
      v4 ? rows(ce_rows_kernel<float, 4>) : rows(ce_rows_kernel<float, 1>);
    if (!want_grad) continue;
    const DType gt = bf ? DType::BF16 : DType::F32;
    const int64_t ldg = bf ? 2 * V : V;
    // 3. dw [V, H] += g^T @ x_c, then dx_c [nc, H] = g @ w (in this order: dx may alias x exactly)
    if (!dw.empty())
      gemm(Gemm{dw.data, dw.dtype, H, logits, gt, ldg, xc, x.dtype, H, V, H, nc, true, false, 1.f, 1.f}, L);
    if (!dx.empty()) {
      void* dxc = static_cast<char*>(dx.data) + size_t(n0) * size_t(H) * dtype_size(dx.dtype);
      gemm(Gemm{dxc, dx.dtype, H, logits, gt, ldg, w.data, w.dtype, H, nc, H, V, false, false, 1.f, 0.f}, L);
    }
  }
}

}  // namespace sf::cuda
