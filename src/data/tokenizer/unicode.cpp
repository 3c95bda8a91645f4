#include "data/tokenizer/unicode.h"

#include <array>
#include <memory>

namespace sf::uni {
namespace {

struct CodeRange {
  uint32_t lo, hi;
};
#include "data/tokenizer/unicode_tables.inc"

// Classes of planes 0-2 in one table (almost every code point of real text); the rest by search.
constexpr uint32_t kTableEnd = 0x30000;

template <size_t N>
constexpr bool in_ranges(const CodeRange (&r)[N], uint32_t cp) {
  size_t a = 0, b = N;
  while (a < b) {
    const size_t m = (a + b) / 2;
    if (cp < r[m].lo)
      b = m;
    else if (cp > r[m].hi)
      a = m + 1;
    else
      return true;
  }
  return false;
}

constexpr uint16_t compute(uint32_t cp) {
  uint16_t c = 0;
  if (in_ranges(kLRanges, cp)) c |= kL;
  if (in_ranges(kNRanges, cp)) c |= kN;
  if ((cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    c |= kSpace;
  if (in_ranges(kLuRanges, cp)) c |= kLu;
  if (in_ranges(kLlRanges, cp)) c |= kLl;
  if (in_ranges(kLtRanges, cp)) c |= kLt;
  if (in_ranges(kLmRanges, cp)) c |= kLm;
  if (in_ranges(kLoRanges, cp)) c |= kLo;
  if (in_ranges(kMRanges, cp)) c |= kM;
  if (in_ranges(kPunctRanges, cp)) c |= kP;
  if (in_ranges(kLateNormRanges, cp)) c |= kLate;
  if (in_ranges(kWordRanges, cp)) c |= kWord;
  return c;
}

const uint16_t* table() {
  static const std::unique_ptr<uint16_t[]> t = [] {
    std::unique_ptr<uint16_t[]> v(new uint16_t[kTableEnd]);
    for (uint32_t cp = 0; cp < kTableEnd; ++cp) v[cp] = compute(cp);
    return v;
  }();
  return t.get();
}

constexpr std::array<uint16_t, 128> ascii_table() {
  std::array<uint16_t, 128> t{};
  for (uint32_t cp = 0; cp < 128; ++cp) t[cp] = compute(cp);
  return t;
}

}  // namespace

constinit const std::array<uint16_t, 128> kAsciiClasses = ascii_table();

uint16_t classes_non_ascii(uint32_t cp) {
  static const uint16_t* t = table();
  return cp < kTableEnd ? t[cp] : compute(cp);
}

void decode_utf8(std::string_view s, std::vector<uint32_t>& cps, std::vector<size_t>& off) {
  cps.clear();
  off.clear();
  cps.reserve(s.size());
  off.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {  // ASCII fast path
      off.push_back(i);
      cps.push_back(c);
      ++i;
      continue;
    }
    int len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    bool ok = len > 0 && i + size_t(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      ok = (d >> 6) == 2;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (ok) {
      const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
      ok = cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (!ok) {
      len = 1;
      cp = 0xDC00 + c;
    }
    off.push_back(i);
    cps.push_back(cp);
    i += size_t(len);
  }
  off.push_back(s.size());
}

bool valid_utf8(const std::string& s) {
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  decode_utf8(s, cps, off);
  for (size_t k = 0; k < cps.size(); ++k)
    if (cps[k] >= 0xDC80 && cps[k] <= 0xDCFF && off[k + 1] - off[k] == 1) return false;
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace sf::uni
