#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "backend/cuda/bias.cuh"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/rmsnorm.cuh"

namespace sf::cuda {
namespace {

template <int VEC>
__global__ void rmsnorm_fwd_kernel(DOut out, float* __restrict__ rstd, DIn x, DIn w, int C, float eps) {
  __shared__ float sh[32];
  const int64_t base = int64_t(blockIdx.x) * C;
  const int nv = C / VEC;
  float ss = 0.f;
  for (int i = threadIdx.x; i < nv; i += blockDim.x) {
    float v[VEC];
    ldv<VEC>(x, base + i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) ss = fmaf(v[k], v[k], ss);
  }
  ss = block_sum(ss, sh);
  const float rs = rsqrtf(ss / float(C) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = rs;
  for (int i = threadIdx.x; i < nv; i += blockDim.x) {
    float v[VEC], wv[VEC];
    ldv<VEC>(x, base + i * VEC, v);  // second read: L1/L2 hit
    ldv<VEC>(w, i * VEC, wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = wv[k] * (v[k] * rs);
    stv<VEC>(out, base + i * VEC, v);
  }
}

template <int VEC>
__global__ void rmsnorm_bwd_kernel(DOut dx, float* __restrict__ partial, DIn g, DIn x, DIn w,
                                   const float* __restrict__ rstd, int64_t R, int C, int accumulate, int want_dw) {
  extern __shared__ float dws[];  // [C] when want_dw; thread t owns the packs t, t+blockDim, ...
  __shared__ float sh[32];
  const int nv = C / VEC;
  if (want_dw)
    for (int i = threadIdx.x; i < nv; i += blockDim.x)
#pragma unroll
      for (int k = 0; k < VEC; ++k) dws[i * VEC + k] = 0.f;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t base = r * C;
    const float rs = rstd[r];
    float dot = 0.f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      float gv[VEC], xv[VEC], wv[VEC];
      ldv<VEC>(g, base + i * VEC, gv);
      ldv<VEC>(x, base + i * VEC, xv);
      ldv<VEC>(w, i * VEC, wv);
#pragma unroll
      for (int k = 0; k < VEC; ++k) dot = fmaf(gv[k] * wv[k], xv[k], dot);
    }
    dot = block_sum(dot, sh);
    const float coef = dot * rs * rs * rs / float(C);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
      float gv[VEC], xv[VEC], wv[VEC], d[VEC];
      ldv<VEC>(g, base + i * VEC, gv);
      ldv<VEC>(x, base + i * VEC, xv);
      ldv<VEC>(w, i * VEC, wv);
      if (accumulate)
        ldv<VEC>(dx, base + i * VEC, d);
      else
#pragma unroll
        for (int k = 0; k < VEC; ++k) d[k] = 0.f;
#pragma unroll
      for (int k = 0; k < VEC; ++k) d[k] += rs * gv[k] * wv[k] - coef * xv[k];
      stv<VEC>(dx, base + i * VEC, d);
      if (want_dw)
#pragma unroll
        for (int k = 0; k < VEC; ++k) dws[i * VEC + k] = fmaf(gv[k] * xv[k], rs, dws[i * VEC + k]);
    }
  }
  if (want_dw)
    for (int i = threadIdx.x; i < nv; i += blockDim.x)
#pragma unroll
      for (int k = 0; k < VEC; ++k) partial[int64_t(blockIdx.x) * C + i * VEC + k] = dws[i * VEC + k];
}

// Fast paths (C % 8 == 0, 16-byte aligned, C <= 8 * 4 * 1024): each thread keeps NP = 4 packs of
// 8 elements of its row in registers in their storage format (a bf16 pack is one uint4), so the
// row is read from memory once, several 16-byte loads per thread are in flight, and few registers
// per byte leave room for many rows in flight per SM. Blocks have C / 32 threads.
constexpr int kNP = 4;

template <bool BF>
struct Pack8;  // 8 elements as stored
template <>
struct Pack8<true> {
  uint4 u;
  __device__ void load(const void* p, int64_t i) {
    u = *reinterpret_cast<const uint4*>(static_cast<const bf16_t*>(p) + i);
  }
  // Keeps the compiler from holding the fp32 conversion live across phases (register pressure).
  __device__ void opaque() { asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w)); }
  __device__ void to_float(float (&f)[8]) const {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 t = __bfloat1622float2(h[j]);
      f[2 * j] = t.x, f[2 * j + 1] = t.y;
    }
  }
};
template <>
struct Pack8<false> {
  float4 a, b;
  __device__ void load(const void* p, int64_t i) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    a = q[0], b = q[1];
  }
  __device__ void opaque() {
    asm volatile("" : "+f"(a.x), "+f"(a.y), "+f"(a.z), "+f"(a.w), "+f"(b.x), "+f"(b.y), "+f"(b.z), "+f"(b.w));
  }
  __device__ void to_float(float (&f)[8]) const {
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
};

template <bool XBF>
__global__ void rmsnorm_fwd_reg_kernel(DOut out, float* __restrict__ rstd, DIn x, DIn w, int C, float eps) {
  __shared__ float sh[32];
  const int64_t base = int64_t(blockIdx.x) * C;
  const int nv = C / 8;
  Pack8<XBF> v[kNP];
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int i = threadIdx.x + p * blockDim.x;
    if (i < nv) v[p].load(x.p, base + int64_t(i) * 8);
  }
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int i = threadIdx.x + p * blockDim.x;
    if (i < nv) {
      float f[8];
      v[p].to_float(f);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss = fmaf(f[k], f[k], ss);
    }
  }
  ss = block_sum(ss, sh);
  const float rs = rsqrtf(ss / float(C) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[blockIdx.x] = rs;
#pragma unroll
  for (int p = 0; p < kNP; ++p) v[p].opaque();
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int i = threadIdx.x + p * blockDim.x;
    if (i < nv) {
      float f[8], wv[8];
      v[p].to_float(f);
      ldv<8>(w, int64_t(i) * 8, wv);
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = wv[k] * (f[k] * rs);
      stv<8>(out, base + int64_t(i) * 8, f);
    }
  }
}

// Blocks walk rows r = blockIdx.x, += gridDim.x, with the next row's dout / x prefetched (in
// storage format) while the current row is reduced and written: two rows in flight per block.
// w and this block's dw partial live in shared memory ([C] floats each; each thread touches only
// its own packs, as float4, so they need no barrier).
template <bool GBF, bool XBF>
__global__ void rmsnorm_bwd_reg_kernel(DOut dx, float* __restrict__ partial, DIn g, DIn x, DIn w,
                                       const float* __restrict__ rstd, int64_t R, int C, int accumulate, int want_dw) {
  extern __shared__ float4 sm4[];
  float* ws = reinterpret_cast<float*>(sm4);  // [C]
  float* dws = ws + C;                        // [C]
  __shared__ float sh[32];
  const int nv = C / 8;
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int i = threadIdx.x + p * blockDim.x;
    if (i < nv) {
      float wv[8], z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      ldv<8>(w, int64_t(i) * 8, wv);
      store_vec<8>(ws + i * 8, wv);
      store_vec<8>(dws + i * 8, z);
    }
  }
  Pack8<GBF> gv[kNP];
  Pack8<XBF> xv[kNP];
  auto load_row = [&](int64_t r, Pack8<GBF>(&ga)[kNP], Pack8<XBF>(&xa)[kNP]) {
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv && r < R) {
        ga[p].load(g.p, r * C + int64_t(i) * 8);
        xa[p].load(x.p, r * C + int64_t(i) * 8);
      }
    }
  };
  load_row(blockIdx.x, gv, xv);
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    Pack8<GBF> gn[kNP];
    Pack8<XBF> xn[kNP];
    load_row(r + gridDim.x, gn, xn);  // prefetch (nothing past the end)
    const int64_t base = r * C;
    const float rs = rstd[r];
    float dot = 0.f;
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv) {
        float wv[8], gf[8], xf[8];
        load_vec<8>(ws + i * 8, wv);
        gv[p].to_float(gf);
        xv[p].to_float(xf);
#pragma unroll
        for (int k = 0; k < 8; ++k) dot = fmaf(gf[k] * wv[k], xf[k], dot);
      }
    }
    dot = block_sum(dot, sh);
    const float coef = dot * rs * rs * rs / float(C);
#pragma unroll
    for (int p = 0; p < kNP; ++p) gv[p].opaque(), xv[p].opaque();
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv) {
        float d[8], wv[8], gf[8], xf[8];
        load_vec<8>(ws + i * 8, wv);
        gv[p].to_float(gf);
        xv[p].to_float(xf);
        if (accumulate)
          ldv<8>(dx, base + int64_t(i) * 8, d);
        else
#pragma unroll
          for (int k = 0; k < 8; ++k) d[k] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) d[k] += rs * gf[k] * wv[k] - coef * xf[k];
        stv<8>(dx, base + int64_t(i) * 8, d);
        if (want_dw) {
          float dwv[8];
          load_vec<8>(dws + i * 8, dwv);
#pragma unroll
          for (int k = 0; k < 8; ++k) dwv[k] = fmaf(gf[k] * xf[k], rs, dwv[k]);
          store_vec<8>(dws + i * 8, dwv);
        }
      }
    }
#pragma unroll
    for (int p = 0; p < kNP; ++p) gv[p] = gn[p], xv[p] = xn[p];
  }
  if (want_dw)
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv) {
        float dwv[8];
        load_vec<8>(dws + i * 8, dwv);
        store_vec<8>(partial + int64_t(blockIdx.x) * C + int64_t(i) * 8, dwv);
      }
    }
}

// dw [4q .. 4q+3] += the column sums of partial [P, C] for the column quads q in [q0, q0 + qn),
// in a fixed order (deterministic): thread slice sl sums the partials p = sl, sl + S, ... of its quad
// (S a power of two), then a fixed tree over the S slices in shared memory (red: >= blockDim.x
// float4). The partials may have been written by other blocks of this kernel (after a grid
// barrier), so they are read with ld.global.cg (L2, never a stale L1 / non-coherent line).
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ void reduce_dw_partials(DOut dw, const float* partial, int P, int C, int q0, int qn, float4* red) {
  if (qn <= 0) return;  // uniform over the block
  const int T = int(blockDim.x), tid = int(threadIdx.x), nq = C / 4;
  const float4* pp = reinterpret_cast<const float4*>(partial);
  auto add_out = [&](int q, float4 s) {
    const int64_t c = int64_t(q) * 4;
    st1(dw, c, ld1(dw, c) + s.x);
    st1(dw, c + 1, ld1(dw, c + 1) + s.y);
    st1(dw, c + 2, ld1(dw, c + 2) + s.z);
    st1(dw, c + 3, ld1(dw, c + 3) + s.w);
  };
  if (qn > T) {  // few blocks, many columns: one thread per quad, all P in order
    for (int q = q0 + tid; q < q0 + qn; q += T) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
      for (int p = 0; p < P; ++p) s = add4(s, __ldcg(pp + int64_t(p) * nq + q));
      add_out(q, s);
    }
    return;
  }
  int S = 1;
  while (S * 2 * qn <= T) S *= 2;
  const int qi = tid % qn, sl = tid / qn;
  if (sl < S) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int p = sl; p < P; p += S) s = add4(s, __ldcg(pp + int64_t(p) * nq + q0 + qi));
    red[sl * qn + qi] = s;
  }
  __syncthreads();
  for (int h = S / 2; h >= 1; h /= 2) {
    if (sl < h) red[sl * qn + qi] = add4(red[sl * qn + qi], red[(sl + h) * qn + qi]);
    __syncthreads();
  }
  if (tid < qn) add_out(q0 + tid, red[tid]);
}

// The separate dw reduction (variant 1): blocks of kReduceThreads threads, kReduceQuads column
// quads each (C = 4096: 128 blocks, 32 slices of P per quad), instead of one thread per column
// walking all P partials (colsum_accumulate: 16 blocks, latency-bound).
constexpr int kReduceThreads = 256, kReduceQuads = 8;
__global__ void __launch_bounds__(kReduceThreads)
    rmsnorm_dw_reduce_kernel(DOut dw, const float* __restrict__ partial, int P, int C) {
  __shared__ float4 red[kReduceThreads];
  const int q0 = int(blockIdx.x) * kReduceQuads;
  const int qn = C / 4 - q0 < kReduceQuads ? C / 4 - q0 : kReduceQuads;
  reduce_dw_partials(dw, partial, P, C, q0, qn, red);
}

// Variants 1-4 of the fast backward (see rmsnorm.cuh). Like rmsnorm_bwd_reg_kernel, but the rows
// of a block go through a ring of D register buffers (D - 1 rows prefetched ahead; the ring index
// is a compile-time constant after unrolling, so nothing is copied between buffers and a row's
// loads are only waited for when that row is reduced), and rstd travels with its row. FUSED: the
// block's dw partial goes to the scratch, a grid barrier (cooperative launch: all P blocks are
// resident), then every block reduces a slice of the columns over the P partials and adds it
// into dw, all in this one launch.
template <bool GBF, bool XBF, int D, bool FUSED>
__global__ void rmsnorm_bwd_ring_kernel(DOut dx, float* __restrict__ partial, DIn g, DIn x, DIn w,
                                        const float* __restrict__ rstd, int64_t R, int C, int accumulate, int want_dw,
                                        DOut dw) {
  static_assert(D >= 2 && D <= 4, "ring depth");
  extern __shared__ float4 sm4[];
  float* ws = reinterpret_cast<float*>(sm4);  // [C]
  float* dws = ws + C;                        // [C]
  __shared__ float sh[32];
  const int nv = C / 8;
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int i = threadIdx.x + p * blockDim.x;
    if (i < nv) {
      float wv[8], z[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      ldv<8>(w, int64_t(i) * 8, wv);
      store_vec<8>(ws + i * 8, wv);
      store_vec<8>(dws + i * 8, z);
    }
  }
  const int64_t G = gridDim.x;
  Pack8<GBF> gb[D][kNP];
  Pack8<XBF> xb[D][kNP];
  float rb[D];
  auto load_row = [&](int64_t r, Pack8<GBF>(&ga)[kNP], Pack8<XBF>(&xa)[kNP], float& rs) {
    if (r >= R) return;
    rs = rstd[r];
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv) {
        ga[p].load(g.p, r * C + int64_t(i) * 8);
        xa[p].load(x.p, r * C + int64_t(i) * 8);
      }
    }
  };
  auto row = [&](int64_t r, Pack8<GBF>(&gv)[kNP], Pack8<XBF>(&xv)[kNP], float rs) {
    const int64_t base = r * C;
    float dot = 0.f;
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv) {
        float wv[8], gf[8], xf[8];
        load_vec<8>(ws + i * 8, wv);
        gv[p].to_float(gf);
        xv[p].to_float(xf);
#pragma unroll
        for (int k = 0; k < 8; ++k) dot = fmaf(gf[k] * wv[k], xf[k], dot);
      }
    }
    dot = block_sum(dot, sh);
    const float coef = dot * rs * rs * rs / float(C);
#pragma unroll
    for (int p = 0; p < kNP; ++p) gv[p].opaque(), xv[p].opaque();
#pragma unroll
    for (int p = 0; p < kNP; ++p) {
      const int i = threadIdx.x + p * blockDim.x;
      if (i < nv) {
        float d[8], wv[8], gf[8], xf[8];
        load_vec<8>(ws + i * 8, wv);
        gv[p].to_float(gf);
        xv[p].to_float(xf);
        if (accumulate)
          ldv<8>(dx, base + int64_t(i) * 8, d);
        else
#pragma unroll
          for (int k = 0; k < 8; ++k) d[k] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) d[k] += rs * gf[k] * wv[k] - coef * xf[k];
        stv<8>(dx, base + int64_t(i) * 8, d);
        if (want_dw) {
          float dwv[8];
          load_vec<8>(dws + i * 8, dwv);
#pragma unroll
          for (int k = 0; k < 8; ++k) dwv[k] = fmaf(gf[k] * xf[k], rs, dwv[k]);
          store_vec<8>(dws + i * 8, dwv);
        }
      }
    }
  };
#pragma unroll
  for (int k = 0; k < D - 1; ++k) load_row(blockIdx.x + k * G, gb[k], xb[k], rb[k]);
  for (int64_t r0 = blockIdx.x; r0 < R; r0 += D * G) {
#pragma unroll
    for (int k = 0; k < D; ++k) {
      const int64_t r = r0 + k * G;
      if (r >= R) break;
      load_row(r + (D - 1) * G, gb[(k + D - 1) % D], xb[(k + D - 1) % D], rb[(k + D - 1) % D]);
      row(r, gb[k], xb[k], rb[k]);
    }
  }
  if (!want_dw) return;
#pragma unroll
  for (int p = 0; p < kNP; ++p) {
    const int i = threadIdx.x + p * blockDim.x;
    if (i < nv) {
      float dwv[8];
      load_vec<8>(dws + i * 8, dwv);
      store_vec<8>(partial + int64_t(blockIdx.x) * C + int64_t(i) * 8, dwv);
    }
  }
  if constexpr (FUSED) {
    cooperative_groups::this_grid().sync();  // all partials written (and fenced); ws / dws free
    const int nq = C / 4, P = int(gridDim.x);
    const int qpb = (nq + P - 1) / P;
    const int q0 = int(blockIdx.x) * qpb;
    reduce_dw_partials(dw, partial, P, C, q0, std::min(qpb, nq - q0), sm4);
  }
}

template <class F>
void with_bf(bool a, F&& f) {
  if (a)
    f(std::true_type{});
  else
    f(std::false_type{});
}

int row_threads(int packs) { return std::clamp((packs + 31) / 32 * 32, 64, 512); }

// Blocks per SM of a kernel at (threads, dynamic smem), queried once per (kernel, threads, smem);
// the first query also raises the kernel's dynamic shared memory limit when it needs more than
// 48 KiB (to the largest size asked for so far). The device is fixed per process.
int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, int> occ;
  static std::map<const void*, size_t> smem_attr;
  std::lock_guard<std::mutex> lk(mu);
  const auto key = std::make_tuple(kernel, threads, smem);
  if (auto it = occ.find(key); it != occ.end()) return it->second;
  if (smem > 48 * 1024) {
    size_t& a = smem_attr[kernel];
    if (smem > a) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      a = smem;
    }
  }
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  occ.emplace(key, per_sm);
  return per_sm;
}

// Backward variants of the fast path (rmsnorm.cuh). depth 0: rmsnorm_bwd_reg_kernel (one row
// prefetched, copied between buffers) + colsum_accumulate; otherwise rmsnorm_bwd_ring_kernel
// with a ring of `depth` rows. max_per_sm: cap on blocks per SM (0: as many as fit). fused: the
// dw reduction in the same (cooperative) launch, else rmsnorm_dw_reduce_kernel.
struct BwdVariant {
  int depth, max_per_sm;
  bool fused;
};
constexpr BwdVariant kBwdVariants[] = {{0, 0, false}, {2, 0, false}, {2, 0, true}, {3, 2, true}, {3, 0, true}};
constexpr int kNumBwdVariants = int(sizeof(kBwdVariants) / sizeof(kBwdVariants[0]));
constexpr int kDefaultBwdVariant = 0;

int bwd_variant_from_env() {
  const char* v = std::getenv("SF_RMSNORM_BWD_VARIANT");
  if (v == nullptr || *v == 0) return kDefaultBwdVariant;
  const int i = std::atoi(v);
  return i >= 0 && i < kNumBwdVariants ? i : kDefaultBwdVariant;
}
std::atomic<int> g_bwd_variant{bwd_variant_from_env()};

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, const Launch& L) {
  const int64_t C = x.cols(), R = x.rows();
  SF_CUDA_REQUIRE(out.numel() == x.numel() && w.numel() == C, "cuda rmsnorm_forward: shape mismatch");
  SF_CUDA_REQUIRE(rstd.empty() || (rstd.dtype == DType::F32 && rstd.numel() == R),
                  "cuda rmsnorm_forward: rstd must be F32 [rows]");
  if (R == 0 || C == 0) return;
  float* rs = rstd.empty() ? nullptr : rstd.ptr<float>();
  const bool vec = C % 8 == 0 && aligned16(out.data) && aligned16(x.data) && aligned16(w.data);
  if (vec && C <= 8 * kNP * 1024) {
    const int t = std::max(32, int((C / 8 + kNP - 1) / kNP + 31) / 32 * 32);
    with_bf(x.dtype == DType::BF16, [&](auto xbf) {
      rmsnorm_fwd_reg_kernel<decltype(xbf)::value>
          <<<unsigned(R), t, 0, L.stream>>>(dout_(out), rs, din(x), din(w), int(C), eps);
    });
  } else if (vec) {
    const int t = row_threads(int(C / 8));
    rmsnorm_fwd_kernel<8><<<unsigned(R), t, 0, L.stream>>>(dout_(out), rs, din(x), din(w), int(C), eps);
  } else {
    const int t = row_threads(int(C));
    rmsnorm_fwd_kernel<1><<<unsigned(R), t, 0, L.stream>>>(dout_(out), rs, din(x), din(w), int(C), eps);
  }
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      const Launch& L) {
  const int64_t C = x.cols(), R = x.rows();
  SF_CUDA_REQUIRE(dx.numel() == x.numel() && dout.numel() == x.numel() && w.numel() == C,
                  "cuda rmsnorm_backward: shape mismatch");
  SF_CUDA_REQUIRE(!rstd.empty() && rstd.dtype == DType::F32 && rstd.numel() == R,
                  "cuda rmsnorm_backward: rstd must be F32 [rows]");
  const bool want_dw = !dw.empty();
  if (want_dw) SF_CUDA_REQUIRE(dw.numel() == C, "cuda rmsnorm_backward: dw numel != C");
  if (R == 0 || C == 0) return;
  const bool vec = C % 8 == 0 && aligned16(dx.data) && aligned16(dout.data) && aligned16(x.data) && aligned16(w.data);
  float* partial = static_cast<float*>(L.scratch->buf);
  if (vec && C <= 8 * kNP * 1024 && C <= 24 * 1024) {
    const BwdVariant var = kBwdVariants[g_bwd_variant.load(std::memory_order_relaxed)];
    const int t = std::max(32, int((C / 8 + kNP - 1) / kNP + 31) / 32 * 32);
    // w and dw [C] each; at least a float4 per thread (the fused dw reduction reuses it, C < 64).
    const size_t smem = std::max(size_t(2 * C) * sizeof(float), size_t(t) * sizeof(float4));
    int64_t max_p = R;
    if (want_dw) {
      max_p = int64_t(L.scratch->buf_bytes / (sizeof(float) * size_t(C)));
      SF_CUDA_REQUIRE(max_p >= 1, "cuda rmsnorm_backward: C too large for the kernel scratch");
    }
    DOut dxo = dout_(dx), dwo = want_dw ? dout_(dw) : DOut{nullptr, 0};
    DIn gi = din(dout), xi = din(x), wi = din(w);
    const float* rs = rstd.ptr<float>();
    int64_t Rv = R;
    int Ci = int(C), acc = accumulate ? 1 : 0, wd = want_dw ? 1 : 0;
    // Grid size: as many blocks as are resident (capped by the variant and the scratch). Ring
    // variants then even out the rows per block (same number of rounds, no lone last round).
    auto grid = [&](const void* kernel, bool balance) -> int64_t {
      int64_t per_sm = blocks_per_sm(kernel, t, smem);
      if (var.max_per_sm > 0) per_sm = std::min<int64_t>(per_sm, var.max_per_sm);
      int64_t P = std::min({R, int64_t(L.num_sms) * per_sm, max_p});
      if (balance && P > 0) {
        const int64_t rounds = (R + P - 1) / P;
        P = (R + rounds - 1) / rounds;
      }
      return P;
    };
    bool launched = false;
    auto base = [&](auto kernel) {
      const int64_t P = grid(reinterpret_cast<const void*>(kernel), false);
      if (P == 0) return;  // does not fit on an SM: the generic kernel below
      kernel<<<unsigned(P), t, smem, L.stream>>>(dxo, partial, gi, xi, wi, rs, R, Ci, acc, wd);
      CUDA_CHECK_LAUNCH();
      if (want_dw) colsum_accumulate(dw, partial, int(P), C, L);
      launched = true;
    };
    auto ring = [&](auto kernel, bool fused) {
      const int64_t P = grid(reinterpret_cast<const void*>(kernel), true);
      if (P == 0) return;
      if (fused && want_dw) {
        void* args[] = {&dxo, &partial, &gi, &xi, &wi, &rs, &Rv, &Ci, &acc, &wd, &dwo};
        CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(unsigned(P)), dim3(t), args,
                                               smem, L.stream));
      } else {
        kernel<<<unsigned(P), t, smem, L.stream>>>(dxo, partial, gi, xi, wi, rs, R, Ci, acc, wd, dwo);
        CUDA_CHECK_LAUNCH();
        if (want_dw && !fused) {
          rmsnorm_dw_reduce_kernel<<<unsigned((C / 4 + kReduceQuads - 1) / kReduceQuads), kReduceThreads, 0,
                                     L.stream>>>(dwo, partial, int(P), Ci);
        }
      }
      CUDA_CHECK_LAUNCH();
      launched = true;
    };
    with_bf(dout.dtype == DType::BF16, [&](auto gbf) {
      with_bf(x.dtype == DType::BF16, [&](auto xbf) {
        constexpr bool GB = decltype(gbf)::value, XB = decltype(xbf)::value;
        constexpr int D3 = GB && XB ? 3 : 2;  // F32 rows take 2x the registers: ring depth 2 only
        if (var.depth == 0)
          base(rmsnorm_bwd_reg_kernel<GB, XB>);
        else if (var.depth == 3)
          var.fused ? ring(rmsnorm_bwd_ring_kernel<GB, XB, D3, true>, true)
                    : ring(rmsnorm_bwd_ring_kernel<GB, XB, D3, false>, false);
        else
          var.fused ? ring(rmsnorm_bwd_ring_kernel<GB, XB, 2, true>, true)
                    : ring(rmsnorm_bwd_ring_kernel<GB, XB, 2, false>, false);
      });
    });
    if (launched) return;
  }
  const int threads = row_threads(int(vec ? C / 8 : C));
  int64_t P = std::min<int64_t>(R, int64_t(L.num_sms) * std::max(1, 2048 / threads));
  size_t smem = 0;
  if (want_dw) {
    const int64_t max_p = int64_t(L.scratch->buf_bytes / (sizeof(float) * size_t(C)));
    SF_CUDA_REQUIRE(max_p >= 1, "cuda rmsnorm_backward: C too large for the kernel scratch");
    P = std::min(P, max_p);
    smem = size_t(C) * sizeof(float);
    SF_CUDA_REQUIRE(smem <= 200 * 1024, "cuda rmsnorm_backward: C too large for shared memory");
  }
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) (void)blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);  // sets the limit
    kernel<<<unsigned(P), threads, smem, L.stream>>>(dout_(dx), partial, din(dout), din(x), din(w), rstd.ptr<float>(),
                                                     R, int(C), accumulate ? 1 : 0, want_dw ? 1 : 0);
    CUDA_CHECK_LAUNCH();
  };
  if (vec)
    launch(rmsnorm_bwd_kernel<8>);
  else
    launch(rmsnorm_bwd_kernel<1>);
  if (want_dw) colsum_accumulate(dw, partial, int(P), C, L);
}

void rmsnorm_set_backward_variant(int v) { g_bwd_variant = v >= 0 && v < kNumBwdVariants ? v : kDefaultBwdVariant; }
int rmsnorm_backward_variant() { return g_bwd_variant.load(); }
int rmsnorm_backward_variants() { return kNumBwdVariants; }

}  // namespace sf::cuda
