// Causal GQA attention through the backend, for bench/attn_vs_torch.py (same call, same GPU):
//   attn_bench B T H KVH HD [--path auto|sm80|sm80small] [--pack L] [--window W] [--io DIR]
// Times forward, backward and forward+backward (CUDA events on the backend's stream, 5 warm-up
// runs, median of 30 each) on random bf16 inputs and prints one RESULT line. The three are timed
// interleaved (each round: fwd, bwd, fwd+bwd), so that clock and temperature drift over the run
// (hd 128 heats the GPU) weigh on them alike; timed one after the other, fwd+bwd came last and read
// up to 0.2 ms above fwd + bwd. With --io DIR it instead
// reads q, k, v, dout (raw bf16, the backend's [B*T, heads*hd] layout) from DIR/{q,k,v,do}.bin,
// runs one forward and backward and writes DIR/{o,dq,dk,dv}.bin for the script's comparison
// with PyTorch. --pack L: packed rows, each row records of L tokens (the last one shorter), so
// that B rows of T cost what B T / L unpacked rows of L should (issue 19: packed batches at the
// same speed per real token); --window W: a sliding window of W keys.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_device.h"
#include "backend/device.h"
#include "bench_check.h"

namespace {

using namespace sf;

__global__ void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = uint64_t(i) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    p[i] = __float2bfloat16(float(x >> 40) * (2.f / 16777216.f) - 1.f);  // uniform [-1, 1)
  }
}

bool read_file(const std::string& path, void* dst, size_t bytes) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(bytes);
  if (!f.read(buf.data(), std::streamsize(bytes)) || f.peek() != EOF) return false;
  CK(cudaMemcpy(dst, buf.data(), bytes, cudaMemcpyHostToDevice));
  return true;
}

bool write_file(const std::string& path, const void* src, size_t bytes) {
  std::vector<char> buf(bytes);
  CK(cudaMemcpy(buf.data(), src, bytes, cudaMemcpyDeviceToHost));
  std::ofstream f(path, std::ios::binary);
  return bool(f.write(buf.data(), std::streamsize(bytes)));
}

int usage() {
  std::fprintf(stderr,
               "usage: attn_bench B T H KVH HD [--path auto|sm80|sm80small] [--pack L] [--window W] [--io DIR]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) return usage();
  AttnDims d;
  d.B = std::atoi(argv[1]), d.T = std::atoi(argv[2]), d.n_head = std::atoi(argv[3]);
  d.n_kv_head = std::atoi(argv[4]), d.head_dim = std::atoi(argv[5]);
  if (d.B < 1 || d.T < 1 || d.n_head < 1 || d.n_kv_head < 1 || d.n_head % d.n_kv_head != 0 || d.head_dim < 1 ||
      d.head_dim > 256)
    return usage();
  d.scale = 1.f / std::sqrt(float(d.head_dim));
  std::string path = "auto", io;
  int pack = 0;
  for (int i = 6; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--path") == 0)
      path = argv[i + 1];
    else if (std::strcmp(argv[i], "--io") == 0)
      io = argv[i + 1];
    else if (std::strcmp(argv[i], "--pack") == 0)
      pack = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--window") == 0)
      d.window = std::atoi(argv[i + 1]);
    else
      return usage();
  }
  if ((path != "auto" && path != "sm80" && path != "sm80small") || pack < 0 || d.window < 0) return usage();
  if (!sf::cuda_available()) {
    std::printf("attn_bench: no GPU\n");
    return 1;
  }
  cuda::attention_force_path(path == "sm80"        ? cuda::AttnPath::Sm80
                             : path == "sm80small" ? cuda::AttnPath::Sm80Small
                                                   : cuda::AttnPath::Auto);
  auto dev = sf::make_cuda_device(size_t(16) << 30);
  auto stream = dev->create_stream();
  cudaStream_t s = static_cast<cudaStream_t>(sf::cuda::native_stream(*stream));

  const int64_t N = int64_t(d.B) * d.T, QW = int64_t(d.n_head) * d.head_dim, KW = int64_t(d.n_kv_head) * d.head_dim;
  auto make = [&](DType dt, std::initializer_list<int64_t> shape) {
    Tensor t(nullptr, dt, shape);
    t.data = dev->alloc(t.bytes());
    return t;
  };
  Tensor q = make(DType::BF16, {N, QW}), k = make(DType::BF16, {N, KW}), v = make(DType::BF16, {N, KW});
  Tensor o = make(DType::BF16, {N, QW}), dout = make(DType::BF16, {N, QW}),
         lse = make(DType::F32, {d.B, d.n_head, d.T});
  Tensor dq = make(DType::BF16, {N, QW}), dk = make(DType::BF16, {N, KW}), dv = make(DType::BF16, {N, KW});
  if (pack > 0) {  // pos [B*T] I32: position inside records of `pack` tokens
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t((i % d.T) % pack);
    d.pos = make(DType::I32, {N});
    CK(cudaMemcpy(d.pos.data, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  }
  const size_t wsb = dev->ops().attention_workspace_bytes(d);
  Tensor ws(dev->alloc(wsb), DType::F32, {int64_t(wsb / 4)});
  auto fwd = [&] { dev->ops().attention_forward(o, lse, q, k, v, d, *stream); };
  auto bwd = [&] { dev->ops().attention_backward(dq, dk, dv, dout, q, k, v, o, lse, d, ws, *stream); };

  try {
    if (!io.empty()) {
      const char* names[4] = {"q", "k", "v", "do"};
      Tensor* ins[4] = {&q, &k, &v, &dout};
      for (int i = 0; i < 4; ++i)
        if (!read_file(io + "/" + names[i] + ".bin", ins[i]->data, ins[i]->bytes())) {
          std::fprintf(stderr, "attn_bench: %s/%s.bin: missing or not %zu bytes\n", io.c_str(), names[i],
                       size_t(ins[i]->bytes()));
          return 2;
        }
      fwd();
      bwd();
      CK(cudaStreamSynchronize(s));
      const char* onames[4] = {"o", "dq", "dk", "dv"};
      const Tensor* outs[4] = {&o, &dq, &dk, &dv};
      for (int i = 0; i < 4; ++i)
        if (!write_file(io + "/" + onames[i] + ".bin", outs[i]->data, outs[i]->bytes())) {
          std::fprintf(stderr, "attn_bench: cannot write %s/%s.bin\n", io.c_str(), onames[i]);
          return 1;
        }
      std::printf("attn_bench: wrote %s/{o,dq,dk,dv}.bin (path %s)\n", io.c_str(), path.c_str());
      return 0;
    }
    uint64_t seed = 1;
    for (Tensor* t : {&q, &k, &v, &dout}) {
      fill_uniform<<<1024, 256, 0, s>>>(static_cast<__nv_bfloat16*>(t->data), t->numel(), ++seed * 7919);
      CK(cudaGetLastError());
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto fwdbwd = [&] {
      fwd();
      bwd();
    };
    // One timed run of f (events around it) after `warm` untimed ones.
    auto time_ms = [&](const std::function<void()>& f, int warm) { return median_event_ms(s, e0, e1, f, warm, 1); };
    std::vector<double> vf, vb, vfb;  // 30 rounds, each timing fwd, bwd and fwd+bwd once
    for (int round = 0; round < 30; ++round) {
      const int warm = round == 0 ? 5 : 0;
      vf.push_back(time_ms(fwd, warm));
      vb.push_back(time_ms(bwd, warm));
      vfb.push_back(time_ms(fwdbwd, warm));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double tf = median(vf), tb = median(vb), tfb = median(vfb);
    std::printf(
        "RESULT sf_attn path=%s B=%d T=%d H=%d KVH=%d hd=%d pack=%d window=%d fwd_ms=%.3f bwd_ms=%.3f fwdbwd_ms=%.3f\n",
        path.c_str(), d.B, d.T, d.n_head, d.n_kv_head, d.head_dim, pack, d.window, tf, tb, tfb);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
