#include "engine/blob_init.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/thread_pool.h"
#include "io/checkpoint.h"

namespace sf {

void read_blob(const CheckpointReader& ckpt, const BlobLayout& blob, float* host) {
  std::fill(host, host + blob.numel, 0.f);
  // As the checkpoint stores them: a tensor an entry, or fused experts read slice by slice.
  for (const StoredTensor& t : blob.stored)
    for (const StoredPart& part : t.parts) {
      const BlobEntry& e = blob.entries[size_t(part.entry)];
      ckpt.read_f32(t.name, t.shape, part.offset, e.numel, host + e.offset);
    }
}

void random_blob(const BlobLayout& blob, int blob_index, uint64_t seed, double std, float* host) {
  // Box-Muller on our own uniform draws: the same numbers on every platform and library. Each
  // chunk of 2^20 values of a tensor has its own generator, so chunks fill in parallel and the
  // result does not depend on the thread count.
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::fill(host, host + blob.numel, 0.f);
  const uint64_t b = uint64_t(blob_index);
  for (size_t ei = 0; ei < blob.entries.size(); ++ei) {
    const BlobEntry& e = blob.entries[ei];
    float* p = host + e.offset;
    bool is_norm = e.name.find("norm.weight") != std::string::npos;
    bool is_bias = e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
    if (is_norm || is_bias) {
      std::fill(p, p + e.numel, is_norm ? blob.norm_init : 0.f);
      continue;
    }
    const int64_t chunks = (e.numel + kChunk - 1) / kChunk;
    cpu_pool().parallel_for(chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (b + 1)) ^ (0xC2B2AE3D27D4EB4Full * (ei + 1)) ^
                            (0x165667B19E3779F9ull * uint64_t(c + 1)));
        auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
        for (int64_t i = c * kChunk; i < std::min(e.numel, (c + 1) * kChunk); ++i) {
          double u1 = uniform(), u2 = uniform();
          p[i] = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
        }
      }
    });
  }
}

}  // namespace sf
