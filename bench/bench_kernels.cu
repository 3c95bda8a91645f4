// Kernel benchmarks of the CUDA backend (GPU machine):
//   1. GEMM TFLOP/s through the backend (cuBLASLt, cached plans) vs plain cuBLAS (cublasGemmEx)
//      on the Llama-3.2-1B layer shapes at 16384 tokens (forward, dgrad, wgrad).
//   2. Causal GQA flash attention fwd / bwd at B=8, T=2048, 32 heads, 8 KV heads, hd 128 (and 64; and
//      16 heads of hd 256), with packed rows and a sliding window.
//   3. RMSNorm / RoPE / SwiGLU achieved GB/s vs a measured device-to-device copy.
//   4. Fused linear cross-entropy at 16384 tokens x 128256 vocab x 4096: time, peak extra memory.
// Timing: cudaEvents on the backend's stream, warm-up, median of many runs. Inputs are random.
// Usage: bench_kernels [section...]   sections: gemm attn mem ce (default: all)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/linear_ce.cuh"
#include "backend/device.h"
#include "bench_check.h"

namespace {

using namespace sf;

#define CB(x)                                                                                     \
  do {                                                                                            \
    cublasStatus_t s_ = (x);                                                                      \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}
// Uniform in [-scale, scale).
__global__ void fill_kernel(void* p, int bf, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = (hash32(uint64_t(i) * 0x9E3779B97F4A7C15ull + seed) >> 8) * (1.f / 16777216.f);
    const float v = (2.f * u - 1.f) * scale;
    if (bf)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
    else
      static_cast<float*>(p)[i] = v;
  }
}
__global__ void labels_kernel(int* p, int64_t n, int V, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(uint64_t(i) + seed);
    p[i] = (h % 10 == 0) ? -100 : int(h % uint32_t(V));
  }
}

struct Ctx {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  cudaStream_t s = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  uint64_t seed = 1;

  Tensor make(DType dt, std::initializer_list<int64_t> shape, float scale = 1.f) {
    Tensor t(nullptr, dt, shape);
    t.data = dev->alloc(t.bytes());
    if (dt == DType::I32) return t;
    fill_kernel<<<1024, 256, 0, s>>>(t.data, dt == DType::BF16, t.numel(), scale, ++seed * 7919);
    CK(cudaGetLastError());
    return t;
  }
  void release(Tensor& t) {
    dev->free(t.data);
    t.data = nullptr;
  }
  // Median milliseconds of f() over `iters` runs after `warm` warm-up runs.
  double time_ms(const std::function<void()>& f, int warm = 3, int iters = 20) {
    return median_event_ms(s, e0, e1, f, warm, iters);
  }
};

// ---- 1. GEMM ----------------------------------------------------------------------------------
void bench_gemm(Ctx& c) {
  std::printf("\n== GEMM: Llama-3.2-1B linears at 16384 tokens, bf16 in/out, fp32 accumulate ==\n");
  std::printf("%-26s %6s %6s %6s  %9s %9s  %6s\n", "op", "M", "N", "K", "sf TF/s", "cuBLAS", "ratio");
  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, c.s));
  const int64_t tok = 16384;
  struct Lin {
    const char* name;
    int64_t in, out;
  };
  const Lin lins[] = {{"qkv_proj (2048->3072)", 2048, 3072},
                      {"o_proj (2048->2048)", 2048, 2048},
                      {"gate_up (2048->16384)", 2048, 16384},
                      {"down_proj (8192->2048)", 8192, 2048}};
  double sf_flops = 0, sf_ms = 0, cb_ms = 0;
  for (const Lin& l : lins) {
    Tensor x = c.make(DType::BF16, {tok, l.in}), w = c.make(DType::BF16, {l.out, l.in}, 0.05f);
    Tensor y = c.make(DType::BF16, {tok, l.out}), dx = c.make(DType::BF16, {tok, l.in});
    Tensor dw = c.make(DType::BF16, {l.out, l.in});
    struct Case {
      const char* what;
      Tensor out, a, b;
      bool ta, tb;
      int64_t M, N, K;
    };
    const Case cases[] = {{"fwd  y=x W^T", y, x, w, false, true, tok, l.out, l.in},
                          {"dgrad dx=dy W", dx, y, w, false, false, tok, l.in, l.out},
                          {"wgrad dW=dy^T x", dw, y, x, true, false, l.out, l.in, tok}};
    std::printf("%s\n", l.name);
    for (const Case& k : cases) {
      const double flops = 2.0 * double(k.M) * double(k.N) * double(k.K);
      const double t_sf = c.time_ms([&] { c.dev->ops().matmul(k.out, k.a, k.b, k.ta, k.tb, 1.f, 0.f, *c.stream); });
      // Plain cuBLAS, same column-major mapping: C^T[N,M] = op(b)^T op(a)^T.
      const float alpha = 1.f, beta = 0.f;
      const int64_t lda = k.a.cols(), ldb = k.b.cols();
      const double t_cb = c.time_ms([&] {
        CB(cublasGemmEx(h, k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, k.ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(k.N), int(k.M),
                        int(k.K), &alpha, k.b.data, CUDA_R_16BF, int(ldb), k.a.data, CUDA_R_16BF, int(lda), &beta,
                        k.out.data, CUDA_R_16BF, int(k.N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      std::printf("  %-24s %6lld %6lld %6lld  %9.1f %9.1f  %6.3f\n", k.what, (long long)k.M, (long long)k.N,
                  (long long)k.K, flops / t_sf * 1e-9, flops / t_cb * 1e-9, t_cb / t_sf);
      sf_flops += flops, sf_ms += t_sf, cb_ms += t_cb;
    }
    c.release(x), c.release(w), c.release(y), c.release(dx), c.release(dw);
  }
  std::printf("GEMM total: sf %.1f TFLOP/s, cuBLAS %.1f TFLOP/s (time ratio cuBLAS/sf %.3f)\n", sf_flops / sf_ms * 1e-9,
              sf_flops / cb_ms * 1e-9, cb_ms / sf_ms);
  std::printf("RESULT gemm_sf_tflops=%.1f gemm_cublas_tflops=%.1f\n", sf_flops / sf_ms * 1e-9, sf_flops / cb_ms * 1e-9);
  cublasDestroy(h);
}

// ---- 2. attention -------------------------------------------------------------------------------
void bench_attn_one(Ctx& c, int B, int T, int H, int KVH, int hd) {
  AttnDims d;
  d.B = B, d.T = T, d.n_head = H, d.n_kv_head = KVH, d.head_dim = hd, d.scale = 1.f / std::sqrt(float(hd));
  const int64_t N = int64_t(B) * T;
  Tensor q = c.make(DType::BF16, {N, int64_t(H) * hd}), k = c.make(DType::BF16, {N, int64_t(KVH) * hd});
  Tensor v = c.make(DType::BF16, {N, int64_t(KVH) * hd}), o = c.make(DType::BF16, {N, int64_t(H) * hd});
  Tensor lse = c.make(DType::F32, {B, H, T}), dout = c.make(DType::BF16, {N, int64_t(H) * hd});
  Tensor dq = c.make(DType::BF16, {N, int64_t(H) * hd}), dk = c.make(DType::BF16, {N, int64_t(KVH) * hd});
  Tensor dv = c.make(DType::BF16, {N, int64_t(KVH) * hd});
  const size_t wsb = c.dev->ops().attention_workspace_bytes(d);
  Tensor ws(c.dev->alloc(wsb), DType::F32, {int64_t(wsb / 4)});
  auto fwd = [&] { c.dev->ops().attention_forward(o, lse, q, k, v, d, *c.stream); };
  auto bwd = [&] { c.dev->ops().attention_backward(dq, dk, dv, dout, q, k, v, o, lse, d, ws, *c.stream); };
  // FlashAttention's convention: causal fwd = 4*B*H*T^2*hd/2, bwd = 2.5x fwd.
  const double f_flops = 4.0 * B * H * double(T) * T * hd / 2.0;
  std::printf("B=%d T=%d H=%d KVH=%d hd=%d\n", B, T, H, KVH, hd);
  // The sm_80 kernels on any device (on Hopper the fallback's speed, against the sm_90 default below).
  sf::cuda::attention_force_path(sf::cuda::AttnPath::Sm80);
  {
    const double tf = c.time_ms(fwd, 3, 20), tb = c.time_ms(bwd, 3, 20);
    std::printf("  sm80 kernels: fwd %.3f ms (%.1f TF/s), bwd %.3f ms\n", tf, f_flops / tf * 1e-9, tb);
    std::printf("RESULT attn_hd%d_sm80_fwd_ms=%.3f attn_hd%d_sm80_bwd_ms=%.3f\n", hd, tf, hd, tb);
  }
  sf::cuda::attention_force_path(sf::cuda::AttnPath::Auto);
  const double t_f = c.time_ms(fwd, 3, 20);
  const double t_b = c.time_ms(bwd, 3, 20);
  const double t_fb = c.time_ms(
      [&] {
        fwd();
        bwd();
      },
      3, 20);
  std::printf("  default: fwd %.3f ms (%.1f TF/s), bwd %.3f ms (%.1f TF/s), fwd+bwd %.3f ms (%.1f TF/s)\n", t_f,
              f_flops / t_f * 1e-9, t_b, 2.5 * f_flops / t_b * 1e-9, t_fb, 3.5 * f_flops / t_fb * 1e-9);
  std::printf("RESULT attn_hd%d_fwd_ms=%.3f attn_hd%d_bwd_ms=%.3f attn_hd%d_fwdbwd_ms=%.3f\n", hd, t_f, hd, t_b, hd,
              t_fb);
  // Packed rows (AttnDims::pos): one record a row given as positions (the cost of the packed path
  // against the unpacked one above), and records of T/4 tokens (a quarter of the causal work).
  {
    Tensor pos = c.make(DType::I32, {N});
    d.pos = pos;
    for (int rec : {T, T / 4}) {
      std::vector<int32_t> hp(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i) hp[size_t(i)] = int32_t((i % T) % rec);
      CK(cudaMemcpy(pos.data, hp.data(), hp.size() * 4, cudaMemcpyHostToDevice));
      const double pf = c.time_ms(fwd, 3, 20), pb = c.time_ms(bwd, 3, 20);
      std::printf("  packed rows, records of %d tokens: fwd %.3f ms, bwd %.3f ms\n", rec, pf, pb);
      std::printf("RESULT attn_hd%d_packed%d_fwd_ms=%.3f attn_hd%d_packed%d_bwd_ms=%.3f\n", hd, rec, pf, hd, rec, pb);
    }
    d.pos = Tensor();
    c.release(pos);
  }
  // Sliding window (Gemma 3's local layers): T/4 keys a query, about 0.44 of the causal work.
  {
    d.window = T / 4;
    const double wf = c.time_ms(fwd, 3, 20), wb = c.time_ms(bwd, 3, 20);
    std::printf("  sliding window of %d: fwd %.3f ms, bwd %.3f ms\n", d.window, wf, wb);
    std::printf("RESULT attn_hd%d_window%d_fwd_ms=%.3f attn_hd%d_window%d_bwd_ms=%.3f\n", hd, d.window, wf, hd,
                d.window, wb);
    d.window = 0;
  }
  for (Tensor* t : {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv, &ws}) c.release(*t);
}

void bench_attn(Ctx& c) {
  std::printf("\n== Attention (causal, GQA, bf16) ==\n");
  bench_attn_one(c, 8, 2048, 32, 8, 128);
  bench_attn_one(c, 8, 2048, 32, 8, 64);
  bench_attn_one(c, 8, 2048, 16, 8, 256);  // Gemma 3's head dim: the FLOPs of the hd 128 case
}

// ---- 3. memory-bound kernels ----------------------------------------------------------------
void bench_mem(Ctx& c) {
  std::printf("\n== Memory-bound kernels vs device-to-device copy (bytes read + written) ==\n");
  const size_t copy_bytes = size_t(1) << 30;
  void* a = c.dev->alloc(copy_bytes);
  void* b = c.dev->alloc(copy_bytes);
  CK(cudaMemsetAsync(a, 1, copy_bytes, c.s));
  const double t_copy = c.time_ms([&] { CK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, c.s)); }, 3, 20);
  const double bw_copy = 2.0 * double(copy_bytes) / t_copy * 1e-6;  // GB/s
  std::printf("d2d copy 1 GiB: %.3f ms, %.0f GB/s\n", t_copy, bw_copy);
  std::printf("RESULT copy_gbs=%.0f\n", bw_copy);
  c.dev->free(a);
  c.dev->free(b);
  auto report = [&](const char* name, double bytes, const std::function<void()>& f) {
    const double t = c.time_ms(f, 3, 30);
    const double bw = bytes / t * 1e-6;
    std::printf("%-44s %8.3f ms %7.0f GB/s  %5.1f%% of copy\n", name, t, bw, 100.0 * bw / bw_copy);
    std::printf("RESULT %s_pct_copy=%.1f\n", name, 100.0 * bw / bw_copy);
    return 100.0 * bw / bw_copy;
  };
  const int64_t R = 16384;
  {
    const int64_t C = 4096;
    Tensor x = c.make(DType::BF16, {R, C}), w = c.make(DType::BF16, {C}, 0.1f), out = c.make(DType::BF16, {R, C});
    Tensor rstd = c.make(DType::F32, {R}), g = c.make(DType::BF16, {R, C}), dx = c.make(DType::BF16, {R, C});
    Tensor dw = c.make(DType::F32, {C});
    const double xb = double(R * C * 2);
    report("rmsnorm_fwd[16384x4096]", 2 * xb, [&] { c.dev->ops().rmsnorm_forward(out, rstd, x, w, 1e-5f, *c.stream); });
    report("rmsnorm_bwd[16384x4096]", 3 * xb,
           [&] { c.dev->ops().rmsnorm_backward(dx, dw, g, x, w, rstd, false, *c.stream); });
    for (Tensor* t : {&x, &w, &out, &rstd, &g, &dx, &dw}) c.release(*t);
  }
  {
    const int T = 2048, nh = 32, hd = 128;
    Tensor x = c.make(DType::BF16, {R, int64_t(nh) * hd});
    Tensor cs = c.make(DType::F32, {T, hd / 2}), sn = c.make(DType::F32, {T, hd / 2});
    const double xb = double(R) * nh * hd * 2;
    report("rope_fwd[16384x32x128]", 2 * xb,
           [&] { c.dev->ops().rope_forward(x, cs, sn, T, nh, hd, Tensor(), *c.stream); });
    report("rope_bwd[16384x32x128]", 2 * xb,
           [&] { c.dev->ops().rope_backward(x, cs, sn, T, nh, hd, Tensor(), *c.stream); });
    for (Tensor* t : {&x, &cs, &sn}) c.release(*t);
  }
  {
    const int64_t I = 14336;
    Tensor g = c.make(DType::BF16, {R, I}, 3.f), u = c.make(DType::BF16, {R, I}), o = c.make(DType::BF16, {R, I});
    Tensor d = c.make(DType::BF16, {R, I}), dg = c.make(DType::BF16, {R, I}), du = c.make(DType::BF16, {R, I});
    const double eb = double(R * I * 2);
    report("swiglu_fwd[16384x14336]", 3 * eb, [&] { c.dev->ops().swiglu_forward(o, g, u, *c.stream); });
    report("swiglu_bwd[16384x14336]", 5 * eb, [&] { c.dev->ops().swiglu_backward(dg, du, d, g, u, *c.stream); });
    for (Tensor* t : {&g, &u, &o, &d, &dg, &du}) c.release(*t);
  }
}

// ---- 4. linear cross-entropy ------------------------------------------------------------------
void bench_ce(Ctx& c) {
  std::printf("\n== Fused linear cross-entropy: N=16384, H=4096, V=128256, bf16 x/w/dx ==\n");
  const int64_t N = 16384, H = 4096, V = 128256;
  Tensor x = c.make(DType::BF16, {N, H}), w = c.make(DType::BF16, {V, H}, 0.02f);
  Tensor labels = c.make(DType::I32, {N});
  labels_kernel<<<256, 256, 0, c.s>>>(labels.ptr<int>(), N, int(V), 99);
  CK(cudaGetLastError());
  Tensor loss = c.make(DType::F32, {1}), dx = c.make(DType::BF16, {N, H});
  const size_t wsb = c.dev->ops().linear_ce_workspace_bytes(N, H, V);
  Tensor ws(c.dev->alloc(wsb), DType::F32, {int64_t(wsb / 4)});
  const double logits_bf16 = double(N) * V * 2;
  for (DType dwt : {DType::BF16, DType::F32}) {
    Tensor dw = c.make(dwt, {V, H});
    const double t =
        c.time_ms([&] { c.dev->ops().linear_cross_entropy(loss, dx, dw, x, w, labels, 1.f / N, ws, *c.stream); }, 2, 7);
    const double flops = 3 * 2.0 * double(N) * V * H;
    // Peak extra memory: the workspace (chunk logits) plus the stream's cuBLASLt workspace.
    const double extra = double(wsb) + double(sf::cuda::kLtWorkspaceBytes);
    std::printf(
        "dw %s: %.2f ms (%.0f TFLOP/s over the 3 GEMMs), %lld-token chunks, workspace %.1f MiB + %.0f MiB cuBLASLt "
        "workspace = %.1f MiB = %.4f of the bf16 logits (target <= 0.125)\n",
        dwt == DType::BF16 ? "BF16" : "F32", t, flops / t * 1e-9, (long long)sf::cuda::linear_ce_chunk_rows(N, V),
        double(wsb) / (1 << 20), double(sf::cuda::kLtWorkspaceBytes) / (1 << 20), extra / (1 << 20),
        extra / logits_bf16);
    std::printf("RESULT ce_dw%s_ms=%.2f ce_ws_mib=%.1f ce_ws_frac=%.4f ce_extra_mib=%.1f ce_extra_frac=%.4f\n",
                dwt == DType::BF16 ? "bf16" : "f32", t, double(wsb) / (1 << 20), double(wsb) / logits_bf16,
                extra / (1 << 20), extra / logits_bf16);
    c.release(dw);
  }
  for (Tensor* t : {&x, &w, &labels, &loss, &dx, &ws}) c.release(*t);
}

}  // namespace

int main(int argc, char** argv) {
  if (!sf::cuda_available()) {
    std::printf("bench_kernels: no GPU\n");
    return 0;
  }
  Ctx c;
  c.dev = sf::make_cuda_device(size_t(24) << 30);
  c.stream = c.dev->create_stream();
  c.s = static_cast<cudaStream_t>(sf::cuda::native_stream(*c.stream));
  CK(cudaEventCreate(&c.e0));
  CK(cudaEventCreate(&c.e1));
  std::printf("device: %s\n", c.dev->name().c_str());
  auto want = [&](const char* s) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], s) == 0) return true;
    return false;
  };
  try {
    if (want("gemm")) bench_gemm(c);
    if (want("attn")) bench_attn(c);
    if (want("mem")) bench_mem(c);
    if (want("ce")) bench_ce(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
  c.dev->synchronize(*c.stream);
  return 0;
}
