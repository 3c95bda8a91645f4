// The MoE grouped GEMMs of one layer, through the backend's kernel table as the MoE layer calls
// them (backend/ops.h; model/moe_program.cpp):
//   moe_gemm_bench [--tokens N] [--iters I] [--model olmoe|qwen3|all]
// cuBLASLt per expert over the expert streams (lt, what ships) and on one stream (lt1, the test hook
// cuda::moe_gemm_force_one_stream), for the OLMoE-1B-7B and Qwen3-30B-A3B expert shapes at N tokens
// (default 16384 = 8 x 2048), routed by the real router on random logits. Each GEMM is timed by CUDA
// events on the backend's stream (median of I runs after 3 warm-ups) and printed as a RESULT line
// with its TFLOP/s, its fraction of a dense cuBLAS GEMM of the same FLOPs (the ceiling) and the
// host's milliseconds to issue it; then a layer's MoE forward from the routing on (the host's wait
// for the offsets included). Checked: lt against a reference of one dense matmul per expert
// (relative L2 over 1e-2: exit 1) and lt against lt1 (not the same bits: exit 1).
//
// The one-launch tensor-core tile kernel that lt replaced (deleted in session 12; docs/MOE.md) ran,
// on the H200 (session 12, call 4; bench/results/2026-12-02s12_gpu_4_moe_gemm.log), at 46-109
// TFLOP/s on OLMoE's GEMMs where lt ran at 564-668 (dense ceiling 788; lt1 429-549) and gave the
// same bits; at Qwen3's, 44-100 where lt ran at 296-457 (lt1 260-342).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/moe.cuh"
#include "backend/device.h"
#include "bench_check.h"

namespace {

using namespace sf;

__global__ void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = uint64_t(i) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    p[i] = __float2bfloat16((float(x >> 40) * (2.f / 16777216.f) - 1.f) * scale);  // uniform [-scale, scale)
  }
}

struct Shape {
  const char* name;
  int64_t E, k, H, Ie;
};

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    CK(cudaMemcpy(v.data(), t.data, t.bytes(), cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<__nv_bfloat16> b(v.size());
  CK(cudaMemcpy(b.data(), t.data, t.bytes(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < v.size(); ++i) v[i] = __bfloat162float(b[i]);
  return v;
}

double rel_l2(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    num += (double(x[i]) - ref[i]) * (double(x[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int usage() {
  std::fprintf(stderr, "usage: moe_gemm_bench [--tokens N] [--iters I] [--model olmoe|qwen3|all]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 16384;
  int iters = 10;
  std::string which = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    if (a == "--tokens")
      N = std::atoll(argv[++i]);
    else if (a == "--iters")
      iters = std::atoi(argv[++i]);
    else if (a == "--model")
      which = argv[++i];
    else
      return usage();
  }
  if (N < 1 || N > (int64_t(1) << 20) || iters < 1 || iters > 1000) return usage();
  if (!cuda_available()) {
    std::fprintf(stderr, "moe_gemm_bench: no GPU\n");
    return 1;
  }
  const Shape shapes[] = {{"olmoe", 64, 8, 2048, 1024}, {"qwen3", 128, 8, 2048, 768}};
  bool ok = true;
  try {
    auto dev = make_cuda_device(size_t(20) << 30, 0);
    auto stream = dev->create_stream();
    const cudaStream_t s = static_cast<cudaStream_t>(cuda::native_stream(*stream));
    Ops& ops = dev->ops();
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (const Shape& sh : shapes) {
      if (which != "all" && which != sh.name) continue;
      const int64_t E = sh.E, k = sh.k, H = sh.H, Ie = sh.Ie, S = N * k;
      std::vector<void*> owned;
      auto make = [&](DType dt, std::initializer_list<int64_t> shape) {
        Tensor t(nullptr, dt, shape);
        t.data = dev->alloc(t.bytes());
        owned.push_back(t.data);
        return t;
      };
      uint64_t seed = 11;
      auto rand_bf16 = [&](std::initializer_list<int64_t> shape, float scale) {
        Tensor t = make(DType::BF16, shape);
        fill_uniform<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(t.data), t.numel(), ++seed * 7919, scale);
        CK(cudaGetLastError());
        return t;
      };
      // The routing: the router's softmax top-k on random logits, sorted by expert.
      Tensor logits = rand_bf16({N, E}, 2.f), probs = make(DType::F32, {N, E});
      Tensor idx = make(DType::I32, {N, k}), wt = make(DType::F32, {N, k});
      Tensor offs = make(DType::I32, {E + 1}), ss = make(DType::I32, {S}), sp = make(DType::I32, {S});
      ops.moe_route(probs, idx, wt, Tensor(), logits, true, *stream);
      ops.moe_permute(offs, ss, sp, idx, *stream);
      std::vector<int32_t> off(size_t(E + 1));
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(off.data(), offs.data, off.size() * 4, cudaMemcpyDeviceToHost));
      int64_t lo = S, hi = 0, empty = 0;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t r = off[size_t(e + 1)] - off[size_t(e)];
        lo = std::min(lo, r), hi = std::max(hi, r), empty += r == 0;
      }
      std::printf("%s: E=%lld top-%lld H=%lld Ie=%lld tokens=%lld rows=%lld, rows an expert %lld..%lld (%lld empty)\n",
                  sh.name, (long long)E, (long long)k, (long long)H, (long long)Ie, (long long)N, (long long)S,
                  (long long)lo, (long long)hi, (long long)empty);
      // Layer buffers (model/program.h): [S, H] and [S, Ie] activations, the experts' weights.
      const float ws = 0.03f;
      Tensor xs = rand_bf16({S, H}, 1.f), ea = rand_bf16({S, Ie}, 1.f), dys = rand_bf16({S, H}, 1.f);
      Tensor deg = rand_bf16({S, Ie}, 1.f);
      Tensor wg = rand_bf16({E, Ie * H}, ws), wd = rand_bf16({E, H * Ie}, ws);
      Tensor out_i = make(DType::BF16, {S, Ie}), out_h = make(DType::BF16, {S, H});
      Tensor dwg = make(DType::BF16, {E, Ie * H}), dwd = make(DType::F32, {E, H * Ie});
      ops.zero(out_h, *stream);
      ops.zero(dwg, *stream);
      ops.zero(dwd, *stream);
      // One grouped GEMM as the layer calls it: out = a @ op(W_e) + beta out, or (wgrad) dW_e += a_e^T b_e.
      struct Op {
        const char* name;  // as op_profile names the call: out rows x cols, K
        Tensor out, a, b;  // forward: out [S, Nout], a [S, K], b = w [E, K*Nout]; wgrad: dw, dy, x
        bool wgrad = false, trans_w = true;
        float beta = 0.f;
      };
      const std::vector<Op> opsl = {
          {"fwd_x_WT S x Ie K=H (gate, up)", out_i, xs, wg, false, true, 0.f},
          {"fwd_x_WT S x H K=Ie (down)", out_h, ea, wd, false, true, 0.f},
          {"bwd_dy_W S x Ie K=H (d act)", out_i, dys, wd, false, false, 0.f},
          {"bwd_dy_W S x H K=Ie beta=1 (d xs)", out_h, deg, wg, false, false, 1.f},
          {"wgrad Ie x H over S, bf16 dw (gate, up)", dwg, deg, xs, true},
          {"wgrad H x Ie over S, f32 dw (down)", dwd, dys, ea, true},
      };
      auto run = [&](const Op& op) {
        if (op.wgrad)
          ops.moe_grouped_matmul_wgrad(op.out, op.a, op.b, offs, *stream);
        else
          ops.moe_grouped_matmul(op.out, op.a, op.b, offs, op.trans_w, op.beta, *stream);
      };
      // Rows [r0, r0 + n) of t [rows, cols], or row e of w [E, stride] seen as [r, c].
      auto rows_of = [](const Tensor& t, int64_t r0, int64_t n) {
        return Tensor(static_cast<char*>(t.data) + size_t(r0 * t.cols()) * dtype_size(t.dtype), t.dtype, {n, t.cols()});
      };
      auto expert_w = [](const Tensor& w, int64_t e, int64_t r, int64_t c) {
        return Tensor(static_cast<char*>(w.data) + size_t(e * w.cols()) * dtype_size(w.dtype), w.dtype, {r, c});
      };
      // The reference: one dense matmul per expert with rows (cuBLASLt on each expert's own plan).
      auto reference = [&](const Op& op) {
        for (int64_t e = 0; e < E; ++e) {
          const int64_t r0 = off[size_t(e)], n = off[size_t(e + 1)] - r0;
          if (n == 0) continue;
          if (op.wgrad) {  // dW_e [Nout, K] += dy_e^T x_e
            const int64_t Nout = op.a.cols(), K = op.b.cols();
            ops.matmul(expert_w(op.out, e, Nout, K), rows_of(op.a, r0, n), rows_of(op.b, r0, n), true, false, 1.f, 1.f,
                       *stream);
          } else {  // out_e = a_e @ op(W_e) + beta out_e, W_e [Nout, K] (trans_w) or [K, Nout]
            const int64_t Nout = op.out.cols(), K = op.a.cols();
            const Tensor w = op.trans_w ? expert_w(op.b, e, Nout, K) : expert_w(op.b, e, K, Nout);
            ops.matmul(rows_of(op.out, r0, n), rows_of(op.a, r0, n), w, false, op.trans_w, 1.f, op.beta, *stream);
          }
        }
      };
      // The output of f run once from zero (the accumulating calls, beta 1 and wgrad, grow their
      // output with every run).
      auto from_zero = [&](const Op& op, const std::function<void()>& f) {
        ops.zero(op.out, *stream);
        f();
        CK(cudaStreamSynchronize(s));
        return to_host(op.out);
      };
      const double flops = 2.0 * double(S) * double(H) * double(Ie);
      // The ceiling: one dense GEMM of the same FLOPs, [S, H] x [H, Ie]^T.
      Tensor wdense = Tensor(wg.data, DType::BF16, {Ie, H});
      const double dms = median_event_ms(
          s, e0, e1, [&] { ops.matmul(out_i, xs, wdense, false, true, 1.f, 0.f, *stream); }, 3, iters);
      const double ceiling = flops / (dms * 1e-3) * 1e-12;
      std::printf("RESULT moe_gemm model=%s op=\"dense cuBLAS S x Ie K=H (ceiling)\" ms=%.3f tflops=%.1f\n", sh.name,
                  dms, ceiling);
      // Host milliseconds to issue one call (the launches; the offsets' wait is behind the warm-up).
      auto host_ms = [&](const std::function<void()>& f) {
        std::vector<double> ts;
        for (int i = 0; i < iters; ++i) {
          CK(cudaStreamSynchronize(s));
          const auto t0 = std::chrono::steady_clock::now();
          f();
          ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        CK(cudaStreamSynchronize(s));
        std::sort(ts.begin(), ts.end());
        return ts[ts.size() / 2];
      };
      const char* paths[2] = {"lt", "lt1"};
      for (const Op& op : opsl) {
        const auto f = [&] { run(op); };
        std::vector<float> outs[2];
        for (int p = 0; p < 2; ++p) {
          cuda::moe_gemm_force_one_stream(p == 1);
          const double ms = median_event_ms(s, e0, e1, f, 3, iters), hms = host_ms(f);
          outs[p] = from_zero(op, f);
          const double tf = flops / (ms * 1e-3) * 1e-12;
          std::printf("RESULT moe_gemm model=%s op=\"%s\" path=%s ms=%.3f tflops=%.1f of_ceiling=%.2f host_ms=%.3f\n",
                      sh.name, op.name, paths[p], ms, tf, tf / ceiling, hms);
        }
        cuda::moe_gemm_force_one_stream(false);
        const double err = rel_l2(outs[0], from_zero(op, [&] { reference(op); }));
        const bool same = outs[0] == outs[1];  // four streams and one: the same plans, the same bits
        const bool good = err <= 1e-2 && same;
        ok = ok && good;
        std::printf("RESULT moe_gemm model=%s op=\"%s\" rel_l2_lt_vs_dense_per_expert=%.2e lt_lt1_same_bits=%d%s\n",
                    sh.name, op.name, err, same ? 1 : 0, good ? "" : " MISMATCH");
      }
      // A layer's MoE forward from the routing on: permute, gather, gate, up, down. It holds the
      // host's one wait for the offsets: a GPU bubble would show here as time beyond the parts.
      Tensor x = rand_bf16({N, H}, 1.f), out_i2 = make(DType::BF16, {S, Ie});
      auto chain = [&] {
        ops.moe_permute(offs, ss, sp, idx, *stream);
        ops.moe_gather(xs, x, ss, int(k), *stream);
        ops.moe_grouped_matmul(out_i, xs, wg, offs, true, 0.f, *stream);
        ops.moe_grouped_matmul(out_i2, xs, wg, offs, true, 0.f, *stream);
        ops.moe_grouped_matmul(out_h, ea, wd, offs, true, 0.f, *stream);
      };
      for (int p = 0; p < 2; ++p) {
        cuda::moe_gemm_force_one_stream(p == 1);
        const double cms = median_event_ms(s, e0, e1, chain, 3, iters);
        std::printf("RESULT moe_gemm model=%s op=\"forward chain: permute, gather, 3 grouped GEMMs\" path=%s ms=%.3f\n",
                    sh.name, paths[p], cms);
      }
      cuda::moe_gemm_force_one_stream(false);
      CK(cudaStreamSynchronize(s));
      for (void* q : owned) dev->free(q);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_gemm_bench: %s\n", e.what());
    return 1;
  }
  if (!ok) std::fprintf(stderr, "moe_gemm_bench: an output differs from its reference (MISMATCH above)\n");
  return ok ? 0 : 1;
}
