#include "engine/rates.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "core/dtype.h"
#include "core/host_memory.h"
#include "core/thread_pool.h"

namespace sf {

namespace {

// 1B in-memory step over its FLOPs (500 TFLOP/s) against cuBLAS on its layer GEMMs (727), H200.
constexpr double kStepEfficiency = 500.0 / 727.0;

template <class F>
double best_seconds(int reps, F&& fn) {
  fn();  // warm-up: first touch, lazy initialisation
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

MeasuredRates measure_rates(const std::string& device) {
  MeasuredRates m;
  // Host: AdamW over 32M parameters (fp32 gradients, bf16 copy), as the sliding engine runs it.
  const int64_t n = int64_t(1) << 25;
  HostBuffer p(size_t(n) * 4), g(size_t(n) * 4), mm(size_t(n) * 4), v(size_t(n) * 4), c(size_t(n) * 2);
  std::memset(p.data(), 0, p.size());
  std::memset(mm.data(), 0, mm.size());
  std::memset(v.data(), 0, v.size());
  float* gp = static_cast<float*>(g.data());
  cpu_pool().parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) gp[i] = 1e-3f * float(i % 97 - 48);
  });
  auto T = [&](void* d, DType t) { return Tensor(d, t, {n}); };
  AdamWParams ap;
  ap.lr = 1e-5f;
  int64_t step = 0;
  const double t_adam = best_seconds(3, [&] {
    ap.step = ++step;
    cpu::adamw(T(p.data(), DType::F32), T(g.data(), DType::F32), T(mm.data(), DType::F32), T(v.data(), DType::F32),
               T(c.data(), DType::BF16), ap);
  });
  m.rates.host_adamw_params_s = double(n) / t_adam;
  float sq = 0.f;
  const double t_read = best_seconds(3, [&] {
    sq = 0.f;
    cpu::sq_norm(Tensor(&sq, DType::F32, {1}), T(g.data(), DType::F32));
  });
  m.rates.host_read_gbs = double(n) * 4 / t_read * 1e-9;

  const BackendInfo be = backend_info(device);
  if (be.kind == DeviceKind::Cuda) {
    auto dev = make_device("cuda", size_t(2) << 30);
    auto s1 = dev->create_stream(), s2 = dev->create_stream();
    const size_t bytes = size_t(256) << 20;
    DeviceBuffer hu(*dev, bytes, MemoryKind::PinnedHost), hd(*dev, bytes, MemoryKind::PinnedHost);
    DeviceBuffer du(*dev, bytes), dd(*dev, bytes);
    std::memset(hu.data(), 1, bytes);
    const double t_pcie = best_seconds(3, [&] {
      dev->copy(du.data(), hu.data(), bytes, CopyKind::HostToDevice, *s1);
      dev->copy(hd.data(), dd.data(), bytes, CopyKind::DeviceToHost, *s2);
      dev->synchronize(*s1);
      dev->synchronize(*s2);
    });
    m.rates.pcie_gbs = double(bytes) / t_pcie * 1e-9;
    // A layer-sized GEMM: [8192, 4096] x [4096, 4096]^T in bf16 (fp32 accumulate), 10 in a row.
    const int64_t M = 8192, K = 4096, N = 4096;
    DeviceBuffer a(*dev, size_t(M * K) * 2), w(*dev, size_t(N * K) * 2), o(*dev, size_t(M * N) * 2);
    Ops& ops = dev->ops();
    {  // pseudo-random values (a GEMM of zeros runs at another power and clock)
      std::vector<uint16_t> h(size_t(M * K));
      uint32_t x = 12345;
      for (auto& e : h) {
        x = x * 1664525u + 1013904223u;
        e = float_to_bf16(float(int(x >> 9) % 2001 - 1000) * 1e-3f).bits;
      }
      dev->copy(a.data(), h.data(), size_t(M * K) * 2, CopyKind::HostToDevice, *s1);
      dev->copy(w.data(), h.data(), size_t(N * K) * 2, CopyKind::HostToDevice, *s1);
      dev->synchronize(*s1);
    }
    const double t_gemm = best_seconds(3, [&] {
      for (int i = 0; i < 10; ++i)
        ops.matmul(Tensor(o.data(), DType::BF16, {M, N}), Tensor(a.data(), DType::BF16, {M, K}),
                   Tensor(w.data(), DType::BF16, {N, K}), false, true, 1.f, 0.f, *s1);
      dev->synchronize(*s1);
    });
    m.gemm_tflops = 10 * 2.0 * double(M) * double(N) * double(K) / t_gemm * 1e-12;
    m.rates.model_tflops = m.gemm_tflops * kStepEfficiency;
  }
  char line[256];
  std::snprintf(line, sizeof line, "measured: host AdamW %.2f G params/s, host read %.0f GB/s%s",
                m.rates.host_adamw_params_s * 1e-9, m.rates.host_read_gbs, "");
  m.summary = line;
  if (m.gemm_tflops > 0) {
    std::snprintf(line, sizeof line, ", PCIe %.1f GB/s each way (both busy), GEMM %.0f TFLOP/s -> model %.0f TFLOP/s",
                  m.rates.pcie_gbs, m.gemm_tflops, m.rates.model_tflops);
    m.summary += line;
  }
  return m;
}

}  // namespace sf
