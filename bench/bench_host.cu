// Host-side rates that bound the offloaded (sliding) engine, measured on the machine it runs on:
//   1. host memory bandwidth (read, write, copy) by thread count, on arrays far larger than the
//      caches: the CPU optimizer and the gradient additions are limited by it;
//   2. the CPU AdamW (backend/cpu/adamw.cpp, the engine's host optimizer) in parameters/s and the
//      bytes it moves, with fp32 and with bf16 gradients; the host squared norm;
//   3. pinned host <-> GPU copies (PCIe), each direction alone and both at once.
// Timing: wall clock around whole passes, best of several. Usage: bench_host [MiB per array]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "backend/cpu/kernels.h"
#include "bench_check.h"
#include "core/dtype.h"
#include "core/host_memory.h"
#include "core/thread_pool.h"

namespace {

using namespace sf;
using Clock = std::chrono::steady_clock;

double best_s(int reps, const std::function<void()>& fn) {
  fn();  // warm-up (first touch, page faults)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void bench_memory(size_t bytes) {
  const int64_t n = int64_t(bytes / 4);
  HostBuffer a(bytes), b(bytes);
  float* pa = static_cast<float*>(a.data());
  float* pb = static_cast<float*>(b.data());
  cpu_pool().parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) pa[i] = float(i & 1023), pb[i] = 0.f;
  });
  std::printf("== Host memory bandwidth (%zu MiB arrays) ==\n", bytes >> 20);
  const int hw = int(std::thread::hardware_concurrency());
  std::vector<int> counts = {1, 2, 4, 8, hw};
  counts.erase(std::remove_if(counts.begin(), counts.end(), [&](int c) { return c > hw; }), counts.end());
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  double best_copy = 0;
  for (int t : counts) {
    ThreadPool pool(t);
    std::vector<float> sinks(size_t(t) + 1, 0.f);
    const double tr = best_s(3, [&] {
      pool.parallel_for(n, [&](int64_t i0, int64_t i1) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = i0; i + 8 <= i1; i += 8)
          for (int j = 0; j < 8; ++j) s[j] += pa[i + j];
        sinks[size_t(i0 * t / n)] += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
      });
    });
    const double tw = best_s(3, [&] {
      pool.parallel_for(n, [&](int64_t i0, int64_t i1) { std::memset(pb + i0, 0, size_t(i1 - i0) * 4); });
    });
    const double tc = best_s(3, [&] {
      pool.parallel_for(n, [&](int64_t i0, int64_t i1) { std::memcpy(pb + i0, pa + i0, size_t(i1 - i0) * 4); });
    });
    const double gb = double(bytes) * 1e-9;
    std::printf("  %2d threads: read %6.1f GB/s, write %6.1f GB/s, copy %6.1f GB/s (read + write)%s\n", t, gb / tr,
                gb / tw, 2 * gb / tc, sinks[0] == 12345.f ? " " : "");
    best_copy = std::max(best_copy, 2 * gb / tc);
  }
  std::printf("RESULT host_copy_gbs=%.1f\n", best_copy);
}

void bench_optimizer(int64_t n) {
  std::printf("== CPU AdamW (%d threads), %lld parameters ==\n", cpu_pool().size(), (long long)n);
  HostBuffer p(size_t(n) * 4), m(size_t(n) * 4), v(size_t(n) * 4), g(size_t(n) * 4), gb(size_t(n) * 2),
      copy(size_t(n) * 2);
  float* pp = static_cast<float*>(p.data());
  float* pg = static_cast<float*>(g.data());
  uint16_t* pgb = static_cast<uint16_t*>(gb.data());
  cpu_pool().parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      pp[i] = 0.01f * float((i * 7919) % 1000 - 500) / 500.f;
      pg[i] = 1e-3f * float((i * 104729) % 1000 - 500) / 500.f;
      pgb[i] = float_to_bf16(pg[i]).bits;
    }
  });
  std::memset(m.data(), 0, m.size());
  std::memset(v.data(), 0, v.size());
  AdamWParams ap;
  ap.lr = 1e-5f;
  ap.weight_decay = 0.01f;
  auto T = [&](void* d, DType t) { return Tensor(d, t, {n}); };
  int64_t step = 0;
  const double t32 = best_s(3, [&] {
    ap.step = ++step;
    cpu::adamw(T(p.data(), DType::F32), T(g.data(), DType::F32), T(m.data(), DType::F32), T(v.data(), DType::F32),
               T(copy.data(), DType::BF16), ap);
  });
  const double t16 = best_s(3, [&] {
    ap.step = ++step;
    cpu::adamw(T(p.data(), DType::F32), T(gb.data(), DType::BF16), T(m.data(), DType::F32), T(v.data(), DType::F32),
               T(copy.data(), DType::BF16), ap);
  });
  // bytes: read p, m, v, g; write p, m, v, bf16 copy
  const double b32 = double(n) * (16 + 14), b16 = double(n) * (14 + 14);
  std::printf("  fp32 grads -> bf16 copy: %.3f s, %.2f G params/s, %.1f GB/s\n", t32, n / t32 * 1e-9, b32 / t32 * 1e-9);
  std::printf("  bf16 grads -> bf16 copy: %.3f s, %.2f G params/s, %.1f GB/s\n", t16, n / t16 * 1e-9, b16 / t16 * 1e-9);
  // The engine's host pass (bf16 gradients in, no copy) with fp32 and with bf16 m and v (compact
  // optimizer state, stochastically rounded): 26 and 18 bytes a parameter.
  HostBuffer m16(size_t(n) * 2), v16(size_t(n) * 2);
  std::memset(m16.data(), 0, m16.size());
  std::memset(v16.data(), 0, v16.size());
  const double te32 = best_s(3, [&] {
    ap.step = ++step;
    cpu::adamw(T(p.data(), DType::F32), T(gb.data(), DType::BF16), T(m.data(), DType::F32), T(v.data(), DType::F32),
               Tensor(), ap);
  });
  const double te16 = best_s(3, [&] {
    ap.step = ++step;
    cpu::adamw(T(p.data(), DType::F32), T(gb.data(), DType::BF16), T(m16.data(), DType::BF16),
               T(v16.data(), DType::BF16), Tensor(), ap);
  });
  std::printf("  engine pass, fp32 m, v: %.3f s, %.2f G params/s, %.1f GB/s\n", te32, n / te32 * 1e-9,
              double(n) * 26 / te32 * 1e-9);
  std::printf("  engine pass, bf16 m, v: %.3f s, %.2f G params/s, %.1f GB/s\n", te16, n / te16 * 1e-9,
              double(n) * 18 / te16 * 1e-9);
  std::printf("RESULT adamw_engine_fp32state_gparams_s=%.3f adamw_engine_bf16state_gparams_s=%.3f\n", n / te32 * 1e-9,
              n / te16 * 1e-9);
  float sq = 0.f;
  const double tn = best_s(3, [&] {
    sq = 0.f;
    cpu::sq_norm(Tensor(&sq, DType::F32, {1}), T(g.data(), DType::F32));
  });
  std::printf("  squared norm of fp32 gradients: %.3f s, %.1f GB/s\n", tn, double(n) * 4 / tn * 1e-9);
  std::printf("RESULT adamw_f32grad_gparams_s=%.3f adamw_bf16grad_gparams_s=%.3f sqnorm_gbs=%.1f\n", n / t32 * 1e-9,
              n / t16 * 1e-9, double(n) * 4 / tn * 1e-9);
}

void bench_pcie(size_t bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("== PCIe: no GPU, skipped ==\n");
    return;
  }
  void *hup, *hdown, *dup, *ddown;
  CK(cudaHostAlloc(&hup, bytes, cudaHostAllocDefault));
  CK(cudaHostAlloc(&hdown, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&dup, bytes));
  CK(cudaMalloc(&ddown, bytes));
  std::memset(hup, 1, bytes);
  std::memset(hdown, 2, bytes);
  cudaStream_t s1, s2;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const double gb = double(bytes) * 1e-9;
  const double th = best_s(5, [&] {
    CK(cudaMemcpyAsync(dup, hup, bytes, cudaMemcpyHostToDevice, s1));
    CK(cudaStreamSynchronize(s1));
  });
  const double td = best_s(5, [&] {
    CK(cudaMemcpyAsync(hdown, ddown, bytes, cudaMemcpyDeviceToHost, s2));
    CK(cudaStreamSynchronize(s2));
  });
  const double tb = best_s(5, [&] {
    CK(cudaMemcpyAsync(dup, hup, bytes, cudaMemcpyHostToDevice, s1));
    CK(cudaMemcpyAsync(hdown, ddown, bytes, cudaMemcpyDeviceToHost, s2));
    CK(cudaStreamSynchronize(s1));
    CK(cudaStreamSynchronize(s2));
  });
  std::printf("== PCIe, pinned, %zu MiB copies ==\n", bytes >> 20);
  std::printf("  host->device %.1f GB/s, device->host %.1f GB/s, both at once %.1f GB/s each way\n", gb / th, gb / td,
              gb / tb);
  std::printf("RESULT pcie_h2d_gbs=%.1f pcie_d2h_gbs=%.1f pcie_both_gbs=%.1f\n", gb / th, gb / td, gb / tb);
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
  CK(cudaFreeHost(hup));
  CK(cudaFreeHost(hdown));
  CK(cudaFree(dup));
  CK(cudaFree(ddown));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? size_t(std::atoll(argv[1])) : 2048;
  bench_memory(mib << 20);
  bench_optimizer(int64_t(mib << 20) / 4);
  bench_pcie(std::min<size_t>(mib, 1024) << 20);
  return 0;
}
