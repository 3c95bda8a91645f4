#include <algorithm>
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
__global__ void rmsnorm_fwd_kernel(DOut out, float* __restrict__ rstd, DIn x, DIn w, int C, float eps, float woff) {
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
    for (int k = 0; k < VEC; ++k) v[k] = (wv[k] + woff) * (v[k] * rs);
    stv<VEC>(out, base + i * VEC, v);
  }
}

template <int VEC>
__global__ void rmsnorm_bwd_kernel(DOut dx, float* __restrict__ partial, DIn g, DIn x, DIn w,
                                   const float* __restrict__ rstd, int64_t R, int C, int accumulate, int want_dw,
                                   float woff) {
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
      for (int k = 0; k < VEC; ++k) dot = fmaf(gv[k] * (wv[k] + woff), xv[k], dot);
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
      for (int k = 0; k < VEC; ++k) d[k] += rs * gv[k] * (wv[k] + woff) - coef * xv[k];
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
__global__ void rmsnorm_fwd_reg_kernel(DOut out, float* __restrict__ rstd, DIn x, DIn w, int C, float eps, float woff) {
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
      for (int k = 0; k < 8; ++k) f[k] = (wv[k] + woff) * (f[k] * rs);
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
                                       const float* __restrict__ rstd, int64_t R, int C, int accumulate, int want_dw,
                                       float woff) {
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
#pragma unroll
      for (int k = 0; k < 8; ++k) wv[k] += woff;  // the effective weight (Gemma: 1 + w)
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

// The dw reduction keeps one fp32 row of C partial sums per block in the stream's kernel scratch.
void check_dw_scratch(int64_t max_p, int64_t C) {
  SF_CHECK(max_p >= 1, "rmsnorm_backward: C = " + std::to_string(C) + " is too large for the cuda kernel's scratch");
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, const Launch& L, float w_offset) {
  const int64_t C = x.cols(), R = x.rows();
  if (R == 0 || C == 0) return;
  float* rs = rstd.empty() ? nullptr : rstd.ptr<float>();
  const bool vec = C % 8 == 0 && aligned16(out.data) && aligned16(x.data) && aligned16(w.data);
  if (vec && C <= 8 * kNP * 1024) {
    const int t = std::max(32, int((C / 8 + kNP - 1) / kNP + 31) / 32 * 32);
    with_bf(x.dtype == DType::BF16, [&](auto xbf) {
      rmsnorm_fwd_reg_kernel<decltype(xbf)::value>
          <<<unsigned(R), t, 0, L.stream>>>(dout_(out), rs, din(x), din(w), int(C), eps, w_offset);
    });
  } else if (vec) {
    const int t = row_threads(int(C / 8));
    rmsnorm_fwd_kernel<8><<<unsigned(R), t, 0, L.stream>>>(dout_(out), rs, din(x), din(w), int(C), eps, w_offset);
  } else {
    const int t = row_threads(int(C));
    rmsnorm_fwd_kernel<1><<<unsigned(R), t, 0, L.stream>>>(dout_(out), rs, din(x), din(w), int(C), eps, w_offset);
  }
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool accumulate,
                      const Launch& L, float w_offset) {
  const int64_t C = x.cols(), R = x.rows();
  SF_CHECK(!dx.empty(), "rmsnorm_backward: the cuda kernel always writes dx: dx is required");
  const bool want_dw = !dw.empty();
  if (R == 0 || C == 0) return;
  const bool vec = C % 8 == 0 && aligned16(dx.data) && aligned16(dout.data) && aligned16(x.data) && aligned16(w.data);
  float* partial = static_cast<float*>(L.scratch->buf);
  if (vec && C <= 8 * kNP * 1024 && C <= 24 * 1024) {
    const int t = std::max(32, int((C / 8 + kNP - 1) / kNP + 31) / 32 * 32);
    // w and dw [C] each. The floor of a float4 per thread (only matters for C < 64) is a leftover of
    // the removed fused dw reduction, kept so that the launch stays the one measured on the GPU.
    const size_t smem = std::max(size_t(2 * C) * sizeof(float), size_t(t) * sizeof(float4));
    int64_t max_p = R;
    if (want_dw) {
      max_p = int64_t(L.scratch->buf_bytes / (sizeof(float) * size_t(C)));
      check_dw_scratch(max_p, C);
    }
    bool launched = false;
    with_bf(dout.dtype == DType::BF16, [&](auto gbf) {
      with_bf(x.dtype == DType::BF16, [&](auto xbf) {
        auto kernel = rmsnorm_bwd_reg_kernel<decltype(gbf)::value, decltype(xbf)::value>;
        // Grid size: as many blocks as are resident, capped by the rows and the scratch.
        const int64_t per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), t, smem);
        const int64_t P = std::min({R, int64_t(L.num_sms) * per_sm, max_p});
        if (P == 0) return;  // does not fit on an SM: the generic kernel below
        kernel<<<unsigned(P), t, smem, L.stream>>>(dout_(dx), partial, din(dout), din(x), din(w), rstd.ptr<float>(), R,
                                                   int(C), accumulate ? 1 : 0, want_dw ? 1 : 0, w_offset);
        CUDA_CHECK_LAUNCH();
        if (want_dw) colsum_accumulate(dw, partial, int(P), C, L);
        launched = true;
      });
    });
    if (launched) return;
  }
  const int threads = row_threads(int(vec ? C / 8 : C));
  int64_t P = std::min<int64_t>(R, int64_t(L.num_sms) * std::max(1, 2048 / threads));
  size_t smem = 0;
  if (want_dw) {
    const int64_t max_p = int64_t(L.scratch->buf_bytes / (sizeof(float) * size_t(C)));
    check_dw_scratch(max_p, C);
    P = std::min(P, max_p);
    smem = size_t(C) * sizeof(float);
    SF_CHECK(smem <= 200 * 1024, "rmsnorm_backward: C = " + std::to_string(C) +
                                     " is too large for the cuda kernel's shared memory (at most 51200)");
  }
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) (void)blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);  // sets the limit
    kernel<<<unsigned(P), threads, smem, L.stream>>>(dout_(dx), partial, din(dout), din(x), din(w), rstd.ptr<float>(),
                                                     R, int(C), accumulate ? 1 : 0, want_dw ? 1 : 0, w_offset);
    CUDA_CHECK_LAUNCH();
  };
  if (vec)
    launch(rmsnorm_bwd_kernel<8>);
  else
    launch(rmsnorm_bwd_kernel<1>);
  if (want_dw) colsum_accumulate(dw, partial, int(P), C, L);
}

}  // namespace sf::cuda
