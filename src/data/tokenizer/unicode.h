// Code points for the tokenizer: UTF-8 decoding and the Unicode classes its pre-tokenizers test.
// Letters, numbers and marks are those of Oniguruma (Unicode 16.0), the regex engine of Hugging
// Face tokenizers; see src/data/tokenizer/unicode_tables.inc and tools/gen_unicode_tables.py.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sf::uni {

enum : uint16_t {
  kL = 1,      // \p{L}
  kN = 2,      // \p{N}
  kSpace = 4,  // \s (White_Space)
  kLu = 8,
  kLl = 16,
  kLt = 32,
  kLm = 64,
  kLo = 128,
  kM = 256,
  kP = 512,      // punctuation (general category P)
  kLate = 1024,  // assigned after Unicode 9.0 and normalization-relevant (see normalizer.cpp)
  kWord = 2048   // \w (Whitespace pre-tokenizer)
};

// The classes of ASCII code points (the same as classes() gives; a constant table, inline).
extern const std::array<uint16_t, 128> kAsciiClasses;
uint16_t classes_non_ascii(uint32_t cp);
inline uint16_t classes(uint32_t cp) { return cp < 128 ? kAsciiClasses[cp] : classes_non_ascii(cp); }
inline bool is_letter(uint32_t cp) { return classes(cp) & kL; }
inline bool is_number(uint32_t cp) { return classes(cp) & kN; }
inline bool is_space(uint32_t cp) { return classes(cp) & kSpace; }
// Bytes of the UTF-8 character starting at s[i] by its lead byte (an invalid lead byte: 1; never
// past the end).
inline size_t utf8_length(std::string_view s, size_t i) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  return len < s.size() - i ? len : s.size() - i;
}

// Code points of UTF-8 text with the byte offset of each (and one past the end). An invalid byte
// stands for itself as U+DC80..U+DCFF (a lone surrogate: no class), as Python's surrogateescape.
void decode_utf8(std::string_view s, std::vector<uint32_t>& cps, std::vector<size_t>& off);
// Whether s is valid UTF-8 (no surrogates, no overlong forms).
bool valid_utf8(const std::string& s);
void append_utf8(std::string& out, uint32_t cp);

}  // namespace sf::uni
