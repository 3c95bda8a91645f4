#include "engine/blob_init.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"

namespace sf {

namespace {
// Norm weights (a module named *norm*: also Gemma 4's post_feedforward_layernorm_1), and Gemma 4's
// router scales (ones in transformers' init, as its norms).
bool is_norm_entry(const BlobEntry& e) {
  auto ends = [&](const std::string& x) {
    return e.name.size() >= x.size() && e.name.compare(e.name.size() - x.size(), x.size(), x) == 0;
  };
  if (ends("router.scale") || ends("router.per_expert_scale")) return true;
  if (!ends(".weight")) return false;
  const std::string module = e.name.substr(0, e.name.size() - 7);
  const size_t dot = module.rfind('.');
  return module.find("norm", dot == std::string::npos ? 0 : dot + 1) != std::string::npos;
}
bool is_bias_entry(const BlobEntry& e) {
  return e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bias") == 0;
}

// Elements [w0, w1) of a blob into dst [w1 - w0] (dst[0] is element w0).
struct Window {
  int64_t w0, w1;
  float* dst;
  // dst over [lo, hi) clipped to the window
  void fill(int64_t lo, int64_t hi, float v) const {
    lo = std::max(lo, w0), hi = std::min(hi, w1);
    if (lo < hi) std::fill(dst + (lo - w0), dst + (hi - w0), v);
  }
};

// The window's 0 between and after the entries (their alignment padding), and value on each entry
// ei for which fill(ei, value) returns true (the entries nothing else writes). Touches only those
// elements: a whole-blob fill first was a serial pass over every byte (a MoE layer: 1.7 GB).
template <class Fill>
void fill_around(const BlobLayout& blob, const Window& w, Fill fill) {
  std::vector<size_t> order(blob.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return blob.entries[x].offset < blob.entries[y].offset; });
  int64_t end = 0;  // first element after the entries seen so far
  for (size_t ei : order) {
    const BlobEntry& e = blob.entries[ei];
    if (e.offset > end) w.fill(end, e.offset, 0.f);
    end = std::max(end, e.offset + e.numel);
    float value = 0.f;
    if (fill(ei, value)) w.fill(e.offset, e.offset + e.numel, value);
  }
  if (blob.numel > end) w.fill(end, blob.numel, 0.f);
}

void check_window(const BlobLayout& blob, int64_t w0, int64_t w1) {
  SF_CHECK(0 <= w0 && w0 <= w1 && w1 <= blob.numel, "blob window [" + std::to_string(w0) + ", " + std::to_string(w1) +
                                                        ") outside the blob's " + std::to_string(blob.numel) +
                                                        " elements");
}
}  // namespace

void read_blob(const CheckpointReader& ckpt, const BlobLayout& blob, float* host) {
  read_blob_window(ckpt, blob, 0, blob.numel, host);
}

void read_blob_window(const CheckpointReader& ckpt, const BlobLayout& blob, int64_t w0, int64_t w1, float* dst) {
  check_window(blob, w0, w1);
  const Window w{w0, w1, dst};
  // Every entry a stored tensor (or a slice of one) covers is read (its part in the window); the
  // rest is 0.
  std::vector<char> read(blob.entries.size(), 0);  // [entries]
  for (const StoredTensor& t : blob.stored)
    for (const StoredPart& part : t.parts) read[size_t(part.entry)] = 1;
  fill_around(blob, w, [&](size_t ei, float& value) {
    value = 0.f;
    return !read[ei];
  });
  // As the checkpoint stores them: a tensor an entry, or fused experts read slice by slice.
  for (const StoredTensor& t : blob.stored)
    for (const StoredPart& part : t.parts) {
      const BlobEntry& e = blob.entries[size_t(part.entry)];
      const int64_t lo = std::max(e.offset, w0), hi = std::min(e.offset + e.numel, w1);
      if (lo < hi) ckpt.read_f32(t.name, t.shape, part.offset + (lo - e.offset), hi - lo, dst + (lo - w0));
    }
}

void random_blob(const BlobLayout& blob, int blob_index, uint64_t seed, double std, float* host) {
  random_blob_window(blob, blob_index, seed, std, 0, blob.numel, host);
}

void random_blob_window(const BlobLayout& blob, int blob_index, uint64_t seed, double std, int64_t w0, int64_t w1,
                        float* dst) {
  check_window(blob, w0, w1);
  const Window w{w0, w1, dst};
  // Box-Muller on our own uniform draws: the same numbers on every platform and library. Each
  // chunk of 2^20 values of a tensor has its own generator (seeded by blob, entry and chunk), so
  // the result does not depend on the thread count or the order the chunks run in. The chunks of
  // all the blob's tensors form one list that the pool's threads take from: a MoE layer has
  // hundreds of expert matrices of 1-2 chunks each, which a loop over tensors (a parallel_for per
  // tensor) ran on 2 threads at a time (issue 18: OLMoE's set-up took minutes on 16 cores).
  constexpr int64_t kChunk = int64_t(1) << 20;
  const uint64_t b = uint64_t(blob_index);
  // Everything no draw writes: the padding between entries (0), norms and biases.
  fill_around(blob, w, [&](size_t ei, float& value) {
    const BlobEntry& e = blob.entries[ei];
    value = is_norm_entry(e) ? blob.norm_init : 0.f;
    return is_norm_entry(e) || is_bias_entry(e);
  });
  struct Piece {
    uint32_t entry;
    int64_t chunk;
  };
  std::vector<Piece> pieces;  // [chunks of every drawn tensor that meet the window]
  for (size_t ei = 0; ei < blob.entries.size(); ++ei) {
    const BlobEntry& e = blob.entries[ei];
    if (is_norm_entry(e) || is_bias_entry(e)) continue;
    for (int64_t c = 0; c * kChunk < e.numel; ++c) {
      const int64_t lo = e.offset + c * kChunk, hi = e.offset + std::min(e.numel, (c + 1) * kChunk);
      if (lo < w1 && hi > w0) pieces.push_back({uint32_t(ei), c});
    }
  }
  cpu_pool().parallel_pieces(
      int64_t(pieces.size()),
      [&](int64_t p0, int64_t p1) {
        for (int64_t pi = p0; pi < p1; ++pi) {
          const uint64_t ei = pieces[size_t(pi)].entry;
          const int64_t c = pieces[size_t(pi)].chunk;
          const BlobEntry& e = blob.entries[ei];
          std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * (b + 1)) ^ (0xC2B2AE3D27D4EB4Full * (ei + 1)) ^
                              (0x165667B19E3779F9ull * uint64_t(c + 1)));
          auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
          // the chunk is drawn from its start (its generator's sequence), kept where in the window
          const int64_t i1 = std::min(e.numel, (c + 1) * kChunk);
          const int64_t keep0 = std::max(c * kChunk, w0 - e.offset), keep1 = std::min(i1, w1 - e.offset);
          for (int64_t i = c * kChunk; i < keep1; ++i) {
            double u1 = uniform(), u2 = uniform();
            if (i >= keep0)
              dst[e.offset + i - w0] = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
          }
        }
      },
      1);
}

}  // namespace sf
