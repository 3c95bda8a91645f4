// Unbiased stochastic rounding of fp32 to bf16, driven by a counter-based random stream.
//
// Why: AdamW's v moves by (1 - b2)(g^2 - v) a step; once that is under half a bf16 ulp of v,
// round-to-nearest writes the old v back every step and v stops moving (m likewise with 1 - b1).
// Rounding up with probability (the dropped low 16 bits) / 2^16 makes the stored value's
// expectation the fp32 value, so small updates survive on average.
//
// The stream is a pure function of (key, element index): no state, no order. Every engine, every
// chunking and the CUDA kernel (this header is host and device code) draw the same bits for the
// same element, so a run is reproducible for a seed and the engines agree byte for byte.
// - round_key(seed, step, blob): one 64-bit key per AdamW step and blob (a model-layout index);
// - round_bits(k, index): 32 random bits for element `index` of that blob: the low 16 round m,
//   the high 16 round v (one hash, two independent 16-bit draws).
// The per-element hash is one round of a 32-bit xorshift-multiply mixer (a bijection of 32 bits
// with full avalanche; the multipliers are the low-bias pair found by C. Wellons' "hash prospector"
// search) between two 32-bit keys: mix32(index ^ k0) ^ k1. Every (seed, step, blob) gets fresh keys
// from the 64-bit finaliser, so an element's draws over the steps are unrelated; the elements of one
// step are the mixer's outputs for distinct inputs. (A second round cost the AVX2 pass 0.2 ns an
// element more, in cache, for no measurable change of the statistics tested.) 64-bit indices fold
// their high half into k1 (blobs rarely pass 2^32 elements, but nothing breaks when they do).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SF_HD __host__ __device__ __forceinline__
#else
#define SF_HD inline
#endif

namespace sf {

// 64-bit finaliser (the splitmix64 output function): a bijection with full avalanche.
SF_HD uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The key of one AdamW step (1-based) of one blob, from the run's seed. Each input goes through
// the mixer before the next is added, so nearby seeds, steps and blobs give unrelated keys.
SF_HD uint64_t round_key(uint64_t seed, int64_t step, int64_t blob) {
  constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  uint64_t z = mix64(seed + kGolden);
  z = mix64(z ^ (uint64_t(step) * kGolden));
  return mix64(z + uint64_t(blob) * 0xd1b54a32d192ed03ull);
}

SF_HD uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}

// The two 32-bit keys of the elements [hi * 2^32, (hi + 1) * 2^32) of a blob.
struct RoundKeys {
  uint32_t k0, k1;
};
SF_HD RoundKeys round_keys(uint64_t key, uint64_t hi) {
  return {uint32_t(key), uint32_t(key >> 32) ^ (hi != 0 ? uint32_t(mix64(hi)) : 0u)};
}
// 32 random bits of element lo (the low 32 bits of its index) under keys k. (The SIMD loops of
// backend/cpu/adamw_simd.inc repeat these operations lane-wise.)
SF_HD uint32_t round_bits(RoundKeys k, uint32_t lo) { return mix32(lo ^ k.k0) ^ k.k1; }
SF_HD uint32_t round_bits(uint64_t key, uint64_t index) {
  return round_bits(round_keys(key, index >> 32), uint32_t(index));
}

// fp32 bits u -> bf16 bits, rounded up (in magnitude) with probability low16(u) / 2^16 given r,
// 16 uniform bits in r's low half; exact values stay exact; NaN stays a (quiet) NaN; +-inf stay.
SF_HD uint16_t bf16_bits_stochastic(uint32_t u, uint32_t r) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + (r & 0xffffu)) >> 16);
}

SF_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

}  // namespace sf
