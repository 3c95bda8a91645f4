// int64 arithmetic for sizes computed from user input (config.json dimensions, tensor shapes):
// an overflow is the input's fault, so it is an InputError (exit 2) naming `where` and `what`,
// never a wrapped-around size that later allocates too little or passes a check it should fail.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace sf {

inline int64_t checked_mul(int64_t a, int64_t b, const std::string& where, const std::string& what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    input_error(where, what + ": " + std::to_string(a) + " * " + std::to_string(b) + " overflows a 64-bit size");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const std::string& where, const std::string& what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    input_error(where, what + ": " + std::to_string(a) + " + " + std::to_string(b) + " overflows a 64-bit size");
  return r;
}

// The product of all factors (e.g. a shape's element count).
inline int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& where,
                               const std::string& what) {
  int64_t r = 1;
  for (int64_t f : factors) r = checked_mul(r, f, where, what);
  return r;
}

}  // namespace sf
