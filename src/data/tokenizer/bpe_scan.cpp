#include "data/tokenizer/bpe_scan.h"

#include <cstring>
#include <exception>
#include <thread>

#include "data/tokenizer/unicode.h"

namespace sf {
namespace {

struct Cursor {
  const char* p;
  const char* end;

  void ws() {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
  }
  // Whitespace, then `ch` (consumed): true when it is there.
  bool eat(char ch) {
    ws();
    if (p < end && *p == ch) {
      ++p;
      return true;
    }
    return false;
  }
  bool at(char ch) const { return p < end && *p == ch; }
};

// The length of the UTF-8 sequence at p (lead byte >= 0x80) when it is well formed (Unicode's
// table 3-7, what the JSON parser accepts: no overlong form, no surrogate, nothing past U+10FFFF),
// else 0.
size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
  const unsigned c = p[0];
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (size_t(end - p) < n || p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (p[k] < 0x80 || p[k] > 0xBF) return 0;
  return n;
}

bool hex4(Cursor& c, uint32_t& v) {
  if (c.end - c.p < 4) return false;
  v = 0;
  for (int k = 0; k < 4; ++k) {
    const char h = *c.p++;
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
    if (d < 0) return false;
    v = v * 16 + uint32_t(d);
  }
  return true;
}

// The JSON string at c.p, decoded and appended to out; false when it is not a string the parser
// accepts.
bool read_string(Cursor& c, std::string& out) {
  if (!c.at('"')) return false;
  ++c.p;
  for (;;) {
    const char* run = c.p;  // plain bytes are copied a run at a time
    while (c.p < c.end) {
      const unsigned char b = static_cast<unsigned char>(*c.p);
      if (b == '"' || b == '\\' || b < 0x20 || b >= 0x80) break;
      ++c.p;
    }
    out.append(run, size_t(c.p - run));
    if (c.p >= c.end) return false;
    const unsigned char b = static_cast<unsigned char>(*c.p);
    if (b == '"') {
      ++c.p;
      return true;
    }
    if (b < 0x20) return false;  // control characters must be escaped
    if (b >= 0x80) {
      const size_t n =
          utf8_sequence(reinterpret_cast<const unsigned char*>(c.p), reinterpret_cast<const unsigned char*>(c.end));
      if (n == 0) return false;
      out.append(c.p, n);
      c.p += n;
      continue;
    }
    if (c.end - c.p < 2) return false;
    const char e = c.p[1];
    c.p += 2;
    switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        uint32_t u;
        if (!hex4(c, u)) return false;
        if (u >= 0xD800 && u <= 0xDBFF) {  // a high surrogate needs \u and a low one
          uint32_t low;
          if (c.end - c.p < 2 || c.p[0] != '\\' || c.p[1] != 'u') return false;
          c.p += 2;
          if (!hex4(c, low) || low < 0xDC00 || low > 0xDFFF) return false;
          u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
        } else if (u >= 0xDC00 && u <= 0xDFFF) {
          return false;
        }
        uni::append_utf8(out, u);
        break;
      }
      default:
        return false;
    }
  }
}

// An object key without escapes (the keys compared here: "model", "vocab", "merges"); false for
// any other (the tree parser reads such a file).
bool read_plain_key(Cursor& c, std::string_view& key) {
  c.ws();
  if (!c.at('"')) return false;
  const char* begin = ++c.p;
  while (c.p < c.end && *c.p != '"') {
    if (*c.p == '\\' || static_cast<unsigned char>(*c.p) < 0x20) return false;
    ++c.p;
  }
  if (c.p >= c.end) return false;
  key = std::string_view(begin, size_t(c.p - begin));
  ++c.p;
  return c.eat(':');
}

// Moves past the string at c.p ('"') without checking it; false when it does not end.
bool skip_string(Cursor& c) {
  for (const char* p = c.p + 1;;) {
    const char* q = static_cast<const char*>(std::memchr(p, '"', size_t(c.end - p)));
    if (!q) return false;
    size_t backslashes = 0;  // an odd number before the quote escapes it
    while (q - backslashes > p && q[-1 - std::ptrdiff_t(backslashes)] == '\\') ++backslashes;
    p = q + 1;
    if (backslashes % 2 == 0) {
      c.p = p;
      return true;
    }
  }
}

// Moves past the JSON value at c.p without checking it (the tree parser checks every value kept in
// `rest`, the scans below the two they read); false when it does not end.
bool skip_value(Cursor& c) {
  c.ws();
  int depth = 0;
  while (c.p < c.end) {
    const char ch = *c.p;
    if (ch == '"') {
      if (!skip_string(c)) return false;
      if (depth == 0) return true;
      continue;
    }
    if (ch == '{' || ch == '[') {
      ++depth;
    } else if (ch == '}' || ch == ']') {
      if (depth == 0) return true;  // a scalar ended by its container's end
      ++c.p;
      if (--depth == 0) return true;
      continue;
    } else if (depth == 0 && (ch == ',' || ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t')) {
      return true;
    }
    ++c.p;
  }
  return depth == 0;
}

// The members of the object at c.p: fn(key, cursor at the value) reads or skips each value.
template <class Fn>
bool each_member(Cursor& c, Fn&& fn) {
  if (!c.eat('{')) return false;
  if (c.eat('}')) return true;
  for (;;) {
    std::string_view key;
    if (!read_plain_key(c, key)) return false;
    c.ws();
    if (!fn(key, c)) return false;
    if (c.eat(',')) continue;
    return c.eat('}');
  }
}

// A vocab id: a plain integer literal below 2^31 (no sign, fraction or exponent).
bool read_id(Cursor& c, int32_t& id) {
  c.ws();
  const char* begin = c.p;
  int64_t v = 0;
  while (c.p < c.end && *c.p >= '0' && *c.p <= '9' && c.p - begin < 11) v = v * 10 + (*c.p++ - '0');
  const size_t digits = size_t(c.p - begin);
  if (digits == 0 || (digits > 1 && *begin == '0') || v > INT32_MAX) return false;
  if (c.p < c.end && (*c.p == '.' || *c.p == 'e' || *c.p == 'E' || (*c.p >= '0' && *c.p <= '9'))) return false;
  id = int32_t(v);
  return true;
}

bool scan_vocab(Cursor& c, VocabIndex& vocab) {
  // Real vocabularies take 12-24 bytes of text a token ("token": id, indentation): room for those
  // of 24 (a table that fits in a cache better), grown if more come.
  vocab.reserve(size_t(c.end - c.p) / 24 + 16, size_t(c.end - c.p) / 2);
  std::string key;
  if (!c.eat('{')) return false;
  if (c.eat('}')) return true;
  for (;;) {
    c.ws();
    key.clear();
    int32_t id;
    if (!read_string(c, key) || !c.eat(':') || !read_id(c, id)) return false;
    if (!vocab.insert(key, id)) return false;  // a duplicate key: the tree parser keeps the last
    if (c.eat(',')) continue;
    return c.eat('}');
  }
}

bool scan_merges(Cursor& c, ScannedBpe& out) {
  std::string& bytes = out.merge_bytes;
  if (!c.eat('[')) return false;
  if (c.eat(']')) return true;
  int form = -1;  // 1: "a b" strings, 0: ["a", "b"] pairs
  for (;;) {
    c.ws();
    const size_t off = bytes.size();
    size_t a_len;
    if (c.at('"')) {
      if (form == 0) return false;
      form = 1;
      if (!read_string(c, bytes)) return false;
      const std::string_view s = std::string_view(bytes).substr(off);
      if (s.substr(0, 8) == "#version") {
        bytes.resize(off);
      } else {
        const size_t sp = s.find(' ');
        if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos) return false;
        a_len = sp;
        bytes.erase(off + sp, 1);
        out.merges.push_back({uint32_t(off), uint32_t(a_len), uint32_t(bytes.size() - off - a_len)});
      }
    } else if (c.at('[')) {
      if (form == 1) return false;
      form = 0;
      ++c.p;
      c.ws();
      if (!read_string(c, bytes)) return false;
      a_len = bytes.size() - off;
      if (!c.eat(',')) return false;
      c.ws();
      if (!read_string(c, bytes) || !c.eat(']')) return false;
      out.merges.push_back({uint32_t(off), uint32_t(a_len), uint32_t(bytes.size() - off - a_len)});
    } else {
      return false;
    }
    if (c.eat(',')) continue;
    return c.eat(']');
  }
}

}  // namespace

bool scan_bpe(std::string_view text, ScannedBpe& out) {
  if (text.size() >= UINT32_MAX) return false;
  Cursor c{text.data(), text.data() + text.size()};
  // Where the two values are: every top-level and model member is walked (a key given twice, which
  // the parser would take the last of, declines), the two values skipped over.
  bool model = false;
  Cursor vocab{nullptr, nullptr}, merges{nullptr, nullptr};
  const bool ok = each_member(c, [&](std::string_view key, Cursor& v) {
    if (key != "model") return skip_value(v);
    if (model) return false;
    model = true;
    return each_member(v, [&](std::string_view mkey, Cursor& mv) {
      Cursor* range = mkey == "vocab" ? &vocab : mkey == "merges" ? &merges : nullptr;
      if (!range) return skip_value(mv);
      if (range->p) return false;
      range->p = mv.p;
      if (!skip_value(mv)) return false;
      range->end = mv.p;
      return true;
    });
  });
  if (!ok || !vocab.p || !merges.p) return false;
  // Each value scanned exactly (it must be read whole, to its end), the two at once.
  const char *vocab_begin = vocab.p, *vocab_end = vocab.end;
  const char *merges_begin = merges.p, *merges_end = merges.end;
  bool merges_ok = false;
  std::exception_ptr merges_error;  // bad_alloc
  std::thread merges_thread([&] {
    try {
      out.merge_bytes.reserve(size_t(merges_end - merges_begin));
      merges_ok = scan_merges(merges, out) && (merges.ws(), merges.p == merges_end);
    } catch (...) {
      merges_error = std::current_exception();
    }
  });
  bool vocab_ok = false;
  try {
    vocab_ok = scan_vocab(vocab, out.vocab) && (vocab.ws(), vocab.p == vocab_end);
  } catch (...) {
    merges_thread.join();
    throw;
  }
  merges_thread.join();
  if (merges_error) std::rethrow_exception(merges_error);
  if (!vocab_ok || !merges_ok) return false;
  // The rest: the text with the two values emptied, in file order.
  const bool vocab_first = vocab_begin < merges_begin;
  const char* first_begin = vocab_first ? vocab_begin : merges_begin;
  const char* first_end = vocab_first ? vocab_end : merges_end;
  const char* second_begin = vocab_first ? merges_begin : vocab_begin;
  const char* second_end = vocab_first ? merges_end : vocab_end;
  out.rest.reserve(text.size() - size_t(first_end - first_begin) - size_t(second_end - second_begin) + 4);
  out.rest.assign(text.data(), first_begin);
  out.rest += vocab_first ? "{}" : "[]";
  out.rest.append(first_end, second_begin);
  out.rest += vocab_first ? "[]" : "{}";
  out.rest.append(second_end, text.data() + text.size());
  return true;
}

}  // namespace sf
