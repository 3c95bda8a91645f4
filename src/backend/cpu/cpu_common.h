// Private helpers of the cpu kernels: conversion between F32/BF16 storage and fp32 math, per-thread
// scratch buffers, and the one sgemm entry point. The kernels get their arguments checked by the
// front of the kernel table (backend/ops_check.h); they check only values in memory (token ids,
// labels, positions) and their own limits.
//
// Determinism: every kernel gives the same bits whatever cpu_pool's size, because each output
// element (and each reduction) is computed by one thread in a fixed order. The engine's
// "bitwise on the cpu backend" checks rely on this. (OpenBLAS itself may round differently
// under another OPENBLAS_NUM_THREADS: compare runs within one process or with that fixed.)
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace sf::cpu::detail {

inline float bf16_bits_to_float(uint16_t b) { return bf16_to_float(bf16{b}); }

// float_to_bf16 (nearest-even, NaN kept quiet) without branches, so that loops vectorise.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Element i of a F32/BF16 tensor as fp32, and the store back (bf16: nearest-even).
inline float get(const Tensor& t, int64_t i) {
  return t.dtype == DType::F32 ? t.ptr<float>()[i] : bf16_bits_to_float(t.ptr<uint16_t>()[i]);
}
inline void set(const Tensor& t, int64_t i, float v) {
  if (t.dtype == DType::F32) {
    t.ptr<float>()[i] = v;
  } else {
    t.ptr<uint16_t>()[i] = bf16_bits(v);
  }
}

// Typed element access for kernels templated on the storage type (float or bf16).
inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const bf16* p, int64_t i) { return bf16_bits_to_float(p[i].bits); }
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(bf16* p, int64_t i, float v) { p[i].bits = bf16_bits(v); }

// Calls f(float*) or f(bf16*) with the data of a F32/BF16 tensor.
template <class F>
inline void visit(const Tensor& t, F&& f) {
  if (t.dtype == DType::F32) {
    f(t.ptr<float>());
  } else {
    f(t.ptr<bf16>());
  }
}

// visit over several tensors at once: f(p0, p1, ...) with the typed data of each (one instantiation
// per dtype mix, as nested visits would give).
template <class F>
inline void visit_all(F&& f) {
  f();
}
template <class F, class... Ts>
inline void visit_all(F&& f, const Tensor& t, const Ts&... rest) {
  visit(t, [&](auto* p) { visit_all([&](auto*... ps) { f(p, ps...); }, rest...); });
}

// dst[0, n) = t[off, off + n) as fp32.
inline void load(const Tensor& t, int64_t off, int64_t n, float* dst) {
  if (t.dtype == DType::F32) {
    std::memcpy(dst, t.ptr<float>() + off, size_t(n) * 4);
  } else {
    const uint16_t* s = t.ptr<uint16_t>() + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(s[i]);
  }
}
// t[off, off + n) = src[0, n), rounded to the storage dtype.
inline void store(const Tensor& t, int64_t off, int64_t n, const float* src) {
  if (t.dtype == DType::F32) {
    std::memcpy(t.ptr<float>() + off, src, size_t(n) * 4);
  } else {
    uint16_t* d = t.ptr<uint16_t>() + off;
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits(src[i]);
  }
}

// A growable per-thread fp32 buffer. `slot` (0..kScratchSlots-1) tells apart buffers that are
// live at the same time within one kernel. Contents are garbage on return. It keeps its peak
// size for the thread's lifetime: fine for the reference backend, and no allocation once warm.
constexpr int kScratchSlots = 6;
inline float* scratch(int slot, size_t n) {
  struct Buf {
    std::unique_ptr<float[]> p;
    size_t n = 0;
  };
  thread_local Buf bufs[kScratchSlots];
  Buf& b = bufs[slot];
  if (b.n < n) {
    b.p.reset(new float[n]);
    b.n = n;
  }
  return b.p.get();
}

// fp32 view of a whole F32/BF16 tensor: the tensor itself when F32, else a converted copy in
// scratch `slot`.
inline const float* as_f32(const Tensor& t, int slot) {
  if (t.dtype == DType::F32) return t.ptr<float>();
  float* buf = scratch(slot, size_t(t.numel()));
  load(t, 0, t.numel(), buf);
  return buf;
}

// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C on fp32 memory (OpenBLAS), with lda/ldb/ldc
// the row strides. beta == 0 ignores what C holds (NaN included). Call from the caller thread
// only, never inside a cpu_pool task (OpenBLAS runs its own threads).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace sf::cpu::detail
