#include "data/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "data/tokenizer/unicode.h"

namespace sf {
namespace {

// Lowercase mappings added in Unicode 16 (HF's Lowercase is Rust's char::to_lowercase, Unicode 16
// in tokenizers 0.23's toolchain; utf8proc 2.8 has Unicode 15): 0 when cp is not one of them.
uint32_t unicode16_lowercase(uint32_t cp) {
  if (cp == 0x1C89) return 0x1C8A;                       // Cyrillic TJE
  if (cp >= 0x10D50 && cp <= 0x10D65) return cp + 0x20;  // Garay
  switch (cp) {
    case 0xA7CB:
      return 0x0264;
    case 0xA7CC:
      return 0xA7CD;
    case 0xA7DA:
      return 0xA7DB;
    case 0xA7DC:
      return 0x019B;
    default:
      return 0;
  }
}

int utf8proc_options(const char* form) {
  const int base = UTF8PROC_STABLE;
  if (!std::strcmp(form, "NFC")) return base | UTF8PROC_COMPOSE;
  if (!std::strcmp(form, "NFD")) return base | UTF8PROC_DECOMPOSE;
  if (!std::strcmp(form, "NFKC")) return base | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  return base | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
}

bool normalize_run(const char* p, size_t n, int options, std::string& out) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t r =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(p), utf8proc_ssize_t(n), &dst, utf8proc_option_t(options));
  if (r < 0) return false;
  out.append(reinterpret_cast<const char*>(dst), size_t(r));
  std::free(dst);
  return true;
}

// Literal regex: no metacharacter (a Replace "Regex" pattern is then its own text).
bool literal_regex(const std::string& p) { return p.find_first_of("\\^$.|?*+()[]{}") == std::string::npos; }

// Whether NFC leaves valid UTF-8 text as it is because each of its characters is below U+0300 (no
// combining mark; each such character is its own composition), a CJK unified ideograph of
// U+4E00..U+9FFF or a Hangul syllable (neither decomposed by NFC nor composed with a neighbor here:
// the Hangul jamo that would follow a syllable are not in these ranges). Any other character: false.
bool nfc_inert(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
    } else if (b >= 0xC2 && b <= 0xCB) {  // U+0080..U+02FF
      if (i + 1 >= n || (p[i + 1] >> 6) != 2) return false;
      i += 2;
    } else if ((b >> 4) == 14) {
      if (i + 2 >= n || (p[i + 1] >> 6) != 2 || (p[i + 2] >> 6) != 2) return false;
      const uint32_t cp = ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
      if (!((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3))) return false;
      i += 3;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string unicode_normalize(const std::string& s, const char* form) {
  bool ascii = true;
  for (unsigned char ch : s) ascii &= ch < 0x80;
  if (ascii) return s;  // every form leaves ASCII as it is
  if (!std::strcmp(form, "NFC") && nfc_inert(s)) return s;
  const int options = utf8proc_options(form);
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  uni::decode_utf8(s, cps, off);
  // tokenizers' tables are Unicode 9.0: a character assigned later is an inert starter there, so
  // the runs between such characters are normalized apart and those characters are kept.
  std::string out;
  out.reserve(s.size() + 8);
  size_t run = 0;
  auto flush = [&](size_t end) {
    if (end > run && !normalize_run(s.data() + off[run], off[end] - off[run], options, out))
      out.append(s, off[run], off[end] - off[run]);
  };
  for (size_t k = 0; k < cps.size(); ++k) {
    if (uni::classes(cps[k]) & uni::kLate) {
      flush(k);
      out.append(s, off[k], off[k + 1] - off[k]);
      run = k + 1;
    }
  }
  flush(cps.size());
  return out;
}

Normalizer Normalizer::from_json(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path) {
  Normalizer n;
  n.file_ = c.file;
  if (!j.is_null()) n.add(c, j, path, 0);
  return n;
}

void Normalizer::add(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path, int depth) {
  if (depth > 16) c.fail(path, "normalizer sequences nested too deep");
  const std::string type = c.type(j, path);
  if (type == "Sequence") {
    c.each(j, path, "normalizers",
           [&](const nlohmann::json& item, const std::string& ip) { add(c, item, ip, depth + 1); });
    return;
  }
  // The steps without options.
  static const std::pair<const char*, Kind> kPlain[] = {{"NFC", Kind::NFC},
                                                        {"NFD", Kind::NFD},
                                                        {"NFKC", Kind::NFKC},
                                                        {"NFKD", Kind::NFKD},
                                                        {"Lowercase", Kind::Lowercase}};
  Step s;
  s.kind = Kind::NFC;
  const auto plain = std::find_if(std::begin(kPlain), std::end(kPlain), [&](const auto& k) { return type == k.first; });
  if (plain != std::end(kPlain)) {
    s.kind = plain->second;
  } else if (type == "Strip") {
    s.kind = Kind::Strip;
    s.left = c.boolean(c.at(j, path, "strip_left"), path + ".strip_left");
    s.right = c.boolean(c.at(j, path, "strip_right"), path + ".strip_right");
  } else if (type == "Prepend") {
    s.kind = Kind::Prepend;
    s.content = c.str(c.at(j, path, "prepend"), path + ".prepend");
  } else if (type == "Replace") {
    s.kind = Kind::Replace;
    const auto& p = c.obj(c.at(j, path, "pattern"), path + ".pattern");
    if (const auto* str = c.opt(p, path + ".pattern", "String")) {
      s.pattern = c.str(*str, path + ".pattern.String");
    } else if (const auto* re = c.opt(p, path + ".pattern", "Regex")) {
      s.pattern = c.str(*re, path + ".pattern.Regex");
      if (!literal_regex(s.pattern))
        c.fail(path + ".pattern",
               "Replace with the regular expression '" + s.pattern.substr(0, 80) + "' is not supported");
    } else {
      c.fail(path + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
    }
    if (s.pattern.empty()) c.fail(path + ".pattern", "an empty pattern is not supported");
    s.content = c.str(c.at(j, path, "content"), path + ".content");
  } else {
    c.fail(path, "normalizer " + type.substr(0, 60) + " is not supported");
  }
  steps_.push_back(std::move(s));
}

void Normalizer::apply(std::string& s, bool& at_start) const {
  // A file's normalizers may grow text without bound (40 x Replace a -> aa is 2^40 times): the
  // output is held to kGrowthFactor x the input + kGrowthSlack bytes, checked before each step's
  // output is built where a step can multiply it (Replace) and after every step.
  const size_t limit = kGrowthFactor * s.size() + kGrowthSlack;
  auto too_long = [&](size_t bytes) {
    input_error(file_, "normalizer: the text of " + std::to_string(bytes) + " bytes grows past " +
                           std::to_string(kGrowthFactor) + " x its size + " + std::to_string(kGrowthSlack) + " bytes");
  };
  const size_t input = s.size();
  for (const Step& st : steps_) {
    if (s.empty()) return;  // no normalizer changes an empty string
    if (s.size() > limit) too_long(input);
    switch (st.kind) {
      case Kind::NFC:
        s = unicode_normalize(s, "NFC");
        break;
      case Kind::NFD:
        s = unicode_normalize(s, "NFD");
        break;
      case Kind::NFKC:
        s = unicode_normalize(s, "NFKC");
        break;
      case Kind::NFKD:
        s = unicode_normalize(s, "NFKD");
        break;
      case Kind::Lowercase: {
        // Character by character, as Rust's char::to_lowercase (no final-sigma context).
        std::vector<uint32_t> cps;
        std::vector<size_t> off;
        uni::decode_utf8(s, cps, off);
        std::string out;
        out.reserve(s.size());
        for (size_t k = 0; k < cps.size(); ++k) {
          const uint32_t cp = cps[k];
          if (cp < 0x80) {
            out += char(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
          } else if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping
            out += "i\xCC\x87";
          } else if (const uint32_t lc = unicode16_lowercase(cp)) {  // Rust's tables are Unicode 16
            uni::append_utf8(out, lc);
          } else if (cp >= 0xDC80 && cp <= 0xDCFF && off[k + 1] - off[k] == 1) {
            out.append(s, off[k], 1);  // an invalid byte stays
          } else {
            uni::append_utf8(out, uint32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
          }
        }
        s = std::move(out);
        break;
      }
      case Kind::Strip: {
        std::vector<uint32_t> cps;
        std::vector<size_t> off;
        uni::decode_utf8(s, cps, off);
        size_t a = 0, b = cps.size();
        if (st.left)
          while (a < b && uni::is_space(cps[a])) ++a;
        if (st.right)
          while (b > a && uni::is_space(cps[b - 1])) --b;
        if (a > 0) at_start = false;
        s = s.substr(off[a], off[b] - off[a]);
        break;
      }
      case Kind::Prepend:
        s.insert(0, st.content);
        break;
      case Kind::Replace: {
        if (st.content.size() > st.pattern.size()) {
          size_t n = 0;
          for (size_t k = s.find(st.pattern); k != std::string::npos; k = s.find(st.pattern, k + st.pattern.size())) ++n;
          if (s.size() + n * (st.content.size() - st.pattern.size()) > limit) too_long(input);
        }
        std::string out;
        size_t i = 0;
        for (size_t k; (k = s.find(st.pattern, i)) != std::string::npos; i = k + st.pattern.size()) {
          out.append(s, i, k - i);
          out += st.content;
        }
        out.append(s, i, std::string::npos);
        s = std::move(out);
        break;
      }
    }
  }
  if (s.size() > limit) too_long(input);
}

namespace {

size_t utf8_length(const std::string& s, size_t i) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  return std::min(len, s.size() - i);
}

}  // namespace

std::vector<std::pair<size_t, size_t>> Normalizer::align(const std::string& input, bool at_start) const {
  using Span = std::pair<size_t, size_t>;
  const bool start0 = at_start;
  std::string s = input;
  std::vector<Span> origin(s.size());  // per byte of s: its bytes in `input`
  for (size_t k = 0; k < s.size(); ++k) origin[k] = {k, k + 1};
  auto span_of = [&](size_t b, size_t e) {  // the input bytes of s[b, e)
    Span r = origin[b];
    for (size_t k = b + 1; k < e; ++k) r = {std::min(r.first, origin[k].first), std::max(r.second, origin[k].second)};
    return r;
  };
  for (const Step& st : steps_) {
    if (s.empty()) break;
    std::string out;
    std::vector<Span> o;
    switch (st.kind) {
      case Kind::Strip: {
        std::string t = s;
        Normalizer one;
        one.steps_.push_back(st);
        one.apply(t, at_start);
        // Only leading and trailing white space goes: t starts at the first byte that is not.
        const size_t a = st.left && !t.empty() ? s.find(t) : 0;
        out = t;
        o.assign(origin.begin() + ptrdiff_t(a), origin.begin() + ptrdiff_t(a + t.size()));
        break;
      }
      case Kind::Prepend: {
        // The prepended text stands for the first character (tokenizers' transform of its range).
        const Span first = span_of(0, utf8_length(s, 0));
        out = st.content + s;
        o.assign(st.content.size(), first);
        o.insert(o.end(), origin.begin(), origin.end());
        break;
      }
      case Kind::Replace: {
        size_t i = 0;
        for (size_t k; (k = s.find(st.pattern, i)) != std::string::npos; i = k + st.pattern.size()) {
          out.append(s, i, k - i);
          o.insert(o.end(), origin.begin() + ptrdiff_t(i), origin.begin() + ptrdiff_t(k));
          out += st.content;
          o.insert(o.end(), st.content.size(), span_of(k, k + st.pattern.size()));
        }
        out.append(s, i, std::string::npos);
        o.insert(o.end(), origin.begin() + ptrdiff_t(i), origin.end());
        break;
      }
      default: {
        // Unicode forms and Lowercase: the shortest runs of characters that normalize apart
        // (step(run + next) == step(run) + step(next) at each cut); a run's bytes map to it whole.
        Normalizer one;
        one.steps_.push_back(st);
        auto step = [&](size_t b, size_t e) {
          std::string t = s.substr(b, e - b);
          bool st_start = false;
          one.apply(t, st_start);
          return t;
        };
        size_t run = 0;
        std::string run_out;
        auto flush = [&](size_t e) {
          out += run_out;
          o.insert(o.end(), run_out.size(), span_of(run, e));
        };
        for (size_t i = 0; i < s.size();) {
          const size_t len = utf8_length(s, i);
          if (i == 0) {
            run_out = step(0, len);
          } else {
            const std::string alone = step(i, i + len);
            std::string together = step(run, i + len);
            if (together == run_out + alone) {
              flush(i);
              run = i;
              run_out = alone;
            } else {
              if (i + len - run > kMaxRun) return {};
              run_out = std::move(together);
            }
          }
          i += len;
        }
        flush(s.size());
        break;
      }
    }
    s = std::move(out);
    origin = std::move(o);
  }
  std::string whole = input;  // the runs must add up to what apply() gives
  bool st = start0;
  apply(whole, st);
  if (whole != s) return {};
  return origin;
}

}  // namespace sf
