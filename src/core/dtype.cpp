#include "core/dtype.h"

#include <cmath>

namespace sf {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
  }
  return "?";
}

float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      float f = std::ldexp(float(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.f) return sign | 0x7c00;
  if (a < 6.103515625e-05f) {  // subnormal half
    int m = int(std::nearbyint(a * 16777216.f));
    return sign | uint16_t(m);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  int mant = int(std::nearbyint((m * 2.f - 1.f) * 1024.f));
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    exp++;
  }
  if (exp >= 31) return sign | 0x7c00;
  return sign | uint16_t(exp << 10) | uint16_t(mant);
}

}  // namespace sf
