#include "data/tokenizer/pre_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>

#include "data/tokenizer/unicode.h"

namespace sf {
namespace {

using uni::is_letter;
using uni::is_number;
using uni::is_space;

bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
bool is_other(uint32_t cp) { return !(uni::classes(cp) & (uni::kL | uni::kN | uni::kSpace)); }

// Contractions 's 't 're 've 'm 'll 'd; the match length in code points (0: none). Case-insensitive
// as Oniguruma's (?i:...), whose case folding also maps U+017F (long s) to s.
size_t contraction(const std::vector<uint32_t>& c, size_t i, bool any_case) {
  if (c[i] != '\'' || i + 1 >= c.size()) return 0;
  auto low = [&](size_t k) -> uint32_t {
    if (k >= c.size()) return 0;
    if (!any_case) return c[k];
    if (c[k] >= 'A' && c[k] <= 'Z') return c[k] + 32;
    return c[k] == 0x17F ? 's' : c[k];
  };
  const uint32_t a = low(i + 1), b = low(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End (in code points) of the match starting at i, for Llama 3's pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (Qwen2's is the same with \p{N} for \p{N}{1,3}). Every code point is in some match.
size_t next_llama3(const std::vector<uint32_t>& c, size_t i, size_t max_digits) {
  const size_t n = c.size();
  if (size_t k = contraction(c, i, true)) return i + k;
  if (i + 1 < n && !is_crlf(c[i]) && !is_letter(c[i]) && !is_number(c[i]) && is_letter(c[i + 1])) {
    size_t j = i + 1;
    while (j < n && is_letter(c[j])) ++j;
    return j;
  }
  if (is_letter(c[i])) {
    size_t j = i;
    while (j < n && is_letter(c[j])) ++j;
    return j;
  }
  if (is_number(c[i])) {
    size_t j = i;
    while (j < n && j - i < max_digits && is_number(c[j])) ++j;
    return j;
  }
  {
    size_t k = i;
    if (c[k] == ' ' && k + 1 < n && is_other(c[k + 1])) ++k;
    if (is_other(c[k])) {
      size_t j = k;
      while (j < n && is_other(c[j])) ++j;
      while (j < n && is_crlf(c[j])) ++j;
      return j;
    }
  }
  // c[i] is whitespace here.
  size_t j = i;
  while (j < n && is_space(c[j])) ++j;
  for (size_t k = j; k > i; --k)
    if (is_crlf(c[k - 1])) return k;  // \s*[\r\n]+ ends at the last line break of the run
  if (j == n || j - i < 2) return j;  // \s+(?!\S) at the end, else \s+
  return j - 1;                       // \s+(?!\S): leave one space to the next piece
}

// GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t next_gpt2(const std::vector<uint32_t>& c, size_t i) {
  const size_t n = c.size();
  if (size_t k = contraction(c, i, false)) return i + k;
  for (auto cls : {is_letter, is_number, is_other}) {
    size_t k = i;
    if (c[k] == ' ' && k + 1 < n && cls(c[k + 1])) ++k;
    if (cls(c[k])) {
      size_t j = k;
      while (j < n && cls(c[j])) ++j;
      return j;
    }
  }
  size_t j = i;
  while (j < n && is_space(c[j])) ++j;
  if (j == n || j - i < 2) return j;
  return j - 1;
}

// Mistral Nemo's (tekken) pattern:
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
//   \p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with a regex engine's backtracking: the first alternative that matches, each quantifier greedy
// and giving back one character at a time.
bool upperish(uint32_t cp) { return uni::classes(cp) & (uni::kLu | uni::kLt | uni::kLm | uni::kLo | uni::kM); }
bool lowerish(uint32_t cp) { return uni::classes(cp) & (uni::kLl | uni::kLm | uni::kLo | uni::kM); }
bool prefix_char(uint32_t cp) { return !is_crlf(cp) && !is_letter(cp) && !is_number(cp); }

// U*W+ from s: the end, or 0 when it does not match (a match is never empty).
size_t upper_star_lower_plus(const std::vector<uint32_t>& c, size_t s) {
  const size_t n = c.size();
  size_t e = s;
  while (e < n && upperish(c[e])) ++e;
  for (size_t t = e + 1; t-- > s;) {  // U* gives back one at a time
    if (t < n && lowerish(c[t])) {
      size_t k = t;
      while (k < n && lowerish(c[k])) ++k;
      return k;
    }
  }
  return 0;
}
// U+W* from s: the end, or 0.
size_t upper_plus_lower_star(const std::vector<uint32_t>& c, size_t s) {
  const size_t n = c.size();
  size_t e = s;
  while (e < n && upperish(c[e])) ++e;
  if (e == s) return 0;
  while (e < n && lowerish(c[e])) ++e;
  return e;
}

size_t next_tekken(const std::vector<uint32_t>& c, size_t i) {
  const size_t n = c.size();
  const bool pre = prefix_char(c[i]) && i + 1 < n;
  for (auto alt : {upper_star_lower_plus, upper_plus_lower_star}) {
    if (pre)
      if (size_t e = alt(c, i + 1)) return e;
    if (size_t e = alt(c, i)) return e;
  }
  if (is_number(c[i])) return i + 1;
  {
    size_t k = i;
    if (c[k] == ' ' && k + 1 < n && is_other(c[k + 1])) ++k;
    if (is_other(c[k])) {
      size_t j = k;
      while (j < n && is_other(c[j])) ++j;
      while (j < n && (is_crlf(c[j]) || c[j] == '/')) ++j;
      return j;
    }
  }
  size_t j = i;
  while (j < n && is_space(c[j])) ++j;
  for (size_t k = j; k > i; --k)
    if (is_crlf(c[k - 1])) return k;
  if (j == n || j - i < 2) return j;
  return j - 1;
}

const char* kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// DeepSeek-V3's three Split patterns, applied in turn (each Isolated). Their matches do not cover
// the text: what lies between matches is a piece of its own.
//   \p{N}{1,3}
//   [一-龥぀-ゟ゠-ヿ]+     (CJK ideographs U+4E00-9FA5, hiragana, katakana)
//   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//   ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Each next_* returns the end of the match starting at i, or i when none starts there.
const char* kDigits3Pattern = R"(\p{N}{1,3})";
const char* kCjkPattern = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
const char* kDeepseekPattern =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

bool is_symbol(uint32_t cp) {
  const auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_SM || cat == UTF8PROC_CATEGORY_SC || cat == UTF8PROC_CATEGORY_SK ||
         cat == UTF8PROC_CATEGORY_SO;
}
bool is_punct_or_symbol(uint32_t cp) { return (uni::classes(cp) & uni::kP) || is_symbol(cp); }
bool is_ascii_letter(uint32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'); }

size_t next_digits3(const std::vector<uint32_t>& c, size_t i) {
  size_t j = i;
  while (j < c.size() && j - i < 3 && is_number(c[j])) ++j;
  return j;
}

size_t next_cjk(const std::vector<uint32_t>& c, size_t i) {
  auto cjk = [](uint32_t cp) { return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF); };
  size_t j = i;
  while (j < c.size() && cjk(c[j])) ++j;
  return j;
}

size_t next_deepseek(const std::vector<uint32_t>& c, size_t i) {
  const size_t n = c.size();
  auto letter_or_mark = [](uint32_t cp) { return uni::classes(cp) & (uni::kL | uni::kM); };
  auto run = [&](size_t j, auto pred) {
    while (j < n && pred(c[j])) ++j;
    return j;
  };
  if (c[i] < 0x80 && std::ispunct(int(c[i])) && i + 1 < n && is_ascii_letter(c[i + 1]))
    return run(i + 1, is_ascii_letter);
  if (!is_crlf(c[i]) && !is_letter(c[i]) && !is_punct_or_symbol(c[i]) && i + 1 < n && letter_or_mark(c[i + 1]))
    return run(i + 1, letter_or_mark);
  if (letter_or_mark(c[i])) return run(i, letter_or_mark);
  {
    const size_t k = c[i] == ' ' && i + 1 < n && is_punct_or_symbol(c[i + 1]) ? i + 1 : i;
    if (is_punct_or_symbol(c[k])) return run(run(k, is_punct_or_symbol), is_crlf);
  }
  if (!is_space(c[i])) return i;
  const size_t j = run(i, is_space);
  for (size_t k = j; k > i; --k)
    if (is_crlf(c[k - 1])) return k;  // \s*[\r\n]+ ends at the last line break of the run
  if (j == n || j - i < 2) return j;  // \s+(?!\S) at the end, else \s+
  return j - 1;
}

struct TextSpan {
  size_t a, b;
  bool match;
};

// Byte spans of the regex's matches: they cover the text. The code points go through per-thread
// buffers (no allocation once they have grown).
template <class Emit>
void regex_matches(PreTokenizer::Regex r, std::string_view s, Emit&& emit) {
  thread_local std::vector<uint32_t> cps;
  thread_local std::vector<size_t> off;
  uni::decode_utf8(s, cps, off);
  const size_t n = cps.size();
  for (size_t i = 0; i < n;) {
    const size_t j = r == PreTokenizer::Regex::Gpt2     ? next_gpt2(cps, i)
                     : r == PreTokenizer::Regex::Tekken ? next_tekken(cps, i)
                                                        : next_llama3(cps, i, r == PreTokenizer::Regex::Qwen2 ? 1 : 3);
    emit(off[i], off[j]);
    i = j;
  }
}

// The patterns whose matches leave gaps: a gap (the code points where no match starts) is a span
// that is not a match.
bool has_gaps(PreTokenizer::Regex r) {
  using R = PreTokenizer::Regex;
  return r == R::Digits3 || r == R::Cjk || r == R::Deepseek;
}

void gap_spans(PreTokenizer::Regex r, std::string_view s, std::vector<TextSpan>& out) {
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  uni::decode_utf8(s, cps, off);
  size_t gap = 0;
  for (size_t i = 0; i < cps.size();) {
    const size_t j = r == PreTokenizer::Regex::Digits3 ? next_digits3(cps, i)
                     : r == PreTokenizer::Regex::Cjk   ? next_cjk(cps, i)
                                                       : next_deepseek(cps, i);
    if (j == i) {
      ++i;
      continue;
    }
    if (gap < i) out.push_back({off[gap], off[i], false});
    out.push_back({off[i], off[j], true});
    i = gap = j;
  }
  if (gap < cps.size()) out.push_back({off[gap], off[cps.size()], false});
}

void regex_spans(PreTokenizer::Regex r, std::string_view s, std::vector<TextSpan>& out) {
  if (has_gaps(r)) return gap_spans(r, s, out);
  regex_matches(r, s, [&](size_t a, size_t b) { out.push_back({a, b, true}); });
}

void literal_spans(const std::string& pat, const std::string& s, std::vector<TextSpan>& out) {
  size_t prev = 0;
  for (size_t k; (k = s.find(pat, prev)) != std::string::npos; prev = k + pat.size()) {
    if (k > prev) out.push_back({prev, k, false});
    out.push_back({k, k + pat.size(), true});
  }
  if (prev < s.size()) out.push_back({prev, s.size(), false});
}

// One match per code point for which pred holds (tokenizers' char-predicate patterns).
template <class Pred>
void char_spans(Pred pred, const std::string& s, std::vector<TextSpan>& out) {
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  uni::decode_utf8(s, cps, off);
  size_t last = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (!pred(cps[k])) continue;
    if (last < off[k]) out.push_back({last, off[k], false});
    out.push_back({off[k], off[k + 1], true});
    last = off[k + 1];
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

// Contiguous and the Merged* behaviors: walks the spans (backward for MergedWithNext) and grows the
// last kept span over the next one when joins(it is a match, the one before it was).
template <class Joins>
void merge_spans(const std::vector<TextSpan>& m, bool backward, Joins joins, std::vector<TextSpan>& keep) {
  bool prev = false;
  for (size_t n = 0; n < m.size(); ++n) {
    const TextSpan& s = m[backward ? m.size() - 1 - n : n];
    if (joins(s.match, prev) && !keep.empty())
      (backward ? keep.back().a : keep.back().b) = backward ? s.a : s.b;
    else
      keep.push_back({s.a, s.b, false});
    prev = s.match;
  }
  if (backward) std::reverse(keep.begin(), keep.end());
}

// tokenizers' NormalizedString::split: spans -> pieces by behavior (empty pieces dropped).
void split_by(const Piece& p, std::vector<TextSpan>& m, PreTokenizer::Behavior beh, std::vector<Piece>& out) {
  using B = PreTokenizer::Behavior;
  std::vector<TextSpan> keep;  // .match here: to be removed
  switch (beh) {
    case B::Isolated:
      for (const TextSpan& s : m) keep.push_back({s.a, s.b, false});
      break;
    case B::Removed:
      keep = m;
      break;
    case B::Contiguous:
      merge_spans(
          m, false, [](bool match, bool prev) { return match == prev; }, keep);
      break;
    case B::MergedWithPrevious:
      merge_spans(
          m, false, [](bool match, bool prev) { return match && !prev; }, keep);
      break;
    case B::MergedWithNext:
      merge_spans(
          m, true, [](bool match, bool prev) { return match && !prev; }, keep);
      break;
  }
  for (const TextSpan& s : keep)
    if (!s.match && s.b > s.a) out.push_back({p.text.substr(s.a, s.b - s.a), p.at_start && s.a == 0});
}

PreTokenizer::Behavior behavior_of(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path,
                                   const char* dflt) {
  const std::string b = c.str_or(j, path, "behavior", dflt);
  using B = PreTokenizer::Behavior;
  if (b == "Removed") return B::Removed;
  if (b == "Isolated") return B::Isolated;
  if (b == "MergedWithPrevious") return B::MergedWithPrevious;
  if (b == "MergedWithNext") return B::MergedWithNext;
  if (b == "Contiguous") return B::Contiguous;
  c.fail(path + ".behavior", "unknown split behavior '" + b.substr(0, 40) + "'");
}

struct ByteMap {
  std::string to_utf8[256];
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uni::append_utf8(to_utf8[b], printable ? uint32_t(b) : uint32_t(256 + n++));
    }
  }
};

}  // namespace

std::vector<std::string> regex_pieces(PreTokenizer::Regex r, const std::string& text) {
  std::vector<TextSpan> m;
  regex_spans(r, text, m);
  std::vector<std::string> out;
  for (const TextSpan& s : m) out.push_back(text.substr(s.a, s.b - s.a));
  return out;
}

PreTokenizer PreTokenizer::from_json(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path) {
  PreTokenizer p;
  if (!j.is_null()) p.add(c, j, path, 0);
  // Byte spans suffice (see byte_spans()) for a regular expression (Isolated) then a ByteLevel without
  // its own regex, or a ByteLevel with its regex alone; neither adding a prefix space.
  const auto& st = p.steps_;
  if (st.size() == 2 && st[0].kind == Kind::Split && st[0].regex != Regex::None &&
      st[0].behavior == Behavior::Isolated && !has_gaps(st[0].regex) && st[1].kind == Kind::ByteLevel && !st[1].flag && !st[1].flag2)
    p.span_regex_ = st[0].regex;
  if (st.size() == 1 && st[0].kind == Kind::ByteLevel && !st[0].flag && st[0].flag2) p.span_regex_ = Regex::Gpt2;
  return p;
}

bool PreTokenizer::byte_spans(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& spans) const {
  if (span_regex_ == Regex::None) return false;
  spans.clear();
  regex_matches(span_regex_, text, [&](size_t a, size_t b) { spans.push_back({uint32_t(a), uint32_t(b)}); });
  return true;
}

void PreTokenizer::add(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path, int depth) {
  if (depth > 16) c.fail(path, "pre_tokenizer sequences nested too deep");
  const std::string type = c.type(j, path);
  Step s;
  s.kind = Kind::Split;
  if (type == "Sequence") {
    c.each(j, path, "pretokenizers",
           [&](const nlohmann::json& item, const std::string& ip) { add(c, item, ip, depth + 1); });
    return;
  } else if (type == "Split") {
    const auto& pat = c.obj(c.at(j, path, "pattern"), path + ".pattern");
    if (const auto* re = c.opt(pat, path + ".pattern", "Regex")) {
      const std::string r = c.str(*re, path + ".pattern.Regex");
      // Line breaks in a class may be written as characters or as \r \n: the same expression.
      std::string rx = r;
      for (const auto& [esc, ch] : {std::pair<const char*, const char*>{"\\r", "\r"}, {"\\n", "\n"}})
        for (size_t k; (k = rx.find(esc)) != std::string::npos;) rx.replace(k, 2, ch);
      auto is = [&](const char* pat) { return r == pat || rx == pat; };
      s.regex = is(kLlama3Pattern)     ? Regex::Llama3
                : is(kQwen2Pattern)    ? Regex::Qwen2
                : is(kGpt2Pattern)     ? Regex::Gpt2
                : is(kTekkenPattern)   ? Regex::Tekken
                : is(kDigits3Pattern)  ? Regex::Digits3
                : is(kCjkPattern)      ? Regex::Cjk
                : is(kDeepseekPattern) ? Regex::Deepseek
                                       : Regex::None;
      if (s.regex == Regex::None) c.fail(path + ".pattern", "Split pattern not supported: " + r.substr(0, 200));
    } else if (const auto* lit = c.opt(pat, path + ".pattern", "String")) {
      s.literal = c.str(*lit, path + ".pattern.String");
      if (s.literal.empty()) c.fail(path + ".pattern", "an empty Split pattern is not supported");
    } else {
      c.fail(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    c.at(j, path, "behavior");  // required by tokenizers, as invert
    s.behavior = behavior_of(c, j, path, "Isolated");
    if (c.boolean(c.at(j, path, "invert"), path + ".invert"))
      c.fail(path + ".invert", "Split with invert is not supported");
    if (s.regex != Regex::None && s.behavior != Behavior::Isolated && s.behavior != Behavior::Removed)
      c.fail(path + ".behavior", "only Isolated or Removed with a regular expression");
  } else if (type == "ByteLevel") {
    s.kind = Kind::ByteLevel;
    s.flag = c.boolean(c.at(j, path, "add_prefix_space"), path + ".add_prefix_space");
    c.boolean(c.at(j, path, "trim_offsets"), path + ".trim_offsets");  // offsets only; required
    s.flag2 = c.bool_or(j, path, "use_regex", true);
    byte_level_ = true;
  } else if (type == "Metaspace") {
    s.kind = Kind::Metaspace;
    s.literal = c.str(c.at(j, path, "replacement"), path + ".replacement");
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    uni::decode_utf8(s.literal, cps, off);
    if (cps.size() != 1) c.fail(path + ".replacement", "must be one character");
    const std::string scheme = c.str_or(j, path, "prepend_scheme", "always");
    s.prepend = scheme == "never" ? 0 : scheme == "first" ? 1 : scheme == "always" ? 2 : -1;
    if (s.prepend < 0) c.fail(path + ".prepend_scheme", "unknown scheme '" + scheme.substr(0, 40) + "'");
    // Older files say add_prefix_space; tokenizers accepts false only with prepend_scheme "never"
    // (an absent scheme defaults to "always", so it refuses that too).
    if (const auto* aps = c.opt(j, path, "add_prefix_space")) {
      if (!c.boolean(*aps, path + ".add_prefix_space") && s.prepend != 0)
        c.fail(path, "add_prefix_space false does not match prepend_scheme " + scheme.substr(0, 20));
    }
    s.flag = c.bool_or(j, path, "split", true);  // tokenizers' default when the key is absent
    meta_ = s.literal;
    meta_prepends_ = s.prepend != 0;
  } else if (type == "Digits") {
    s.kind = Kind::Digits;
    s.flag = c.boolean(c.at(j, path, "individual_digits"), path + ".individual_digits");
  } else if (type == "Punctuation") {
    s.kind = Kind::Punctuation;
    s.behavior = behavior_of(c, j, path, "Isolated");
  } else if (type == "WhitespaceSplit") {
    s.kind = Kind::WhitespaceSplit;
  } else if (type == "Whitespace") {
    s.kind = Kind::Whitespace;
  } else {
    c.fail(path, "pre_tokenizer " + type.substr(0, 60) + " is not supported");
  }
  steps_.push_back(std::move(s));
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  static const ByteMap bm;
  std::vector<Piece> next;
  std::vector<TextSpan> m;
  for (const Step& st : steps_) {
    next.clear();
    for (Piece& p : pieces) {
      m.clear();
      switch (st.kind) {
        case Kind::Split:
          if (st.regex != Regex::None)
            regex_spans(st.regex, p.text, m);
          else
            literal_spans(st.literal, p.text, m);
          split_by(p, m, st.behavior, next);
          break;
        case Kind::ByteLevel: {
          if (st.flag && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, 1, ' ');
          const size_t first = next.size();
          if (st.flag2) {
            regex_spans(Regex::Gpt2, p.text, m);
            split_by(p, m, Behavior::Isolated, next);
          } else if (!p.text.empty()) {
            next.push_back(std::move(p));
          }
          for (size_t k = first; k < next.size(); ++k) {
            std::string mapped;
            mapped.reserve(next[k].text.size() * 2);
            for (unsigned char b : next[k].text) mapped += bm.to_utf8[b];
            next[k].text = std::move(mapped);
          }
          break;
        }
        case Kind::Metaspace: {
          std::string t;
          t.reserve(p.text.size() + 3);
          for (char ch : p.text) {
            if (ch == ' ')
              t += st.literal;
            else
              t += ch;
          }
          if (!t.empty() && t.compare(0, st.literal.size(), st.literal) != 0 &&
              (st.prepend == 2 || (st.prepend == 1 && p.at_start)))
            t.insert(0, st.literal);
          Piece q{std::move(t), p.at_start};
          if (st.flag) {
            literal_spans(st.literal, q.text, m);
            split_by(q, m, Behavior::MergedWithNext, next);
          } else if (!q.text.empty()) {
            next.push_back(std::move(q));
          }
          break;
        }
        case Kind::Digits:
          char_spans(is_number, p.text, m);
          split_by(p, m, st.flag ? Behavior::Isolated : Behavior::Contiguous, next);
          break;
        case Kind::Punctuation:
          char_spans([](uint32_t cp) { return (cp < 0x80 && std::ispunct(int(cp))) || (uni::classes(cp) & uni::kP); },
                     p.text, m);
          split_by(p, m, st.behavior, next);
          break;
        case Kind::Whitespace: {
          // \w+|[^\w\s]+ kept, the whitespace between removed.
          std::vector<uint32_t> cps;
          std::vector<size_t> off;
          uni::decode_utf8(p.text, cps, off);
          for (size_t k = 0; k < cps.size();) {
            const uint16_t cl = uni::classes(cps[k]);
            size_t e = k + 1;
            const int kind = (cl & uni::kWord) ? 0 : (cl & uni::kSpace) ? 1 : 2;
            while (e < cps.size()) {
              const uint16_t ce = uni::classes(cps[e]);
              if (((ce & uni::kWord) ? 0 : (ce & uni::kSpace) ? 1 : 2) != kind) break;
              ++e;
            }
            m.push_back({off[k], off[e], kind == 1});
            k = e;
          }
          split_by(p, m, Behavior::Removed, next);
          break;
        }
        case Kind::WhitespaceSplit:
          char_spans(is_space, p.text, m);
          split_by(p, m, Behavior::Removed, next);
          break;
      }
    }
    pieces.swap(next);
  }
}

}  // namespace sf
