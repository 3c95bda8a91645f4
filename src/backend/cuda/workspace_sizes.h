// The cuda backend's device-memory sizes as plain host code (no CUDA headers), so that every build,
// CUDA or not, can plan for a GPU: `plan --hardware` on a machine without one (backend/device.h
// cuda_backend_sizes). The kernels size their buffers with the same functions.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend/ops.h"
#include "core/align.h"

namespace sf::cuda {

// Bytes of arena each stream takes the first time it runs a kernel that needs scratch
// (cuBLASLt workspace + reduction partials). Copy-only streams take none.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr size_t kKernelScratchBytes = size_t(32) << 20;

// Attention backward: fp32 dQ accumulator [B*T, n_head*hd] + D [B, n_head, T], each 256-byte aligned.
inline size_t attention_workspace_bytes(const AttnDims& d) {
  const size_t rows = size_t(d.B) * size_t(d.T);
  return round256(rows * size_t(d.n_head) * size_t(d.head_dim) * 4) + round256(rows * size_t(d.n_head) * 4);
}

// Fused linear cross-entropy, tokens per chunk: all N when N*V*4 <= 32 MiB; otherwise as many as fit
// in max(32 MiB, N*V*2/8 - kLtWorkspaceBytes) bytes of F32 logits (1/8 of the BF16 N x V logits less
// the cuBLASLt workspace, so that both stay within 1/8 of the logits), a multiple of 128 when that
// is at least 128.
inline int64_t linear_ce_chunk_rows(int64_t N, int64_t V) {
  if (N <= 0 || V <= 0) return 1;
  const int64_t row_bytes = V * 4;
  const int64_t small = int64_t(32) << 20;
  if (N * row_bytes <= small) return N;
  const int64_t budget = std::max<int64_t>(small, N * V * 2 / 8 - int64_t(kLtWorkspaceBytes));
  int64_t nc = budget / row_bytes;
  if (nc >= N) return N;
  if (nc >= 128) nc = nc / 128 * 128;
  return std::max<int64_t>(nc, 1);
}

// Its workspace: the chunk's F32 logits.
inline size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) {
  (void)H;
  return round256(size_t(linear_ce_chunk_rows(N, V)) * size_t(V) * 4);
}

}  // namespace sf::cuda
