// Private device helpers shared by the kernels: dtype-tagged pointers, vector loads/stores,
// warp/block reductions, and the inline-PTX wrappers (cp.async, ldmatrix, mma.sync).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.h"

namespace sf::cuda {

using bf16_t = __nv_bfloat16;

// A storage pointer with its dtype (F32 or BF16) decided at run time. The branch on `bf` is
// uniform across a launch, so it costs a couple of instructions and avoids instantiating every
// kernel for every mix of input/output dtypes that ops.h allows.
struct DIn {
  const void* p;
  int bf;  // 1: BF16, 0: F32
};
struct DOut {
  void* p;
  int bf;
};

// Of a F32 or BF16 tensor (the front of the kernel table, backend/ops_check.h, checked the dtype).
inline DIn din(const Tensor& t) { return DIn{t.data, t.dtype == DType::BF16 ? 1 : 0}; }
inline DOut dout_(const Tensor& t) { return DOut{t.data, t.dtype == DType::BF16 ? 1 : 0}; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16_t x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16_t from_f<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

// N contiguous elements; the pointer must be 16-byte aligned when N * sizeof(T) >= 16.
template <int N>
__device__ __forceinline__ void load_vec(const float* p, float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      float4 x = reinterpret_cast<const float4*>(p)[i];
      v[4 * i] = x.x, v[4 * i + 1] = x.y, v[4 * i + 2] = x.z, v[4 * i + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = p[i];
  }
}
// bf16 through packs of type P (uint4: 8 elements, uint2: 4), as __nv_bfloat162 pairs.
template <class P, int N>
__device__ __forceinline__ void load_bf16_packs(const bf16_t* p, float (&v)[N]) {
  constexpr int E = int(sizeof(P)) / 2;  // elements a pack
#pragma unroll
  for (int i = 0; i < N / E; ++i) {
    P x = reinterpret_cast<const P*>(p)[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
    for (int j = 0; j < E / 2; ++j) {
      float2 f = __bfloat1622float2(h[j]);
      v[E * i + 2 * j] = f.x, v[E * i + 2 * j + 1] = f.y;
    }
  }
}
template <class P, int N>
__device__ __forceinline__ void store_bf16_packs(bf16_t* p, const float (&v)[N]) {
  constexpr int E = int(sizeof(P)) / 2;
#pragma unroll
  for (int i = 0; i < N / E; ++i) {
    P x;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&x);
#pragma unroll
    for (int j = 0; j < E / 2; ++j) h[j] = __floats2bfloat162_rn(v[E * i + 2 * j], v[E * i + 2 * j + 1]);
    reinterpret_cast<P*>(p)[i] = x;
  }
}
template <int N>
__device__ __forceinline__ void load_vec(const bf16_t* p, float (&v)[N]) {
  if constexpr (N % 8 == 0) {
    load_bf16_packs<uint4>(p, v);
  } else if constexpr (N % 4 == 0) {
    load_bf16_packs<uint2>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __bfloat162float(p[i]);
  }
}
template <int N>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
      reinterpret_cast<float4*>(p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = v[i];
  }
}
template <int N>
__device__ __forceinline__ void store_vec(bf16_t* p, const float (&v)[N]) {
  if constexpr (N % 8 == 0) {
    store_bf16_packs<uint4>(p, v);
  } else if constexpr (N % 4 == 0) {
    store_bf16_packs<uint2>(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = __float2bfloat16_rn(v[i]);
  }
}

template <int N>
__device__ __forceinline__ void ldv(DIn a, int64_t i, float (&v)[N]) {
  if (a.bf)
    load_vec<N>(static_cast<const bf16_t*>(a.p) + i, v);
  else
    load_vec<N>(static_cast<const float*>(a.p) + i, v);
}
template <int N>
__device__ __forceinline__ void ldv(DOut a, int64_t i, float (&v)[N]) {
  ldv<N>(DIn{a.p, a.bf}, i, v);
}
template <int N>
__device__ __forceinline__ void stv(DOut a, int64_t i, const float (&v)[N]) {
  if (a.bf)
    store_vec<N>(static_cast<bf16_t*>(a.p) + i, v);
  else
    store_vec<N>(static_cast<float*>(a.p) + i, v);
}
__device__ __forceinline__ float ld1(DIn a, int64_t i) {
  return a.bf ? __bfloat162float(static_cast<const bf16_t*>(a.p)[i]) : static_cast<const float*>(a.p)[i];
}
__device__ __forceinline__ float ld1(DOut a, int64_t i) { return ld1(DIn{a.p, a.bf}, i); }
__device__ __forceinline__ void st1(DOut a, int64_t i, float v) {
  if (a.bf)
    static_cast<bf16_t*>(a.p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(a.p)[i] = v;
}

// ---- reductions ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block; every thread gets the result. `sh` holds >= 32 floats. Contains two
// __syncthreads(), so it is safe to call repeatedly with the same `sh`.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // previous users of sh are done
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < nw ? sh[lane] : 0.f;
  return warp_sum(r);
}

// Grid size for grid-stride loops over n work items.
inline unsigned grid_for(int64_t n, int threads, int num_sms, int per_sm = 16) {
  int64_t b = (n + threads - 1) / threads;
  int64_t cap = int64_t(num_sms) * per_sm;
  if (b > cap) b = cap;
  if (b < 1) b = 1;
  return unsigned(b);
}

// ---- element-wise grid-stride loops --------------------------------------------------------
// `Op` is a functor (a struct of DIn / DOut / scalars; nvcc here has no extended lambdas) with
//   template <int N> __device__ void apply(int64_t i) const;
// which does elements [i, i + N). The kernel walks [0, n): packs of VEC elements (pack k starts at
// k * VEC, so its pointers stay 16-byte aligned when the tensors are), then the n % VEC elements
// of the tail one at a time, each loop striding over the whole grid.
template <int VEC, class Op>
__global__ void for_each_kernel(Op op, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t i = tid; i < nv; i += stride) op.template apply<VEC>(i * VEC);
  for (int64_t i = nv * VEC + tid; i < n; i += stride) op.template apply<1>(i);
}

// Launches for_each_kernel<VEC> over n elements on L.stream with a grid sized for `items` work
// items of `threads` threads (grid_for: at most 16 blocks an SM).
template <int VEC, class Op>
void launch_for_each(const Op& op, int64_t n, int64_t items, const Launch& L, int threads = 256) {
  if (n == 0) return;
  for_each_kernel<VEC><<<grid_for(items, threads, L.num_sms), threads, 0, L.stream>>>(op, n);
  CUDA_CHECK_LAUNCH();
}

// Plain maps, the usual Op of for_each: out = f(a), x = f(x) and out = f(a, b) element by element, with f a
// device functor on fp32 values (math in fp32, storage F32 or BF16 as DIn / DOut say).
template <class F>
struct Map1 {
  DOut out;
  DIn a;
  F f;
  template <int N>
  __device__ void apply(int64_t i) const {
    float v[N];
    ldv<N>(a, i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = f(v[k]);
    stv<N>(out, i, v);
  }
};
// x = f(x) in place: a Map1 whose input is x itself.
template <class F>
struct Update {
  DOut x;
  F f;
  template <int N>
  __device__ void apply(int64_t i) const {
    Map1<F>{x, DIn{x.p, x.bf}, f}.template apply<N>(i);
  }
};
template <class F>
struct Map2 {
  DOut out;
  DIn a, b;
  F f;
  template <int N>
  __device__ void apply(int64_t i) const {
    float x[N], y[N];
    ldv<N>(a, i, x);
    ldv<N>(b, i, y);
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = f(x[k], y[k]);
    stv<N>(out, i, x);
  }
};

// Runs op over n elements: VEC at a time when `vec` (the caller checked the alignment), else one
// at a time; either way on the grid of ceil(n / VEC) work items.
template <int VEC, class Op>
void for_each(const Op& op, int64_t n, bool vec, const Launch& L, int threads = 256) {
  const int64_t items = (n + VEC - 1) / VEC;
  if (vec)
    launch_for_each<VEC>(op, n, items, L, threads);
  else
    launch_for_each<1>(op, n, items, L, threads);
}

// ---- tensor-core / async-copy PTX (sm_80+) -------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; when !valid the destination is zero-filled.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
// c[16x8] += a[16x16] (row) * b[16x8] (col); bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 2^x with the special-function unit (max rel. error 2^-22; -inf -> +0; flushes subnormals).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t u) {
  __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&u);
  return __bfloat1622float2(v);
}

}  // namespace sf::cuda
