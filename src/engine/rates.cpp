#include "engine/rates.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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

// Our causal attention kernel at a long-sequence shape of the presets' heads: B 2 x T 8192, 32 query
// and 8 KV heads of 128 (16384 tokens, as 8 x 2048), forward and backward timed apart (the
// backward reads the forward's output and log-sum-exp). Rates on FLOPs counted FlashAttention's way
// (attention_forward_flops; the backward 2.5x), as the planner counts them.
struct AttentionRate {
  double fwd_tflops = 0, bwd_tflops = 0;
};
AttentionRate measure_attention(Device& dev, Stream& s) {
  AttnDims d;
  d.B = 2, d.T = 8192, d.n_head = 32, d.n_kv_head = 8, d.head_dim = 128;
  d.scale = 1.f / std::sqrt(float(d.head_dim));
  const int64_t N = int64_t(d.B) * d.T, QW = int64_t(d.n_head) * d.head_dim, KW = int64_t(d.n_kv_head) * d.head_dim;
  Ops& ops = dev.ops();
  const size_t ws_bytes = ops.attention_workspace_bytes(d);
  DeviceBuffer q(dev, size_t(N * QW) * 2), o(dev, size_t(N * QW) * 2), dout(dev, size_t(N * QW) * 2),
      dq(dev, size_t(N * QW) * 2);  // [N, 32 x 128] bf16
  DeviceBuffer k(dev, size_t(N * KW) * 2), v(dev, size_t(N * KW) * 2), dk(dev, size_t(N * KW) * 2),
      dv(dev, size_t(N * KW) * 2);                          // [N, 8 x 128] bf16
  DeviceBuffer lse(dev, size_t(d.B) * d.n_head * d.T * 4);  // [B, 32, T] f32
  DeviceBuffer ws(dev, std::max<size_t>(ws_bytes, 256));
  {  // pseudo-random values in [-1, 1]: scores of a realistic spread (all-equal inputs run another path of exp)
    std::vector<uint16_t> h(size_t(N * QW));
    uint32_t x = 777;
    for (auto& e : h) {
      x = x * 1664525u + 1013904223u;
      e = float_to_bf16(float(int(x >> 9) % 2001 - 1000) * 1e-3f).bits;
    }
    for (DeviceBuffer* b : {&q, &dout}) dev.copy(b->data(), h.data(), size_t(N * QW) * 2, CopyKind::HostToDevice, s);
    for (DeviceBuffer* b : {&k, &v}) dev.copy(b->data(), h.data() + 17, size_t(N * KW) * 2, CopyKind::HostToDevice, s);
    dev.synchronize(s);
  }
  auto T2 = [](DeviceBuffer& b, DType t, std::initializer_list<int64_t> shape) { return Tensor(b.data(), t, shape); };
  const Tensor tq = T2(q, DType::BF16, {N, QW}), to = T2(o, DType::BF16, {N, QW}), tdo = T2(dout, DType::BF16, {N, QW}),
               tdq = T2(dq, DType::BF16, {N, QW}), tk = T2(k, DType::BF16, {N, KW}), tv = T2(v, DType::BF16, {N, KW}),
               tdk = T2(dk, DType::BF16, {N, KW}), tdv = T2(dv, DType::BF16, {N, KW}),
               tl = T2(lse, DType::F32, {d.B, d.n_head, d.T});
  const Tensor tws(ws.data(), DType::F32, {int64_t(std::max<size_t>(ws_bytes, 256) / 4)});
  constexpr int kRuns = 5;
  const double t_fwd = best_seconds(3, [&] {
    for (int i = 0; i < kRuns; ++i) ops.attention_forward(to, tl, tq, tk, tv, d, s);
    dev.synchronize(s);
  });
  const double t_bwd = best_seconds(3, [&] {
    for (int i = 0; i < kRuns; ++i) ops.attention_backward(tdq, tdk, tdv, tdo, tq, tk, tv, to, tl, d, tws, s);
    dev.synchronize(s);
  });
  const double fwd_flops = attention_forward_flops(d.B, d.T, d.n_head, d.head_dim);
  return {kRuns * fwd_flops / t_fwd * 1e-12, kRuns * 2.5 * fwd_flops / t_bwd * 1e-12};
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
    {  // first, while the arena is empty (its buffers are freed again at the end of this block)
      const AttentionRate a = measure_attention(*dev, *s1);
      m.rates.attn_fwd_tflops = a.fwd_tflops;
      m.rates.attn_bwd_tflops = a.bwd_tflops;
    }
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
    std::snprintf(
        line, sizeof line,
        ", PCIe %.1f GB/s each way (both busy), GEMM %.0f TFLOP/s -> model %.0f TFLOP/s, attention forward %.0f "
        "/ backward %.0f TFLOP/s",
        m.rates.pcie_gbs, m.gemm_tflops, m.rates.model_tflops, m.rates.attn_fwd_tflops, m.rates.attn_bwd_tflops);
    m.summary += line;
  }
  return m;
}

}  // namespace sf
