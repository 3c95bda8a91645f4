// Mixture-of-experts kernels. Deterministic: every output element and every reduction has one
// owner thread or block and a fixed order (no float atomics), so runs repeat bit for bit. The
// grouped GEMMs run on cuBLASLt, one GEMM per expert (moe_gemm.cpp).
#include <climits>

#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_gemm.cuh"
#include "core/error.h"

namespace sf::cuda {
namespace {

constexpr int kRowThreads = 128;  // one block a row / token / expert

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  return warp_max(lane < nw ? sh[lane] : -INFINITY);
}

// The better of two (value, expert) candidates of the top-k: a valid expert beats none, then the
// larger value, then (ties) the lower expert; the cpu twin's order.
__device__ __forceinline__ bool better(float v, int e, float bv, int be) {
  if (be == INT_MAX) return e != INT_MAX;
  if (e == INT_MAX) return false;
  return v > bv || (v == bv && e < be);
}

// Softmax in fp32, top-k by k rounds of a block argmax over the experts not yet taken.
__global__ void route_kernel(float* __restrict__ probs, int32_t* __restrict__ idx, float* __restrict__ wt, DIn logits,
                             int E, int k, int renorm) {
  extern __shared__ float smem[];
  float* p = smem;                                                    // [E]
  unsigned char* taken = reinterpret_cast<unsigned char*>(smem + E);  // [E]
  __shared__ float red[32];
  __shared__ float rv[32];
  __shared__ int ri[32];
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  float mx = -INFINITY;
  for (int e = tid; e < E; e += blockDim.x) {
    p[e] = ld1(logits, r * E + e);
    mx = fmaxf(mx, p[e]);
  }
  mx = block_max(mx, red);
  float s = 0.f;
  for (int e = tid; e < E; e += blockDim.x) s += (p[e] = expf(p[e] - mx));
  s = block_sum(s, red);
  const float inv = 1.f / s;
  for (int e = tid; e < E; e += blockDim.x) {
    p[e] *= inv;
    probs[r * E + e] = p[e];
    taken[e] = 0;
  }
  __syncthreads();
  float wsum = 0.f;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int be = INT_MAX;
    for (int e = tid; e < E; e += blockDim.x)
      if (!taken[e] && better(p[e], e, bv, be)) bv = p[e], be = e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (better(ov, oe, bv, be)) bv = ov, be = oe;
    }
    if (lane == 0) rv[warp] = bv, ri[warp] = be;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < nw; ++w)
        if (better(rv[w], ri[w], bv, be)) bv = rv[w], be = ri[w];
      taken[be] = 1;
      idx[r * k + j] = be;
      wt[r * k + j] = p[be];
      wsum += p[be];
    }
    __syncthreads();
  }
  if (tid == 0 && renorm)
    for (int j = 0; j < k; ++j) wt[r * k + j] /= wsum;
}

// stats[e] += tokens that picked e; stats[E + e] += sum of probs[:, e]. One block an expert.
__global__ void route_stats_kernel(float* __restrict__ stats, const float* __restrict__ probs,
                                   const int32_t* __restrict__ idx, int64_t N, int E, int k) {
  __shared__ float red[32];
  const int e = blockIdx.x;
  float ps = 0.f, cnt = 0.f;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) ps += probs[r * E + e];
  for (int64_t s = threadIdx.x; s < N * k; s += blockDim.x) cnt += idx[s] == e ? 1.f : 0.f;
  ps = block_sum(ps, red);
  cnt = block_sum(cnt, red);
  if (threadIdx.x == 0) {
    stats[e] += cnt;
    stats[E + e] += ps;
  }
}

__global__ void route_bwd_kernel(DOut dlogits, const float* __restrict__ dwt, const float* __restrict__ probs,
                                 const int32_t* __restrict__ idx, int E, int k, int renorm,
                                 const float* __restrict__ counts, float aux_scale) {
  extern __shared__ float dp[];  // [E]
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* p = probs + r * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) dp[e] = counts ? aux_scale * counts[e] : 0.f;
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t* ir = idx + r * k;
    const float* dw = dwt + r * k;
    if (renorm) {  // w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S
      float S = 0.f, dot = 0.f;
      for (int j = 0; j < k; ++j) S += p[ir[j]];
      for (int j = 0; j < k; ++j) dot += dw[j] * (p[ir[j]] / S);
      for (int j = 0; j < k; ++j) dp[ir[j]] += (dw[j] - dot) / S;
    } else {
      for (int j = 0; j < k; ++j) dp[ir[j]] += dw[j];
    }
  }
  __syncthreads();
  float pdp = 0.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) pdp += p[e] * dp[e];
  pdp = block_sum(pdp, red);
  for (int e = threadIdx.x; e < E; e += blockDim.x) st1(dlogits, r * E + e, p[e] * (dp[e] - pdp));
}

// Counting sort, pass 1: offsets[e + 1] = slots of expert e (one block an expert).
__global__ void permute_count_kernel(int32_t* __restrict__ offsets, const int32_t* __restrict__ idx, int64_t S) {
  __shared__ float red[32];
  const int e = blockIdx.x;
  float c = 0.f;
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) c += idx[s] == e ? 1.f : 0.f;
  c = block_sum(c, red);  // exact: counts < 2^24 (ops_check bounds S by 2^31; see moe_permute)
  if (threadIdx.x == 0) offsets[e + 1] = int32_t(c);
  if (e == 0 && threadIdx.x == 0) offsets[0] = 0;
}

// Pass 2: running sum (E <= 4096: one thread is enough); mirror (host memory mapped for the
// device, may be null): the same E+1 values, for the grouped GEMMs' row counts (moe_gemm.cuh).
__global__ void permute_scan_kernel(int32_t* offsets, int E, int32_t* mirror) {
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  if (mirror)
    for (int e = 0; e <= E; ++e) mirror[e] = offsets[e];
}

// Pass 3: expert e's slots in slot order (a block-wide ballot scan over all slots).
__global__ void permute_place_kernel(int32_t* __restrict__ ss, int32_t* __restrict__ sp,
                                     const int32_t* __restrict__ idx, const int32_t* __restrict__ offsets, int64_t S) {
  __shared__ int wtot[32];
  __shared__ int base;
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (threadIdx.x == 0) base = offsets[e];
  __syncthreads();
  for (int64_t s0 = 0; s0 < S; s0 += blockDim.x) {
    const int64_t s = s0 + threadIdx.x;
    const bool f = s < S && idx[s] == e;
    const unsigned m = __ballot_sync(0xffffffffu, f);
    if (lane == 0) wtot[warp] = __popc(m);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < nw; ++w) {
      before += w < warp ? wtot[w] : 0;
      total += wtot[w];
    }
    if (f) {
      const int p = base + before + __popc(m & ((1u << lane) - 1u));
      ss[p] = int32_t(s);
      sp[s] = p;
    }
    __syncthreads();
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
}

__global__ void gather_kernel(DOut xs, DIn x, const int32_t* __restrict__ ss, int64_t S, int64_t H, int k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < S * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / H, h = i - p * H;
    st1(xs, i, ld1(x, int64_t(ss[p] / k) * H + h));
  }
}

__global__ void gather_bwd_kernel(DOut dx, DIn dxs, const int32_t* __restrict__ sp, int64_t N, int64_t H, int k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, h = i - n * H;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += ld1(dxs, int64_t(sp[n * k + j]) * H + h);
    st1(dx, i, acc);
  }
}

__global__ void combine_kernel(DOut y, DIn ys, const float* __restrict__ wt, const int32_t* __restrict__ sp, int64_t N,
                               int64_t H, int k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, h = i - n * H;
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += wt[n * k + j] * ld1(ys, int64_t(sp[n * k + j]) * H + h);
    st1(y, i, acc);
  }
}

__global__ void combine_bwd_kernel(DOut dys, float* __restrict__ dwt, DIn dy, DIn ys, const float* __restrict__ wt,
                                   const int32_t* __restrict__ sp, int64_t H, int k) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const int64_t p = sp[n * k + j];
    const float wj = wt[n * k + j];
    float dot = 0.f;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      const float g = ld1(dy, n * H + h);
      st1(dys, p * H + h, wj * g);
      dot += g * ld1(ys, p * H + h);
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) dwt[n * k + j] = dot;
  }
}

__global__ void aux_loss_kernel(float* loss, const float* __restrict__ stats, int E, float scale) {
  __shared__ float red[32];
  float s = 0.f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) s += stats[e] * stats[E + e];
  s = block_sum(s, red);
  if (threadIdx.x == 0) loss[0] += scale * s;
}

// Shared memory of the per-row router kernels, opted in above 48 KiB once per kernel.
template <class Kern>
void row_smem(Kern kernel, size_t bytes) {
  SF_CHECK(bytes <= 200 * 1024, "moe: too many experts for the router kernel's shared memory");
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

unsigned elem_grid(int64_t n, const Launch& L) { return grid_for(n, 256, L.num_sms); }

}  // namespace

void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm, const Launch& L) {
  const int64_t N = idx.rows(), k = idx.cols(), E = logits.cols();
  if (N == 0) return;
  SF_CHECK(N < (int64_t(1) << 31), "moe_route: too many rows for the cuda kernel");
  const size_t smem = size_t(E) * 5;  // probs (float) + taken (byte)
  row_smem(route_kernel, smem);
  route_kernel<<<unsigned(N), kRowThreads, (smem + 3) / 4 * 4, L.stream>>>(
      probs.ptr<float>(), idx.ptr<int32_t>(), weights.ptr<float>(), din(logits), int(E), int(k), renorm ? 1 : 0);
  CUDA_CHECK_LAUNCH();
  if (stats.empty()) return;
  route_stats_kernel<<<unsigned(E), 256, 0, L.stream>>>(stats.ptr<float>(), probs.ptr<float>(), idx.ptr<int32_t>(), N,
                                                        int(E), int(k));
  CUDA_CHECK_LAUNCH();
}

void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                        float aux_scale, const Launch& L) {
  const int64_t N = idx.rows(), k = idx.cols(), E = probs.cols();
  if (N == 0) return;
  const size_t smem = size_t(E) * 4;
  row_smem(route_bwd_kernel, smem);
  route_bwd_kernel<<<unsigned(N), kRowThreads, smem, L.stream>>>(
      dout_(dlogits), dweights.ptr<float>(), probs.ptr<float>(), idx.ptr<int32_t>(), int(E), int(k), renorm ? 1 : 0,
      counts.empty() ? nullptr : counts.ptr<float>(), aux_scale);
  CUDA_CHECK_LAUNCH();
}

void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, const Launch& L) {
  const int64_t S = idx.numel(), E = offsets.numel() - 1;
  SF_CHECK(S < (int64_t(1) << 24), "moe_permute: N*k = " + std::to_string(S) + " slots, the cuda kernel takes < 2^24");
  permute_count_kernel<<<unsigned(E), 256, 0, L.stream>>>(offsets.ptr<int32_t>(), idx.ptr<int32_t>(), S);
  CUDA_CHECK_LAUNCH();
  // The scan also writes the host copy of the offsets, before the placement and the gather run:
  // the grouped GEMMs' one host wait ends while the GPU still has those to do.
  auto scan = [&](int32_t* mirror) {
    permute_scan_kernel<<<1, 1, 0, L.stream>>>(offsets.ptr<int32_t>(), int(E), mirror);
    CUDA_CHECK_LAUNCH();
  };
  if (L.moe)
    L.moe->publish(offsets, L.stream, scan);
  else
    scan(nullptr);
  if (S == 0) return;
  permute_place_kernel<<<unsigned(E), 256, 0, L.stream>>>(sorted_slot.ptr<int32_t>(), slot_pos.ptr<int32_t>(),
                                                          idx.ptr<int32_t>(), offsets.ptr<int32_t>(), S);
  CUDA_CHECK_LAUNCH();
}

void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, const Launch& L) {
  const int64_t S = xs.rows(), H = xs.cols();
  if (S * H == 0) return;
  gather_kernel<<<elem_grid(S * H, L), 256, 0, L.stream>>>(dout_(xs), din(x), sorted_slot.ptr<int32_t>(), S, H, k);
  CUDA_CHECK_LAUNCH();
}

void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, const Launch& L) {
  const int64_t N = dx.rows(), H = dx.cols();
  if (N * H == 0) return;
  gather_bwd_kernel<<<elem_grid(N * H, L), 256, 0, L.stream>>>(dout_(dx), din(dxs), slot_pos.ptr<int32_t>(), N, H, k);
  CUDA_CHECK_LAUNCH();
}

void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, const Launch& L) {
  const int64_t N = y.rows(), H = y.cols(), k = weights.cols();
  if (N * H == 0) return;
  combine_kernel<<<elem_grid(N * H, L), 256, 0, L.stream>>>(dout_(y), din(ys), weights.ptr<float>(),
                                                            slot_pos.ptr<int32_t>(), N, H, int(k));
  CUDA_CHECK_LAUNCH();
}

void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                          const Launch& L) {
  const int64_t N = dy.rows(), H = dy.cols(), k = weights.cols();
  if (N == 0) return;
  SF_CHECK(N < (int64_t(1) << 31), "moe_combine_backward: too many rows for the cuda kernel");
  combine_bwd_kernel<<<unsigned(N), kRowThreads, 0, L.stream>>>(
      dout_(dys), dweights.ptr<float>(), din(dy), din(ys), weights.ptr<float>(), slot_pos.ptr<int32_t>(), H, int(k));
  CUDA_CHECK_LAUNCH();
}

namespace {

__global__ void expert_scale_kernel(float* __restrict__ out, const float* __restrict__ w,
                                    const int32_t* __restrict__ idx, DIn scale, int64_t S) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < S; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = w[i] * ld1(scale, idx[i]);
}

// One block per expert e: dscale[e] += the sum over slots that chose e of dout * w (block-strided,
// then the fixed tree of block_sum: the same bits every run).
__global__ void expert_scale_dscale_kernel(DOut dscale, const float* __restrict__ dout, const float* __restrict__ w,
                                           const int32_t* __restrict__ idx, int64_t S) {
  __shared__ float red[32];
  const int e = int(blockIdx.x);
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x)
    if (idx[i] == e) acc += dout[i] * w[i];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) st1(dscale, e, ld1(dscale, e) + acc);
}

}  // namespace

void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, const Launch& L) {
  const int64_t S = w.numel();
  if (S == 0) return;
  expert_scale_kernel<<<elem_grid(S, L), 256, 0, L.stream>>>(out.ptr<float>(), w.ptr<float>(), idx.ptr<int32_t>(),
                                                             din(scale), S);
  CUDA_CHECK_LAUNCH();
}

void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                               const Launch& L) {
  const int64_t S = w.numel(), E = scale.numel();
  if (S == 0) return;
  SF_CHECK(E < (int64_t(1) << 31), "moe_expert_scale_backward: too many experts for the cuda kernel");
  // dscale first: it reads dout, which dw may alias.
  expert_scale_dscale_kernel<<<unsigned(E), kRowThreads, 0, L.stream>>>(dout_(dscale), dout.ptr<float>(),
                                                                        w.ptr<float>(), idx.ptr<int32_t>(), S);
  CUDA_CHECK_LAUNCH();
  expert_scale_kernel<<<elem_grid(S, L), 256, 0, L.stream>>>(dw.ptr<float>(), dout.ptr<float>(), idx.ptr<int32_t>(),
                                                             din(scale), S);
  CUDA_CHECK_LAUNCH();
}

void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, const Launch& L) {
  aux_loss_kernel<<<1, 256, 0, L.stream>>>(loss_sum.ptr<float>(), stats.ptr<float>(), int(stats.numel() / 2), scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
