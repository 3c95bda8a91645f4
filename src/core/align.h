// Buffer sizes and offsets rounded up to 256 bytes: every device buffer and blob entry starts on a
// 256-byte boundary (coalesced, vector-aligned access in every kernel).
#pragma once
#include <cstddef>

namespace sf {

inline constexpr size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace sf
