// Element types of stored tensors, and bf16 <-> fp32 conversion.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace sf {

enum class DType : uint8_t { F32, BF16, F16, I32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType t);  // "F32", "BF16", "F16", "I32" (safetensors spelling)

// bf16 is stored as the high 16 bits of an IEEE fp32.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even (what PyTorch's .to(bfloat16) does); NaN stays NaN.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// IEEE half -> float (only read: F16 checkpoints are converted on load).
float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

}  // namespace sf
