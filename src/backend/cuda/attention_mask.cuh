// The attention mask's lower bound, shared by both kernel families (attention.cu, attention_sm90.cu).
#pragma once
#include <cstdint>

namespace sf::cuda {

// First key that query `row` of a sequence may see: its record's start (packed rows, pb = that
// sequence's pos, or null) and, with a sliding window, row - window + 1. Never decreases with row.
__device__ __forceinline__ int first_key(const int32_t* pb, int window, int row) {
  const int lo = pb != nullptr ? row - pb[row] : 0;
  return window > 0 ? max(lo, row - window + 1) : lo;
}

}  // namespace sf::cuda
