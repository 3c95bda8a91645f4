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
// rows), else hi: a whole warp, each lane probing one of 32 evenly spaced tiles a round, so a
// round costs one load's latency and narrows the range 32-fold (one round up to 32 tiles, two up
// to 1024), where a bisection pays one dependent load per halving. Every lane returns it.
__device__ __forceinline__ int first_tile_past(const int32_t* pb, int window, int rows, int last, int lo, int hi) {
  const int lane = int(threadIdx.x) % 32;
  while (lo < hi) {
    const int stride = (hi - lo + 31) / 32, p = lo + lane * stride;
    // probes past hi count as past `last`: the answer is then hi at the latest
    const unsigned past = __ballot_sync(0xffffffffu, p >= hi || first_key(pb, window, p * rows) > last);
    const int k = __ffs(past) - 1;  // the first probe past `last` (-1: none, all were before it)
    if (k == 0) return lo;
    const int prev = lo + (k < 0 ? 31 : k - 1) * stride;  // the last probe before `last`
    hi = k < 0 ? hi : min(hi, lo + k * stride);
    lo = prev + 1;
  }
  return hi;
}

}  // namespace sf::cuda
