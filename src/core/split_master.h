// An fp32 master weight stored split (docs/ENGINE.md "Split masters"): its bf16 rounding to
// nearest even (`hi`: what the GPU's cast gives, so the uploads read it as it is), the low 16 bits
// of its fp32 pattern (`lo`), and a tie bit. 4 bytes a parameter (+ 1/8) where the fp32 master
// beside a bf16 upload copy took 6, and every fp32 pattern comes back exactly:
// - lo < 0x8000: the rounding went down, the pattern is hi:lo;
// - lo > 0x8000: it went up, the pattern is (hi - 1):lo;
// - lo == 0x8000, a tie: nearest-even went up exactly when the truncated high half was odd, and
//   both cases leave an even hi, so hi and lo alone do not say which; the tie bit does (1: it went
//   up). It is written only when the new lo is 0x8000 and read only then (a stale bit under any
//   other lo is never read), so the bitmap costs no memory traffic outside ties (~1 in 65,536).
// NaN: hi is the quiet NaN float_to_bf16 gives, and what comes back is a NaN (not the same
// payload); infinities are exact.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace sf {

struct SplitMaster {
  uint16_t* hi = nullptr;   // [n] bf16 bits (the upload source)
  uint16_t* lo = nullptr;   // [n] the low half of the fp32 pattern
  uint8_t* ties = nullptr;  // bitmap of the blob: element i's bit is tie_first + i
  int64_t tie_first = 0;

  // Elements [off, ...) of this one.
  SplitMaster at(int64_t off) const { return {hi + off, lo + off, ties, tie_first + off}; }
};

// Whether element i's rounding went up, given its lo. Ties read their bit.
inline uint32_t split_rounded_up(const SplitMaster& s, int64_t i, uint32_t lo) {
  if (lo != 0x8000u) return lo > 0x8000u ? 1u : 0u;
  const uint64_t t = uint64_t(s.tie_first + i);
  return (__atomic_load_n(s.ties + (t >> 3), __ATOMIC_RELAXED) >> (t & 7)) & 1u;
}

inline float split_join(const SplitMaster& s, int64_t i) {
  const uint32_t lo = s.lo[i];
  const uint32_t u = ((uint32_t(s.hi[i]) - split_rounded_up(s, i, lo)) << 16) | lo;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The tie bit of element i (lo == 0x8000): whether the rounding of pattern u went up. Threads
// updating neighbouring elements share the byte, hence the atomic (ties are rare: no contention).
inline void split_set_tie(const SplitMaster& s, int64_t i, uint32_t u) {
  const uint64_t t = uint64_t(s.tie_first + i);
  const uint8_t bit = uint8_t(1u << (t & 7));
  if ((u >> 16) & 1u) {
    __atomic_fetch_or(s.ties + (t >> 3), bit, __ATOMIC_RELAXED);
  } else {
    __atomic_fetch_and(s.ties + (t >> 3), uint8_t(~bit), __ATOMIC_RELAXED);
  }
}

inline void split_store(const SplitMaster& s, int64_t i, float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  s.hi[i] = float_to_bf16(x).bits;
  s.lo[i] = uint16_t(u);
  if (uint16_t(u) == 0x8000u) split_set_tie(s, i, u);
}

// Whether an upload copy in dtype `work` makes its master split (HostOptimizer; the planner
// counts it so): a bf16 copy is the master's nearest-even high half; fp16 / fp32 ones are not.
inline bool upload_copy_splits(DType work) { return work == DType::BF16; }

// Bytes of the tie bitmap of n elements.
inline uint64_t split_tie_bytes(int64_t n) { return (uint64_t(n) + 7) / 8; }

}  // namespace sf
