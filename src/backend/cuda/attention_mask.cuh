// The attention mask's lower bound, shared by both kernel families (attention.cu, attention_sm90.cu).
#pragma once
#include <cstdint>

namespace sf::cuda {

// First key that query `row` may see, given its record's start lo (packed rows; else 0): lo and,
// with a sliding window, row - window + 1.
__device__ __forceinline__ int window_key(int lo, int window, int row) {
  return window > 0 ? max(lo, row - window + 1) : lo;
}
// First key that query `row` of a sequence may see: its record's start (packed rows, pb = that
// sequence's pos, or null) and, with a sliding window, row - window + 1. Never decreases with row.
__device__ __forceinline__ int first_key(const int32_t* pb, int window, int row) {
  return window_key(pb != nullptr ? row - pb[row] : 0, window, row);
}

// The first tile i in [lo, hi) whose first row's first key is past key `last` (tiles of `rows`
// rows; every probed row i * rows < hi * rows must be a row of the sequence), else hi. Called by
// all 32 lanes of a warp with the same arguments; every lane returns the answer. Each lane probes
// one of 32 evenly spaced tiles a round (ordinary loads), so a round costs one load's latency and
// narrows the range 32-fold (one round up to 32 tiles, two up to 1024), where a bisection pays
// one dependent load per halving. Relies on first keys never decreasing along a row.
__device__ __forceinline__ int first_tile_past(const int32_t* pb, int window, int rows, int last, int lo, int hi) {
  const int lane = int(threadIdx.x) % 32;
  while (lo < hi) {
    const int stride = (hi - lo + 31) / 32, p = lo + lane * stride;
    // a probe at or past hi counts as past `last` (and reads nothing): the answer is hi at the latest
    const unsigned past = __ballot_sync(0xffffffffu, p >= hi || first_key(pb, window, p * rows) > last);
    if (past == 0) {  // all 32 probes before it: the answer lies after the last one
      lo += 31 * stride + 1;
      continue;
    }
    const int k = __ffs(int(past)) - 1;  // the first probe past `last`
    if (k == 0) return lo;
    hi = min(hi, lo + k * stride);  // probe k is past (or at hi)
    lo += (k - 1) * stride + 1;     // probe k - 1 is not
  }
  return hi;
}

}  // namespace sf::cuda
