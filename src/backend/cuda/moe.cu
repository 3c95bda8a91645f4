// Mixture-of-experts kernels. Deterministic: every output element and every reduction has one
// owner thread or block and a fixed order (no float atomics), so runs repeat bit for bit.
//
// The grouped GEMMs: one launch for all experts, any routing (experts with no rows, one expert
// with all). BF16 operands run on tensor cores (mma.sync m16n8k16, fp32 accumulate, 128 x 128
// tiles); F32 operands (and SF_MOE_SIMT=1, the fallback) on shared-memory tiled SIMT kernels.
#include <algorithm>
#include <climits>

#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/moe.cuh"
#include "core/env.h"
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

// Pass 2: running sum (E <= 4096: one thread is enough).
__global__ void permute_scan_kernel(int32_t* offsets, int E) {
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
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

// ---- grouped GEMMs: 64 x 64 tiles, 16-deep k slices, 256 threads of 4 x 4 outputs each.
constexpr int BM = 64, BN = 64, BK = 16, kMmThreads = 256;

// acc[i][j] += sum over the slice of As[k][ty + 16 i] * Bs[k][tx + 16 j] (thread (tx, ty) of 16 x 16).
__device__ __forceinline__ void simt_tile_fma(float (&acc)[4][4], const float (*As)[BM + 1],
                                              const float (*Bs)[BN + 1]) {
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
  for (int kk = 0; kk < BK; ++kk) {
    float av[4], bv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i], bv[i] = Bs[kk][tx + 16 * i];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
  }
}

// out[r] = a[r] @ op(W_e) + beta out[r] over expert e's rows; blockIdx.y enumerates the row tiles
// of all experts in order (the grid has an upper bound of them: ceil(M / BM) + E).
__global__ void __launch_bounds__(kMmThreads)
    grouped_mm_kernel(DOut out, DIn a, DIn w, const int32_t* __restrict__ off, int E, int64_t stride, int K, int Nout,
                      int trans_w, float beta) {
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 1];
  int t = blockIdx.y, e = 0, r0 = 0, r_end = 0;
  for (; e < E; ++e) {
    const int c0 = off[e], c1 = off[e + 1], tiles = (c1 - c0 + BM - 1) / BM;
    if (t < tiles) {
      r0 = c0 + t * BM;
      r_end = c1;
      break;
    }
    t -= tiles;
  }
  if (e == E) return;
  const int col0 = blockIdx.x * BN, tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t wbase = int64_t(e) * stride;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += kMmThreads) {
      const int m = i / BK, kk = i % BK, r = r0 + m, kg = k0 + kk;
      As[kk][m] = (r < r_end && kg < K) ? ld1(a, int64_t(r) * K + kg) : 0.f;
    }
    for (int i = threadIdx.x; i < BN * BK; i += kMmThreads) {
      // Consecutive threads along W's contiguous dimension.
      const int n = trans_w ? i / BK : i % BN, kk = trans_w ? i % BK : i / BN;
      const int ng = col0 + n, kg = k0 + kk;
      float v = 0.f;
      if (ng < Nout && kg < K) v = ld1(w, wbase + (trans_w ? int64_t(ng) * K + kg : int64_t(kg) * Nout + ng));
      Bs[kk][n] = v;
    }
    __syncthreads();
    simt_tile_fma(acc, As, Bs);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = r0 + ty + 16 * i;
    if (r >= r_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = col0 + tx + 16 * j;
      if (c >= Nout) continue;
      const int64_t o = int64_t(r) * Nout + c;
      st1(out, o, acc[i][j] + (beta != 0.f ? beta * ld1(out, o) : 0.f));
    }
  }
}

// dW_e [Nout, K] += dy_e^T x_e: blockIdx.z = expert, the reduction over its rows.
__global__ void __launch_bounds__(kMmThreads)
    grouped_wgrad_kernel(DOut dw, DIn dy, DIn x, const int32_t* __restrict__ off, int64_t stride, int K, int Nout) {
  __shared__ float As[BK][BM + 1];  // [rows][o]
  __shared__ float Bs[BK][BN + 1];  // [rows][c]
  const int e = blockIdx.z, c0 = off[e], c1 = off[e + 1];
  if (c1 == c0) return;
  const int o0 = blockIdx.y * BM, col0 = blockIdx.x * BN, tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  float acc[4][4] = {};
  for (int r0 = c0; r0 < c1; r0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += kMmThreads) {
      const int rr = i / BM, o = i % BM, r = r0 + rr, og = o0 + o;
      As[rr][o] = (r < c1 && og < Nout) ? ld1(dy, int64_t(r) * Nout + og) : 0.f;
    }
    for (int i = threadIdx.x; i < BN * BK; i += kMmThreads) {
      const int rr = i / BN, c = i % BN, r = r0 + rr, cg = col0 + c;
      Bs[rr][c] = (r < c1 && cg < K) ? ld1(x, int64_t(r) * K + cg) : 0.f;
    }
    __syncthreads();
    simt_tile_fma(acc, As, Bs);
    __syncthreads();
  }
  const int64_t wbase = int64_t(e) * stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int o = o0 + ty + 16 * i;
    if (o >= Nout) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = col0 + tx + 16 * j;
      if (c >= K) continue;
      const int64_t idx = wbase + int64_t(o) * K + c;
      st1(dw, idx, ld1(dw, idx) + acc[i][j]);
    }
  }
}

// ---- tensor-core grouped GEMM: C[m, n] = sum_k A(m, k) B(n, k), bf16 in, fp32 accumulate.
// Tiles of 128 (m) x 128 (n), 32 deep; 8 warps of 64 x 32. Both operands are staged in shared
// memory k-contiguous ([row][k], rows padded to 40 elements: 80-byte rows keep ldmatrix free of
// bank conflicts), whatever their layout in global memory: an operand stored with k contiguous
// is copied 8 elements at a time, one stored with rows contiguous is read 8 rows at a time and
// transposed on the way in.
constexpr int TM = 128, TN = 128, TK = 32, TKP = 40, kTcThreads = 256;

// One operand: element (i, k) at p[i * si + k * sk] (si == 1 or sk == 1), valid for i < i_end and
// k_begin <= k < k_end.
struct TcOperand {
  const bf16_t* p;
  int64_t si, sk;
};

__device__ __forceinline__ bool aligned16_dev(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

template <bool KCONTIG>
__device__ __forceinline__ void tc_load(bf16_t (*S)[TKP], const TcOperand& op, int i0, int i_end, int k0, int k_end) {
  const bf16_t zero = __float2bfloat16_rn(0.f);
  for (int q = threadIdx.x; q < TM * TK / 8; q += kTcThreads) {
    if constexpr (KCONTIG) {  // 8 consecutive k of one row
      const int r = q / (TK / 8), kc = (q % (TK / 8)) * 8, i = i0 + r, k = k0 + kc;
      const bf16_t* g = op.p + int64_t(i) * op.si + k;
      if (i < i_end && k + 8 <= k_end && op.si % 8 == 0 && aligned16_dev(g)) {
        *reinterpret_cast<uint4*>(&S[r][kc]) = *reinterpret_cast<const uint4*>(g);
      } else {
#pragma unroll
        for (int t = 0; t < 8; ++t) S[r][kc + t] = (i < i_end && k + t < k_end) ? g[t] : zero;
      }
    } else {  // 8 consecutive rows of one k, transposed into the tile
      const int kk = q / (TM / 8), rc = (q % (TM / 8)) * 8, i = i0 + rc, k = k0 + kk;
      const bf16_t* g = op.p + int64_t(k) * op.sk + i;
      if (k < k_end && i + 8 <= i_end && op.sk % 8 == 0 && aligned16_dev(g)) {
        const uint4 v = *reinterpret_cast<const uint4*>(g);
        const bf16_t* h = reinterpret_cast<const bf16_t*>(&v);
#pragma unroll
        for (int t = 0; t < 8; ++t) S[rc + t][kk] = h[t];
      } else {
#pragma unroll
        for (int t = 0; t < 8; ++t) S[rc + t][kk] = (k < k_end && i + t < i_end) ? g[t] : zero;
      }
    }
  }
}

// acc[mt][nt] (16 x 8 each) += the block's tile product over k in [k_begin, k_end).
template <bool AK, bool BK>
__device__ __forceinline__ void tc_tile(float (&acc)[4][4][4], bf16_t (*As)[TKP], bf16_t (*Bs)[TKP], const TcOperand& A,
                                        int m0, int m_end, const TcOperand& B, int n0, int n_end, int k_begin,
                                        int k_end) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
  for (int k0 = k_begin; k0 < k_end; k0 += TK) {
    tc_load<AK>(As, A, m0, m_end, k0, k_end);
    tc_load<BK>(Bs, B, n0, n_end, k0, k_end);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < TK; ks += 16) {
      uint32_t af[4][4], bfr[2][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) ldsm_x4(af[mt], &As[wm * 64 + mt * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
      for (int np = 0; np < 2; ++np)
        ldsm_x4(bfr[np], &Bs[wn * 32 + np * 16 + (lane & 7) + (lane >> 4) * 8][ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          mma_bf16(acc[mt][nt], af[mt], bfr[nt >> 1][(nt & 1) * 2], bfr[nt >> 1][(nt & 1) * 2 + 1]);
    }
    __syncthreads();
  }
}

// Visits the block's outputs: f(m, n, value) for each valid (m < m_end, n < n_end).
template <class F>
__device__ __forceinline__ void tc_store(const float (&acc)[4][4][4], int m0, int m_end, int n0, int n_end, F f) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = m0 + wm * 64 + mt * 16 + (lane >> 2) + (c >> 1) * 8;
        const int n = n0 + wn * 32 + nt * 8 + (lane & 3) * 2 + (c & 1);
        if (m < m_end && n < n_end) f(m, n, acc[mt][nt][c]);
      }
}

// out[r] = a[r] @ op(W_e) + beta out[r] over expert e's rows (as grouped_mm_kernel). trans_w: W_e
// [Nout, K] (k contiguous), else [K, Nout] (rows contiguous).
template <bool TRANS_W>
__global__ void __launch_bounds__(kTcThreads)
    tc_grouped_mm_kernel(DOut out, const bf16_t* __restrict__ a, const bf16_t* __restrict__ w,
                         const int32_t* __restrict__ off, int E, int64_t stride, int K, int Nout, float beta) {
  __shared__ __align__(16) bf16_t As[TM][TKP];
  __shared__ __align__(16) bf16_t Bs[TN][TKP];
  int t = blockIdx.y, e = 0, r0 = 0, r_end = 0;
  for (; e < E; ++e) {
    const int c0 = off[e], c1 = off[e + 1], tiles = (c1 - c0 + TM - 1) / TM;
    if (t < tiles) {
      r0 = c0 + t * TM;
      r_end = c1;
      break;
    }
    t -= tiles;
  }
  if (e == E) return;
  const int n0 = blockIdx.x * TN;
  float acc[4][4][4] = {};
  const TcOperand A{a, K, 1};
  const TcOperand B = TRANS_W ? TcOperand{w + int64_t(e) * stride, K, 1} : TcOperand{w + int64_t(e) * stride, 1, Nout};
  tc_tile<true, TRANS_W>(acc, As, Bs, A, r0, r_end, B, n0, Nout, 0, K);
  tc_store(acc, r0, r_end, n0, Nout, [&](int m, int n, float v) {
    const int64_t o = int64_t(m) * Nout + n;
    st1(out, o, v + (beta != 0.f ? beta * ld1(out, o) : 0.f));
  });
}

// dW_e [Nout, K] += dy_e^T x_e: m = output row o, n = input column c, k = the expert's rows.
__global__ void __launch_bounds__(kTcThreads)
    tc_grouped_wgrad_kernel(DOut dw, const bf16_t* __restrict__ dy, const bf16_t* __restrict__ x,
                            const int32_t* __restrict__ off, int64_t stride, int K, int Nout) {
  __shared__ __align__(16) bf16_t As[TM][TKP];
  __shared__ __align__(16) bf16_t Bs[TN][TKP];
  const int e = blockIdx.z, c0 = off[e], c1 = off[e + 1];
  if (c1 == c0) return;
  const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
  float acc[4][4][4] = {};
  tc_tile<false, false>(acc, As, Bs, TcOperand{dy, 1, Nout}, m0, Nout, TcOperand{x, 1, K}, n0, K, c0, c1);
  const int64_t base = int64_t(e) * stride;
  tc_store(acc, m0, Nout, n0, K, [&](int m, int n, float v) {
    const int64_t o = base + int64_t(m) * K + n;
    st1(dw, o, ld1(dw, o) + v);
  });
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

// The tensor-core GEMMs take BF16 operands; SF_MOE_SIMT=1 forces the SIMT kernels (read at each
// call, so that a test can compare both paths).
bool use_tensor_cores(const Tensor& a, const Tensor& b) {
  return a.dtype == DType::BF16 && b.dtype == DType::BF16 && !env_switch(Env::MoeSimt, false);
}

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
  permute_scan_kernel<<<1, 1, 0, L.stream>>>(offsets.ptr<int32_t>(), int(E));
  CUDA_CHECK_LAUNCH();
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

void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta, const Launch& L) {
  const int64_t M = out.rows(), Nout = out.cols(), K = a.cols(), E = w.rows();
  if (M == 0 || Nout == 0) return;
  SF_CHECK(M < INT_MAX && K < INT_MAX && Nout < INT_MAX, "moe_grouped_matmul: dimension over the cuda kernel's 2^31");
  if (use_tensor_cores(a, w)) {
    const int64_t tiles = (M + TM - 1) / TM + E;  // >= sum over experts of ceil(rows_e / TM)
    SF_CHECK(tiles <= 65535, "moe_grouped_matmul: too many row tiles for the cuda kernel");
    const dim3 grid(unsigned((Nout + TN - 1) / TN), unsigned(tiles));
    auto* kernel = trans_w ? tc_grouped_mm_kernel<true> : tc_grouped_mm_kernel<false>;
    kernel<<<grid, kTcThreads, 0, L.stream>>>(dout_(out), a.ptr<bf16_t>(), w.ptr<bf16_t>(), offsets.ptr<int32_t>(),
                                              int(E), w.cols(), int(K), int(Nout), beta);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t tiles = (M + BM - 1) / BM + E;  // >= sum over experts of ceil(rows_e / BM)
  SF_CHECK(tiles <= 65535, "moe_grouped_matmul: too many row tiles for the cuda kernel");
  const dim3 grid(unsigned((Nout + BN - 1) / BN), unsigned(tiles));
  grouped_mm_kernel<<<grid, kMmThreads, 0, L.stream>>>(dout_(out), din(a), din(w), offsets.ptr<int32_t>(), int(E),
                                                       w.cols(), int(K), int(Nout), trans_w ? 1 : 0, beta);
  CUDA_CHECK_LAUNCH();
}

void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, const Launch& L) {
  const int64_t Nout = dy.cols(), K = x.cols(), E = dw.rows();
  if (Nout == 0 || K == 0 || E == 0) return;
  SF_CHECK(dy.rows() < INT_MAX && K < INT_MAX && Nout < INT_MAX,
           "moe_grouped_matmul_wgrad: dimension over the cuda kernel's 2^31");
  if (use_tensor_cores(dy, x)) {
    const dim3 grid(unsigned((K + TN - 1) / TN), unsigned((Nout + TM - 1) / TM), unsigned(E));
    tc_grouped_wgrad_kernel<<<grid, kTcThreads, 0, L.stream>>>(dout_(dw), dy.ptr<bf16_t>(), x.ptr<bf16_t>(),
                                                               offsets.ptr<int32_t>(), dw.cols(), int(K), int(Nout));
    CUDA_CHECK_LAUNCH();
    return;
  }
  const dim3 grid(unsigned((K + BN - 1) / BN), unsigned((Nout + BM - 1) / BM), unsigned(E));
  grouped_wgrad_kernel<<<grid, kMmThreads, 0, L.stream>>>(dout_(dw), din(dy), din(x), offsets.ptr<int32_t>(), dw.cols(),
                                                          int(K), int(Nout));
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
